//! `forkbox migrate`: the command line over `forkbox-migrate`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use forkbox_engine::paths::Paths;
use forkbox_migrate::reports::Format;
use forkbox_migrate::{Event, MigrateConfig};

#[derive(clap::Args)]
pub struct MigrateArgs {
    /// A TOML file with a `[migration]` table holding these options (the flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The old toolchain's image (NAME or NAME@N).
    #[arg(long)]
    from: Option<String>,
    /// The new toolchain's image.
    #[arg(long)]
    to: Option<String>,
    /// The code to port (a directory).
    #[arg(long)]
    code: Option<PathBuf>,
    /// The test command, run in the code's directory; it must print results (pytest -rA,
    /// JUnit XML, go test -json, cargo test, TAP).
    #[arg(long)]
    test: Option<String>,
    /// The plans file (TOML, `[[plan]]` tables); its directory is uploaded to /plan.
    #[arg(long)]
    plans: Option<PathBuf>,
    /// Where the report and patches go.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Baseline runs, to tell flaky tests.
    #[arg(long)]
    runs: Option<u32>,
    /// A setup command run in the new image's sandbox before the snapshot (repeatable).
    #[arg(long = "setup")]
    setup: Vec<String>,
    /// A host the setup commands may reach (repeatable), e.g. pypi.org and
    /// files.pythonhosted.org; baseline and forks have no network.
    #[arg(long = "setup-allow", value_name = "HOST")]
    setup_allow: Vec<String>,
    /// A secret the setup commands' HTTPS requests carry (repeatable): NAME@HOST[,HOST...]
    /// from this host's $NAME, NAME=env:VAR@HOSTS or NAME=file:PATH@HOSTS; the guest sees a
    /// placeholder. Allows the HOSTS during setup; baseline and forks have no network.
    #[arg(long = "secret", value_name = "NAME@HOSTS", value_parser = crate::daemon::secret_arg)]
    secrets: Vec<forkbox_engine::api::SecretSpec>,
    /// A directory (relative to the code) the setup commands make that the baseline runs get
    /// too, copied from the prepared sandbox (repeatable): `node_modules`, so `npm ci` runs once.
    #[arg(long = "share", value_name = "DIR")]
    share: Vec<String>,
    /// Reject plans that change test files (without it they are listed in the report).
    #[arg(long)]
    protect_tests: bool,
    /// Which files are test files, as a glob relative to the code (repeatable: `tests/**`);
    /// replaces the runners' usual naming for the report's test changes and --protect-tests.
    #[arg(long = "tests", value_name = "GLOB")]
    tests: Vec<String>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct MigrationTable {
    from: Option<String>,
    to: Option<String>,
    code: Option<PathBuf>,
    test: Option<String>,
    plans: Option<PathBuf>,
    out: Option<PathBuf>,
    runs: Option<u32>,
    #[serde(default)]
    setup: Vec<String>,
    #[serde(default)]
    setup_allow: Vec<String>,
    /// `--secret`'s forms (the value from the environment or a file, never the config).
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    share: Vec<String>,
    rate_cpu_second: Option<f64>,
    rate_gib_second: Option<f64>,
    #[serde(default)]
    protect_tests: bool,
    #[serde(default)]
    tests: Vec<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    migration: MigrationTable,
}

/// The config's `secrets` (`--secret`'s forms), their values read from the environment or files.
fn config_secrets(forms: &[String]) -> Result<Vec<forkbox_engine::api::SecretSpec>, String> {
    forms
        .iter()
        .map(|s| crate::daemon::secret_arg(s).map_err(|e| format!("secrets in the config: {e}")))
        .collect()
}

/// Exit code of a usage error (as clap's own).
const USAGE: u8 = 2;

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("forkbox: {msg}");
    ExitCode::from(USAGE)
}

