//! forkbox's HTTP API, versioned under `/v1`: each route parses its request into one
//! [`forkbox_engine::api::Command`] and renders the reply or the error. The daemon listens on a
//! Unix socket in forkbox's home, mode 0600.
#![forbid(unsafe_code)]

pub mod auth;
pub mod listen;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use forkbox_engine::api::{
    Command, CreateRequest, Engine, EngineError, ExecRequest, ForkRequest, SnapshotRequest,
};
use forkbox_engine::error::{AgentError, ImageError, SandboxError};
use forkbox_engine::paths::Paths;

/// Where the daemon listens.
pub fn socket_path(paths: &Paths) -> PathBuf {
    paths.home().join("forkbox.sock")
}

/// The daemon's PID file.
pub fn pid_path(paths: &Paths) -> PathBuf {
    paths.home().join("daemon.pid")
}

struct ApiError(EngineError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self.0 {
            EngineError::NoSuchSandbox(_) | EngineError::NoSuchCommand(..) => StatusCode::NOT_FOUND,
            EngineError::BadRequest(_) => StatusCode::BAD_REQUEST,
            EngineError::Hibernated(_) | EngineError::NotHibernated(_) => StatusCode::CONFLICT,
            EngineError::Sandbox(SandboxError::Image(
                ImageError::NotFound { .. } | ImageError::BadReference(_),
            )) => StatusCode::BAD_REQUEST,
            EngineError::Sandbox(SandboxError::Snapshot(e)) | EngineError::Snapshot(e) => {
                use forkbox_engine::snapshot::SnapshotError as S;
                match e {
                    S::NotFound(_) => StatusCode::NOT_FOUND,
                    S::Exists(_) | S::InUse { .. } => StatusCode::CONFLICT,
                    S::BadName(_) | S::Incompatible { .. } => StatusCode::BAD_REQUEST,
                    S::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
                }
            }
            EngineError::Sandbox(SandboxError::DiskTooSmall { .. } | SandboxError::Network(_)) => {
                StatusCode::BAD_REQUEST
            }
            EngineError::Sandbox(SandboxError::Agent(AgentError::Failed(_))) => {
                StatusCode::CONFLICT
            }
            EngineError::Sandbox(SandboxError::HostDiskFull { .. }) => {
                StatusCode::INSUFFICIENT_STORAGE
            }
            EngineError::Sandbox(_) | EngineError::State(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (
            status,
            Json(serde_json::json!({ "error": self.0.to_string() })),
        )
            .into_response()
    }
}

type Api = Result<Response, ApiError>;

async fn run(engine: &Arc<Engine>, cmd: Command, ok: StatusCode) -> Api {
    // The command runs to its end even if the client goes away meanwhile: a create or fork
    // that was under way still registers its sandboxes (they are then listed), rather than
    // being dropped halfway.
    let engine = engine.clone();
    let reply = tokio::spawn(async move { engine.handle(cmd).await })
        .await
        .map_err(|e| {
            ApiError(EngineError::BadRequest(format!(
                "the request's task failed: {e}"
            )))
        })?
        .map_err(ApiError)?;
    Ok((ok, Json(reply)).into_response())
}

/// The API's description, kept beside the handlers and checked against them by a test.
pub const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

async fn health() -> Response {
    Json(serde_json::json!({
        "ok": true,
        "version": env!("CARGO_PKG_VERSION"),
        "protocol_version": forkbox_protocol::PROTOCOL_VERSION,
    }))
    .into_response()
}

async fn create(State(e): State<Arc<Engine>>, Json(r): Json<CreateRequest>) -> Api {
    run(&e, Command::Create(r), StatusCode::CREATED).await
}

async fn list(State(e): State<Arc<Engine>>, Query(q): Query<HashMap<String, String>>) -> Api {
    let label = match q.get("label") {
        None => None,
        Some(kv) => match kv.split_once('=') {
            Some((k, v)) => Some((k.to_string(), v.to_string())),
            None => {
                return Err(ApiError(EngineError::BadRequest(format!(
                    "label filter {kv:?} is not K=V"
                ))))
            }
        },
    };
    let state = match q.get("state") {
        None => None,
        Some(s) => Some(
            serde_json::from_value(serde_json::Value::String(s.clone())).map_err(|_| {
                ApiError(EngineError::BadRequest(format!(
                    "state filter {s:?} is not one of running, disk_full, hibernated, failed"
                )))
            })?,
        ),
    };
    run(&e, Command::List { label, state }, StatusCode::OK).await
}

async fn get_one(State(e): State<Arc<Engine>>, UrlPath(id): UrlPath<String>) -> Api {
    run(&e, Command::Get { id }, StatusCode::OK).await
}

async fn delete(State(e): State<Arc<Engine>>, UrlPath(id): UrlPath<String>) -> Api {
    run(&e, Command::Delete { id }, StatusCode::OK).await
}

#[derive(serde::Deserialize, Default)]
struct ExecQuery {
    #[serde(default)]
    stream: bool,
}

/// Runs a command. Plain: one JSON result, output capped. With `?stream=true`: newline-delimited
/// JSON events as they happen, `{"type":"stdout"|"stderr","data_b64":...}` then
/// `{"type":"exit",...}` (or `{"type":"error","message":...}`). A client that goes away does not
/// stop the command.
async fn exec(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<ExecQuery>,
    Json(request): Json<ExecRequest>,
) -> Api {
    if !q.stream {
        return run(&e, Command::Exec { id, request }, StatusCode::OK).await;
    }
    let cid = e.start_command(&id, request).await.map_err(ApiError)?;
    attach(e, id, cid).await
}

/// NDJSON events of a command from its start, following it until it ends: first
/// `{"type":"command","command_id":...}`, then `stdout`/`stderr` chunks (`data_b64`), then
/// `exit` (or `error`). Reattaching replays everything kept.
async fn attach(e: Arc<Engine>, id: String, cid: String) -> Api {
    use base64::Engine as _;
    let log = e.command(&id, &cid).await.map_err(ApiError)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::convert::Infallible>>(16);
    tokio::spawn(async move {
        let b64 = base64::engine::general_purpose::STANDARD;
        let first = serde_json::json!({ "type": "command", "command_id": cid });
        if tx.send(Ok(format!("{first}\n"))).await.is_err() {
            return;
        }
        let mut next = 0;
        loop {
            log.wait_past(next).await;
            let snap = log.snapshot(next);
            next = snap.next;
            for c in snap.chunks {
                let line = serde_json::json!({ "type": c.stream, "data_b64": b64.encode(&c.data) });
                if tx.send(Ok(format!("{line}\n"))).await.is_err() {
                    return; // the client left; the command goes on
                }
            }
            if let Some(exit) = snap.exit {
                let line = match &exit.error {
                    Some(m) => serde_json::json!({ "type": "error", "message": m }),
                    None => {
                        let mut v = serde_json::to_value(&exit).unwrap_or_default();
                        v["type"] = "exit".into();
                        v
                    }
                };
                let _ = tx.send(Ok(format!("{line}\n"))).await;
                return;
            }
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        body,
    )
        .into_response())
}

#[derive(serde::Deserialize)]
struct ArchiveQuery {
    path: String,
}

fn transfer_error(e: forkbox_engine::files::TransferError) -> Response {
    use forkbox_engine::files::TransferError as T;
    let status = match &e {
        // The guest's own disk is full (an upload bigger than its room): the client's to fix.
        T::Agent(AgentError::Refused { message, .. })
            if message.contains("No space left on device") =>
        {
            StatusCode::INSUFFICIENT_STORAGE
        }
        T::Agent(AgentError::Failed(_)) => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
}

/// Unpacks the request body (tar.zst) into `path` in the sandbox.
async fn put_archive(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<ArchiveQuery>,
    body: axum::body::Body,
) -> Api {
    use futures_util::StreamExt;
    let sb = e.sandbox(&id).await.map_err(ApiError)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(8);
    let feed = tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        while let Some(Ok(bytes)) = stream.next().await {
            if tx.send(bytes.to_vec()).await.is_err() {
                break;
            }
        }
    });
    let result = forkbox_engine::files::put_archive(sb.client(), &q.path, rx).await;
    feed.abort();
    match result {
        Ok(bytes) => {
            e.metrics().bytes_uploaded.inc_by(bytes);
            Ok(Json(serde_json::json!({ "bytes": bytes })).into_response())
        }
        Err(err) => Ok(transfer_error(err)),
    }
}

/// Streams `path` from the sandbox as tar.zst.
async fn get_archive(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<ArchiveQuery>,
) -> Api {
    let sb = e.sandbox(&id).await.map_err(ApiError)?;
    let rx = match forkbox_engine::files::get_archive(sb.client(), &q.path).await {
        Ok(rx) => rx,
        Err(err) => return Ok(transfer_error(err)),
    };
    // An error from the guest ends the body early; the client then sees a broken transfer.
    let counted = e.clone();
    let stream = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        move |item| {
            if let Ok(chunk) = &item {
                counted
                    .metrics()
                    .bytes_downloaded
                    .inc_by(chunk.len() as u64);
            }
            item
        },
    );
    Ok(axum::body::Body::from_stream(stream).into_response())
}

