//! The JavaScript corpus: real npm packages whose published tarballs carry their suites, one
//! per runner (tape twice, `node --test`; Mocha, Jest and Vitest through plain `npm test`,
//! their reports asked for by forkbox and by hand in the native runs), each run
//! natively in Debian chroots (bookworm's Node 18, trixie's Node 20) and through `forkbox
//! migrate` from `node-bookworm` to `node-trixie` with one plan that changes nothing. Promises
//! checked per package: forkbox's baseline passes exactly the tests the native Node 18 run
//! passes, the plan's run exactly those of the native Node 20 run (test for test, by the
//! names the runner gives them); every id names a test a person can find in the suite's
//! source; the plan that changes nothing is accepted with no test lost.
//!
//! Each tarball is fetched with `npm pack` into a cache (never committed); its lock file is
//! written with `npm install --package-lock-only` (the development dependencies trimmed to
//! what the suite needs), and `npm ci` on the host makes the one `node_modules` both the
//! chroots and the sandboxes use. Needs npm's registry and a Debian mirror; runs with
//! `FORKBOX_CORPUS=1` (two packages: qs's tape suite, whose hundreds of same-named assertions
//! once collapsed, and Mocha through plain `npm test`, the runner's report asked for by
//! forkbox; the reports of the other runners are read from fixtures in `forkbox-reports`'s
//! tests) or `all` (six), like the PyPI corpus. Prints `FIGURE` lines.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};

use forkbox_migrate::reports::{Format, Results};
use forkbox_test_infra as infra;

mod common;
use common::passed;

/// The chroot of Debian `suite` with its Node.js (made once per test home).
fn chroot(dir: &Path, suite: &str) -> PathBuf {
    common::chroot(dir, suite, &["nodejs"], "usr/bin/node")
}

/// The suite run natively in `root` (see [`common::native`]); its results and how long it took.
fn native(root: &Path, code: &Path, test: &str) -> (Results, u64) {
    common::native_results(root, code, test, &[], Format::Auto)
}

/// The suite's source: every JavaScript file outside `node_modules`.
fn sources(dir: &Path, into: &mut String) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            if e.file_name() != "node_modules" {
                sources(&p, into);
            }
        } else if p
            .extension()
            .is_some_and(|x| ["js", "mjs", "cjs", "ts"].iter().any(|e| x == *e))
        {
            // As the runner prints a title: the string's escapes undone.
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            into.push_str(&text.replace("\\'", "'").replace("\\\"", "\""));
        }
    }
}

/// Whether a person finds the test `id` names in the suite: its own name (the last part of
/// its path, the ordinal left out) is written in the source (its first three words, for a
/// name the suite builds: `'skips empty string key with ' + testCase.input`), or it is a
/// file.
fn findable(id: &str, source: &str) -> bool {
    let base = match id.rsplit_once(" #") {
        Some((b, n)) if n.bytes().all(|c| c.is_ascii_digit()) => b,
        _ => id,
    };
    let name = base.rsplit(" > ").next().unwrap_or(base);
    let words: Vec<&str> = name.split(' ').collect();
    // Mocha's full titles put the suites' names before the test's, with spaces.
    let ends =
        (1..words.len()).any(|i| words.len() - i >= 3 && source.contains(&words[i..].join(" ")));
    name.starts_with("/work/")
        || source.contains(name)
        || (words.len() > 3 && source.contains(&words[..3].join(" ")))
        || ends
}

/// The pass sets of the native run and forkbox's equal, but for the tests in `timing`, which
/// depend on the machine's speed (under emulation they can fail where a native run passes):
/// those must be reported by both, under the same id, whatever their outcome.
fn same(spec: &str, what: &str, native: &Results, ours: &Results, timing: &[&str]) {
    for t in timing {
        assert!(
            native.contains_key(*t) && ours.contains_key(*t),
            "{spec} ({what}): {t:?} is not reported by both: {native:?} {ours:?}"
        );
    }
    let judged = |r: &Results| -> Results {
        r.iter()
            .filter(|(id, _)| !timing.contains(&id.as_str()))
            .map(|(id, o)| (id.clone(), *o))
            .collect()
    };
    let (native, ours) = (judged(native), judged(ours));
    let (a, b) = (passed(&native), passed(&ours));
    assert!(
        a == b,
        "{spec} ({what}): pass sets differ; only native: {:?}; only forkbox: {:?}",
        a.difference(&b).take(5).collect::<Vec<_>>(),
        b.difference(&a).take(5).collect::<Vec<_>>()
    );
}

/// A package and how its suite runs: its development dependencies kept (and added), its
/// `npm test` script, the test command forkbox is given, the one the native runs use (the
/// same, or with the runner's machine-readable reporter asked for by hand: the reference
/// forkbox's own reading is checked against), how many tests pass at least, and which
/// depend on the machine's speed.
struct Suite<'a> {
    spec: &'a str,
    keep: &'a [&'a str],
    add: &'a [(&'a str, &'a str)],
    npm_test: Option<&'a str>,
    test: &'a str,
    native: Option<&'a str>,
    at_least: usize,
    timing: &'a [&'a str],
    /// Whether `FORKBOX_CORPUS=1` runs it; `all` runs every one.
    default: bool,
}

