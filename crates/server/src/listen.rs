//! Serving the router on a listener so that no client can starve the daemon: each listener
//! holds at most [`MAX_CONNECTIONS`] connections, and a connection that does not finish sending
//! a request's headers within [`HEADER_TIMEOUT`] — also while idle between requests — is
//! closed. A connection that arrives when all the slots are taken takes the slot of the one
//! that has waited longest for a request's headers (a half-sent or idle connection; one whose
//! request is being answered is never cut), so a flood of idle connections cannot keep a real
//! client out even while it lasts; when every held connection is busy with a request, the new
//! one is closed at once, so its descriptor is not kept. The Unix socket and the TCP listener
//! each have their own budget, so a flood on TCP never locks the owner out of the Unix socket.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::serve::Listener;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

/// Connections one listener holds at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Time a client has to send a request's headers, counted from the connection (or the end of
/// the previous response): a slow or idle client is cut off after it.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping daemon waits for requests under way.
const DRAIN: Duration = Duration::from_secs(5);
/// How long a new connection waits for the slot of the connection it cut.
const EVICT_WAIT: Duration = Duration::from_millis(500);

/// What a listener knows of one connection it holds.
struct Held {
    /// Requests being answered on it (0 or 1 with HTTP/1.1).
    busy: usize,
    /// Since when it has been waiting for a request's headers.
    waiting_since: Option<Instant>,
    /// Told when it is cut to make room.
    cut: Arc<Notify>,
}

/// The connections a listener holds, by a number of its own.
#[derive(Default)]
struct Table {
    next: u64,
    held: HashMap<u64, Held>,
}

type Shared = Arc<Mutex<Table>>;

fn lock(t: &Shared) -> std::sync::MutexGuard<'_, Table> {
    t.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Table {
    fn add(&mut self) -> (u64, Arc<Notify>) {
        let id = self.next;
        self.next += 1;
        let cut = Arc::new(Notify::new());
        self.held.insert(
            id,
            Held {
                busy: 0,
                waiting_since: Some(Instant::now()),
                cut: cut.clone(),
            },
        );
        (id, cut)
    }

    /// Tells the connection that has waited longest for a request's headers to close, and
    /// forgets it; false when every connection is busy answering.
    fn cut_longest_waiting(&mut self) -> bool {
        let victim = self
            .held
            .iter()
            .filter(|(_, h)| h.busy == 0)
            .filter_map(|(id, h)| Some((*id, h.waiting_since?)))
            .min_by_key(|(_, since)| *since)
            .map(|(id, _)| id);
        match victim.and_then(|id| self.held.remove(&id)) {
            Some(h) => {
                h.cut.notify_one();
                true
            }
            None => false,
        }
    }

    fn request_started(&mut self, id: u64) {
        if let Some(h) = self.held.get_mut(&id) {
            h.busy += 1;
            h.waiting_since = None;
        }
    }

    fn request_ended(&mut self, id: u64) {
        if let Some(h) = self.held.get_mut(&id) {
            h.busy = h.busy.saturating_sub(1);
            if h.busy == 0 {
                h.waiting_since = Some(Instant::now());
            }
        }
    }
}

/// Marks a request as answered when the response's body is dropped (sent whole, or the
/// connection gone).
struct Answering {
    table: Shared,
    id: u64,
}

impl Drop for Answering {
    fn drop(&mut self) {
        lock(&self.table).request_ended(self.id);
    }
}

/// A slot for a new connection: a free one, else the one of the connection that has waited
/// longest for its headers (cut for it); none when every held connection is busy.
async fn take_slot(slots: &Arc<Semaphore>, table: &Shared) -> Option<OwnedSemaphorePermit> {
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return Some(slot);
    }
    if !lock(table).cut_longest_waiting() {
        return None;
    }
    tokio::time::timeout(EVICT_WAIT, slots.clone().acquire_owned())
        .await
        .ok()?
        .ok()
}

/// A connection's byte stream, plain or TLS (a listener's, or a node's to a peer).
pub trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Stream for T {}

/// A connection a listener can look into before serving it: its first byte, unread.
pub trait Peek: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {
    /// The first byte the client sent (waiting for it), or None where nothing is looked at.
    fn first_byte(&self) -> impl Future<Output = Option<u8>> + Send;
}