async fn snapshot(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    body: Option<Json<SnapshotRequest>>,
) -> Api {
    let request = body.map(|Json(r)| r).unwrap_or_default();
    run(&e, Command::Snapshot { id, request }, StatusCode::CREATED).await
}

/// Forks a sandbox (saving it first) or a snapshot into `count` new sandboxes.
async fn fork(
    State(e): State<Arc<Engine>>,
    UrlPath(source): UrlPath<String>,
    Json(request): Json<ForkRequest>,
) -> Api {
    run(&e, Command::Fork { source, request }, StatusCode::CREATED).await
}

async fn hibernate(State(e): State<Arc<Engine>>, UrlPath(id): UrlPath<String>) -> Api {
    run(&e, Command::Hibernate { id }, StatusCode::OK).await
}

async fn resume(State(e): State<Arc<Engine>>, UrlPath(id): UrlPath<String>) -> Api {
    run(&e, Command::Resume { id }, StatusCode::OK).await
}

async fn list_snapshots(State(e): State<Arc<Engine>>) -> Api {
    run(&e, Command::ListSnapshots, StatusCode::OK).await
}

async fn get_snapshot(State(e): State<Arc<Engine>>, UrlPath(name): UrlPath<String>) -> Api {
    run(&e, Command::GetSnapshot { name }, StatusCode::OK).await
}

