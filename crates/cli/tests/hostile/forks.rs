//! Fork integrity: copies of one snapshot must not share secrets, identity, time or memory.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::{text, Daemon};

fn fork(d: &Daemon, source: &str, n: u32) -> Vec<String> {
    let out = d.cli(&["sandbox", "fork", source, "--count", &n.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ids: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("sb-"))
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), n as usize, "{}", text(&out.stdout));
    ids
}

/// Promise: every copy and the parent draw different random bytes and report different boot
/// ids, machine ids and host names.
#[test]
fn copies_share_no_randomness_or_identity() {
    let d = Daemon::start("fork-identity");
    let parent = d.create(&[]);
    let mut all = fork(&d, &parent, 3);
    all.push(parent);
    let probe = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; cat /proc/sys/kernel/random/boot_id /etc/machine-id; hostname";
    let seen: Vec<Vec<String>> = all
        .iter()
        .map(|id| d.ok(id, probe).lines().map(str::to_string).collect())
        .collect();
    for (i, what) in ["urandom", "boot id", "machine id", "hostname"]
        .iter()
        .enumerate()
    {
        let mut values: Vec<&String> = seen.iter().map(|s| &s[i]).collect();
        values.sort();
        values.dedup();
        assert_eq!(
            values.len(),
            all.len(),
            "{what} repeats across copies: {seen:?}"
        );
    }
}

