//! envd, E2B's in-sandbox services, answered on the host: `process.Process` and
//! `filesystem.Filesystem` over the Connect protocol (JSON codec), `/files` and `/health`.
//! Every call names its sandbox (`E2b-Sandbox-Id`) and carries that sandbox's access token
//! (`X-Access-Token`), then becomes calls of the daemon's API: commands, their events and
//! stdin, files, and small POSIX scripts for what a Debian root answers by itself
//! ([`crate::guest`]).

mod files;
mod filesystem;
mod process;
mod watch;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use futures_util::StreamExt as _;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::connect::{self, Reader};
use crate::errors::Failure;
use crate::{keys, E2b};

pub(crate) use process::Proc;
pub(crate) use watch::Watcher;

pub(crate) fn router(state: Arc<E2b>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/files", get(files::read).post(files::write))
        .route("/process.Process/{method}", post(process::call))
        .route("/filesystem.Filesystem/{method}", post(filesystem::call))
        .layer(axum::extract::DefaultBodyLimit::max(
            forkbox_api::MAX_FILE_BYTES + (1 << 20),
        ))
        .with_state(state)
}

/// The sandbox a data-plane call is for, and the user it names (`""`: the default one).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub id: String,
    pub user: String,
}

/// The sandbox named by the call's headers, once its access token is checked; the user from
/// `Authorization: Basic` (`user` for `/files`, which names it in the query).
pub(crate) fn target(e: &E2b, headers: &HeaderMap, user: Option<&str>) -> Result<Target, Failure> {
    let id = headers
        .get(crate::SANDBOX_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Failure::new(400, "the E2b-Sandbox-Id header is missing"))?
        .to_string();
    let token = headers
        .get(crate::ACCESS_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !keys::token_ok(&e.key, &id, token) {
        return Err(Failure::new(
            401,
            format!("the access token is not sandbox {id}'s (X-Access-Token, from its create or connect)"),
        ));
    }
    let user = match user {
        Some(u) => u.to_string(),
        None => basic_user(headers).unwrap_or_default(),
    };
    check_user(&user)?;
    Ok(Target { id, user })
}

/// [`target`] with the user of `Authorization: Basic`, its sandbox resumed first if it is
/// paused and asked for that ([`E2b::awake`]).
pub(crate) async fn awake_target(e: &E2b, headers: &HeaderMap) -> Result<Target, Failure> {
    let t = target(e, headers, None)?;
    e.awake(&t.id).await?;
    Ok(t)
}

/// The user of `Authorization: Basic base64("user:")`.
fn basic_user(headers: &HeaderMap) -> Option<String> {
    let v = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let b = v.strip_prefix("Basic ")?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b.trim())
        .ok()?;
    let s = String::from_utf8(raw).ok()?;
    Some(s.split(':').next().unwrap_or("").to_string())
}

/// A user name as `useradd` takes them (or empty: the default user).
fn check_user(u: &str) -> Result<(), Failure> {
    let ok = u.len() <= 32
        && u.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        && !u.starts_with('-');
    match ok {
        true => Ok(()),
        false => Err(Failure::new(400, format!("user {u:?} is not a user name"))),
    }
}

/// `GET /health`: 204 while the sandbox runs; 502 in the shape E2B's proxy answers when it
/// does not (the SDK's `is_running` then says false).
async fn health(
    axum::extract::State(e): axum::extract::State<Arc<E2b>>,
    headers: HeaderMap,
) -> Response {
    let t = match target(&e, &headers, Some("")) {
        Ok(t) => t,
        Err(f) => return f.into_response(),
    };
    match e.running(&t.id).await {
        true => StatusCode::NO_CONTENT.into_response(),
        false => not_running(&t.id),
    }
}

/// E2B's 502 for a sandbox that is not running.
pub(crate) fn not_running(id: &str) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        axum::Json(serde_json::json!({
            "sandboxId": id,
            "message": "The sandbox was not found",
            "code": 502,
        })),
    )
        .into_response()
}

// -- the Connect protocol's halves ----------------------------------------------------------

/// A unary call's request message.
pub(crate) fn unary<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Failure> {
    let body = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        bytes
    };
    serde_json::from_slice(body).map_err(|e| Failure::new(400, format!("the request message: {e}")))
}

/// A unary call's answer: `call` given its body (at most 1 MiB), its message or its error as
/// the protocol says them.
pub(crate) async fn unary_answer<F, Fut>(body: Body, call: F) -> Response
where
    F: FnOnce(axum::body::Bytes) -> Fut,
    Fut: std::future::Future<Output = Result<Value, Failure>>,
{
    let r = match axum::body::to_bytes(body, 1 << 20).await {
        Ok(bytes) => call(bytes).await,
        Err(err) => Err(Failure::new(400, format!("the request body: {err}"))),
    };
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(f) => f.connect_response(),
    }
}