async fn delete_snapshot(State(e): State<Arc<Engine>>, UrlPath(name): UrlPath<String>) -> Api {
    run(&e, Command::DeleteSnapshot { name }, StatusCode::OK).await
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TtlRequest {
    ttl_seconds: u64,
}

async fn set_ttl(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Json(r): Json<TtlRequest>,
) -> Api {
    run(
        &e,
        Command::SetTtl {
            id,
            ttl_seconds: r.ttl_seconds,
        },
        StatusCode::OK,
    )
    .await
}

async fn start_command(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Json(request): Json<ExecRequest>,
) -> Api {
    let cid = e.start_command(&id, request).await.map_err(ApiError)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "command_id": cid })),
    )
        .into_response())
}

async fn command_events(
    State(e): State<Arc<Engine>>,
    UrlPath((id, cid)): UrlPath<(String, String)>,
) -> Api {
    attach(e, id, cid).await
}

#[derive(serde::Deserialize)]
struct PollQuery {
    #[serde(default)]
    from: usize,
}

/// Output past chunk `from`, and the exit if the command ended.
async fn command_poll(
    State(e): State<Arc<Engine>>,
    UrlPath((id, cid)): UrlPath<(String, String)>,
    Query(q): Query<PollQuery>,
) -> Api {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let snap = e
        .command(&id, &cid)
        .await
        .map_err(ApiError)?
        .snapshot(q.from);
    let chunks: Vec<serde_json::Value> = snap
        .chunks
        .iter()
        .map(|c| serde_json::json!({ "stream": c.stream, "data_b64": b64.encode(&c.data) }))
        .collect();
    Ok(Json(serde_json::json!({
        "command_id": cid,
        "chunks": chunks,
        "next": snap.next,
        "dropped_bytes": snap.dropped_bytes,
        "exit": snap.exit,
    }))
    .into_response())
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalRequest {
    signal: i32,
}

async fn command_signal(
    State(e): State<Arc<Engine>>,
    UrlPath((id, cid)): UrlPath<(String, String)>,
    Json(r): Json<SignalRequest>,
) -> Api {
    e.command(&id, &cid)
        .await
        .map_err(ApiError)?
        .signal(r.signal)
        .await;
    Ok(StatusCode::ACCEPTED.into_response())
}

async fn metrics(State(e): State<Arc<Engine>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        e.metrics().encode(),
    )
        .into_response()
}

