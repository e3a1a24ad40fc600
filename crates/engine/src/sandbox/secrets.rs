//! Secrets that never enter a guest. A sandbox's commands find a random placeholder in `$NAME`;
//! a connection the guest's proxy opens to one of the secret's hosts is not tunnelled to the
//! host as it is, but ends here: TLS is terminated with a certificate for that host issued by
//! the sandbox's own CA (the guest trusts it through `SSL_CERT_FILE` and its kin; its key
//! never leaves this process), a TLS connection of this side's own goes to the real host
//! (verified against the host's CA bundle), and each HTTP/1.1 request goes on with the
//! placeholder replaced by the value in its headers: as it is (`Authorization: Bearer`, any
//! header) and inside `Basic` credentials (decoded, replaced, encoded again: how git and pip
//! send a token). A placeholder sent anywhere else stays a placeholder. The values live in this
//! process's memory only: not in the state database, a snapshot, a log or a reply.
//!
//! The tunnel machinery in [`crate::net`] carries bytes to a TCP stream; a secret's connection
//! is one to this sandbox's listener on 127.0.0.1, which knows the connection by its source
//! address (registered before connecting) and serves it with what it was opened for.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use forkbox_api::{entry_matches, SecretSpec, SecretView};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// How long the guest may take to start and finish its TLS handshake (under emulation on a
/// busy host, seconds).
const HANDSHAKE: Duration = Duration::from_secs(60);
/// How long the connection to the real host may take, with its TLS handshake.
const UPSTREAM: Duration = Duration::from_secs(30);

/// A sandbox's secrets, its CA and the certificates it issued so far.
pub struct Secrets {
    entries: Vec<Entry>,
    ca_der: CertificateDer<'static>,
    ca_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The one key of every host certificate this CA issues.
    leaf_key: rcgen::KeyPair,
    configs: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

struct Entry {
    name: String,
    hosts: Vec<String>,
    placeholder: String,
    value: String,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// This year, by the host's clock (a certificate's validity starts the year before).
fn this_year() -> i32 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    1970 + (secs / 31_556_952) as i32
}

fn validity(params: &mut rcgen::CertificateParams) {
    let year = this_year();
    params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + 2, 1, 1);
}

