//! One guest connection to a registry, and its requests answered from the cache or the
//! registry (see [`super`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use http_cache_semantics::{AfterResponse, BeforeRequest, CacheOptions, CachePolicy};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt as _;

use super::store::{Key, Stored, Writing};
use super::PackageCache;
use crate::intercept::{Opened, Target};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// How a guest's request was answered (for the log and the counts).
#[derive(Debug, Clone, Copy)]
enum How {
    Hit,
    Revalidated,
    Fetched,
    Passed,
    Stale,
}

/// Serves one guest connection: TLS ended with the home CA's certificate for the registry,
/// then HTTP/1.1 requests until the guest closes it.
pub(super) async fn connection(cache: Arc<PackageCache>, guest: tokio::net::TcpStream, t: Target) {
    let config = match cache.ca.server_config(&t.host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("{}: package cache: {e}", t.sandbox);
            return;
        }
    };
    let Opened::Tls(tls) = crate::intercept::accept(guest, &t, config).await else {
        return;
    };
    let target = t.clone();
    let service = hyper::service::service_fn(move |req| {
        let (cache, t) = (cache.clone(), target.clone());
        async move { Ok::<_, std::convert::Infallible>(answer(&cache, req, &t).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .await
    {
        tracing::debug!(
            "{}: package cache: a connection to {} ended: {e}",
            t.sandbox,
            t.host
        );
    }
}

/// The hop-by-hop headers, which belong to one connection, never to a response kept or a
/// request carried on.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        h.remove(*name);
    }
}

/// Whether `uri` is a package archive: an npm tarball or a file PyPI serves (never changed
/// once published).
fn is_archive(uri: &http::Uri) -> bool {
    let path = uri.path();
    (path.contains("/-/") && path.ends_with(".tgz"))
        || (uri.host() == Some("files.pythonhosted.org") && path.starts_with("/packages/"))
}

/// The freshness a registry that says nothing of it is given (see [`super`]).
fn heuristic_freshness(uri: &http::Uri, status: StatusCode, h: &mut HeaderMap) {
    if status != StatusCode::OK
        || h.contains_key(header::CACHE_CONTROL)
        || h.contains_key(header::EXPIRES)
    {
        return;
    }
    let value = if is_archive(uri) {
        "public, max-age=31536000, immutable"
    } else {
        "public, max-age=300"
    };
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(value));
}

/// Answers one request of a guest.
async fn answer(cache: &PackageCache, req: Request<Incoming>, t: &Target) -> Response<Body> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let uri: http::Uri = match format!("https://{}{path}", t.host).parse() {
        Ok(u) => u,
        Err(e) => return bad_gateway(&format!("{}{path}: {e}", t.host)),
    };
    let (mut parts, body) = req.into_parts();
    let (method, url) = (parts.method.clone(), uri.to_string());
    parts.uri = uri;
    strip_hop_by_hop(&mut parts.headers);
    let kept = parts.method == Method::GET
        && [header::AUTHORIZATION, header::COOKIE, header::RANGE]
            .iter()
            .all(|h| !parts.headers.contains_key(h));
    let (response, how) = if kept {
        cached(cache, parts, t).await
    } else {
        (
            pass(cache, parts, reqwest::Body::wrap(body), t).await,
            How::Passed,
        )
    };
    tracing::debug!("{}: package cache: {} {}: {how:?}", t.sandbox, method, url);
    let counts = &cache.counts;
    match how {
        How::Hit | How::Stale => &counts.hits,
        How::Revalidated => &counts.revalidated,
        How::Fetched => &counts.fetched,
        How::Passed => &counts.passed,
    }
    .fetch_add(1, Ordering::Relaxed);
    response
}

