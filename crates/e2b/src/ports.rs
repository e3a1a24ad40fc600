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
    let host_port = match forward(e, id, port).await {
        Ok(p) => p,
        Err(f) if f.status == 404 => {
            return plain(502, format!("The sandbox {id} was not found"));
        }
        Err(f) => return plain(502, f.message),
    };
    let stream = match tokio::net::TcpStream::connect(("127.0.0.1", host_port)).await {
        Ok(s) => s,
        Err(err) => return plain(502, format!("port {port} of {id}: {err}")),
    };
    let unreachable = |err: hyper::Error| {
        plain(
            502,
            format!("nothing answered on port {port} of sandbox {id} ({err}): is a server listening there?"),
        )
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(x) => x,
        Err(err) => return unreachable(err),
    };
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let from_client = hyper::upgrade::on(&mut req);
    let mut answer = match sender.send_request(req).await {
        Ok(a) => a,
        Err(err) => return unreachable(err),
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
