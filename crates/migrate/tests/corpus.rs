//! The corpus: real projects nobody here wrote, from PyPI, each run natively in a Debian
//! bookworm chroot and through `forkbox migrate` (bookworm to bookworm, one plan that changes
//! nothing), both with the same Python 3.11 and pytest. Promises checked per project:
//! forkbox's baseline passes exactly the tests the native run passes (test for test); the
//! native run's outcome counts, as forkbox reads them, equal pytest's own summary line; and a
//! plan that changes nothing is accepted with no test lost.
//!
//! Needs PyPI (`pip download`) and a Debian mirror (`mmdebstrap`, once per test home). Runs
//! with `FORKBOX_CORPUS=1` (two projects) or `all` (six): 20-80 s per project under TCG.
//! Prints `FIGURE` lines: the native suite time, forkbox's baseline and whole-migration
//! times, and their ratios.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use forkbox_migrate::reports::{self, Counts, Outcome, Results};
use forkbox_test_infra as infra;

mod common;
use common::locked;

/// The test command, the same natively and in the sandboxes (`src` layouts import too; the
/// native run also pins pytest's rootdir to the project, which other projects sit beside).
const TEST: &str = "PYTHONPATH=src:. python3 -m pytest -q -rA -p no:cacheprovider";
/// Tests left out of both runs: they time the machine, not the code. `time_limited(0.1, ...)`
/// must yield its first item within 0.1 s of wall-clock time, which a TCG guest on a host busy
/// with other VMs misses now and then (the native run and forkbox's then disagree by chance).
const WALL_CLOCK: &[(&str, &str)] = &[(
    "more-itertools==10.2.0",
    "tests/test_more.py::TimeLimitedTests::test_basic",
)];

/// The test command for one project: `TEST` without its wall-clock tests.
fn test_command(spec: &str) -> String {
    WALL_CLOCK
        .iter()
        .filter(|(s, _)| *s == spec)
        .fold(TEST.to_string(), |cmd, (_, id)| {
            format!("{cmd} --deselect {id}")
        })
}
/// What the corpus's one plan appends to the sdist's PKG-INFO, and the bytes of the binary
/// file it makes (`printf` escapes, escaped again for TOML; NUL and non-UTF-8 bytes: git
/// calls it binary).
const MARK: &str = "ported by forkbox";
const BIN: &str = "\\\\000\\\\001forkbox\\\\377\\\\376";
const BIN_BYTES: &[u8] = b"\x00\x01forkbox\xff\xfe";

fn corpus_dir(paths: &forkbox_engine::paths::Paths) -> PathBuf {
    let d = paths.home().join("corpus");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The bookworm chroot with Python and pytest the native runs use (made once).
fn chroot(dir: &Path) -> PathBuf {
    let root = dir.join("bookworm");
    locked(dir, || {
        if !root.join("usr/bin/python3").exists() {
            let tmp = dir.join("bookworm.tmp");
            forkbox_engine::tree::remove_tree(&tmp).expect("remove a killed run's root");
            let st = forkbox_test_infra::mmdebstrap()
                .args([
                    "--variant=minbase",
                    "--include=python3,python3-pytest",
                    "bookworm",
                ])
                .arg(&tmp)
                .status()
                .unwrap();
            assert!(st.success(), "mmdebstrap failed");
            std::fs::rename(&tmp, &root).unwrap();
        }
    });
    root
}

/// The project's sdist, unpacked into a fresh directory (downloaded once into the cache).
fn project(dir: &Path, spec: &str) -> (tempfile::TempDir, PathBuf) {
    let cache = dir.join("sdists");
    std::fs::create_dir_all(&cache).unwrap();
    let (name, version) = spec.split_once("==").unwrap();
    let file = cache.join(format!("{name}-{version}.tar.gz"));
    locked(dir, || {
        if !file.exists() {
            let st = Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                ])
                .arg("--dest")
                .arg(&cache)
                .arg(spec)
                .status()
                .unwrap();
            assert!(st.success() && file.exists(), "pip download {spec}");
        }
    });
    let work = common::untar(&file);
    let root = work.path().join(format!("{name}-{version}"));
    assert!(root.is_dir(), "{}", root.display());
    (work, root)
}

