//! The host side of the agent protocol: one connection, many concurrent requests.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use forkbox_protocol::{
    decode, encode_frame, AgentMsg, ExecSpec, ExitStatus, FrameDecoder, Hello, HelloInfo, HostMsg,
    CHUNK, MAGIC,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::error::AgentError;

type Routes = Arc<Mutex<HashMap<u32, mpsc::Sender<AgentMsg>>>>;

/// Replies that came, early in a connection, for no request routed on it: kept for
/// [`AgentClient::adopt`]. A guest restored from a hibernation sends its running commands'
/// output as soon as a host connects: what its agent had queued, and what QEMU had taken
/// from the guest but not yet written when the VM stopped, comes before the agent's answer
/// to the hello, and more comes before the held commands are adopted. Dropped, that lost a
/// block of a command's output across every pause (1,215 to 3,112 lines of 30,000 in three
/// tries). Bounded: [`STRAYS_MOST`] bytes, kept for [`STRAYS_FOR`] after the connection is
/// made (what is left is dropped at the next stray reply after that, or with the client).
#[derive(Default)]
struct Strays {
    by_id: HashMap<u32, Vec<AgentMsg>>,
    bytes: usize,
    until: Option<std::time::Instant>,
}

const STRAYS_MOST: usize = 8 << 20;
const STRAYS_FOR: Duration = Duration::from_secs(30);

impl Strays {
    fn open() -> Strays {
        Strays {
            until: Some(std::time::Instant::now() + STRAYS_FOR),
            ..Default::default()
        }
    }

    /// Keeps `msg` (`size` bytes on the wire) if there is room and time.
    fn keep(&mut self, msg: AgentMsg, size: usize) {
        if self.until.is_none_or(|t| std::time::Instant::now() > t) {
            self.by_id.clear();
            self.until = None;
            return;
        }
        if self.bytes + size <= STRAYS_MOST {
            self.bytes += size;
            self.by_id.entry(msg.id()).or_default().push(msg);
        }
    }
}
/// Why the host stopped talking to a guest, once it did.
type Failure = Arc<Mutex<Option<String>>>;

/// Most bytes [`AgentClient::read_file`] returns.
pub const MAX_READ_FILE: usize = 64 << 20;

#[derive(Clone)]
pub struct AgentClient {
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    routes: Routes,
    next_id: Arc<AtomicU32>,
    /// What the agent said in its hello.
    pub hello: HelloInfo,
    /// The guest proxy's tunnels and the policy that opens them.
    pub net: Arc<crate::net::HostNet>,
    failure: Failure,
    /// When it was last used and what holds it now (requests in flight are `routes`).
    pub activity: Arc<super::activity::Activity>,
    /// Requests in flight that do not keep the sandbox awake: a service forkbox runs in it for
    /// its callers (the code server), which waits for them without being used.
    quiet: Arc<Mutex<std::collections::HashSet<u32>>>,
    /// Replies early in the connection for no request (see [`Strays`]); locked after
    /// `routes`.
    strays: Arc<Mutex<Strays>>,
}

/// One event of a running command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Started {
        pid: u32,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exited {
        status: ExitStatus,
        timed_out: bool,
        duration_ms: u64,
    },
}

/// A command's collected result.
#[derive(Debug, Clone, Default)]
pub struct Output {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
    pub duration_ms: u64,
}

impl Output {
    /// Adds one event of the command; true once it has exited.
    pub fn absorb(&mut self, ev: ExecEvent) -> bool {
        match ev {
            ExecEvent::Started { .. } => false,
            ExecEvent::Stdout(d) => {
                self.stdout.extend_from_slice(&d);
                false
            }
            ExecEvent::Stderr(d) => {
                self.stderr.extend_from_slice(&d);
                false
            }
            ExecEvent::Exited {
                status,
                timed_out,
                duration_ms,
            } => {
                self.status = Some(status);
                self.timed_out = timed_out;
                self.duration_ms = duration_ms;
                true
            }
        }
    }

    pub fn code(&self) -> i32 {
        self.status.map_or(-1, ExitStatus::as_shell_code)
    }
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> AgentError + '_ {
    move |source| AgentError::Io {
        what: what.to_string(),
        source,
    }
}

/// The host's hello frame.
fn our_hello() -> Result<Vec<u8>, AgentError> {
    Ok(Hello::ours(HelloInfo {
        software: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    })
    .to_frame()?)
}

