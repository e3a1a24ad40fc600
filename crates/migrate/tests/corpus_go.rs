//! The Go corpus: libraries whose Debian `golang-*-dev` packages carry their sources with their
//! tests (bookworm's versions), each run natively in Debian chroots (bookworm's Go 1.19,
//! trixie's Go 1.24) with `go test -count=1 -json ./...` typed by hand, and through `forkbox
//! migrate` from `go-bookworm` to `go-trixie` with the plain `go test ./...` a project's README
//! gives (forkbox asks for the JSON itself) and two plans: one that changes nothing and one
//! that breaks one test. Promises checked per library: the baseline is the native Go 1.19 run
//! and the first plan's run the native Go 1.24 run, test for test (`package/TestX/sub`); every
//! id names a test function in the sources; the plan that changes nothing is accepted, the
//! one that breaks a test loses exactly that test.
//!
//! Each package is fetched with `apt-get download` into a cache (never committed). A library
//! without a `go.mod` (written before modules) gets one naming its import path, as its users'
//! tools would. Runs with `FORKBOX_CORPUS=1` (one library) or `FORKBOX_CORPUS=all` (every
//! one); needs a Debian mirror. Prints `FIGURE` lines.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;

use forkbox_migrate::reports::{Format, Outcome, Results};
use forkbox_test_infra as infra;

mod common;
use common::passed;

/// What the native runs share with the images (`images/go-*.toml`).
const ENV: &[(&str, &str)] = &[
    ("GOPROXY", "off"),
    ("GOFLAGS", "-mod=mod"),
    ("GOTOOLCHAIN", "local"),
    ("CGO_ENABLED", "0"),
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
];

/// The library's sources from Debian's `package` (downloaded once into the cache), at
/// `import` under `/usr/share/gocode/src`, in a fresh directory with a `go.mod`.
fn library(dir: &Path, package: &str, import: &str, module: &str) -> (tempfile::TempDir, PathBuf) {
    let deb = common::deb(dir, package);
    let unpacked = tempfile::tempdir().unwrap();
    let st = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(st.success(), "dpkg-deb -x {}", deb.display());
    let work = tempfile::tempdir().unwrap();
    let code = work.path().join("code");
    let st = Command::new("cp")
        .arg("-a")
        .arg(unpacked.path().join("usr/share/gocode/src").join(import))
        .arg(&code)
        .status()
        .unwrap();
    assert!(st.success());
    let gomod = code.join("go.mod");
    if !gomod.exists() {
        std::fs::write(&gomod, format!("module {module}\n")).unwrap();
    }
    (work, code)
}

/// The suite run natively in `root`, with the JSON typed by hand; its results and how long it
/// took.
fn native(root: &Path, code: &Path) -> (Results, u64) {
    let test = "go test -count=1 -json ./...";
    common::native_results(root, code, test, ENV, Format::GoJson)
}

/// Whether a person finds the test `id` (`package/TestX/sub`) in the sources: its function
/// (or, for a package whose tests did not build, its directory).
fn findable(id: &str, code: &Path, module: &str, source: &str) -> bool {
    if let Some(dir) = id.strip_prefix(module) {
        if code.join(dir.trim_start_matches('/')).is_dir() && !dir.contains("/Test") {
            return true;
        }
    }
    id.split('/')
        .find(|s| ["Test", "Example", "Fuzz"].iter().any(|p| s.starts_with(p)))
        .is_some_and(|f| source.contains(&format!("func {f}(")))
}

/// A library: its Debian package, its import path under gocode, its module path, how many
/// tests pass at least, and the test the breaking plan breaks (`file`, `function`).
struct Library<'a> {
    package: &'a str,
    import: &'a str,
    module: &'a str,
    at_least: usize,
    breaks: (&'a str, &'a str),
}

