//! Commands that outlive the request that started them: their output is kept (up to a cap) so a
//! client can poll it, or attach and read it from the start while it runs, and reattach after a
//! disconnect.

use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::client::ExecEvent;
use crate::sandbox::SandboxExecution;

pub use forkbox_api::{ExitInfo, Stream};

/// Output a command keeps for readers; past it, further output is counted but dropped.
pub const LOG_CAP: usize = 64 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct Chunk {
    pub stream: Stream,
    #[serde(skip)]
    pub data: Vec<u8>,
}

#[derive(Default)]
struct Log {
    chunks: Vec<Chunk>,
    bytes: usize,
    dropped_bytes: u64,
    exit: Option<ExitInfo>,
}

/// A command that could not start as a shell says it: 127 and the agent's words when its
/// program is not found, 126 when it cannot be run. The same code and words from `run`,
/// `sandbox exec` and the API.
pub fn cannot_start(e: &crate::error::SandboxError) -> Option<(i32, String)> {
    use crate::error::{AgentError, SandboxError};
    use forkbox_protocol::ErrorKind;
    match e {
        SandboxError::Agent(AgentError::Refused { kind, message }) => match kind {
            ErrorKind::NotFound => Some((127, message.clone())),
            ErrorKind::PermissionDenied => Some((126, message.clone())),
            _ => None,
        },
        _ => None,
    }
}

/// What a client sends a running command.
enum Control {
    Signal(i32),
    /// Bytes for its standard input; `None` closes it.
    Stdin(Option<Vec<u8>>),
    Resize(forkbox_protocol::WinSize),
}

/// One command's output and fate.
pub struct CommandLog {
    log: Mutex<Log>,
    changed: Notify,
    control: mpsc::Sender<Control>,
    /// Whether it reads standard input from its clients (else /dev/null).
    reads_stdin: bool,
    /// Its request's number on the agent connection (the guest keeps it by that number).
    agent_id: u32,
    /// Set while its sandbox sleeps with it: the connection that wakes it is handed over.
    hold: Mutex<Hold>,
    /// Whether it leaves its sandbox idle while it runs (a service of forkbox's own).
    quiet: std::sync::atomic::AtomicBool,
}

/// The two ends by which a sleeping command's new connection reaches its pump.
#[derive(Default)]
struct Hold {
    tx: Option<oneshot::Sender<SandboxExecution>>,
    rx: Option<oneshot::Receiver<SandboxExecution>>,
}

/// What a reader gets: chunks from index `from` on, and the exit once there is one.
pub struct Snapshot {
    pub chunks: Vec<Chunk>,
    pub next: usize,
    pub dropped_bytes: u64,
    pub exit: Option<ExitInfo>,
}

impl CommandLog {
    /// Drives `ex` to its end in the background, recording what it prints.
    pub fn start(mut ex: SandboxExecution, reads_stdin: bool) -> Arc<CommandLog> {
        let (control, mut control_rx) = mpsc::channel::<Control>(4);
        let log = Arc::new(CommandLog {
            log: Mutex::default(),
            changed: Notify::new(),
            control,
            reads_stdin,
            agent_id: ex.id(),
            hold: Mutex::default(),
            quiet: Default::default(),
        });
        let me = log.clone();
        tokio::spawn(async move {
            loop {
                let ev = tokio::select! {
                    ev = ex.next() => ev,
                    Some(c) = control_rx.recv() => {
                        let _ = match c {
                            Control::Signal(sig) => ex.signal(sig).await,
                            Control::Stdin(Some(data)) => ex.stdin(data).await,
                            Control::Stdin(None) => ex.close_stdin().await,
                            Control::Resize(size) => ex.resize(size).await,
                        };
                        continue;
                    }
                };
                let exit = match ev {
                    Ok(ExecEvent::Started { .. }) => None,
                    Ok(ExecEvent::Stdout(d)) => {
                        me.push(Stream::Stdout, d);
                        None
                    }
                    Ok(ExecEvent::Stderr(d)) => {
                        me.push(Stream::Stderr, d);
                        None
                    }
                    Ok(ExecEvent::Exited {
                        status,
                        timed_out,
                        duration_ms,
                    }) => Some(ExitInfo {
                        exit_code: status.as_shell_code(),
                        signal: status.signal(),
                        timed_out,
                        duration_ms,
                        error: None,
                    }),
                    // Its sandbox went to sleep with it: it goes on on the connection that
                    // wakes it.
                    Err(e) if cannot_start(&e).is_none() && me.held() => {
                        match me.woken(&ex).await {
                            Some(woke) => {
                                ex = woke;
                                continue;
                            }
                            None => Some(ExitInfo {
                                exit_code: -1,
                                error: Some(format!(
                                    "its sandbox went to sleep and did not wake with it ({e})"
                                )),
                                ..Default::default()
                            }),
                        }
                    }
                    Err(e) => Some(match cannot_start(&e) {
                        Some((exit_code, message)) => ExitInfo {
                            exit_code,
                            error: Some(message),
                            ..Default::default()
                        },
                        None => ExitInfo {
                            exit_code: -1,
                            error: Some(e.to_string()),
                            ..Default::default()
                        },
                    }),
                };
                if let Some(exit) = exit {
                    me.lock().exit = Some(exit);
                    me.changed.notify_waiters();
                    return;
                }
            }
        });
        log
    }