/// A copy made from a snapshot saved a while ago. Promise: its clock is the host's at the
/// fork, not the snapshot's.
#[test]
fn a_copy_tells_the_hosts_time_not_its_snapshots() {
    let d = Daemon::start("fork-clock");
    let parent = d.create(&[]);
    let out = d.cli(&["sandbox", "snapshot", &parent, "--name", "old-clock"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::thread::sleep(std::time::Duration::from_secs(8));
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let copy = fork(&d, "old-clock", 1).remove(0);
    let guest: u64 = d.ok(&copy, "date +%s").trim().parse().unwrap();
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        guest + 2 >= before && guest <= after + 2,
        "guest {guest}, host {before}..{after}"
    );
    let _ = d.cli(&["sandbox", "rm", &copy]);
    let _ = d.cli(&["snapshot", "rm", "old-clock"]);
}

/// 32 MB of a pattern in guest RAM (tmpfs), then forks; one copy overwrites it. Promise: the
/// parent and the other copy still hold theirs, page for page.
#[test]
fn a_copys_memory_writes_reach_no_other_copy() {
    let d = Daemon::start("fork-memory");
    let parent = d.create(&[]);
    let sum = "sha256sum /dev/shm/blob | cut -d' ' -f1";
    d.ok(&parent, "head -c 33554432 /dev/urandom > /dev/shm/blob");
    let original = d.ok(&parent, sum);
    let copies = fork(&d, &parent, 2);
    d.ok(&copies[0], "head -c 33554432 /dev/zero > /dev/shm/blob");
    assert_ne!(d.ok(&copies[0], sum), original);
    assert_eq!(d.ok(&copies[1], sum), original);
    assert_eq!(d.ok(&parent, sum), original);
}

/// A copy that writes all it can to its disk and memory. Promise: the snapshot it came from
/// is unchanged (its RAM file and disk hash the same), so later copies start clean.
#[test]
fn a_copy_cannot_change_its_snapshot() {
    use sha2::{Digest, Sha256};
    let d = Daemon::start("fork-snapshot");
    let parent = d.create(&[]);
    let out = d.cli(&["sandbox", "snapshot", &parent, "--name", "pristine"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dir = d.paths.snapshots().join("pristine");
    let digest = |p: &std::path::Path| {
        let mut f = std::fs::File::open(p).unwrap();
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).unwrap();
        h.finalize()
    };
    let mem = digest(&dir.join("mem"));
    let copy = fork(&d, "pristine", 1).remove(0);
    d.ok(
        &copy,
        "head -c 50000000 /dev/urandom > /dev/shm/x; head -c 50000000 /dev/urandom > /root/x; sync",
    );
    assert_eq!(
        digest(&dir.join("mem")),
        mem,
        "a copy changed its snapshot's RAM file"
    );
    let later = fork(&d, "pristine", 1).remove(0);
    assert_eq!(
        d.ok(&later, "ls /root/x /dev/shm/x 2>/dev/null | wc -l")
            .trim(),
        "0"
    );
    for id in [copy, later] {
        let _ = d.cli(&["sandbox", "rm", &id]);
    }
    let _ = d.cli(&["snapshot", "rm", "pristine"]);
}

/// A copy's QEMU taken over from inside its guest: the test acts as it (its mount namespace,
/// its root, its uid and group, through `nsenter`). Promise, with QEMU 8.2 or later: it cannot
/// open the RAM file its sibling copies map for writing, and a sibling's memory stays the
/// snapshot's. Skipped, saying why, on an older QEMU (which opens that file read-write;
/// `forkbox doctor` warns of it).
#[test]
fn an_escaped_qemu_cannot_write_its_siblings_memory() {
    use forkbox_engine::vm::program;
    if !program::readonly_private_ram() {
        eprintln!(
            "skipped: {} opens a RAM file it maps private read-write (read-only from 8.2)",
            program::banner()
        );
        return;
    }
    let d = Daemon::start("fork-ram-readonly");
    let parent = d.create(&[]);
    let sum = "sha256sum /dev/shm/blob | cut -d' ' -f1";
    d.ok(&parent, "head -c 33554432 /dev/urandom > /dev/shm/blob");
    let original = d.ok(&parent, sum);
    let out = d.cli(&["sandbox", "snapshot", &parent, "--name", "shared-ram"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let copies = fork(&d, "shared-ram", 2);

    let q = d.qemu_of(&copies[0]);
    let status = std::fs::read_to_string(format!("/proc/{q}/status")).unwrap();
    let id = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .unwrap()
            .to_string()
    };
    let (uid, gid) = (id("Uid:"), id("Gid:"));
    let cmdline = std::fs::read(format!("/proc/{q}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline);
    let mem = cmdline
        .split(['\0', ','])
        .find_map(|a| a.strip_prefix("mem-path="))
        .expect("the copy's RAM file")
        .to_string();
    assert!(
        !mem.contains(&copies[0]),
        "{mem}: the copy's own, not the snapshot's"
    );
    let as_qemu = |script: &str| {
        std::process::Command::new("nsenter")
            .args(["-t", &q.to_string(), "-m", "-r", "-S", &uid, "-G", &gid])
            .args(["--", "/bin/sh", "-c", script])
            .output()
            .unwrap()
    };
    // The method can write where the QEMU may: its own run directory.
    let run = d.paths.run().join(&copies[0]);
    let own = as_qemu(&format!(": > '{}/escaped'", run.display()));
    assert!(
        own.status.success(),
        "acting as the QEMU failed where it may write: {}",
        text(&own.stderr)
    );
    // The RAM file its siblings map: neither opened for writing nor for reading and writing.
    for open in [
        format!("exec 3>>'{mem}'"),
        format!("exec 3<>'{mem}'"),
        format!("head -c 4096 /dev/zero | dd of='{mem}' conv=notrunc status=none"),
    ] {
        let out = as_qemu(&open);
        assert!(
            !out.status.success(),
            "`{open}` succeeded inside the copy's jail"
        );
        let why = text(&out.stderr);
        assert!(
            why.contains("Read-only file system") || why.contains("Permission denied"),
            "{open}: {why}"
        );
    }
    assert_eq!(d.ok(&copies[1], sum), original);
    for c in &copies {
        let _ = d.cli(&["sandbox", "rm", c]);
    }
    let _ = d.cli(&["snapshot", "rm", "shared-ram"]);
}
