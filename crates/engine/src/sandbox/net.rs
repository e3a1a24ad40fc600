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
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use forkbox_protocol::{encode_frame, HostMsg, HOST_TUNNEL, TUNNEL_WINDOW};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot, Semaphore};

pub use forkbox_api::{check_allow_entry, NetworkPolicy, PolicyError};

/// Where the guest's proxy listens.
pub const PROXY_PORT: u16 = 3128;

/// The host's CA bundle, if it has one where Debian, Fedora or `SSL_CERT_FILE` put it; looked
/// for once per process (every command of a sandbox with a network asks).
pub fn host_ca_bundle() -> Option<&'static std::path::Path> {
    static FOUND: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            std::env::var_os("SSL_CERT_FILE")
                .map(std::path::PathBuf::from)
                .into_iter()
                .chain([
                    std::path::PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
                    std::path::PathBuf::from("/etc/pki/tls/certs/ca-bundle.crt"),
                ])
                .find(|p| p.is_file())
        })
        .as_deref()
}

/// Where a sandbox with network keeps the host's CA bundle (public certificates: a host
/// behind a TLS-inspecting proxy reaches registries through it, and so must its guests).
pub const GUEST_CA: &str = "/run/forkbox-host-ca.crt";

/// The variables that point TLS clients (OpenSSL, Python, pip, curl, git, Node, npm) at a CA
/// bundle.
pub const CA_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "npm_config_cafile",
];

/// Cloud metadata and platform services outside the link-local ranges: Alibaba Cloud's
/// 100.100.100.200, Azure's wire server 168.63.129.16, AWS's IPv6 metadata fd00:ec2::254 and
/// its DNS fd00:ec2::253, Oracle Cloud's 192.0.0.192. (169.254.169.254 and fe80::/10, where
/// AWS, GCP, Azure, DigitalOcean and OpenStack answer, are link-local and refused as such.)
pub const METADATA: &[IpAddr] = &[
    IpAddr::V4(std::net::Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(std::net::Ipv4Addr::new(168, 63, 129, 16)),
    IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 0, 192)),
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x253)),
];

/// Addresses a sandbox may never reach, whatever its policy: the host's own, loopback,
/// link-local (with 169.254.169.254), cloud metadata ([`METADATA`]), multicast, unspecified,
/// broadcast; an IPv4 address written as IPv6 (mapped or NAT64 `64:ff9b::/96`) counts as itself.
pub fn never_reachable(ip: IpAddr, host_addrs: &[IpAddr]) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                    let o = v6.octets();
                    IpAddr::V4(std::net::Ipv4Addr::new(o[12], o[13], o[14], o[15]))
                } else {
                    ip
                }
            }
        },
        v4 => v4,
    };
    if host_addrs.contains(&ip)
        || METADATA.contains(&ip)
        || ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
    {
        return true;
    }
    match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast() || v4.octets()[0] == 0,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The addresses of this host's interfaces.
fn host_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| {
            let s = a.address?;
            if let Some(v4) = s.as_sockaddr_in() {
                return Some(IpAddr::V4(v4.ip()));
            }
            s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
        })
        .collect()
}

/// How long a name's addresses are kept: a package manager opens a connection per package,
/// and a resolver asked for one name a hundred times at once drops some of the questions.
const RESOLVED_FOR: Duration = Duration::from_secs(30);

type Resolved = std::collections::HashMap<(String, u16), (std::time::Instant, Vec<SocketAddr>)>;

