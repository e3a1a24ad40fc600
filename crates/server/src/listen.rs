//! Serving the router on a listener so that no client can starve the daemon: each listener
//! holds at most [`MAX_CONNECTIONS`] connections (one past that is closed at once, so its
//! descriptor is not kept), and a connection that does not finish sending a request's headers
//! within [`HEADER_TIMEOUT`] — also while idle between requests — is closed. The Unix socket
//! and the TCP listener each have their own budget, so a flood on TCP never locks the owner
//! out of the Unix socket.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

/// Connections one listener holds at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Time a client has to send a request's headers, counted from the connection (or the end of
/// the previous response): a slow or idle client is cut off after it.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping daemon waits for requests under way.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `stop` completes; then finishes the requests under way
/// (for at most a few seconds) and returns.
pub async fn serve<L: Listener>(mut listener: L, app: Router, stop: impl Future<Output = ()>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (stopping, stop_rx) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let (io, _) = tokio::select! {
            c = listener.accept() => c,
            () = &mut stop => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over the budget: close it now rather than hold its descriptor.
            drop(io);
            continue;
        };
        let app = app.clone();
        let mut stop_rx = stop_rx.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                app.clone().oneshot(req.map(Body::new))
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            let stopping = tokio::select! {
                _ = conn.as_mut() => false,
                r = stop_rx.wait_for(|s| *s) => r.is_ok(),
            };
            if stopping {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(DRAIN, conn).await;
            }
            drop(slot);
        });
    }
    let _ = stopping.send(true);
    // Every connection gives its slot back when it ends.
    let _ = tokio::time::timeout(
        DRAIN + Duration::from_secs(1),
        slots.acquire_many(MAX_CONNECTIONS as u32),
    )
    .await;
}
