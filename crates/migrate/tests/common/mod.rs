//! What the corpus tests share: a lock for their caches, and a migration with one plan.

#![allow(clippy::unwrap_used, dead_code)] // tests fail loudly by design; each uses a part

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use forkbox_migrate::reports::{Outcome, Results};
use std::time::Instant;

use forkbox_migrate::flow::MigrateReport;
use forkbox_migrate::MigrateConfig;

#[allow(unused_imports)] // each test file uses some of them
pub use forkbox_test_infra::npm::{locked, untar};

/// A finished migration of one plan: its report, how long it took, and its output directory.
pub struct OnePlan {
    pub report: MigrateReport,
    pub ms: u64,
    pub cfg: MigrateConfig,
    pub out: tempfile::TempDir,
}

/// `forkbox migrate` of `code` from image `from` to `to` with one plan, `plan` (a plans
/// file's `[[plan]]` table, without its header).
pub async fn one_plan(
    paths: &forkbox_engine::paths::Paths,
    images: (&str, &str),
    code: PathBuf,
    test: &str,
    plan: &str,
) -> OnePlan {
    migration(paths, images, code, test, &[plan], 2).await
}

/// `forkbox migrate` of `code` from image `from` to `to` with `plans` (each a plans file's
/// `[[plan]]` table, without its header) and `runs` baseline runs.
pub async fn migration(
    paths: &forkbox_engine::paths::Paths,
    (from, to): (&str, &str),
    code: PathBuf,
    test: &str,
    plans: &[&str],
    runs: u32,
) -> OnePlan {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plans.toml");
    let text: Vec<String> = plans.iter().map(|p| format!("[[plan]]\n{p}")).collect();
    std::fs::write(&file, text.join("\n")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let cfg = MigrateConfig {
        test_timeout_secs: 1800,
        runs,
        ..MigrateConfig::new(
            (from, to),
            code,
            test,
            (
                forkbox_migrate::plans::load(&file).unwrap(),
                dir.path().to_path_buf(),
            ),
            out.path().to_path_buf(),
        )
    };
    let t = Instant::now();
    let report = forkbox_migrate::migrate(
        paths,
        &cfg,
        std::sync::Arc::new(|_: forkbox_migrate::Event<'_>| {}),
    )
    .await
    .unwrap();
    OnePlan {
        report,
        ms: t.elapsed().as_millis() as u64,
        cfg,
        out,
    }
}

/// The chroot of Debian `suite` with `packages`, made once per test home under `dir` (the file
/// `probe` in it says it is whole); with a hosts file (Vite looks `localhost` up, and a
/// minbase root has none) and a `/work` to bind the code on.
pub fn chroot(dir: &Path, suite: &str, packages: &[&str], probe: &str) -> PathBuf {
    let root = dir.join(suite);
    locked(dir, || {
        if !root.join(probe).exists() {
            let tmp = dir.join(format!("{suite}.tmp"));
            forkbox_engine::tree::remove_tree(&tmp).expect("remove a killed run's root");
            let st = forkbox_test_infra::mmdebstrap()
                .arg("--variant=minbase")
                .arg(format!("--include={}", packages.join(",")))
                .arg(suite)
                .arg(&tmp)
                .status()
                .unwrap();
            assert!(st.success(), "mmdebstrap {suite} failed");
            forkbox_engine::tree::remove_tree(&root).expect("remove an older root");
            std::fs::rename(&tmp, &root).unwrap();
        }
    });
    std::fs::create_dir_all(root.join("work")).unwrap();
    let hosts = root.join("etc/hosts");
    if !hosts.exists() {
        std::fs::write(&hosts, "127.0.0.1 localhost\n::1 localhost\n").unwrap();
    }
    root
}

/// Debian's package `package` (`apt-get download`ed once into `dir/debs`, the lists updated
/// first on a machine that has none): its `.deb`.
pub fn deb(dir: &Path, package: &str) -> PathBuf {
    let cache = dir.join("debs");
    std::fs::create_dir_all(&cache).unwrap();
    locked(dir, || {
        let find = || {
            std::fs::read_dir(&cache)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| {
                    let name = p.file_name().unwrap().to_string_lossy().into_owned();
                    name.starts_with(&format!("{package}_")) && name.ends_with(".deb")
                })
        };
        if let Some(deb) = find() {
            return deb;
        }
        let download = || {
            Command::new("apt-get")
                .args(["download", "-q", package])
                .current_dir(&cache)
                .output()
                .unwrap()
        };
        let mut out = download();
        if !out.status.success() {
            // A fresh machine's lists may not be there yet.
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
            out = download();
        }
        assert!(
            out.status.success(),
            "apt-get download {package}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        find().unwrap()
    })
}

/// `test` run natively in `root` with the code at `/work` and the variables `env`, as in the
/// sandboxes (a mount namespace of its own: the tests run side by side); what it printed and
/// how long it took.
pub fn native(
    root: &Path,
    code: &Path,
    test: &str,
    env: &[(&str, &str)],
) -> (std::process::Output, u64) {
    let t = Instant::now();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount --bind \"$1\" \"$2/work\" && mount -t proc proc \"$2/proc\" && exec chroot \"$2\" sh -c \"cd /work && $3\""
        )
        .args(["native"])
        .arg(code)
        .arg(root)
        .arg(test)
        .env("HOME", "/root")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (out, t.elapsed().as_millis() as u64)
}

/// Whether the corpora run: `Some(true)` for every project (`FORKBOX_CORPUS=all`),
/// `Some(false)` for the first of each ecosystem (`FORKBOX_CORPUS=1`), `None` for none.
pub fn corpus() -> Option<bool> {
    match std::env::var("FORKBOX_CORPUS").as_deref() {
        Ok("1") => Some(false),
        Ok("all") => Some(true),
        _ => None,
    }
}

/// Whether a corpus test runs its project: `first` of its ecosystem, or every one asked for.
pub fn runs(name: &str, first: bool) -> bool {
    match corpus() {
        None => {
            eprintln!("corpus: skipped (set FORKBOX_CORPUS=1 or all to run it)");
            false
        }
        Some(false) if !first => {
            eprintln!("corpus: {name} runs with FORKBOX_CORPUS=all");
            false
        }
        _ => true,
    }
}

/// The tests that passed.
pub fn passed(r: &Results) -> BTreeSet<&String> {
    r.iter()
        .filter(|(_, o)| **o == Outcome::Passed)
        .map(|(id, _)| id)
        .collect()
}

/// Results equal test for test: the same ids, each with the same outcome.
pub fn same(what: &str, native: &Results, ours: &Results) {
    let (a, b): (BTreeSet<_>, BTreeSet<_>) = (native.keys().collect(), ours.keys().collect());
    assert!(
        a == b,
        "{what}: ids differ; only native: {:?}; only forkbox: {:?}",
        a.difference(&b).take(5).collect::<Vec<_>>(),
        b.difference(&a).take(5).collect::<Vec<_>>()
    );
    let differ: Vec<_> = native
        .iter()
        .filter(|(id, o)| ours.get(*id) != Some(o))
        .take(5)
        .collect();
    assert!(differ.is_empty(), "{what}: outcomes differ: {differ:?}");
}

/// The files under `dir` whose extension is one of `exts`, concatenated into `into`
/// (`target` and `node_modules` left out).
pub fn sources(dir: &Path, exts: &[&str], into: &mut String) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if !p.ends_with("target") && !p.ends_with("node_modules") {
                sources(&p, exts, into);
            }
        } else if p.extension().is_some_and(|x| exts.iter().any(|e| x == *e)) {
            into.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
    }
}

