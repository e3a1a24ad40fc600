//! E2B's Python suites, run by pytest two tests at a time: the Python SDK's (`python-sdk/`: its
//! `tests` at the commit of `e2b` 2.45.1, with that release from PyPI) and the code
//! interpreter's (`code-interpreter/python`: its `tests` at `e2b-code-interpreter` 2.9.1, with
//! that release and its lock file's `e2b` 2.39.1).

use std::path::Path;
use std::process::Command;

use forkbox_test_infra as infra;

use crate::list::{judge, leave_out, listed, take_reruns, Outcome};
use crate::{flagged, in_mode, suites, Mode, AGAIN_AT_MOST};

/// Pytest's arguments that pick some of the suite's tests instead of all of them
/// (`FORKBOX_E2B_SUITE_ARGS`, say `tests/sync/sandbox_sync/files -k secured`), when given.
fn selection() -> Option<String> {
    std::env::var("FORKBOX_E2B_SUITE_ARGS")
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// What the default run leaves out of the Python SDK suite (all of it runs with
/// `FORKBOX_E2B_SUITES_ALL=1`): its async half. E2B keeps the suite's sync and async tests as
/// twins (`tests/sync/X_sync`, `tests/async/X_async`: 309 and 306 tests), making the same
/// requests through the SDK's two clients; the sync ones run, and E2B's async client is driven
/// against the daemon in the default run by `e2b.rs`'s `python_sdk_async_and_the_v1_paths`
/// (and its volume file tests by `volume_files` below). The async half took ~4.5 of the
/// suite's 9 minutes under TCG, its template builds most of it.
pub fn left_out() -> &'static [&'static str] {
    if crate::all() {
        &[]
    } else {
        &["tests/async"]
    }
}

/// Which of a suite's tests a pytest run takes.
#[derive(Clone, Copy)]
enum Tests<'a> {
    /// The whole suite (or `FORKBOX_E2B_SUITE_ARGS`' choice) but these folders, two at a time.
    AllBut(&'a [&'a str]),
    /// These tests, one at a time.
    Only(&'a [String]),
}

/// Runs E2B's Python suite from a copy of `suite` (pytest writes beside the tests), through
/// `client` (the program to run, made ready to reach the daemon): every test's outcome of
/// those `tests` names. Pytest's whole output is kept in the test home as `e2b-suite-NAME.log`.
fn pytest(
    name: &str,
    python: &Path,
    suite: &Path,
    client: &impl Fn(&Path) -> Command,
    tests: Tests<'_>,
) -> (Vec<Outcome>, f64) {
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("suite");
    let st = Command::new("cp")
        .arg("-r")
        .arg(suite)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(st.success());
    let outcomes = work.path().join("outcomes.jsonl");
    let plugin = infra::repo_root().join("crates/e2b/tests/suites");
    let started = std::time::Instant::now();
    let mut cmd = client(python);
    // Two at a time; tests run again, one at a time.
    let workers = if matches!(tests, Tests::Only(_)) {
        "0"
    } else {
        "2"
    };
    cmd.args([
        "-m",
        "pytest",
        "-n",
        workers,
        "-q",
        "-rfE",
        "-p",
        "no:cacheprovider",
    ])
    .args(["-p", "forkbox_outcomes"]);
    match (tests, selection()) {
        (Tests::Only(tests), _) => cmd.args(tests),
        (Tests::AllBut(_), Some(args)) => cmd.args(args.split_whitespace()),
        (Tests::AllBut(skip), None) => cmd
            .arg("tests")
            .args(skip.iter().map(|d| format!("--ignore={d}"))),
    };
    let out = cmd
        .env("PYTHONPATH", &plugin)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("FORKBOX_OUTCOMES", &outcomes)
        .current_dir(&copy)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The whole of pytest's output is kept; the summary it ends with is printed.
    let log = infra::home().home().join(format!("e2b-suite-{name}.log"));
    std::fs::write(&log, &out.stdout).unwrap();
    let tail: Vec<&str> = stdout.lines().rev().take(150).collect();
    for line in tail.iter().rev() {
        println!("{line}");
    }
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    println!("pytest's whole output: {}", log.display());
    let secs = started.elapsed().as_secs_f64();
    let all = std::fs::read_to_string(&outcomes)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (all, secs)
}

/// Runs E2B's Python suite through `client` and judges it against the list for `mode`. A test
/// that fails unlisted is run once more, alone, when there are few: one that then passes was
/// starved of the machine beside the others (the suite's own timeouts are 30 s under TCG) and
/// is said as such; one that fails again fails the run.
fn run_python(suites: &Path, mode: &str, client: &dyn Fn(&Path) -> Command) {
    let python = infra::e2b_suite_python();
    run_pytest_suite(
        "python-sdk",
        &python,
        &suites.join("python-sdk"),
        (mode, left_out()),
        client,
    );
}

