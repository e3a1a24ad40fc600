//! Network policy, enforced on the host. A sandbox never has a network device; with a policy
//! other than off, the guest agent runs an HTTP proxy on 127.0.0.1:3128 (programs find it in
//! `HTTP_PROXY`/`HTTPS_PROXY`) and each connection a program makes through it arrives here as a
//! tunnel request for a host name and port. This side decides: the name must be allowed, it
//! is resolved here (the guest has no resolver to trick), and an address is used only if it
//! is not the host itself, loopback, link-local (169.254.0.0/16 with the cloud metadata
//! address, fe80::/10), multicast or unspecified; the connection goes to exactly that
//! address, so a name cannot be re-resolved elsewhere in between.

use super::handshakes::Turn;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use forkbox_protocol::{encode_frame, HostMsg, HOST_TUNNEL, TUNNEL_WINDOW};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot, Semaphore};

pub use forkbox_api::{check_allow_entry, NetworkPolicy, PolicyError};

mod carry;
mod reach;
pub use carry::READ_NOTHING;
use carry::*;
pub use reach::*;

/// Tunnels a guest may have open (or waiting to open) at once; more are refused (not a
/// violation: a program may open many connections). `npm ci` asks for every package's
/// metadata at once.
pub const MAX_TUNNELS: usize = 512;
/// Tunnels being resolved and connected at once; more wait for their turn.
pub const MAX_PENDING_OPENS: usize = 16;
/// Protocol violations (data past the window or before a tunnel is ready, acknowledgements of
/// bytes never sent, a tunnel opened twice, replies left unread) a guest may commit; the next
/// one ends the host's connection to it and the sandbox is marked failed.
pub const MAX_VIOLATIONS: u32 = 8;
/// Longest host name a tunnel may ask for (DNS's own limit).
pub const MAX_HOST_LEN: usize = 253;
/// Frames queued for the guest. A request whose reply finds it full waits while the guest
/// takes frames from it (see [`HostNet::reply`]).
const OUTBOX: usize = 1024;
/// How long the queue back may stay full with the guest taking nothing from it before a
/// reply waiting for room is a violation (the guest floods requests and reads no replies).
const READ_STALL: Duration = Duration::from_secs(5);
/// Tunnels the guest was told are closed, remembered so that it is told once: a guest still
/// sending on one (its data was queued before it learned) gets no more replies. Forgotten all
/// at once past this many (then told again, once each).
const TOLD_CLOSED: usize = 4096;

