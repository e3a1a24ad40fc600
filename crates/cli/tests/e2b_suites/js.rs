//! E2B's JavaScript SDK suite (`js-sdk/`: `packages/js-sdk` at 2.45.0, whose tests import the
//! SDK from its own `src`), run by vitest: its node projects (`unit`, `connectionConfig`,
//! `template`) as its config defines them, two test files at a time. A test is named
//! `FILE > DESCRIBE > TEST`, as in the list.

use std::path::Path;
use std::process::Command;

use forkbox_test_infra as infra;

use crate::list::{judge, leave_out, listed, take_reruns, Outcome};
use crate::{flagged, in_mode, suites, Mode, AGAIN_AT_MOST};

const SUITE: &str = "js-sdk";

/// vitest's arguments that pick some of the suite's tests instead of all of them
/// (`FORKBOX_E2B_JS_SUITE_ARGS`, say `tests/sandbox/files -t watch`), when given.
fn selection() -> Option<String> {
    std::env::var("FORKBOX_E2B_JS_SUITE_ARGS")
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// The test files the default run leaves out (all of them run with `FORKBOX_E2B_SUITES_ALL=1`):
/// the template tests that build live templates. The Python suite's sync template tests,
/// which run, make the same builds through the same requests (`test_build`,
/// `test_background_build`, `methods/test_run_cmd`, `methods/test_make_symlink`); each build
/// boots guests under TCG. The JavaScript template tests that check the SDK's side against a
/// mock, and its tag tests, stay.
pub fn left_out() -> &'static [&'static str] {
    if crate::all() {
        &[]
    } else {
        &[
            "tests/template/build.test.ts",
            "tests/template/backgroundBuild.test.ts",
            "tests/template/methods/runCmd.test.ts",
            "tests/template/methods/makeSymlink.test.ts",
        ]
    }
}

/// vitest's JSON report (the fields read of it).
#[derive(serde::Deserialize)]
struct Report {
    #[serde(rename = "testResults")]
    files: Vec<FileReport>,
}

#[derive(serde::Deserialize)]
struct FileReport {
    name: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    message: String,
    #[serde(rename = "assertionResults", default)]
    tests: Vec<TestReport>,
}

#[derive(serde::Deserialize)]
struct TestReport {
    #[serde(rename = "ancestorTitles", default)]
    ancestors: Vec<String>,
    title: String,
    status: String,
    #[serde(rename = "failureMessages", default)]
    failures: Vec<String>,
}

/// Each test's outcome in `report`, for a suite copied to `root`. A file that failed before
/// any of its tests ran (it did not load) is one failed test named by the file.
fn outcomes(report: Report, root: &Path) -> Vec<Outcome> {
    let mut all = Vec::new();
    for f in report.files {
        let file = Path::new(&f.name)
            .strip_prefix(root)
            .map(|p| p.display().to_string())
            .unwrap_or(f.name.clone());
        if f.tests.is_empty() && f.status == "failed" {
            all.push(Outcome {
                test: file.clone(),
                outcome: "failed".into(),
                why: first_line(&f.message),
            });
        }
        for t in f.tests {
            let mut name = vec![file.as_str()];
            name.extend(t.ancestors.iter().map(String::as_str));
            name.push(&t.title);
            let outcome = match t.status.as_str() {
                "passed" => "passed",
                "failed" => "failed",
                _ => "skipped",
            };
            all.push(Outcome {
                test: name.join(" > "),
                outcome: outcome.into(),
                why: t
                    .failures
                    .first()
                    .map(|m| first_line(m))
                    .unwrap_or_default(),
            });
        }
    }
    all
}

fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .chars()
        .take(300)
        .collect()
}