/// Runs the Python suite `list_name` in `suite` with `python` in `mode` but for its folders
/// `skip`, judged against the list.
fn run_pytest_suite(
    list_name: &str,
    python: &Path,
    suite: &Path,
    (mode, skip): (&str, &[&str]),
    client: &dyn Fn(&Path) -> Command,
) {
    let (python, suite) = (python.to_path_buf(), suite.to_path_buf());
    let name = format!("{list_name}-{mode}");
    let (mut outcomes, secs) = pytest(&name, &python, &suite, &client, Tests::AllBut(skip));
    let mut listed = listed(list_name, mode);
    leave_out(&mut listed, skip);
    let again: Vec<String> = outcomes
        .iter()
        .filter(|o| o.outcome == "failed" && !listed.contains_key(&o.test))
        .map(|o| o.test.clone())
        .collect();
    if !again.is_empty() && again.len() <= AGAIN_AT_MOST {
        println!(
            "{} failed unlisted: each runs once more, alone",
            again.len()
        );
        let (second, _) = pytest(
            &format!("{name}-again"),
            &python,
            &suite,
            &client,
            Tests::Only(&again),
        );
        take_reruns(&mut outcomes, second, &again);
    }
    judge(
        list_name,
        mode,
        &listed,
        (outcomes, secs),
        selection().is_none(),
    );
}

/// E2B's Python SDK suite with only `E2B_DOMAIN` and a key, as E2B's docs set it up.
#[test]
fn python_sdk_suite_in_domain_mode() {
    let Some(suites) = suites() else { return };
    in_mode("e2b-suite-domain", Mode::Domain, "base", |client| {
        run_python(&suites, "domain", client);
        volume_files(&suites, client);
    });
}

/// E2B's volume file tests (`test_file.py`, sync and async, unchanged) with volumes on the
/// daemon: E2B's own fixtures answer every content call with a mock, so beside the tests goes
/// `crates/e2b/tests/suites/volume-content/conftest.py`, whose fixtures make real volumes
/// through the SDK. Every test passes but the one E2B itself skips.
fn volume_files(suites: &Path, client: &dyn Fn(&Path) -> Command) {
    let work = tempfile::tempdir().unwrap();
    let from = suites.join("python-sdk");
    for dir in ["sync/volume_sync", "async/volume_async"] {
        let to = work.path().join("tests").join(dir);
        std::fs::create_dir_all(&to).unwrap();
        std::fs::copy(
            from.join("tests").join(dir).join("test_file.py"),
            to.join("test_file.py"),
        )
        .unwrap();
    }
    std::fs::copy(from.join("pytest.ini"), work.path().join("pytest.ini")).unwrap();
    let ours = infra::repo_root().join("crates/e2b/tests/suites/volume-content/conftest.py");
    std::fs::copy(ours, work.path().join("tests/conftest.py")).unwrap();
    let outcomes = work.path().join("outcomes.jsonl");
    let out = client(&infra::e2b_suite_python())
        .args([
            "-m",
            "pytest",
            "-n",
            "2",
            "-q",
            "-rfE",
            "-p",
            "no:cacheprovider",
        ])
        .args(["-p", "forkbox_outcomes", "tests"])
        .env(
            "PYTHONPATH",
            infra::repo_root().join("crates/e2b/tests/suites"),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("FORKBOX_OUTCOMES", &outcomes)
        .current_dir(work.path())
        .output()
        .unwrap();
    println!("{}", String::from_utf8_lossy(&out.stdout));
    let all: Vec<Outcome> = std::fs::read_to_string(&outcomes)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let wrong: Vec<&Outcome> = all
        .iter()
        .filter(|o| o.outcome != "passed" && !o.test.ends_with("test_list_with_depth"))
        .collect();
    assert!(
        all.len() >= 50,
        "E2B's volume file tests: {} ran",
        all.len()
    );
    assert!(
        wrong.is_empty(),
        "E2B's volume file tests on the daemon: {wrong:#?}"
    );
    println!(
        "E2B's volume file tests on the daemon: {} passed",
        all.len() - 2
    );
}

/// E2B's Python SDK suite with `E2B_API_URL` and `E2B_SANDBOX_URL` at the daemon's TCP
/// listener (with `FORKBOX_E2B_SUITES_ALL=1`).
#[test]
fn python_sdk_suite_in_url_mode() {
    let Some(suites) = flagged(suites) else {
        return;
    };
    in_mode("e2b-suite-url", Mode::Url, "base", |client| {
        run_python(&suites, "url", client)
    });
}

/// E2B's code-interpreter suite (its Python tests, `code-interpreter-v1` their template) with
/// `E2B_API_URL` and `E2B_SANDBOX_URL` at the daemon's TCP listener (with
/// `FORKBOX_E2B_SUITES_ALL=1`: ~7 min under TCG, past what the default run has room for).
#[test]
fn code_interpreter_suite_in_url_mode() {
    code_interpreter_suite("e2b-suite-ci-url", Mode::Url, "url");
}

/// The same with only `E2B_DOMAIN` and a key: the interpreter's client reaches its server at
/// `49999-ID.DOMAIN` (with `FORKBOX_E2B_SUITES_ALL=1`).
#[test]
fn code_interpreter_suite_in_domain_mode() {
    code_interpreter_suite("e2b-suite-ci-domain", Mode::Domain, "domain");
}

fn code_interpreter_suite(home: &str, mode: Mode, mode_name: &str) {
    let Some(suites) = flagged(suites) else {
        return;
    };
    let python = infra::e2b_code_interpreter_suite_python();
    let suite = suites.join("code-interpreter/python");
    in_mode(home, mode, "code-interpreter", |client| {
        run_pytest_suite(
            "code-interpreter",
            &python,
            &suite,
            (mode_name, &[]),
            client,
        )
    });
}
