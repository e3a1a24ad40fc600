//! Port forwards end to end: servers in the guest (Python's http.server and a WebSocket echo,
//! both on the guest's 127.0.0.1, with the sandbox's network off) reached from this host
//! through the forward's listener; 200 connections at once; a guest server that never reads
//! holds the host to the tunnel's window; a port nobody listens on is refused at once; bad
//! requests are refused by name. Costs: one restore, the guest's Python under TCG (~10-30 s).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use forkbox_engine::api::{ops, CreateRequest, Engine, PortRequest};
use forkbox_test_infra as infra;

/// In the guest: an HTTP server on 8000, a WebSocket echo on 8001 and a server on 8002 that
/// accepts and never reads; prints "up" once all three listen.
const SERVERS: &str = r#"
import base64, hashlib, http.server, os, socket, socketserver, threading, time
os.makedirs('/tmp/www', exist_ok=True)
open('/tmp/www/hello.txt', 'w').write('hello from the guest\n')
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer.request_queue_size = 256
web = http.server.ThreadingHTTPServer(('127.0.0.1', 8000), lambda *a: Quiet(*a, directory='/tmp/www'))
threading.Thread(target=web.serve_forever, daemon=True).start()
class Ws(socketserver.StreamRequestHandler):
    def handle(self):
        head = b''
        while b'\r\n\r\n' not in head:
            head += self.request.recv(4096)
        key = [l.split(b':', 1)[1].strip() for l in head.split(b'\r\n') if l.lower().startswith(b'sec-websocket-key')][0]
        accept = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
        self.request.sendall(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + b'\r\n\r\n')
        while True:
            h = self.rfile.read(2)
            if len(h) < 2:
                return
            n = h[1] & 0x7f
            if n == 126:
                n = int.from_bytes(self.rfile.read(2), 'big')
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if h[0] & 0x0f == 8:
                return
            out = b'echo: ' + data
            self.request.sendall(bytes([0x81, len(out)]) + out)
ws = socketserver.ThreadingTCPServer(('127.0.0.1', 8001), Ws)
threading.Thread(target=ws.serve_forever, daemon=True).start()
pit = socket.socket()
pit.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
pit.bind(('127.0.0.1', 8002))
pit.listen(8)
kept = []
threading.Thread(target=lambda: [kept.append(pit.accept()) for _ in iter(int, 1)], daemon=True).start()
print('up', flush=True)
time.sleep(3600)
"#;

fn try_get(addr: &str, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn http_get(addr: &str, path: &str) -> String {
    try_get(addr, path).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_ports_are_reached_from_the_host() {
    let (paths, cfg) = infra::sandbox_setup("python-bookworm");
    let engine = Engine::private(paths.clone());
    let v = engine
        .call(ops::Create {
            request: CreateRequest {
                image: Some(cfg.image.to_string()),
                ..Default::default()
            },
        })
        .await
        .unwrap();
    let id = v.info.id.clone();
    let sb = engine.sandbox(&id).await.unwrap();
    let sb2 = sb.clone();
    let servers = tokio::spawn(async move {
        sb2.run(infra::argv(&["python3", "-c", SERVERS], &[], 3_600_000))
            .await
    });
    let forward = |guest_port: u16, host_port: Option<u16>| {
        let (engine, id) = (&engine, id.clone());
        async move {
            engine
                .call(ops::ForwardPort {
                    id,
                    request: PortRequest {
                        guest_port,
                        host_port,
                        address: None,
                    },
                })
                .await
        }
    };
    let web = forward(8000, None).await.unwrap();
    assert_eq!(web.url, format!("http://127.0.0.1:{}/", web.host_port));
    let addr = format!("127.0.0.1:{}", web.host_port);
    // The guest's servers take a while to start under emulation.
    assert!(
        infra::wait_until(Duration::from_secs(120), || {
            try_get(&addr, "/hello.txt").is_ok_and(|r| r.contains("hello from the guest"))
        }),
        "the guest's HTTP server never answered through the forward"
    );

    // 200 connections at once, each answered.
    let t0 = Instant::now();
    let answers: Vec<String> = std::thread::scope(|s| {
        let all: Vec<_> = (0..200)
            .map(|_| s.spawn(|| http_get(&addr, "/hello.txt")))
            .collect();
        all.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        answers.iter().all(|a| a.contains("hello from the guest")),
        "{:?}",
        answers.iter().find(|a| !a.contains("hello from the guest"))
    );
    println!(
        "FIGURE 200 concurrent requests through a forward: {:?}",
        t0.elapsed()
    );

    // WebSocket: the upgrade and frames both ways.
    let ws = forward(8001, None).await.unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", ws.host_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(
        head.starts_with("HTTP/1.1 101") && head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "{head}"
    );
    let msg = b"ping";
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | msg.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(msg.iter().enumerate().map(|(i, c)| c ^ mask[i % 4]));
    s.write_all(&frame).unwrap();
    let mut reply = [0u8; 2 + 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[2..], b"echo: ping");

    // A guest server that never reads: the host takes what the window and the socket buffers
    // hold, then the sender waits; nothing grows without bound.
    let pit = forward(8002, None).await.unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", pit.host_port)).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let mut sent = 0usize;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    println!("FIGURE a guest that never reads took {} KiB", sent >> 10);
    assert!(
        sent < 16 << 20,
        "{sent} bytes went to a guest that never reads"
    );

    // Nobody listens on 8003: the host's connection is refused (reset) at once, not hung.
    let none = forward(8003, None).await.unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", none.host_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    let r = s.read(&mut buf);
    assert!(
        matches!(r, Ok(0) | Err(_)) && t0.elapsed() < Duration::from_secs(20),
        "{r:?} after {:?}",
        t0.elapsed()
    );

    // Bad requests: port 0, a host port in use, a bad address; each said, nothing made.
    let e = forward(0, None).await.unwrap_err().to_string();
    assert!(e.contains("1 to 65535"), "{e}");
    let e = forward(8000, Some(web.host_port))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("is in use"), "{e}");
    let e = engine
        .call(ops::ForwardPort {
            id: id.clone(),
            request: PortRequest {
                guest_port: 8000,
                host_port: None,
                address: Some("localhost.example".into()),
            },
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("IP address"), "{e}");
    let listed = engine
        .call(ops::ListPorts { id: id.clone() })
        .await
        .unwrap();
    assert_eq!(listed.len(), 4, "{listed:?}");

    // Closed: the listener is gone.
    engine
        .call(ops::ClosePort {
            id: id.clone(),
            host_port: web.host_port,
        })
        .await
        .unwrap();
    assert!(
        TcpStream::connect(&addr).is_err(),
        "the closed forward still listens"
    );
    // The sandbox goes: so do its forwards.
    engine.call(ops::Delete { id }).await.unwrap();
    assert!(TcpStream::connect(("127.0.0.1", ws.host_port)).is_err());
    servers.abort();
}