/// The plan that changes nothing (a plans file's `[[plan]]` table, without its header).
pub const SAME: &str =
    "name = \"same\"\ninstructions = \"change nothing\"\nporter = { command = \"true\" }\n";

/// `forkbox migrate` of a corpus project with one baseline run and two plans: [`SAME`], and one
/// whose porter runs `breaks` (a shell command that breaks one test; the plan fails if it
/// changes nothing). See [`check_two_plans`].
pub async fn same_and_break(
    paths: &forkbox_engine::paths::Paths,
    images: (&str, &str),
    code: PathBuf,
    test: &str,
    breaks: &str,
) -> OnePlan {
    let toml = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let broken = format!(
        "name = \"break\"\ninstructions = \"break one test\"\nporter = {{ command = \"{}\" }}\n",
        toml(breaks)
    );
    migration(paths, images, code, test, &[SAME, &broken], 1).await
}

/// Checks a finished two-plan migration against the native runs: the baseline is `old`, the
/// plan that changes nothing is `new` and loses what the native runs lose (the tests that
/// passed on the old toolchain and do not on the new one), accepted only if that is nothing;
/// the breaking plan loses that and exactly `broken` besides.
pub fn check_two_plans(what: &str, run: &OnePlan, (old, new): (&Results, &Results), broken: &str) {
    let report = &run.report;
    same(
        &format!("{what}, the baseline (old toolchain)"),
        old,
        &report.baseline.results,
    );
    same(
        &format!("{what}, the plan (new toolchain)"),
        new,
        &report.plans[0].results,
    );
    let v = &report.verdicts;
    let natively: BTreeSet<&String> = passed(old).difference(&passed(new)).copied().collect();
    let lost = |i: usize| v[i].lost.iter().collect::<BTreeSet<_>>();
    assert_eq!(lost(0), natively, "{what}: {:?}", v[0]);
    assert_eq!(v[0].accepted, natively.is_empty(), "{what}: {:?}", v[0]);
    let mut also = natively.clone();
    let broken = broken.to_string();
    if passed(new).contains(&broken) {
        also.insert(&broken);
    }
    assert_eq!(lost(1), also, "{what}: {:?}", v[1]);
    assert!(!v[1].accepted, "{what}: {:?}", v[1]);
}

/// `test` run natively in `root` (see [`native`]) and its output read as `format`; its
/// results and how long it took.
pub fn native_results(
    root: &Path,
    code: &Path,
    test: &str,
    env: &[(&str, &str)],
    format: forkbox_migrate::reports::Format,
) -> (Results, u64) {
    let (out, took) = native(root, code, test, env);
    let text = String::from_utf8_lossy(&out.stdout);
    let results = forkbox_migrate::reports::parse(format, &text)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}\n{text}\n{}",
                root.display(),
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .results;
    (results, took)
}

/// What the native runs of `what` must show: at least `at_least` passing tests on one
/// toolchain or the other, and every id one a person finds in the sources.
pub fn check_native(
    what: &str,
    (old, new): (&Results, &Results),
    at_least: usize,
    findable: impl Fn(&str) -> bool,
) {
    let most = passed(old).len().max(passed(new).len());
    assert!(
        most >= at_least,
        "{what}: {most} tests passed natively, expected {at_least} or more: {old:?} {new:?}"
    );
    for id in old.keys().chain(new.keys()) {
        assert!(findable(id), "{what}: no test {id:?} in the sources");
    }
}
