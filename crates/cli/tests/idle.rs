//! Sandboxes that sleep when idle and wake when used, through the daemon: a sandbox made with
//! `--idle 5s` is hibernated after five seconds of nothing, and an exec, a file download, a
//! connection to a forwarded port and a preview request each wake it with its state intact (a
//! counter process that carried on, its files, its environment); a detached command keeps it
//! awake; many sleeping sandboxes woken at once all answer. Each test boots VMs (TCG: a few
//! seconds each) and waits out idle times.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::{Duration, Instant};

use forkbox_test_infra as infra;

mod common;
use common::{cli, http, ok, text, Daemon};

/// Sandbox `id`'s view.
fn view(d: &Daemon, id: &str) -> serde_json::Value {
    let all: serde_json::Value =
        serde_json::from_str(&ok(d, &["sandbox", "ls", "--json"])).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no {id} in {all}"))
}

/// Waits until sandbox `id` is in `state` (at most `limit`); how long that took.
fn until_state(d: &Daemon, id: &str, state: &str, limit: Duration) -> Duration {
    let t = Instant::now();
    assert!(
        infra::wait_until(limit, || view(d, id)["state"] == state),
        "{id} never became {state}: {}",
        view(d, id)
    );
    t.elapsed()
}

/// No QEMU of sandbox `id` runs.
fn no_vm(d: &Daemon, id: &str) -> bool {
    infra::processes_mentioning(&d.paths.run().join(id).display().to_string()).is_empty()
}

/// The counter's value and whether it still counts, its environment variable, and a file.
const STATE: &str = "a=$(cat /tmp/n); for i in $(seq 100); do sleep 0.1; b=$(cat /tmp/n); [ \"$b\" != \"$a\" ] && break; done; echo \"$a $b\"; tr '\\0' '\\n' < /proc/$(cat /tmp/pid)/environ | grep '^MARK='; cat /root/f";

/// The counter's last value, checked to go on from `before`, with the environment and the
/// file intact; the value.
fn intact(out: &str, before: u64) -> u64 {
    let mut lines = out.lines();
    let counts: Vec<u64> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 2, "{out}");
    assert!(counts[0] >= before, "the counter went back: {out}");
    assert!(counts[1] > counts[0], "the counter stopped: {out}");
    assert_eq!(lines.next(), Some("MARK=kept-through-sleep"), "{out}");
    assert_eq!(lines.next(), Some("on-disk"), "{out}");
    counts[1]
}

