//! Choosing the accelerator: KVM where this host can run a standard guest, TCG elsewhere.
//!
//! `/dev/kvm` existing is not enough: nested or paravirtual KVM may accept a VM and then fail
//! on the first MSR write (`-cpu host`) or run a standard kernel so slowly it never boots. So
//! the decision boots the real guest kernel once under KVM, and the guest agent (in probe mode)
//! says it got to userspace. The deadline fits the host: the same guest boots under TCG beside
//! it, and KVM is chosen if it gets there first (a real KVM host: well under a second; a KVM
//! guest nested in an emulated one: 15-30 s, still ahead of TCG inside that guest; this host's
//! paravirtual KVM: never). The verdict is cached per host (kernel release, QEMU binary, CPU
//! model) and probe guest (the initramfs, named by its content), so later sandboxes pay nothing.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::error::VmError;
use crate::paths::{write_atomic, Paths};

pub use forkbox_api::{Accel, AccelChoice, AccelDecision};

/// How long a probe guest may take to reach userspace under KVM, at most, when the one beside
/// it under TCG has not either.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(180);

#[derive(Debug, Serialize, Deserialize)]
struct Verdict {
    host: String,
    kvm_works: bool,
    reason: String,
}

pub(crate) fn host_fingerprint() -> String {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let qemu = super::program::program()
        .and_then(|p| {
            std::fs::metadata(&p)
                .ok()
                .map(|m| format!("{}:{}:{:?}", p.display(), m.len(), m.modified().ok()))
        })
        .unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .unwrap_or_default()
        .to_string();
    format!("{release}|{qemu}|{cpu}")
}

/// The accelerator this host gives sandboxes, once a guest kernel and the agent are there to
/// probe with (`None` before).
pub async fn host_decision(
    paths: &Paths,
    choice: AccelChoice,
) -> Result<Option<AccelDecision>, crate::error::SandboxError> {
    let (Ok(k), Ok((_, bytes))) = (
        crate::kernel::Kernel::newest(paths),
        crate::agent_bin::locate(),
    ) else {
        return Ok(None);
    };
    let initramfs = crate::kernel::initramfs(paths, &k, &bytes)?;
    Ok(Some(decide(paths, choice, &k.vmlinuz(), &initramfs).await?))
}

/// Decides the accelerator. `kernel` and `initramfs` are those the sandbox will boot.
pub async fn decide(
    paths: &Paths,
    choice: AccelChoice,
    kernel: &Path,
    initramfs: &Path,
) -> Result<AccelDecision, VmError> {
    if choice == AccelChoice::Tcg {
        return Ok(AccelDecision {
            accel: Accel::Tcg,
            reason: "requested".into(),
        });
    }
    super::cpu::kvm_model().map_err(|reason| VmError::CpuModel { reason })?;
    let kvm = kvm_usable(paths, kernel, initramfs).await;
    match (choice, kvm) {
        (_, Ok(())) => Ok(AccelDecision {
            accel: Accel::Kvm,
            reason: "this host runs standard guests under KVM".into(),
        }),
        (AccelChoice::Kvm, Err(reason)) => Err(VmError::KvmUnavailable { reason }),
        (_, Err(reason)) => Ok(AccelDecision {
            accel: Accel::Tcg,
            reason,
        }),
    }
}

async fn kvm_usable(paths: &Paths, kernel: &Path, initramfs: &Path) -> Result<(), String> {
    let dev = Path::new("/dev/kvm");
    if !dev.exists() {
        return Err("no /dev/kvm".into());
    }
    if !crate::setup::usable_device(dev) {
        return Err("/dev/kvm cannot be opened for reading and writing by this user".into());
    }
    if let Some(why) = jail_cannot_open(dev) {
        return Err(why);
    }
    // The guest that probes is part of the key: a verdict reached with another kernel or agent
    // is not trusted.
    let host = format!(
        "{}|{}",
        host_fingerprint(),
        initramfs
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    if let Ok(text) = std::fs::read_to_string(paths.accel_verdict()) {
        if let Ok(v) = serde_json::from_str::<Verdict>(&text) {
            if v.host == host {
                return if v.kvm_works { Ok(()) } else { Err(v.reason) };
            }
        }
    }
    let result = race(kernel, initramfs).await;
    let verdict = Verdict {
        host,
        kvm_works: result.is_ok(),
        reason: result.as_ref().err().cloned().unwrap_or_default(),
    };
    if let Ok(json) = serde_json::to_vec_pretty(&verdict) {
        let _ = write_atomic(&paths.accel_verdict(), &json);
    }
    result
}

/// Why a jailed QEMU could not open `/dev/kvm`, if it could not: it runs as a uid of its own
/// with the device's group, so the group needs read and write (Debian's udev rule gives it
/// group `kvm`, mode 0660; a host without udev may leave it 0600, root's alone).
fn jail_cannot_open(dev: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dev).ok()?.permissions().mode();
    (super::jail::own_uid() && mode & 0o060 != 0o060).then(|| {
        format!(
            "/dev/kvm is mode {:o}: sandboxes' QEMUs run as users of their own and reach it through its group (as udev sets it: groupadd -r kvm; chgrp kvm /dev/kvm; chmod 660 /dev/kvm)",
            mode & 0o777
        )
    })
}

