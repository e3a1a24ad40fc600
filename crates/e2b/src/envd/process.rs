//! `process.Process`: commands started through the daemon's API (`commands`), each wrapped so
//! that it records itself in the guest and says its pid first ([`crate::guest::start`]); their
//! output and end from the command's events, its stdin, signals and terminal size through the
//! command's own calls.
//!
//! A command lives until it exits or its deadline (`connect-timeout-ms`, as envd has it) passes,
//! whether or not a client still follows it: a background command is one whose client let go,
//! and `Connect` follows it again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use forkbox_api::{CommandEvent, ExecRequest, TerminalSize};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{awake_target, b64, bytes_field, unary, Messages, Stream, Target};
use crate::errors::Failure;
use crate::{guest, E2b};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Size {
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

#[derive(Debug, Default, Deserialize)]
struct Pty {
    size: Option<Size>,
}

#[derive(Debug, Default, Deserialize)]
struct StartRequest {
    #[serde(default)]
    process: ProcessConfig,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct WithProcess {
    #[serde(default)]
    process: Selector,
}

#[derive(Debug, Default, Deserialize)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct SendInput {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    input: Input,
}

#[derive(Debug, Default, Deserialize)]
struct SendSignal {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    signal: Value,
}

#[derive(Debug, Default, Deserialize)]
struct Update {
    #[serde(default)]
    process: Selector,
    pty: Option<Pty>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamInputRequest {
    start: Option<WithProcess>,
    data: Option<StreamData>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamData {
    #[serde(default)]
    input: Input,
}

/// `POST /process.Process/{method}`.
pub(super) async fn call(
    State(e): State<Arc<E2b>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match method.as_str() {
        "Start" => streaming(e, headers, body, Kind::Start).await,
        "Connect" => streaming(e, headers, body, Kind::Connect).await,
        "StreamInput" => stream_input(e, headers, body).await,
        _ => {
            super::unary_answer(body, |bytes| async move {
                unary_call(&e, &headers, &method, &bytes).await
            })
            .await
        }
    }
}

async fn unary_call(
    e: &E2b,
    headers: &HeaderMap,
    method: &str,
    bytes: &[u8],
) -> Result<Value, Failure> {
    let t = awake_target(e, headers).await?;
    match method {
        "List" => list(e, &t).await,
        "SendInput" => {
            let r: SendInput = unary(bytes)?;
            let (pid, cid) = resolve(e, &t, &r.process).await?;
            let data = input_bytes(&r.input)?;
            let p = stdin_of(cid, pid)?;
            e.daemon
                .write_stdin(&t.id, &p.cid, chunks(vec![data]), false)
                .await?;
            Ok(json!({}))
        }
        "CloseStdin" => {
            let r: WithProcess = unary(bytes)?;
            let (pid, cid) = resolve(e, &t, &r.process).await?;
            let p = stdin_of(cid, pid)?;
            e.daemon
                .write_stdin(&t.id, &p.cid, chunks(Vec::new()), true)
                .await?;
            Ok(json!({}))
        }
        "SendSignal" => {
            let r: SendSignal = unary(bytes)?;
            let sig = signal_number(&r.signal)?;
            let (pid, cid) = resolve(e, &t, &r.process).await?;
            signal(e, &t, pid, cid, sig).await?;
            Ok(json!({}))
        }
        "Update" => {
            let r: Update = unary(bytes)?;
            let (pid, cid) = resolve(e, &t, &r.process).await?;
            if let Some(size) = r.pty.and_then(|p| p.size) {
                let p = stdin_of(cid, pid)?;
                e.daemon
                    .resize(
                        &t.id,
                        &p.cid,
                        TerminalSize {
                            rows: size.rows,
                            cols: size.cols,
                        },
                    )
                    .await?;
            }
            Ok(json!({}))
        }
        m => Err(Failure::new(
            501,
            format!("process.Process has no method {m}"),
        )),
    }
}

/// Chunks for a command's stdin, all ready.
fn chunks(data: Vec<Vec<u8>>) -> tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(data.len().max(1));
    for d in data {
        let _ = tx.try_send(Ok(d));
    }
    rx
}

fn input_bytes(i: &Input) -> Result<Vec<u8>, Failure> {
    match (&i.stdin, &i.pty) {
        (Some(s), _) | (None, Some(s)) => bytes_field(s),
        (None, None) => Ok(Vec::new()),
    }
}

/// A command this front end started: the daemon's id of it, and whether it runs on a terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proc {
    pub cid: String,
    pub pty: bool,
}

/// The command of a process this front end started (its stdin, signals, size).
fn stdin_of(cid: Option<Proc>, pid: u32) -> Result<Proc, Failure> {
    cid.ok_or_else(|| {
        Failure::new(
            400,
            format!(
                "process {pid} runs, but was not started through this API in this sandbox (a \
                 fork's copy keeps its parent's processes, not their input and output)"
            ),
        )
    })
}

fn signal_number(v: &Value) -> Result<i32, Failure> {
    match v {
        Value::String(s) if s == "SIGNAL_SIGKILL" => Ok(9),
        Value::String(s) if s == "SIGNAL_SIGTERM" => Ok(15),
        Value::Number(n) if n.as_i64() == Some(9) || n.as_i64() == Some(15) => {
            Ok(n.as_i64().unwrap_or(9) as i32)
        }
        other => Err(Failure::new(
            400,
            format!("signal {other}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
        )),
    }
}

/// The process a selector names: its pid, and its command id when this front end started it.
async fn resolve(e: &E2b, t: &Target, s: &Selector) -> Result<(u32, Option<Proc>), Failure> {
    let pid = match (s.pid, &s.tag) {
        (Some(p), _) if p > 0 => p,
        (_, Some(tag)) => {
            let all = recorded(e, &t.id).await?;
            all.iter()
                .find(|(_, cfg)| cfg.get("tag").and_then(Value::as_str) == Some(tag))
                .map(|(p, _)| *p)
                .ok_or_else(|| Failure::new(404, format!("no process with tag {tag:?}")))?
        }
        _ => {
            return Err(Failure::new(
                400,
                "the process selector names neither a pid nor a tag",
            ))
        }
    };
    let cid = e
        .procs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(t.id.clone(), pid))
        .cloned();
    if cid.is_none() && s.tag.is_none() {
        let alive = e.exec(&t.id, guest::alive(pid)).await?;
        if alive.exit_code != 0 {
            return Err(Failure::new(
                404,
                format!("process with pid {pid} not found"),
            ));
        }
    }
    Ok((pid, cid))
}

/// The live processes the guest has records of: pid and `{"config", "tag"}`.
async fn recorded(e: &E2b, id: &str) -> Result<Vec<(u32, Value)>, Failure> {
    let out = e.run_root(id, guest::list_processes()).await?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let (pid, cfg) = l.split_once('\t')?;
            Some((pid.parse().ok()?, serde_json::from_str(cfg).ok()?))
        })
        .collect())
}