impl AgentClient {
    /// Connects to the agent's socket and greets it. Waits (without limit: callers bound it)
    /// for the guest to boot and answer; re-sends the hello until it does.
    pub async fn connect(socket: &Path) -> Result<AgentClient, AgentError> {
        let stream = loop {
            match UnixStream::connect(socket).await {
                Ok(s) => break s,
                Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        };
        let (mut rd, mut wr) = stream.into_split();
        let hello = our_hello()?;
        let mut dec = FrameDecoder::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut strays = Strays::open();
        let info = 'outer: loop {
            wr.write_all(&hello).await.map_err(io("send hello"))?;
            let wait = tokio::time::sleep(Duration::from_millis(500));
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    _ = &mut wait => continue 'outer,
                    n = rd.read(&mut buf) => {
                        let n = n.map_err(io("read hello"))?;
                        if n == 0 {
                            return Err(AgentError::Disconnected);
                        }
                        dec.push(&buf[..n]);
                        while let Some(p) = dec.next_frame()? {
                            if p.starts_with(&MAGIC) {
                                break 'outer Hello::parse(&p)?.info;
                            }
                            // A restored guest's output, sent before its answer.
                            if let Ok(msg) = decode::<AgentMsg>(&p) {
                                if msg.tunnel().is_none() {
                                    strays.keep(msg, p.len());
                                }
                            }
                        }
                    }
                }
            }
        };
        Ok(AgentClient::serve(rd, wr, dec, info, strays))
    }

    /// Connects to the agent of a guest that cannot answer yet (stopped by a full host disk,
    /// see [`crate::diskwatch`]): sends the hello once and returns at once; the guest reads
    /// it when it runs again, and its answer is skipped like that of a re-sent hello.
    pub async fn connect_stopped(socket: &Path) -> Result<AgentClient, AgentError> {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(io("connect to the agent's socket"))?;
        let (rd, mut wr) = stream.into_split();
        wr.write_all(&our_hello()?)
            .await
            .map_err(io("send hello"))?;
        Ok(AgentClient::serve(
            rd,
            wr,
            FrameDecoder::new(),
            HelloInfo::default(),
            Strays::open(),
        ))
    }

    /// The client over a connection whose hello is sent: its read loop runs from now on.
    fn serve(
        rd: OwnedReadHalf,
        wr: OwnedWriteHalf,
        dec: FrameDecoder,
        hello: HelloInfo,
        strays: Strays,
    ) -> AgentClient {
        let routes: Routes = Arc::new(Mutex::new(HashMap::new()));
        let strays = Arc::new(Mutex::new(strays));
        let writer = Arc::new(tokio::sync::Mutex::new(wr));
        let net = Arc::new(crate::net::HostNet::new(writer.clone()));
        let failure = Failure::default();
        tokio::spawn(read_loop(
            rd,
            dec,
            (routes.clone(), strays.clone()),
            net.clone(),
            writer.clone(),
            failure.clone(),
        ));
        AgentClient {
            writer,
            routes,
            next_id: Arc::new(AtomicU32::new(first_request_id())),
            hello,
            net,
            failure,
            activity: Default::default(),
            quiet: Default::default(),
            strays,
        }
    }

    /// Why the host stopped talking to this guest (it sent a malformed frame, or broke the
    /// tunnel protocol too often), if it did. Requests then fail at once instead of waiting
    /// for answers nobody reads.
    pub fn failure(&self) -> Option<String> {
        lock(&self.failure).clone()
    }

    /// A request id whose replies come to the returned receiver (for multi-message transfers).
    pub(crate) fn route_for_transfer(&self) -> (u32, mpsc::Receiver<AgentMsg>) {
        self.route()
    }

    pub(crate) fn unroute_transfer(&self, id: u32) {
        self.unroute(id)
    }

    pub(crate) async fn send_msg(&self, msg: &HostMsg) -> Result<(), AgentError> {
        self.send(msg).await
    }

    async fn send(&self, msg: &HostMsg) -> Result<(), AgentError> {
        let frame = encode_frame(msg)?;
        let mut w = self.writer.lock().await;
        w.write_all(&frame)
            .await
            .map_err(|_| AgentError::Disconnected)
    }

    /// A request id and where its replies arrive. Once the connection is failed, the
    /// receiver is closed at once (callers see the agent gone, and [`Self::failure`] says why).
    fn route(&self) -> (u32, mpsc::Receiver<AgentMsg>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        (id, self.route_id(id, false))
    }

    /// Where request `id`'s replies arrive (closed at once on a failed connection); `adopted`:
    /// those it sent before (early in the connection, see [`Strays`]) come first, taken under
    /// the routes' lock so that none arrives between them and the route.
    fn route_id(&self, id: u32, adopted: bool) -> mpsc::Receiver<AgentMsg> {
        let mut routes = lock(&self.routes);
        let early = match adopted {
            true => lock(&self.strays).by_id.remove(&id).unwrap_or_default(),
            false => Vec::new(),
        };
        if !early.is_empty() {
            tracing::debug!(
                "request {id} adopted with {} replies that came before",
                early.len()
            );
        }
        let (tx, rx) = mpsc::channel(64 + early.len());
        for msg in early {
            let _ = tx.try_send(msg);
        }
        if lock(&self.failure).is_none() {
            routes.insert(id, tx);
        }
        drop(routes);
        self.activity.touch();
        rx
    }

    /// Request `id` of an earlier connection to this guest, still running in it (its
    /// sandbox slept with it and woke on this connection): its replies come here from now on,
    /// what it sent before this first.
    pub fn adopt(&self, id: u32) -> Execution {
        let rx = self.route_id(id, true);
        Execution {
            id,
            rx,
            client: self.clone(),
            done: false,
        }
    }

    fn unroute(&self, id: u32) {
        lock(&self.routes).remove(&id);
        lock(&self.quiet).remove(&id);
        self.activity.touch();
    }

    /// Request `id` (a command that serves the sandbox's callers) no longer keeps it awake.
    pub fn quiet(&self, id: u32) {
        lock(&self.quiet).insert(id);
    }

    /// How long nothing has used this sandbox: zero while a request to its agent is in flight
    /// (a command running, a transfer, a terminal) or a tunnel is open (a port forward's or
    /// preview's connection, a connection of the guest's through the proxy). Busy counts as a
    /// use when seen, so idleness is counted from the last time something held it.
    pub fn idle_for(&self) -> std::time::Duration {
        let quiet = lock(&self.quiet);
        let busy = lock(&self.routes)
            .keys()
            .filter(|id| !quiet.contains(id))
            .count();
        drop(quiet);
        let in_flight = busy + self.net.tunnels();
        if in_flight > 0 {
            self.activity.touch();
        }
        self.activity.idle_for(in_flight)
    }

    pub async fn ping(&self) -> Result<(), AgentError> {
        let (id, mut rx) = self.route();
        self.send(&HostMsg::Ping { id }).await?;
        let r = rx.recv().await;
        self.unroute(id);
        match r {
            Some(AgentMsg::Pong { .. }) => Ok(()),
            Some(other) => Err(AgentError::Unexpected(format!("{other:?}"))),
            None => Err(AgentError::Disconnected),
        }
    }

    /// Sends the request `msg(id)` makes and waits for the agent's `Done` (or its error).
    async fn until_done(&self, msg: impl FnOnce(u32) -> HostMsg) -> Result<(), AgentError> {
        let (id, mut rx) = self.route();
        let sent = self.send(&msg(id)).await;
        let r = match sent {
            Ok(()) => rx.recv().await,
            Err(e) => {
                self.unroute(id);
                return Err(e);
            }
        };
        self.unroute(id);
        match r {
            Some(AgentMsg::Done { .. }) => Ok(()),
            Some(AgentMsg::Error { kind, message, .. }) => {
                Err(AgentError::Refused { kind, message })
            }
            Some(other) => Err(AgentError::Unexpected(format!("{other:?}"))),
            None => Err(AgentError::Disconnected),
        }
    }

    /// Makes a restored copy its own machine (see [`HostMsg::Refresh`]); returns once the
    /// guest has applied it.
    pub async fn refresh(&self, refresh: forkbox_protocol::Refresh) -> Result<(), AgentError> {
        self.until_done(|id| HostMsg::Refresh { id, refresh }).await
    }

    /// Mounts volumes in the guest (see [`HostMsg::Mount`]).
    pub async fn mount(&self, mounts: Vec<forkbox_protocol::GuestMount>) -> Result<(), AgentError> {
        self.until_done(|id| HostMsg::Mount { id, mounts }).await
    }

    /// Unmounts volumes in the guest (see [`HostMsg::Unmount`]).
    pub async fn unmount(&self, paths: Vec<String>) -> Result<(), AgentError> {
        self.until_done(|id| HostMsg::Unmount { id, paths }).await
    }

    /// Applies a network policy: the host opens tunnels by it from now on, and the guest's
    /// proxy is started if the policy lets anything through.
    pub async fn set_network(&self, policy: crate::net::NetworkPolicy) -> Result<(), AgentError> {
        let on = !policy.is_off();
        self.net.set_policy(policy);
        if !on {
            return Ok(());
        }
        self.until_done(|id| HostMsg::NetUp {
            id,
            port: crate::net::PROXY_PORT,
        })
        .await
    }

    /// Starts a command; read its events from the returned [`Execution`].
    pub async fn exec(&self, spec: ExecSpec) -> Result<Execution, AgentError> {
        let (id, rx) = self.route();
        if let Err(e) = self.send(&HostMsg::Exec { id, spec }).await {
            self.unroute(id);
            return Err(e);
        }
        Ok(Execution {
            id,
            rx,
            client: self.clone(),
            done: false,
        })
    }

    /// Runs a command to completion and collects its output.
    pub async fn run(&self, spec: ExecSpec) -> Result<Output, AgentError> {
        let mut ex = self.exec(spec).await?;
        let mut out = Output::default();
        while !out.absorb(ex.next().await?) {}
        Ok(out)
    }

    pub async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<(), AgentError> {
        let (id, mut rx) = self.route();
        let chunks: Vec<&[u8]> = if data.is_empty() {
            vec![&[]]
        } else {
            data.chunks(CHUNK).collect()
        };
        let n = chunks.len();
        let result = async {
            for (i, c) in chunks.into_iter().enumerate() {
                self.send(&HostMsg::WriteFile {
                    id,
                    path: path.into(),
                    mode,
                    append: i > 0,
                    data: c.to_vec(),
                    last: i + 1 == n,
                })
                .await?;
            }
            match rx.recv().await {
                Some(AgentMsg::Done { .. }) => Ok(()),
                Some(AgentMsg::Error { kind, message, .. }) => {
                    Err(AgentError::Refused { kind, message })
                }
                Some(other) => Err(AgentError::Unexpected(format!("{other:?}"))),
                None => Err(AgentError::Disconnected),
            }
        }
        .await;
        self.unroute(id);
        result
    }

    /// Reads one file of the guest, refusing it past [`MAX_READ_FILE`] bytes (a guest's
    /// `/dev/zero` must not fill the host's memory; larger files go as archives).
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, AgentError> {
        let (id, mut rx) = self.route();
        self.send(&HostMsg::ReadFile {
            id,
            path: path.into(),
        })
        .await?;
        let mut data = Vec::new();
        let result = loop {
            match rx.recv().await {
                Some(AgentMsg::FileData { data: d, .. }) => {
                    if data.len() + d.len() > MAX_READ_FILE {
                        break Err(AgentError::Refused {
                            kind: forkbox_protocol::ErrorKind::InvalidRequest,
                            message: format!(
                                "{path} is larger than {} MiB; download it as an archive",
                                MAX_READ_FILE >> 20
                            ),
                        });
                    }
                    data.extend_from_slice(&d)
                }
                Some(AgentMsg::Done { .. }) => break Ok(data),
                Some(AgentMsg::Error { kind, message, .. }) => {
                    break Err(AgentError::Refused { kind, message })
                }
                Some(other) => break Err(AgentError::Unexpected(format!("{other:?}"))),
                None => break Err(AgentError::Disconnected),
            }
        };
        self.unroute(id);
        result
    }
}

