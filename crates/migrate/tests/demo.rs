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
        test_timeout_secs: 600,
        ..MigrateConfig::new(
            (&old.to_string(), &new.to_string()),
            examples.join("legacykit"),
            "python3 -m pytest -q -rA -p no:cacheprovider",
            plans_of(&examples.join("plans")),
            out.path().to_path_buf(),
        )
    };
    let report = migrate_logged(&paths, &cfg).await;

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

    let verdict = |p: &str| verdict_of(&report, p);
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

    // report.json: versioned, images as NAME@N, one entry per plan carrying its verdict, the
    // ranking explained, the lost tests' failure output.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(json["schema_version"], forkbox_migrate::REPORT_SCHEMA);
    assert!(json["forkbox_version"].is_string() && json["created_unix"].as_u64() > Some(0));
    for (field, image) in [("from", &old), ("to", &new)] {
        let named = json[field].as_str().unwrap();
        assert!(
            named.starts_with(&format!("{}@", image.name)),
            "{field}: {named}"
        );
    }
    let plan = |name: &str| {
        json["plans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["plan"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(plan("minimal")["verdict"]["rank"], 1);
    assert!(plan("minimal")["verdict"]["rank_reason"]
        .as_str()
        .unwrap()
        .contains("smallest diff"));
    assert!(plan("modernize")["verdict"]["rank_reason"]
        .as_str()
        .unwrap()
        .contains("larger diff than minimal"));
    let wrong_plan = plan("wrong");
    let lost_id = wrong.lost[0].clone();
    assert!(
        wrong_plan["failures"][&lost_id]
            .as_str()
            .is_some_and(|f| !f.is_empty()),
        "the lost test's failure output: {wrong_plan}"
    );
    check_in_chromium(&out.path().join("report.html"), &lost_id);

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
            user: None,
        })
        .await
        .unwrap();
    sb.destroy().await;
    let r = reports::parse(Format::Auto, &out.stdout_text())
        .unwrap()
        .results;
    assert_eq!(out.code(), 0, "{}", out.stdout_text());
    assert_eq!(r.len(), report.baseline.results.len());
}

