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
//! A secret's connection is one to this sandbox's listener ([`crate::intercept`]).

use std::sync::Arc;

use base64::Engine as _;
use forkbox_api::{entry_matches, SecretSpec, SecretView};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use crate::ca::Ca;
use crate::intercept::{Listener, Opened, Target, UPSTREAM};

/// A sandbox's secrets, its CA and the certificates it issued so far.
pub struct Secrets {
    entries: Vec<Entry>,
    ca: Ca,
}

struct Entry {
    name: String,
    hosts: Vec<String>,
    placeholder: String,
    value: String,
    /// The header it sets on its hosts' requests (then the guest has no placeholder).
    header: Option<hyper::header::HeaderName>,
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
                let header = match &s.header {
                    Some(h) => Some(
                        hyper::header::HeaderName::from_bytes(h.as_bytes())
                            .map_err(|e| format!("secret {}: header {h:?}: {e}", s.name))?,
                    ),
                    None => None,
                };
                Ok(Entry {
                    name: s.name.clone(),
                    hosts: s.hosts.clone(),
                    placeholder,
                    value: s.value.clone(),
                    header,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let ca = Ca::new(&format!("forkbox sandbox {id} CA"))?;
        Ok(Secrets { entries, ca })
    }

    /// Names and hosts, for the sandbox's view.
    pub fn views(&self) -> Vec<SecretView> {
        self.entries
            .iter()
            .map(|e| SecretView {
                name: e.name.clone(),
                hosts: e.hosts.clone(),
                header: e.header.as_ref().map(|h| h.to_string()),
            })
            .collect()
    }

    /// `NAME=placeholder` for every secret the guest sends itself: what the guest's
    /// commands see (a secret that sets a header has none).
    pub fn env(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .filter(|e| e.header.is_none())
            .map(|e| (e.name.clone(), e.placeholder.clone()))
            .collect()
    }

    /// Sets the headers of the secrets scoped to `host`:`port` that set one, replacing what
    /// the guest sent; the names of those set.
    pub fn set_headers(
        &self,
        headers: &mut hyper::HeaderMap,
        host: &str,
        port: u16,
    ) -> Vec<String> {
        let mut set = Vec::new();
        for e in &self.entries {
            let Some(h) = &e.header else { continue };
            if !e.hosts.iter().any(|x| entry_matches(x, host, port)) {
                continue;
            }
            if let Ok(v) = HeaderValue::from_str(&e.value) {
                let mut v = v;
                v.set_sensitive(true);
                headers.insert(h.clone(), v);
                set.push(e.name.clone());
            }
        }
        set
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
        self.ca.pem()
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
}

/// A sandbox's listener for its secrets' connections.
pub struct SecretProxy {
    pub secrets: Arc<Secrets>,
    listener: Listener,
}

impl SecretProxy {
    /// Starts the listener of `secrets`.
    pub async fn start(secrets: Arc<Secrets>) -> std::io::Result<SecretProxy> {
        let s = secrets.clone();
        let listener = Listener::start(Arc::new(move |stream, target| {
            Box::pin(serve(stream, target, s.clone()))
        }))
        .await?;
        Ok(SecretProxy { secrets, listener })
    }

    /// Where the listener is (on the host's loopback, which no guest may reach).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.listener.addr()
    }

    /// A connection for a tunnel to `target`, served by this listener.
    pub(crate) async fn connect(&self, target: Target) -> std::io::Result<TcpStream> {
        self.listener.connect(target).await
    }
}

/// Serves one connection: TLS terminated and requests carried with the secrets put in, or, when
/// the guest does not speak TLS first, the bytes carried to the host untouched (no secret goes
/// into a connection in clear).
async fn serve(guest: TcpStream, t: Target, secrets: Arc<Secrets>) {
    let config = match secrets.ca.server_config(&t.host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("{}: secrets: {e}", t.sandbox);
            return;
        }
    };
    // The connection to the real host is made while the guest's handshake runs (a guest
    // under emulation takes tens of ms for it): the request then waits for neither in turn.
    let (opened, up) = tokio::join!(crate::intercept::accept(guest, &t, config), upstream(&t));
    let Opened::Tls(guest_tls) = opened else {
        return;
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
    let config = crate::ca::upstream_config()?;
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
    let mut used = put_secrets(req.headers_mut(), secrets, &t.host, t.port);
    used.extend(secrets.set_headers(req.headers_mut(), &t.host, t.port));
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
                    header: None,
                },
                SecretSpec {
                    name: "OTHER".into(),
                    hosts: vec!["*.other.org".into()],
                    value: "real-value-2".into(),
                    header: None,
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
    fn a_header_secret_sets_its_header_on_its_hosts_alone() {
        let s = Secrets::new(
            "sb-test",
            &[SecretSpec {
                name: "E2B_RULE_1".into(),
                hosts: vec!["api.example.com".into()],
                value: "Bearer real-value-3".into(),
                header: Some("Authorization".into()),
            }],
        )
        .expect("secrets");
        // The guest gets no placeholder for it.
        assert!(s.env().is_empty());
        let mut h = hyper::HeaderMap::new();
        h.insert(AUTHORIZATION, "Bearer guest-sent".parse().expect("header"));
        assert!(s
            .set_headers(&mut h.clone(), "other.example.com", 443)
            .is_empty());
        assert_eq!(
            s.set_headers(&mut h, "api.example.com", 443),
            ["E2B_RULE_1"]
        );
        assert_eq!(h[AUTHORIZATION], "Bearer real-value-3");
        assert_eq!(h.get_all(AUTHORIZATION).iter().count(), 1);
        assert!(s.scoped("api.example.com", 443));
        assert_eq!(s.views()[0].header.as_deref(), Some("authorization"));
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
        let c1 = a.ca.server_config("api.example.com").expect("config");
        let c2 = a.ca.server_config("api.example.com").expect("config");
        assert!(Arc::ptr_eq(&c1, &c2));
        a.ca.server_config("10.9.8.7")
            .expect("an IP address gets a certificate too");
    }
}