pub fn migrate(paths: &Paths, a: MigrateArgs) -> anyhow::Result<ExitCode> {
    forkbox_engine::limits::raise_open_files();
    let json = a.json;
    let cfg = match settle(a)? {
        Ok(cfg) => cfg,
        Err(usage) => return Ok(usage),
    };
    // The images forkbox carries build on first use, with their progress, as `run` does.
    for (flag, image) in [("--from", &cfg.from), ("--to", &cfg.to)] {
        match image.parse() {
            Ok(reference) => crate::bundled::ensure_blocking(paths, &reference, false)?,
            Err(e) => return Ok(usage(format!("{flag} {image}: {e}"))),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let board = Board::new(std::io::stderr().is_terminal());
    let ticker = board.clone().tick();
    let shown = board.clone();
    // A daemon of this home shows the run in its console.
    let told = Arc::new(rt.block_on(crate::announce::Announcer::start(paths, &cfg)));
    let teller = told.clone();
    let report = rt.block_on(forkbox_migrate::migrate(
        paths,
        &cfg,
        Arc::new(move |ev: Event<'_>| {
            shown.event(ev);
            teller.event(ev);
        }),
    ));
    board.stop();
    let _ = ticker.join();
    let said = report.as_ref().map_err(|e| e.to_string());
    rt.block_on(told.finish(said, &cfg.out));
    let report = match report {
        Ok(r) => r,
        Err(e) => bail!("{e}"),
    };
    say_report(&report, cfg.out.clone(), json)
}

/// The `[migration]` table of the `--config` file (empty without one) and the directory its
/// paths are relative to; a usage error (said on stderr) as its exit code.
fn config_table(
    config: Option<&Path>,
) -> anyhow::Result<Result<(MigrationTable, PathBuf), ExitCode>> {
    let Some(p) = config else {
        return Ok(Ok((MigrationTable::default(), PathBuf::new())));
    };
    let text = std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))?;
    let f: ConfigFile = match toml::from_str(&text) {
        Ok(f) => f,
        Err(e) => return Ok(Err(usage(format!("{}: {e}", p.display())))),
    };
    Ok(Ok((
        f.migration,
        p.parent().map(Path::to_path_buf).unwrap_or_default(),
    )))
}

