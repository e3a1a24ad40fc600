//! `get_host(port)` in domain mode: a request for `PORT-ID.D` reaches port PORT of sandbox ID,
//! as on E2B (anyone who can reach the daemon's listener and names the sandbox; E2B's
//! `allowPublicTraffic: false` is refused at create). It goes through a port forward of the
//! daemon (made once per sandbox and port, reused after), HTTP and WebSocket alike.

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;

use crate::errors::Failure;
use crate::E2b;

/// `(port, sandbox id)` of host name `host` (`8080-sb-0a1b2c.D`, a port of the listener's
/// after `:`) under `domain`.
pub fn target(host: &str, domain: &str) -> Option<(u16, String)> {
    let name = host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let label = name.strip_suffix(domain)?.strip_suffix('.')?;
    if label.contains('.') {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    let ok = !id.is_empty()
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    ok.then(|| (port, id.to_string()))
}

fn plain(status: u16, text: String) -> Response {
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// E2B's answer for a port of a sandbox that is not there (killed, or never was).
fn gone(id: &str) -> Response {
    let body = serde_json::json!({
        "message": "The sandbox was not found",
        "sandboxId": id,
        "code": 502,
    });
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}

/// The host port whose connections reach `port` of sandbox `id` (a forward of the daemon's,
/// made now if there is none).
async fn forward(e: &E2b, id: &str, port: u16) -> Result<u16, Failure> {
    let ports = e.daemon.list_ports(id).await?;
    if let Some(p) = ports
        .iter()
        .find(|p| p.guest_port == port && p.address == "127.0.0.1")
    {
        return Ok(p.host_port);
    }
    let _one = e.forwarding.lock().await;
    let ports = e.daemon.list_ports(id).await?;
    if let Some(p) = ports
        .iter()
        .find(|p| p.guest_port == port && p.address == "127.0.0.1")
    {
        return Ok(p.host_port);
    }
    let v = e
        .daemon
        .forward_port(
            id,
            &forkbox_api::PortRequest {
                guest_port: port,
                ..Default::default()
            },
        )
        .await?;
    Ok(v.host_port)
}

/// Carries `req` to port `port` of sandbox `id` and its answer back (a WebSocket upgrade
/// joins both ends).
pub async fn proxy(e: &E2b, id: &str, port: u16, mut req: Request) -> Response {
    if let Err(refused) = admit(e, id, port, &mut req).await {
        return refused;
    }
    let first = open(e, id, port).await;
    let mut sender = match first {
        Ok(s) => s,
        Err(refused) => {
            // A sandbox of autoResume that was being paused as the request came (its TTL ran
            // out; listed as paused meanwhile): resumed once the pause is done (the daemon's
            // resume waits for it), and the request goes to it.
            if e.awake(id).await.is_err() {
                return refused;
            }
            match open(e, id, port).await {
                Ok(s) => s,
                Err(_) => return refused,
            }
        }
    };
    let from_client = hyper::upgrade::on(&mut req);
    let mut answer = match sender.send_request(req).await {
        Ok(a) => a,
        Err(err) => return unreachable(id, port, err),
    };
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        let from_guest = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            if let (Ok(a), Ok(b)) = (from_client.await, from_guest.await) {
                let _ =
                    tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
            }
        });
    }
    answer.map(Body::new)
}

/// The header a request to a sandbox's port carries its traffic access token in.
const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Lets `req` through to `port` of sandbox `id` as its create asked: with its traffic access
/// token when its traffic is not public (403 without), the token taken off; its Host made the
/// sandbox's `maskRequestHost`.
async fn admit(e: &E2b, id: &str, port: u16, req: &mut Request) -> Result<(), Response> {
    let Ok(v) = e.daemon.get(id).await else {
        // Not there: the forward says so.
        return Ok(());
    };
    let token = req
        .headers_mut()
        .remove(TRAFFIC_TOKEN_HEADER)
        .and_then(|h| h.to_str().ok().map(str::to_string));
    if crate::shape::private_traffic(&v)
        && !token.is_some_and(|t| crate::keys::traffic_token_ok(&e.key, id, &t))
    {
        return Err(plain(
            403,
            format!(
                "sandbox {id}'s traffic is not public: send its traffic access token in \
                 {TRAFFIC_TOKEN_HEADER}"
            ),
        ));
    }
    // Carried over HTTP/1: an HTTP/2 request's authority becomes its Host, its target the
    // path alone.
    if let Some(authority) = req.uri().authority().cloned() {
        if !req.headers().contains_key(axum::http::header::HOST) {
            if let Ok(h) = axum::http::HeaderValue::from_str(authority.as_str()) {
                req.headers_mut().insert(axum::http::header::HOST, h);
            }
        }
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        if let Ok(uri) = path.parse() {
            *req.uri_mut() = uri;
        }
        *req.version_mut() = axum::http::Version::HTTP_11;
    }
    if let Some(mask) = v.labels.get(crate::keys::MASK_HOST_LABEL) {
        let host = mask.replace("${PORT}", &port.to_string());
        if let Ok(h) = axum::http::HeaderValue::from_str(&host) {
            req.headers_mut().insert(axum::http::header::HOST, h);
        }
    }
    Ok(())
}

/// An HTTP/1 connection to `port` of sandbox `id`, or the 502 that says why there is none.
async fn open(
    e: &E2b,
    id: &str,
    port: u16,
) -> Result<hyper::client::conn::http1::SendRequest<Body>, Response> {
    let host_port = match forward(e, id, port).await {
        Ok(p) => p,
        Err(f) if f.status == 404 => return Err(gone(id)),
        Err(f) => return Err(plain(502, f.message)),
    };
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", host_port))
        .await
        .map_err(|err| plain(502, format!("port {port} of {id}: {err}")))?;
    // Header names written as Go's servers and proxies write them (`Host`, `User-Agent`),
    // as E2B's edge passes them on.
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|err| unreachable(id, port, err))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

fn unreachable(id: &str, port: u16, err: hyper::Error) -> Response {
    plain(
        502,
        format!(
            "nothing answered on port {port} of sandbox {id} ({err}): is a server listening there?"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_a_port_and_a_sandbox_under_the_domain() {
        let d = "e2b.test";
        assert_eq!(
            target("8080-sb-0a1b2c.e2b.test", d),
            Some((8080, "sb-0a1b2c".into()))
        );
        assert_eq!(
            target("8080-sb-0a1b2c.E2B.test.:443", d),
            Some((8080, "sb-0a1b2c".into()))
        );
        assert_eq!(target("api.e2b.test", d), None);
        assert_eq!(target("8080-sb-1.x.e2b.test", d), None);
        assert_eq!(target("8080-sb-1.e2b.testing", d), None);
        assert_eq!(target("0-sb-1.e2b.test", d), None);
        assert_eq!(target("8080-sb-1.other.test", d), None);
    }
}
