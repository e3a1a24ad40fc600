//! The guest's outbound proxy. A sandbox has no network device; when its policy allows any
//! network, the host sends `NetUp` and the agent listens on 127.0.0.1:3128 for HTTP proxy
//! requests (`CONNECT host:port` for TLS and anything else, or `GET http://host/...`). Each
//! connection becomes a tunnel over the host channel; the host decides, by a policy the guest
//! cannot see or change, whether to open it, resolves the name itself and connects. Each
//! direction may run `TUNNEL_WINDOW` bytes ahead of the other side's acknowledgements, so a
//! slow reader on either end holds back its sender instead of filling memory.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use forkbox_protocol::{AgentMsg, TUNNEL_WINDOW};

use crate::serve::Outbox;

enum ToGuest {
    Data(Vec<u8>),
    Eof,
    Close,
}

struct Tunnel {
    ready: Mutex<Option<Sender<Option<String>>>>,
    to_guest: Sender<ToGuest>,
    /// Bytes this side may still send before the host acknowledges more.
    credit: Mutex<u64>,
    more: Condvar,
    closed: AtomicBool,
}

#[derive(Default)]
struct Tunnels {
    open: Mutex<HashMap<u32, Arc<Tunnel>>>,
    next: AtomicU32,
    listening: AtomicBool,
}

fn tunnels() -> &'static Tunnels {
    static T: OnceLock<Tunnels> = OnceLock::new();
    T.get_or_init(Tunnels::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn get(tunnel: u32) -> Option<Arc<Tunnel>> {
    lock(&tunnels().open).get(&tunnel).cloned()
}

/// Starts the proxy listener once.
pub fn up(port: u16, out: &Outbox) -> io::Result<()> {
    let t = tunnels();
    if t.listening.load(Ordering::SeqCst) {
        return Ok(());
    }
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    t.listening.store(true, Ordering::SeqCst);
    let out = out.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(c) => {
                    let out = out.clone();
                    std::thread::spawn(move || serve_client(c, &out));
                }
                Err(e) => eprintln!("forkbox-agent: proxy accept: {e}"),
            }
        }
    });
    Ok(())
}

/// The host answered a `TunnelOpen`.
pub fn ready(tunnel: u32, error: Option<String>) {
    if let Some(t) = get(tunnel) {
        if let Some(tx) = lock(&t.ready).take() {
            let _ = tx.send(error);
        }
    }
}

pub fn data(tunnel: u32, data: Vec<u8>, out: &Outbox) {
    match get(tunnel) {
        Some(t) => {
            let _ = t.to_guest.send(ToGuest::Data(data));
        }
        // A tunnel this agent does not know (e.g. open when the snapshot this copy came from
        // was taken): tell the host it is gone.
        None => out.send(&AgentMsg::TunnelClose { tunnel }),
    }
}

pub fn eof(tunnel: u32) {
    if let Some(t) = get(tunnel) {
        let _ = t.to_guest.send(ToGuest::Eof);
    }
}

pub fn close(tunnel: u32) {
    if let Some(t) = get(tunnel) {
        // Under the credit lock: a sender that found the tunnel open is then either waiting
        // (and woken here) or has not checked yet (and sees it closed); set between its check
        // and its wait, the wake-up was lost and the sender slept for good.
        {
            let _credit = lock(&t.credit);
            t.closed.store(true, Ordering::SeqCst);
        }
        t.more.notify_all();
        let _ = t.to_guest.send(ToGuest::Close);
    }
}

pub fn ack(tunnel: u32, bytes: u32) {
    if let Some(t) = get(tunnel) {
        *lock(&t.credit) += u64::from(bytes);
        t.more.notify_all();
    }
}

/// The head of the proxy request: up to the blank line, at most 16 KiB. Returns the head and
/// what was read after it.
fn read_head(c: &mut TcpStream) -> io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > 16 * 1024 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too long",
            ));
        }
        let n = c.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before a request",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Splits `host:port` (`[v6]:port` too).
