//! forkbox's HTTP API, versioned under `/v1`: each route parses its request into one of the
//! engine's operations ([`forkbox_engine::api::ops`]), calls it, and renders its reply or the
//! error. The daemon listens on a Unix socket in forkbox's home, mode 0600.
#![forbid(unsafe_code)]

pub mod auth;
pub mod cluster;
pub mod console;
mod daemon;
pub mod doc;
pub mod listen;
pub mod preview;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use forkbox_engine::api::routes::reply;
#[allow(unused_imports)] // some are named only by the OpenAPI annotations
use forkbox_engine::api::{
    ops, ArchiveFormat, BuildLogView, BuildProgress, BuildRequest, BuildView, CommandEvent,
    CommandPoll, CommandStarted, CreateRequest, Deleted, DirListing, Engine, EngineError,
    ExecRequest, ExecResult, ForkRequest, ForkResult, GuestPath, Health, IdleRequest, ImageView,
    InfoView, MigrationEvent, MigrationStart, MigrationView, NetworkPolicy, Operation, PolledChunk,
    PortRequest, PortView, SandboxState, SandboxView, SnapshotRequest, StdinWritten, TerminalSize,
    Unpacked, VolumeCreateRequest, VolumeView, Written,
};
#[allow(unused_imports)]
use forkbox_engine::snapshot::SnapshotMeta;

mod cells;
mod extract;
mod images;

use cells::*;
use images::*;

pub use daemon::{
    is_running, pid_path, running_pid, serve, socket_path, spawn_private, Front, Site,
};
use extract::{Body, Params};

struct ApiError(EngineError);

pub use forkbox_engine::api::ErrorBody;

/// Every error an HTTP client sees: the engine's status for it and `{"error": message}`.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        refusal(self.0.code(), self.0.to_string())
    }
}

/// An error answer: the code's status and `{"error": message, "code": code}`. Every refusal
/// the API makes (the engine's, the listener's) is one of these.
pub(crate) fn refusal(code: forkbox_engine::api::Code, message: impl Into<String>) -> Response {
    let status =
        StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(ErrorBody::new(code, message))).into_response()
}

/// An engine error as the answer to a call (the one mapping, [`ApiError`]'s).
pub(crate) fn engine_error(e: EngineError) -> Response {
    ApiError(e).into_response()
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        ApiError(e)
    }
}

type Api = Result<Response, ApiError>;

/// Carries out `op` to its end even if the client goes away meanwhile: a create or fork that
/// was under way still registers its sandboxes (they are then listed), rather than being
/// dropped halfway.
async fn call<O: Operation>(engine: &Arc<Engine>, op: O) -> Result<O::Reply, ApiError> {
    let engine = engine.clone();
    task_outcome(tokio::spawn(async move { engine.call(op).await }).await)
}

/// A request task's reply or error; a task that panicked (a bug in forkbox, never the
/// request's fault) is a 500 `internal`, logged with what it said (the panic hook of
/// [`serve`] logs where, with the backtrace).
fn task_outcome<T>(
    r: Result<Result<T, EngineError>, tokio::task::JoinError>,
) -> Result<T, ApiError> {
    match r {
        Ok(r) => Ok(r?),
        Err(e) => {
            let what = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into()),
                Err(e) => e.to_string(),
            };
            tracing::error!("a request's task failed: {what}");
            Err(ApiError(EngineError::Internal(format!(
                "the request's task failed: {what}"
            ))))
        }
    }
}

/// Logs every panic of the daemon with where it happened and the backtrace (once per
/// process), so that the 500 a client sees has its cause in the daemon's log.
fn log_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            tracing::error!(
                "panic: {info}\n{}",
                std::backtrace::Backtrace::force_capture()
            );
        }));
    });
}