pub fn router(engine: Arc<Engine>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/health", get(health))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/sandboxes", post(create).get(list))
        .route("/v1/sandboxes/{id}", get(get_one).delete(delete))
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/ttl", post(set_ttl))
        .route("/v1/sandboxes/{id}/snapshot", post(snapshot))
        .route("/v1/sandboxes/{id}/fork", post(fork))
        .route("/v1/sandboxes/{id}/hibernate", post(hibernate))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/snapshots", get(list_snapshots))
        .route(
            "/v1/snapshots/{id}",
            get(get_snapshot).delete(delete_snapshot),
        )
        .route("/v1/snapshots/{id}/fork", post(fork))
        .route("/v1/sandboxes/{id}/commands", post(start_command))
        .route("/v1/sandboxes/{id}/commands/{cid}", get(command_poll))
        .route(
            "/v1/sandboxes/{id}/commands/{cid}/events",
            get(command_events),
        )
        .route(
            "/v1/sandboxes/{id}/commands/{cid}/signal",
            post(command_signal),
        )
        .route(
            "/v1/sandboxes/{id}/archive",
            get(get_archive).put(put_archive),
        )
        .with_state(engine)
}

/// Serves `engine` on a Unix socket of its own (mode 0600) until the returned task is aborted:
/// the private API a run such as `forkbox migrate` hands to host-side programs.
pub fn spawn_private(
    engine: Arc<Engine>,
    socket: &Path,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    let app = router(engine);
    Ok(tokio::spawn(listen::serve(
        listener,
        app,
        std::future::pending(),
    )))
}

/// Serves the API on the Unix socket (and, with `tcp`, on that address for bearer tokens)
/// until SIGINT or SIGTERM, then stops every sandbox.
pub async fn serve(paths: Paths, tcp: Option<std::net::SocketAddr>) -> std::io::Result<()> {
    let socket = socket_path(&paths);
    std::fs::create_dir_all(paths.home())?;
    if socket.exists() {
        if tokio::net::UnixStream::connect(&socket).await.is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("a forkbox daemon already listens on {}", socket.display()),
            ));
        }
        std::fs::remove_file(&socket)?;
    }
    // Sandboxes of a daemon that died are taken over before any request is served (their TTLs
    // apply at the first sweep); what other owners left half-made is removed.
    let engine = Arc::new(Engine::durable(paths.clone()).map_err(std::io::Error::other)?);
    for id in engine.adopt_all().await {
        tracing::info!("{id}: re-adopted");
    }
    for line in forkbox_engine::runstate::sweep(&paths).lines() {
        tracing::info!("start-up sweep: {line}");
    }
    let listener = tokio::net::UnixListener::bind(&socket)?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    forkbox_engine::paths::write_atomic(
        &pid_path(&paths),
        std::process::id().to_string().as_bytes(),
    )?;

    tracing::info!("forkbox daemon listening on {}", socket.display());
    let app = router(engine.clone());
    // TTLs are absolute deadlines; a sweep enforces them each second, and samples every VM's
    // CPU and memory for the metrics.
    let sweeper = engine.clone();
    let sweep = tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            for id in sweeper.expire().await {
                tracing::info!("{id}: TTL passed; deleted");
            }
            sweeper.sample(1.0).await;
        }
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let tcp_task = match tcp {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr).await?;
            tracing::info!(
                "forkbox daemon listening on {} (bearer tokens required)",
                l.local_addr()?
            );
            let app = router(engine.clone())
                .layer(axum::middleware::from_fn_with_state(
                    paths.clone(),
                    auth::require_token,
                ))
                .layer(axum::middleware::from_fn(auth::refuse_browsers));
            let mut rx = stop_rx.clone();
            Some(tokio::spawn(listen::serve(l, app, async move {
                let _ = rx.wait_for(|s| *s).await;
            })))
        }
        None => None,
    };
    listen::serve(listener, app, shutdown_signal()).await;
    let _ = stop_tx.send(true);
    if let Some(t) = tcp_task {
        let _ = t.await;
    }
    drop(stop_rx);
    sweep.abort();
    engine.shutdown().await;
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(pid_path(&paths));
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// True when a daemon answers on the socket.
pub async fn is_running(socket: &Path) -> bool {
    tokio::net::UnixStream::connect(socket).await.is_ok()
}
