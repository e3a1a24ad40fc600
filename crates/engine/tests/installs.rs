//! Package installs in sandboxes through the package cache, as a migration's prepare step runs
//! them: `npm ci` of qs with its tape suite's dependencies (136 packages), its lock file
//! without `resolved` URLs (what this machine's npm writes, so npm first asks for every
//! package's metadata: a hundred TLS connections at once), in one-vCPU node-trixie sandboxes
//! that may reach the registry and nothing else. Under emulation a guest could not answer that
//! many handshakes within the registry's time (~10 s), npm retried and failed with
//! ECONNRESET; the cache ends the guest's TLS on the host and fetches over its own
//! connections. Every test here runs with `FORKBOX_INSTALLS=all` (~2.5 min under TCG from an
//! empty cache; ~12 min for the same tree in a guest whose QEMU is held to 25 % of a core;
//! pip's, pnpm's and Yarn's installs). The default run covers the same path with the Node
//! example (`crates/migrate/tests/demo.rs`): `npm ci` of a 197-package lock file without
//! `resolved` URLs in a one-vCPU node-trixie sandbox that may reach the registry alone,
//! through the package cache. Answers from the cache, misses fetched included, are checked
//! host-side (`packages.rs`). Needs npm's registry (for the lock files and the installs).
//! Prints `FIGURE` lines.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::Arc;

use forkbox_engine::packages::{PackageCache, Settings, DEFAULT_HOSTS};
use forkbox_engine::sandbox::{Sandbox, SandboxConfig};
use forkbox_test_infra as infra;

/// `npm ci` of the project at `code` in a new sandbox through `cache` (its QEMU held to
/// `percent` of a core when given): how long it took, npm's retried fetches, and the
/// sandbox's count of connections a registry cut short.
async fn npm_ci(
    paths: &forkbox_engine::paths::Paths,
    cfg: &SandboxConfig,
    code: &std::path::Path,
    percent: Option<u32>,
) -> (f64, usize, u64) {
    let sb = Sandbox::create(paths, cfg).await.unwrap();
    forkbox_engine::sandbox::files::upload(sb.client(), code, "/root/qs")
        .await
        .unwrap();
    if let Some(p) = percent {
        infra::npm::throttle(&sb.info().id, p);
    }
    let started = std::time::Instant::now();
    let out = sb
        .run(infra::argv(
            &[
                "sh",
                "-c",
                "cd /root/qs && npm ci --no-audit --no-fund --loglevel http 2>&1 && node -e \"require('./'); console.log('required')\"",
            ],
            &[],
            1_500_000,
        ))
        .await
        .unwrap();
    let log = out.stdout_text();
    let tail: Vec<&str> = log.lines().rev().take(15).collect();
    assert_eq!(out.code(), 0, "npm ci failed:\n{}", tail.join("\n"));
    assert!(log.contains("required"), "{log}");
    let took = started.elapsed().as_secs_f64();
    let cut = sb.client().net.counts().cut_short;
    sb.destroy().await;
    (took, log.matches(" attempt #").count(), cut)
}