    /// The connection its sandbox woke with, `before`'s deadline carried over; `None` when
    /// it will not wake.
    async fn woken(&self, before: &SandboxExecution) -> Option<SandboxExecution> {
        let lost_at = std::time::Instant::now();
        let rx = self.hold_lock().rx.take()?;
        let mut woke = rx.await.ok()?;
        woke.carry_on(before, lost_at);
        Some(woke)
    }

    fn hold_lock(&self) -> std::sync::MutexGuard<'_, Hold> {
        self.hold.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its sandbox is about to sleep with it (its memory kept): when its connection ends, it
    /// waits for the one that wakes it ([`Self::wake`]) rather than ending. False when it had
    /// ended already.
    pub fn hold(&self) -> bool {
        if self.finished() {
            return false;
        }
        let (tx, rx) = oneshot::channel();
        *self.hold_lock() = Hold {
            tx: Some(tx),
            rx: Some(rx),
        };
        true
    }

    /// Whether it waits for its sandbox to wake.
    pub fn held(&self) -> bool {
        self.hold_lock().tx.is_some()
    }

    /// Its sandbox did not go to sleep after all, or will not wake (removed, or booted from
    /// its disk): it ends with its connection.
    pub fn release(&self) {
        *self.hold_lock() = Hold::default();
    }

    /// Its sandbox woke, running it on: its output and end come through `ex` (the new
    /// connection's, see [`crate::sandbox::Sandbox::adopt_command`]) from now on.
    pub fn wake(&self, ex: SandboxExecution) {
        let tx = self.hold_lock().tx.take();
        if let Some(tx) = tx {
            let _ = tx.send(ex);
        }
    }

    /// Its request's number on the agent connection.
    pub fn agent_id(&self) -> u32 {
        self.agent_id
    }

    /// It leaves its sandbox idle while it runs (also on the connection that wakes it).
    pub fn set_quiet(&self) {
        self.quiet.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn is_quiet(&self) -> bool {
        self.quiet.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, stream: Stream, data: Vec<u8>) {
        let mut log = self.lock();
        if log.bytes + data.len() > LOG_CAP {
            log.dropped_bytes += data.len() as u64;
        } else {
            log.bytes += data.len();
            log.chunks.push(Chunk { stream, data });
        }
        drop(log);
        self.changed.notify_waiters();
    }

    pub fn snapshot(&self, from: usize) -> Snapshot {
        let log = self.lock();
        let from = from.min(log.chunks.len());
        Snapshot {
            chunks: log.chunks[from..].to_vec(),
            next: log.chunks.len(),
            dropped_bytes: log.dropped_bytes,
            exit: log.exit.clone(),
        }
    }

    /// Waits until there is output past `from` or the command ended.
    pub async fn wait_past(&self, from: usize) {
        loop {
            let notified = self.changed.notified();
            {
                let log = self.lock();
                if log.chunks.len() > from || log.exit.is_some() {
                    return;
                }
            }
            notified.await;
        }
    }

    pub fn finished(&self) -> bool {
        self.lock().exit.is_some()
    }

    pub async fn signal(&self, sig: i32) {
        let _ = self.control.send(Control::Signal(sig)).await;
    }

    /// A new size for its terminal, when it runs on one (otherwise nothing happens).
    pub async fn resize(&self, size: forkbox_protocol::WinSize) {
        let _ = self.control.send(Control::Resize(size)).await;
    }

    pub fn reads_stdin(&self) -> bool {
        self.reads_stdin
    }

    /// Passes `data` to the command's standard input (in order, with back-pressure); `None`
    /// closes it. Data for a command that ended is dropped: it can read nothing more.
    pub async fn stdin(&self, data: Option<Vec<u8>>) {
        let _ = self.control.send(Control::Stdin(data)).await;
    }
}