/// An operation's reply as JSON with status `ok`. `R` is the reply the route table names for the handler's route ([`reply`]): an operation
/// that gives another does not compile.
async fn answer<R, O>(engine: &Arc<Engine>, op: O, ok: StatusCode) -> Api
where
    O: Operation<Reply = R>,
    R: serde::Serialize,
{
    Ok((ok, Json(call(engine, op).await?)).into_response())
}

/// Newline-delimited JSON from a channel of events.
fn ndjson<T: serde::Serialize + Send + 'static>(rx: tokio::sync::mpsc::Receiver<T>) -> Response {
    let lines =
        tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), |ev| {
            let mut line = serde_json::to_string(&ev).unwrap_or_default();
            line.push('\n');
            Ok::<_, std::convert::Infallible>(line)
        });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

#[utoipa::path(get, path = "/v1/openapi.json", responses((status = 200, description = "this document (OpenAPI 3.1)", content_type = "application/json")))]
async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        doc::json(),
    )
        .into_response()
}

#[utoipa::path(get, path = "/v1/health", responses((status = 200, description = "the daemon answers", body = Health)))]
async fn health() -> Response {
    Json(Health {
        ok: true,
        version: env!("CARGO_PKG_VERSION").into(),
        protocol_version: forkbox_protocol::PROTOCOL_VERSION,
    })
    .into_response()
}

#[utoipa::path(post, path = "/v1/sandboxes", request_body = CreateRequest, responses((status = 201, body = SandboxView), (status = 400, body = ErrorBody), (status = 404, description = "no such image or snapshot", body = ErrorBody), (status = 507, body = ErrorBody)))]
async fn create(State(e): State<Arc<Engine>>, Body(r): Body<CreateRequest>) -> Api {
    answer::<reply::create, _>(&e, ops::Create { request: r }, StatusCode::CREATED).await
}