impl Peek for tokio::net::TcpStream {
    async fn first_byte(&self) -> Option<u8> {
        let mut b = [0u8; 1];
        match self.peek(&mut b).await {
            Ok(1) => Some(b[0]),
            _ => None,
        }
    }
}

impl Peek for tokio::net::UnixStream {
    async fn first_byte(&self) -> Option<u8> {
        None
    }
}

/// The node a TLS client's certificate names (set on each request of a TLS connection).
#[derive(Debug, Clone)]
pub struct PeerCertificate(pub Option<String>);

/// A TLS ClientHello's first byte (a handshake record).
const TLS_HANDSHAKE: u8 = 0x16;

/// What a listener answers TLS handshakes with, by the server name the client asks for: a
/// front end's own sites (E2B's domain: `D` and every name under it), each with a certificate
/// of its own and no client certificate; any other name is a cluster peer's, whose client
/// certificate of the cluster CA is required.
#[derive(Clone, Default)]
pub struct Tls {
    pub peers: Option<Arc<rustls::ServerConfig>>,
    pub sites: Vec<(String, Arc<rustls::ServerConfig>)>,
}

impl Tls {
    fn is_empty(&self) -> bool {
        self.peers.is_none() && self.sites.is_empty()
    }

    /// The site serving `name` (the ClientHello's server name), if one does.
    fn site(&self, name: Option<&str>) -> Option<Arc<rustls::ServerConfig>> {
        let name = name?.trim_end_matches('.').to_ascii_lowercase();
        self.sites
            .iter()
            .find(|(d, _)| {
                name == *d
                    || name
                        .strip_suffix(d.as_str())
                        .is_some_and(|r| r.ends_with('.'))
            })
            .map(|(_, c)| c.clone())
    }
}

/// A connection to serve, the peer its certificate names (a cluster node's), and whether it
/// speaks HTTP/2 (a TLS client that chose `h2`).
type Opened = (Box<dyn Stream>, Option<PeerCertificate>, bool);

/// The connection to serve: TLS when the client opens with a handshake and `tls` answers the
/// name it asks for (a peer's: the node its verified client certificate names beside it), else
/// as it came; None when the handshake fails or does not finish within [`HEADER_TIMEOUT`].
async fn open<I: Peek>(io: I, tls: &Tls) -> Option<Opened> {
    if tls.is_empty() {
        return Some((Box::new(io), None, false));
    }
    let handshake = async {
        if io.first_byte().await != Some(TLS_HANDSHAKE) {
            return Some((Box::new(io) as Box<dyn Stream>, None, false));
        }
        let start = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
            .await
            .map_err(|e| tracing::debug!("a TLS ClientHello could not be read: {e}"))
            .ok()?;
        let site = tls.site(start.client_hello().server_name());
        let (config, peer) = match (site, &tls.peers) {
            (Some(c), _) => (c, false),
            (None, Some(c)) => (c.clone(), true),
            (None, None) => {
                tracing::debug!(
                    "a TLS handshake for {:?}, a name this listener has no certificate for",
                    start.client_hello().server_name()
                );
                return None;
            }
        };
        match start.into_stream(config).await {
            Ok(s) => {
                let cert = peer.then(|| {
                    PeerCertificate(
                        s.get_ref()
                            .1
                            .peer_certificates()
                            .and_then(forkbox_cluster::tls::peer_node),
                    )
                });
                let h2 = s.get_ref().1.alpn_protocol() == Some(b"h2");
                Some((Box::new(s) as Box<dyn Stream>, cert, h2))
            }
            Err(e) => {
                tracing::debug!("a TLS handshake failed: {e}");
                None
            }
        }
    };
    tokio::time::timeout(HEADER_TIMEOUT, handshake)
        .await
        .ok()
        .flatten()
}

/// Serves `app` on `listener` until `stop` completes; then finishes the requests under way
/// (for at most a few seconds) and returns.
pub async fn serve<L: Listener>(listener: L, app: Router, stop: impl Future<Output = ()>)
where
    L::Io: Peek,
{
    serve_tls(listener, app, stop, Tls::default()).await
}

