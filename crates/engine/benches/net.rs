//! What secrets and port forwards cost. Run with `bench/run.sh net` (or `cargo bench -p
//! forkbox-engine --bench net`). One run prints, each next to what it is compared with:
//!
//! - an HTTPS request from the guest (a new connection each, through the guest's proxy) to a
//!   server whose host a secret is scoped to (TLS terminated on the host, the header rewritten,
//!   TLS again to the server) against the same request to the same kind of server through a
//!   plain CONNECT tunnel: p50 and p99 of BENCH_REQUESTS (default 40) each, interleaved;
//! - a port forward: 100 MB from a server in the guest to this host (MB/s), and an HTTP request
//!   to the guest's http.server (a new connection each, p50 over BENCH_REQUESTS), against the
//!   same servers run by `podman run -p` on this host when podman can start a container here,
//!   else in a network namespace over a veth pair (the path podman's port mapping takes, less
//!   its NAT), said which.
//!
//! The servers are Python under TCG in the guest and native Python on the host: the guest's
//! side is slower for that alone (TCG runs Python ~15x slower); the figures say what a user
//! gets here.

#![allow(clippy::unwrap_used)] // benches fail loudly by design

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use forkbox_engine::api::{ops, CreateRequest, Engine, PortRequest, SecretSpec};
use forkbox_engine::net::NetworkPolicy;
use forkbox_engine::sandbox::Sandbox;
use forkbox_test_infra as infra;

mod common;
use common::{env_count, ms, runtime, stats};

const HTTPS_SERVER: &str = r#"
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_GET(self):
        body = b'ok'
        self.send_response(200)
        self.send_header('Content-Length', '2')
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[3], sys.argv[4])
srv = http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
"#;

/// In the guest: `n` requests to each URL, interleaved, a new connection each; prints
/// `URL MS` per request.
const CLIENT: &str = r#"
import os, sys, time, urllib.request
n = int(sys.argv[1])
for i in range(n):
    for url in sys.argv[2:]:
        req = urllib.request.Request(url, headers={'Authorization': 'Bearer ' + os.environ['TOKEN']})
        t = time.perf_counter()
        urllib.request.urlopen(req, timeout=120).read()
        print(url, (time.perf_counter() - t) * 1000, flush=True)
"#;

/// A server that sends 100 MB to each connection, and an http.server, on `addr`.
const SERVERS: &str = r#"
import http.server, os, socket, sys, threading
addr = sys.argv[1]
os.makedirs('/tmp/www', exist_ok=True)
open('/tmp/www/i.txt', 'w').write('hello\n')
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass
web = http.server.ThreadingHTTPServer((addr, 8000), lambda *a: Quiet(*a, directory='/tmp/www'))
threading.Thread(target=web.serve_forever, daemon=True).start()
bulk = socket.socket()
bulk.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
bulk.bind((addr, 9000))
bulk.listen(4)
block = b'\0' * (1 << 20)
print('up', flush=True)
while True:
    c, _ = bulk.accept()
    for _ in range(100):
        c.sendall(block)
    c.close()
"#;

async fn run(sb: &Sandbox, argv: &[&str], env: &[(&str, &str)]) -> String {
    let out = sb.run(infra::argv(argv, env, 1_800_000)).await.unwrap();
    assert_eq!(out.code(), 0, "{}", String::from_utf8_lossy(&out.stderr));
    out.stdout_text()
}

fn p(v: &[f64]) -> String {
    let (p50, p99, _) = stats(v.to_vec());
    format!("p50 {p50:.1} ms, p99 {p99:.1} ms")
}

/// Ms per HTTP request to `addr`, a new connection each.
fn http_times(addr: &str, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let mut s = TcpStream::connect(addr).unwrap();
            write!(s, "GET /i.txt HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).unwrap();
            assert!(
                out.ends_with(b"hello\n"),
                "{}",
                String::from_utf8_lossy(&out)
            );
            ms(t.elapsed())
        })
        .collect()
}

/// MB/s of the 100 MB a connection to `addr` is sent.
fn bulk_rate(addr: &str) -> f64 {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0usize;
    loop {
        match s.read(&mut buf).unwrap() {
            0 => break,
            n => got += n,
        }
    }
    assert_eq!(got, 100 << 20);
    got as f64 / 1e6 / t.elapsed().as_secs_f64()
}

fn wait_http(addr: &str) {
    assert!(
        infra::wait_until(Duration::from_secs(300), || {
            TcpStream::connect(addr).is_ok_and(|mut s| {
                let _ = write!(s, "GET /i.txt HTTP/1.0\r\nHost: x\r\n\r\n");
                let mut out = Vec::new();
                let _ = s.read_to_end(&mut out);
                out.ends_with(b"hello\n")
            })
        }),
        "no server answered on {addr}"
    );
}

/// The servers on this host behind `podman run -p`, or in a namespace over a veth when podman
/// cannot start a container here: their address and what they are.
fn host_servers(
    net: &mut infra::TestNet,
    dir: &std::path::Path,
) -> (String, String, Option<String>) {
    let script = dir.join("servers.py");
    std::fs::write(&script, SERVERS).unwrap();
    let name = format!("forkbox-bench-net-{}", std::process::id());
    let podman = std::process::Command::new("podman")
        .args(["run", "--rm", "-d", "--name", &name, "-v", "/usr:/usr:ro"])
        .arg("-v")
        .arg(format!("{}:/servers.py:ro", script.display()))
        .args(["-p", "127.0.0.1:18000:8000", "-p", "127.0.0.1:19000:9000"])
        .args([
            "localhost/forkbox-bench-debian",
            "python3",
            "/servers.py",
            "0.0.0.0",
        ])
        .output();
    match podman {
        Ok(o) if o.status.success() => {
            wait_http("127.0.0.1:18000");
            ("127.0.0.1".into(), "podman run -p".into(), Some(name))
        }
        other => {
            let why = match other {
                Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
                Err(e) => e.to_string(),
            };
            println!("podman cannot start a container here ({why}); the host's servers run in a network namespace over a veth instead");
            let ip = net.peer_ips[0].clone();
            net.run_server(
                "python3",
                &[script.to_str().unwrap(), &ip],
                &ip,
                8000,
                &dir.join("servers.log"),
            );
            (
                ip,
                "a network namespace over a veth (podman's path, less its NAT)".into(),
                None,
            )
        }
    }
}