/// `spec`'s project with its development dependencies trimmed to `keep`, locked on the host
/// (under the test home's `installs/`), without its `node_modules`; and its lock file's text.
fn locked_project(
    paths: &forkbox_engine::paths::Paths,
    spec: &str,
    keep: &[&str],
) -> (tempfile::TempDir, std::path::PathBuf, String) {
    let dir = paths.home().join("installs");
    std::fs::create_dir_all(&dir).unwrap();
    let (work, code) = infra::npm::project(&dir, spec, keep, &[], None);
    let lock = std::fs::read_to_string(code.join("package-lock.json")).unwrap();
    forkbox_engine::tree::remove_tree(&code.join("node_modules")).unwrap();
    (work, code, lock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npm_ci_of_qs_through_an_empty_package_cache() {
    if !all() {
        eprintln!("skipped (FORKBOX_INSTALLS=all runs it; the Node example covers npm ci)");
        return;
    }
    let paths = infra::home();
    let (_keep, code, lock) = locked_project(&paths, "qs@6.13.0", infra::npm::QS_KEEP);
    assert!(
        !lock.contains("\"resolved\""),
        "the lock file names no download URLs"
    );
    let packages = lock.matches("\"node_modules/").count() as u64;

    // An empty cache of its own: the first install fetches everything.
    let store = tempfile::tempdir().unwrap();
    let (cfg, cache) = sandbox_config(&paths, "node-trixie", &["registry.npmjs.org"], store.path());

    let (cold, retried, cut) = npm_ci(&paths, &cfg, &code, None).await;
    let first = cache.counts();
    println!(
        "FIGURE npm ci of qs ({packages} packages) in a 1-vCPU sandbox, empty cache: {cold:.0} s, \
         {retried} fetches retried, {cut} connections cut short; cache {first:?}"
    );
    assert_eq!((retried, cut), (0, 0));
    // Every package's metadata and tarball went through the cache and was kept.
    assert!(first.fetched >= 2 * packages, "{first:?}");
}

/// The whole of qs's tape suite's tree (136 packages) in a guest held to a quarter of a core,
/// from an empty cache. Measured: 713 s, nothing retried or cut short (before the cache: failed
/// after 677 s, 215 connections cut short by the registry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npm_ci_of_qs_in_a_throttled_guest_from_an_empty_cache() {
    if !all() {
        eprintln!("skipped (FORKBOX_INSTALLS=all runs it)");
        return;
    }
    let paths = infra::home();
    let (_keep, code, _) = locked_project(&paths, "qs@6.13.0", infra::npm::QS_KEEP);
    let store = tempfile::tempdir().unwrap();
    let (cfg, cache) = sandbox_config(&paths, "node-trixie", &["registry.npmjs.org"], store.path());
    let (slow, retried, cut) = npm_ci(&paths, &cfg, &code, Some(25)).await;
    println!(
        "FIGURE npm ci of qs (136 packages) held to 25 % of a core, empty cache: {slow:.0} s, \
         {retried} fetches retried, {cut} connections cut short; cache {:?}",
        cache.counts()
    );
    assert_eq!((retried, cut), (0, 0));
}

/// The installs run with `FORKBOX_INSTALLS=all` (each takes minutes under TCG; the Node
/// example covers the same path in the default run).
fn all() -> bool {
    std::env::var("FORKBOX_INSTALLS").is_ok_and(|v| v == "all")
}

/// A sandbox through its own empty cache, allowed `allow`.
fn sandbox_config(
    paths: &forkbox_engine::paths::Paths,
    image: &str,
    allow: &[&str],
    store: &std::path::Path,
) -> (SandboxConfig, Arc<PackageCache>) {
    let settings = Settings {
        hosts: DEFAULT_HOSTS.iter().map(|h| h.to_string()).collect(),
        max_bytes: 4 << 30,
    };
    let cache = PackageCache::open(store, settings).unwrap();
    let cfg = SandboxConfig {
        image: infra::image(paths, image),
        memory_mib: 2048,
        network: forkbox_engine::net::NetworkPolicy {
            internet: false,
            allow: allow.iter().map(|h| h.to_string()).collect(),
            deny: Vec::new(),
        },
        packages: Some(cache.clone()),
        ..Default::default()
    };
    (cfg, cache)
}

/// `script` in a new sandbox of `cfg` with `dir` at /root/p; its output.
async fn in_sandbox(
    paths: &forkbox_engine::paths::Paths,
    cfg: &SandboxConfig,
    dir: &std::path::Path,
    script: &str,
) -> String {
    let sb = Sandbox::create(paths, cfg).await.unwrap();
    forkbox_engine::sandbox::files::upload(sb.client(), dir, "/root/p")
        .await
        .unwrap();
    let out = sb
        .run(infra::argv(
            &["sh", "-c", &format!("cd /root/p && ({script}) 2>&1")],
            &[],
            3_000_000,
        ))
        .await
        .unwrap();
    let log = out.stdout_text();
    sb.destroy().await;
    let tail: Vec<&str> = log.lines().rev().take(20).collect();
    assert_eq!(out.code(), 0, "{script} failed:\n{}", tail.join("\n"));
    log
}

/// `pip install -r` of about 150 pinned packages (jupyterlab, sphinx, pytest, requests, boto3,
/// pandas, matplotlib, django, fastapi, mypy and what they need, resolved on the host for the
/// guest's Python by `pip install --dry-run --report`) into a venv of python-bookworm, through
/// the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pip_installs_150_packages_through_the_cache() {
    if !all() {
        eprintln!("skipped (FORKBOX_INSTALLS=all runs it)");
        return;
    }
    let paths = infra::home();
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("resolve");
    let ok = |c: &mut std::process::Command| assert!(c.status().unwrap().success(), "{c:?}");
    ok(std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv));
    let report = dir.path().join("report.json");
    // Resolved for the guest's Python (bookworm's 3.11.2), wheels only.
    let roots = "jupyterlab sphinx pytest requests boto3 pandas flask sqlalchemy black rich \
                 httpx matplotlib django fastapi uvicorn mypy";
    ok(std::process::Command::new(venv.join("bin/pip"))
        .args(["install", "-q", "--dry-run", "--ignore-installed"])
        .args([
            "--python-version",
            "3.11.2",
            "--only-binary=:all:",
            "--target",
        ])
        .arg(dir.path().join("target"))
        .arg("--report")
        .arg(&report)
        .args(roots.split_whitespace()));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let pins: Vec<String> = report["install"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}=={}",
                i["metadata"]["name"].as_str().unwrap(),
                i["metadata"]["version"].as_str().unwrap()
            )
        })
        .collect();
    let project = dir.path().join("p");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("requirements.txt"), pins.join("\n") + "\n").unwrap();
    let store = tempfile::tempdir().unwrap();
    let allow = ["pypi.org", "files.pythonhosted.org"];
    let (cfg, cache) = sandbox_config(&paths, "python-bookworm", &allow, store.path());
    let started = std::time::Instant::now();
    in_sandbox(
        &paths,
        &cfg,
        &project,
        "python3 -m venv /root/v && /root/v/bin/pip install -q --no-cache-dir -r requirements.txt && /root/v/bin/python -c 'import jupyterlab, pandas, sphinx'",
    )
    .await;
    let c = cache.counts();
    println!(
        "FIGURE pip install -r of {} packages in a 1-vCPU sandbox through an empty cache: {:.0} s; cache {c:?}",
        pins.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(pins.len() >= 140, "{}", pins.len());
    assert!(c.fetched >= pins.len() as u64, "{c:?}");
}