/// Why this host cannot run a guest saved under KVM, if its cached verdict (or the lack of a
/// `/dev/kvm`) says so; `None` when KVM works here or nothing is known yet.
pub fn kvm_refused(paths: &Paths) -> Option<String> {
    if !Path::new("/dev/kvm").exists() {
        return Some("no /dev/kvm".into());
    }
    let v: Verdict = serde_json::from_slice(&std::fs::read(paths.accel_verdict()).ok()?).ok()?;
    (v.host.starts_with(&format!("{}|", host_fingerprint())) && !v.kvm_works).then_some(v.reason)
}

/// The probe guest under KVM and under TCG at once: KVM works for this host if its guest
/// reaches userspace first (the TCG one is stopped then), or if the TCG one fails. A KVM that
/// loses to emulation is broken for forkbox's purposes (paravirtual KVM never gets there; a
/// nested one in a KVM guest, even in an emulated one, still beats emulation inside it), so
/// `--accel kvm` is refused there too.
async fn race(kernel: &Path, initramfs: &Path) -> Result<(), String> {
    let started = Instant::now();
    let kvm = probe(Accel::Kvm, kernel, initramfs, PROBE_DEADLINE);
    let tcg = probe(Accel::Tcg, kernel, initramfs, PROBE_DEADLINE);
    tokio::pin!(kvm, tcg);
    tokio::select! {
        r = &mut kvm => r,
        r = &mut tcg => match r {
            // TCG got there first: KVM here is paravirtual or broken.
            // Whether it would get there at all is left open (never, on a paravirtual KVM).
            Ok(()) => Err(format!(
                "a standard guest kernel reached userspace under tcg in {} ms and not yet under kvm (paravirtual or broken KVM)",
                started.elapsed().as_millis()
            )),
            Err(_) => kvm.await,
        },
    }
}

/// Boots the guest kernel in probe mode (no disk, no devices) and waits up to `deadline` for
/// the agent to say it reached userspace.
pub async fn probe(
    accel: Accel,
    kernel: &Path,
    initramfs: &Path,
    deadline: Duration,
) -> Result<(), String> {
    let started = Instant::now();
    let accel_args = [
        "-accel".to_string(),
        match accel {
            Accel::Kvm => "kvm".into(),
            Accel::Tcg => "tcg,thread=multi".into(),
        },
        "-cpu".into(),
        super::cpu::qemu_cpu(accel),
    ];
    let mut child = Command::new(super::program::program().ok_or("QEMU is not installed")?)
        .args(super::program::firmware_args())
        .envs(super::program::module_env())
        .args([
            "-M",
            "microvm,x-option-roms=off,isa-serial=on,acpi=on",
            "-m",
            "256M",
        ])
        .args(accel_args)
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initramfs)
        .arg("-append")
        .arg(format!(
            "{} forkbox.probe=1",
            super::qemu::kernel_cmdline(accel)
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start QEMU for the KVM probe: {e}"))?;
    let mut out = child.stdout.take().ok_or("no probe stdout")?;
    let mut err = child.stderr.take().ok_or("no probe stderr")?;
    let mut seen = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match out.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(16).any(|w| w == b"FORKBOX-PROBE-OK") {
                        return true;
                    }
                }
            }
        }
    };
    let ok = tokio::time::timeout(deadline, read).await;
    let _ = child.start_kill();
    let status = child.wait().await;
    match ok {
        Ok(true) => Ok(()),
        Ok(false) => {
            let mut e = String::new();
            let _ = tokio::time::timeout(Duration::from_millis(500), err.read_to_string(&mut e)).await;
            let said = e.lines().find(|l| !l.contains("warning")).unwrap_or(e.lines().next().unwrap_or("")).trim().to_string();
            let said = if said.is_empty() {
                format!("QEMU exited ({})", status.map(|s| s.to_string()).unwrap_or_default())
            } else {
                said
            };
            // The guest's last words, printable and short (a panic says why).
            let console = String::from_utf8_lossy(&seen).into_owned();
            let last: Vec<&str> = console.lines().map(str::trim).filter(|l| !l.is_empty()).rev().take(3).collect();
            let last: String = last.into_iter().rev().collect::<Vec<_>>().join(" / ").chars().filter(|c| !c.is_control()).take(300).collect();
            Err(format!(
                "a {accel} guest failed after {} ms: {said}{}",
                started.elapsed().as_millis(),
                if last.is_empty() { String::new() } else { format!("; its console's last lines: {last}") }
            ))
        }
        Err(_) => Err(format!(
            "a standard guest kernel did not reach userspace under {accel} within {} s (nested or paravirtual KVM)",
            deadline.as_secs()
        )),
    }
}