/// The report as a person sees it, in headless Chromium at 1280 px: nothing wider than the
/// window, the winner and the lost test (with its failure output) in the DOM, every plan's
/// patch present, no external URL, and a screenshot that renders.
fn check_in_chromium(report: &Path, lost_id: &str) {
    let html = std::fs::read_to_string(report).unwrap();
    for external in ["http://", "https://", "//cdn", "src=\"//"] {
        assert!(!html.contains(external), "the report loads {external}…");
    }
    let chromium = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            std::process::Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("Chromium is needed to check the report (scripts/test.sh installs it)");
    let dir = tempfile::tempdir().unwrap();
    // A copy that measures itself once laid out, into an attribute --dump-dom prints.
    let probe = dir.path().join("probe.html");
    std::fs::write(
        &probe,
        html.replace(
            "</body>",
            "<script>const w=document.documentElement.scrollWidth;\
             document.body.setAttribute('data-width',String(w));\
             const wide=[...document.querySelectorAll('body *')].filter(e=>e.getBoundingClientRect().right>1281).map(e=>e.tagName+'.'+e.className);\
             document.body.setAttribute('data-too-wide',wide.slice(0,5).join(' '));</script></body>",
        ),
    )
    .unwrap();
    let run = |extra: &[&str], page: &Path| {
        let out = std::process::Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1280,2000",
            ])
            .args(extra)
            .arg(format!("file://{}", page.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "chromium: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let dom = run(&["--dump-dom"], &probe);
    assert!(
        dom.contains("data-width=\"1280\""),
        "the page is wider than 1280 px: {}",
        dom.split("data-too-wide=")
            .nth(1)
            .map(|s| &s[..s.len().min(200)])
            .unwrap_or("")
    );
    assert!(dom.contains("Winner: minimal"));
    assert!(dom.contains(lost_id), "the lost test is named");
    assert!(
        dom.contains("class=\"lost-test\"") && dom.contains("<pre>"),
        "with its output"
    );
    assert!(dom.contains("id=\"plan-modernize\"") && dom.contains("class=\"patch"));
    assert!(dom.contains("rank 2"), "why the second ranked second");
    let png = dir.path().join("report.png");
    run(&[&format!("--screenshot={}", png.display())], report);
    let bytes = std::fs::read(&png).expect("a screenshot");
    assert_eq!(&bytes[1..4], b"PNG");
    let width = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    assert_eq!(width, 1280);
    assert!(bytes.len() > 20_000, "the screenshot shows something");
}

/// The verdict on `plan`.
fn verdict_of(
    report: &forkbox_migrate::flow::MigrateReport,
    plan: &str,
) -> forkbox_migrate::decide::Verdict {
    report
        .verdicts
        .iter()
        .find(|v| v.plan == plan)
        .unwrap_or_else(|| panic!("no verdict on {plan}"))
        .clone()
}

/// The migration, its progress on stderr (shown when a test fails).
async fn migrate_logged(
    paths: &forkbox_engine::paths::Paths,
    cfg: &MigrateConfig,
) -> forkbox_migrate::flow::MigrateReport {
    migrate(
        paths,
        cfg,
        std::sync::Arc::new(|e: forkbox_migrate::Event<'_>| eprintln!("{e:?}")),
    )
    .await
    .expect("migrate")
}

/// The plans of `dir/plans.toml`, and `dir` (uploaded to /plan).
fn plans_of(dir: &Path) -> (Vec<forkbox_migrate::plans::Plan>, std::path::PathBuf) {
    (
        forkbox_migrate::plans::load(&dir.join("plans.toml")).unwrap(),
        dir.to_path_buf(),
    )
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

/// Two image builds (once per test home, ~20 s each) and two boots. The Node images give
/// Node 18 and Node 20, and `node --test`'s output in the guest reads as the same tests on
/// both (TAP on 18, where it is the default, and spec on 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_images_run_node_test_and_its_results_read() {
    let paths = infra::home();
    let suite = std::fs::read_to_string(
        infra::repo_root().join("crates/reports/src/fixtures/node.test.js"),
    )
    .unwrap();
    for (recipe, major, reporter) in [
        ("node-bookworm", "v18.", "tap"),
        ("node-trixie", "v20.", "spec"),
    ] {
        let image = infra::image(&paths, recipe);
        let sb = Sandbox::create(
            &paths,
            &SandboxConfig {
                image,
                ..SandboxConfig::default()
            },
        )
        .await
        .unwrap();
        sb.client()
            .write_file("/work/test/node.test.js", suite.as_bytes(), 0o644)
            .await
            .unwrap();
        let out = sb
            .run(forkbox_protocol::ExecSpec {
                cwd: Some("/work".into()),
                ..infra::sh(
                    &format!("node --version && node --test --test-reporter={reporter} test/"),
                    Some(120_000),
                )
            })
            .await
            .unwrap();
        sb.destroy().await;
        let text = out.stdout_text();
        assert!(text.starts_with(major), "{recipe}: {text}");
        let r = reports::parse(Format::Auto, &text).unwrap().results;
        let failed: Vec<&String> = r
            .iter()
            .filter(|(_, o)| **o == Outcome::Failed)
            .map(|(id, _)| id)
            .collect();
        assert_eq!(r.len(), 6, "{recipe}: {r:?}\n{text}");
        assert!(
            failed.len() == 1 && failed[0].ends_with("edge cases > is wrong on purpose"),
            "{recipe}: {r:?}"
        );
    }
}

/// The Node example of docs/migrate.md end to end: nodekit from Node 18 to Node 20. `npm ci` runs once,
/// in the prepared sandbox (which may reach the npm registry alone); the baseline runs get its
/// node_modules (they have no network); the forks port offline, one with `npx jscodeshift`
/// from that node_modules. Costs: both Node images once per test home, `npm ci` under TCG
/// (~3-4 min), the baseline (~25 s) and three forks (~1 min).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_example_installs_once_and_takes_the_smallest_port() {
    let paths = infra::home();
    let examples = infra::repo_root().join("examples");
    let file: toml::Value =
        toml::from_str(&std::fs::read_to_string(examples.join("node-migration.toml")).unwrap())
            .unwrap();
    let m = &file["migration"];
    let list = |k: &str| -> Vec<String> {
        m[k].as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let old = infra::image(&paths, m["from"].as_str().unwrap());
    let new = infra::image(&paths, m["to"].as_str().unwrap());
    let out = tempfile::tempdir().unwrap();
    let code = examples.join(m["code"].as_str().unwrap());
    assert!(
        !code.join("node_modules").exists(),
        "examples/nodekit/node_modules would be uploaded: remove it"
    );
    let cfg = MigrateConfig {
        setup: list("setup"),
        setup_network: forkbox_engine::net::NetworkPolicy {
            internet: false,
            allow: list("setup_allow"),
            deny: Vec::new(),
        },
        share: list("share"),
        test_timeout_secs: 900,
        ..MigrateConfig::new(
            (&old.to_string(), &new.to_string()),
            code.clone(),
            m["test"].as_str().unwrap(),
            plans_of(&examples.join("node-plans")),
            out.path().to_path_buf(),
        )
    };
    let report = migrate_logged(&paths, &cfg).await;
    // Mocha's JSON report, every test passing on Node 18 with the shared node_modules.
    assert_eq!(report.baseline.results.len(), 43);
    assert!(report
        .baseline
        .results
        .values()
        .all(|o| *o == Outcome::Passed));
    let verdict = |p: &str| verdict_of(&report, p);
    let (hand, codemod, regex) = (verdict("hand-patch"), verdict("codemod"), verdict("regex"));
    assert!(hand.accepted && hand.rank == Some(1), "{hand:?}");
    assert!(codemod.accepted && codemod.rank == Some(2), "{codemod:?}");
    assert!(!regex.accepted, "{regex:?}");
    assert!(regex.lost.iter().any(|t| t.contains("dates")), "{regex:?}");
    assert_eq!(report.winner.as_deref(), Some("hand-patch"));
    // Both accepted patches apply to the original code with plain `git apply`, and hold no
    // node_modules.
    for plan in ["hand-patch", "codemod"] {
        let patch = out.path().join(format!("{plan}.patch"));
        let text = std::fs::read_to_string(&patch).unwrap();
        assert!(!text.contains("node_modules"), "{plan}: {text}");
        let copy = tempfile::tempdir().unwrap();
        copy_dir(&code, copy.path());
        let st = std::process::Command::new("git")
            .arg("apply")
            .arg(&patch)
            .current_dir(copy.path())
            .status()
            .unwrap();
        assert!(st.success(), "git apply {plan}.patch");
        let dates = std::fs::read_to_string(copy.path().join("src/dates.js")).unwrap();
        assert!(dates.contains("'dayjs/plugin/utc.js'"), "{plan}: {dates}");
    }
}

/// What an install script in a project being migrated can reach: its sandbox, the package
/// registry the setup allows through forkbox's proxy, and nothing else: not the host (by any
/// of its addresses, directly or through the proxy), not loopback on the host, not cloud
/// metadata, not another site. The probe is a local package whose `postinstall` tries each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postinstall_script_reaches_the_registry_and_nothing_else() {
    let paths = infra::home();
    let image = infra::image(&paths, "node-trixie");
    let host_ips: Vec<String> = {
        let out = std::process::Command::new("ip")
            .args(["-4", "-o", "addr", "show"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(3))
            .filter_map(|a| a.split('/').next())
            .filter(|a| !a.starts_with("127."))
            .map(str::to_string)
            .collect()
    };
    assert!(!host_ips.is_empty());
    let sb = Sandbox::create(
        &paths,
        &SandboxConfig {
            image,
            network: forkbox_engine::net::NetworkPolicy {
                internet: false,
                allow: vec!["registry.npmjs.org".into()],
                deny: Vec::new(),
            },
            ..SandboxConfig::default()
        },
    )
    .await
    .unwrap();
    let probe = include_str!("probe/probe.js");
    let w = |p: &'static str, s: String| {
        let sb = &sb;
        async move {
            sb.client()
                .write_file(p, s.as_bytes(), 0o644)
                .await
                .unwrap()
        }
    };
    w("/work/probe/probe.js", probe.to_string()).await;
    w(
        "/work/probe/package.json",
        r#"{"name":"probe","version":"1.0.0","scripts":{"postinstall":"node probe.js"}}"#.into(),
    )
    .await;
    w(
        "/work/app/package.json",
        r#"{"name":"app","version":"1.0.0","dependencies":{"probe":"file:../probe"}}"#.into(),
    )
    .await;
    let out = sb
        .run(forkbox_protocol::ExecSpec {
            cwd: Some("/work/app".into()),
            env: vec![("PROBE_HOST_IPS".into(), host_ips.join(","))],
            ..infra::sh(
                "npm install --foreground-scripts --no-audit --no-fund 2>&1",
                Some(300_000),
            )
        })
        .await
        .unwrap();
    sb.destroy().await;
    let text = out.stdout_text();
    assert_eq!(out.code(), 0, "{text}");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("PROBE "))
        .unwrap_or_else(|| panic!("no probe report: {text}"));
    eprintln!("{line}");
    let r: serde_json::Value = serde_json::from_str(line).unwrap();
    // Through the proxy: the registry only.
    for (target, status) in r["proxy"].as_object().unwrap() {
        let ok = status.as_str().unwrap().starts_with("200");
        assert_eq!(ok, target == "registry.npmjs.org:443", "{target}: {status}");
    }
    assert!(r["proxy"].as_object().unwrap().len() >= 4 + host_ips.len());
    // Directly: nothing (the guest has no network interface but loopback).
    for (target, result) in r["direct"].as_object().unwrap() {
        assert!(
            !result.as_str().unwrap().starts_with("connected"),
            "{target}: {result}"
        );
    }
    // Its own name (the sandbox's id), none of the host's files.
    assert!(r["hostname"].as_str().unwrap().starts_with("sb-"), "{r}");
    assert_eq!(r["host_repo_visible"], false);
}

