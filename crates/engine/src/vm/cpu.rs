//! The CPU a KVM guest is given, and whether a snapshot of one can run on this host.
//!
//! Under KVM a guest sees a real CPU model's features and uses those it found at boot. With
//! `host` (the default: every feature, the fastest) a snapshot runs only where the CPU has all
//! of the saving host's features; a named model (`FORKBOX_KVM_CPU=EPYC`, `x86-64-v3`, as
//! Firecracker's CPU templates do) gives every host the same features, so snapshots move
//! between cluster nodes of different generations (QEMU refuses, with `enforce`, a host that
//! lacks one of the model's). Under TCG the guest gets QEMU's own `max` model everywhere.

use std::collections::BTreeSet;

use super::Accel;
pub use forkbox_api::GuestCpu;

/// The setting: the `-cpu` model of KVM guests.
pub const KVM_CPU_ENV: &str = "FORKBOX_KVM_CPU";

/// The KVM guests' CPU model: `FORKBOX_KVM_CPU`, else `host`. A value that is not a model's
/// name is refused in words.
pub fn kvm_model() -> Result<String, String> {
    match std::env::var(KVM_CPU_ENV) {
        Err(_) => Ok("host".into()),
        Ok(m) if m.is_empty() => Ok("host".into()),
        Ok(m)
            if m.len() <= 64
                && m.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && m.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) =>
        {
            Ok(m)
        }
        Ok(m) => Err(format!(
            "{KVM_CPU_ENV}={m:?} is not a CPU model's name (host, or one `qemu-system-x86_64 -cpu help` lists, such as EPYC or x86-64-v3)"
        )),
    }
}

/// QEMU's `-cpu` argument for `accel`. A named KVM model is enforced: QEMU refuses to start
/// on a host lacking one of its features rather than give the guest less.
pub fn qemu_cpu(accel: Accel) -> String {
    match accel {
        Accel::Tcg => "max".into(),
        Accel::Kvm => match kvm_model().unwrap_or_else(|_| "host".into()) {
            m if m == "host" => m,
            m => format!("{m},enforce"),
        },
    }
}

/// This host's CPU: its `model name` and feature flags.
pub fn host() -> (String, BTreeSet<String>) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let flags = field("flags")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    (field("model name"), flags)
}

/// What a snapshot of a guest under `accel` records of its CPU (nothing under TCG).
pub fn guest(accel: Accel) -> Option<GuestCpu> {
    (accel == Accel::Kvm).then(|| {
        let (host, flags) = host();
        GuestCpu {
            model: kvm_model().unwrap_or_else(|_| "host".into()),
            host,
            flags: flags.into_iter().collect(),
        }
    })
}

/// What keeps a guest saved with `cpu` from running here, in words; `None` when it can.
pub fn unfit(cpu: &GuestCpu) -> Option<String> {
    let ours = kvm_model().unwrap_or_else(|_| "host".into());
    if cpu.model != ours {
        return Some(format!(
            "it was saved with the CPU model {} and this host gives KVM guests {ours} ({KVM_CPU_ENV})",
            cpu.model
        ));
    }
    if cpu.model != "host" {
        return None;
    }
    let (name, flags) = host();
    let missing: Vec<&str> = cpu
        .flags
        .iter()
        .filter(|f| !flags.contains(*f))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "it was saved on a {} and this host's CPU ({name}) lacks {} of its features ({}{}); restore it on a host of that CPU, or save snapshots with a CPU model every node has ({KVM_CPU_ENV}=EPYC, x86-64-v3, ...)",
        cpu.host,
        missing.len(),
        missing.iter().take(8).copied().collect::<Vec<_>>().join(", "),
        if missing.len() > 8 { ", ..." } else { "" }
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_guest_of_this_host_fits_and_one_of_a_richer_cpu_does_not() {
        let here = guest(Accel::Kvm).unwrap();
        assert_eq!(unfit(&here), None);
        assert_eq!(guest(Accel::Tcg), None);
        let mut richer = here.clone();
        richer.host = "a CPU from the future".into();
        richer.flags.push("no_such_feature".into());
        let why = unfit(&richer).unwrap();
        assert!(
            why.contains("lacks 1 of its features (no_such_feature)"),
            "{why}"
        );
        assert!(
            why.contains("a CPU from the future") && why.contains(KVM_CPU_ENV),
            "{why}"
        );
        let mut named = here;
        named.model = "EPYC".into();
        let why = unfit(&named).unwrap();
        assert!(
            why.contains("the CPU model EPYC") && why.contains("gives KVM guests host"),
            "{why}"
        );
    }
}