#[utoipa::path(get, path = "/v1/sandboxes", params(("label" = Option<String>, Query, description = "K=V"), ("state" = Option<SandboxState>, Query), ("node" = Option<String>, Query, description = "in a cluster: one node's")), responses((status = 200, body = Vec<SandboxView>), (status = 400, body = ErrorBody)))]
async fn list(State(e): State<Arc<Engine>>, Params(q): Params<HashMap<String, String>>) -> Api {
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
                    "state filter {s:?} is not one of running, disk_full, sleeping, hibernated, \
                     failed, lost"
                )))
            })?,
        ),
    };
    let mut all = call(&e, ops::List { label, state }).await?;
    if let Some(node) = q.get("node") {
        all.retain(|v| v.node.as_ref() == Some(node));
    }
    Ok(Json::<reply::list>(all).into_response())
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", params(("id" = String, Path)), responses((status = 200, body = SandboxView), (status = 404, body = ErrorBody)))]
async fn get_one(State(e): State<Arc<Engine>>, UrlPath(id): UrlPath<String>) -> Api {
    answer::<reply::get_one, _>(&e, ops::Get { id }, StatusCode::OK).await
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}", params(("id" = String, Path)), responses((status = 200, body = Deleted), (status = 404, body = ErrorBody)))]
async fn delete(State(e): State<Arc<Engine>>, UrlPath(id): UrlPath<String>) -> Api {
    answer::<reply::delete, _>(&e, ops::Delete { id }, StatusCode::OK).await
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
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", params(("id" = String, Path), ("stream" = Option<bool>, Query, description = "NDJSON CommandEvent lines as they happen")), request_body = ExecRequest, responses((status = 200, description = "the result (output capped at 64 KiB per stream), or with stream=true NDJSON CommandEvent lines", content((ExecResult = "application/json"), (CommandEvent = "application/x-ndjson"))), (status = 400, description = "bad request", body = ErrorBody), (status = 404, description = "no such sandbox", body = ErrorBody), (status = 409, description = "hibernated or failed", body = ErrorBody)))]
async fn exec(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Params(q): Params<ExecQuery>,
    Body(request): Body<ExecRequest>,
) -> Api {
    if !q.stream {
        return answer::<reply::exec, _>(&e, ops::Exec { id, request }, StatusCode::OK).await;
    }
    let op = ops::StartCommand {
        id: id.clone(),
        request,
    };
    let started = call(&e, op).await?;
    attach(e, id, started.command_id).await
}

/// NDJSON events of a command from its start, following it until it ends: first
/// `{"type":"command","command_id":...}`, then `stdout`/`stderr` chunks (`data_b64`), then
/// `exit` (or `error`). Reattaching replays everything kept.
async fn attach(e: Arc<Engine>, id: String, cid: String) -> Api {
    use base64::Engine as _;
    let op = ops::AttachCommand {
        id,
        command_id: cid.clone(),
    };
    let log = call(&e, op).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<CommandEvent>(16);
    tokio::spawn(async move {
        let b64 = base64::engine::general_purpose::STANDARD;
        if tx
            .send(CommandEvent::Command { command_id: cid })
            .await
            .is_err()
        {
            return;
        }
        let mut next = 0;
        loop {
            log.wait_past(next).await;
            let snap = log.snapshot(next);
            next = snap.next;
            for c in snap.chunks {
                let data_b64 = b64.encode(&c.data);
                let ev = match c.stream {
                    forkbox_engine::commands::Stream::Stdout => CommandEvent::Stdout { data_b64 },
                    forkbox_engine::commands::Stream::Stderr => CommandEvent::Stderr { data_b64 },
                };
                if tx.send(ev).await.is_err() {
                    return; // the client left; the command goes on
                }
            }
            if let Some(exit) = snap.exit {
                let ev = match exit.error.clone() {
                    Some(message) => CommandEvent::Error {
                        message,
                        exit_code: (exit.exit_code >= 0).then_some(exit.exit_code),
                    },
                    None => CommandEvent::Exit(exit),
                };
                let _ = tx.send(ev).await;
                return;
            }
        }
    });
    Ok(ndjson(rx))
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ArchiveQuery {
    /// The directory (upload) or the file or directory (download) in the sandbox.
    path: String,
    /// `tar.zst` (the default) or `tar.gz`.
    #[serde(default)]
    format: ArchiveFormat,
}

/// Unpacks the request body (tar.zst, or tar.gz with `format=tar.gz`) into `path` in the
/// sandbox.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/archive", params(("id" = String, Path), ArchiveQuery), request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "tar.zst, or tar.gz with format=tar.gz"), responses((status = 200, body = Unpacked), (status = 404, body = ErrorBody), (status = 507, body = ErrorBody)))]
async fn put_archive(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Params(q): Params<ArchiveQuery>,
    body: axum::body::Body,
) -> Api {
    let (rx, feed) = body_chunks(body);
    let cmd = ops::PutArchive {
        id,
        path: q.path,
        format: q.format,
        chunks: rx,
    };
    let result = answer::<reply::put_archive, _>(&e, cmd, StatusCode::OK).await;
    feed.abort();
    result
}

/// Streams `path` from the sandbox as tar.zst (or tar.gz with `format=tar.gz`).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/archive", params(("id" = String, Path), ArchiveQuery), responses((status = 200, description = "tar.zst (or tar.gz) stream", body = Vec<u8>, content_type = "application/octet-stream"), (status = 404, body = ErrorBody)))]
async fn get_archive(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Params(q): Params<ArchiveQuery>,
) -> Api {
    let op = ops::GetArchive {
        id,
        path: q.path,
        format: q.format,
    };
    let rx = call(&e, op).await?;
    // An error from the guest ends the body early; the client then sees a broken transfer.
    Ok(
        axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .into_response(),
    )
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshot", params(("id" = String, Path)), request_body(content = Option<SnapshotRequest>), responses((status = 201, body = SnapshotMeta), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn snapshot(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    body: Option<Body<SnapshotRequest>>,
) -> Api {
    let request = body.map(|Body(r)| r).unwrap_or_default();
    answer::<reply::snapshot, _>(&e, ops::Snapshot { id, request }, StatusCode::CREATED).await
}

/// Forks a sandbox (saving it first) into `count` new sandboxes.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", params(("id" = String, Path)), request_body = ForkRequest, responses((status = 201, description = "the copies (saved first)", body = ForkResult), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn fork(
    State(e): State<Arc<Engine>>,
    UrlPath(source): UrlPath<String>,
    Body(request): Body<ForkRequest>,
) -> Api {
    answer::<reply::fork, _>(&e, ops::Fork { source, request }, StatusCode::CREATED).await
}

/// Forks a snapshot into `count` new sandboxes.
#[utoipa::path(post, path = "/v1/snapshots/{id}/fork", params(("id" = String, Path, description = "the snapshot")), request_body = ForkRequest, responses((status = 201, body = ForkResult), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn fork_snapshot(
    State(e): State<Arc<Engine>>,
    UrlPath(source): UrlPath<String>,
    Body(request): Body<ForkRequest>,
) -> Api {
    answer::<reply::fork_snapshot, _>(&e, ops::Fork { source, request }, StatusCode::CREATED).await
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct HibernateQuery {
    /// `false`: keep only the sandbox's files (synced to its disk); the resume boots it from
    /// them, under the same id and machine id, with none of its processes. Default `true`.
    #[serde(default = "yes")]
    memory: bool,
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/hibernate", params(("id" = String, Path), HibernateQuery), responses((status = 200, body = SandboxView), (status = 400, description = "memory=false with volumes mounted", body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn hibernate(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Params(q): Params<HibernateQuery>,
) -> Api {
    let op = ops::Hibernate {
        id,
        memory: q.memory,
    };
    answer::<reply::hibernate, _>(&e, op, StatusCode::OK).await
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports", params(("id" = String, Path)), request_body = PortRequest, responses((status = 201, description = "a host port whose connections reach the guest's port", body = PortView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn forward_port(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Body(request): Body<PortRequest>,
) -> Api {
    let guest_port = request.guest_port;
    let mut v: reply::forward_port = call(
        &e,
        ops::ForwardPort {
            id: id.clone(),
            request,
        },
    )
    .await?;
    v.preview_url = preview::url(&id, guest_port);
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", params(("id" = String, Path)), responses((status = 200, body = Vec<PortView>), (status = 404, body = ErrorBody)))]
async fn list_ports(State(e): State<Arc<Engine>>, UrlPath(id): UrlPath<String>) -> Api {
    answer::<reply::list_ports, _>(&e, ops::ListPorts { id }, StatusCode::OK).await
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/ports/{port}", params(("id" = String, Path), ("port" = u16, Path, description = "the forward's host port")), responses((status = 200, body = Deleted), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn close_port(
    State(e): State<Arc<Engine>>,
    UrlPath((id, host_port)): UrlPath<(String, u16)>,
) -> Api {
    answer::<reply::close_port, _>(&e, ops::ClosePort { id, host_port }, StatusCode::OK).await
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", params(("id" = String, Path)), responses((status = 200, body = SandboxView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn resume(State(e): State<Arc<Engine>>, UrlPath(id): UrlPath<String>) -> Api {
    answer::<reply::resume, _>(&e, ops::Resume { id }, StatusCode::OK).await
}

#[utoipa::path(get, path = "/v1/snapshots", responses((status = 200, body = Vec<SnapshotMeta>)))]
async fn list_snapshots(State(e): State<Arc<Engine>>) -> Api {
    answer::<reply::list_snapshots, _>(&e, ops::ListSnapshots {}, StatusCode::OK).await
}

#[utoipa::path(get, path = "/v1/snapshots/{id}", params(("id" = String, Path, description = "the snapshot")), responses((status = 200, body = SnapshotMeta), (status = 404, body = ErrorBody)))]
async fn get_snapshot(State(e): State<Arc<Engine>>, UrlPath(name): UrlPath<String>) -> Api {
    answer::<reply::get_snapshot, _>(&e, ops::GetSnapshot { name }, StatusCode::OK).await
}

#[utoipa::path(delete, path = "/v1/snapshots/{id}", params(("id" = String, Path, description = "the snapshot")), responses((status = 200, body = Deleted), (status = 404, body = ErrorBody), (status = 409, description = "copies depend on it", body = ErrorBody)))]
async fn delete_snapshot(State(e): State<Arc<Engine>>, UrlPath(name): UrlPath<String>) -> Api {
    answer::<reply::delete_snapshot, _>(&e, ops::DeleteSnapshot { name }, StatusCode::OK).await
}

/// Makes a volume: a disk of its own that outlives the sandboxes that mount it.
#[utoipa::path(post, path = "/v1/volumes", request_body = VolumeCreateRequest, responses((status = 201, body = VolumeView), (status = 400, body = ErrorBody), (status = 409, description = "a volume of that name exists", body = ErrorBody), (status = 503, description = "no room on the host's disk", body = ErrorBody)))]
async fn create_volume(
    State(e): State<Arc<Engine>>,
    Body(request): Body<VolumeCreateRequest>,
) -> Api {
    answer::<reply::create_volume, _>(&e, ops::CreateVolume { request }, StatusCode::CREATED).await
}

#[utoipa::path(get, path = "/v1/volumes", responses((status = 200, body = Vec<VolumeView>)))]
async fn list_volumes(State(e): State<Arc<Engine>>) -> Api {
    answer::<reply::list_volumes, _>(&e, ops::ListVolumes {}, StatusCode::OK).await
}

#[utoipa::path(get, path = "/v1/volumes/{name}", params(("name" = String, Path)), responses((status = 200, body = VolumeView), (status = 404, body = ErrorBody)))]
async fn get_volume(State(e): State<Arc<Engine>>, UrlPath(name): UrlPath<String>) -> Api {
    answer::<reply::get_volume, _>(&e, ops::GetVolume { name }, StatusCode::OK).await
}

/// Removes a volume and what is on it; refused while a sandbox has it mounted.
#[utoipa::path(delete, path = "/v1/volumes/{name}", params(("name" = String, Path)), responses((status = 200, body = Deleted), (status = 404, body = ErrorBody), (status = 409, description = "a sandbox has it mounted", body = ErrorBody)))]
async fn remove_volume(State(e): State<Arc<Engine>>, UrlPath(name): UrlPath<String>) -> Api {
    answer::<reply::remove_volume, _>(&e, ops::RemoveVolume { name }, StatusCode::OK).await
}

#[utoipa::path(get, path = "/v1/migrations", responses((status = 200, description = "runs of `forkbox migrate` this daemon knows, newest first", body = Vec<MigrationView>)))]
async fn list_migrations(State(e): State<Arc<Engine>>) -> Api {
    answer::<reply::list_migrations, _>(&e, ops::ListMigrations {}, StatusCode::OK).await
}

#[utoipa::path(post, path = "/v1/migrations", request_body = MigrationStart, responses((status = 201, description = "the run, registered", body = MigrationView), (status = 400, body = ErrorBody)))]
async fn start_migration(State(e): State<Arc<Engine>>, Body(start): Body<MigrationStart>) -> Api {
    answer::<reply::start_migration, _>(&e, ops::StartMigration { start }, StatusCode::CREATED)
        .await
}

#[utoipa::path(post, path = "/v1/migrations/{id}/events", params(("id" = String, Path, description = "the run")), request_body = MigrationEvent, responses((status = 200, body = MigrationView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn migration_event(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Body(event): Body<MigrationEvent>,
) -> Api {
    answer::<reply::migration_event, _>(&e, ops::MigrationProgress { id, event }, StatusCode::OK)
        .await
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", params(("id" = String, Path)), request_body = NetworkPolicy, responses((status = 200, description = "the sandbox, its new policy in force for the connections it opens from now on", body = SandboxView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn set_network(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Body(policy): Body<NetworkPolicy>,
) -> Api {
    answer::<reply::set_network, _>(&e, ops::SetNetwork { id, policy }, StatusCode::OK).await
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/idle", params(("id" = String, Path)), request_body = IdleRequest, responses((status = 200, description = "the sandbox with its new idle policy (`idle: null` turns sleeping off)", body = SandboxView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn set_idle(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Body(request): Body<IdleRequest>,
) -> Api {
    answer::<reply::set_idle, _>(&e, ops::SetIdle { id, request }, StatusCode::OK).await
}

#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct TtlRequest {
    ttl_seconds: u64,
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/ttl", params(("id" = String, Path)), request_body = TtlRequest, responses((status = 200, body = SandboxView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn set_ttl(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Body(r): Body<TtlRequest>,
) -> Api {
    answer::<reply::set_ttl, _>(
        &e,
        ops::SetTtl {
            id,
            ttl_seconds: r.ttl_seconds,
        },
        StatusCode::OK,
    )
    .await
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands", params(("id" = String, Path)), request_body = ExecRequest, responses((status = 202, body = CommandStarted), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn start_command(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Body(request): Body<ExecRequest>,
) -> Api {
    answer::<reply::start_command, _>(&e, ops::StartCommand { id, request }, StatusCode::ACCEPTED)
        .await
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands/{cid}/events", params(("id" = String, Path), ("cid" = String, Path)), responses((status = 200, description = "NDJSON CommandEvent lines from the start, following the command to its end", body = CommandEvent, content_type = "application/x-ndjson"), (status = 404, body = ErrorBody)))]
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
#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands/{cid}", params(("id" = String, Path), ("cid" = String, Path), ("from" = Option<usize>, Query)), responses((status = 200, body = CommandPoll), (status = 404, body = ErrorBody)))]
async fn command_poll(
    State(e): State<Arc<Engine>>,
    UrlPath((id, command_id)): UrlPath<(String, String)>,
    Params(q): Params<PollQuery>,
) -> Api {
    let cmd = ops::PollCommand {
        id,
        command_id,
        from: q.from,
    };
    answer::<reply::command_poll, _>(&e, cmd, StatusCode::OK).await
}

#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct SignalRequest {
    signal: i32,
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}/signal", params(("id" = String, Path), ("cid" = String, Path)), request_body = SignalRequest, responses((status = 202, description = "sent"), (status = 404, body = ErrorBody)))]
async fn command_signal(
    State(e): State<Arc<Engine>>,
    UrlPath((id, command_id)): UrlPath<(String, String)>,
    Body(r): Body<SignalRequest>,
) -> Api {
    let cmd = ops::SignalCommand {
        id,
        command_id,
        signal: r.signal,
    };
    call(&e, cmd).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// Resizes the terminal of a command started with `tty`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}/resize", params(("id" = String, Path), ("cid" = String, Path)), request_body = TerminalSize, responses((status = 202, description = "sent"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn command_resize(
    State(e): State<Arc<Engine>>,
    UrlPath((id, command_id)): UrlPath<(String, String)>,
    Body(size): Body<TerminalSize>,
) -> Api {
    let cmd = ops::ResizeCommand {
        id,
        command_id,
        size,
    };
    call(&e, cmd).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
struct StdinQuery {
    /// Close the command's standard input after this body (default true): false keeps it open
    /// for another request.
    #[serde(default = "yes")]
    close: bool,
}

fn yes() -> bool {
    true
}

/// Feeds the request body, as it arrives, to the standard input of a command started with
/// `stdin: true`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}/stdin", params(("id" = String, Path), ("cid" = String, Path), StdinQuery), request_body(content = Vec<u8>, content_type = "application/octet-stream"), responses((status = 200, body = StdinWritten), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn command_stdin(
    State(e): State<Arc<Engine>>,
    UrlPath((id, command_id)): UrlPath<(String, String)>,
    Params(q): Params<StdinQuery>,
    body: axum::body::Body,
) -> Api {
    let (chunks, feed) = body_chunks(body);
    let cmd = ops::WriteStdin {
        id,
        command_id,
        chunks,
        close: q.close,
    };
    let result = answer::<reply::command_stdin, _>(&e, cmd, StatusCode::OK).await;
    feed.abort();
    result
}

