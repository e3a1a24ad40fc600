//! The Rust corpus: crates from crates.io without dependencies whose published sources carry
//! their tests (unit tests, integration tests, doc tests), each run natively in Debian chroots
//! (bookworm's Rust 1.63, trixie's Rust 1.85) and through `forkbox migrate` from
//! `rust-bookworm` to `rust-trixie` with `cargo test` and two plans: one that changes nothing
//! and one that breaks one test. Promises checked per crate: the baseline is the native Rust
//! 1.63 run and the first plan's run the native Rust 1.85 run, test for test (`module::test`,
//! a doc test by its file and line); every id names a test in the sources; the plan that
//! changes nothing is accepted, the one that breaks a test loses exactly that test.
//!
//! Each crate is fetched from crates.io into a cache (never committed). Runs with
//! `FORKBOX_CORPUS=1` (one crate) or `FORKBOX_CORPUS=all` (every one); needs crates.io and a
//! Debian mirror. Prints `FIGURE` lines.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;

use forkbox_migrate::reports::{Format, Outcome, Results};
use forkbox_test_infra as infra;

mod common;
use common::{locked, passed};

/// The crate's published sources (downloaded once into the cache), in a fresh directory.
fn crate_sources(dir: &Path, name: &str, version: &str) -> (tempfile::TempDir, PathBuf) {
    let cache = dir.join("crates");
    std::fs::create_dir_all(&cache).unwrap();
    let file = cache.join(format!("{name}-{version}.crate"));
    locked(dir, || {
        if !file.exists() {
            let tmp = cache.join(format!("{name}-{version}.tmp"));
            let out = Command::new("curl")
                .args(["-sSfL", "--retry", "3", "-o"])
                .arg(&tmp)
                .arg(format!(
                    "https://static.crates.io/crates/{name}/{name}-{version}.crate"
                ))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "download {name} {version}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::rename(&tmp, &file).unwrap();
        }
    });
    let work = common::untar(&file);
    let code = work.path().join(format!("{name}-{version}"));
    (work, code)
}

/// The suite run natively in `root` (its build directory in the chroot, apart from the code
/// and from other crates'); its results and how long it took.
fn native(root: &Path, code: &Path, name: &str) -> (Results, u64) {
    let target = format!("/tmp/target-{name}");
    let env = [
        ("CARGO_NET_OFFLINE", "true"),
        ("CARGO_TERM_COLOR", "never"),
        ("CARGO_TARGET_DIR", target.as_str()),
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
    ];
    common::native_results(root, code, "cargo test", &env, Format::Cargo)
}

/// Whether a person finds the test `id` in the sources: a doc test's file, or the test
/// function's name (the last part of its path; a macro's test by the name given to it).
fn findable(id: &str, code: &Path, source: &str) -> bool {
    if let Some((file, _)) = id.split_once(" - ") {
        return code.join(file).is_file();
    }
    let name = id.rsplit("::").next().unwrap_or(id);
    source.contains(name)
}

/// A crate: its name and version, how many tests pass at least, and how the breaking plan
/// breaks one test (a shell command, and that test's id or its last `::` parts).
struct Crate<'a> {
    name: &'a str,
    version: &'a str,
    at_least: usize,
    breaks: (&'a str, &'a str),
}

async fn check(c: Crate<'_>, first: bool) {
    if !common::runs(c.name, first) {
        return;
    }
    let paths = infra::home();
    let old = infra::image(&paths, "rust-bookworm");
    let new = infra::image(&paths, "rust-trixie");
    let dir = paths.home().join("corpus-rust");
    std::fs::create_dir_all(&dir).unwrap();
    let bookworm = common::chroot(&dir, "bookworm", &["cargo"], "usr/bin/cargo");
    let trixie = common::chroot(&dir, "trixie", &["cargo"], "usr/bin/cargo");
    let (_keep, code) = crate_sources(&dir, c.name, c.version);

    let (rust163, ms163) = native(&bookworm, &code, c.name);
    let (rust185, ms185) = native(&trixie, &code, c.name);
    let mut source = String::new();
    common::sources(&code, &["rs"], &mut source);
    common::check_native(c.name, (&rust163, &rust185), c.at_least, |id| {
        findable(id, &code, &source)
    });
    let (breaks, suffix) = c.breaks;
    let broken = rust163
        .keys()
        .find(|id| *id == suffix || id.ends_with(&format!("::{suffix}")))
        .unwrap_or_else(|| panic!("{}: no test {suffix} in {rust163:?}", c.name))
        .clone();
    assert_eq!(rust163.get(&broken), Some(&Outcome::Passed), "{broken}");

    let run = common::same_and_break(
        &paths,
        (&old.to_string(), &new.to_string()),
        code.clone(),
        "cargo test",
        breaks,
    )
    .await;
    common::check_two_plans(c.name, &run, (&rust163, &rust185), &broken);
    let report = &run.report;
    assert!(
        report
            .results_source
            .contains("--no-fail-fast added by forkbox"),
        "{}: {}",
        c.name,
        report.results_source
    );
    println!(
        "FIGURE corpus-rust {} {}: {} tests pass natively on Rust 1.63 ({ms163} ms), {} on Rust 1.85 ({ms185} ms); forkbox baseline {} ms, whole migration (2 plans) {} ms = {:.1}x (native 1.63 + 1.85 = {} ms); results read from {}",
        c.name,
        c.version,
        passed(&rust163).len(),
        passed(&rust185).len(),
        report.phases.baseline_ms,
        run.ms,
        run.ms as f64 / (ms163 + ms185).max(1) as f64,
        ms163 + ms185,
        report.results_source,
    );
}

/// scopeguard: unit tests with unwinding, a lock file of its own, doc tests (the crate of the
/// default run: its migration takes about two minutes here, heck's four).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopeguard() {
    check(
        Crate {
            name: "scopeguard",
            version: "1.2.0",
            at_least: 8,
            breaks: (
                "sed -i 's/^    fn test_defer() {$/&\\n        panic!(\"broken by the plan\");/' src/lib.rs && grep -q 'broken by the plan' src/lib.rs",
                "test_defer",
            ),
        },
        true,
    )
    .await;
}

/// heck: tests made by a macro in each case's module, and doc tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heck() {
    check(
        Crate {
            name: "heck",
            version: "0.5.0",
            at_least: 100,
            breaks: (
                "sed -i 's/t!(test1: \"CamelCase\" => \"camel_case\");/t!(test1: \"CamelCase\" => \"broken_by_the_plan\");/' src/snake.rs && grep -q broken_by_the_plan src/snake.rs",
                "snake::tests::test1",
            ),
        },
        false,
    )
    .await;
}

/// fnv: a crate of one file at its root (`lib.rs`), edition 2015.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fnv() {
    check(
        Crate {
            name: "fnv",
            version: "1.0.7",
            at_least: 3,
            breaks: (
                "sed -i 's/^    fn basic_tests() {$/&\\n        panic!(\"broken by the plan\");/' lib.rs && grep -q 'broken by the plan' lib.rs",
                "basic_tests",
            ),
        },
        false,
    )
    .await;
}
