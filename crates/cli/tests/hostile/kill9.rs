//! `kill -9` of the daemon in the middle of each lifecycle step. Promise: after a restart,
//! every sandbox it reported made is there and answers, and nothing is left half-made: no
//! QEMU, run directory, temporary snapshot or cgroup without a sandbox.

use std::process::Stdio;
use std::time::Duration;

use forkbox_test_infra as infra;

use crate::{text, Daemon};

/// Starts the daemon again on the same home (no clean-up).
fn restart(paths: &forkbox_engine::paths::Paths) -> Daemon {
    let mut c = Daemon::cmd(paths);
    c.arg("serve").stdout(Stdio::null()).stderr(Stdio::null());
    Daemon::spawn(paths.clone(), c)
}

fn listed(d: &Daemon) -> Vec<serde_json::Value> {
    let out = d.cli(&["sandbox", "ls", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The invariants after a restart.
fn check_nothing_lost_or_leaked(d: &Daemon, reported: &[String]) {
    let all = listed(d);
    let ids: Vec<String> = all
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_string())
        .collect();
    for r in reported {
        assert!(
            ids.contains(r),
            "{r} was reported made but is gone: {ids:?}"
        );
    }
    for v in &all {
        let id = v["id"].as_str().unwrap();
        // A sandbox whose making the kill cut short may be adopted without answering (known:
        // see the threat model); it must still go cleanly with `rm` (below, and in Drop).
        if !reported.iter().any(|r| r == id) {
            continue;
        }
        match v["state"].as_str().unwrap() {
            "running" => {
                // Bounded: a sandbox that never answers fails the test instead of hanging it.
                // 60 s, not less: with other tests' VMs on the two cores a TCG guest can be
                // starved for tens of seconds (seen once at 20 s while the MCP tests ran).
                let out = d.cli(&["sandbox", "exec", id, "--timeout", "60", "--", "echo", "ok"]);
                let console = || {
                    forkbox_engine::vm::console_tail(
                        &d.paths.run().join(id).join("console.log"),
                        40,
                    )
                };
                assert_eq!(
                    text(&out.stdout),
                    "ok\n",
                    "{id} does not answer: {}\n{v}\ndaemon log:\n{}\nits console's last lines:\n{}",
                    text(&out.stderr),
                    d.log_text(),
                    console()
                );
            }
            "hibernated" => {}
            other => panic!("{id} is {other}"),
        }
    }
    let running: Vec<&str> = all
        .iter()
        .filter(|v| v["state"] == "running")
        .map(|v| v["id"].as_str().unwrap())
        .collect();
    // A QEMU per running sandbox, none more.
    assert_eq!(
        infra::qemus_of(&d.paths).len(),
        running.len(),
        "QEMUs without a sandbox (or sandboxes without one)"
    );
    let mut runs = infra::run_entries(&d.paths);
    runs.retain(|r| !r.starts_with('.'));
    runs.sort();
    let mut want: Vec<String> = running.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(runs, want, "run directories");
    for root in [d.paths.snapshots(), d.paths.templates()] {
        let tmp: Vec<String> = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp-"))
            .collect();
        assert!(tmp.is_empty(), "left in {}: {tmp:?}", root.display());
    }
    // Cgroups of sandboxes of this home that are not running.
    for ctrl in ["memory", "pids", "cpu", ""] {
        let base = std::path::Path::new("/sys/fs/cgroup")
            .join(ctrl)
            .join("forkbox");
        for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let ours = d.paths.run().join(&n).exists() || n.starts_with("sb-");
            if ours && reported.iter().any(|r| n.contains(r.as_str())) {
                assert!(
                    running.contains(&n.as_str()),
                    "cgroup {n} outlived its sandbox"
                );
            }
        }
    }
    // What the kill interrupted goes cleanly: its QEMU with it.
    let kept = running
        .iter()
        .filter(|r| reported.iter().any(|x| x == *r))
        .count();
    for id in ids.iter().filter(|id| !reported.contains(id)) {
        let out = d.cli(&["sandbox", "rm", id]);
        assert!(out.status.success(), "rm {id}: {}", text(&out.stderr));
    }
    assert!(
        infra::wait_until(Duration::from_secs(10), || {
            infra::qemus_of(&d.paths).len() == kept
        }),
        "QEMUs left after removing what the kill interrupted"
    );
}

/// Runs `args` against the daemon, kills the daemon `after` into it, restarts it; returns the
/// restarted daemon and whether the command reported success.
fn kill_during(mut d: Daemon, args: &[&str], after: Duration) -> (Daemon, bool, String) {
    let mut c = Daemon::cmd(&d.paths);
    // This very daemon: a command that finds it gone fails instead of starting another.
    let socket = forkbox_server::socket_path(&d.paths);
    c.env("FORKBOX_API", format!("unix:{}", socket.display()));
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    std::thread::sleep(after);
    d.kill9();
    let out = child.wait_with_output().unwrap();
    let paths = d.paths.clone();
    drop(d);
    let d = restart(&paths);
    (d, out.status.success(), text(&out.stdout))
}

fn first_id(s: &str) -> Vec<String> {
    s.lines()
        .map(str::trim)
        .filter(|l| l.starts_with("sb-"))
        .map(str::to_string)
        .collect()
}

/// Killed while a sandbox is being created.
#[test]
fn kill9_during_create() {
    let d = Daemon::start("kill9-create");
    let keep = d.create(&[]);
    let (d, ok, out) = kill_during(d, &["sandbox", "create"], Duration::from_millis(300));
    let mut reported = vec![keep];
    if ok {
        reported.extend(first_id(&out));
    }
    check_nothing_lost_or_leaked(&d, &reported);
}

/// Killed while a running sandbox is being saved.
#[test]
fn kill9_during_snapshot() {
    let d = Daemon::start("kill9-snapshot");
    let id = d.create(&[]);
    let (d, _, _) = kill_during(
        d,
        &["sandbox", "snapshot", &id, "--name", "half"],
        Duration::from_millis(1200),
    );
    check_nothing_lost_or_leaked(&d, &[id]);
}

/// Killed while a running sandbox is being forked into three.
#[test]
fn kill9_during_fork() {
    let d = Daemon::start("kill9-fork");
    let id = d.create(&[]);
    let (d, ok, out) = kill_during(
        d,
        &["sandbox", "fork", &id, "--count", "3"],
        Duration::from_millis(1500),
    );
    let mut reported = vec![id];
    if ok {
        reported.extend(first_id(&out));
    }
    check_nothing_lost_or_leaked(&d, &reported);
}

/// Killed while a sandbox is being hibernated.
#[test]
fn kill9_during_hibernate() {
    let d = Daemon::start("kill9-hibernate");
    let id = d.create(&[]);
    d.ok(&id, "echo kept > /root/kept");
    let (d, _, _) = kill_during(
        d,
        &["sandbox", "hibernate", &id],
        Duration::from_millis(1000),
    );
    check_nothing_lost_or_leaked(&d, std::slice::from_ref(&id));
    let v = d.view(&id);
    if v["state"] == "hibernated" {
        let out = d.cli(&["sandbox", "resume", &id]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    assert_eq!(d.ok(&id, "cat /root/kept"), "kept\n");
}

/// Killed while a hibernated sandbox is being resumed.
#[test]
fn kill9_during_resume() {
    let d = Daemon::start("kill9-resume");
    let id = d.create(&[]);
    d.ok(&id, "echo kept > /root/kept");
    let out = d.cli(&["sandbox", "hibernate", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (d, _, _) = kill_during(d, &["sandbox", "resume", &id], Duration::from_millis(300));
    check_nothing_lost_or_leaked(&d, std::slice::from_ref(&id));
    if d.view(&id)["state"] == "hibernated" {
        let out = d.cli(&["sandbox", "resume", &id]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    assert_eq!(d.ok(&id, "cat /root/kept"), "kept\n");
}

/// Killed while sandboxes are being deleted.
#[test]
fn kill9_during_rm() {
    let d = Daemon::start("kill9-rm");
    let keep = d.create(&[]);
    let gone = d.create(&[]);
    let (d, ok, _) = kill_during(d, &["sandbox", "rm", &gone], Duration::from_millis(20));
    let all: Vec<String> = listed(&d)
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_string())
        .collect();
    if ok {
        assert!(
            !all.contains(&gone),
            "{gone} was reported deleted but is back"
        );
    }
    check_nothing_lost_or_leaked(&d, &[keep]);
}