impl Secrets {
    /// Secrets for one sandbox (`id` names its CA), each with a fresh placeholder, and a CA
    /// of its own. `specs` were checked with [`forkbox_api::validate_secrets`].
    pub fn new(id: &str, specs: &[SecretSpec]) -> Result<Secrets, String> {
        let entries = specs
            .iter()
            .map(|s| {
                let placeholder = format!(
                    "fbxs_{}",
                    crate::random::hex(20).map_err(|e| format!("draw a placeholder: {e}"))?
                );
                Ok(Entry {
                    name: s.name.clone(),
                    hosts: s.hosts.clone(),
                    placeholder,
                    value: s.value.clone(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let ca_key = rcgen::KeyPair::generate().map_err(|e| format!("make a CA key: {e}"))?;
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("forkbox sandbox {id} CA"),
        );
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params);
        let ca = params
            .self_signed(&ca_key)
            .map_err(|e| format!("make a CA certificate: {e}"))?;
        let leaf_key = rcgen::KeyPair::generate().map_err(|e| format!("make a key: {e}"))?;
        Ok(Secrets {
            entries,
            ca_der: ca.der().clone(),
            ca_pem: ca.pem(),
            issuer: rcgen::Issuer::new(params, ca_key),
            leaf_key,
            configs: Mutex::new(HashMap::new()),
        })
    }

    /// Names and hosts, for the sandbox's view.
    pub fn views(&self) -> Vec<SecretView> {
        self.entries
            .iter()
            .map(|e| SecretView {
                name: e.name.clone(),
                hosts: e.hosts.clone(),
            })
            .collect()
    }

    /// `NAME=placeholder` for every secret: what the guest's commands see.
    pub fn env(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|e| (e.name.clone(), e.placeholder.clone()))
            .collect()
    }

    /// Every host entry of every secret (the network policy allows them).
    pub fn hosts(&self) -> Vec<String> {
        let mut all: Vec<String> = self.entries.iter().flat_map(|e| e.hosts.clone()).collect();
        all.sort();
        all.dedup();
        all
    }

    /// The CA's certificate, PEM: the guest trusts it.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Whether a connection to `host`:`port` is one a secret may go into.
    pub fn scoped(&self, host: &str, port: u16) -> bool {
        self.entries
            .iter()
            .any(|e| e.hosts.iter().any(|h| entry_matches(h, host, port)))
    }

    /// `text` with the placeholder of every secret scoped to `host`:`port` replaced by its
    /// value, and the names of those that were; `None` when none was in it.
    pub fn replace_in(&self, text: &str, host: &str, port: u16) -> Option<(String, Vec<String>)> {
        let mut out = text.to_string();
        let mut used = Vec::new();
        for e in &self.entries {
            if out.contains(&e.placeholder) && e.hosts.iter().any(|h| entry_matches(h, host, port))
            {
                out = out.replace(&e.placeholder, &e.value);
                used.push(e.name.clone());
            }
        }
        (!used.is_empty()).then_some((out, used))
    }

    /// The TLS configuration the guest's side of a connection to `host` is served with: a
    /// certificate for `host` this CA issued (made once per host), HTTP/1.1 only.
    fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        if let Some(c) = lock(&self.configs).get(host) {
            return Ok(c.clone());
        }
        let mut params = rcgen::CertificateParams::new(vec![host.to_string()])
            .map_err(|e| format!("a certificate for {host:?}: {e}"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, host.to_string());
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params);
        let leaf = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(|e| format!("a certificate for {host:?}: {e}"))?;
        let key = PrivateKeyDer::try_from(self.leaf_key.serialize_der())
            .map_err(|e| format!("a key for {host:?}: {e}"))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS for {host:?}: {e}"))?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), self.ca_der.clone()], key)
            .map_err(|e| format!("TLS for {host:?}: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        lock(&self.configs).insert(host.to_string(), config.clone());
        Ok(config)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The TLS configuration of this side's connections to the real hosts: verified against the
/// host's CA bundle (read once), HTTP/1.1.
fn upstream_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let bundle = crate::net::host_ca_bundle().ok_or(
                "the host has no CA bundle (/etc/ssl/certs/ca-certificates.crt or SSL_CERT_FILE) to verify the secret's host against",
            )?;
            let mut roots = rustls::RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(bundle)
                .map_err(|e| format!("read {}: {e}", bundle.display()))?
                .filter_map(Result::ok);
            roots.add_parsable_certificates(certs);
            let mut config = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS: {e}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
}

/// What a connection to the listener was opened for.
#[derive(Clone)]
pub(crate) struct Target {
    pub host: String,
    pub port: u16,
    /// The address the policy resolved the host to.
    pub addr: SocketAddr,
    /// The sandbox, for log lines.
    pub sandbox: String,
}

/// A sandbox's listener for its secrets' connections.
pub struct SecretProxy {
    pub secrets: Arc<Secrets>,
    addr: SocketAddr,
    expected: Arc<Mutex<HashMap<SocketAddr, Target>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for SecretProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl SecretProxy {
    /// Starts the listener of `secrets` on 127.0.0.1 (a port of its own).
    pub async fn start(secrets: Arc<Secrets>) -> std::io::Result<SecretProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let expected: Arc<Mutex<HashMap<SocketAddr, Target>>> = Default::default();
        let (known, s) = (expected.clone(), secrets.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, peer)) = listener.accept().await else {
                    // Out of descriptors, say: wait a moment rather than spin.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                // Only connections this process registered: anyone else on the host gets
                // nothing but a closed connection.
                let Some(target) = lock(&known).remove(&peer) else {
                    continue;
                };
                tokio::spawn(serve(stream, target, s.clone()));
            }
        });
        Ok(SecretProxy {
            secrets,
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
    pub(crate) async fn connect(&self, target: Target) -> std::io::Result<TcpStream> {
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

/// Serves one connection: TLS terminated and requests carried with the secrets put in, or, when
/// the guest does not speak TLS first, the bytes carried to the host untouched (no secret goes
/// into a connection in clear).
async fn serve(guest: TcpStream, t: Target, secrets: Arc<Secrets>) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE, guest.peek(&mut first)).await {
        Ok(Ok(1..)) => {}
        _ => return,
    }
    if first[0] != 0x16 {
        return carry_plain(guest, t).await;
    }
    let config = match secrets.server_config(&t.host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("{}: secrets: {e}", t.sandbox);
            return;
        }
    };
    // The connection to the real host is made while the guest's handshake runs (a guest
    // under emulation takes tens of ms for it): the request then waits for neither in turn.
    let accept = tokio::time::timeout(
        HANDSHAKE,
        tokio_rustls::TlsAcceptor::from(config).accept(guest),
    );
    let (accepted, up) = tokio::join!(accept, upstream(&t));
    let guest_tls = match accepted {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(
                "{}: secrets: the guest's TLS handshake for {} failed: {e}",
                t.sandbox,
                t.host
            );
            return;
        }
        Err(_) => return,
    };
    let io = TokioIo::new(guest_tls);
    let served = match up {
        Ok(sender) => {
            let sender = Arc::new(tokio::sync::Mutex::new(sender));
            let t = t.clone();
            let service = hyper::service::service_fn(move |req| {
                let (sender, secrets, t) = (sender.clone(), secrets.clone(), t.clone());
                async move { forward(req, &sender, &secrets, &t).await }
            });
            hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
        }
        Err(why) => {
            tracing::info!("{}: secrets: {why}", t.sandbox);
            let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                let why = why.clone();
                async move { Ok::<_, std::convert::Infallible>(bad_gateway(&why)) }
            });
            hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
        }
    };
    if let Err(e) = served {
        tracing::debug!(
            "{}: secrets: a connection to {} ended: {e}",
            t.sandbox,
            t.host
        );
    }
}

