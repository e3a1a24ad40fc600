//! Volumes through the daemon and the CLI: a volume written by one sandbox is read by the next;
//! one sandbox has it read-write or any number read-only, never both, and a second writer is
//! told who holds it; forks get a read-only volume, never a read-write one; a sleeping sandbox
//! keeps its volume; a full volume is the guest's ENOSPC and nothing else's; a daemon killed
//! with SIGKILL mid-write and then the VM itself lose nothing the guest had synced; of two
//! creates racing for one volume read-write, one wins and the other is told who. Each test
//! boots VMs (TCG: a few seconds each) in a home of its own with no volumes in it.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use forkbox_test_infra as infra;

mod common;
use common::{cli, ok, text, Daemon};

/// `forkbox ARGS` that must fail; its error, which must say each of `words`.
fn refused(d: &Daemon, args: &[&str], words: &[&str]) -> String {
    let out = cli(d, args);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "forkbox {args:?} was not refused");
    for w in words {
        assert!(
            err.contains(w),
            "forkbox {args:?}: {err:?} does not say {w:?}"
        );
    }
    err
}

fn sh(d: &Daemon, id: &str, script: &str) -> String {
    ok(d, &["sandbox", "exec", id, "--", "sh", "-c", script])
}

fn create(d: &Daemon, extra: &[&str]) -> String {
    let mut args = vec!["sandbox", "create", "--ttl", "1800"];
    args.extend(extra);
    ok(d, &args).trim().to_string()
}