/// `host:port`'s addresses: asked once at a time per name, and kept for [`RESOLVED_FOR`].
async fn lookup(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    use std::sync::{LazyLock, Mutex};
    static KEPT: LazyLock<Mutex<Resolved>> = LazyLock::new(Default::default);
    type Asking = std::collections::HashMap<(String, u16), std::sync::Arc<tokio::sync::Mutex<()>>>;
    static ASKING: LazyLock<Mutex<Asking>> = LazyLock::new(Default::default);
    let key = (host.to_ascii_lowercase(), port);
    let kept = || {
        let mut map = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (at, _)| at.elapsed() < RESOLVED_FOR);
        map.get(&key).map(|(_, a)| a.clone())
    };
    if let Some(a) = kept() {
        return Ok(a);
    }
    // One question per name at a time (other names are not held up): whoever waited finds
    // the answer kept.
    let gate = {
        let mut map = ASKING.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, g| std::sync::Arc::strong_count(g) > 1);
        map.entry(key.clone()).or_default().clone()
    };
    let _asking = gate.lock().await;
    if let Some(a) = kept() {
        return Ok(a);
    }
    let found: Vec<SocketAddr> = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::lookup_host((host, port)),
    )
    .await
    .map_err(|_| format!("resolving {host} timed out"))?
    .map_err(|e| format!("cannot resolve {host}: {e}"))?
    .collect();
    KEPT.lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, (std::time::Instant::now(), found.clone()));
    Ok(found)
}

