//! A small blocking client for QEMU's machine protocol (QMP), enough for migration-based
//! snapshots and restores: commands, events with their timestamps, and passing open files to
//! QEMU (`getfd`, SCM_RIGHTS), which works under QEMU's strictest seccomp setting where
//! `exec:` migration URIs cannot.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::socket_wait::SocketWait;
use crate::error::VmError;

/// An event QEMU sent, with QEMU's own timestamp (microseconds since the Unix epoch).
#[derive(Debug, Clone)]
pub struct Event {
    pub name: String,
    pub at_us: u64,
    pub data: Value,
}

pub struct Qmp {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    pub events: Vec<Event>,
}

fn err(command: &str, message: impl Into<String>) -> VmError {
    VmError::Qmp {
        command: command.to_string(),
        message: message.into(),
    }
}

impl Qmp {
    /// Connects to a QMP socket that QEMU may still be creating (see [`SocketWait`]: retries
    /// until `within`, or until the socket's directory is removed).
    pub fn connect(path: &Path, within: Duration) -> Result<Qmp, VmError> {
        let mut wait = SocketWait::new(path, within);
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) => match wait.next_pause() {
                    Some(pause) => std::thread::sleep(pause),
                    None => {
                        return Err(err(
                            "connect",
                            format!(
                                "{}: {e} (waited {:.1} s for QEMU to open it)",
                                path.display(),
                                wait.waited().as_secs_f64()
                            ),
                        ))
                    }
                },
            }
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(|e| err("connect", e.to_string()))?;
        let reader = BufReader::new(
            stream
                .try_clone()
                .map_err(|e| err("connect", e.to_string()))?,
        );
        let mut q = Qmp {
            writer: stream,
            reader,
            events: Vec::new(),
        };
        // The greeting, then leave capabilities negotiation mode.
        q.read_message("greeting")?;
        q.execute("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    fn read_message(&mut self, command: &str) -> Result<Value, VmError> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| err(command, format!("reading QEMU's answer: {e}")))?;
        if n == 0 {
            return Err(err(command, "QEMU closed its control socket (it exited)"));
        }
        serde_json::from_str(&line).map_err(|e| err(command, format!("bad JSON from QEMU: {e}")))
    }

    /// Runs a command and returns its `return` value; events that arrive meanwhile are kept.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, VmError> {
        self.send(command, arguments, None)
    }

    /// Runs a command with an open file passed along (for `getfd`).
    pub fn execute_with_fd(
        &mut self,
        command: &str,
        arguments: Value,
        fd: BorrowedFd<'_>,
    ) -> Result<Value, VmError> {
        self.send(command, arguments, Some(fd))
    }

    fn send(
        &mut self,
        command: &str,
        arguments: Value,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Value, VmError> {
        let msg = serde_json::to_vec(&json!({"execute": command, "arguments": arguments}))
            .map_err(|e| err(command, e.to_string()))?;
        match fd {
            None => self
                .writer
                .write_all(&msg)
                .map_err(|e| err(command, e.to_string()))?,
            Some(fd) => {
                use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
                let fds = [fd.as_raw_fd()];
                let iov = [std::io::IoSlice::new(&msg)];
                let cmsg = [ControlMessage::ScmRights(&fds)];
                let sent = sendmsg::<()>(
                    self.writer.as_raw_fd(),
                    &iov,
                    &cmsg,
                    MsgFlags::empty(),
                    None,
                )
                .map_err(|e| err(command, e.to_string()))?;
                if sent != msg.len() {
                    self.writer
                        .write_all(&msg[sent..])
                        .map_err(|e| err(command, e.to_string()))?;
                }
            }
        }
        loop {
            let v = self.read_message(command)?;
            if let Some(name) = v.get("event").and_then(Value::as_str) {
                let ts = &v["timestamp"];
                let at_us = ts["seconds"].as_u64().unwrap_or(0) * 1_000_000
                    + ts["microseconds"].as_u64().unwrap_or(0);
                self.events.push(Event {
                    name: name.to_string(),
                    at_us,
                    data: v.get("data").cloned().unwrap_or(Value::Null),
                });
                continue;
            }
            if let Some(e) = v.get("error") {
                return Err(err(
                    command,
                    e["desc"].as_str().unwrap_or("unknown error").to_string(),
                ));
            }
            return Ok(v.get("return").cloned().unwrap_or(Value::Null));
        }
    }

    /// Passes an open file to QEMU under `name`, for `fd:NAME` migration URIs.
    pub fn pass_fd(&mut self, name: &str, fd: BorrowedFd<'_>) -> Result<(), VmError> {
        self.execute_with_fd("getfd", json!({ "fdname": name }), fd)
            .map(drop)
    }

    pub fn set_capabilities(&mut self, caps: &[(&str, bool)]) -> Result<(), VmError> {
        let caps: Vec<Value> = caps
            .iter()
            .map(|(c, on)| json!({"capability": c, "state": on}))
            .collect();
        self.execute("migrate-set-capabilities", json!({ "capabilities": caps }))
            .map(drop)
    }

    /// Polls `query-migrate` until its status is one of `want`; a failed or cancelled
    /// migration is an error carrying QEMU's reason.
    pub fn wait_migration(&mut self, want: &[&str], within: Duration) -> Result<Value, VmError> {
        let started = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            let v = self.execute("query-migrate", json!({}))?;
            let status = v["status"].as_str().unwrap_or("none");
            if want.contains(&status) {
                return Ok(v);
            }
            if matches!(status, "failed" | "cancelled") {
                return Err(err(
                    "migrate",
                    format!(
                        "migration {status}: {}",
                        v["error-desc"].as_str().unwrap_or("no reason given")
                    ),
                ));
            }
            if started.elapsed() > within {
                return Err(err(
                    "migrate",
                    format!("still `{status}` after {} s", within.as_secs()),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// The VM's run state (`running`, `paused`, `inmigrate`, `postmigrate`, ...).
    pub fn status(&mut self) -> Result<String, VmError> {
        let v = self.execute("query-status", json!({}))?;
        Ok(v["status"].as_str().unwrap_or("unknown").to_string())
    }

    /// The time of the last event called `name`, if one came.
    pub fn last_event(&self, name: &str) -> Option<u64> {
        self.events
            .iter()
            .rev()
            .find(|e| e.name == name)
            .map(|e| e.at_us)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// What QEMU says on a new control connection, then its answer to `qmp_capabilities`.
    fn serve_once(listener: UnixListener) {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n")
            .unwrap();
        // One JSON object, with no line end after it (QEMU's parser needs none).
        let mut asked = [0u8; 256];
        let n = std::io::Read::read(&mut s, &mut asked).unwrap();
        let asked = String::from_utf8_lossy(&asked[..n]);
        assert!(asked.contains("qmp_capabilities"), "{asked}");
        s.write_all(b"{\"return\": {}}\r\n").unwrap();
    }

    #[test]
    fn a_socket_opened_late_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let at = path.clone();
        let server = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            serve_once(UnixListener::bind(at).unwrap());
        });
        let started = Instant::now();
        Qmp::connect(&path, Duration::from_secs(30)).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(1500));
        server.join().unwrap();
    }

    #[test]
    fn no_socket_in_time_says_how_long_it_waited() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let Err(e) = Qmp::connect(&path, Duration::from_millis(300)) else {
            panic!("connected to nothing");
        };
        let e = e.to_string();
        assert!(e.contains("qmp.sock") && e.contains("waited 0.3 s"), "{e}");
    }

    #[test]
    fn a_removed_directory_ends_the_wait_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run").join("qmp.sock");
        std::fs::create_dir(dir.path().join("run")).unwrap();
        let gone = dir.path().join("run");
        let remover = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            std::fs::remove_dir(gone).unwrap();
        });
        let started = Instant::now();
        assert!(Qmp::connect(&path, Duration::from_secs(60)).is_err());
        assert!(started.elapsed() < Duration::from_secs(10));
        remover.join().unwrap();
    }
}