/// A request body as a channel of chunks, fed by a task the caller aborts when done.
fn body_chunks(
    body: axum::body::Body,
) -> (
    tokio::sync::mpsc::Receiver<Vec<u8>>,
    tokio::task::JoinHandle<()>,
) {
    use futures_util::StreamExt;
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(8);
    let feed = tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        while let Some(Ok(bytes)) = stream.next().await {
            if tx.send(bytes.to_vec()).await.is_err() {
                break;
            }
        }
    });
    (rx, feed)
}

#[utoipa::path(get, path = "/v1/info", responses((status = 200, body = InfoView)))]
async fn info(State(e): State<Arc<Engine>>) -> Api {
    answer::<reply::info, _>(&e, ops::Info {}, StatusCode::OK).await
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct FileQuery {
    /// Absolute, or relative to `/root`.
    path: String,
    /// Octal permission bits for a written file (default 644).
    mode: Option<String>,
}

fn guest_path(q: &FileQuery) -> Result<GuestPath, ApiError> {
    Ok(GuestPath::parse(&q.path).map_err(EngineError::from)?)
}

/// One file's bytes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", params(("id" = String, Path), FileQuery), responses((status = 200, description = "the bytes (at most 64 MiB)", body = Vec<u8>, content_type = "application/octet-stream"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn read_file(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Params(q): Params<FileQuery>,
) -> Api {
    let path = guest_path(&q)?;
    let bytes = call(&e, ops::ReadFile { id, path }).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response())
}