fn main() {
    let n = env_count("BENCH_REQUESTS", 40);
    let rt = runtime();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut net = infra::TestNet::new();
        let [a, b] = net.peer_ips.clone();
        let (ca, cert, key) = infra::test_pki(&[a.clone(), b.clone()]);
        for (f, text) in [("ca.pem", &ca), ("cert.pem", &cert), ("key.pem", &key)] {
            std::fs::write(dir.path().join(f), text).unwrap();
        }
        std::env::set_var("SSL_CERT_FILE", dir.path().join("ca.pem"));
        let server = dir.path().join("https.py");
        std::fs::write(&server, HTTPS_SERVER).unwrap();
        for ip in [&a, &b] {
            let (c, k) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            net.run_server(
                "python3",
                &[server.to_str().unwrap(), ip, "443", c.to_str().unwrap(), k.to_str().unwrap()],
                ip,
                443,
                &dir.path().join(format!("{ip}.log")),
            );
        }
        let (paths, cfg) = infra::sandbox_setup("python-bookworm");
        let engine = Engine::private(paths.clone());
        let v = engine
            .call(ops::Create {
                request: CreateRequest {
                    image: Some(cfg.image.to_string()),
                    network: Some(NetworkPolicy {
                        internet: false,
                        allow: vec![format!("{b}:443")],
                        deny: Vec::new(),
                    }),
                    secrets: vec![SecretSpec {
                        name: "TOKEN".into(),
                        hosts: vec![a.clone()],
                        value: "bench-value".into(),
                        header: None,
                    }],
                    ..Default::default()
                },
            })
            .await
            .unwrap();
        let sb = engine.sandbox(&v.info.id).await.unwrap();
        let (via_secret, via_tunnel) = (format!("https://{a}/"), format!("https://{b}/"));
        // One round first: the guest's Python and the host's certificate for the host warm.
        let warm = format!("{n}");
        let _ = run(&sb, &["python3", "-c", CLIENT, "1", &via_secret, &via_tunnel], &[]).await;
        let out = run(&sb, &["python3", "-c", CLIENT, &warm, &via_secret, &via_tunnel], &[]).await;
        let times = |url: &str| -> Vec<f64> {
            out.lines()
                .filter_map(|l| l.strip_prefix(url))
                .filter_map(|t| t.trim().parse().ok())
                .collect()
        };
        let (s, t) = (times(&via_secret), times(&via_tunnel));
        println!("== secrets: an HTTPS request from the guest, a new connection each ({n} each, interleaved)");
        println!("through the secret's connection (TLS ended on the host, header rewritten): {}", p(&s));
        println!("through a plain CONNECT tunnel:                                        {}", p(&t));
        let (s50, t50) = (stats(s.clone()).0, stats(t.clone()).0);
        println!("overhead at p50: {:.1} ms (goal <= 5 ms)", s50 - t50);

        println!("== ports: guest servers reached from this host");
        let sb2 = sb.clone();
        let guest = tokio::spawn(async move {
            run(&sb2, &["python3", "-c", SERVERS, "127.0.0.1"], &[]).await
        });
        let forward = |guest_port: u16| {
            let (engine, id) = (&engine, v.info.id.clone());
            async move {
                let p = engine
                    .call(ops::ForwardPort {
                        id,
                        request: PortRequest {
                            guest_port,
                            host_port: None,
                            address: None,
                        },
                    })
                    .await
                    .unwrap();
                format!("127.0.0.1:{}", p.host_port)
            }
        };
        let (web, bulk) = (forward(8000).await, forward(9000).await);
        let host_dir = dir.path().to_path_buf();
        let (host_ip, what, container) = host_servers(&mut net, &host_dir);
        let (host_web, host_bulk) = match container {
            Some(_) => ("127.0.0.1:18000".to_string(), "127.0.0.1:19000".to_string()),
            None => (format!("{host_ip}:8000"), format!("{host_ip}:9000")),
        };
        let (web2, bulk2, hw, hb) = (web.clone(), bulk.clone(), host_web.clone(), host_bulk.clone());
        let figures = tokio::task::spawn_blocking(move || {
            wait_http(&web2);
            let fwd = (bulk_rate(&bulk2), http_times(&web2, n));
            let host = (bulk_rate(&hb), http_times(&hw, n));
            (fwd, host)
        })
        .await
        .unwrap();
        let ((fwd_rate, fwd_times), (host_rate, host_times)) = figures;
        println!("100 MB from the guest through a forward: {fwd_rate:.1} MB/s; through {what}: {host_rate:.1} MB/s ({:.2}x)", fwd_rate / host_rate);
        println!("an HTTP request through a forward: {}; through {what}: {}", p(&fwd_times), p(&host_times));
        println!(
            "request latency ratio at p50: {:.1}x (the guest's server runs under TCG)",
            stats(fwd_times).0 / stats(host_times).0
        );
        if let Some(name) = container {
            let _ = std::process::Command::new("podman").args(["rm", "-f", &name]).output();
        }
        guest.abort();
        engine.call(ops::Delete { id: v.info.id.clone() }).await.unwrap();
    });
}