/// pnpm and Yarn (classic) installing a Jest project (about 300 packages) from lock files of
/// their own made from npm's (`pnpm import`, `yarn import`), frozen, through the cache; the
/// second finds npm's tarballs kept by the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pnpm_and_yarn_install_a_frozen_lock_through_the_cache() {
    if !all() {
        eprintln!("skipped (FORKBOX_INSTALLS=all runs it)");
        return;
    }
    let paths = infra::home();
    let (_keep, code, _) = locked_project(&paths, "process-warning@5.1.1", &["jest"]);
    let store = tempfile::tempdir().unwrap();
    let (cfg, cache) = sandbox_config(
        &paths,
        "node-trixie",
        &["registry.npmjs.org", "registry.yarnpkg.com"],
        store.path(),
    );
    for (tool, script) in [
        ("pnpm", "npm i -g --no-audit --no-fund pnpm@9 && pnpm import && rm package-lock.json && pnpm install --frozen-lockfile && test -x node_modules/.bin/jest"),
        ("yarn", "npm i -g --no-audit --no-fund yarn@1 && yarn import && rm package-lock.json && yarn install --frozen-lockfile --non-interactive && test -x node_modules/.bin/jest"),
    ] {
        let started = std::time::Instant::now();
        in_sandbox(&paths, &cfg, &code, script).await;
        println!(
            "FIGURE {tool} install of a Jest project in a 1-vCPU sandbox: {:.0} s; cache {:?}",
            started.elapsed().as_secs_f64(),
            cache.counts()
        );
    }
    assert!(cache.counts().hits > 200, "{:?}", cache.counts());
}