fn host_port(s: &str, default: u16) -> Option<(String, u16)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once(']')?;
        let port = match p.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => default,
        };
        return Some((h.to_string(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((s.to_string(), default)),
    }
}

/// What the client asked for: the target, and the bytes to send there first (for a plain HTTP
/// request: the request rewritten to origin form; for CONNECT: nothing).
fn parse(head: &str) -> Result<(String, u16, bool, Vec<u8>), String> {
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    if method.eq_ignore_ascii_case("CONNECT") {
        let (h, p) = host_port(target, 443).ok_or("bad CONNECT target")?;
        return Ok((h, p, true, Vec::new()));
    }
    let rest = target
        .strip_prefix("http://")
        .ok_or("only CONNECT and http:// requests go through this proxy")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (h, p) = host_port(authority, 80).ok_or("bad host in the request")?;
    let mut out = format!("{method} {path} {version}\r\n");
    for l in lines {
        let lower = l.to_ascii_lowercase();
        if lower.starts_with("proxy-connection:") || lower.starts_with("proxy-authorization:") {
            continue;
        }
        out.push_str(l);
        out.push_str("\r\n");
    }
    // The head ended with a blank line; split() left it as the last (empty) element(s).
    while out.ends_with("\r\n\r\n\r\n") {
        out.truncate(out.len() - 2);
    }
    if !out.ends_with("\r\n\r\n") {
        out.push_str("\r\n");
    }
    Ok((h, p, false, out.into_bytes()))
}

fn refuse(c: &mut TcpStream, status: &str, why: &str) {
    let body = format!("forkbox: {why}\n");
    let _ = write!(
        c,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// The send buffer of the agent's side of a program's connection: what the agent writes goes
/// on only as the program reads, so the agent acknowledges to the host what the program took
/// in steps of about this (a kernel-sized buffer of megabytes let a program reading 16 KiB/s
/// look to the host as if it read nothing for minutes).
const TO_PROGRAM_BUFFER: usize = 128 * 1024;

fn serve_client(mut c: TcpStream, out: &Outbox) {
    let _ = nix::sys::socket::setsockopt(&c, nix::sys::socket::sockopt::SndBuf, &TO_PROGRAM_BUFFER);
    let (head, early) = match read_head(&mut c) {
        Ok(h) => h,
        Err(_) => return,
    };
    let (host, port, connect, first) = match parse(&head) {
        Ok(p) => p,
        Err(why) => return refuse(&mut c, "400 Bad Request", &why),
    };
    let t = tunnels();
    let id = t.next.fetch_add(1, Ordering::SeqCst) + 1;
    let (ready_tx, ready_rx) = channel();
    let (to_guest, from_host) = channel();
    let tunnel = Arc::new(Tunnel {
        ready: Mutex::new(Some(ready_tx)),
        to_guest,
        credit: Mutex::new(u64::from(TUNNEL_WINDOW)),
        more: Condvar::new(),
        closed: AtomicBool::new(false),
    });
    lock(&t.open).insert(id, tunnel.clone());
    out.send(&AgentMsg::TunnelOpen {
        tunnel: id,
        host,
        port,
    });
    match ready_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(None) => {}
        Ok(Some(why)) => {
            lock(&t.open).remove(&id);
            return refuse(&mut c, "403 Forbidden", &why);
        }
        Err(_) => {
            lock(&t.open).remove(&id);
            out.send(&AgentMsg::TunnelClose { tunnel: id });
            return refuse(
                &mut c,
                "504 Gateway Timeout",
                "the host did not open the tunnel",
            );
        }
    }
    if connect
        && c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .is_err()
    {
        out.send(&AgentMsg::TunnelClose { tunnel: id });
        lock(&t.open).remove(&id);
        return;
    }
    let writer = match c.try_clone() {
        Ok(w) => w,
        Err(_) => {
            out.send(&AgentMsg::TunnelClose { tunnel: id });
            lock(&t.open).remove(&id);
            return;
        }
    };
    let down = {
        let out = out.clone();
        std::thread::spawn(move || to_client(id, writer, from_host, &out))
    };
    let mut pending: Vec<u8> = first;
    pending.extend_from_slice(&early);
    from_client(id, &mut c, pending, &tunnel, out);
    let _ = down.join();
    lock(&t.open).remove(&id);
}

/// A port forward from the host: connects to 127.0.0.1:`port` (in a thread of its own) and
/// carries the connection as a tunnel numbered `tunnel` by the host.
pub fn forward(tunnel: u32, port: u16, out: &Outbox) {
    let out = out.clone();
    std::thread::spawn(move || {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut c = match TcpStream::connect_timeout(&addr, Duration::from_secs(10)) {
            Ok(c) => c,
            Err(e) => {
                return out.send(&AgentMsg::ForwardReady {
                    tunnel,
                    error: Some(format!("127.0.0.1:{port} in the guest: {e}")),
                })
            }
        };
        let (to_guest, from_host) = channel();
        let t = Arc::new(Tunnel {
            ready: Mutex::new(None),
            to_guest,
            credit: Mutex::new(u64::from(TUNNEL_WINDOW)),
            more: Condvar::new(),
            closed: AtomicBool::new(false),
        });
        let writer = match c.try_clone() {
            Ok(w) => w,
            Err(e) => {
                return out.send(&AgentMsg::ForwardReady {
                    tunnel,
                    error: Some(format!("127.0.0.1:{port} in the guest: {e}")),
                })
            }
        };
        lock(&tunnels().open).insert(tunnel, t.clone());
        out.send(&AgentMsg::ForwardReady {
            tunnel,
            error: None,
        });
        let down = {
            let out = out.clone();
            std::thread::spawn(move || to_client(tunnel, writer, from_host, &out))
        };
        from_client(tunnel, &mut c, Vec::new(), &t, &out);
        let _ = down.join();
        lock(&tunnels().open).remove(&tunnel);
    });
}

/// Guest program -> host, within the window.
fn from_client(id: u32, c: &mut TcpStream, first: Vec<u8>, t: &Tunnel, out: &Outbox) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut next = first;
    loop {
        if next.is_empty() {
            match c.read(&mut buf) {
                Ok(0) => {
                    out.send(&AgentMsg::TunnelEof { tunnel: id });
                    return;
                }
                Ok(n) => next = buf[..n].to_vec(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    out.send(&AgentMsg::TunnelClose { tunnel: id });
                    return;
                }
            }
        }
        let n = next.len() as u64;
        {
            let mut credit = lock(&t.credit);
            while *credit < n && !t.closed.load(Ordering::SeqCst) {
                credit = t.more.wait(credit).unwrap_or_else(|p| p.into_inner());
            }
            if t.closed.load(Ordering::SeqCst) {
                return;
            }
            *credit -= n;
        }
        out.send(&AgentMsg::TunnelData {
            tunnel: id,
            data: std::mem::take(&mut next),
        });
    }
}

/// Host -> guest program; acknowledges what was written.
fn to_client(id: u32, mut w: TcpStream, rx: Receiver<ToGuest>, out: &Outbox) {
    while let Ok(m) = rx.recv() {
        match m {
            ToGuest::Data(d) => {
                if w.write_all(&d).is_err() {
                    out.send(&AgentMsg::TunnelClose { tunnel: id });
                    let _ = w.shutdown(Shutdown::Both);
                    return;
                }
                out.send(&AgentMsg::TunnelAck {
                    tunnel: id,
                    bytes: d.len() as u32,
                });
            }
            ToGuest::Eof => {
                let _ = w.shutdown(Shutdown::Write);
                return;
            }
            ToGuest::Close => {
                let _ = w.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_as_targets() {
        let (h, p, c, first) =
            parse("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n").unwrap();
        assert_eq!((h.as_str(), p, c, first.len()), ("pypi.org", 443, true, 0));
        let (h, p, c, first) = parse(
            "GET http://10.0.0.2:8080/a/b?c HTTP/1.1\r\nHost: 10.0.0.2:8080\r\nProxy-Connection: keep-alive\r\n\r\n",
        )
        .unwrap();
        assert_eq!((h.as_str(), p, c), ("10.0.0.2", 8080, false));
        assert_eq!(
            String::from_utf8(first).unwrap(),
            "GET /a/b?c HTTP/1.1\r\nHost: 10.0.0.2:8080\r\n\r\n"
        );
        let (h, p, _, _) = parse("CONNECT [::1]:22 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((h.as_str(), p), ("::1", 22));
        let (_, p, _, _) = parse("GET http://example.org HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(p, 80);
        assert!(parse("GET /local HTTP/1.1\r\n\r\n").is_err());
        assert!(parse("CONNECT host:notaport HTTP/1.1\r\n\r\n").is_err());
    }
}