/// A shared directory is a relative path inside the code: no root, no `..`, not empty.
fn inside_the_code(s: &str) -> bool {
    !s.is_empty()
        && Path::new(s)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// The migration's configuration from the flags over the `--config` file's table, checked;
/// a usage error (said on stderr) as its exit code.
fn settle(a: MigrateArgs) -> anyhow::Result<Result<MigrateConfig, ExitCode>> {
    let (table, base) = match config_table(a.config.as_deref())? {
        Ok(t) => t,
        Err(code) => return Ok(Err(code)),
    };
    let rel = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
    let (Some(from), Some(to), Some(code), Some(test), Some(plans)) = (
        a.from.or(table.from),
        a.to.or(table.to),
        a.code.or(table.code.map(rel)),
        a.test.or(table.test),
        a.plans.or(table.plans.map(rel)),
    ) else {
        return Ok(Err(usage("migrate needs --from, --to, --code, --test and --plans (or a --config with a [migration] table)")));
    };
    if !code.is_dir() {
        return Ok(Err(usage(format!(
            "--code {}: not a directory",
            code.display()
        ))));
    }
    let plan_list = match forkbox_migrate::plans::load(&plans) {
        Ok(p) => p,
        Err(e) => return Ok(Err(usage(e))),
    };
    let out = a
        .out
        .or(table.out.map(rel))
        .unwrap_or_else(|| PathBuf::from("forkbox-migrate-out"));
    let mut setup = table.setup;
    setup.extend(a.setup);
    let mut setup_allow = table.setup_allow;
    setup_allow.extend(a.setup_allow);
    let setup_network = forkbox_engine::net::NetworkPolicy {
        internet: false,
        allow: setup_allow,
        deny: Vec::new(),
    };
    if let Err(e) = setup_network.validate() {
        return Ok(Err(usage(format!("--setup-allow: {e}"))));
    }
    let mut setup_secrets = match config_secrets(&table.secrets) {
        Ok(s) => s,
        Err(e) => return Ok(Err(usage(e))),
    };
    setup_secrets.extend(a.secrets);
    let mut share = table.share;
    share.extend(a.share);
    if let Some(bad) = share.iter().find(|s| !inside_the_code(s)) {
        return Ok(Err(usage(format!(
            "--share {bad:?}: give a directory inside the code, relative to it (node_modules)"
        ))));
    }
    let mut test_globs = table.tests;
    test_globs.extend(a.tests);
    let tests = match forkbox_migrate::integrity::TestFiles::new(&test_globs) {
        Ok(t) => t,
        Err(e) => return Ok(Err(usage(e))),
    };
    let cfg = MigrateConfig {
        from,
        to,
        code,
        test,
        plans_dir: plans
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(".")),
        plans: plan_list,
        out: out.clone(),
        runs: a.runs.or(table.runs).unwrap_or(2),
        setup,
        setup_network,
        setup_secrets,
        share,
        format: Format::Auto,
        test_timeout_secs: 3600,
        rate_cpu_second: table.rate_cpu_second.unwrap_or(0.000_014),
        rate_gib_second: table.rate_gib_second.unwrap_or(0.000_002),
        llm: forkbox_migrate::llm::LlmEndpoint::from_env(),
        cli: std::env::current_exe().ok(),
        protect_tests: a.protect_tests || table.protect_tests,
        tests,
        api_host: Some(forkbox_server::spawn_private),
    };
    let uses_llm = cfg.plans.iter().any(|p| {
        matches!(
            p.porter.kind(),
            Some(forkbox_migrate::plans::PorterKind::Llm(_))
        )
    });
    if uses_llm && cfg.llm.is_none() {
        return Ok(Err(usage(forkbox_migrate::llm::LlmError::NoEndpoint)));
    }
    if cfg.runs == 0 {
        return Ok(Err(usage("--runs must be at least 1")));
    }
    Ok(Ok(cfg))
}