async fn read_loop(
    mut rd: OwnedReadHalf,
    mut dec: FrameDecoder,
    (routes, strays): (Routes, Arc<Mutex<Strays>>),
    net: Arc<crate::net::HostNet>,
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    failure: Failure,
) {
    let broken = read_frames(&mut rd, &mut dec, (&routes, &strays), &net).await;
    if let Some(why) = broken {
        // Bounded: `why` quotes nothing the guest chose beyond a decoder's message.
        tracing::warn!(
            "{}: the guest agent broke the protocol ({why}); the host stops talking to it and marks the sandbox failed",
            net.name()
        );
        mark_failed(
            &routes,
            &failure,
            format!("its guest broke the agent protocol ({why})"),
        );
        let _ = writer.lock().await.shutdown().await;
    }
    // Dropping every sender tells each waiting request that the agent is gone.
    lock(&routes).clear();
    net.close_all();
}

/// Records why the connection failed, under the routes' lock so that no request is routed
/// after it (see [`AgentClient::route`]), and fails the requests waiting.
fn mark_failed(routes: &Routes, failure: &Failure, why: String) {
    let mut r = lock(routes);
    *lock(failure) = Some(why);
    r.clear();
}

/// Reads frames and hands them on until the connection ends (`None`) or the guest breaks
/// the protocol (why).
async fn read_frames(
    rd: &mut OwnedReadHalf,
    dec: &mut FrameDecoder,
    (routes, strays): (&Routes, &Mutex<Strays>),
    net: &Arc<crate::net::HostNet>,
) -> Option<String> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        // Frames already buffered (read together with the hello) go first.
        loop {
            let payload = match dec.next_frame() {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => return Some(format!("a bad frame: {e}")),
            };
            if payload.starts_with(&MAGIC) {
                continue; // an answer to a re-sent hello
            }
            let msg = match decode::<AgentMsg>(&payload) {
                Ok(m) => m,
                Err(e) => return Some(format!("an undecodable message: {e}")),
            };
            if msg.tunnel().is_some() {
                if let Err(why) = net.on_agent(msg).await {
                    return Some(why);
                }
                continue;
            }
            let tx = match lock(routes).get(&msg.id()) {
                Some(tx) => tx.clone(),
                // Kept under the routes' lock: an adoption takes them with its route.
                None => {
                    lock(strays).keep(msg, payload.len());
                    continue;
                }
            };
            // Waiting here slows the guest down (backpressure) rather than buffering without bound.
            let _ = tx.send(msg).await;
        }
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => dec.push(&buf[..n]),
        }
    }
}

