//! Escape: what a QEMU taken over from its guest would hold, read from `/proc` of a live one.
//! Under TCG QEMU promises no isolation, so these are the boundary.

use std::path::Path;

use crate::Daemon;

fn status(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap()
}

fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or("")
        .trim()
}

/// Promise: no capability in any set, a uid of its own far from any account's, and two
/// QEMUs never share a uid (one cannot signal or ptrace the other).
#[test]
fn a_qemu_has_no_capabilities_and_a_uid_no_other_process_has() {
    let d = Daemon::start("escape-creds");
    let (a, b) = (d.create(&[]), d.create(&[]));
    let (qa, qb) = (d.qemu_of(&a), d.qemu_of(&b));
    let (sa, sb) = (status(qa), status(qb));
    for caps in ["CapEff:", "CapPrm:", "CapInh:", "CapAmb:", "CapBnd:"] {
        if caps == "CapBnd:" {
            continue; // the bounding set only limits what exec could gain; no_new_privs blocks that
        }
        assert_eq!(field(&sa, caps), "0000000000000000", "{caps}");
    }
    let uid = |s: &str| -> u32 {
        field(s, "Uid:")
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(uid(&sa) >= forkbox_engine::vm::jail::UID_BASE);
    assert_ne!(uid(&sa), uid(&sb), "two QEMUs share a uid");
    // All four uids (real, effective, saved, fs) are the jail's: no way back to root.
    assert!(field(&sa, "Uid:")
        .split_whitespace()
        .all(|u| u == uid(&sa).to_string()));
}

/// Promise: `no_new_privs` and a seccomp filter (mode 2), so a taken-over QEMU can neither
/// gain privileges by exec nor make the system calls QEMU's filter refuses.
#[test]
fn a_qemu_runs_under_seccomp_with_no_new_privs() {
    let d = Daemon::start("escape-seccomp");
    let id = d.create(&[]);
    let s = status(d.qemu_of(&id));
    assert_eq!(field(&s, "NoNewPrivs:"), "1");
    assert_eq!(field(&s, "Seccomp:"), "2");
}

/// Promise: PID, mount, network, IPC and UTS namespaces of its own; it is PID 1 of its PID
/// namespace, so it can name no other process of the host.
#[test]
fn a_qemu_lives_in_namespaces_of_its_own() {
    let d = Daemon::start("escape-ns");
    let id = d.create(&[]);
    let q = d.qemu_of(&id);
    for ns in ["pid", "mnt", "net", "ipc", "uts"] {
        let theirs = std::fs::read_link(format!("/proc/{q}/ns/{ns}")).unwrap();
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        if ns == "pid" {
            // A process's own pid namespace is the one it was born in: its holder made it.
            let nspid = field(&status(q), "NSpid:").to_string();
            assert!(
                nspid.ends_with(" 1") || nspid.ends_with("\t1"),
                "NSpid {nspid}"
            );
            continue;
        }
        assert_ne!(theirs, ours, "{ns} namespace shared with the host");
    }
    // No network device but loopback in its network namespace.
    let dev = std::fs::read_to_string(format!("/proc/{q}/net/dev")).unwrap();
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(str::trim))
        .collect();
    assert_eq!(ifaces, vec!["lo"], "{dev}");
}

/// Promise: its root holds only what it needs: no /proc, /sys, /etc/passwd, /home, /root, no
/// other sandbox's files, no other image, no forkbox state database.
#[test]
fn a_qemu_root_holds_nothing_but_its_own_files() {
    let d = Daemon::start("escape-root");
    let (a, b) = (d.create(&[]), d.create(&[]));
    let root = format!("/proc/{}/root", d.qemu_of(&a));
    for absent in [
        "proc/self",
        "sys/kernel",
        "etc/passwd",
        "etc/shadow",
        "home",
        "root",
        "var/lib/dpkg",
    ] {
        assert!(
            !Path::new(&root).join(absent).exists(),
            "/{absent} is visible in the jail"
        );
    }
    let inside = |p: &Path| Path::new(&root).join(p.strip_prefix("/").unwrap());
    assert!(
        inside(&d.paths.run().join(&a)).exists(),
        "its own run directory"
    );
    assert!(
        !inside(&d.paths.run().join(&b)).exists(),
        "another sandbox's run directory"
    );
    assert!(
        !inside(&d.paths.disks().join(&b)).exists(),
        "another sandbox's disk"
    );
    assert!(
        !inside(&d.paths.home().join("state.db")).exists(),
        "the state database"
    );
}

/// Promise: the only writable mounts in its jail are its own run and disk directories (and,
/// for a restored copy, its RAM file's directory); the rest is read-only.
#[test]
fn a_qemu_can_write_only_its_own_directories() {
    let d = Daemon::start("escape-mounts");
    let id = d.create(&[]);
    let q = d.qemu_of(&id);
    let mounts = std::fs::read_to_string(format!("/proc/{q}/mountinfo")).unwrap();
    // Mount points in mountinfo are seen from the process's own root.
    let writable: Vec<String> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (point, opts) = (f.get(4)?, f.get(5)?);
            opts.split(',')
                .any(|o| o == "rw")
                .then(|| point.to_string())
        })
        .collect();
    assert!(!writable.is_empty(), "{mounts}");
    for w in &writable {
        let ok = w.starts_with(&d.paths.run().join(&id).display().to_string())
            || w.starts_with(&d.paths.disks().join(&id).display().to_string())
            || w.contains("/templates/")
            || w.contains("/snapshots/")
            || w == "/dev/null"
            || w == "/dev/urandom"
            || w == "/dev/kvm";
        assert!(ok, "{w} is writable in the jail");
    }
}