/// A GET that may be answered from the cache.
async fn cached(
    cache: &PackageCache,
    parts: http::request::Parts,
    t: &Target,
) -> (Response<Body>, How) {
    let key = Key::of(&parts);
    // One request per key asks the registry at a time: forks installing the same lock at once
    // fetch each package once, the others answered from what the first kept.
    let _asking = cache.asking(&key).await;
    let Some(stored) = cache.store.get(&key).await else {
        return fetch(cache, &key, &parts, t).await;
    };
    let request = match stored.policy.before_request(&parts, SystemTime::now()) {
        BeforeRequest::Fresh(res) => return (from_store(cache, stored, res), How::Hit),
        BeforeRequest::Stale { matches: false, .. } => return fetch(cache, &key, &parts, t).await,
        BeforeRequest::Stale { request, .. } => request,
    };
    let resp = match send(cache, t, &request, reqwest::Body::from(Vec::new())).await {
        Ok(r) => r,
        // Disconnected: a stale response is better than none (RFC 9111, 4.2.4), unless
        // the registry said it must not be used so.
        Err(why) => match stale(&stored.policy, &parts) {
            Some(res) => {
                tracing::info!(
                    "{}: package cache: {}: {why}; answered with what was kept",
                    t.sandbox,
                    parts.uri
                );
                return (from_store(cache, stored, res), How::Stale);
            }
            None => return (bad_gateway(&why), How::Passed),
        },
    };
    if resp.status() != StatusCode::NOT_MODIFIED {
        return keep(cache, &key, &parts, resp, t).await;
    }
    match stored
        .policy
        .after_response(&parts, &seen(&resp), SystemTime::now())
    {
        AfterResponse::NotModified(policy, res) => {
            cache
                .store
                .update(&key, &policy, stored.size, &parts.uri.to_string())
                .await;
            (from_store(cache, stored, res), How::Revalidated)
        }
        // A 304 that does not match what was kept: ask again, unconditionally.
        AfterResponse::Modified(..) => fetch(cache, &key, &parts, t).await,
    }
}

/// The kept response, stale, when the registry cannot be asked: allowed unless it said it
/// must be revalidated (RFC 9111, 4.2.4: a request's `max-stale` is how a client asks).
fn stale(p: &CachePolicy, parts: &http::request::Parts) -> Option<http::response::Parts> {
    let mut asked = parts.clone();
    asked
        .headers
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("max-stale"));
    match p.before_request(&asked, SystemTime::now()) {
        BeforeRequest::Fresh(res) => Some(res),
        BeforeRequest::Stale { .. } => None,
    }
}

/// The status and headers of a registry's answer, as HTTP caching reads them.
fn seen(resp: &reqwest::Response) -> http::Response<()> {
    let mut headers = resp.headers().clone();
    strip_hop_by_hop(&mut headers);
    let mut seen = http::Response::new(());
    *seen.status_mut() = resp.status();
    *seen.headers_mut() = headers;
    seen
}

/// Asks the registry for `parts` and keeps the answer if it may be kept.
async fn fetch(
    cache: &PackageCache,
    key: &Key,
    parts: &http::request::Parts,
    t: &Target,
) -> (Response<Body>, How) {
    match send(cache, t, parts, reqwest::Body::from(Vec::new())).await {
        Ok(resp) => keep(cache, key, parts, resp, t).await,
        Err(why) => (bad_gateway(&why), How::Passed),
    }
}