/// A running command.
pub struct Execution {
    pub id: u32,
    rx: mpsc::Receiver<AgentMsg>,
    client: AgentClient,
    done: bool,
}

impl Execution {
    /// The next event; after `Exited`, further calls fail.
    pub async fn next(&mut self) -> Result<ExecEvent, AgentError> {
        if self.done {
            return Err(AgentError::Unexpected("the command already exited".into()));
        }
        match self.rx.recv().await {
            Some(AgentMsg::Started { pid, .. }) => Ok(ExecEvent::Started { pid }),
            Some(AgentMsg::Stdout { data, .. }) => Ok(ExecEvent::Stdout(data)),
            Some(AgentMsg::Stderr { data, .. }) => Ok(ExecEvent::Stderr(data)),
            Some(AgentMsg::Exited {
                status,
                timed_out,
                duration_ms,
                ..
            }) => {
                self.done = true;
                self.client.unroute(self.id);
                Ok(ExecEvent::Exited {
                    status,
                    timed_out,
                    duration_ms,
                })
            }
            Some(AgentMsg::Error { kind, message, .. }) => {
                self.done = true;
                self.client.unroute(self.id);
                Err(AgentError::Refused { kind, message })
            }
            Some(other) => Err(AgentError::Unexpected(format!("{other:?}"))),
            None => {
                self.done = true;
                Err(AgentError::Disconnected)
            }
        }
    }