/// Before a rejection is final a plan's lost tests run once more, alone (pytest node ids): a
/// test that failed once and passes then is "lost, flaky" and does not reject its plan; one
/// that fails again does. With pytest-randomly in the old image the baseline runs are
/// shuffled, and the report says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_tests_run_again_before_a_rejection_is_final() {
    let paths = infra::home();
    let image = infra::image_from(
        &paths,
        &infra::repo_root().join("crates/migrate/tests/images/python-randomly.toml"),
    );
    let code = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(code.path().join("tests")).unwrap();
    std::fs::write(
        code.path().join("tests/test_steady.py"),
        "import pytest\n\n@pytest.mark.parametrize('n', range(12))\ndef test_steady(n):\n    assert n * 2 == n + n\n",
    )
    .unwrap();
    // Markers outside the tree, which a porter leaves: one failure, or failures for good.
    std::fs::write(
        code.path().join("tests/test_marks.py"),
        "import os\n\ndef test_once():\n    if os.path.exists('/tmp/fail-once'):\n        os.remove('/tmp/fail-once')\n        assert False, 'fails this once'\n\ndef test_always():\n    assert not os.path.exists('/tmp/fail-always')\n",
    )
    .unwrap();
    let plans = tempfile::tempdir().unwrap();
    std::fs::write(
        plans.path().join("plans.toml"),
        r#"[[plan]]
name = "fails-once"
instructions = "a port whose run meets a failure that does not repeat"
porter = { command = "touch /tmp/fail-once" }

[[plan]]
name = "breaks"
instructions = "a port that breaks a test for good"
porter = { command = "touch /tmp/fail-always" }
"#,
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let cfg = MigrateConfig {
        test_timeout_secs: 600,
        ..MigrateConfig::new(
            (&image.to_string(), &image.to_string()),
            code.path().to_path_buf(),
            "python3 -m pytest -q -rA -p no:cacheprovider",
            plans_of(plans.path()),
            out.path().to_path_buf(),
        )
    };
    let report = migrate_logged(&paths, &cfg).await;
    assert!(
        report
            .baseline_order
            .contains("shuffled by pytest-randomly"),
        "{}",
        report.baseline_order
    );
    assert_eq!(report.baseline.passed().count(), 14);
    let plan = |name: &str| report.plans.iter().find(|p| p.plan == name).unwrap();
    let verdict = |name: &str| verdict_of(&report, name);

    let once = verdict("fails-once");
    assert!(once.accepted, "{once:?}");
    assert!(once.lost.is_empty(), "{once:?}");
    assert_eq!(once.flaky_lost, vec!["tests/test_marks.py::test_once"]);
    assert!(once.reason.contains("lost, flaky"), "{}", once.reason);
    let rerun = plan("fails-once")
        .rerun
        .clone()
        .expect("its lost test ran again");
    assert!(rerun.alone && rerun.error.is_none(), "{rerun:?}");
    assert_eq!(rerun.tests, vec!["tests/test_marks.py::test_once"]);
    assert_eq!(
        rerun.results.get("tests/test_marks.py::test_once"),
        Some(&Outcome::Passed)
    );
    // Alone: the re-run reported its one test and nothing else.
    assert_eq!(rerun.results.len(), 1, "{rerun:?}");

    let breaks = verdict("breaks");
    assert!(!breaks.accepted, "{breaks:?}");
    assert_eq!(breaks.lost, vec!["tests/test_marks.py::test_always"]);
    assert!(breaks.flaky_lost.is_empty(), "{breaks:?}");
    assert!(
        breaks.reason.contains("nor when run again"),
        "{}",
        breaks.reason
    );
    let rerun = plan("breaks")
        .rerun
        .clone()
        .expect("its lost test ran again");
    assert_eq!(
        rerun.results.get("tests/test_marks.py::test_always"),
        Some(&Outcome::Failed)
    );
    assert_eq!(report.winner.as_deref(), Some("fails-once"));

    // The report says the same.
    let html = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(html.contains("lost, flaky") && html.contains("shuffled by pytest-randomly"));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(
        json["verdicts"][0]["flaky_lost"][0],
        "tests/test_marks.py::test_once"
    );
}