async fn list(e: &E2b, t: &Target) -> Result<Value, Failure> {
    let all = recorded(e, &t.id).await?;
    let processes: Vec<Value> = all
        .into_iter()
        .map(|(pid, mut rec)| {
            let mut p = json!({ "config": rec["config"].take(), "pid": pid });
            if let Some(tag) = rec.get("tag").filter(|v| v.is_string()) {
                p["tag"] = tag.clone();
            }
            p
        })
        .collect();
    Ok(json!({ "processes": processes }))
}

async fn signal(e: &E2b, t: &Target, pid: u32, cid: Option<Proc>, sig: i32) -> Result<(), Failure> {
    if let Some(p) = cid {
        if e.daemon.signal(&t.id, &p.cid, sig).await.is_ok() {
            return Ok(());
        }
    }
    let r = e.exec(&t.id, guest::signal(pid, sig)).await?;
    match r.exit_code {
        0 => Ok(()),
        3 => Err(Failure::new(
            404,
            format!("process with pid {pid} not found"),
        )),
        n => Err(Failure::new(
            500,
            format!("signalling process {pid} failed ({n}): {}", r.stderr.trim()),
        )),
    }
}

// -- server streams: Start and Connect ------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Start,
    Connect,
}

async fn streaming(e: Arc<E2b>, headers: HeaderMap, body: Body, kind: Kind) -> Response {
    let first = super::first_message(body).await;
    let (stream, resp) = Stream::open();
    tokio::spawn(async move {
        let r = match (first, kind) {
            (Err(f), _) => Err(f),
            (Ok((_, v)), Kind::Start) => start(&e, &headers, v, &stream).await,
            (Ok((_, v)), Kind::Connect) => reconnect(&e, &headers, v, &stream).await,
        };
        stream.end(r.err().as_ref()).await;
    });
    resp
}