/// [`serve`], and a connection that opens with a TLS handshake is served over TLS as `tls`
/// says (a peer's with its node on each request as a [`PeerCertificate`]) beside plain ones on
/// the same port.
pub async fn serve_tls<L: Listener>(
    mut listener: L,
    app: Router,
    stop: impl Future<Output = ()>,
    tls: Tls,
) where
    L::Io: Peek,
{
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let table: Shared = Arc::default();
    let (stopping, stop_rx) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let (io, _) = tokio::select! {
            c = listener.accept() => c,
            () = &mut stop => break,
        };
        let Some(slot) = take_slot(&slots, &table).await else {
            // Every held connection is answering a request: close this one now rather than
            // hold its descriptor.
            drop(io);
            continue;
        };
        let (id, cut) = lock(&table).add();
        let app = app.clone();
        let table = table.clone();
        let mut stop_rx = stop_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let Some((io, peer, h2)) = open(io, &tls).await else {
                lock(&table).held.remove(&id);
                drop(slot);
                return;
            };
            let t = table.clone();
            let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                if let Some(p) = &peer {
                    req.extensions_mut().insert(p.clone());
                }
                lock(&t).request_started(id);
                let answering = Answering {
                    table: t.clone(),
                    id,
                };
                let response = app.clone().oneshot(req.map(Body::new));
                async move {
                    let response = response.await?;
                    Ok::<_, std::convert::Infallible>(response.map(move |body| {
                        // The body holds `answering`: the request ends when hyper drops it.
                        Body::new(body.map_frame(move |frame| {
                            let _ = &answering;
                            frame
                        }))
                    }))
                }
            });
            // Until the connection ends, is cut to make room, or the listener stops (then its
            // requests under way are finished, for at most DRAIN).
            macro_rules! drive {
                ($conn:expr) => {{
                    let conn = $conn;
                    tokio::pin!(conn);
                    let stopping = tokio::select! {
                        _ = conn.as_mut() => false,
                        () = cut.notified() => false,
                        r = stop_rx.wait_for(|s| *s) => r.is_ok(),
                    };
                    if stopping {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(DRAIN, conn).await;
                    }
                }};
            }
            if h2 {
                drive!(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .timer(TokioTimer::new())
                        .serve_connection(TokioIo::new(io), service)
                );
            } else {
                drive!(hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(io), service)
                    // A preview URL's WebSocket (see `preview`) takes its connection over.
                    .with_upgrades());
            }
            lock(&table).held.remove(&id);
            drop(slot);
        });
    }
    let _ = stopping.send(true);
    // Every connection gives its slot back when it ends.
    let _ = tokio::time::timeout(
        DRAIN + Duration::from_secs(1),
        slots.acquire_many(MAX_CONNECTIONS as u32),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_waiting_idle_connection_is_cut_never_a_busy_one() {
        let mut t = Table::default();
        let pause = || std::thread::sleep(Duration::from_millis(2));
        let (old, old_cut) = t.add();
        pause();
        let (mid, mid_cut) = t.add();
        pause();
        let (new, _) = t.add();
        pause();
        // The oldest is answering a request: it is not a candidate.
        t.request_started(old);
        assert!(t.cut_longest_waiting());
        assert!(
            !t.held.contains_key(&mid),
            "the longest-waiting idle one goes"
        );
        assert!(t.held.contains_key(&old) && t.held.contains_key(&new));
        // Its task is told (the permit waits for it even if it is not listening yet).
        assert!(futures_util::FutureExt::now_or_never(mid_cut.notified()).is_some());
        assert!(futures_util::FutureExt::now_or_never(old_cut.notified()).is_none());
        // Once its answer is sent, the first waits again, from now: the newer one goes first.
        t.request_ended(old);
        assert!(t.cut_longest_waiting());
        assert!(!t.held.contains_key(&new));
        assert!(t.cut_longest_waiting());
        assert!(t.held.is_empty());
        assert!(!t.cut_longest_waiting(), "nothing left to cut");
    }

    #[test]
    fn with_every_connection_busy_nothing_is_cut() {
        let mut t = Table::default();
        let ids: Vec<u64> = (0..3).map(|_| t.add().0).collect();
        for id in &ids {
            t.request_started(*id);
        }
        assert!(!t.cut_longest_waiting());
        assert_eq!(t.held.len(), 3);
    }
}