/// One sandbox: sleeps after 5 s of nothing, and each kind of use wakes it with its state.
#[test]
fn an_idle_sandbox_sleeps_and_each_use_wakes_it_intact() {
    let d = Daemon::start("idle-wake");
    let created: serde_json::Value = serde_json::from_str(&ok(
        &d,
        &[
            "sandbox", "create", "--idle", "5s", "--ttl", "1800", "--json",
        ],
    ))
    .unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["idle"]["after_secs"], 5, "{created}");
    assert_eq!(created["wake_on_use"], true, "{created}");
    // A counter outside any command (it holds nothing open), a file, a web server likewise.
    ok(&d, &["sandbox", "exec", &id, "--", "sh", "-c",
        "echo on-disk > /root/f; mkdir -p /tmp/w && echo served-by-the-guest > /tmp/w/i.txt; \
         MARK=kept-through-sleep setsid sh -c 'echo $$ > /tmp/pid; i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.2; done' >/dev/null 2>&1 < /dev/null & \
         setsid python3 -m http.server 3000 --bind 127.0.0.1 --directory /tmp/w >/dev/null 2>&1 < /dev/null &"]);
    let pf: serde_json::Value =
        serde_json::from_str(&ok(&d, &["sandbox", "port-forward", &id, "3000", "--json"])).unwrap();
    let direct = pf["url"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let preview = pf["preview_url"].as_str().unwrap().to_string();
    assert!(
        infra::wait_until(Duration::from_secs(120), || {
            http(&direct, "x", "/i.txt", "").contains("served-by-the-guest")
        }),
        "the guest's server never answered"
    );
    let mut count = intact(
        &ok(&d, &["sandbox", "exec", &id, "--", "sh", "-c", STATE]),
        0,
    );

    // Asleep after its idle time: no VM, said by `ls` and the view.
    let took = until_state(&d, &id, "sleeping", Duration::from_secs(90));
    assert!(
        infra::wait_until(Duration::from_secs(30), || no_vm(&d, &id)),
        "a sleeping sandbox has no VM"
    );
    let out = ok(&d, &["sandbox", "ls"]);
    assert!(
        out.lines()
            .any(|l| l.contains(&id) && l.contains("sleeping")),
        "{out}"
    );
    eprintln!("asleep {} ms after its last use", took.as_millis());

    // An exec wakes it.
    count = intact(
        &ok(&d, &["sandbox", "exec", &id, "--", "sh", "-c", STATE]),
        count,
    );
    assert_eq!(view(&d, &id)["state"], "running");

    // A file download wakes it.
    until_state(&d, &id, "sleeping", Duration::from_secs(90));
    let into = tempfile::tempdir().unwrap();
    let got = into.path().join("f");
    ok(
        &d,
        &["sandbox", "download", &id, "/root/f", got.to_str().unwrap()],
    );
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "on-disk\n");

    // A connection to the forwarded port wakes it (the forward kept listening).
    until_state(&d, &id, "sleeping", Duration::from_secs(90));
    let page = http(&direct, "x", "/i.txt", "");
    assert!(page.contains("served-by-the-guest"), "{page}");

    // A preview request wakes it.
    until_state(&d, &id, "sleeping", Duration::from_secs(90));
    let tcp = d.tcp.trim_start_matches("http://").to_string();
    let (host, query) = preview
        .trim_start_matches("http://")
        .split_once("/?")
        .unwrap();
    let page = http(&tcp, host, &format!("/i.txt?{query}"), "");
    assert!(page.contains("served-by-the-guest"), "{page}");
    count = intact(
        &ok(&d, &["sandbox", "exec", &id, "--", "sh", "-c", STATE]),
        count,
    );

    // A detached command keeps it awake while it runs (three idle times), then it sleeps.
    ok(
        &d,
        &["sandbox", "exec", &id, "--detach", "--", "sleep", "15"],
    );
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(12) {
        assert_eq!(
            view(&d, &id)["state"],
            "running",
            "slept under a running command"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    until_state(&d, &id, "sleeping", Duration::from_secs(90));

    // `idle off`: woken by the call, and stays awake.
    let out = ok(&d, &["sandbox", "idle", &id, "off", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["idle"].is_null(), "{v}");
    intact(
        &ok(&d, &["sandbox", "exec", &id, "--", "sh", "-c", STATE]),
        count,
    );
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(view(&d, &id)["state"], "running");

    // Sleeps and wakes are counted with their times.
    let metrics = http(
        &tcp,
        "localhost",
        "/metrics",
        &format!("Authorization: Bearer {}\r\n", d.token),
    );
    let count_of = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert!(count_of("forkbox_sleep_seconds_count") >= 5, "{metrics}");
    assert!(count_of("forkbox_wake_seconds_count") >= 5, "{metrics}");

    // Bad input: an idle time out of range, a word that is not one.
    let out = cli(&d, &["sandbox", "idle", &id, "8d"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("7 days"),
        "{}",
        text(&out.stderr)
    );
    let out = cli(&d, &["sandbox", "create", "--no-wake"]);
    assert!(!out.status.success(), "--no-wake without --idle");
    ok(&d, &["sandbox", "rm", &id]);
}

/// Twenty sandboxes asleep, woken by twenty execs at once: every one answers with its state.
#[test]
fn twenty_sleeping_sandboxes_woken_at_once_all_answer() {
    let d = Daemon::start("idle-twenty");
    let base = ok(
        &d,
        &["sandbox", "create", "--memory", "256m", "--ttl", "1800"],
    )
    .trim()
    .to_string();
    ok(
        &d,
        &[
            "sandbox",
            "exec",
            &base,
            "--",
            "sh",
            "-c",
            "echo on-disk > /root/f",
        ],
    );
    // Copies of one sandbox, each told to sleep after 3 s.
    let forked: serde_json::Value = serde_json::from_str(&ok(
        &d,
        &[
            "sandbox", "fork", &base, "--count", "20", "--idle", "3s", "--json",
        ],
    ))
    .unwrap();
    ok(&d, &["sandbox", "rm", &base]);
    let ids: Vec<String> = forked["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 20, "{forked}");
    for id in &ids {
        until_state(&d, id, "sleeping", Duration::from_secs(300));
    }
    let t = Instant::now();
    std::thread::scope(|s| {
        for id in &ids {
            let d = &d;
            s.spawn(move || {
                let out = ok(
                    d,
                    &[
                        "sandbox",
                        "exec",
                        id,
                        "--",
                        "sh",
                        "-c",
                        "cat /root/f; hostname",
                    ],
                );
                assert_eq!(out.lines().next(), Some("on-disk"), "{id}: {out}");
            });
        }
    });
    eprintln!(
        "FIGURE idle: 20 sleeping sandboxes woken by 20 execs at once: all answered in {} ms",
        t.elapsed().as_millis()
    );
    for id in &ids {
        ok(&d, &["sandbox", "rm", id]);
    }
}

/// A TTL goes on while its sandbox sleeps: one that deletes deletes the sleeping sandbox (and
/// the snapshot it sleeps in); one that hibernates is spent, and a wake does not undo it.
#[test]
fn a_ttl_that_passes_while_asleep_applies() {
    let d = Daemon::start("idle-ttl");
    let gone = ok(&d, &["sandbox", "create", "--idle", "2s", "--ttl", "25"])
        .trim()
        .to_string();
    let kept = ok(
        &d,
        &[
            "sandbox",
            "create",
            "--idle",
            "2s",
            "--ttl",
            "25",
            "--ttl-action",
            "hibernate",
        ],
    )
    .trim()
    .to_string();
    until_state(&d, &gone, "sleeping", Duration::from_secs(90));
    until_state(&d, &kept, "sleeping", Duration::from_secs(90));
    let listed = |id: &str| -> bool {
        let all: serde_json::Value =
            serde_json::from_str(&ok(&d, &["sandbox", "ls", "--json"])).unwrap();
        all.as_array().unwrap().iter().any(|v| v["id"] == id)
    };
    assert!(
        infra::wait_until(Duration::from_secs(90), || !listed(&gone)),
        "a sleeping sandbox outlived its TTL"
    );
    let snapshots = ok(&d, &["snapshot", "ls", "--all"]);
    assert!(!snapshots.contains(&gone), "{snapshots}");
    assert!(listed(&kept));
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        view(&d, &kept)["expires_unix"].is_null(),
        "{}",
        view(&d, &kept)
    );
    let out = ok(&d, &["sandbox", "exec", &kept, "--", "echo", "awake"]);
    assert_eq!(out, "awake\n");
    ok(&d, &["sandbox", "rm", &kept]);
}
