//! Preview URLs: `http://PORT-ID.localhost:P/` on the daemon's TCP listener reaches port PORT of
//! sandbox ID (HTTP and WebSocket), for a browser on the host. Each needs a token good for that
//! sandbox and port alone (a keyed BLAKE3 of both under a key this daemon drew at start): given
//! once as `?forkbox_preview=TOKEN` (the preview URL of a port forward carries it), then kept
//! in a cookie of that host name (`HttpOnly`, `SameSite=Lax`), which a browser sends to that
//! name alone. The daemon's bearer tokens are neither needed nor accepted here, and nothing
//! of the API is reachable under these names.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use forkbox_engine::api::{Engine, EngineError};
use hyper_util::rt::TokioIo;

const PARAM: &str = "forkbox_preview";

struct Config {
    key: [u8; 32],
    tcp_port: u16,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// Turns previews on for the TCP listener on `tcp_port` (once per daemon). A cluster's nodes
/// derive their key from the secret they share, so a preview's token is good on every node
/// (each carries a preview of a sandbox it does not run to the node that does); a single
/// daemon draws one at random.
pub fn enable(tcp_port: u16, cluster_secret: Option<&str>) -> std::io::Result<()> {
    let key = match cluster_secret {
        Some(s) => blake3::derive_key("forkbox preview tokens v1", s.as_bytes()),
        None => {
            let mut key = [0u8; 32];
            getrandom::getrandom(&mut key).map_err(std::io::Error::other)?;
            key
        }
    };
    let _ = CONFIG.set(Config { key, tcp_port });
    Ok(())
}

/// What previews are served from: this daemon's engine, and its cluster node (a preview of a
/// sandbox another node runs is carried there).
#[derive(Clone)]
pub struct Previews {
    pub engine: Arc<Engine>,
    pub node: Option<Arc<crate::cluster::Node>>,
}

fn token_with(key: &[u8; 32], id: &str, port: u16) -> String {
    let h = blake3::keyed_hash(key, format!("preview {id} {port}").as_bytes());
    h.to_hex()[..32].to_string()
}

/// The preview URL of sandbox `id`'s `port`, when the daemon listens on TCP.
pub fn url(id: &str, port: u16) -> Option<String> {
    let c = CONFIG.get()?;
    Some(format!(
        "http://{port}-{id}.localhost:{}/?{PARAM}={}",
        c.tcp_port,
        token_with(&c.key, id, port)
    ))
}

/// `(port, sandbox id)` of a preview host name (`3000-sb-0a1b2c.localhost:7070`).
pub fn target(host: &str) -> Option<(u16, String)> {
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let label = name
        .trim_end_matches('.')
        .to_ascii_lowercase()
        .strip_suffix(".localhost")?
        .to_string();
    let (port, id) = label.split_once('-')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    let ok = id.starts_with("sb-")
        && id.len() <= 64
        && id[3..].chars().all(|c| c.is_ascii_alphanumeric());
    ok.then(|| (port, id.to_string()))
}

fn plain(status: StatusCode, text: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text + "\n",
    )
        .into_response()
}

/// The token a request carries: in the query, else in the cookie.
fn given(req: &Request) -> (Option<String>, bool) {
    let from_query = req.uri().query().and_then(|q| {
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == PARAM)
            .map(|(_, v)| v.to_string())
    });
    if from_query.is_some() {
        return (from_query, true);
    }
    (crate::auth::cookie(req, PARAM), false)
}

/// The request's path and query without the token.
fn without_token(req: &Request) -> String {
    let path = req.uri().path();
    let rest: Vec<&str> = req
        .uri()
        .query()
        .map(|q| {
            q.split('&')
                .filter(|kv| !kv.starts_with(&format!("{PARAM}=")))
                .collect()
        })
        .unwrap_or_default();
    match rest.is_empty() {
        true => path.to_string(),
        false => format!("{path}?{}", rest.join("&")),
    }
}