/// Decides a tunnel request: the address to connect to, or why not.
pub async fn resolve(policy: &NetworkPolicy, host: &str, port: u16) -> Result<SocketAddr, String> {
    policy.permits_name(host, port)?;
    let found = lookup(host, port).await?;
    let own = host_addresses();
    let mut refused = Vec::new();
    for a in found {
        if never_reachable(a.ip(), &own) {
            refused.push(a.ip().to_string());
        } else {
            return Ok(a);
        }
    }
    Err(format!(
        "{host} resolves only to addresses a sandbox may never reach (the host itself, loopback, link-local, cloud metadata): {}",
        refused.join(", ")
    ))
}

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
    told_closed: Mutex<HashSet<u32>>,
    violations: AtomicU32,
    /// The sandbox's id, for log lines.
    name: OnceLock<String>,
    log: crate::guestlog::RateLimit,
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub refused: AtomicU64,
    /// Connections a remote ended before the guest answered it (see [`HostNet::say_cut_short`]).
    pub cut_short: AtomicU64,
    /// The sandbox's secrets and the listener their connections end at, when it has any.
    secrets: RwLock<Option<Arc<crate::secrets::SecretProxy>>>,
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
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                let Ok(frame) = encode_frame(&msg) else {
                    continue;
                };
                if w.lock().await.write_all(&frame).await.is_err() {
                    return;
                }
                sent.fetch_add(1, Ordering::Relaxed);
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
            told_closed: Mutex::new(HashSet::new()),
            violations: AtomicU32::new(0),
            name: OnceLock::new(),
            log: Default::default(),
            bytes_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            cut_short: AtomicU64::new(0),
            secrets: RwLock::new(None),
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

    /// Counts a violation; past [`MAX_VIOLATIONS`], the reason the connection must end.
    fn violation(&self, what: String) -> Result<(), String> {
        let n = self.violations.fetch_add(1, Ordering::Relaxed) + 1;
        crate::guest_info!(
            self.log,
            "{}: the guest broke the tunnel protocol ({n} of {MAX_VIOLATIONS} allowed): {what}",
            self.name()
        );
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
                crate::guest_info!(
                    self.log,
                    "{}: tunnel to {}:{port} refused: {why}",
                    self.name(),
                    crate::guestlog::quote(&host)
                );
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
                crate::guest_info!(
                    self.log,
                    "{}: tunnel to {}:{port} refused: {}",
                    self.name(),
                    crate::guestlog::quote(&host),
                    crate::guestlog::quote(&why)
                );
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
        if let Some(proxy) = proxy {
            let target = crate::secrets::Target {
                host: host.clone(),
                port,
                addr,
                sandbox: self.name().to_string(),
            };
            return match proxy.connect(target).await {
                Ok(s) => self.carry(tunnel, addr, s, Carry::Secrets, opening).await,
                Err(e) => refuse(format!("{host}:{port}: the secrets' listener: {e}")).await,
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

    /// Carries tunnel `tunnel` (pending) over `stream`, connected to its remote at `addr`:
    /// tells the guest it is ready, then copies both ways within the windows.
    ///
    /// The remote is connected when the guest asks, so that a refusal or an unreachable
    /// remote is said before the guest's program is told "connected". A guest under emulation
    /// on a busy host can then take seconds to send its first bytes, and some servers reset a
    /// connection that has said nothing for a few seconds (the npm registry here: a TLS
    /// ClientHello 10 s after connecting is reset, 5 s is not). So when the guest's first
    /// bytes come more than [`FRESH_FOR`] after the connect, and the remote has said nothing,
    /// they go over a new connection to the same address (the old one closed unused); a
    /// server that speaks first (SSH, SMTP) has spoken by then and keeps its connection.
    /// Only a remote's connection is swapped so: the secrets' listener waits as long as the
    /// guest takes, and a port forward's connection is a host program's.
    async fn carry(
        self: Arc<Self>,
        tunnel: u32,
        addr: SocketAddr,
        stream: tokio::net::TcpStream,
        kind: Carry,
        opening: Option<Opening>,
    ) {
        let may_swap = kind == Carry::Remote;
        let connected = std::time::Instant::now();
        let (rd, wr) = stream.into_split();
        let (swap_tx, swap_rx) = oneshot::channel::<Swap>();
        let quiet_end = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = mpsc::unbounded_channel::<Option<Vec<u8>>>();
        let credit = Arc::new(Semaphore::new(TUNNEL_WINDOW as usize));
        let unacked = Arc::new(AtomicUsize::new(0));
        {
            let mut open = lock(&self.open);
            // The guest may have closed it meanwhile.
            let Some(slot) = open.get_mut(&tunnel) else {
                return;
            };
            *slot = Slot::Open(Open {
                to_remote: tx,
                unacked: unacked.clone(),
                credit: credit.clone(),
                tasks: Vec::new(),
                guest_done: false,
                remote_done: false,
            });
        }
        // Ready goes into the queue before any data of this tunnel can (a forward's tunnel
        // the agent opened itself).
        if kind != Carry::Forward
            && self
                .outbox
                .send(HostMsg::TunnelReady {
                    tunnel,
                    error: None,
                })
                .await
                .is_err()
        {
            return;
        }
        let down = tokio::spawn(self.clone().remote_to_guest(Down {
            tunnel,
            rd,
            swap_rx,
            quiet_end: quiet_end.clone(),
            credit,
            opening: opening.clone(),
        }));
        let up = tokio::spawn(self.clone().guest_to_remote(Up {
            tunnel,
            addr,
            connected,
            wr,
            rx,
            swap_tx,
            quiet_end,
            unacked,
            may_swap,
            turn: opening.map(|o| o.turn),
        }));
        match lock(&self.open).get_mut(&tunnel) {
            Some(Slot::Open(o)) => o.tasks.extend([down, up]),
            _ => {
                down.abort();
                up.abort();
            }
        }
    }

    /// Remote -> guest, within the agent's acknowledgements. Until the remote or the guest
    /// has said something, a fresh connection offered by [`Self::guest_to_remote`] may take
    /// the old one's place.
    async fn remote_to_guest(self: Arc<Self>, d: Down) {
        let Down {
            tunnel,
            mut rd,
            mut swap_rx,
            quiet_end,
            credit,
            opening,
        } = d;
        let mut buf = vec![0u8; 64 * 1024];
        let mut waiting_swap = true;
        let started = std::time::Instant::now();
        let mut got = 0u64;
        let mut last_sent = started;
        loop {
            let read = tokio::select! {
                biased;
                swap = &mut swap_rx, if waiting_swap => {
                    waiting_swap = false;
                    // Nothing was read from the old connection (the first read
                    // ends the offer): the new one takes its place.
                    if let Ok(swap) = swap {
                        take_swap(&mut rd, swap);
                    }
                    continue;
                }
                r = rd.read(&mut buf) => r,
            };
            if waiting_swap {
                waiting_swap = false;
                if !matches!(read, Ok(n) if n > 0) {
                    // Ended or reset before either side said anything (a server
                    // tired of waiting): the guest's first bytes will go over a new
                    // connection; if it sends none, this end is reported as it was.
                    quiet_end.store(true, Ordering::SeqCst);
                    if let Ok(swap) = (&mut swap_rx).await {
                        take_swap(&mut rd, swap);
                        continue;
                    }
                }
                // The remote has spoken, or no new connection came: this one stays.
                swap_rx.close();
            }
            if matches!(read, Ok(0) | Err(_)) {
                let quiet = last_sent.elapsed();
                self.say_cut_short(opening.as_ref(), &read, (started, quiet), got);
            }
            let n = match read {
                Ok(0) => {
                    let _ = self.outbox.send(HostMsg::TunnelEof { tunnel }).await;
                    self.end_of(tunnel, End::Remote);
                    return;
                }
                Ok(n) => n,
                Err(e) => return self.remote_failed(tunnel, &e).await,
            };
            match credit.acquire_many(n as u32).await {
                Ok(p) => p.forget(),
                Err(_) => return,
            }
            self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
            got += n as u64;
            last_sent = std::time::Instant::now();
            if let Some(o) = &opening {
                o.turn.remote_spoke();
            }
            let data = buf[..n].to_vec();
            if self
                .outbox
                .send(HostMsg::TunnelData { tunnel, data })
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Says in the log (rate-limited) when a remote ends a guest's connection that has not
    /// answered the remote's first bytes, after waiting for it ([`CUT_AFTER`] or more since
    /// its last bytes): a server that gave up on a slow guest (a TLS handshake not finished in
    /// the server's time), which the guest's program reports only as a reset connection. (A
    /// server that answers and closes at once, plain HTTP's way, waited for nothing.)
    fn say_cut_short(
        &self,
        opening: Option<&Opening>,
        read: &std::io::Result<usize>,
        (started, quiet): (std::time::Instant, Duration),
        got: u64,
    ) {
        let Some(o) = opening else { return };
        let Some(waited) = o.turn.unanswered_for() else {
            return;
        };
        if quiet < CUT_AFTER {
            return;
        }
        o.turn.cut_short();
        self.cut_short.fetch_add(1, Ordering::Relaxed);
        let how = match read {
            Err(e) => format!("reset it ({e})"),
            _ => "closed it".to_string(),
        };
        crate::guest_info!(
            self.log,
            "{}: {} {how} {:.1} s after its first answer, which the guest had not answered \
             ({got} bytes sent to the guest, {:.1} s after the connect): the remote's time for \
             a reply ran out (a guest too slow for it; a program that sees the connection \
             reset retries)",
            self.name(),
            crate::guestlog::quote(&o.target),
            waited.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
    }

    /// Guest -> remote, acknowledged as written. The guest's first bytes go over a fresh
    /// connection when they come late (see [`Self::carry`]).
    async fn guest_to_remote(self: Arc<Self>, u: Up) {
        let Up {
            tunnel,
            addr,
            connected,
            mut wr,
            mut rx,
            swap_tx,
            quiet_end,
            unacked,
            may_swap,
            turn,
        } = u;
        let mut swap_tx = Some(swap_tx);
        while let Some(m) = rx.recv().await {
            if let Some(offer) = swap_tx.take_if(|_| m.is_some()) {
                let late = connected.elapsed() >= FRESH_FOR || quiet_end.load(Ordering::SeqCst);
                if may_swap && late {
                    if let Some(new_wr) = reconnect(addr, offer).await {
                        tracing::debug!(
                            "{}: tunnel {tunnel}: the guest's first bytes came {} ms after the connect: sent over a new connection",
                            self.name(),
                            connected.elapsed().as_millis()
                        );
                        wr = new_wr;
                    }
                }
            }
            match m {
                Some(d) => {
                    if let Some(t) = &turn {
                        t.guest_spoke();
                    }
                    if let Err(e) = wr.write_all(&d).await {
                        return self.remote_failed(tunnel, &e).await;
                    }
                    unacked.fetch_sub(d.len(), Ordering::Relaxed);
                    let bytes = d.len() as u32;
                    let _ = self.outbox.send(HostMsg::TunnelAck { tunnel, bytes }).await;
                }
                None => {
                    let _ = wr.shutdown().await;
                    return;
                }
            }
        }
    }
}

/// What a tunnel carries, from the host's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carry {
    /// A connection to the remote a guest program asked for.
    Remote,
    /// A connection to the sandbox's secrets' listener, for a secret's host.
    Secrets,
    /// A host program's connection to a port forward.
    Forward,
}

/// How long the agent may take to connect a port forward in the guest.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);

/// What a tunnel's reader (remote -> guest) works with.
struct Down {
    tunnel: u32,
    rd: tokio::net::tcp::OwnedReadHalf,
    /// A fresh connection offered by the writer, until either side has said something.
    swap_rx: oneshot::Receiver<Swap>,
    /// Set when the first connection ended before either side said anything.
    quiet_end: Arc<std::sync::atomic::AtomicBool>,
    /// The bytes the guest's agent may still take (its window).
    credit: Arc<Semaphore>,
    /// A guest's connection: its turn and what it connects to.
    opening: Option<Opening>,
}

/// A connection the guest opened: its turn for its first round trip, and what it connects to
/// (`host:port`, for log lines).
#[derive(Clone)]
struct Opening {
    turn: Arc<Turn>,
    target: String,
}

/// What a tunnel's writer (guest -> remote) works with.
struct Up {
    tunnel: u32,
    addr: SocketAddr,
    connected: std::time::Instant,
    wr: tokio::net::tcp::OwnedWriteHalf,
    rx: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    swap_tx: oneshot::Sender<Swap>,
    quiet_end: Arc<std::sync::atomic::AtomicBool>,
    unacked: Arc<AtomicUsize>,
    /// Whether late first bytes may go over a fresh connection (see [`HostNet::carry`]).
    may_swap: bool,
    /// A guest's connection's turn, passed on once the guest answers the remote.
    turn: Option<Arc<Turn>>,
}

/// A fresh connection's read half for a tunnel's reader, and how it says it took it.
type Swap = (tokio::net::tcp::OwnedReadHalf, oneshot::Sender<()>);

/// The reader's end of a swap: the fresh connection's read half replaces `rd`, and the writer
/// is told so.
fn take_swap(rd: &mut tokio::net::tcp::OwnedReadHalf, (new_rd, taken): Swap) {
    *rd = new_rd;
    let _ = taken.send(());
}

/// How long a remote must have waited, silent, before it ends a connection the guest had not
/// answered for the end to count as it giving up on the guest.
const CUT_AFTER: Duration = Duration::from_secs(1);

/// How long a connection may wait unused for the guest's first bytes before they go over a new
/// one instead (see [`HostNet::carry`]).
const FRESH_FOR: Duration = Duration::from_secs(2);

/// How long a tunnel's connect to its remote may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// A new connection to `addr` whose read half `offer` hands to the tunnel's reader; its write
/// half once the reader has taken it. `None`: keep the old connection (this one failed, or the
/// remote spoke on the old one meanwhile).
async fn reconnect(
    addr: SocketAddr,
    offer: oneshot::Sender<Swap>,
) -> Option<tokio::net::tcp::OwnedWriteHalf> {
    let connect = tokio::net::TcpStream::connect(addr);
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .ok()?
        .ok()?;
    let (rd, wr) = stream.into_split();
    let (taken_tx, taken_rx) = oneshot::channel();
    offer.send((rd, taken_tx)).ok()?;
    taken_rx.await.ok().map(|()| wr)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A host's end of an agent channel, and the guest's end of it.
    fn host_and_guest() -> (Arc<HostNet>, tokio::net::UnixStream) {
        let (host, guest) = tokio::net::UnixStream::pair().unwrap();
        let (_rd, wr) = host.into_split();
        let net = Arc::new(HostNet::new(Arc::new(tokio::sync::Mutex::new(wr))));
        (net, guest)
    }

    /// The guest's agent sends `data` on `tunnel`.
    async fn guest_sends(net: &Arc<HostNet>, tunnel: u32, data: &[u8]) {
        let msg = forkbox_protocol::AgentMsg::TunnelData {
            tunnel,
            data: data.to_vec(),
        };
        net.on_agent(msg).await.unwrap();
    }

    /// Frames the guest end of `guest` has been sent within `wait`.
    async fn frames_for_guest(guest: &mut tokio::net::UnixStream, wait: Duration) -> Vec<HostMsg> {
        let mut dec = forkbox_protocol::FrameDecoder::new();
        let mut said = Vec::new();
        let mut bytes = vec![0u8; 64 * 1024];
        let end = tokio::time::Instant::now() + wait;
        while let Ok(Ok(n)) = tokio::time::timeout_at(end, guest.read(&mut bytes)).await {
            if n == 0 {
                break;
            }
            dec.push(&bytes[..n]);
            while let Some(f) = dec.next_frame().unwrap() {
                said.push(forkbox_protocol::decode::<HostMsg>(&f).unwrap());
            }
        }
        said
    }

    fn allow(list: &[&str]) -> NetworkPolicy {
        NetworkPolicy {
            internet: false,
            allow: list.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn allow_lists_match_names_subdomains_and_ports() {
        let p = allow(&[
            "pypi.org",
            "*.pythonhosted.org",
            "10.1.2.3:8080",
            "[fd00::1]:9000",
        ]);
        p.validate().unwrap();
        assert!(p.permits_name("pypi.org", 443).is_ok());
        assert!(p.permits_name("PyPI.org.", 80).is_ok());
        assert!(p.permits_name("pypi.org", 22).is_err());
        assert!(p.permits_name("evil-pypi.org", 443).is_err());
        assert!(p.permits_name("files.pythonhosted.org", 443).is_ok());
        assert!(p.permits_name("pythonhosted.org", 443).is_err());
        assert!(p.permits_name("10.1.2.3", 8080).is_ok());
        assert!(p.permits_name("10.1.2.3", 80).is_err());
        assert!(p.permits_name("fd00::1", 9000).is_ok());
        assert!(NetworkPolicy::default()
            .permits_name("pypi.org", 443)
            .is_err());
        let any = NetworkPolicy {
            internet: true,
            allow: vec![],
        };
        assert!(any.permits_name("example.org", 22).is_ok());
    }

    #[test]
    fn bad_policies_say_what_is_wrong() {
        assert_eq!(
            allow(&["pypi.org/simple"]).validate(),
            Err(PolicyError::BadEntry("pypi.org/simple".into()))
        );
        assert!(allow(&["host:99999"]).validate().is_err());
        assert!(allow(&[""]).validate().is_err());
        let both = NetworkPolicy {
            internet: true,
            allow: vec!["pypi.org".into()],
        };
        assert_eq!(both.validate(), Err(PolicyError::Both));
    }

    #[test]
    fn the_host_loopback_and_metadata_are_never_reachable() {
        let own: Vec<IpAddr> = vec!["192.168.1.10".parse().unwrap()];
        for ip in [
            "127.0.0.1",
            "127.8.9.1",
            "::1",
            "169.254.169.254",
            "fe80::1",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "255.255.255.255",
            "192.168.1.10",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "100.100.100.200",
            "168.63.129.16",
            "192.0.0.192",
            "fd00:ec2::254",
            "fd00:ec2::253",
            "::ffff:100.100.100.200",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
        ] {
            assert!(never_reachable(ip.parse().unwrap(), &own), "{ip}");
        }
        for ip in [
            "10.0.0.5",
            "151.101.0.223",
            "2a04:4e42::223",
            "192.168.1.11",
        ] {
            assert!(!never_reachable(ip.parse().unwrap(), &own), "{ip}");
        }
    }

    /// A request the host refuses at once (a host name past DNS's limit).
    fn refused_open(tunnel: u32) -> forkbox_protocol::AgentMsg {
        forkbox_protocol::AgentMsg::TunnelOpen {
            tunnel,
            host: "a".repeat(MAX_HOST_LEN + 1),
            port: 443,
        }
    }

    /// A guest that floods requests (eight queues' worth, each refused at once) while it reads
    /// the replies slowly, as one under emulation on a busy host does: it is slowed down, every
    /// refusal reaches it, and no violation is counted. (Every reply that found the queue full
    /// counted as one, and the hostile suite's flood of tunnel opens cut off its guest so
    /// when the suite's own load slowed that guest's agent down.)
    #[tokio::test]
    async fn a_flood_from_a_guest_that_reads_slowly_is_slowed_down_not_cut_off() {
        let (net, mut guest) = host_and_guest();
        let n = 8 * OUTBOX;
        let reader = tokio::spawn(async move {
            let mut dec = forkbox_protocol::FrameDecoder::new();
            let mut buf = vec![0u8; 4096];
            let mut refusals = 0;
            while refusals < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let k = guest.read(&mut buf).await.unwrap();
                assert!(
                    k > 0,
                    "the host closed the channel after {refusals} refusals"
                );
                dec.push(&buf[..k]);
                while let Some(f) = dec.next_frame().unwrap() {
                    let msg = forkbox_protocol::decode::<HostMsg>(&f).unwrap();
                    assert!(
                        matches!(msg, HostMsg::TunnelReady { error: Some(_), .. }),
                        "{msg:?}"
                    );
                    refusals += 1;
                }
            }
            refusals
        });
        for tunnel in 0..n as u32 {
            net.on_agent(refused_open(tunnel)).await.unwrap();
        }
        let got = tokio::time::timeout(Duration::from_secs(60), reader)
            .await
            .expect("the guest was not sent every refusal within 60 s")
            .unwrap();
        assert_eq!(got, n);
        assert_eq!(net.violations.load(Ordering::Relaxed), 0);
    }

    /// A guest that floods requests and reads none of the replies is still cut off: once the
    /// queue back is full, each reply that waits a whole stall for room is a violation, and
    /// the one past [`MAX_VIOLATIONS`] ends the connection.
    #[tokio::test]
    async fn a_guest_that_floods_and_reads_no_replies_is_cut_off() {
        let (mut net, _guest) = host_and_guest();
        Arc::get_mut(&mut net).unwrap().read_stall = Duration::from_millis(50);
        let t = tokio::time::Instant::now();
        let mut sent = 0u32;
        let why = loop {
            match net.on_agent(refused_open(sent)).await {
                Ok(()) => sent += 1,
                Err(why) => break why,
            }
            assert!(sent < 100 * OUTBOX as u32, "never cut off");
        };
        assert!(why.contains("read none of the host's replies"), "{why}");
        assert_eq!(net.violations.load(Ordering::Relaxed), MAX_VIOLATIONS + 1);
        // Cut off after the stalls, not at the first full queue.
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(50) * (MAX_VIOLATIONS + 1),
            "{took:?}"
        );
        assert!(sent as usize >= OUTBOX, "cut off after {sent} requests");
    }

    /// Data on a tunnel the host does not know (closed for going past its window, say), far
    /// more frames than the queue back holds, from a guest that reads nothing meanwhile:
    /// told once that it is closed, no violation; a tunnel opened again under the number is
    /// new.
    #[tokio::test]
    async fn a_closed_tunnel_is_reported_once_however_much_comes_on_it() {
        let (net, mut guest) = host_and_guest();
        for _ in 0..(3 * OUTBOX) {
            guest_sends(&net, 7, &[1; 100]).await;
        }
        assert_eq!(net.violations.load(Ordering::Relaxed), 0);
        let said = frames_for_guest(&mut guest, Duration::from_secs(1)).await;
        assert!(
            matches!(said.as_slice(), [HostMsg::TunnelClose { tunnel: 7 }]),
            "{said:?}"
        );
        // Opened again (refused here: no policy), then data on it: told again.
        let open = forkbox_protocol::AgentMsg::TunnelOpen {
            tunnel: 7,
            host: "example.org".into(),
            port: 443,
        };
        net.on_agent(open).await.unwrap();
        assert!(!lock(&net.told_closed).contains(&7));
    }

    /// A remote that resets its connection (after the guest spoke) ends the tunnel: the guest
    /// is told once, and the tunnel no longer counts against [`MAX_TUNNELS`], whatever the
    /// guest says after. (It was kept: the guest's end of data that followed never met an end
    /// of the remote's, and an `npm ci` on a busy host, its registry resetting connections,
    /// filled all 512.)
    #[tokio::test]
    async fn a_tunnel_whose_remote_resets_is_forgotten() {
        let (net, mut guest) = host_and_guest();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let remote = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        lock(&net.open).insert(9, Slot::Pending);
        let addr = listener.local_addr().unwrap();
        net.clone()
            .carry(9, addr, remote, Carry::Remote, None)
            .await;
        assert_eq!(net.tunnels(), 1);
        // The guest speaks, the server reads it and resets.
        guest_sends(&net, 9, b"ping").await;
        let mut server = server;
        server.read_exact(&mut [0u8; 4]).await.unwrap();
        server.set_zero_linger().unwrap();
        drop(server);
        let gone = async {
            while net.tunnels() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), gone)
            .await
            .expect("the tunnel is still counted 10 s after its remote reset it");
        // What the agent says once told (its program's end of data, then its close).
        net.on_agent(forkbox_protocol::AgentMsg::TunnelEof { tunnel: 9 })
            .await
            .unwrap();
        net.on_agent(forkbox_protocol::AgentMsg::TunnelClose { tunnel: 9 })
            .await
            .unwrap();
        assert_eq!(net.tunnels(), 0);
        assert_eq!(net.violations.load(Ordering::Relaxed), 0);
        let said = frames_for_guest(&mut guest, Duration::from_secs(1)).await;
        assert!(
            matches!(
                said.as_slice(),
                [
                    HostMsg::TunnelReady {
                        tunnel: 9,
                        error: None
                    },
                    HostMsg::TunnelAck {
                        tunnel: 9,
                        bytes: 4
                    },
                    HostMsg::TunnelClose { tunnel: 9 }
                ]
            ),
            "{said:?}"
        );
    }

    /// A guest whose first bytes come seconds after the connect (a busy emulated guest), to a
    /// server that resets a connection silent for a second (as the npm registry does after
    /// 5-10 s): the bytes go over a new connection and the answer comes back; a server that
    /// spoke first keeps its connection.
    #[tokio::test]
    async fn a_late_first_write_goes_over_a_fresh_connection() {
        let (net, mut guest) = host_and_guest();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // The server: each connection gets a second to say something, or is reset.
        let server = tokio::spawn(async move {
            let mut served = 0;
            loop {
                let (mut c, _) = listener.accept().await.unwrap();
                served += 1;
                let mut b = [0u8; 5];
                match tokio::time::timeout(Duration::from_secs(1), c.read_exact(&mut b)).await {
                    Ok(Ok(_)) => {
                        c.write_all(b"world").await.unwrap();
                        return (served, b);
                    }
                    _ => {
                        c.set_zero_linger().unwrap();
                        drop(c);
                    }
                }
            }
        });
        let remote = tokio::net::TcpStream::connect(addr).await.unwrap();
        lock(&net.open).insert(3, Slot::Pending);
        net.clone()
            .carry(3, addr, remote, Carry::Remote, None)
            .await;
        tokio::time::sleep(FRESH_FOR + Duration::from_millis(500)).await;
        guest_sends(&net, 3, b"hello").await;
        let (served, got) = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((served, &got), (2, b"hello"));
        let said = frames_for_guest(&mut guest, Duration::from_secs(2)).await;
        let data: Vec<u8> = said
            .iter()
            .filter_map(|m| match m {
                HostMsg::TunnelData { tunnel: 3, data } => Some(data.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(data, b"world", "{said:?}");
        assert!(
            !said
                .iter()
                .any(|m| matches!(m, HostMsg::TunnelClose { .. })),
            "{said:?}"
        );
        assert_eq!(net.tunnels(), 1);

        // A server that speaks first: its connection stays, however late the guest answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut c, _) = listener.accept().await.unwrap();
            c.write_all(b"SSH-2.0-x\r\n").await.unwrap();
            let mut b = [0u8; 5];
            c.read_exact(&mut b).await.unwrap();
            b
        });
        let remote = tokio::net::TcpStream::connect(addr).await.unwrap();
        lock(&net.open).insert(4, Slot::Pending);
        net.clone()
            .carry(4, addr, remote, Carry::Remote, None)
            .await;
        tokio::time::sleep(FRESH_FOR + Duration::from_millis(500)).await;
        guest_sends(&net, 4, b"reply").await;
        let got = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"reply");
    }

    #[tokio::test]
    async fn names_that_resolve_to_the_host_are_refused() {
        let p = allow(&["localhost:8080", "127.0.0.1:8080"]);
        let e = resolve(&p, "localhost", 8080).await.unwrap_err();
        assert!(e.contains("may never reach"), "{e}");
        let e = resolve(&p, "127.0.0.1", 8080).await.unwrap_err();
        assert!(e.contains("may never reach"), "{e}");
    }
}
