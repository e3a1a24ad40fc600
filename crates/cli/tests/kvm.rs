//! The KVM path, run for real. This machine's own `/dev/kvm` cannot run a standard guest, so
//! `scripts/kvm-host.sh` makes a KVM host one level down (a Debian guest under TCG with an AMD
//! CPU model, its kvm_amd on), and this test binary runs itself there: the `inside::` tests,
//! ignored here, are what run inside, as root on that host, with forkbox's daemon choosing the
//! accelerator on its own. They prove the KVM path correct; its speed there is not a KVM host's
//! (3-7x slower than TCG here) and its isolation is not tested.
//!
//! In the default run: the smoke (probe, template, snapshot of a running sandbox, fork x2 and a
//! fork of a fork with the parent's files and memory, fork safety, hibernate and resume, the
//! jail) in a bookworm host (~4 min). With `FORKBOX_KVM_FULL=1`: the whole KVM suite (the smoke,
//! files and TTL, the engine's page-exact fork tests), ~8 min.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use forkbox_test_infra as infra;

mod common;

/// Runs these tests of this binary, then those of `other` (a test binary and its tests), in a
/// KVM host of `flavour`, as root there with the KVM host's own test home; skips (saying why)
/// only when this machine cannot make such a host.
fn in_kvm_host(flavour: &str, ours: &[&str], other: Option<(&Path, &[&str])>) {
    let paths = infra::home();
    infra::image(&paths, "python-bookworm");
    let q = |s: &Path| format!("'{}'", s.to_string_lossy().replace('\'', "'\\''"));
    let mut script = format!(
        "export FORKBOX_KVM_INSIDE=1 RUST_BACKTRACE=1; {} --ignored --exact --nocapture --test-threads 1 {}",
        q(&std::env::current_exe().unwrap()),
        ours.join(" ")
    );
    if let Some((bin, tests)) = other {
        script += &format!(
            " && {} --exact --nocapture --test-threads 1 {}",
            q(bin),
            tests.join(" ")
        );
    }
    let started = Instant::now();
    let status = Command::new(infra::repo_root().join("scripts/kvm-host.sh"))
        .args(["--flavour", flavour])
        .args(["--seed", "kernels", "--seed", "images/python-bookworm"])
        .args(["--", "sh", "-c", &script])
        .env("FORKBOX_TEST_HOME", paths.home())
        .status()
        .unwrap();
    println!(
        "FIGURE kvm host ({flavour}) {ours:?}{}: {:.0} s from L0, its boot included",
        other
            .map(|(_, t)| format!(" and {t:?}"))
            .unwrap_or_default(),
        started.elapsed().as_secs_f64()
    );
    if status.code() == Some(77) {
        eprintln!("kvm: skipped: this machine cannot run a KVM host (said above)");
        return;
    }
    assert!(
        status.success(),
        "{ours:?} in the {flavour} KVM host: {status}"
    );
}

#[test]
fn smoke_in_a_bookworm_kvm_host() {
    in_kvm_host("bookworm", &["inside::smoke"], None);
}

/// The whole KVM suite (`FORKBOX_KVM_FULL=1`): the smoke, the rest of a sandbox's life (files,
/// TTL), and the engine's own fork tests (every page a busy parent wrote is in each copy and
/// nothing else changed; processes carried, copies diverge), in a bookworm host, or in the hosts
/// `FORKBOX_KVM_FLAVOURS` names (`bookworm,trixie`: a trixie host's KVM guest has not booted on
/// this machine's QEMU 7.2 yet; see COMPATIBILITY.md).
#[test]
fn full_suite_in_kvm_hosts() {
    if std::env::var("FORKBOX_KVM_FULL").as_deref() != Ok("1") {
        eprintln!(
            "kvm: the full KVM suite runs with FORKBOX_KVM_FULL=1 (the smoke covers the same path)"
        );
        return;
    }
    let fork_tests = forkbox_test_infra::test_binary("fork");
    let engine: &[&str] = &[
        "live_snapshot_of_a_busy_sandbox_is_exact",
        "forks_carry_processes_and_diverge",
    ];
    let flavours = std::env::var("FORKBOX_KVM_FLAVOURS").unwrap_or_else(|_| "bookworm".into());
    for flavour in flavours.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        in_kvm_host(
            flavour,
            &["inside::smoke", "inside::more"],
            Some((&fork_tests, engine)),
        );
    }
}

/// What runs in the KVM host.
mod inside {
    use std::collections::BTreeSet;
    use std::time::Instant;

    use super::common::{forkbox, Daemon};