async fn check(lib: Library<'_>, first: bool) {
    if !common::runs(lib.package, first) {
        return;
    }
    let paths = infra::home();
    let old = infra::image(&paths, "go-bookworm");
    let new = infra::image(&paths, "go-trixie");
    let dir = paths.home().join("corpus-go");
    std::fs::create_dir_all(&dir).unwrap();
    let bookworm = common::chroot(&dir, "bookworm", &["golang-go"], "usr/bin/go");
    let trixie = common::chroot(&dir, "trixie", &["golang-go"], "usr/bin/go");
    let (_keep, code) = library(&dir, lib.package, lib.import, lib.module);

    let (go119, ms119) = native(&bookworm, &code);
    let (go124, ms124) = native(&trixie, &code);
    let mut source = String::new();
    common::sources(&code, &["go"], &mut source);
    common::check_native(lib.package, (&go119, &go124), lib.at_least, |id| {
        findable(id, &code, lib.module, &source)
    });
    let (file, func) = lib.breaks;
    let broken = format!("{}/{func}", package_of(&go119, func));
    assert_eq!(go119.get(&broken), Some(&Outcome::Passed), "{broken}");

    let breaks = format!(
        "sed -i 's/^func {func}(t \\*testing.T) {{$/&\\n\\tt.Fatal(\"broken by the plan\")/' {file} && grep -q 'broken by the plan' {file}"
    );
    let run = common::same_and_break(
        &paths,
        (&old.to_string(), &new.to_string()),
        code.clone(),
        "go test ./...",
        &breaks,
    )
    .await;
    common::check_two_plans(lib.package, &run, (&go119, &go124), &broken);
    let report = &run.report;
    assert!(
        report.results_source.contains("added by forkbox"),
        "{}: {}",
        lib.package,
        report.results_source
    );
    // What people read of the run is Go's text, not the JSON forkbox asked for.
    let shown = &report.plans[0].test_output_tail;
    assert!(
        (shown.contains("ok  \t") || shown.contains("FAIL\t")) && !shown.contains("\"Action\""),
        "{}: {shown}",
        lib.package
    );
    println!(
        "FIGURE corpus-go {}: {} tests pass natively on Go 1.19 ({ms119} ms), {} on Go 1.24 ({ms124} ms); forkbox baseline {} ms, whole migration (2 plans) {} ms = {:.1}x (native 1.19 + 1.24 = {} ms); results read from {}",
        lib.package,
        passed(&go119).len(),
        passed(&go124).len(),
        report.phases.baseline_ms,
        run.ms,
        run.ms as f64 / (ms119 + ms124).max(1) as f64,
        ms119 + ms124,
        report.results_source,
    );
}

/// The package of the test function `func` in `results`.
fn package_of<'a>(results: &'a Results, func: &str) -> &'a str {
    results
        .keys()
        .find_map(|id| id.strip_suffix(&format!("/{func}")))
        .unwrap_or_else(|| panic!("no test {func} in {results:?}"))
}

/// google/uuid: a module of its own, no dependencies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn google_uuid() {
    check(
        Library {
            package: "golang-github-google-uuid-dev",
            import: "github.com/google/uuid",
            module: "github.com/google/uuid",
            at_least: 30,
            breaks: ("null_test.go", "TestNullUUIDValue"),
        },
        true,
    )
    .await;
}

/// xxhash v2: a module path with its major version, subtests by input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cespare_xxhash() {
    check(
        Library {
            package: "golang-github-cespare-xxhash-dev",
            import: "github.com/cespare/xxhash",
            module: "github.com/cespare/xxhash/v2",
            at_least: 5,
            breaks: ("xxhash_test.go", "TestReset"),
        },
        false,
    )
    .await;
}

/// go-difflib: written before modules (no `go.mod`), its package in a subdirectory. Go 1.24's
/// vet (run by `go test`) refuses two of its examples (`ExampleGetUnifiedDiffCode refers to
/// unknown identifier`): its tests no longer build, natively or in forkbox, and the plan that
/// changes nothing loses every test, as a migration must say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pmezard_go_difflib() {
    check(
        Library {
            package: "golang-github-pmezard-go-difflib-dev",
            import: "github.com/pmezard/go-difflib",
            module: "github.com/pmezard/go-difflib",
            at_least: 10,
            breaks: ("difflib/difflib_test.go", "TestGetOptCodes"),
        },
        false,
    )
    .await;
}
