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
    let seen = match admit(e, id, port, &mut req).await {
        Ok(seen) => seen,
        Err(refused) => return refused,
    };
    // A forward to a paused sandbox of autoResume wakes it.
    let asleep = seen
        .as_ref()
        .is_some_and(|v| crate::shape::state(v) == "paused");
    let first = open(e, id, port).await;
    let (sender, woke) = match first {
        Ok(s) => (s, asleep),
        Err(refused) => {
            // A sandbox of autoResume that was being paused as the request came (its TTL ran
            // out; listed as paused meanwhile): resumed once the pause is done (the daemon's
            // resume waits for it), and the request goes to it.
            if !matches!(e.awake(id).await, Ok(true)) {
                return refused;
            }
            match open(e, id, port).await {
                Ok(s) => (s, true),
                Err(_) => return refused,
            }
        }
    };
    let from_client = hyper::upgrade::on(&mut req);
    let answered = if repeatable(&req) {
        let emulated = seen.is_some_and(|v| v.info.accel.accel == forkbox_api::Accel::Tcg);
        let waits = match (woke, emulated) {
            (true, _) => WOKEN_WAITS,
            (false, true) => EMULATED_DIAL_WAITS,
            (false, false) => DIAL_WAITS,
        };
        send_again_while_closed(e, id, port, sender, req, waits).await
    } else {
        let mut sender = sender;
        sender
            .send_request(req)
            .await
            .map_err(|err| unreachable(id, port, err))
    };
    let mut answer = match answered {
        Ok(a) => a,
        Err(refused) => return refused,
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

/// The pauses between tries of a request whose port nobody listens on yet, as E2B's sandbox
/// proxy dials a sandbox's port again (5 tries, 100 to 400 ms apart: a server that is
/// starting gets about a second).
const DIAL_WAITS: &[u64] = &[100, 200, 300, 400];

/// The same in a sandbox under TCG, where a server starts ~15 times slower than under KVM (a
/// `python3` HTTP server listens 1.5 s after its start in a new sandbox, several seconds on
/// a busy host): E2B's tries, then every 500 ms to 5 s in all.
const EMULATED_DIAL_WAITS: &[u64] = &[100, 200, 300, 400, 500, 500, 500, 500, 500, 500, 500, 500];

/// The same after the request woke its sandbox: the guest was frozen where its pause found
/// it, and a server it was starting (a TTL may run out seconds after the start; under TCG a
/// `python3 -m http.server` takes 1.5 s to listen in a new sandbox) listens only once the
/// guest runs again: tried again every 200 ms for 10 s.
const WOKEN_WAITS: &[u64] = &[200; 50];

/// Whether `req` may be sent again when nothing answered it: no body, and a method that asks
/// for nothing to change (GET, HEAD, OPTIONS). A closed port inside the guest ends the
/// forward's connection before any answer, as a server that closed without answering would:
/// only such a request is safe to repeat.
fn repeatable(req: &Request) -> bool {
    use axum::http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
    use axum::http::Method;
    let h = req.headers();
    matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS)
        && !h.contains_key(TRANSFER_ENCODING)
        && h.get(CONTENT_LENGTH).is_none_or(|v| v.as_bytes() == b"0")
}

/// Whether `err` is how a forward's connection ends when nothing listens on the guest's port:
/// reset before any answer (the forward's refusal), or closed.
fn nothing_listened(err: &hyper::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    let io = std::error::Error::source(err).and_then(|s| s.downcast_ref::<std::io::Error>());
    err.is_incomplete_message()
        || err.is_closed()
        || io.is_some_and(|e| matches!(e.kind(), ConnectionReset | BrokenPipe | ConnectionAborted))
}

/// Sends repeatable `req`, and while nothing answers on the port, again on a new connection
/// after each of `waits` (milliseconds).
async fn send_again_while_closed(
    e: &E2b,
    id: &str,
    port: u16,
    mut sender: hyper::client::conn::http1::SendRequest<Body>,
    req: Request,
    waits: &[u64],
) -> Result<axum::http::Response<hyper::body::Incoming>, Response> {
    let (parts, _) = req.into_parts();
    let mut waits = waits.iter();
    loop {
        let mut again = Request::new(Body::empty());
        *again.method_mut() = parts.method.clone();
        *again.uri_mut() = parts.uri.clone();
        *again.version_mut() = parts.version;
        *again.headers_mut() = parts.headers.clone();
        let err = match sender.send_request(again).await {
            Ok(a) => return Ok(a),
            Err(err) => err,
        };
        match waits.next() {
            Some(ms) if nothing_listened(&err) => {
                tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
                sender = open(e, id, port).await?;
            }
            _ => return Err(unreachable(id, port, err)),
        }
    }
}

/// The header a request to a sandbox's port carries its traffic access token in.
const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Lets `req` through to `port` of sandbox `id` as its create asked: with its traffic access
/// token when its traffic is not public (403 without), the token taken off; its Host made the
/// sandbox's `maskRequestHost`. Gives the sandbox as it found it.
async fn admit(
    e: &E2b,
    id: &str,
    port: u16,
    req: &mut Request,
) -> Result<Option<forkbox_api::SandboxView>, Response> {
    let Ok(v) = e.daemon.get(id).await else {
        // Not there: the forward says so.
        return Ok(None);
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
    Ok(Some(v))
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