/// The verdicts and where the winner and the report are (or the report as JSON); 0 when a
/// plan won.
fn say_report(
    report: &forkbox_migrate::flow::MigrateReport,
    out: PathBuf,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if json {
        crate::print_json(report)?;
    } else {
        for v in &report.verdicts {
            println!(
                "{:<12} {:<9} {}",
                v.plan,
                if v.accepted { "accepted" } else { "rejected" },
                v.reason
            );
        }
        let out = std::fs::canonicalize(&out).unwrap_or(out);
        match (&report.winner, &report.winner_patch) {
            (Some(w), Some(patch)) => println!(
                "winner: {w}\npatch:  {}\nreport: {}",
                out.join(patch).display(),
                out.join("report.html").display()
            ),
            (Some(w), None) => println!(
                "winner: {w} (it changes nothing: the code passes as it is)\nreport: {}",
                out.join("report.html").display()
            ),
            (None, _) => println!(
                "no plan was accepted; see {}",
                out.join("report.html").display()
            ),
        }
    }
    Ok(if report.winner.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// How often a pipe hears where unfinished rows are.
const PIPE_BEAT: Duration = Duration::from_secs(10);

/// Live progress: one line per fork (phase, time in it, time since the fork began, tests so
/// far) redrawn in place on a terminal; elsewhere each change of phase is a line of its own.
#[derive(Clone)]
struct Board {
    tty: bool,
    start: Instant,
    stopped: Arc<AtomicBool>,
    rows: Arc<Mutex<Rows>>,
}

#[derive(Default)]
struct Rows {
    forks: Vec<Row>,
    /// Lines of the board on screen now.
    drawn: usize,
}

struct Row {
    plan: String,
    phase: String,
    began: Instant,
    phase_began: Instant,
    tests: usize,
}

impl Board {
    fn new(tty: bool) -> Board {
        Board {
            tty,
            start: Instant::now(),
            stopped: Arc::new(AtomicBool::new(false)),
            rows: Default::default(),
        }
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, Rows> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stamp(&self) -> String {
        format!("[{:>6.1} s]", self.start.elapsed().as_secs_f64())
    }

    fn event(&self, ev: Event<'_>) {
        let mut rows = self.rows();
        let mut err = std::io::stderr().lock();
        match ev {
            Event::Note(line) => {
                if self.tty {
                    Self::erase(&mut rows, &mut err);
                }
                let _ = writeln!(err, "{} {line}", self.stamp());
            }
            Event::Fork { plan, phase, tests } => {
                let now = Instant::now();
                let i = match rows.forks.iter().position(|r| r.plan == plan) {
                    Some(i) => i,
                    None => {
                        rows.forks.push(Row {
                            plan: plan.to_string(),
                            phase: String::new(),
                            began: now,
                            phase_began: now,
                            tests: 0,
                        });
                        rows.forks.len() - 1
                    }
                };
                let row = &mut rows.forks[i];
                let changed = row.phase != phase;
                // In a pipe, a change of phase is a line saying how long the last one took.
                let said = (changed && !self.tty).then(|| match row.phase.is_empty() {
                    true => format!("{:<14} {phase}", row.plan),
                    false => format!(
                        "{:<14} {phase:<16} ({} took {:.1} s{})",
                        row.plan,
                        row.phase,
                        row.phase_began.elapsed().as_secs_f64(),
                        match row.tests {
                            0 => String::new(),
                            n => format!(", {n} tests"),
                        }
                    ),
                });
                if changed {
                    row.phase = phase.to_string();
                    row.phase_began = now;
                }
                row.tests = tests;
                if self.tty {
                    Self::erase(&mut rows, &mut err);
                } else if let Some(line) = said {
                    let _ = writeln!(err, "{} {line}", self.stamp());
                }
            }
        }
        if self.tty {
            Self::draw(&mut rows, &mut err);
        }
    }

    fn line(r: &Row) -> String {
        format!(
            "{:<14} {:<16} {:>6.1} s in phase {:>7.1} s in all {:>5} tests",
            r.plan,
            r.phase,
            r.phase_began.elapsed().as_secs_f64(),
            r.began.elapsed().as_secs_f64(),
            r.tests
        )
    }

    fn erase(rows: &mut Rows, err: &mut impl Write) {
        if rows.drawn > 0 {
            // Up to the board's first line, then clear to the end of the screen.
            let _ = write!(err, "\x1b[{}F\x1b[J", rows.drawn);
            rows.drawn = 0;
        }
    }

    fn draw(rows: &mut Rows, err: &mut impl Write) {
        for r in &rows.forks {
            let _ = writeln!(err, "{}", Self::line(r));
        }
        rows.drawn = rows.forks.len();
        let _ = err.flush();
    }

    /// Redraws the board each half second so the clocks move on a terminal; in a pipe, says
    /// every 10 s where each unfinished row is (its phase, the time in it, tests so far).
    fn tick(self) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut last = Instant::now();
            while !self.stopped.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(500));
                let mut rows = self.rows();
                let mut err = std::io::stderr().lock();
                if self.tty {
                    if rows.drawn > 0 {
                        Self::erase(&mut rows, &mut err);
                        Self::draw(&mut rows, &mut err);
                    }
                } else if last.elapsed() >= PIPE_BEAT {
                    last = Instant::now();
                    for r in rows.forks.iter().filter(|r| !Self::finished(&r.phase)) {
                        let _ = writeln!(err, "{} {}", self.stamp(), Self::line(r));
                    }
                }
            }
        })
    }

    fn finished(phase: &str) -> bool {
        matches!(phase, "done" | "accepted" | "rejected" | "failed")
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}