/// Runs vitest on a copy of the suite (`args`: which tests; none: every test of the node
/// projects) through `client`, `workers` test files at a time: every test's outcome and the
/// wall time. vitest's whole output is kept in the test home as `e2b-suite-NAME.log`.
fn vitest(
    name: &str,
    client: &dyn Fn(&Path) -> Command,
    args: &[String],
    workers: usize,
) -> (Vec<Outcome>, f64) {
    let suites = infra::e2b_suites().unwrap();
    let sdk = suites.join(SUITE);
    let deps = infra::e2b_suite_js(&sdk);
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("suite");
    let st = Command::new("cp")
        .arg("-r")
        .arg(&sdk)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(st.success());
    std::os::unix::fs::symlink(deps.join("node_modules"), copy.join("node_modules")).unwrap();
    // The SDK as released (its bundle test reads `dist`): the same source, built by E2B.
    std::os::unix::fs::symlink(deps.join("node_modules/e2b/dist"), copy.join("dist")).unwrap();
    let config = "vitest.forkbox.mts";
    std::fs::copy(
        infra::repo_root()
            .join("crates/e2b/tests/suites")
            .join(config),
        copy.join(config),
    )
    .unwrap();
    let report = work.path().join("report.json");
    let started = std::time::Instant::now();
    let node = which("node");
    let out = client(&node)
        .arg(copy.join("node_modules/vitest/vitest.mjs"))
        .args(["run", "--config", config])
        .args(["--project", "unit", "--project", "connectionConfig"])
        .args(["--project", "template"])
        .arg(format!("--maxWorkers={workers}"))
        .args(left_out().iter().map(|f| format!("--exclude={f}")))
        .args(["--reporter=dot", "--reporter=json"])
        .arg(format!("--outputFile.json={}", report.display()))
        .args(args)
        .env("NO_COLOR", "1")
        .env("CI", "1")
        .current_dir(&copy)
        .output()
        .unwrap();
    let secs = started.elapsed().as_secs_f64();
    let log = infra::home().home().join(format!("e2b-suite-{name}.log"));
    let mut whole = out.stdout.clone();
    whole.extend_from_slice(&out.stderr);
    std::fs::write(&log, &whole).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let tail: Vec<&str> = text.lines().rev().take(60).collect();
    for line in tail.iter().rev() {
        println!("{line}");
    }
    println!("vitest's whole output: {}", log.display());
    let report: Report = match std::fs::read(&report) {
        Ok(r) => serde_json::from_slice(&r).unwrap(),
        Err(e) => panic!(
            "vitest wrote no report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    };
    let copy = copy.canonicalize().unwrap_or(copy);
    (outcomes(report, &copy), secs)
}

fn which(program: &str) -> std::path::PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!path.is_empty(), "{program} is not on PATH");
    path.into()
}

/// Runs E2B's JavaScript suite through `client` and judges it against the list for `mode`.
/// The files of a few tests that failed unlisted run once more, one at a time: a test of
/// theirs that passes then was starved beside the others and is said FLAKY.
fn run_js(mode: &str, client: &dyn Fn(&Path) -> Command) {
    let name = format!("js-{mode}");
    let args: Vec<String> = selection()
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let (mut outcomes, secs) = vitest(&name, client, &args, 2);
    let mut listed = listed(SUITE, mode);
    leave_out(&mut listed, left_out());
    let again: Vec<String> = outcomes
        .iter()
        .filter(|o| o.outcome == "failed" && !listed.contains_key(&o.test))
        .map(|o| o.test.clone())
        .collect();
    if !again.is_empty() && again.len() <= AGAIN_AT_MOST {
        let mut files: Vec<String> = again
            .iter()
            .map(|t| t.split(" > ").next().unwrap_or(t).to_string())
            .collect();
        files.sort();
        files.dedup();
        println!(
            "{} failed unlisted: their {} files run once more, one at a time",
            again.len(),
            files.len()
        );
        let (second, _) = vitest(&format!("{name}-again"), client, &files, 1);
        take_reruns(&mut outcomes, second, &again);
    }
    judge(
        SUITE,
        mode,
        &listed,
        (outcomes, secs),
        selection().is_none(),
    );
}

/// E2B's JavaScript SDK suite with only `E2B_DOMAIN` and a key, as E2B's docs set it up: its
/// mocked tests (msw answers `https://api.DOMAIN`) and its tests of a live sandbox both run.
#[test]
fn javascript_sdk_suite_in_domain_mode() {
    let Some(_) = suites() else { return };
    in_mode("e2b-suite-js-domain", Mode::Domain, "base", |client| {
        run_js("domain", client)
    });
}

/// E2B's JavaScript SDK suite with `E2B_API_URL` and `E2B_SANDBOX_URL` at the daemon's TCP
/// listener (with `FORKBOX_E2B_SUITES_ALL=1`).
#[test]
fn javascript_sdk_suite_in_url_mode() {
    let Some(_) = flagged(suites) else { return };
    in_mode("e2b-suite-js-url", Mode::Url, "base", |client| {
        run_js("url", client)
    });
}