    fn cli(d: &Daemon, args: &[&str]) -> String {
        let out = forkbox(&d.paths).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "forkbox {args:?}: {stderr}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn sh(d: &Daemon, id: &str, script: &str) -> String {
        cli(d, &["sandbox", "exec", id, "--", "sh", "-c", script])
            .trim()
            .to_string()
    }

    fn json(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    fn step(what: &str, since: Instant) {
        println!("ok: {what} ({:.1} s)", since.elapsed().as_secs_f64());
    }

    /// The value of the guest's counter, read until it has moved on from `past` (a running
    /// guest keeps counting; one not running never does).
    fn counts_on(d: &Daemon, id: &str, past: u64) -> u64 {
        for _ in 0..60 {
            let n: u64 = sh(d, id, "cat /root/count").parse().unwrap_or(0);
            if n > past {
                return n;
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        panic!("{id}: the counter stayed at {past}");
    }

    /// What a copy must share with its parent: the files and memory it wrote.
    const SUMS: &str = "sha256sum /root/data /dev/shm/blob | cut -c1-64 | tr '\\n' ' '";
    /// What must be a copy's own: its boot id, fresh random bytes, its name.
    const OWN: &str = "cat /proc/sys/kernel/random/boot_id; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; hostname";

    #[test]
    #[ignore = "runs in a KVM host (tests/kvm.rs runs it there)"]
    fn smoke() {
        assert_eq!(std::env::var("FORKBOX_KVM_INSIDE").as_deref(), Ok("1"));
        let t = Instant::now();
        let d = Daemon::start("kvm-smoke");
        let info = json(&cli(&d, &["info", "--json"]));
        assert_eq!(info["accel"]["accel"], "kvm", "{info}");
        let doctor = cli(&d, &["doctor"]);
        assert!(
            doctor.contains("KVM") && !doctor.contains("TCG, software emulation"),
            "{doctor}"
        );
        step(
            &format!(
                "the daemon chose KVM on its own ({})",
                info["accel"]["reason"]
            ),
            t,
        );

        let t = Instant::now();
        let id = cli(&d, &["sandbox", "create", "--memory", "512m"])
            .trim()
            .to_string();
        step(
            &format!("create {id} (the template made under KVM first)"),
            t,
        );
        // What differs between the accelerators, seen from the guest: KVM's clock, the host's
        // CPU model (TCG's is QEMU's own).
        assert_eq!(
            sh(
                &d,
                &id,
                "cat /sys/devices/system/clocksource/clocksource0/current_clocksource"
            ),
            "kvm-clock"
        );
        let host_cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let model = |text: &str| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .unwrap_or("")
                .to_string()
        };
        assert_eq!(model(&sh(&d, &id, "cat /proc/cpuinfo")), model(&host_cpu));
        assert_eq!(sh(&d, &id, "python3 -c 'print(6 * 7)'"), "42");

        // A running parent: a counter in the background, a file and 50 MB of memory written.
        let t = Instant::now();
        cli(&d, &["sandbox", "exec", &id, "--detach", "--", "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /root/count.tmp; mv /root/count.tmp /root/count; sleep 0.2; done"]);
        sh(&d, &id, "head -c 20000000 /dev/urandom > /root/data && head -c 50000000 /dev/urandom > /dev/shm/blob");
        let sums = sh(&d, &id, SUMS);
        let before = counts_on(&d, &id, 0);
        let snap = json(&cli(&d, &["sandbox", "snapshot", &id, "--json"]));
        step(
            &format!(
                "snapshot of a running sandbox (paused {} ms)",
                snap["pause_ms"]
            ),
            t,
        );
        // What a KVM snapshot records: its accelerator, no TCG RAM tail, the guest's CPU model
        // and the host CPU's features (what a restore elsewhere is checked against).
        assert_eq!(
            (
                &snap["accel"]["accel"],
                &snap["ram_tail_kib"],
                &snap["cpu"]["model"]
            ),
            (
                &serde_json::json!("kvm"),
                &serde_json::json!(0),
                &serde_json::json!("host")
            ),
            "{snap}"
        );
        assert!(
            snap["cpu"]["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f == "svm" || f == "lm")),
            "{snap}"
        );

        let t = Instant::now();
        let forks = json(&cli(
            &d,
            &["sandbox", "fork", &id, "--count", "2", "--json"],
        ));
        let copies: Vec<String> = forks["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(copies.len(), 2, "{forks}");
        step(
            &format!(
                "fork x2 of the running sandbox (paused {} ms)",
                forks["pause_ms"]
            ),
            t,
        );

        let t = Instant::now();
        let mut owns = BTreeSet::new();
        owns.insert(sh(&d, &id, OWN));
        let host_now = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64()
        };
        for c in &copies {
            assert_eq!(sh(&d, c, SUMS), sums, "{c}: the parent's file and memory");
            counts_on(&d, c, before);
            assert!(
                owns.insert(sh(&d, c, OWN)),
                "{c}: a boot id, random bytes or a name of another's"
            );
            // The host's time on either side of the guest's (each step here is slow).
            let (h0, guest_now, h1): (f64, f64, f64) = (
                host_now(),
                sh(&d, c, "date +%s.%N").parse().unwrap(),
                host_now(),
            );
            assert!(
                guest_now > h0 - 5.0 && guest_now < h1 + 5.0,
                "{c}: the guest's clock {guest_now} against the host's {h0}..{h1}"
            );
        }
        step("each copy: the parent's file and memory, its counter going on, its own boot id, randomness, name and the host's time", t);

        let t = Instant::now();
        let grand = json(&cli(&d, &["sandbox", "fork", &copies[0], "--json"]));
        let grand = grand["sandboxes"][0]["id"].as_str().unwrap().to_string();
        assert_eq!(sh(&d, &grand, SUMS), sums, "a fork of a fork");
        assert!(
            owns.insert(sh(&d, &grand, OWN)),
            "a fork of a fork has its own identity"
        );
        cli(&d, &["sandbox", "rm", &grand]);
        step(
            "a fork of a fork: the same file and memory, its own identity",
            t,
        );

        // The jail under KVM: /dev/kvm is the one device beyond null and urandom, reached by a
        // uid of its own (through the device's group), under seccomp.
        let t = Instant::now();
        let list = json(&cli(&d, &["sandbox", "ls", "--json"]));
        let pid = list
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["id"] == id.as_str())
            .unwrap()["qemu_pid"]
            .as_u64()
            .unwrap();
        let mut dev: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/root/dev"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        dev.sort();
        assert_eq!(dev, ["kvm", "null", "urandom"]);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |k: &str| {
            status
                .lines()
                .find(|l| l.starts_with(k))
                .unwrap()
                .split_whitespace()
                .nth(1)
                .unwrap()
                .to_string()
        };
        assert_ne!(field("Uid:"), "0", "{status}");
        assert_eq!(field("Seccomp:"), "2", "{status}");
        step(
            "the jail under KVM: /dev/kvm, null and urandom alone, its own uid, seccomp",
            t,
        );

        let t = Instant::now();
        let n = counts_on(&d, &id, before);
        cli(&d, &["sandbox", "hibernate", &id]);
        cli(&d, &["sandbox", "resume", &id]);
        counts_on(&d, &id, n);
        assert_eq!(sh(&d, &id, SUMS), sums);
        step(
            "hibernate and resume: the counter goes on, the memory is there",
            t,
        );

        let mut all = vec![id.as_str()];
        all.extend(copies.iter().map(String::as_str));
        cli(&d, &[&["sandbox", "rm"][..], &all].concat());
        d.assert_nothing_left();
        println!("kvm smoke passed");
    }
    /// The rest of a sandbox's life under KVM: files in and out, a TTL that ends it.
    #[test]
    #[ignore = "runs in a KVM host (tests/kvm.rs runs it there)"]
    fn more() {
        assert_eq!(std::env::var("FORKBOX_KVM_INSIDE").as_deref(), Ok("1"));
        let d = Daemon::start("kvm-more");
        let t = Instant::now();
        let id = cli(
            &d,
            &["sandbox", "create", "--memory", "512m", "--ttl", "40"],
        )
        .trim()
        .to_string();
        let work = tempfile::tempdir().unwrap();
        let src = work.path().join("src");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::write(src.join("sub/a.txt"), "forkbox under kvm\n").unwrap();
        std::os::unix::fs::symlink("sub/a.txt", src.join("link")).unwrap();
        cli(
            &d,
            &["sandbox", "upload", &id, &src.to_string_lossy(), "/root/in"],
        );
        assert_eq!(sh(&d, &id, "cat /root/in/link"), "forkbox under kvm");
        let back = work.path().join("back");
        cli(
            &d,
            &[
                "sandbox",
                "download",
                &id,
                "/root/in",
                &back.to_string_lossy(),
            ],
        );
        assert_eq!(
            std::fs::read_to_string(back.join("sub/a.txt")).unwrap(),
            "forkbox under kvm\n"
        );
        assert!(back
            .join("link")
            .symlink_metadata()
            .unwrap()
            .file_type()
            .is_symlink());
        step("a directory up and back, its link a link", t);
        let t = Instant::now();
        let gone = (0..120).any(|_| {
            std::thread::sleep(std::time::Duration::from_secs(1));
            !cli(&d, &["sandbox", "ls"]).contains(&id)
        });
        assert!(gone, "{id} outlived its TTL");
        d.assert_nothing_left();
        step("its TTL ended it, VM and files", t);
    }
}
