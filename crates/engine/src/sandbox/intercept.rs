//! Connections of a guest that the host ends itself instead of tunnelling them to the remote
//! as they are: a secret's ([`crate::secrets`]) and a package registry's
//! ([`crate::packages`]). The tunnel machinery in [`crate::net`] carries bytes to a TCP
//! stream; such a connection is one to a listener on 127.0.0.1, which knows it by its source
//! address (registered before connecting) and serves it with what it was opened for. Anyone
//! else on the host who connects gets nothing but a closed connection.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// How long the guest may take to start and finish its TLS handshake. Under emulation a
/// guest held to a quarter of a core with a hundred handshakes at once (`npm ci`) takes
/// minutes for some; a slow guest is not a hostile one, and a hostile one holds at most
/// [`crate::net::MAX_TUNNELS`] connections of a few KiB each meanwhile.
pub const HANDSHAKE: Duration = Duration::from_secs(600);
/// How long the connection to the real host may take, with its TLS handshake.
pub const UPSTREAM: Duration = Duration::from_secs(30);

/// What a connection to a listener was opened for.
#[derive(Clone, Debug)]
pub struct Target {
    pub host: String,
    pub port: u16,
    /// The address the policy resolved the host to.
    pub addr: SocketAddr,
    /// The sandbox, for log lines.
    pub sandbox: String,
}

type Served = Pin<Box<dyn Future<Output = ()> + Send>>;
/// What serves a connection a listener took.
pub type Serve = Arc<dyn Fn(TcpStream, Target) -> Served + Send + Sync>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A listener on 127.0.0.1 (a port of its own) for the connections this process registered.
pub struct Listener {
    addr: SocketAddr,
    expected: Arc<Mutex<HashMap<SocketAddr, Target>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Listener {
    /// Starts listening; each registered connection is given to `serve` on a task of its own.
    pub async fn start(serve: Serve) -> std::io::Result<Listener> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let expected: Arc<Mutex<HashMap<SocketAddr, Target>>> = Default::default();
        let known = expected.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, peer)) = listener.accept().await else {
                    // Out of descriptors, say: wait a moment rather than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Some(target) = lock(&known).remove(&peer) else {
                    continue;
                };
                tokio::spawn(serve(stream, target));
            }
        });
        Ok(Listener {
            addr,
            expected,
            accept,
        })
    }

    /// Where the listener is (on the host's loopback, which no guest may reach).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A connection for a tunnel to `target`, served by this listener.
    pub async fn connect(&self, target: Target) -> std::io::Result<TcpStream> {
        let socket = TcpSocket::new_v4()?;
        socket.bind("127.0.0.1:0".parse().map_err(std::io::Error::other)?)?;
        let local = socket.local_addr()?;
        lock(&self.expected).insert(local, target);
        let r = socket.connect(self.addr).await;
        if r.is_err() {
            lock(&self.expected).remove(&local);
        }
        r
    }
}

/// What the guest opened a connection with.
pub enum Opened {
    /// TLS, terminated here with `config`.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// Something else (it was carried to the remote as it is, and has ended).
    Plain,
    /// Nothing within [`HANDSHAKE`], or a handshake that failed (said in the log).
    Nothing,
}

/// Ends the guest's TLS on `guest` with a certificate from `config`; a guest that does not
/// speak TLS first is carried to the remote untouched (nothing of the host's goes into a
/// connection in clear).
pub async fn accept(guest: TcpStream, t: &Target, config: Arc<rustls::ServerConfig>) -> Opened {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE, guest.peek(&mut first)).await {
        Ok(Ok(1..)) => {}
        Ok(_) => return Opened::Nothing,
        Err(_) => {
            tracing::info!(
                "{}: a connection to {}:{} closed: the guest sent nothing within {} s",
                t.sandbox,
                t.host,
                t.port,
                HANDSHAKE.as_secs()
            );
            return Opened::Nothing;
        }
    }
    if first[0] != 0x16 {
        carry_plain(guest, t).await;
        return Opened::Plain;
    }
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(guest);
    match tokio::time::timeout(HANDSHAKE, accept).await {
        Ok(Ok(s)) => Opened::Tls(Box::new(s)),
        Ok(Err(e)) => {
            tracing::info!(
                "{}: the guest's TLS handshake for {} failed: {e}",
                t.sandbox,
                t.host
            );
            Opened::Nothing
        }
        Err(_) => {
            tracing::info!(
                "{}: a connection to {}:{} closed: the guest's TLS handshake did not finish \
                 within {} s",
                t.sandbox,
                t.host,
                t.port,
                HANDSHAKE.as_secs()
            );
            Opened::Nothing
        }
    }
}

/// A connection that does not start with TLS: carried to the remote as it is.
async fn carry_plain(mut guest: TcpStream, t: &Target) {
    let Ok(Ok(mut remote)) = tokio::time::timeout(UPSTREAM, TcpStream::connect(t.addr)).await
    else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut guest, &mut remote).await;
}