async fn start(
    e: &Arc<E2b>,
    headers: &HeaderMap,
    first: Value,
    stream: &Stream,
) -> Result<(), Failure> {
    let t = awake_target(e, headers).await?;
    let req: StartRequest = super::message(first)?;
    let p = req.process;
    if p.cmd.is_empty() {
        return Err(Failure::new(400, "process.cmd is empty"));
    }
    let record = json!({
        "config": { "cmd": p.cmd, "args": p.args, "envs": p.envs, "cwd": p.cwd },
        "tag": req.tag,
    });
    let mut argv = vec![p.cmd.clone()];
    argv.extend(p.args.iter().cloned());
    let mut env = p.envs.clone();
    env.insert("E2B_PROC".into(), record.to_string());
    let tty = req.pty.as_ref().map(|p| {
        let s = p.size.as_ref();
        TerminalSize {
            rows: s.map_or(24, |s| s.rows.max(1)),
            cols: s.map_or(80, |s| s.cols.max(1)),
        }
    });
    let exec = ExecRequest {
        argv: Some(guest::start(&t.user, p.cwd.as_deref().unwrap_or(""), &argv)),
        env,
        timeout_ms: super::deadline_ms(headers),
        stdin: req.stdin.unwrap_or(true) || tty.is_some(),
        tty,
        ..Default::default()
    };
    let started = e.daemon.start_command(&t.id, &exec).await?;
    let events = e.daemon.attach(&t.id, &started.command_id).await?;
    let follow = Follow {
        e: e.clone(),
        sandbox: t.id.clone(),
        cid: started.command_id,
        pty: tty.is_some(),
        keepalive: super::keepalive(headers),
    };
    follow.run(events, stream, None).await
}

async fn reconnect(
    e: &Arc<E2b>,
    headers: &HeaderMap,
    first: Value,
    stream: &Stream,
) -> Result<(), Failure> {
    let t = awake_target(e, headers).await?;
    let req: WithProcess = super::message(first)?;
    let (pid, cid) = resolve(e, &t, &req.process).await?;
    let proc = stdin_of(cid, pid)?;
    let events = e.daemon.attach(&t.id, &proc.cid).await?;
    let follow = Follow {
        e: e.clone(),
        sandbox: t.id.clone(),
        cid: proc.cid,
        pty: proc.pty,
        keepalive: super::keepalive(headers),
    };
    follow.run(events, stream, Some(pid)).await
}

/// One command followed from its events to a client's stream.
struct Follow {
    e: Arc<E2b>,
    sandbox: String,
    cid: String,
    pty: bool,
    keepalive: Duration,
}

/// Where the pid mark ends in `head`, and the pid: `\x1ee2b-pid PID\n` (`\r\n` on a
/// terminal).
fn take_mark(head: &[u8]) -> Option<Result<(u32, usize), ()>> {
    if !head.starts_with(guest::PID_MARK) {
        let could_be = guest::PID_MARK.starts_with(head);
        return (!could_be).then_some(Err(()));
    }
    // A pid is at most 10 digits (and `\r` on a terminal): a longer "mark" is none, and its
    // bytes are the command's output (what a guest sends is never held without bound).
    let Some(nl) = head.iter().position(|b| *b == b'\n') else {
        return (head.len() > guest::PID_MARK.len() + 12).then_some(Err(()));
    };
    let text = String::from_utf8_lossy(&head[guest::PID_MARK.len()..nl]);
    Some(
        text.trim()
            .parse::<u32>()
            .map(|p| (p, nl + 1))
            .map_err(|_| ()),
    )
}

