//! forkbox on Debian 12's own QEMU 7.2, beside the QEMU `forkbox setup` installs (10.0): the
//! weaknesses 7.2 has (a RAM file its copies' QEMUs open read-write; TCG's dirty tracking that
//! needs padded RAM) are worked around, not fixed, and users who keep 7.2
//! (`forkbox setup --qemu=system`) must not be broken by what 10.0 allows.
//!
//! `scripts/qemu-7.2.sh` unpacks 7.2 into the test home (nothing is installed), and the
//! engine's fork tests run with `FORKBOX_QEMU` pointing at it. In every run: a live snapshot of
//! a busy sandbox is exact page for page, and forks carry processes and diverge (~2 min).
//! `FORKBOX_QEMU72_FULL=1` runs all of the engine's fork tests there.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::PathBuf;
use std::process::Command;

/// Debian 12's QEMU 7.2, unpacked; `None` (said why) where apt offers none.
fn qemu_7_2() -> Option<PathBuf> {
    let out = Command::new(forkbox_test_infra::repo_root().join("scripts/qemu-7.2.sh"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(77) {
        eprintln!("skipped: {stderr}");
        return None;
    }
    assert!(out.status.success(), "scripts/qemu-7.2.sh: {stderr}");
    Some(PathBuf::from(
        String::from_utf8(out.stdout).unwrap().trim().to_string(),
    ))
}

#[test]
fn snapshots_and_forks_on_qemu_7_2() {
    let Some(qemu) = qemu_7_2() else { return };
    let version = Command::new(&qemu).arg("--version").output().unwrap();
    let banner = String::from_utf8_lossy(&version.stdout);
    assert!(banner.contains("version 7.2."), "{banner}");
    let mut cmd = Command::new(forkbox_test_infra::test_binary("fork"));
    cmd.env("FORKBOX_QEMU", &qemu).arg("--test-threads=1");
    if std::env::var("FORKBOX_QEMU72_FULL").as_deref() != Ok("1") {
        cmd.args([
            "--exact",
            "live_snapshot_of_a_busy_sandbox_is_exact",
            "forks_carry_processes_and_diverge",
        ]);
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("{stderr}\n{stdout}");
    assert!(
        out.status.success(),
        "the fork tests failed on {}",
        banner.lines().next().unwrap_or_default()
    );
    // The run did test something (a filter that matches nothing passes).
    assert!(
        stdout.contains("test result: ok.") && !stdout.contains("test result: ok. 0 passed"),
        "{stdout}"
    );
}
