//! The listener's connection budget with real sockets: idle connections give way to a new
//! one, busy ones never do.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use forkbox_server::listen::{serve, MAX_CONNECTIONS};
use tokio::sync::Semaphore;

/// Serves a router with `/` (answers at once) and `/slow` (answers when `release` gets a
/// permit) on a loopback port, on a runtime of its own.
fn start(release: Arc<Semaphore>, arrived: Arc<AtomicUsize>) -> (String, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let app = Router::new().route("/", get(|| async { "ok" })).route(
        "/slow",
        get(move || {
            let release = release.clone();
            arrived.fetch_add(1, Ordering::SeqCst);
            async move {
                let _ = release.acquire().await.map(|p| p.forget());
                "slow"
            }
        }),
    );
    rt.spawn(serve(listener, app, std::future::pending()));
    (addr, rt)
}

fn get_root(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply
}

/// True when the daemon closed `s` (EOF or reset), false when it holds it open.
fn closed(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn held_once_answered(addr: &str, n: usize, request: &[u8]) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(request).unwrap();
            s
        })
        .collect()
}

#[test]
fn a_new_connection_takes_the_slot_of_the_longest_idle_one() {
    let (addr, _rt) = start(Arc::new(Semaphore::new(0)), Arc::default());
    // Every slot held by a half-sent request.
    let mut idle = held_once_answered(&addr, MAX_CONNECTIONS, b"GET / HTTP/1.1\r\nHost: x\r\n");
    // Long before the header timeout, a real request is answered...
    let reply = get_root(&addr);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    assert!(reply.ends_with("ok"), "{reply:?}");
    // ...in the slot of the first of them, which is cut; the last one is still held.
    assert!(
        closed(&mut idle[0], Duration::from_secs(5)),
        "the oldest idle connection is held"
    );
    let last = idle.len() - 1;
    assert!(
        !closed(&mut idle[last], Duration::from_millis(200)),
        "the newest idle connection was cut"
    );
}

#[test]
fn connections_answering_requests_are_never_cut() {
    let release = Arc::new(Semaphore::new(0));
    let arrived = Arc::new(AtomicUsize::new(0));
    let (addr, _rt) = start(release.clone(), arrived.clone());
    let mut busy = held_once_answered(
        &addr,
        MAX_CONNECTIONS,
        b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    // Every request's headers read and its answer under way.
    assert!(forkbox_test_infra::wait_until(
        Duration::from_secs(60),
        || { arrived.load(Ordering::SeqCst) == MAX_CONNECTIONS }
    ));
    // A new connection finds every slot busy: it is closed without an answer.
    let reply = get_root(&addr);
    assert!(reply.is_empty(), "{reply:?}");
    // Every busy one is still held and answers once released.
    release.add_permits(MAX_CONNECTIONS);
    for s in &mut busy {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        assert!(reply.ends_with("slow"), "{reply:?}");
    }
    assert!(get_root(&addr).starts_with("HTTP/1.1 200"));
}