/// A body's enveloped messages, one at a time (a streaming request).
pub(crate) struct Messages {
    body: axum::body::BodyDataStream,
    reader: Reader,
    ready: std::collections::VecDeque<connect::Frame>,
}

impl Messages {
    pub fn new(body: Body) -> Messages {
        Messages {
            body: body.into_data_stream(),
            reader: Reader::default(),
            ready: Default::default(),
        }
    }

    /// The next message (none at the body's end or its end-of-stream frame).
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, Failure> {
        loop {
            if let Some(f) = self.ready.pop_front() {
                if f.is_end() {
                    return Ok(None);
                }
                return serde_json::from_slice(&f.message)
                    .map(Some)
                    .map_err(|e| Failure::new(400, format!("a request message: {e}")));
            }
            match self.body.next().await {
                Some(Ok(piece)) => {
                    let frames = self
                        .reader
                        .push(&piece)
                        .map_err(|e| Failure::new(400, format!("the request stream: {e}")))?;
                    self.ready.extend(frames);
                }
                Some(Err(e)) => return Err(Failure::new(400, format!("the request body: {e}"))),
                None => {
                    self.reader
                        .finish()
                        .map_err(|e| Failure::new(400, format!("the request stream: {e}")))?;
                    return Ok(None);
                }
            }
        }
    }
}

/// A streaming call's first request message, read before its answer starts (a client that
/// sent `Expect: 100-continue` sends its body only once the server reads it), and the rest.
pub(crate) async fn first_message(body: Body) -> Result<(Messages, Value), Failure> {
    let mut msgs = Messages::new(body);
    match msgs.next::<Value>().await? {
        Some(v) => Ok((msgs, v)),
        None => Err(Failure::new(400, "the request stream held no message")),
    }
}

/// A request message of type `T`.
pub(crate) fn message<T: DeserializeOwned>(v: Value) -> Result<T, Failure> {
    serde_json::from_value(v).map_err(|e| Failure::new(400, format!("the request message: {e}")))
}

/// The sending half of a server stream: messages, then its end.
pub(crate) struct Stream {
    tx: tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
}

impl Stream {
    /// A stream and the response that carries it.
    pub fn open() -> (Stream, Response) {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let resp = (
            [(axum::http::header::CONTENT_TYPE, "application/connect+json")],
            body,
        )
            .into_response();
        (Stream { tx }, resp)
    }

    /// Sends message `v`; false once the client has gone.
    pub async fn send(&self, v: &Value) -> bool {
        self.tx.send(Ok(connect::message(v))).await.is_ok()
    }

    /// Cuts the stream short, as a connection to a sandbox that died is: no end frame, the
    /// response broken off (the SDKs then ask `/health` and, the sandbox gone, raise
    /// "killed or reached its end of life").
    pub async fn cut(&self) {
        let lost = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "sandbox gone");
        let _ = self.tx.send(Err(lost)).await;
    }

    /// Ends the stream, with an error or without.
    pub async fn end(self, error: Option<&Failure>) {
        let frame = match error {
            Some(f) => connect::end(Some(f.connect())),
            None => connect::end(None),
        };
        let _ = self.tx.send(Ok(frame)).await;
    }

    /// Whether the client has gone.
    pub fn closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The interval of keepalive messages the client asks for (`Keepalive-Ping-Interval`, s).
pub(crate) fn keepalive(headers: &HeaderMap) -> std::time::Duration {
    let s = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(90)
        .clamp(1, 3600);
    std::time::Duration::from_secs(s)
}

/// The call's deadline (`connect-timeout-ms`), if any.
pub(crate) fn deadline_ms(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
}

/// A proto `bytes` field, as the JSON codec carries it (standard base64, padded or not, or URL
/// safe).
pub(crate) fn bytes_field(s: &str) -> Result<Vec<u8>, Failure> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    STANDARD
        .decode(s)
        .or_else(|_| STANDARD_NO_PAD.decode(s))
        .or_else(|_| URL_SAFE.decode(s))
        .or_else(|_| URL_SAFE_NO_PAD.decode(s))
        .map_err(|e| Failure::new(400, format!("a bytes field is not base64: {e}")))
}

pub(crate) fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_user_comes_from_basic_auth() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h), None);
        h.insert(
            axum::http::header::AUTHORIZATION,
            format!("Basic {}", b64(b"root:")).parse().unwrap(),
        );
        assert_eq!(basic_user(&h).as_deref(), Some("root"));
        assert!(check_user("user").is_ok() && check_user("").is_ok());
        assert!(check_user("a;b").is_err() && check_user("-x").is_err());
        assert_eq!(bytes_field("aGk=").unwrap(), b"hi");
        assert_eq!(bytes_field("aGk").unwrap(), b"hi");
    }
}
