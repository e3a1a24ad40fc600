//! The hostile suite: attacks on forkbox written as an attacker would make them, each naming the
//! attack and the promise it checks (`docs/threat-model.md` lists them by class). Guests attack
//! from inside real VMs — as root, writing protocol frames into the agent's own port, and as an
//! unprivileged user — and local clients attack the daemon's sockets. Every test runs its own
//! daemon in a home of its own (sharing the test home's kernel, images and templates), so a
//! test that breaks a daemon breaks only its own.
//!
//! Costs (TCG, 2 cores): a daemon start and a sandbox restore are ~1 s; the guest programs are
//! Python under TCG, 1-10 s each. Figures the closing note quotes are printed with `FIGURE`.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod attacks;
mod builds;
mod contexts;
mod egress;
mod escape;
mod exhaustion;
mod files;
mod forks;
mod front;
mod kill9;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use forkbox_engine::paths::Paths;
use forkbox_test_infra as infra;

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A daemon of the test's own, in `homes/hostile-NAME` of the test home.
pub struct Daemon {
    pub paths: Paths,
    pub child: Option<Child>,
}

fn stop_stale(paths: &Paths) {
    // Only a PID file a live daemon holds: a stale one (a daemon this suite killed on an
    // earlier run) names a number that may be any process's now, the test runner's too.
    if let Some(pid) = forkbox_server::running_pid(paths) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        infra::wait_until(Duration::from_secs(10), || {
            !Path::new(&format!("/proc/{pid}")).exists()
        });
    }
}

impl Daemon {
    pub fn home(name: &str) -> Paths {
        let paths = infra::isolated_home(&format!("hostile-{name}"));
        stop_stale(&paths);
        // What an earlier run of this test left: sandboxes' and snapshots' files.
        for sub in [
            "run",
            "disks",
            "snapshots",
            "state.db",
            "state.db-wal",
            "state.db-shm",
        ] {
            let p = paths.home().join(sub);
            forkbox_engine::tree::remove_tree(&p).expect("remove what an earlier run left");
            let _ = std::fs::remove_file(&p);
        }
        for f in ["daemon.log", "daemon.log.1", "daemon.out", "daemon.pid"] {
            let _ = std::fs::remove_file(paths.home().join(f));
        }
        paths
    }

