//! The README's demo end to end with real VMs: legacykit from Python 3.9 (bullseye) to 3.13
//! (trixie) with three plans. Costs: both images once per test home (~1-2 min each), then a
//! template per image (~5 s each, once), 2 baseline runs, one snapshot (~3 s under TCG), three
//! forks porting and testing in parallel, and a fresh sandbox to check the winning patch:
//! about a minute on a warm test home.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;

use forkbox_engine::sandbox::{Sandbox, SandboxConfig};
use forkbox_migrate::reports::{self, Format, Outcome};
use forkbox_migrate::{migrate, MigrateConfig};
use forkbox_test_infra as infra;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_picks_the_minimal_port_and_rejects_the_wrong_one() {
    let paths = infra::home();
    let old = infra::image(&paths, "python-bullseye");
    let new = infra::image(&paths, "python-trixie");
    let examples = infra::repo_root().join("examples");
    let out = tempfile::tempdir().unwrap();
    let cfg = MigrateConfig {
        from: old.to_string(),
        to: new.to_string(),
        code: examples.join("legacykit"),
        test: "python3 -m pytest -q -rA -p no:cacheprovider".into(),
        plans: forkbox_migrate::plans::load(&examples.join("plans/plans.toml")).unwrap(),
        plans_dir: examples.join("plans"),
        out: out.path().to_path_buf(),
        runs: 2,
        setup: vec![],
        setup_network: Default::default(),
        format: Format::Auto,
        test_timeout_secs: 600,
        rate_cpu_second: 0.0,
        rate_gib_second: 0.0,
        llm: None,
        cli: None,
        protect_tests: false,
    };
    let report = migrate(
        &paths,
        &cfg,
        std::sync::Arc::new(|e: forkbox_migrate::Event<'_>| eprintln!("{e:?}")),
    )
    .await
    .expect("migrate");

    // The baseline: everything passes on 3.9.
    let passed = report
        .baseline
        .results
        .values()
        .filter(|o| **o == Outcome::Passed)
        .count();
    assert!(passed >= 40, "{passed} tests passed on the old toolchain");
    assert_eq!(passed, report.baseline.results.len());
    // pytest's JUnit report is read in preference to its text, and its ids are node ids.
    assert!(
        report.results_source.contains("JUnit"),
        "{}",
        report.results_source
    );
    assert!(
        report
            .baseline
            .results
            .keys()
            .all(|id| id.contains(".py::")),
        "{:?}",
        report.baseline.results.keys().take(3).collect::<Vec<_>>()
    );

    let verdict = |p: &str| {
        report
            .verdicts
            .iter()
            .find(|v| v.plan == p)
            .unwrap()
            .clone()
    };
    let minimal = verdict("minimal");
    let modern = verdict("modernize");
    let wrong = verdict("wrong");
    assert!(minimal.accepted && minimal.rank == Some(1), "{minimal:?}");
    assert!(modern.accepted && modern.rank == Some(2), "{modern:?}");
    assert!(!wrong.accepted, "{wrong:?}");
    assert!(
        wrong.lost.iter().any(|t| t.contains("test_compare")),
        "{wrong:?}"
    );
    assert_eq!(report.winner.as_deref(), Some("minimal"));
    for f in [
        "report.json",
        "report.html",
        "winner.patch",
        "minimal.patch",
        "wrong.patch",
    ] {
        assert!(out.path().join(f).is_file(), "{f} is written");
    }
    let html = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(html.contains("Winner: minimal") && html.contains("rejected"));

    // The winner's patch applies to the original code with `git apply`, and the patched code
    // passes its tests in a fresh sandbox of the new image.
    let code = tempfile::tempdir().unwrap();
    copy_dir(&examples.join("legacykit"), code.path());
    let st = std::process::Command::new("git")
        .args(["apply", "--whitespace=nowarn"])
        .arg(out.path().join("winner.patch"))
        .current_dir(code.path())
        .status()
        .unwrap();
    assert!(st.success(), "git apply of the winning patch");
    let sb = Sandbox::create(
        &paths,
        &SandboxConfig {
            image: new,
            ..SandboxConfig::default()
        },
    )
    .await
    .unwrap();
    forkbox_engine::files::upload(sb.client(), code.path(), "/work")
        .await
        .unwrap();
    let out = sb
        .run(forkbox_protocol::ExecSpec {
            program: forkbox_protocol::Program::Shell(cfg.test.clone()),
            cwd: Some("/work".into()),
            env: vec![],
            timeout_ms: Some(600_000),
            stdin: false,
            tty: None,
        })
        .await
        .unwrap();
    sb.destroy().await;
    let r = reports::parse(Format::Auto, &out.stdout_text()).unwrap();
    assert_eq!(out.code(), 0, "{}", out.stdout_text());
    assert_eq!(r.len(), report.baseline.results.len());
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}