impl Follow {
    /// Forwards the command's events: `start{pid}` first (at once when `known` — a Connect —
    /// else once the command has said its pid; on a terminal, once its program has drawn too:
    /// see [`TERMINAL_READY_WAIT`]), its output, then its `end`.
    async fn run(
        &self,
        mut events: forkbox_client::Events<CommandEvent>,
        stream: &Stream,
        known: Option<u32>,
    ) -> Result<(), Failure> {
        let mut pid = known;
        if let Some(p) = pid {
            stream
                .send(&json!({ "event": { "start": { "pid": p } } }))
                .await;
        }
        // Output before the mark is read (a Connect replays from the command's start).
        let mut head: Option<Vec<u8>> = Some(Vec::new());
        let mut held: Vec<Value> = Vec::new();
        // A terminal's pid, known, whose start waits for its program's first output.
        let mut gate: Option<(u32, tokio::time::Instant)> = None;
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + self.keepalive, self.keepalive);
        loop {
            let ev = tokio::select! {
                ev = events.next() => ev?,
                _ = tick.tick() => {
                    if pid.is_some() && !stream.send(&json!({ "event": { "keepalive": {} } })).await {
                        return Ok(());
                    }
                    continue;
                }
                _ = until(gate.map(|g| g.1)) => {
                    pid = self.open(gate.take(), &mut held, stream).await;
                    continue;
                }
            };
            let out = match ev {
                Some(CommandEvent::Command { .. }) => continue,
                Some(CommandEvent::Stdout { data_b64 }) => {
                    let mut data = bytes_field(&data_b64)?;
                    if let Some(mut h) = head.take() {
                        h.extend_from_slice(&data);
                        match take_mark(&h) {
                            None => {
                                head = Some(h);
                                continue;
                            }
                            Some(Ok((p, n))) => {
                                data = h.split_off(n);
                                if pid.is_none() {
                                    self.register(p);
                                    let now = tokio::time::Instant::now();
                                    if self.pty && data.is_empty() {
                                        gate = Some((p, now + TERMINAL_READY_WAIT));
                                    } else {
                                        pid = self.open(Some((p, now)), &mut held, stream).await;
                                    }
                                }
                            }
                            Some(Err(())) => data = h,
                        }
                    }
                    if data.is_empty() {
                        continue;
                    }
                    let key = if self.pty { "pty" } else { "stdout" };
                    json!({ "event": { "data": { key: b64(&data) } } })
                }
                Some(CommandEvent::Stderr { data_b64 }) => {
                    json!({ "event": { "data": { "stderr": data_b64 } } })
                }
                last => {
                    pid = pid.or(self.open(gate.take(), &mut held, stream).await);
                    return self.end(last, pid, stream).await;
                }
            };
            if pid.is_none() {
                held.push(out);
                pid = self.open(gate.take(), &mut held, stream).await;
            } else if !stream.send(&out).await {
                // The client let go: the command goes on (a background command), until it
                // ends or its deadline passes.
                return Ok(());
            }
        }
    }

    /// Sends the `start` of the command whose pid `gate` holds, then the output held for it;
    /// returns the pid (none, and nothing sent, without a gate).
    async fn open(
        &self,
        gate: Option<(u32, tokio::time::Instant)>,
        held: &mut Vec<Value>,
        stream: &Stream,
    ) -> Option<u32> {
        let (p, _) = gate?;
        stream
            .send(&json!({ "event": { "start": { "pid": p } } }))
            .await;
        for v in held.drain(..) {
            stream.send(&v).await;
        }
        Some(p)
    }

    /// The call's end: the command's `end` when it exited (or its Connect error), and when its
    /// sandbox died under it (`last` is an error, or the events stopped), the stream cut short.
    async fn end(
        &self,
        last: Option<CommandEvent>,
        pid: Option<u32>,
        stream: &Stream,
    ) -> Result<(), Failure> {
        self.forget_pid(pid);
        match last {
            Some(CommandEvent::Exit(x)) => {
                pid.ok_or_else(|| no_pid(&x.error))?;
                // A deadline that passed ends the call as envd's does: Connect's
                // `deadline_exceeded` (the SDKs' TimeoutException), not an end event.
                if x.timed_out && x.error.is_none() {
                    return Err(Failure::new(504, DEADLINE_PASSED));
                }
                stream.send(&exit_end(x)).await;
            }
            Some(CommandEvent::Error { message, .. }) if pid.is_none() => {
                return Err(no_pid(&Some(message)));
            }
            _ if self.sandbox_gone().await => stream.cut().await,
            Some(CommandEvent::Error { message, exit_code }) => {
                stream.send(&error_end(&message, exit_code)).await;
            }
            _ => {
                return Err(Failure::new(
                    503,
                    format!("sandbox {} stopped before the command ended", self.sandbox),
                ))
            }
        }
        Ok(())
    }

    /// Whether the command's sandbox is gone (killed, ended, or no longer running). A
    /// command's connection breaks while its sandbox is being taken down, before the daemon
    /// lists it as gone: a running sandbox is asked about again for up to 3 s.
    async fn sandbox_gone(&self) -> bool {
        for _ in 0..12 {
            if !self.e.running(&self.sandbox).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }

    fn register(&self, pid: u32) {
        self.e
            .procs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                (self.sandbox.clone(), pid),
                Proc {
                    cid: self.cid.clone(),
                    pty: self.pty,
                },
            );
    }

    fn forget_pid(&self, pid: Option<u32>) {
        if let Some(p) = pid {
            let mut m = self.e.procs.lock().unwrap_or_else(|p| p.into_inner());
            if m.get(&(self.sandbox.clone(), p)).map(|x| &x.cid) == Some(&self.cid) {
                m.remove(&(self.sandbox.clone(), p));
            }
        }
    }
}