type Body = http_body_util::combinators::BoxBody<hyper::body::Bytes, hyper::Error>;

fn bad_gateway(why: &str) -> Response<Body> {
    let body = http_body_util::Full::new(hyper::body::Bytes::from(format!("forkbox: {why}\n")))
        .map_err(|never| match never {})
        .boxed();
    let mut r = Response::new(body);
    *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
    r
}

/// The connection to the real host: TCP to the address the policy chose, TLS verified for its
/// name, HTTP/1.1.
async fn upstream(t: &Target) -> Result<hyper::client::conn::http1::SendRequest<Incoming>, String> {
    let config = upstream_config()?;
    let name = ServerName::try_from(t.host.clone())
        .map_err(|e| format!("{} is not a name TLS can verify: {e}", t.host))?;
    let connect = async {
        let tcp = TcpStream::connect(t.addr)
            .await
            .map_err(|e| format!("{}:{} ({}): {e}", t.host, t.port, t.addr))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| {
                format!(
                    "TLS to {}:{} failed (verified against the host's CA bundle): {e}",
                    t.host, t.port
                )
            })?;
        hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP to {}:{}: {e}", t.host, t.port))
    };
    let (sender, conn) = tokio::time::timeout(UPSTREAM, connect)
        .await
        .map_err(|_| {
            format!(
                "{}:{}: no answer within {} s",
                t.host,
                t.port,
                UPSTREAM.as_secs()
            )
        })??;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One request: its headers with the secrets put in, sent on to the real host.
async fn forward(
    mut req: Request<Incoming>,
    sender: &tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
    secrets: &Secrets,
    t: &Target,
) -> Result<Response<Body>, std::convert::Infallible> {
    let used = put_secrets(req.headers_mut(), secrets, &t.host, t.port);
    if !used.is_empty() {
        tracing::info!(
            "{}: secrets {} put into a request to {}:{}",
            t.sandbox,
            used.join(", "),
            t.host,
            t.port
        );
    }
    let mut sender = sender.lock().await;
    if sender.ready().await.is_err() {
        return Ok(bad_gateway(&format!("{} closed the connection", t.host)));
    }
    match sender.send_request(req).await {
        Ok(r) => Ok(r.map(|b| b.boxed())),
        Err(e) => Ok(bad_gateway(&format!("{}:{}: {e}", t.host, t.port))),
    }
}

/// Replaces the placeholders of the secrets scoped to `host`:`port` in every header, and inside
/// `Basic` credentials; returns the names of the secrets put in.
pub fn put_secrets(
    headers: &mut hyper::HeaderMap,
    secrets: &Secrets,
    host: &str,
    port: u16,
) -> Vec<String> {
    let mut used = Vec::new();
    for (name, value) in headers.iter_mut() {
        let Ok(text) = value.to_str() else {
            continue;
        };
        let basic = (name == AUTHORIZATION)
            .then(|| text.get(..6).filter(|p| p.eq_ignore_ascii_case("basic ")))
            .flatten()
            .and_then(|_| {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(text[6..].trim())
                    .ok()?;
                let creds = String::from_utf8(raw).ok()?;
                let (creds, names) = secrets.replace_in(&creds, host, port)?;
                let encoded = base64::engine::general_purpose::STANDARD.encode(creds);
                Some((format!("{} {encoded}", &text[..5]), names))
            });
        let replaced = basic.or_else(|| secrets.replace_in(text, host, port));
        if let Some((new, names)) = replaced {
            if let Ok(v) = HeaderValue::from_str(&new) {
                *value = v;
                used.extend(names);
            }
        }
    }
    used.sort();
    used.dedup();
    used
}

