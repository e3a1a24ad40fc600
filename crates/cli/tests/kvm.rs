//! The KVM path, run for real. This machine's own `/dev/kvm` cannot run a standard guest, so
//! `scripts/kvm-host.sh` makes a KVM host one level down (a Debian guest under TCG with an AMD
//! CPU model, its kvm_amd on), and this test binary runs itself there: the `inside::` tests,
//! ignored here, are what run inside, as root on that host, with forkbox's daemon choosing the
//! accelerator on its own. They prove the KVM path correct; its speed there is not a KVM host's
//! (3-7x slower than TCG here) and its isolation is not tested.
//!
//! In the default run: the smoke (probe, template, snapshot of a running sandbox, fork x2 with
//! exactness, hibernate and resume, fork safety) in a bookworm host (~6 min). With
//! `FORKBOX_KVM_FULL=1`: the same in a trixie host too (Linux 6.12 with `PAGEMAP_SCAN`, QEMU 10).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::process::Command;
use std::time::Instant;

use forkbox_test_infra as infra;

mod common;

/// Runs `inside::NAME` of this binary in a KVM host of `flavour`; skips (saying why) only when
/// this machine cannot make one.
fn in_kvm_host(flavour: &str, name: &str) {
    let paths = infra::home();
    infra::image(&paths, "python-bookworm");
    let started = Instant::now();
    let status = Command::new(infra::repo_root().join("scripts/kvm-host.sh"))
        .args(["--flavour", flavour])
        .args(["--seed", "kernels", "--seed", "images/python-bookworm"])
        .arg("--")
        .args(["env", "FORKBOX_KVM_INSIDE=1", "RUST_BACKTRACE=1"])
        .arg(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "--nocapture", "--test-threads", "1"])
        .arg(format!("inside::{name}"))
        .env("FORKBOX_TEST_HOME", paths.home())
        .status()
        .unwrap();
    println!(
        "FIGURE kvm host ({flavour}) inside::{name}: {:.0} s from L0, boot and build included",
        started.elapsed().as_secs_f64()
    );
    if status.code() == Some(77) {
        eprintln!("kvm: skipped: this machine cannot run a KVM host (said above)");
        return;
    }
    assert!(
        status.success(),
        "inside::{name} in the {flavour} KVM host: {status}"
    );
}

#[test]
fn smoke_in_a_bookworm_kvm_host() {
    in_kvm_host("bookworm", "smoke");
}

#[test]
fn smoke_in_a_trixie_kvm_host() {
    if std::env::var("FORKBOX_KVM_FULL").as_deref() != Ok("1") {
        eprintln!("kvm: the trixie host runs with FORKBOX_KVM_FULL=1 (the bookworm one covers the same path)");
        return;
    }
    in_kvm_host("trixie", "smoke");
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
        let host_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        for c in &copies {
            assert_eq!(sh(&d, c, SUMS), sums, "{c}: the parent's file and memory");
            counts_on(&d, c, before);
            assert!(
                owns.insert(sh(&d, c, OWN)),
                "{c}: a boot id, random bytes or a name of another's"
            );
            let guest_now: f64 = sh(&d, c, "date +%s.%N").parse().unwrap();
            assert!(
                (guest_now - host_now).abs() < 30.0,
                "{c}: the guest's clock {guest_now} against the host's {host_now}"
            );
        }
        step("each copy: the parent's file and memory, its counter going on, its own boot id, randomness, name and the host's time", t);

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
}
