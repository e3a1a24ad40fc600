//! One run of the test suite in a sandbox: the tree recorded before and put back after, the
//! runner's own machine-readable report asked for where forkbox knows the runner (see
//! [`crate::runners`]), and the results read from it or from what the command printed.

use std::time::Instant;

use forkbox_engine::sandbox::Sandbox;

use crate::flow::{ms, sh, shell_quote, tail, MigrateConfig, OUTPUT_TAIL_LINES};
use crate::reports::{self, Format, Parsed, Results};
use crate::runners;

/// Before a test run in a fork: the tree as it is (the porter's work so far) goes into the
/// index, so that [`AFTER_TESTS`] can put it back; the last run's JUnit report goes.
const BEFORE_TESTS: &str = "rm -f /tmp/forkbox-junit.xml; [ ! -d .git ] || git add -A";
/// After a test run: what the suite changed or created in the tree is undone (ignored files,
/// caches, stay ignored), so no patch ever carries it and every run starts from the same tree.
const AFTER_TESTS: &str = "[ ! -d .git ] || { git checkout -q -- . && git clean -fdq; }";
/// pytest also writes a JUnit report (xunit1 names each test's file), read in preference to
/// its text: a skipped test then has its own id, and an xfail is told apart.
const PYTEST_ADDOPTS: &str = "--junitxml=/tmp/forkbox-junit.xml -o junit_family=xunit1";
const JUNIT: &str = "/tmp/forkbox-junit.xml";

/// One run of the test command.
pub(crate) struct TestRun {
    pub results: Result<Results, String>,
    pub exit: Option<i32>,
    pub ms: u64,
    /// Where the results were read from.
    pub source: String,
    /// What each failed or errored test said, when the report tells (pytest's JUnit XML).
    pub failures: reports::Failures,
    /// The last lines the test command printed.
    pub output_tail: String,
    /// Whether its ids select tests when given back to the runner (pytest node ids).
    pub selectable: bool,
}

impl TestRun {
    fn failed(why: String, exit: Option<i32>, ms: u64) -> TestRun {
        TestRun {
            results: Err(why),
            exit,
            ms,
            source: String::new(),
            failures: Default::default(),
            output_tail: String::new(),
            selectable: false,
        }
    }
}

/// Runs the test command and reads its results (pytest's JUnit report when it wrote one,
/// else what the command printed); `on_tests` hears how many tests the output has reported
/// so far while it runs. With `only`, pytest runs those node ids alone. What the suite
/// writes into the tree is undone afterwards.
pub(crate) async fn run_tests(
    sb: &Sandbox,
    cfg: &MigrateConfig,
    on_tests: &(dyn Fn(usize) + Send + Sync),
    only: &[String],
) -> TestRun {
    if let Err(e) = sb.run(sh(BEFORE_TESTS, 600)).await {
        return TestRun::failed(
            format!("the tree could not be recorded before the tests: {e}"),
            None,
            0,
        );
    }
    let mut run = run_suite(sb, cfg, on_tests, only).await;
    let undone = match sb.run(sh(AFTER_TESTS, 600)).await {
        Ok(o) if o.code() == 0 => Ok(()),
        Ok(o) => Err(format!(
            "what the tests wrote into the tree could not be undone (exit {}): {}",
            o.code(),
            tail(&[o.stdout.as_slice(), o.stderr.as_slice()].concat(), 4)
        )),
        Err(e) => Err(format!(
            "what the tests wrote into the tree could not be undone: {e}"
        )),
    };
    if let Err(e) = undone {
        run.results = Err(e);
    }
    run
}