/// pytest's own summary (`1 failed, 30 passed, 2 skipped`), warnings and deselections left out.
fn pytest_summary(out: &str) -> String {
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains(" in ") && (l.contains("passed") || l.contains("failed")))
        .unwrap_or("");
    let body = line.trim_matches(|c| c == '=' || c == ' ');
    let body = body.rsplit_once(" in ").map_or(body, |(b, _)| b);
    body.split(", ")
        .filter(|p| !p.contains("warning") && !p.contains("deselected"))
        .map(|p| p.trim().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The suite run natively in the chroot: its results (read as forkbox reads them), pytest's
/// summary line, and how long it took.
fn native(chroot: &Path, code: &Path, test: &str) -> (Results, String, u64) {
    // A directory and a report of its own: the tests run two at a time in one chroot.
    let name = code.file_name().unwrap().to_string_lossy().into_owned();
    let inside = chroot.join("projects").join(&name);
    let _ = std::fs::remove_dir_all(&inside);
    std::fs::create_dir_all(chroot.join("projects")).unwrap();
    let st = Command::new("cp")
        .arg("-a")
        .arg(code)
        .arg(&inside)
        .status()
        .unwrap();
    assert!(st.success());
    let t = Instant::now();
    let out = Command::new("chroot")
        .arg(chroot)
        .args(["sh", "-c"])
        .arg(format!(
            "cd /projects/{name} && PYTHONDONTWRITEBYTECODE=1 {test} --rootdir=. --junitxml=/tmp/{name}.xml -o junit_family=xunit1"
        ))
        .output()
        .unwrap();
    let took = t.elapsed().as_millis() as u64;
    let xml = std::fs::read_to_string(chroot.join(format!("tmp/{name}.xml"))).unwrap();
    let results = reports::pytest_junit(&xml).unwrap();
    (
        results,
        pytest_summary(&String::from_utf8_lossy(&out.stdout)),
        took,
    )
}

fn passed(r: &Results) -> std::collections::BTreeSet<&String> {
    r.iter()
        .filter(|(_, o)| **o == Outcome::Passed)
        .map(|(id, _)| id)
        .collect()
}

/// Runs project `spec`: with `FORKBOX_CORPUS=1` when it is one of the `default` two (one
/// module; a package whose suite has skips and expected failures, the richest outcome mix),
/// with `all` every one.
async fn check(spec: &str, default: bool) {
    if !common::runs(spec, default) {
        return;
    }
    let paths = infra::home();
    let image = infra::image(&paths, "python-bookworm");
    let dir = corpus_dir(&paths);
    let chroot = chroot(&dir);
    let (_keep, code) = project(&dir, spec);
    let test = test_command(spec);

    let (native_base, summary, native_ms) = native(&chroot, &code, &test);
    assert!(!native_base.is_empty(), "{spec}: no tests ran natively");
    assert_eq!(
        Counts::of(&native_base).to_string(),
        summary,
        "{spec}: forkbox's reading of the native run against pytest's own summary"
    );

    let common::OnePlan {
        report,
        ms: total_ms,
        cfg,
        out,
    } = common::one_plan(
        &paths,
        (&image.to_string(), &image.to_string()),
        code.clone(),
        &test,
        &format!("name = \"touch\"\ninstructions = \"a harmless change to a text file and a new binary file\"\nporter = {{ command = \"printf '\\\\n{MARK}\\\\n' >> PKG-INFO && printf '{BIN}' > forkbox-ported.bin\" }}\n"),
    )
    .await;
    let ours = &report.baseline.results;
    let (a, b) = (passed(&native_base), passed(ours));
    let only_native: Vec<_> = a.difference(&b).take(5).collect();
    let only_ours: Vec<_> = b.difference(&a).take(5).collect();
    assert!(
        only_native.is_empty() && only_ours.is_empty(),
        "{spec}: pass sets differ; only native: {only_native:?}; only forkbox: {only_ours:?}"
    );
    let v = &report.verdicts[0];
    assert!(v.accepted && v.lost.is_empty(), "{spec}: {v:?}");
    assert_eq!(
        report.winner_patch.as_deref(),
        Some("winner.patch"),
        "{spec}"
    );

    // The winner's patch applies with plain `git apply` to a fresh copy of the original code
    // and carries the porter's change alone: the text line, the binary file, nothing the
    // suite wrote.
    let (_fresh, patched) = project(&dir, spec);
    let st = Command::new("git")
        .arg("apply")
        .arg(out.path().join("winner.patch"))
        .current_dir(&patched)
        .status()
        .unwrap();
    assert!(st.success(), "{spec}: git apply winner.patch");
    let info = std::fs::read_to_string(patched.join("PKG-INFO")).unwrap();
    assert!(info.ends_with(&format!("\n{MARK}\n")), "{spec}: PKG-INFO");
    assert_eq!(
        std::fs::read(patched.join("forkbox-ported.bin")).unwrap(),
        BIN_BYTES,
        "{spec}: the binary file"
    );
    let patch = std::fs::read(out.path().join("winner.patch")).unwrap();
    let files = String::from_utf8_lossy(&patch)
        .lines()
        .filter(|l| l.starts_with("diff --git "))
        .count();
    assert_eq!(files, 2, "{spec}: the patch holds two files");

    // The patched code natively: the plan's run in its fork passes exactly those tests.
    let (native_plan, _, native_plan_ms) = native(&chroot, &patched, &test);
    let plan = &report.plans[0];
    let (a, b) = (passed(&native_plan), passed(&plan.results));
    assert!(
        a == b,
        "{spec}: the plan's pass sets differ; only native: {:?}; only forkbox: {:?}",
        a.difference(&b).take(5).collect::<Vec<_>>(),
        b.difference(&a).take(5).collect::<Vec<_>>()
    );
    // The measure: the whole migration against the native baseline plus the longest
    // native plan run (here the one plan).
    let native_total = native_ms + native_plan_ms;
    println!(
        "FIGURE corpus {spec}: {} natively ({summary}) in {native_ms} ms, patched in {native_plan_ms} ms; forkbox baseline ({} runs side by side) {} ms ({:.1}x one native run), whole migration {total_ms} ms = {:.1}x (native baseline + native plan run = {native_total} ms)",
        passed(&native_base).len(),
        cfg.runs,
        report.phases.baseline_ms,
        report.phases.baseline_ms as f64 / native_ms.max(1) as f64,
        total_ms as f64 / native_total.max(1) as f64,
    );
}

/// A single-module project with one test file at its root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six() {
    check("six==1.16.0", true).await;
}

/// A package with a `tests/` directory of unittest cases and data files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idna() {
    check("idna==3.7", false).await;
}

/// A large unittest suite (about a thousand tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_itertools() {
    check("more-itertools==10.2.0", false).await;
}

/// Tests inside the package (`toolz/tests`), pytest style.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolz() {
    check("toolz==0.12.1", false).await;
}

/// pytest-style tests with parametrised compliance cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jmespath() {
    check("jmespath==1.0.1", false).await;
}

/// A checker whose tests live in `pyflakes/test`, with skips and expected failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyflakes() {
    check("pyflakes==3.2.0", true).await;
}