/// How long a new terminal's `start` waits for its program's first output (a shell's
/// prompt). A client types as soon as `start` comes; a terminal is ready then, as E2B's are:
/// under TCG a sandbox's first login shell takes 0.2-0.5 s to read its terminal (more on a
/// busy host), and a client that gave its input 0.3 s to echo (E2B's own PTY tests do) saw
/// nothing of it. A program that draws nothing starts this much later.
const TERMINAL_READY_WAIT: Duration = Duration::from_secs(2);

/// Waits until `at`, or forever.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

const DEADLINE_PASSED: &str = "the command's deadline passed (connect-timeout-ms)";

/// envd's `end` of a command that exited (or was killed by a signal).
fn exit_end(x: forkbox_api::ExitInfo) -> Value {
    let (code, exited, status) = match x.signal {
        Some(s) => (-1, false, format!("signal: {}", signal_name(s))),
        None => (x.exit_code, true, format!("exit status {}", x.exit_code)),
    };
    let mut end = json!({ "exitCode": code, "exited": exited, "status": status });
    match (x.error, x.timed_out) {
        (Some(err), _) => end["error"] = json!(err),
        (None, true) => end["error"] = json!(DEADLINE_PASSED),
        (None, false) => {}
    }
    json!({ "event": { "end": end } })
}

/// envd's `end` of a command that could not run, or whose sandbox failed under it.
fn error_end(message: &str, exit_code: Option<i32>) -> Value {
    let end = json!({
        "exitCode": exit_code.unwrap_or(-1),
        "exited": false,
        "status": "error",
        "error": message,
    });
    json!({ "event": { "end": end } })
}

fn no_pid(why: &Option<String>) -> Failure {
    Failure::new(
        500,
        format!(
            "the command ended before it started ({})",
            why.as_deref().unwrap_or("its wrapper printed no pid")
        ),
    )
}

fn signal_name(s: i32) -> &'static str {
    match s {
        9 => "killed",
        15 => "terminated",
        2 => "interrupt",
        1 => "hangup",
        13 => "broken pipe",
        6 => "aborted",
        11 => "segmentation fault",
        _ => "signal",
    }
}

// -- client stream: StreamInput -------------------------------------------------------------

async fn stream_input(e: Arc<E2b>, headers: HeaderMap, body: Body) -> Response {
    let first = super::first_message(body).await;
    let (stream, resp) = Stream::open();
    tokio::spawn(async move {
        let r = match first {
            Ok((msgs, v)) => feed(&e, &headers, v, msgs).await,
            Err(f) => Err(f),
        };
        if r.is_ok() {
            stream.send(&json!({})).await;
        }
        stream.end(r.err().as_ref()).await;
    });
    resp
}

async fn feed(
    e: &E2b,
    headers: &HeaderMap,
    first: Value,
    mut msgs: Messages,
) -> Result<(), Failure> {
    let t = awake_target(e, headers).await?;
    let first: StreamInputRequest = super::message(first)?;
    let sel = first
        .start
        .ok_or_else(|| Failure::new(400, "StreamInput starts with `start`"))?
        .process;
    let (pid, cid) = resolve(e, &t, &sel).await?;
    let cid = stdin_of(cid, pid)?.cid;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let writer = {
        let daemon = e.daemon.clone();
        let (id, cid) = (t.id.clone(), cid.clone());
        tokio::spawn(async move { daemon.write_stdin(&id, &cid, rx, false).await })
    };
    while let Some(m) = msgs.next::<StreamInputRequest>().await? {
        if let Some(d) = m.data {
            if tx.send(Ok(input_bytes(&d.input)?)).await.is_err() {
                break;
            }
        }
    }
    drop(tx);
    writer
        .await
        .map_err(|err| Failure::new(500, format!("the stdin writer failed: {err}")))??;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_mark_is_read_whole_and_only_at_the_start() {
        assert_eq!(take_mark(b""), None);
        assert_eq!(take_mark(b"\x1ee2b-p"), None);
        assert_eq!(take_mark(b"\x1ee2b-pid 42"), None);
        assert_eq!(take_mark(b"\x1ee2b-pid 42\nhi"), Some(Ok((42, 12))));
        assert_eq!(take_mark(b"\x1ee2b-pid 42\r\nhi"), Some(Ok((42, 13))));
        assert_eq!(take_mark(b"hello"), Some(Err(())));
        let mut endless = guest::PID_MARK.to_vec();
        endless.extend(std::iter::repeat_n(b'1', 64));
        assert_eq!(
            take_mark(&endless),
            Some(Err(())),
            "a mark without end is not waited for"
        );
        assert_eq!(signal_number(&json!("SIGNAL_SIGKILL")).unwrap(), 9);
        assert!(signal_number(&json!("SIGNAL_SIGHUP")).is_err());
    }
}