    /// `forkbox` with this daemon's home.
    pub fn cmd(paths: &Paths) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_forkbox"));
        c.env("FORKBOX_HOME", paths.home())
            .env_remove("FORKBOX_ACCEL")
            .env_remove("FORKBOX_IMAGE")
            .env_remove("FORKBOX_API")
            .env("FORKBOX_POOL_SIZE", "0")
            .stdin(Stdio::null());
        c
    }

    pub fn start(name: &str) -> Daemon {
        let paths = Daemon::home(name);
        let mut c = Daemon::cmd(&paths);
        c.arg("serve").stdout(Stdio::null()).stderr(Stdio::null());
        Daemon::spawn(paths, c)
    }

    /// Starts the daemon with `c` (which must end in running `forkbox serve` for `paths`).
    pub fn spawn(paths: Paths, mut c: Command) -> Daemon {
        let child = c.spawn().expect("start forkbox serve");
        let socket = forkbox_server::socket_path(&paths);
        // Up when it answers and holds a PID file naming it (the file is written after the
        // bind: reading it earlier could name a daemon of an earlier run).
        let me = child.id();
        assert!(
            infra::wait_until(Duration::from_secs(60), || {
                std::os::unix::net::UnixStream::connect(&socket).is_ok()
                    && forkbox_server::running_pid(&paths) == Some(me)
            }),
            "the daemon did not come up; see {}",
            paths.home().join("daemon.log").display()
        );
        Daemon {
            paths,
            child: Some(child),
        }
    }

    pub fn pid(&self) -> u32 {
        forkbox_server::running_pid(&self.paths).expect("the daemon runs")
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        Daemon::cmd(&self.paths)
            .args(args)
            .output()
            .expect("run forkbox")
    }

    /// Creates a sandbox (`extra`: more `sandbox create` flags); its id.
    pub fn create(&self, extra: &[&str]) -> String {
        let mut args = vec!["sandbox", "create"];
        args.extend_from_slice(extra);
        let out = self.cli(&args);
        assert!(out.status.success(), "create: {}", text(&out.stderr));
        let id = text(&out.stdout).trim().to_string();
        assert!(id.starts_with("sb-"), "{id}");
        id
    }

    /// `sh -c script` in sandbox `id`.
    pub fn sh(&self, id: &str, script: &str) -> Output {
        self.cli(&["sandbox", "exec", id, "--", "sh", "-c", script])
    }

    /// `sh -c script` that must succeed; its stdout.
    pub fn ok(&self, id: &str, script: &str) -> String {
        self.succeed(&["sandbox", "exec", id, "--", "sh", "-c", script])
    }

    /// Python `code` in sandbox `id` (as root) that must succeed; its stdout.
    pub fn py(&self, id: &str, code: &str) -> String {
        self.succeed(&["sandbox", "exec", id, "--", "python3", "-c", code])
    }

    /// `forkbox ARGS` that must succeed; its stdout.
    fn succeed(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "{}: exit {:?}\n{}{}",
            args.last().unwrap_or(&""),
            out.status.code(),
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// The sandbox as `sandbox ls --json` shows it.
    pub fn view(&self, id: &str) -> serde_json::Value {
        let out = self.cli(&["sandbox", "ls", "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let all: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        all.into_iter()
            .find(|v| v["id"] == id)
            .unwrap_or(serde_json::Value::Null)
    }

    /// Whether the daemon answers at once (`sandbox ls` within 10 s).
    pub fn answers(&self) -> bool {
        let mut c = Daemon::cmd(&self.paths);
        c.args(["sandbox", "ls"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        let done = infra::wait_until(Duration::from_secs(10), || {
            child.try_wait().ok().flatten().is_some()
        });
        if !done {
            let _ = child.kill();
        }
        let _ = child.wait();
        done
    }

    /// The daemon's resident memory, KiB.
    pub fn rss_kib(&self) -> u64 {
        status_field(self.pid(), "VmRSS:")
    }

    /// Bytes of the daemon's log files.
    pub fn log_bytes(&self) -> u64 {
        ["daemon.log", "daemon.log.1", "daemon.out"]
            .iter()
            .filter_map(|f| std::fs::metadata(self.paths.home().join(f)).ok())
            .map(|m| m.len())
            .sum()
    }

    pub fn log_text(&self) -> String {
        ["daemon.log.1", "daemon.log"]
            .iter()
            .filter_map(|f| std::fs::read(self.paths.home().join(f)).ok())
            .map(|b| text(&b))
            .collect()
    }

    /// The QEMU of sandbox `id`.
    pub fn qemu_of(&self, id: &str) -> u32 {
        let pids = infra::processes_mentioning(&self.paths.run().join(id).display().to_string());
        pids.into_iter()
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.starts_with("qemu"))
            })
            .expect("the sandbox's QEMU")
    }

    /// Sends SIGKILL to the daemon and waits for it to be gone.
    pub fn kill9(&mut self) {
        let pid = self
            .child
            .as_ref()
            .map_or_else(|| self.pid(), std::process::Child::id);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        infra::wait_until(Duration::from_secs(10), || {
            !Path::new(&format!("/proc/{pid}")).exists()
        });
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A daemon killed on purpose leaves its sandboxes to the next one on this home.
        if self.child.is_none() {
            return;
        }
        // Everything this daemon made goes with it, so tests leave no VM behind.
        let out = self.cli(&["sandbox", "ls", "--json"]);
        if let Ok(all) = serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout) {
            for v in all {
                if let Some(id) = v["id"].as_str() {
                    let _ = self.cli(&["sandbox", "rm", id]);
                }
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let exited = infra::wait_until(Duration::from_secs(30), || {
                c.try_wait().ok().flatten().is_some()
            });
            if !exited {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// A number field of `/proc/PID/status` (kB for memory fields).
pub fn status_field(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A temporary host directory holding `files`.
pub fn host_dir(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, data) in files {
        std::fs::write(dir.path().join(name), data).unwrap();
    }
    dir
}

/// Uploads `bytes` as `/root/attack/NAME` into sandbox `id`.
pub fn put(d: &Daemon, id: &str, name: &str, bytes: &[u8]) -> PathBuf {
    let dir = host_dir(&[(name, bytes)]);
    let out = d.cli(&[
        "sandbox",
        "upload",
        id,
        dir.path().to_str().unwrap(),
        "/root/attack",
    ]);
    assert!(out.status.success(), "upload: {}", text(&out.stderr));
    PathBuf::from("/root/attack").join(name)
}