async fn run_suite(
    sb: &Sandbox,
    cfg: &MigrateConfig,
    on_tests: &(dyn Fn(usize) + Send + Sync),
    only: &[String],
) -> TestRun {
    let t = Instant::now();
    let pytest_report = matches!(cfg.format, Format::Auto | Format::PytestRa);
    let runners = runners::setup(&cfg.test);
    let hook = runners::HOOK.as_bytes();
    if let Err(e) = sb
        .client()
        .write_file(runners::HOOK_PATH, hook, 0o644)
        .await
    {
        let why = format!("forkbox's test-runner hook could not be written: {e}");
        return TestRun::failed(why, None, 0);
    }
    let mut spec = sh(
        &format!("{}{}", runners.prelude, cfg.test),
        cfg.test_timeout_secs,
    );
    if pytest_report {
        // pytest reads this as arguments before the command line's (shell-style quoting):
        // node ids given there are run alone.
        let ids: Vec<String> = only.iter().map(|id| shell_quote(id)).collect();
        let opts = [PYTEST_ADDOPTS.to_string()]
            .into_iter()
            .chain(ids)
            .collect::<Vec<_>>()
            .join(" ");
        spec.env.push(("PYTEST_ADDOPTS".into(), opts));
    }
    let out = match stream(sb, spec, on_tests).await {
        Ok(o) => o,
        Err(e) => {
            return TestRun::failed(format!("the test command could not run: {e}"), None, ms(t))
        }
    };
    let took = ms(t);
    if out.timed_out {
        let why = format!(
            "the test command timed out after {} s",
            cfg.test_timeout_secs
        );
        return TestRun::failed(why, Some(out.code()), took);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    // What a person reads: `go test`'s text, not the JSON forkbox asked it for.
    let shown = match runners.go_json {
        true => reports::go_json_text(&stdout).into_bytes(),
        false => out.stdout.to_vec(),
    };
    let shown = [shown.as_slice(), out.stderr.as_slice()].concat();
    let mut run = TestRun {
        results: Err(String::new()),
        exit: Some(out.code()),
        ms: took,
        source: String::new(),
        failures: Default::default(),
        output_tail: tail(&shown, OUTPUT_TAIL_LINES),
        selectable: false,
    };
    if pytest_report {
        let junit = sb.client().read_file(JUNIT).await.unwrap_or_default();
        if let Ok((r, failures)) = reports::pytest_junit_detailed(&String::from_utf8_lossy(&junit))
        {
            if !r.is_empty() {
                run.results = Ok(r);
                run.failures = failures;
                run.source = "pytest's JUnit XML report (xunit1)".into();
                run.selectable = true;
                return run;
            }
        }
    }
    if let Some((parsed, source)) = runner_reports(sb, &runners).await {
        run.source = source;
        run.failures = parsed.failures;
        run.results = Ok(parsed.results);
        return run;
    }
    run.source = match (runners.go_json, runners.cargo) {
        (true, _) => "go test's JSON events on the output (GOFLAGS=-json, added by forkbox)".into(),
        (_, true) => format!(
            "the test command's output ({:?}; cargo's --no-fail-fast added by forkbox)",
            cfg.format
        ),
        _ => format!("the test command's output ({:?})", cfg.format),
    };
    match reports::parse(cfg.format, &stdout) {
        Ok(p) => {
            if let Some(note) = p.repeated_note() {
                run.source = format!("{}; {note}", run.source);
            }
            run.results = Ok(p.results);
            run.failures = p.failures;
        }
        Err(e) => {
            run.results = Err(format!(
                "{e} (exit {}); {}; last lines:\n{}",
                out.code(),
                reports::what_to_add(&String::from_utf8_lossy(&out.stderr)),
                tail(&shown, 8)
            ))
        }
    }
    run
}

/// Runs `spec`, telling `on_tests` how many tests the output has reported so far.
async fn stream(
    sb: &Sandbox,
    spec: forkbox_protocol::ExecSpec,
    on_tests: &(dyn Fn(usize) + Send + Sync),
) -> Result<forkbox_engine::client::Output, forkbox_engine::error::SandboxError> {
    let mut ex = sb.exec(spec).await?;
    let mut out = forkbox_engine::client::Output::default();
    let (mut seen, mut line) = (0usize, Vec::new());
    loop {
        let ev = ex.next().await?;
        if let forkbox_engine::client::ExecEvent::Stdout(d) = &ev {
            for &b in d.iter() {
                if b == b'\n' {
                    let n = reports::tests_in_line(&String::from_utf8_lossy(&line));
                    if n > 0 {
                        seen += n;
                        on_tests(seen);
                    }
                    line.clear();
                } else if line.len() < 4096 {
                    line.push(b);
                }
            }
            // pytest -q prints a test's mark as it ends, on a line that ends only every
            // few dozen tests: a line of marks so far counts as it grows.
            if !line.is_empty() && line.iter().all(|c| b".FEsxX".contains(c)) {
                on_tests(seen + line.len());
            }
        }
        if out.absorb(ev) {
            return Ok(out);
        }
    }
}

/// The reports the runners wrote in this run (see [`runners`]), merged, and which they were;
/// `None` when there are none.
async fn runner_reports(sb: &Sandbox, setup: &runners::Setup) -> Option<(Parsed, String)> {
    let mut list = format!(
        "ls -1 {0} 2>/dev/null | sed 's|^|{0}/|'",
        runners::REPORT_DIR
    );
    if setup.junit_files {
        list.push_str(&format!(
            "; find \"$PWD\" \\( {} \\) 2>/dev/null",
            runners::JUNIT_FILES
        ));
    }
    let names = sb.run(sh(&list, 60)).await.ok()?;
    let mut all = Parsed::default();
    let mut sources = std::collections::BTreeSet::new();
    for name in String::from_utf8_lossy(&names.stdout)
        .lines()
        .take(MAX_REPORTS)
    {
        let Ok(text) = sb.client().read_file(name).await else {
            continue;
        };
        if let Some((p, what)) = runners::read_report(name, &String::from_utf8_lossy(&text)) {
            all.merge(p);
            sources.insert(what);
        }
    }
    if all.results.is_empty() {
        return None;
    }
    let mut source = sources.into_iter().collect::<Vec<_>>().join("; ");
    if let Some(note) = all.repeated_note() {
        source = format!("{source}; {note}");
    }
    Some((all, source))
}

/// How many report files one run is read from at most.
const MAX_REPORTS: usize = 10_000;