/// One tunnel's host side.
struct Open {
    /// Guest → remote. Unbounded as a channel, bounded in bytes: `unacked` may never pass
    /// [`TUNNEL_WINDOW`].
    to_remote: mpsc::UnboundedSender<Option<Vec<u8>>>,
    /// Bytes the guest sent that are not yet written to the remote.
    unacked: Arc<AtomicUsize>,
    /// Remote → guest: bytes the host may still send before the guest acknowledges some.
    credit: Arc<Semaphore>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Which ends have finished sending (the guest's program, the remote): once both have,
    /// the tunnel is over and is forgotten, so that it counts no more against
    /// [`MAX_TUNNELS`] (a guest that never says `TunnelClose` after a clean end cannot
    /// fill the table with finished tunnels).
    guest_done: bool,
    remote_done: bool,
}

/// The two ends of a tunnel.
enum End {
    /// The guest's program.
    Guest,
    /// What it connected to.
    Remote,
}

enum Slot {
    /// Being resolved and connected.
    Pending,
    Open(Open),
}

/// The tunnels of one sandbox's agent connection, and the policy that opens them. Everything
/// a guest sends here is bounded before it costs the host: tunnels open and pending, bytes in
/// flight per tunnel (the window, enforced), frames queued back, log lines.
pub struct HostNet {
    policy: RwLock<NetworkPolicy>,
    open: Mutex<HashMap<u32, Slot>>,
    pending: Arc<Semaphore>,
    /// Turns for new connections' first round trips ([`super::handshakes`]).
    turns: Arc<super::handshakes::Turns>,
    outbox: mpsc::Sender<HostMsg>,
    /// Frames the guest has been sent so far: whether it reads at all.
    delivered: Arc<AtomicU64>,
    /// [`READ_STALL`] (shorter in unit tests).
    read_stall: Duration,
    /// How long a tunnel stays open while its guest takes none of what waits for it.
    read_nothing: Duration,
    /// When each tunnel's last data reached the agent's channel (the queue before it is
    /// shared: a tunnel's data may wait behind other tunnels').
    data_delivered: Arc<Mutex<HashMap<u32, std::time::Instant>>>,
    told_closed: Mutex<HashSet<u32>>,
    violations: AtomicU32,
    /// The sandbox's id, for log lines.
    name: OnceLock<String>,
    log: crate::guestlog::RateLimit,
    /// What the host decided about this sandbox's connections lately (its view shows them).
    notes: Mutex<std::collections::VecDeque<forkbox_api::NetworkNote>>,
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub refused: AtomicU64,
    /// Connections a remote ended before the guest answered it (see [`HostNet::say_cut_short`]).
    pub cut_short: AtomicU64,
    /// The sandbox's secrets and the listener their connections end at, when it has any.
    secrets: RwLock<Option<Arc<crate::secrets::SecretProxy>>>,
    /// The package cache its connections to registries go through, when there is one.
    packages: RwLock<Option<Arc<crate::packages::PackageCache>>>,
    /// Port forwards waiting for the agent's `ForwardReady`.
    forwards: Mutex<HashMap<u32, oneshot::Sender<Option<String>>>>,
    next_forward: AtomicU32,
}

type Writer = Arc<tokio::sync::Mutex<OwnedWriteHalf>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl HostNet {
    /// The tunnels of the agent connection whose write half is `w`: frames for the guest go
    /// through one bounded queue into it.
    pub fn new(w: Writer) -> HostNet {
        let (outbox, mut rx) = mpsc::channel::<HostMsg>(OUTBOX);
        let delivered = Arc::new(AtomicU64::new(0));
        let sent = delivered.clone();
        let data_delivered: Arc<Mutex<HashMap<u32, std::time::Instant>>> = Arc::default();
        let last_data = data_delivered.clone();
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                let Ok(frame) = encode_frame(&msg) else {
                    continue;
                };
                if w.lock().await.write_all(&frame).await.is_err() {
                    return;
                }
                sent.fetch_add(1, Ordering::Relaxed);
                if let HostMsg::TunnelData { tunnel, .. } = msg {
                    lock(&last_data).insert(tunnel, std::time::Instant::now());
                }
            }
        });
        HostNet {
            policy: RwLock::new(NetworkPolicy::default()),
            open: Mutex::new(HashMap::new()),
            pending: Arc::new(Semaphore::new(MAX_PENDING_OPENS)),
            turns: Arc::default(),
            outbox,
            delivered,
            read_stall: READ_STALL,
            read_nothing: read_nothing(),
            data_delivered,
            told_closed: Mutex::new(HashSet::new()),
            violations: AtomicU32::new(0),
            name: OnceLock::new(),
            log: Default::default(),
            notes: Mutex::new(std::collections::VecDeque::new()),
            bytes_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            cut_short: AtomicU64::new(0),
            secrets: RwLock::new(None),
            packages: RwLock::new(None),
            forwards: Mutex::new(HashMap::new()),
            next_forward: AtomicU32::new(0),
        }
    }

    /// Carries `stream` (a connection a host program made to a port forward's listener) to
    /// the guest's 127.0.0.1:`port`, as a tunnel the host opens: within [`MAX_TUNNELS`] and the
    /// windows, like the guest's own. A port nobody listens on in the guest ends `stream` at
    /// once with a reset (what a refused connection looks like), never a hang.
    pub async fn forward(
        self: &Arc<Self>,
        port: u16,
        stream: tokio::net::TcpStream,
    ) -> Result<(), String> {
        let refuse = |stream: tokio::net::TcpStream, why: String| {
            let _ = stream.set_zero_linger();
            drop(stream);
            Err(why)
        };
        let tunnel = {
            let mut open = lock(&self.open);
            if open.len() >= MAX_TUNNELS {
                drop(open);
                return refuse(stream, format!("{MAX_TUNNELS} tunnels are open already"));
            }
            let tunnel = loop {
                let n = self.next_forward.fetch_add(1, Ordering::Relaxed);
                let t = HOST_TUNNEL | (n & !HOST_TUNNEL);
                if !open.contains_key(&t) {
                    break t;
                }
            };
            open.insert(tunnel, Slot::Pending);
            tunnel
        };
        let (tx, rx) = oneshot::channel();
        lock(&self.forwards).insert(tunnel, tx);
        let forget = |net: &Self| {
            lock(&net.forwards).remove(&tunnel);
            if matches!(lock(&net.open).get(&tunnel), Some(Slot::Pending)) {
                lock(&net.open).remove(&tunnel);
            }
        };
        if self
            .outbox
            .send(HostMsg::ForwardOpen { tunnel, port })
            .await
            .is_err()
        {
            forget(self);
            return refuse(stream, "the sandbox's agent connection is gone".into());
        }
        match tokio::time::timeout(FORWARD_TIMEOUT, rx).await {
            Ok(Ok(None)) => {}
            Ok(Ok(Some(why))) => {
                forget(self);
                return refuse(stream, why);
            }
            _ => {
                forget(self);
                let _ = self.outbox.send(HostMsg::TunnelClose { tunnel }).await;
                return refuse(
                    stream,
                    format!(
                        "the guest's agent did not connect to port {port} within {} s",
                        FORWARD_TIMEOUT.as_secs()
                    ),
                );
            }
        }
        let addr = stream
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        self.clone()
            .carry(tunnel, addr, stream, Carry::Forward, None)
            .await;
        Ok(())
    }

    /// Gives this sandbox's connections to its secrets' hosts to `proxy` from now on (none:
    /// every connection is a plain tunnel again, and the placeholders are worth nothing).
    pub fn set_secrets(&self, proxy: Option<Arc<crate::secrets::SecretProxy>>) {
        *self.secrets.write().unwrap_or_else(|p| p.into_inner()) = proxy;
    }

    /// Sends this sandbox's connections to the registries `cache` covers through it from now
    /// on (none: tunnelled as any host's).
    pub fn set_packages(&self, cache: Option<Arc<crate::packages::PackageCache>>) {
        *self.packages.write().unwrap_or_else(|p| p.into_inner()) = cache;
    }

    /// The package cache in force.
    pub fn packages(&self) -> Option<Arc<crate::packages::PackageCache>> {
        self.packages
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Where the secrets' listener is, when the sandbox has secrets.
    pub fn secrets_listener(&self) -> Option<SocketAddr> {
        self.secrets
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|p| p.addr())
    }

    /// The secrets in force.
    pub fn secrets(&self) -> Option<Arc<crate::secrets::Secrets>> {
        self.secrets
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|p| p.secrets.clone())
    }

    /// Names the sandbox in this connection's log lines.
    pub fn set_name(&self, name: &str) {
        let _ = self.name.set(name.to_string());
    }

    pub(crate) fn name(&self) -> &str {
        self.name.get().map_or("sandbox", String::as_str)
    }

    /// What the tunnels carried and how many were refused, so far.
    pub fn counts(&self) -> crate::metrics::NetCounts {
        crate::metrics::NetCounts {
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            cut_short: self.cut_short.load(Ordering::Relaxed),
        }
    }

    /// Tunnels open or being opened now.
    pub fn tunnels(&self) -> usize {
        lock(&self.open).len()
    }

    pub fn set_policy(&self, p: NetworkPolicy) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = p;
    }

    pub fn policy(&self) -> NetworkPolicy {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Says `text` (about this sandbox's connections) in the daemon's log, rate-limited, and
    /// in the sandbox's network log (the last [`forkbox_api::NETWORK_LOG_LINES`]).
    fn say(&self, text: String) {
        crate::guest_info!(self.log, "{}: {text}", self.name());
        let at_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut notes = lock(&self.notes);
        if notes.len() >= forkbox_api::NETWORK_LOG_LINES {
            notes.pop_front();
        }
        notes.push_back(forkbox_api::NetworkNote { at_unix, text });
    }

    /// The sandbox's network log, oldest first.
    pub fn notes(&self) -> Vec<forkbox_api::NetworkNote> {
        lock(&self.notes).iter().cloned().collect()
    }

    /// Counts a violation; past [`MAX_VIOLATIONS`], the reason the connection must end.
    fn violation(&self, what: String) -> Result<(), String> {
        let n = self.violations.fetch_add(1, Ordering::Relaxed) + 1;
        self.say(format!(
            "the guest broke the tunnel protocol ({n} of {MAX_VIOLATIONS} allowed): {what}"
        ));
        if n > MAX_VIOLATIONS {
            return Err(format!(
                "the guest broke the tunnel protocol more than {MAX_VIOLATIONS} times (last: {what})"
            ));
        }
        Ok(())
    }

    /// Queues a reply to a request of the guest's. A full queue is waited on for as long as
    /// the guest takes frames from it: the host then reads nothing more from this guest, so a
    /// flood of requests from a guest that reads its replies slowly (one under emulation on a
    /// busy host) is slowed down, not cut off. A queue the guest takes nothing from for
    /// [`READ_STALL`] means it does not read the host's replies while it keeps sending
    /// requests: a violation, and the reply is dropped. (Counting every reply that found the
    /// queue full cut off a guest that was reading, only slower than it wrote.)
    async fn reply(&self, msg: HostMsg) -> Result<(), String> {
        use mpsc::error::{SendTimeoutError, TrySendError};
        let mut msg = match self.outbox.try_send(msg) {
            Ok(()) | Err(TrySendError::Closed(_)) => return Ok(()),
            Err(TrySendError::Full(m)) => m,
        };
        loop {
            let before = self.delivered.load(Ordering::Relaxed);
            match self.outbox.send_timeout(msg, self.read_stall).await {
                Ok(()) | Err(SendTimeoutError::Closed(_)) => return Ok(()),
                Err(SendTimeoutError::Timeout(m))
                    if self.delivered.load(Ordering::Relaxed) != before =>
                {
                    msg = m
                }
                Err(SendTimeoutError::Timeout(_)) => {
                    return self.violation(format!(
                        "it read none of the host's replies for {} s while it sent requests",
                        self.read_stall.as_secs_f64()
                    ))
                }
            }
        }
    }

    /// Handles one tunnel message from the agent; an error is why the host must stop talking
    /// to this guest.
    pub async fn on_agent(self: &Arc<Self>, msg: forkbox_protocol::AgentMsg) -> Result<(), String> {
        use forkbox_protocol::AgentMsg as A;
        match msg {
            A::TunnelOpen { tunnel, .. } if tunnel & HOST_TUNNEL != 0 => {
                self.violation(format!("tunnel {tunnel} opened with a host's number"))
            }
            A::TunnelOpen { tunnel, host, port } => self.request(tunnel, host, port).await,
            A::ForwardReady { tunnel, error } => {
                if let Some(tx) = lock(&self.forwards).remove(&tunnel) {
                    let _ = tx.send(error);
                }
                Ok(())
            }
            A::TunnelData { tunnel, data } => {
                self.bytes_out
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                let verdict = match lock(&self.open).get(&tunnel) {
                    // Closed meanwhile, or open in the snapshot this copy came from: the agent
                    // learns it is gone.
                    None => Ok(false),
                    Some(Slot::Pending) => Err("data on a tunnel that is not ready"),
                    Some(Slot::Open(o)) => {
                        let n = data.len();
                        if o.unacked.load(Ordering::Relaxed) + n > TUNNEL_WINDOW as usize {
                            Err("data past the flow-control window")
                        } else {
                            o.unacked.fetch_add(n, Ordering::Relaxed);
                            Ok(o.to_remote.send(Some(data)).is_ok())
                        }
                    }
                };
                match verdict {
                    Ok(true) => Ok(()),
                    // The remote side is gone, or the tunnel was.
                    Ok(false) => self.close(tunnel).await,
                    Err(why) => {
                        self.close(tunnel).await?;
                        self.violation(format!("tunnel {tunnel}: {why}"))
                    }
                }
            }
            A::TunnelEof { tunnel } => {
                self.end_of(tunnel, End::Guest);
                Ok(())
            }
            A::TunnelAck { tunnel, bytes } => {
                let over = match lock(&self.open).get(&tunnel) {
                    Some(Slot::Open(o)) => {
                        let ok =
                            o.credit.available_permits() + bytes as usize <= TUNNEL_WINDOW as usize;
                        if ok {
                            o.credit.add_permits(bytes as usize);
                        }
                        !ok
                    }
                    _ => false,
                };
                if over {
                    self.close(tunnel).await?;
                    return self.violation(format!(
                        "tunnel {tunnel}: acknowledged bytes it was never sent"
                    ));
                }
                Ok(())
            }
            A::TunnelClose { tunnel } => {
                self.forget(tunnel);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A tunnel request: refused at once when over a bound, else resolved and connected in a
    /// task of its own.
    async fn request(self: &Arc<Self>, tunnel: u32, host: String, port: u16) -> Result<(), String> {
        lock(&self.told_closed).remove(&tunnel);
        let refusal = {
            let mut open = lock(&self.open);
            if open.contains_key(&tunnel) {
                drop(open);
                return self.violation(format!("tunnel {tunnel} opened twice"));
            }
            if host.len() > MAX_HOST_LEN {
                Some(format!(
                    "a host name of {} bytes (the longest a name can be is {MAX_HOST_LEN})",
                    host.len()
                ))
            } else if open.len() >= MAX_TUNNELS {
                Some(format!(
                    "{MAX_TUNNELS} tunnels are open already; close some first"
                ))
            } else {
                // Opens beyond MAX_PENDING_OPENS wait their turn (a package manager opens
                // dozens at once; refusing them failed `npm ci`), within MAX_TUNNELS.
                open.insert(tunnel, Slot::Pending);
                let net = self.clone();
                let pending = self.pending.clone();
                tokio::spawn(async move {
                    // Its turn first: the remote is connected when the guest can answer it.
                    let turn = Turn::take(&net.turns).await;
                    let Ok(permit) = pending.acquire_owned().await else {
                        return;
                    };
                    net.open(tunnel, host, port, turn).await;
                    drop(permit);
                });
                return Ok(());
            }
        };
        match refusal {
            None => Ok(()),
            Some(why) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.say(format!(
                    "tunnel to {}:{port} refused: {why}",
                    crate::guestlog::quote(&host)
                ));
                self.reply(HostMsg::TunnelReady {
                    tunnel,
                    error: Some(why),
                })
                .await
            }
        }
    }

    /// Ends a tunnel from this side: forgets it and tells the guest.
    async fn close(&self, tunnel: u32) -> Result<(), String> {
        self.forget(tunnel);
        self.tell_closed(tunnel).await
    }

    /// Tells the guest that `tunnel` is closed, once: the frames it sent on it before it
    /// learned (a window's worth of data, say) get no reply each, or a guest that writes
    /// faster than it reads would fill the host's queue and be cut off for it.
    async fn tell_closed(&self, tunnel: u32) -> Result<(), String> {
        match self.first_close(tunnel) {
            true => self.reply(HostMsg::TunnelClose { tunnel }).await,
            false => Ok(()),
        }
    }

    /// Whether the guest is yet to be told that `tunnel` is closed (it counts as told now).
    fn first_close(&self, tunnel: u32) -> bool {
        let mut told = lock(&self.told_closed);
        if told.len() >= TOLD_CLOSED {
            told.clear();
        }
        told.insert(tunnel)
    }

    /// The remote end of `tunnel` failed (a reset, a write that could not go): the tunnel is
    /// over. The guest is told (once; this waits for room in the queue back rather than count
    /// a full one against the guest), and the tunnel forgotten with its other task, so that it
    /// no longer counts against [`MAX_TUNNELS`]. (It was only told: the guest's end of data
    /// that followed never met a remote end, and 512 such tunnels refused every new one.)
    async fn remote_failed(&self, tunnel: u32, e: &std::io::Error) {
        tracing::debug!(
            "{}: tunnel {tunnel}: the remote end failed: {e}",
            self.name()
        );
        if self.first_close(tunnel) {
            let _ = self.outbox.send(HostMsg::TunnelClose { tunnel }).await;
        }
        // Last: this aborts the calling task too, at its next await.
        self.forget(tunnel);
    }

    /// One end of a tunnel has finished sending (the guest's end is passed on to the remote).
    /// Once both have, the tunnel is forgotten; the guest's last bytes are still written to
    /// the remote (its writer task ends by itself on the guest's end of data).
    fn end_of(&self, tunnel: u32, end: End) {
        let mut open = lock(&self.open);
        let Some(Slot::Open(o)) = open.get_mut(&tunnel) else {
            return;
        };
        match end {
            End::Guest => {
                let _ = o.to_remote.send(None);
                o.guest_done = true;
            }
            End::Remote => o.remote_done = true,
        }
        if o.guest_done && o.remote_done {
            if let Some(Slot::Open(o)) = open.remove(&tunnel) {
                o.credit.close();
            }
        }
    }

    fn forget(&self, tunnel: u32) {
        lock(&self.data_delivered).remove(&tunnel);
        if let Some(Slot::Open(o)) = lock(&self.open).remove(&tunnel) {
            o.credit.close();
            for t in o.tasks {
                t.abort();
            }
        }
    }

    /// Every tunnel ends (the VM is going away).
    pub fn close_all(&self) {
        let all: Vec<u32> = lock(&self.open).keys().copied().collect();
        for t in all {
            self.forget(t);
        }
    }

    async fn open(self: Arc<Self>, tunnel: u32, host: String, port: u16, turn: Arc<Turn>) {
        let refuse = |why: String| async {
            if matches!(lock(&self.open).get(&tunnel), Some(Slot::Pending)) {
                lock(&self.open).remove(&tunnel);
            }
            let _ = self
                .outbox
                .send(HostMsg::TunnelReady {
                    tunnel,
                    error: Some(why),
                })
                .await;
        };
        let policy = self.policy();
        let addr = match resolve(&policy, &host, port).await {
            Ok(a) => a,
            Err(why) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                self.say(format!(
                    "tunnel to {}:{port} refused: {}",
                    crate::guestlog::quote(&host),
                    crate::guestlog::quote(&why)
                ));
                return refuse(why).await;
            }
        };
        let opening = Some(Opening {
            turn,
            target: format!("{host}:{port}"),
        });
        // A connection a secret may go into ends at the sandbox's secret listener instead.
        let proxy = self
            .secrets
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .filter(|p| p.secrets.scoped(&host, port));
        let target = crate::intercept::Target {
            host: host.clone(),
            port,
            addr,
            sandbox: self.name().to_string(),
        };
        if let Some(proxy) = proxy {
            return match proxy.connect(target).await {
                Ok(s) => {
                    self.carry(tunnel, addr, s, Carry::Intercepted, opening)
                        .await
                }
                Err(e) => refuse(format!("{host}:{port}: the secrets' listener: {e}")).await,
            };
        }
        // A registry's ends at the package cache, which never waits for the guest: the turn
        // is given back at once.
        if let Some(cache) = self.packages().filter(|c| c.covers(&host, port)) {
            drop(opening);
            return match cache.connect(target).await {
                Ok(s) => self.carry(tunnel, addr, s, Carry::Intercepted, None).await,
                Err(e) => refuse(format!("{host}:{port}: the package cache: {e}")).await,
            };
        }
        let stream =
            match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return refuse(format!("{host}:{port} ({addr}): {e}")).await,
                Err(_) => {
                    return refuse(format!("{host}:{port} ({addr}): connection timed out")).await
                }
            };
        self.carry(tunnel, addr, stream, Carry::Remote, opening)
            .await;
    }
}

/// How long the agent may take to connect a port forward in the guest.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);

#[cfg(test)]
mod tests;