/// The volume's holders, as `volume ls --json` gives them: (sandbox, read-only).
fn holders(d: &Daemon, name: &str) -> Vec<(String, bool)> {
    let all: serde_json::Value = serde_json::from_str(&ok(d, &["volume", "ls", "--json"])).unwrap();
    let v = all
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name} in {all}"));
    v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["sandbox"].as_str().unwrap().to_string(),
                h["read_only"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// A daemon of a home of its own with no volumes (an earlier run's are gone with it).
fn daemon(name: &str) -> Daemon {
    let paths = infra::isolated_home(name);
    common::stop_daemon_of(&paths);
    forkbox_engine::tree::remove_tree(&paths.volumes()).expect("remove an earlier run's volumes");

    Daemon::start_in(paths, &[])
}

#[test]
fn one_writer_or_many_readers_and_the_volume_outlives_them() {
    let d = daemon("volumes-share");
    let snapshots_before = ok(&d, &["snapshot", "ls", "--all", "-q"]);
    // A home that never had a volume: none listed, bad input refused in words.
    assert_eq!(ok(&d, &["volume", "ls"]).trim(), "no volumes");
    refused(&d, &["volume", "create", "Data!"], &["not a volume name"]);
    refused(
        &d,
        &["volume", "create", "data", "--size", "1m"],
        &["16 MiB"],
    );
    refused(
        &d,
        &["sandbox", "create", "--volume", "nope:/work"],
        &["no volume nope"],
    );
    refused(
        &d,
        &["sandbox", "create", "--volume", "data:/proc/x"],
        &["system's own"],
    );
    // One larger than the host's disk can give (with room left for sandboxes): refused before
    // anything is written, and nothing left behind.
    refused(
        &d,
        &["volume", "create", "huge", "--size", "16t"],
        &["no room for volume huge", "MiB free"],
    );
    assert_eq!(ok(&d, &["volume", "ls"]).trim(), "no volumes");
    let leftovers = std::fs::read_dir(d.paths.volumes()).map_or(0, |r| r.count());
    assert_eq!(leftovers, 0, "a refused volume left files");
    assert_eq!(
        ok(&d, &["volume", "create", "data", "--size", "64m"]).trim(),
        "data"
    );
    refused(&d, &["volume", "create", "data"], &["exists"]);

    // A writer; a second writer or a reader beside it is told who holds it.
    let a = create(&d, &["--volume", "data:/work"]);
    sh(&d, &a, "echo from-a > /work/note && sync");
    for v in ["data:/work", "data:/work:ro"] {
        refused(
            &d,
            &["sandbox", "create", "--volume", v],
            &["volume data is in use", &format!("{a} has it read-write")],
        );
    }
    refused(&d, &["volume", "rm", "data"], &["in use"]);
    assert_eq!(holders(&d, "data"), vec![(a.clone(), false)]);

    // A fork of the writer: the copy has no volume (said), the writer keeps it mounted.
    let out = cli(&d, &["sandbox", "fork", &a]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("volume data is not in the copies"),
        "{}",
        text(&out.stderr)
    );
    let copy = text(&out.stdout).trim().to_string();
    assert_eq!(
        sh(&d, &copy, "grep -c ' /work ' /proc/mounts || true").trim(),
        "0"
    );
    assert_eq!(sh(&d, &a, "cat /work/note").trim(), "from-a");
    sh(&d, &a, "echo again >> /work/note && sync");
    ok(&d, &["sandbox", "rm", &a, &copy]);
    assert!(holders(&d, "data").is_empty());

    // The next sandboxes read what the first wrote: any number read-only, none writes.
    let r1 = create(&d, &["--volume", "data:/work:ro"]);
    let r2 = create(&d, &["--volume", "data:/work:ro"]);
    for r in [&r1, &r2] {
        assert_eq!(sh(&d, r, "cat /work/note"), "from-a\nagain\n");
    }
    // `forkbox run` mounts it too, beside the readers.
    let out = ok(
        &d,
        &[
            "run",
            "-q",
            "--volume",
            "data:/work:ro",
            "--",
            "cat",
            "/work/note",
        ],
    );
    assert_eq!(out, "from-a\nagain\n");
    let w = sh(&d, &r1, "{ echo x > /work/other; } 2>&1 || true");
    assert!(w.contains("Read-only file system"), "{w}");
    refused(
        &d,
        &["sandbox", "create", "--volume", "data:/work"],
        &["read-only by"],
    );
    // Copies of a reader read it too.
    let copies = ok(&d, &["sandbox", "fork", &r1, "--count", "2"]);
    let copies: Vec<&str> = copies.split_whitespace().collect();
    assert_eq!(copies.len(), 2);
    for c in &copies {
        assert_eq!(sh(&d, c, "cat /work/note"), "from-a\nagain\n");
    }
    assert_eq!(holders(&d, "data").len(), 4);
    // A copy asleep keeps its read-only hold; deleted asleep, it gives it back.
    ok(&d, &["sandbox", "hibernate", copies[0]]);
    assert_eq!(holders(&d, "data").len(), 4);
    let mut all = vec![r1.as_str(), r2.as_str()];
    all.extend(&copies);
    let mut rm = vec!["sandbox", "rm"];
    rm.extend(all);
    ok(&d, &rm);

    // A sleeping writer keeps it: its guest has it mounted, and wakes with it.
    let s = create(&d, &["--volume", "data:/work"]);
    ok(&d, &["sandbox", "hibernate", &s]);
    refused(
        &d,
        &["sandbox", "create", "--volume", "data:/work:ro"],
        &[&format!("{s} has it read-write")],
    );
    ok(&d, &["sandbox", "resume", &s]);
    assert_eq!(
        sh(
            &d,
            &s,
            "echo slept >> /work/note && sync && tail -1 /work/note"
        )
        .trim(),
        "slept"
    );
    ok(&d, &["sandbox", "rm", &s]);
    ok(&d, &["volume", "rm", "data"]);
    assert_eq!(ok(&d, &["volume", "ls"]).trim(), "no volumes");
    d.assert_nothing_left();
    // The snapshots forkbox made for the forks and the sleeps went with the last sandbox that
    // needed them (one deleted while asleep included).
    assert_eq!(ok(&d, &["snapshot", "ls", "--all", "-q"]), snapshots_before);
}

/// The allocated bytes of a file on the host.
fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks() * 512
}

