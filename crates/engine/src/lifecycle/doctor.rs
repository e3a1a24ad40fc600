//! `forkbox doctor`: how well this host confines sandboxes, and what to fix. Each check says
//! what it found and, where it is not as it should be, the command or setting that fixes it.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::Serialize;

use crate::paths::Paths;
use crate::vm::{Accel, AccelDecision};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub found: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn check(name: &'static str, status: Status, found: String, fix: Option<String>) -> Check {
    Check {
        name,
        status,
        found,
        fix,
    }
}

/// Every check; `accel` is the accelerator this host gets (`None` when it cannot be told yet).
pub fn checks(paths: &Paths, accel: Option<&AccelDecision>) -> Vec<Check> {
    vec![
        accelerator(accel),
        home(paths),
        cgroups(),
        seccomp(),
        jail(),
        qemu(accel),
        log_size(paths),
    ]
}

fn accelerator(accel: Option<&AccelDecision>) -> Check {
    match accel {
        Some(d) if d.accel == Accel::Kvm => {
            check("accelerator", Status::Ok, format!("KVM ({})", d.reason), None)
        }
        Some(d) => check(
            "accelerator",
            Status::Warn,
            format!("TCG, software emulation ({}): QEMU promises no isolation under TCG, so the jail around each QEMU is the boundary", d.reason),
            Some("run on a host whose /dev/kvm can run a standard guest (bare metal, or nested virtualisation enabled)".into()),
        ),
        None => check(
            "accelerator",
            Status::Warn,
            "unknown until a guest kernel and the agent are installed".into(),
            Some("forkbox setup".into()),
        ),
    }
}

/// The home's mode and owner (see [`Paths::secure_home`]).
pub fn home(paths: &Paths) -> Check {
    let dir = paths.home();
    let Ok(meta) = std::fs::metadata(dir) else {
        return check(
            "home",
            Status::Ok,
            format!("{} does not exist yet; it is made 0700", dir.display()),
            None,
        );
    };
    let mode = meta.mode() & 0o7777;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return check(
            "home",
            Status::Fail,
            format!("{} belongs to uid {}, not {me}", dir.display(), meta.uid()),
            Some(format!("chown {me} {}", dir.display())),
        );
    }
    if mode & 0o077 != 0 {
        return check(
            "home",
            Status::Fail,
            format!(
                "{} is mode {mode:04o}: other local users can read sandboxes' disks, memory and logs",
                dir.display()
            ),
            Some(format!("chmod 700 {} (any forkbox command does it)", dir.display())),
        );
    }
    check(
        "home",
        Status::Ok,
        format!("{} is mode {mode:04o}, owned by uid {me}", dir.display()),
        None,
    )
}

fn cgroups() -> Check {
    let root = Path::new("/sys/fs/cgroup");
    let v2 = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    let want = ["memory", "pids", "cpu"];
    if want.iter().all(|w| v2.split_whitespace().any(|x| x == *w)) {
        return check(
            "cgroups",
            Status::Ok,
            "cgroup v2 with memory, pids and cpu".into(),
            None,
        );
    }
    let missing: Vec<&str> = want
        .iter()
        .copied()
        .filter(|c| !root.join(c).join("tasks").exists())
        .collect();
    if missing.is_empty() {
        check(
            "cgroups",
            Status::Ok,
            "cgroup v1 with memory, pids and cpu".into(),
            None,
        )
    } else {
        check(
            "cgroups",
            Status::Fail,
            format!("no {} controller: QEMUs run without those host limits", missing.join(", ")),
            Some("boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1) or mount the v1 controllers".into()),
        )
    }
}

fn seccomp() -> Check {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let has = status.lines().any(|l| l.starts_with("Seccomp:"));
    let filter = std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail")
        .is_ok_and(|a| a.contains("kill_process") || a.contains("trap"));
    if has && filter {
        check(
            "seccomp",
            Status::Ok,
            "the kernel filters system calls (QEMU runs with -sandbox on)".into(),
            None,
        )
    } else {
        check(
            "seccomp",
            Status::Fail,
            "this kernel has no seccomp filters: QEMU would run without its system-call filter"
                .into(),
            Some("use a kernel built with CONFIG_SECCOMP_FILTER".into()),
        )
    }
}