/// Writes the body to one file (parents made as needed), replacing it.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", params(("id" = String, Path), FileQuery), request_body(content = Vec<u8>, content_type = "application/octet-stream"), responses((status = 200, body = Written), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 507, body = ErrorBody)))]
async fn write_file(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Params(q): Params<FileQuery>,
    body: axum::body::Bytes,
) -> Api {
    let path = guest_path(&q)?;
    let mode = match &q.mode {
        None => 0o644,
        Some(m) => u32::from_str_radix(m, 8).map_err(|_| {
            ApiError(EngineError::BadRequest(format!(
                "mode {m:?} is not octal permission bits such as 644"
            )))
        })?,
    };
    let data = body.to_vec();
    answer::<reply::write_file, _>(
        &e,
        ops::WriteFile {
            id,
            path,
            data,
            mode,
        },
        StatusCode::OK,
    )
    .await
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/dir", params(("id" = String, Path), FileQuery), responses((status = 200, body = DirListing), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn list_dir(
    State(e): State<Arc<Engine>>,
    UrlPath(id): UrlPath<String>,
    Params(q): Params<FileQuery>,
) -> Api {
    let path = guest_path(&q)?;
    answer::<reply::list_dir, _>(&e, ops::ListDir { id, path }, StatusCode::OK).await
}