/// Keeps `resp` under `key` if HTTP caching lets it (written whole, then served from the
/// cache), or carries it to the guest as it is.
async fn keep(
    cache: &PackageCache,
    key: &Key,
    parts: &http::request::Parts,
    resp: reqwest::Response,
    t: &Target,
) -> (Response<Body>, How) {
    let mut seen = seen(&resp);
    heuristic_freshness(&parts.uri, resp.status(), seen.headers_mut());
    let policy = CachePolicy::new_options(parts, &seen, SystemTime::now(), CacheOptions::default());
    let small = resp
        .content_length()
        .is_none_or(|n| n <= cache.store.largest());
    if resp.status() != StatusCode::OK || !policy.is_storable() || !small {
        return (carry(resp), How::Passed);
    }
    let url = parts.uri.to_string();
    let mut w = match write(cache, resp).await {
        Ok(w) => w,
        Err(why) => {
            tracing::info!("{}: package cache: {url}: {why}", t.sandbox);
            return (bad_gateway(&why), How::Passed);
        }
    };
    cache
        .counts
        .bytes_fetched
        .fetch_add(w.size, Ordering::Relaxed);
    // Kept when it fits; served either way from the file it was written to.
    let how = match w.size <= cache.store.largest() {
        true => match cache.store.put(key, &mut w, &policy, &url).await {
            Ok(()) => How::Fetched,
            Err(e) => {
                tracing::info!("{}: package cache: keep {url}: {e}", t.sandbox);
                How::Passed
            }
        },
        false => How::Passed,
    };
    let size = w.size;
    match w.into_read().await {
        Ok(file) => (from_file(cache, seen.into_parts().0, file, size), how),
        Err(e) => (bad_gateway(&format!("{url}: {e}")), How::Passed),
    }
}

/// Writes `resp`'s body to a new file of the store.
async fn write(cache: &PackageCache, mut resp: reqwest::Response) -> Result<Writing, String> {
    let url = resp.url().to_string();
    let mut w = cache
        .store
        .begin()
        .await
        .map_err(|e| format!("the package cache: {e}"))?;
    loop {
        match resp.chunk().await {
            Ok(Some(data)) => w
                .write(&data)
                .await
                .map_err(|e| format!("the package cache: {e}"))?,
            Ok(None) => return Ok(w),
            Err(e) => return Err(format!("{url}: {e}")),
        }
    }
}

/// Sends `parts` (with `body`) to the registry over the host's own connection.
async fn send(
    cache: &PackageCache,
    t: &Target,
    parts: &http::request::Parts,
    body: reqwest::Body,
) -> Result<reqwest::Response, String> {
    let client = cache.client(t)?;
    let mut headers = parts.headers.clone();
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    client
        .request(parts.method.clone(), parts.uri.to_string())
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(|e| format!("{}: {}", parts.uri, error_chain(&e)))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A request carried to the registry and its answer back, kept nowhere.
async fn pass(
    cache: &PackageCache,
    parts: http::request::Parts,
    body: reqwest::Body,
    t: &Target,
) -> Response<Body> {
    match send(cache, t, &parts, body).await {
        Ok(resp) => carry(resp),
        Err(why) => bad_gateway(&why),
    }
}

/// The registry's answer, streamed to the guest as it comes.
fn carry(resp: reqwest::Response) -> Response<Body> {
    let resp: http::Response<reqwest::Body> = resp.into();
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, body.map_err(|e| Box::new(e) as BoxError).boxed())
}

/// A kept response: `res`'s status and headers, its body from the cache.
fn from_store(cache: &PackageCache, stored: Stored, res: http::response::Parts) -> Response<Body> {
    from_file(cache, res, stored.body, stored.size)
}

/// A response whose body is read from `file` (`size` bytes) as the guest takes it: a guest
/// that reads nothing holds a few chunks of it in memory, no more.
fn from_file(
    cache: &PackageCache,
    mut res: http::response::Parts,
    mut file: tokio::fs::File,
    size: u64,
) -> Response<Body> {
    strip_hop_by_hop(&mut res.headers);
    res.headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    cache
        .counts
        .bytes_from_cache
        .fetch_add(size, Ordering::Relaxed);
    let (mut tx, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(4);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match file.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => {
                    if tx
                        .send_data(Bytes::copy_from_slice(&buf[..n]))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    tx.abort(Box::new(e));
                    return;
                }
            }
        }
    });
    Response::from_parts(res, body.boxed())
}

fn bad_gateway(why: &str) -> Response<Body> {
    let body = http_body_util::Full::new(Bytes::from(format!("forkbox package cache: {why}\n")))
        .map_err(|never| match never {})
        .boxed();
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r
}