fn jail() -> Check {
    if !crate::vm::jail::enabled() {
        return check(
            "jail",
            Status::Fail,
            "FORKBOX_JAIL=off: QEMU runs unconfined, as forkbox's user".into(),
            Some("unset FORKBOX_JAIL".into()),
        );
    }
    if !crate::vm::jail::own_uid() {
        return check(
            "jail",
            Status::Warn,
            "FORKBOX_JAIL_UID=off: QEMU keeps uid 0 inside its jail".into(),
            Some("unset FORKBOX_JAIL_UID".into()),
        );
    }
    let (lo, hi) = (
        crate::vm::jail::UID_BASE,
        crate::vm::jail::UID_BASE + crate::vm::jail::UID_RANGE,
    );
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let clash: Vec<&str> = passwd
        .lines()
        .filter(|l| {
            l.split(':')
                .nth(2)
                .and_then(|u| u.parse::<u32>().ok())
                .is_some_and(|u| (lo..hi).contains(&u))
        })
        .filter_map(|l| l.split(':').next())
        .collect();
    if !clash.is_empty() {
        return check(
            "jail",
            Status::Fail,
            format!(
                "accounts inside the uids given to QEMUs ({lo}..{hi}): {}",
                clash.join(", ")
            ),
            Some("move those accounts to other uids".into()),
        );
    }
    if nix::unistd::geteuid().as_raw() != 0 {
        return check(
            "jail",
            Status::Fail,
            "not root: QEMU cannot be jailed (namespaces, chroot, its own uid)".into(),
            Some("run forkbox as root".into()),
        );
    }
    check(
        "jail",
        Status::Ok,
        format!("each QEMU in its own namespaces and chroot, as a uid of its own in {lo}..{hi} without capabilities, group {}", crate::vm::jail::GROUP),
        None,
    )
}

/// The QEMU in use (its program, and whether `FORKBOX_QEMU` chose it) and which of forkbox's
/// protections its version allows.
fn qemu(accel: Option<&AccelDecision>) -> Check {
    use crate::vm::program;
    let line = program::banner();
    let at = match (program::program(), std::env::var_os(program::QEMU_ENV)) {
        (Some(p), Some(_)) => format!(" at {} ({})", p.display(), program::QEMU_ENV),
        (Some(p), None) => format!(" at {}", p.display()),
        (None, _) => String::new(),
    };
    let Some(v) = program::version_of(&line) else {
        return check(
            "qemu",
            Status::Fail,
            format!("{line}{at}: cannot tell its version"),
            Some("forkbox setup".into()),
        );
    };
    let tcg = accel.is_none_or(|a| a.accel == Accel::Tcg);
    let mut on = Vec::new();
    let mut notes = Vec::new();
    if v >= (8, 2) {
        on.push("copies map their snapshot's RAM file read-only");
    } else {
        notes.push("before 8.2 a snapshot's RAM file is writable from inside its copies' jails (no read-only private RAM files)");
    }
    if tcg && v >= (9, 0) {
        on.push("TCG's dirty-page tracking is exact (no RAM padding)");
    } else if tcg {
        notes.push("before 9.0 TCG's dirty-page tracking misses writes unless the RAM size is off 256 KiB: forkbox adds 8 KiB to every TCG guest for it");
    }
    if notes.is_empty() {
        check(
            "qemu",
            Status::Ok,
            format!("{line}{at}: {}", on.join("; ")),
            None,
        )
    } else {
        let fix = match std::env::var_os(program::QEMU_ENV) {
            Some(_) => format!("unset {} to use the QEMU forkbox setup installs", program::QEMU_ENV),
            None => "forkbox setup (QEMU 10.0: from bookworm-backports on Debian 12, the distribution's own on Debian 13)".into(),
        };
        check(
            "qemu",
            Status::Warn,
            format!("{line}{at}: {}", notes.join("; ")),
            Some(fix),
        )
    }
}

fn log_size(paths: &Paths) -> Check {
    let bytes: u64 = ["daemon.log", "daemon.log.1", "daemon.out"]
        .iter()
        .filter_map(|f| std::fs::metadata(paths.home().join(f)).ok())
        .map(|m| m.len())
        .sum();
    check(
        "daemon log",
        Status::Ok,
        format!(
            "{} KiB; daemon.log rotates at its cap, and what a guest causes is cut, escaped and rate-limited",
            bytes >> 10
        ),
        None,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_loose_home_fails_with_the_command_that_fixes_it() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::new(dir.path());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let c = home(&paths);
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(c.fix.as_deref().unwrap().starts_with("chmod 700"), "{c:?}");
        let note = paths.secure_home().unwrap();
        assert!(note.unwrap().contains("was mode 0755"));
        assert_eq!(home(&paths).status, Status::Ok);
        assert_eq!(paths.secure_home().unwrap(), None);
    }
}