#[test]
fn a_full_volume_and_a_killed_daemon_lose_nothing_synced() {
    let d = daemon("volumes-bad-days");
    ok(&d, &["volume", "create", "v", "--size", "128m"]);
    let disk = d.paths.volumes().join("v/disk.ext4");
    let taken = |n: u64| (128 << 20..(128 << 20) + (1 << 20)).contains(&n);
    assert!(taken(allocated(&disk)), "its whole size is taken at once");
    // Two creates racing for it read-write: one wins, the other is told who holds it.
    let racers: Vec<_> = (0..2)
        .map(|_| {
            let mut c = d.client(Path::new(env!("CARGO_BIN_EXE_forkbox")));
            c.env("FORKBOX_HOME", d.paths.home())
                .args(["sandbox", "create", "--ttl", "1800", "--volume", "v:/work"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    let outs: Vec<Output> = racers
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let won: Vec<&Output> = outs.iter().filter(|o| o.status.success()).collect();
    assert_eq!(
        won.len(),
        1,
        "{:?}",
        outs.iter().map(|o| text(&o.stderr)).collect::<Vec<_>>()
    );
    let a = text(&won[0].stdout).trim().to_string();
    let lost = outs.iter().find(|o| !o.status.success()).unwrap();
    assert!(
        text(&lost.stderr).contains(&format!("sandbox {a} has it read-write")),
        "{}",
        text(&lost.stderr)
    );
    assert_eq!(holders(&d, "v"), vec![(a.clone(), false)]);

    // 2 GiB into 128 MiB: the guest's ENOSPC; the volume's file stays its size, and the
    // sandbox's own disk does not take the rest.
    let run_disk = |id: &str| -> u64 {
        let dir = d.paths.disks();
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(id))
            .flat_map(|e| std::fs::read_dir(e.path()).unwrap().flatten())
            .map(|e| allocated(&e.path()))
            .sum()
    };
    let before = run_disk(&a);
    let out = sh(
        &d,
        &a,
        "dd if=/dev/zero of=/work/big bs=1M count=2048 2>&1; echo rc=$?; df -m /work | tail -1",
    );
    assert!(
        out.contains("No space left on device") && !out.contains("rc=0"),
        "{out}"
    );
    assert!(taken(allocated(&disk)), "{} bytes", allocated(&disk));
    let grown = run_disk(&a).saturating_sub(before);
    assert!(
        grown < 32 << 20,
        "the sandbox's own disk grew by {grown} bytes"
    );
    sh(&d, &a, "rm /work/big && sync");

    // A writer that syncs each line and then notes it acknowledged.
    sh(&d, &a, "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i >> /work/log; sync /work/log; echo $i > /tmp/acked; done' >/dev/null 2>&1 </dev/null &");
    std::thread::sleep(Duration::from_secs(3));
    // The daemon killed mid-write: the VM runs on, and the next daemon takes it back.
    let pid = forkbox_server::running_pid(&d.paths).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    infra::wait_until(Duration::from_secs(30), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    let paths = d.paths.clone();
    std::mem::forget(d);
    let d = Daemon::start_in(paths, &[]);
    let acked: u64 = sh(&d, &a, "cat /tmp/acked").trim().parse().unwrap();
    assert!(acked > 0);
    assert_eq!(holders(&d, "v"), vec![(a.clone(), false)]);

    // Then the VM itself, as a power cut: what was acknowledged is on the volume after its
    // journal is replayed, every line in order.
    let views: serde_json::Value =
        serde_json::from_str(&ok(&d, &["sandbox", "ls", "--json"])).unwrap();
    let qemu = views
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == a)
        .unwrap()["qemu_pid"]
        .as_u64()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(qemu as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    ok(&d, &["sandbox", "rm", &a]);
    let b = create(&d, &["--volume", "v:/work"]);
    let log = sh(&d, &b, "cat /work/log");
    let lines: Vec<u64> = log.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert!(
        lines.len() as u64 >= acked,
        "{acked} lines acknowledged, {} on the volume",
        lines.len()
    );
    assert!(
        lines.iter().enumerate().all(|(i, n)| *n == i as u64 + 1),
        "the lines are not 1, 2, 3, …: {:?}",
        &lines[..lines.len().min(20)]
    );
    ok(&d, &["sandbox", "rm", &b]);
    ok(&d, &["volume", "rm", "v"]);
    d.assert_nothing_left();
}