/// The outermost layer of the TCP listener: a request for a preview host name is served here
/// (and only here); any other goes on to the API.
pub async fn intercept(State(previews): State<Previews>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let Some((port, id)) = target(&host) else {
        return next.run(req).await;
    };
    let Some(config) = CONFIG.get() else {
        return plain(
            StatusCode::NOT_FOUND,
            "previews are off on this daemon".into(),
        );
    };
    let want = token_with(&config.key, &id, port);
    let (token, in_query) = given(&req);
    let valid = token.is_some_and(|t| forkbox_cluster::auth::equal(t.as_bytes(), want.as_bytes()));
    if !valid {
        return plain(
            StatusCode::UNAUTHORIZED,
            format!(
                "this preview of port {port} of {id} needs its token: open the preview_url its port forward gave (`forkbox sandbox port-forward {id} {port}`)"
            ),
        );
    }
    let owner = match &previews.node {
        Some(n) => n.owner_elsewhere(&id).await,
        None => None,
    };
    // The owner checks the same token (a cluster's key), serves it from its guest and sets
    // the cookie itself.
    if let (Some(owner), Some(node)) = (owner, &previews.node) {
        return carry(node, &owner, &id, req).await.unwrap_or_else(|r| r);
    }
    match proxy(&previews.engine, &id, port, req).await {
        Ok(mut r) => {
            if in_query {
                let cookie = format!("{PARAM}={want}; Path=/; HttpOnly; SameSite=Lax");
                if let Ok(v) = HeaderValue::from_str(&cookie) {
                    r.headers_mut().append(header::SET_COOKIE, v);
                }
            }
            r
        }
        Err(r) => r,
    }
}

/// Carries `req` to the guest's `port` and its answer back (a WebSocket upgrade too).
async fn proxy(
    engine: &Engine,
    id: &str,
    port: u16,
    mut req: Request,
) -> Result<Response, Response> {
    let stream = engine.connect_port(id, port).await.map_err(|e| match e {
        EngineError::NoSuchSandbox(_) => {
            plain(StatusCode::NOT_FOUND, format!("sandbox {id} is gone"))
        }
        EngineError::Hibernated(_) => plain(
            StatusCode::CONFLICT,
            format!("sandbox {id} is hibernated: resume it first"),
        ),
        e => plain(StatusCode::BAD_GATEWAY, e.to_string()),
    })?;
    if let Ok(pq) = without_token(&req).parse() {
        *req.uri_mut() = pq;
    }
    relay(stream, req, |e| {
        format!("nothing answered on port {port} of {id} ({e}): is a server listening there?")
    })
    .await
}

/// Carries a preview request, as the browser sent it (its host name and token), to node
/// `owner` that runs sandbox `id` (over mutual TLS in a cluster with certificates), and its
/// answer back.
async fn carry(
    node: &crate::cluster::Node,
    owner: &forkbox_cluster::NodeRecord,
    id: &str,
    req: Request,
) -> Result<Response, Response> {
    let stream = node.dial(owner).await.map_err(|e| {
        plain(
            StatusCode::BAD_GATEWAY,
            format!("the node running {id}: {e}"),
        )
    })?;
    let url = owner.advertise.clone();
    relay(stream, req, |e| {
        format!("the node running {id} ({url}) broke off the preview: {e}")
    })
    .await
}

/// Sends `req` over `stream` (HTTP/1.1) and gives the answer back; a WebSocket upgrade joins
/// both ends.
async fn relay<S>(
    stream: S,
    mut req: Request,
    why: impl Fn(&hyper::Error) -> String,
) -> Result<Response, Response>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let unreachable = |e: hyper::Error| plain(StatusCode::BAD_GATEWAY, why(&e));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(unreachable)?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let from_browser = hyper::upgrade::on(&mut req);
    let mut answer = sender.send_request(req).await.map_err(unreachable)?;
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        let from_guest = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            if let (Ok(a), Ok(b)) = (from_browser.await, from_guest.await) {
                let _ =
                    tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
            }
        });
    }
    Ok(answer.map(Body::new))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn preview_hosts_name_a_port_and_a_sandbox() {
        assert_eq!(
            target("3000-sb-0a1b2c.localhost:7070"),
            Some((3000, "sb-0a1b2c".into()))
        );
        assert_eq!(
            target("8080-SB-00ff.LOCALHOST"),
            Some((8080, "sb-00ff".into()))
        );
        for no in [
            "localhost:7070",
            "127.0.0.1:7070",
            "0-sb-1.localhost",
            "70000-sb-1.localhost",
            "3000-sb-1.example.com",
            "3000-sb-../x.localhost",
            "x-sb-1.localhost",
        ] {
            assert_eq!(target(no), None, "{no}");
        }
    }

    #[test]
    fn a_token_is_good_for_one_sandbox_and_port() {
        let key = [7u8; 32];
        let t = token_with(&key, "sb-1", 3000);
        assert_eq!(t, token_with(&key, "sb-1", 3000));
        assert_ne!(t, token_with(&key, "sb-1", 5432));
        assert_ne!(t, token_with(&key, "sb-2", 3000));
        assert_ne!(t, token_with(&[8u8; 32], "sb-1", 3000));
    }
}
