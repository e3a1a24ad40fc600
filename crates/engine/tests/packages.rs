//! The package cache on the host, without a VM: a registry the test runs (Python's HTTPS
//! server on loopback, its certificate from a test CA this process trusts through
//! `SSL_CERT_FILE`) answers with the headers real registries send or leave out, and a client
//! that trusts only the cache's CA speaks to the cache's listener as a guest's tunnel does
//! (TLS, HTTP/1.1 keep-alive). What the registry was asked, line by line, says what was
//! answered from the cache. ~3 s.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::net::SocketAddr;
use std::sync::Arc;

use forkbox_engine::intercept::Target;
use forkbox_engine::packages::{PackageCache, Settings};
use forkbox_test_infra as infra;
use http_body_util::BodyExt as _;
use rustls_pki_types::pem::PemObject as _;

/// The registry: answers by path, logs `METHOD PATH IF-NONE-MATCH` per request.
const REGISTRY: &str = r#"
import http.server, ssl, sys
port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
TARBALL = bytes(range(256)) * 64
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a):
        pass
    def reply(self, code, body, headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        n = int(self.headers.get('Content-Length') or 0)
        body = self.rfile.read(n)
        print('POST', self.path, len(body), flush=True)
        self.reply(201, b'published %d bytes' % len(body))
    def do_GET(self):
        inm = self.headers.get('If-None-Match', '-')
        print('GET', self.path, inm, flush=True)
        if self.path == '/left-pad':
            return self.reply(200, b'{"name":"left-pad"}', [('Content-Type', 'application/json')])
        if self.path == '/left-pad/-/left-pad-1.3.0.tgz':
            return self.reply(200, TARBALL, [('Content-Type', 'application/octet-stream')])
        if self.path == '/tagged':
            if inm == '"v1"':
                return self.reply(304, b'', [('ETag', '"v1"'), ('Cache-Control', 'no-cache')])
            return self.reply(200, b'tagged body', [('ETag', '"v1"'), ('Cache-Control', 'no-cache')])
        if self.path == '/private':
            return self.reply(200, b'for one user', [('Cache-Control', 'private')])
        if self.path == '/slow/-/slow-1.0.0.tgz':
            import time
            time.sleep(1)
            return self.reply(200, TARBALL, [('Content-Type', 'application/octet-stream')])
        if self.path == '/brief':
            return self.reply(200, b'fresh for a second', [('Cache-Control', 'max-age=1')])
        self.reply(404, b'no such package')
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv = http.server.ThreadingHTTPServer(('127.0.0.1', port), H)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
"#;

const HOST: &str = "registry.test";

struct Registry {
    child: std::process::Child,
    log: std::path::PathBuf,
    addr: SocketAddr,
}

impl Registry {
    fn start(dir: &std::path::Path, cert: &std::path::Path, key: &std::path::Path) -> Registry {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let script = dir.join("registry.py");
        std::fs::write(&script, REGISTRY).unwrap();
        let log = dir.join("registry.log");
        let child = std::process::Command::new("python3")
            .arg(&script)
            .arg(port.to_string())
            .arg(cert)
            .arg(key)
            .stdout(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        for _ in 0..100 {
            if std::net::TcpStream::connect(addr).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Registry { child, log, addr }
    }

    /// The requests it was sent so far.
    fn asked(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<hyper::body::Bytes>>;

/// A guest's connection to the registry through the cache: TLS that trusts only the cache's
/// CA, then HTTP/1.1.
async fn guest(cache: &Arc<PackageCache>, addr: SocketAddr) -> Sender {
    let target = Target {
        host: HOST.into(),
        port: 443,
        addr,
        sandbox: "sb-test".into(),
    };
    let tcp = cache.connect(target).await.unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_slice(cache.ca_pem().as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(HOST.try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn ask(s: &mut Sender, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    s.ready().await.unwrap();
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", HOST)
        .header("accept", "application/json")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            body.to_vec(),
        )))
        .unwrap();
    let resp = s.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registries_are_answered_from_the_cache_as_http_caching_says() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = infra::test_pki(&[HOST.to_string()]);
    let files = ["ca.pem", "cert.pem", "key.pem"].map(|f| dir.path().join(f));
    for (f, text) in files.iter().zip([&ca, &cert, &key]) {
        std::fs::write(f, text).unwrap();
    }
    // The cache verifies the registry against this bundle.
    std::env::set_var("SSL_CERT_FILE", &files[0]);
    let registry = Registry::start(dir.path(), &files[1], &files[2]);
    let settings = || Settings {
        hosts: vec![HOST.into()],
        max_bytes: 64 << 20,
    };
    let home = dir.path().join("cache");
    let cache = PackageCache::open(&home, settings()).unwrap();
    assert!(cache.covers(HOST, 443) && !cache.covers(HOST, 80) && !cache.covers("x.test", 443));
    let mut g = guest(&cache, registry.addr).await;

    // A document and an archive that say nothing of freshness: fetched once each.
    let doc = ask(&mut g, "GET", "/left-pad", b"").await;
    assert_eq!(doc, (200, b"{\"name\":\"left-pad\"}".to_vec()));
    assert_eq!(ask(&mut g, "GET", "/left-pad", b"").await, doc);
    let tgz = ask(&mut g, "GET", "/left-pad/-/left-pad-1.3.0.tgz", b"").await;
    assert_eq!((tgz.0, tgz.1.len()), (200, 256 * 64));
    // Another connection, as the next sandbox's: the same bytes, not asked again.
    let mut g2 = guest(&cache, registry.addr).await;
    assert_eq!(
        ask(&mut g2, "GET", "/left-pad/-/left-pad-1.3.0.tgz", b"").await,
        tgz
    );
    // Two guests asking for the same new archive at once: the registry is asked once.
    let (a, b) = tokio::join!(
        ask(&mut g, "GET", "/slow/-/slow-1.0.0.tgz", b""),
        ask(&mut g2, "GET", "/slow/-/slow-1.0.0.tgz", b"")
    );
    assert_eq!(a, b);
    assert_eq!(a.1.len(), 256 * 64);
    // `no-cache` with a validator: asked each time, conditionally the second.
    assert_eq!(
        ask(&mut g, "GET", "/tagged", b"").await,
        (200, b"tagged body".to_vec())
    );
    assert_eq!(
        ask(&mut g2, "GET", "/tagged", b"").await,
        (200, b"tagged body".to_vec())
    );
    // `private`, a publish and a 404: carried, kept nowhere.
    for _ in 0..2 {
        assert_eq!(ask(&mut g, "GET", "/private", b"").await.0, 200);
    }
    assert_eq!(
        ask(&mut g, "POST", "/left-pad", b"new version").await,
        (201, b"published 11 bytes".to_vec())
    );
    assert_eq!(ask(&mut g, "GET", "/missing", b"").await.0, 404);
    // Fresh for a second: stale after it, and with the registry gone, answered with what was
    // kept rather than an error.
    assert_eq!(ask(&mut g, "GET", "/brief", b"").await.0, 200);

    let asked = registry.asked();
    let count = |prefix: &str| asked.iter().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(count("GET /left-pad -"), 1, "{asked:?}");
    assert_eq!(count("GET /left-pad/-/left-pad-1.3.0.tgz"), 1, "{asked:?}");
    assert_eq!(count("GET /tagged -"), 1, "{asked:?}");
    assert_eq!(count("GET /tagged \"v1\""), 1, "revalidated: {asked:?}");
    assert_eq!(count("GET /private"), 2, "{asked:?}");
    assert_eq!(count("POST /left-pad 11"), 1, "{asked:?}");
    assert_eq!(count("GET /slow/-/slow-1.0.0.tgz"), 1, "{asked:?}");
    let c = cache.counts();
    assert_eq!((c.hits, c.revalidated), (3, 1), "{c:?}");
    assert_eq!(c.fetched, 5, "{c:?}");
    assert_eq!(c.passed, 4, "{c:?}");

    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    drop(registry);
    let (status, body) = ask(&mut g, "GET", "/brief", b"").await;
    assert_eq!((status, body.as_slice()), (200, &b"fresh for a second"[..]));

    // A daemon started again keeps what was kept, and its CA.
    let pem = cache.ca_pem().to_string();
    drop((g, g2, cache));
    let again = PackageCache::open(&home, settings()).unwrap();
    assert_eq!(again.ca_pem(), pem);
    let mut g = guest(&again, SocketAddr::from(([127, 0, 0, 1], 1))).await;
    assert_eq!(
        ask(&mut g, "GET", "/left-pad/-/left-pad-1.3.0.tgz", b"").await,
        tgz
    );
    assert_eq!(again.counts().hits, 1);
}