#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus/OpenMetrics text", content_type = "application/openmetrics-text")))]
async fn metrics(State(e): State<Arc<Engine>>) -> Api {
    let text = call(&e, ops::Metrics {}).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// Every route of the API at its path in the route table ([`forkbox_api::routes`]).
pub fn router(engine: Arc<Engine>) -> Router {
    use forkbox_engine::api::routes::op;
    Router::new()
        .route(op::metrics.path, get(metrics))
        .route(op::health.path, get(health))
        .route(op::openapi.path, get(openapi))
        .route(op::info.path, get(info))
        .route(op::build_log.path, get(build_log))
        .route(op::list_builds.path, get(list_builds))
        .route(op::list_images.path, get(list_images).post(build_image))
        .route(op::build_dockerfile.path, post(build_dockerfile))
        .route(op::get_image.path, get(get_image).delete(remove_image))
        .route(
            op::read_file.path,
            get(read_file)
                .put(write_file)
                .layer(axum::extract::DefaultBodyLimit::max(
                    forkbox_engine::api::MAX_FILE_BYTES,
                )),
        )
        .route(op::list_dir.path, get(list_dir))
        .route(op::create.path, post(create).get(list))
        .route(op::get_one.path, get(get_one).delete(delete))
        .route(op::exec.path, post(exec))
        .route(op::set_ttl.path, post(set_ttl))
        .route(op::set_network.path, axum::routing::put(set_network))
        .route(op::set_idle.path, axum::routing::put(set_idle))
        .route(op::snapshot.path, post(snapshot))
        .route(op::fork.path, post(fork))
        .route(op::hibernate.path, post(hibernate))
        .route(op::forward_port.path, post(forward_port).get(list_ports))
        .route(op::close_port.path, axum::routing::delete(close_port))
        .route(op::resume.path, post(resume))
        .route(op::list_snapshots.path, get(list_snapshots))
        .route(
            op::get_snapshot.path,
            get(get_snapshot).delete(delete_snapshot),
        )
        .route(op::fork_snapshot.path, post(fork_snapshot))
        .route(
            op::create_volume.path,
            post(create_volume).get(list_volumes),
        )
        .route(op::get_volume.path, get(get_volume).delete(remove_volume))
        .route(
            op::list_migrations.path,
            get(list_migrations).post(start_migration),
        )
        .route(
            op::migration_event.path,
            post(migration_event).layer(axum::extract::DefaultBodyLimit::max(
                forkbox_engine::api::MAX_REPORT_BYTES * 2 + 65536,
            )),
        )
        .route(op::start_command.path, post(start_command))
        .route(op::command_poll.path, get(command_poll))
        .route(op::command_events.path, get(command_events))
        .route(op::command_signal.path, post(command_signal))
        .route(op::command_stdin.path, post(command_stdin))
        .route(op::command_resize.path, post(command_resize))
        .route(op::run_code.path, post(run_code))
        .route(
            op::list_code_contexts.path,
            get(list_code_contexts).post(create_code_context),
        )
        .route(op::restart_code_context.path, post(restart_code_context))
        .route(
            op::delete_code_context.path,
            axum::routing::delete(delete_code_context),
        )
        .route(op::get_archive.path, get(get_archive).put(put_archive))
        .with_state(engine)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// An operation that panics: a bug of forkbox's own, injected.
    struct Panics;

    impl Operation for Panics {
        type Reply = Deleted;
        async fn run(self, _: &Engine) -> Result<Deleted, EngineError> {
            panic!("injected for the test")
        }
    }

    /// An operation whose task panics is answered 500 with code `internal` and what it said,
    /// never a 4xx (it was 400 Bad Request): through the path every handler takes.
    #[tokio::test]
    async fn a_panicked_request_is_a_500_internal() {
        let home = tempfile::tempdir().unwrap();
        let engine = Arc::new(Engine::private(forkbox_engine::paths::Paths::new(
            home.path(),
        )));
        let resp = match answer::<Deleted, _>(&engine, Panics, StatusCode::OK).await {
            Ok(_) => panic!("a panicked operation gave a reply"),
            Err(e) => e.into_response(),
        };
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], "internal", "{v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("injected for the test"),
            "{v}"
        );
        // An error of the operation's own stays what it is.
        let op = ops::Get { id: "sb-x".into() };
        let resp = match answer::<SandboxView, _>(&engine, op, StatusCode::OK).await {
            Ok(_) => panic!("a sandbox that is not there was found"),
            Err(e) => e.into_response(),
        };
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    }
}