/// A connection to a secret's host that does not start with TLS: carried as it is.
async fn carry_plain(mut guest: TcpStream, t: Target) {
    let Ok(Ok(mut remote)) = tokio::time::timeout(UPSTREAM, TcpStream::connect(t.addr)).await
    else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut guest, &mut remote).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> Secrets {
        Secrets::new(
            "sb-test",
            &[
                SecretSpec {
                    name: "TOKEN".into(),
                    hosts: vec!["api.example.com".into(), "10.9.8.7:8443".into()],
                    value: "real-value-1".into(),
                },
                SecretSpec {
                    name: "OTHER".into(),
                    hosts: vec!["*.other.org".into()],
                    value: "real-value-2".into(),
                },
            ],
        )
        .expect("secrets")
    }

    fn placeholder(s: &Secrets, name: &str) -> String {
        s.env()
            .into_iter()
            .find(|(n, _)| n == name)
            .expect("a placeholder")
            .1
    }

    #[test]
    fn placeholders_are_replaced_only_for_their_hosts() {
        let s = secrets();
        let p = placeholder(&s, "TOKEN");
        assert!(!p.contains("real-value"));
        let mut h = hyper::HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            format!("Bearer {p}").parse().expect("header"),
        );
        h.insert("x-api-key", p.parse().expect("header"));
        let used = put_secrets(&mut h.clone(), &s, "elsewhere.example.com", 443);
        assert!(used.is_empty());
        let mut there = h.clone();
        assert_eq!(
            put_secrets(&mut there, &s, "api.example.com", 443),
            ["TOKEN"]
        );
        assert_eq!(there[AUTHORIZATION], "Bearer real-value-1");
        assert_eq!(there["x-api-key"], "real-value-1");
        // The entry's port, not another.
        assert!(s.scoped("10.9.8.7", 8443) && !s.scoped("10.9.8.7", 443));
        // A subdomain entry: subdomains, not the domain itself.
        assert!(s.scoped("pkg.other.org", 443) && !s.scoped("other.org", 443));
        let q = placeholder(&s, "OTHER");
        let mut cross = hyper::HeaderMap::new();
        cross.insert(
            AUTHORIZATION,
            format!("Bearer {q}").parse().expect("header"),
        );
        assert!(put_secrets(&mut cross, &s, "api.example.com", 443).is_empty());
        assert_eq!(cross[AUTHORIZATION], format!("Bearer {q}").as_str());
    }

    #[test]
    fn basic_credentials_are_decoded_replaced_and_encoded() {
        let s = secrets();
        let p = placeholder(&s, "TOKEN");
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut h = hyper::HeaderMap::new();
        let sent = format!("Basic {}", b64.encode(format!("x-access-token:{p}")));
        h.insert(AUTHORIZATION, sent.parse().expect("header"));
        assert_eq!(put_secrets(&mut h, &s, "api.example.com", 443), ["TOKEN"]);
        let got = h[AUTHORIZATION].to_str().expect("text");
        let creds = b64.decode(&got[6..]).expect("base64");
        assert_eq!(creds, b"x-access-token:real-value-1");
    }

    #[test]
    fn each_sandbox_has_its_own_ca_and_placeholders() {
        let (a, b) = (secrets(), secrets());
        assert_ne!(a.ca_pem(), b.ca_pem());
        assert_ne!(placeholder(&a, "TOKEN"), placeholder(&b, "TOKEN"));
        assert!(!a.ca_pem().contains("PRIVATE"));
        // A certificate per host, made once.
        let c1 = a.server_config("api.example.com").expect("config");
        let c2 = a.server_config("api.example.com").expect("config");
        assert!(Arc::ptr_eq(&c1, &c2));
        a.server_config("10.9.8.7")
            .expect("an IP address gets a certificate too");
    }
}
