//! What the corpus tests share: a lock for their caches, and a migration with one plan.

#![allow(clippy::unwrap_used, dead_code)] // tests fail loudly by design; each uses a part

use std::path::{Path, PathBuf};
use std::time::Instant;

use forkbox_migrate::flow::MigrateReport;
use forkbox_migrate::MigrateConfig;

/// Runs `f` holding the lock of the cache in `dir` (the corpus tests run side by side).
pub fn locked<T>(dir: &Path, f: impl FnOnce() -> T) -> T {
    let file = std::fs::File::create(dir.join(".lock")).unwrap();
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .unwrap();
    f()
}

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
    (from, to): (&str, &str),
    code: PathBuf,
    test: &str,
    plan: &str,
) -> OnePlan {
    let plans = tempfile::tempdir().unwrap();
    let file = plans.path().join("plans.toml");
    std::fs::write(&file, format!("[[plan]]\n{plan}")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let cfg = MigrateConfig {
        test_timeout_secs: 1800,
        ..MigrateConfig::new(
            (from, to),
            code,
            test,
            (
                forkbox_migrate::plans::load(&file).unwrap(),
                plans.path().to_path_buf(),
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