async fn check(s: Suite<'_>) {
    let Suite {
        spec,
        keep,
        add,
        npm_test,
        test,
        native: native_test,
        at_least,
        timing,
        default,
    } = s;
    if !common::runs(spec, default) {
        return;
    }
    let paths = infra::home();
    let old = infra::image(&paths, "node-bookworm");
    let new = infra::image(&paths, "node-trixie");
    let dir = paths.home().join("corpus-js");
    std::fs::create_dir_all(&dir).unwrap();
    let (bookworm, trixie) = (chroot(&dir, "bookworm"), chroot(&dir, "trixie"));
    let (_keep, code) = infra::npm::project(&dir, spec, keep, add, npm_test);

    let by_hand = native_test.unwrap_or(test);
    let (native18, ms18) = native(&bookworm, &code, by_hand);
    let (native20, ms20) = native(&trixie, &code, by_hand);
    let mut source = String::new();
    sources(&code, &mut source);
    common::check_native(spec, (&native18, &native20), at_least, |id| {
        findable(id, &source)
    });

    let common::OnePlan {
        report,
        ms: total_ms,
        cfg,
        out: _out,
    } = common::one_plan(
        &paths,
        (&old.to_string(), &new.to_string()),
        code.clone(),
        test,
        common::SAME,
    )
    .await;
    same(
        spec,
        "Node 18, the baseline",
        &native18,
        &report.baseline.results,
        timing,
    );
    same(
        spec,
        "Node 20, the plan",
        &native20,
        &report.plans[0].results,
        timing,
    );
    if npm_test.is_some() {
        assert!(
            report.results_source.contains("by forkbox"),
            "{spec}: results not read from the report forkbox asks the runner for: {}",
            report.results_source
        );
    }
    let v = &report.verdicts[0];
    let lost: Vec<&String> = v
        .lost
        .iter()
        .filter(|t| !timing.contains(&t.as_str()))
        .collect();
    assert!(lost.is_empty(), "{spec}: {v:?}");
    println!(
        "FIGURE corpus-js {spec}: {} tests pass natively on Node 18 ({ms18} ms), {} on Node 20 ({ms20} ms); forkbox baseline ({} runs side by side) {} ms, whole migration {total_ms} ms = {:.1}x (native 18 + native 20 = {} ms); results read from {}",
        passed(&native18).len(),
        passed(&native20).len(),
        cfg.runs,
        report.phases.baseline_ms,
        total_ms as f64 / (ms18 + ms20).max(1) as f64,
        ms18 + ms20,
        report.results_source,
    );
}

/// tape, the suite of the issue that found the collapse: hundreds of assertions named
/// "should be deeply equivalent" under 249 named tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qs_tape() {
    check(Suite {
        spec: "qs@6.13.0",
        keep: infra::npm::QS_KEEP,
        add: &[],
        npm_test: None,
        test: "node_modules/.bin/tape 'test/**/*.js'",
        native: None,
        at_least: 200,
        timing: &[],
        default: true,
    })
    .await;
}

/// tape again, a test per file of small named tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimist_tape() {
    check(Suite {
        spec: "minimist@1.2.8",
        keep: &["tape"],
        add: &[],
        npm_test: None,
        test: "node_modules/.bin/tape 'test/*.js'",
        native: None,
        at_least: 30,
        timing: &[],
        default: false,
    })
    .await;
}

/// `node --test` (its TAP, the default when the output is not a terminal). The suite uses
/// `t.plan`, which Node 18 lacks: every test fails there, natively and in forkbox alike, and
/// passes on Node 20 (the case a migration is for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastify_error_node_test() {
    check(Suite {
        spec: "@fastify/error@4.3.0",
        keep: &[],
        add: &[],
        npm_test: None,
        test: "node --test test/*.test.js",
        native: None,
        at_least: 20,
        timing: &[],
        default: false,
    })
    .await;
}

/// Mocha through plain `npm test` (`mocha test/test.js`): people read its spec output,
/// forkbox reads its runner's events (ids with the file); the native runs ask for its JSON
/// reporter by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sprintf_js_mocha_npm_test() {
    check(Suite {
        spec: "sprintf-js@1.0.3",
        keep: &[],
        add: &[("mocha", "10.8.2")],
        npm_test: Some("mocha test/test.js"),
        test: "npm test",
        native: Some("node_modules/.bin/mocha --reporter json test/test.js"),
        at_least: 3,
        // `assert.equal(Date.now(), sprintf("%s", Date.now))`: passes when both calls fall in
        // one millisecond, which under emulation they seldom do.
        timing: &["/work/test/test.js > sprintfjs should return formated strings for callbacks"],
        default: true,
    })
    .await;
}

/// Jest through plain `npm test` (`jest test/jest.test.js`, no `--json`): forkbox adds its
/// JSON report in a file; the native runs ask for `--json` by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_warning_jest_npm_test() {
    check(Suite {
        spec: "process-warning@5.1.1",
        keep: &["jest"],
        add: &[],
        npm_test: Some("jest test/jest.test.js"),
        test: "npm test",
        native: Some("node_modules/.bin/jest --json test/jest.test.js"),
        at_least: 1,
        timing: &[],
        default: false,
    })
    .await;
}

/// Vitest through plain `npm test` (`vitest run` on zod's TypeScript suites of `zod/mini`,
/// which import the package by its own name): forkbox adds its JSON reporter beside the
/// default one; the native runs ask for `--reporter=json` by hand. Vite 6 is the newest that
/// runs on Node 18.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zod_vitest_npm_test() {
    check(Suite {
        spec: "zod@4.1.12",
        keep: &[],
        add: &[("vitest", "3.2.4"), ("vite", "6.3.6")],
        npm_test: Some(ZOD_TESTS),
        test: "npm test",
        native: Some(&format!("node_modules/.bin/{ZOD_TESTS} --reporter=json")),
        at_least: 30,
        timing: &[],
        default: false,
    })
    .await;
}

const ZOD_TESTS: &str =
    "vitest run src/v4/mini/tests/string.test.ts src/v4/mini/tests/number.test.ts";
