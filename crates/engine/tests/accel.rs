//! The accelerator probe. One probe boot (~3 s under TCG).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use forkbox_engine::kernel::{self, Kernel};
use forkbox_engine::vm::{self, Accel};
use forkbox_test_infra as infra;

/// The probe that decides KVM boots the guest in probe mode: the agent must reach userspace and
/// say so without a disk. Run here under TCG, so that a broken probe mode (which would make
/// every KVM host fall back to emulation) fails a test on any machine.
fn guest() -> (forkbox_engine::paths::Paths, Kernel, std::path::PathBuf) {
    let paths = infra::home();
    let kernel = Kernel::newest(&paths).unwrap();
    let (_, agent) = forkbox_engine::agent_bin::locate().unwrap();
    let initramfs = kernel::initramfs(&paths, &kernel, &agent).unwrap();
    (paths, kernel, initramfs)
}

#[tokio::test]
async fn probe_mode_guest_reaches_userspace_and_reports() {
    let (_, kernel, initramfs) = guest();
    vm::probe(
        Accel::Tcg,
        &kernel.vmlinuz(),
        &initramfs,
        Duration::from_secs(60),
    )
    .await
    .expect("probe guest under TCG");
}

/// What `--accel tcg` and the decision for this host say; and that the decision is cached.
#[tokio::test]
async fn decision_is_explicit_and_cached() {
    let (paths, kernel, initramfs) = guest();
    let tcg = vm::decide(&paths, vm::AccelChoice::Tcg, &kernel.vmlinuz(), &initramfs)
        .await
        .unwrap();
    assert_eq!(tcg.accel, Accel::Tcg);
    let auto = vm::decide(&paths, vm::AccelChoice::Auto, &kernel.vmlinuz(), &initramfs)
        .await
        .unwrap();
    assert!(!auto.reason.is_empty());
    // A probe's verdict is kept per host, and a later decision reads it back. A host whose KVM
    // is ruled out without booting anything (no /dev/kvm, or one that this user or the jail's
    // uids cannot open) keeps none: that check is cheap and may change.
    match std::fs::read(paths.accel_verdict()) {
        Ok(bytes) => {
            let verdict: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(verdict["kvm_works"], auto.accel == Accel::Kvm);
        }
        Err(_) => assert!(
            auto.accel == Accel::Tcg && auto.reason.contains("/dev/kvm"),
            "no cached verdict, yet KVM was not ruled out before a probe: {auto:?}"
        ),
    }
    let again = vm::decide(&paths, vm::AccelChoice::Auto, &kernel.vmlinuz(), &initramfs)
        .await
        .unwrap();
    assert_eq!(again, auto);
    match vm::decide(&paths, vm::AccelChoice::Kvm, &kernel.vmlinuz(), &initramfs).await {
        Ok(d) => assert_eq!((auto.accel, d.accel), (Accel::Kvm, Accel::Kvm)),
        Err(e) => {
            assert_eq!(auto.accel, Accel::Tcg);
            assert!(e.to_string().contains("--accel tcg"), "{e}");
        }
    }
}
