//! A tunnel carried: the guest's window taken before reading from the remote, the bound on a
//! guest that reads nothing, a late first write over a fresh connection, and the connections a
//! remote cut short.

use super::*;

impl HostNet {
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
    pub(super) async fn carry(
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
        let target = match (&opening, kind) {
            (Some(o), _) => o.target.clone(),
            (None, Carry::Forward) => format!("a port forward's connection from {addr}"),
            (None, _) => addr.to_string(),
        };
        let down = tokio::spawn(self.clone().remote_to_guest(Down {
            tunnel,
            rd,
            swap_rx,
            quiet_end: quiet_end.clone(),
            credit,
            opening: opening.clone(),
            target,
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
            target,
        } = d;
        let mut buf = vec![0u8; 64 * 1024];
        let mut waiting_swap = true;
        let started = std::time::Instant::now();
        let mut got = 0u64;
        let mut last_sent = started;
        loop {
            // What the guest's window has room for, taken before reading: a guest that reads
            // nothing leaves the remote's bytes with the remote.
            let Some(room) = self.room(tunnel, &credit, buf.len()).await else {
                return self.read_nothing_of(tunnel, &target).await;
            };
            if room == 0 {
                return;
            }
            let read = tokio::select! {
                biased;
                swap = &mut swap_rx, if waiting_swap => {
                    credit.add_permits(room);
                    waiting_swap = false;
                    // Nothing was read from the old connection (the first read
                    // ends the offer): the new one takes its place.
                    if let Ok(swap) = swap {
                        take_swap(&mut rd, swap);
                    }
                    continue;
                }
                r = rd.read(&mut buf[..room]) => r,
            };
            credit.add_permits(room - read.as_ref().map_or(0, |n| *n));
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

    /// Room in `tunnel`'s window for up to `most` bytes (0: the tunnel is gone), or `None`
    /// when its guest took none of what it was sent for [`Self::read_nothing`] after the last
    /// of it reached the agent's channel.
    async fn room(&self, tunnel: u32, credit: &Semaphore, most: usize) -> Option<usize> {
        let mut wait = self.read_nothing;
        loop {
            match tokio::time::timeout(wait, take_room(credit, most)).await {
                Ok(room) => return Some(room.unwrap_or(0)),
                Err(_) => {
                    let delivered = lock(&self.data_delivered).get(&tunnel).copied();
                    let since = delivered.map_or(wait, |t| t.elapsed());
                    if since >= self.read_nothing {
                        return None;
                    }
                    wait = self.read_nothing - since;
                }
            }
        }
    }

    /// Ends `tunnel`, whose guest took none of what waited for it for [`Self::read_nothing`]:
    /// said in the sandbox's network log, the guest told, the remote's connection closed.
    async fn read_nothing_of(&self, tunnel: u32, target: &str) {
        self.say(format!(
            "the connection to {} closed by the host: the guest read nothing of it for {} s \
             ({} KiB waiting for it; FORKBOX_TUNNEL_READ_NOTHING_SECS sets how long)",
            crate::guestlog::quote(target),
            self.read_nothing.as_secs(),
            TUNNEL_WINDOW / 1024
        ));
        if self.first_close(tunnel) {
            let _ = self.outbox.send(HostMsg::TunnelClose { tunnel }).await;
        }
        // Last: this aborts the calling task too, at its next await.
        self.forget(tunnel);
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
        self.say(format!(
            "{} {how} {:.1} s after its first answer, which the guest had not answered \
             ({got} bytes sent to the guest, {:.1} s after the connect): the remote's time for \
             a reply ran out (a guest too slow for it; a program that sees the connection \
             reset retries)",
            crate::guestlog::quote(&o.target),
            waited.as_secs_f64(),
            started.elapsed().as_secs_f64()
        ));
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
pub(super) enum Carry {
    /// A connection to the remote a guest program asked for.
    Remote,
    /// A connection to a listener of the host's own ([`crate::intercept`]): the sandbox's
    /// secrets' for a secret's host, the package cache's for a registry.
    Intercepted,
    /// A host program's connection to a port forward.
    Forward,
}

/// How long a tunnel stays open while its guest takes none of what waits for it (its window
/// full: the guest's program reads nothing), unless `FORKBOX_TUNNEL_READ_NOTHING_SECS` says.
/// A slow reader takes some within seconds, even held to a quarter of a core. (The guest's agent
/// acknowledges what it wrote to the program's socket, whose send buffer it keeps to 128 KiB:
/// it acknowledges in steps of up to ~192 KiB, and a reader slower than that per this time,
/// about 0.6 KiB/s, counts as reading nothing.)
pub const READ_NOTHING: Duration = Duration::from_secs(300);

pub(super) fn read_nothing() -> Duration {
    std::env::var("FORKBOX_TUNNEL_READ_NOTHING_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(READ_NOTHING, Duration::from_secs)
}

/// Room in a guest's window for up to `most` bytes: waits for some, takes what there is.
/// `None` once the tunnel is gone.
pub(super) async fn take_room(credit: &Semaphore, most: usize) -> Option<usize> {
    credit.acquire().await.ok()?.forget();
    let more = credit.available_permits().min(most - 1);
    if more > 0 {
        credit.try_acquire_many(more as u32).ok()?.forget();
    }
    Some(1 + more)
}

/// What a tunnel's reader (remote -> guest) works with.
pub(super) struct Down {
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
    /// What it connects to, for log lines.
    target: String,
}

/// A connection the guest opened: its turn for its first round trip, and what it connects to
/// (`host:port`, for log lines).
#[derive(Clone)]
pub(super) struct Opening {
    pub(super) turn: Arc<Turn>,
    pub(super) target: String,
}

/// What a tunnel's writer (guest -> remote) works with.
pub(super) struct Up {
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
pub(super) type Swap = (tokio::net::tcp::OwnedReadHalf, oneshot::Sender<()>);

/// The reader's end of a swap: the fresh connection's read half replaces `rd`, and the writer
/// is told so.
pub(super) fn take_swap(rd: &mut tokio::net::tcp::OwnedReadHalf, (new_rd, taken): Swap) {
    *rd = new_rd;
    let _ = taken.send(());
}

/// How long a remote must have waited, silent, before it ends a connection the guest had not
/// answered for the end to count as it giving up on the guest.
pub(super) const CUT_AFTER: Duration = Duration::from_secs(1);

/// How long a connection may wait unused for the guest's first bytes before they go over a new
/// one instead (see [`HostNet::carry`]).
pub(super) const FRESH_FOR: Duration = Duration::from_secs(2);

/// How long a tunnel's connect to its remote may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// A new connection to `addr` whose read half `offer` hands to the tunnel's reader; its write
/// half once the reader has taken it. `None`: keep the old connection (this one failed, or the
/// remote spoke on the old one meanwhile).
pub(super) async fn reconnect(
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