    pub async fn stdin(&self, data: Vec<u8>) -> Result<(), AgentError> {
        for c in data.chunks(CHUNK) {
            self.client
                .send(&HostMsg::Stdin {
                    id: self.id,
                    data: c.to_vec(),
                })
                .await?;
        }
        Ok(())
    }

    pub async fn close_stdin(&self) -> Result<(), AgentError> {
        self.client.send(&HostMsg::StdinClose { id: self.id }).await
    }

    /// Why the host stopped talking to this guest, if it did.
    pub fn failure(&self) -> Option<String> {
        self.client.failure()
    }

    pub async fn signal(&self, signal: i32) -> Result<(), AgentError> {
        self.client
            .send(&HostMsg::Signal {
                id: self.id,
                signal,
            })
            .await
    }

    pub async fn resize(&self, size: forkbox_protocol::WinSize) -> Result<(), AgentError> {
        self.client
            .send(&HostMsg::Resize { id: self.id, size })
            .await
    }
}

impl Drop for Execution {
    fn drop(&mut self) {
        self.client.unroute(self.id);
    }
}

/// Where a connection's request ids start: anywhere in the lower half of the id space, so a
/// new connection's ids do not meet those of commands a guest still runs from an earlier one
/// (a copy restored from a snapshot, a daemon restarted; the agent keeps its commands by id).
fn first_request_id() -> u32 {
    let mut b = [0u8; 4];
    if let Err(e) = crate::random::fill(&mut b) {
        tracing::warn!("agent request ids start at 1: {e}");
        return 1;
    }
    (u32::from_le_bytes(b) >> 1).max(1)
}
