//! E2B's control plane (`/v2/sandboxes`, `/sandboxes/{id}/…`, `/snapshots`): each call as the
//! caller, whose `X-API-KEY` is a forkbox token, and only on sandboxes that key made.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use forkbox_api::{Code, CreateRequest, ForkRequest, NetworkPolicy, SandboxView, TtlAction};
use forkbox_client::Client;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::errors::Failure;
use crate::keys::{self, OWNER_LABEL, TEMPLATE_LABEL};
use crate::{interpreter, shape, volumes, E2b};

type Answer = Result<Response, Failure>;

/// E2B's default sandbox timeout, in seconds, when a create gives none.
const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// The longest a page of a listing holds.
const MAX_PAGE: usize = 100;

pub(crate) fn router(state: Arc<E2b>) -> Router {
    Router::new()
        .route("/sandboxes", post(create).get(list_v1))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(connect))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/snapshots", post(snapshot))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/sandboxes/{id}/network", put(network))
        .route("/snapshots", get(list_snapshots))
        .route("/templates/{id}", delete(delete_snapshot))
        .route("/volumes", post(volumes::create).get(volumes::list))
        .route("/volumes/{id}", get(volumes::info).delete(volumes::destroy))
        .fallback(unknown)
        .with_state(state)
}

/// The caller: their client (the daemon as them) and their owner label.
pub(crate) struct Caller {
    pub(crate) client: Client,
    pub(crate) owner: String,
}

pub(crate) fn caller(e: &E2b, headers: &HeaderMap) -> Result<Caller, Failure> {
    let key = headers
        .get(crate::API_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| {
            Failure::new(
                401,
                "an X-API-KEY header with a forkbox token is required (E2B_API_KEY; make one \
                 with `forkbox token create`)",
            )
        })?;
    Ok(Caller {
        client: e.as_caller(key)?,
        owner: keys::owner(key),
    })
}

fn not_found(id: &str) -> Failure {
    Failure::of(Code::SandboxNotFound, format!("sandbox {id} not found"))
}

/// Sandbox `id` if it is the caller's (else: not found, as for an unknown id).
async fn mine(c: &Caller, id: &str) -> Result<SandboxView, Failure> {
    match c.client.get(id).await {
        Ok(v) if shape::owned_by(&v, &c.owner) => Ok(v),
        Ok(_) => Err(not_found(id)),
        Err(e) if e.status() == Some(404) => Err(not_found(id)),
        Err(e) => Err(e.into()),
    }
}

/// A JSON body, or E2B's 400 saying what is wrong with it.
pub(crate) fn body<T: serde::de::DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, Failure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| Failure::new(400, format!("the request body: {e}")))
}

pub(crate) fn status(code: StatusCode, v: Value) -> Response {
    (code, Json(v)).into_response()
}

async fn unknown(method: axum::http::Method, uri: axum::http::Uri) -> Failure {
    let path = uri.path();
    let under = |p: &str| {
        ["", "/v2", "/v3"]
            .iter()
            .any(|v| path.starts_with(&format!("{v}{p}")))
    };
    if under("/templates") {
        return Failure::unsupported(&format!(
            "{method} {path} of E2B's template API: builds through E2B's Template SDK \
             (Template.build, build_in_background, get_build_status, exists) are answered; \
             template tags, listings and the older build routes are not yet"
        ));
    }
    Failure::new(404, format!("forkbox's E2B API has no {method} {path}"))
}

// -- create -------------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    auto_pause: Option<bool>,
    /// `false`: the TTL's pause is filesystem-only (refused: not done yet).
    auto_pause_memory: Option<bool>,
    auto_resume: Option<Value>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<Network>,
    mcp: Option<Value>,
    iam: Option<Value>,
    volume_mounts: Option<Vec<Value>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Network {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    allow_public_traffic: Option<bool>,
    mask_request_host: Option<String>,
    egress_proxy: Option<Value>,
    rules: Option<Value>,
    /// In an update (in a create it is the body's).
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

/// What forkbox does not do, asked for in a create: refused, naming it.
fn refuse_unsupported(n: &NewSandbox) -> Result<(), Failure> {
    let set = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    if set(&n.mcp) {
        return Err(Failure::unsupported("E2B's MCP gateway (`mcp`)"));
    }
    if set(&n.iam) {
        return Err(Failure::unsupported("IAM tokens (`iam`)"));
    }
    Ok(())
}

/// The whole of the IPv4 (or IPv6) internet, as E2B's selectors name it.
fn all_traffic(a: &str) -> bool {
    matches!(a.trim(), "0.0.0.0/0" | "::/0")
}

/// An address of E2B's `allowOut` / `denyOut` as a forkbox entry: E2B's addresses mean every
/// port, as forkbox's networks do (a bare address means 80 and 443 in forkbox's allow list).
fn e2b_entry(a: &str) -> String {
    let a = a.trim();
    match a.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_ipv4() => format!("{a}/32"),
        Ok(_) => format!("{a}/128"),
        Err(_) => a.to_string(),
    }
}

/// The sandbox's network policy from E2B's fields, as E2B reads them: outbound traffic is open
/// unless `allow_internet_access` is false or `denyOut` names all of it (then only the hosts of
/// `allowOut` are reached); a `denyOut` of some addresses keeps the rest open, and `allowOut`
/// wins over it (forkbox's deny list, with its allow entries as the exceptions).
fn policy(net: Option<&Network>, internet: Option<bool>) -> Result<NetworkPolicy, Failure> {
    let deny = net.and_then(|n| n.deny_out.clone()).unwrap_or_default();
    let allow = net.and_then(|n| n.allow_out.clone()).unwrap_or_default();
    if let Some(net) = net {
        if net.egress_proxy.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(Failure::unsupported("`egressProxy`"));
        }
    }
    let deny_all = deny.iter().any(|d| all_traffic(d));
    let closed = deny_all || internet == Some(false);
    let allow: Vec<String> = allow
        .iter()
        .filter(|a| !all_traffic(a))
        .map(|a| e2b_entry(a))
        .collect();
    let deny: Vec<String> = deny.iter().map(|a| e2b_entry(a)).collect();
    let p = match (closed, deny.is_empty()) {
        (true, _) => NetworkPolicy {
            internet: false,
            allow,
            deny: Vec::new(),
        },
        (false, true) => NetworkPolicy {
            internet: true,
            ..NetworkPolicy::default()
        },
        (false, false) => NetworkPolicy {
            internet: true,
            allow,
            deny,
        },
    };
    p.validate().map_err(|e| Failure::new(400, e.to_string()))?;
    Ok(p)
}

async fn create(State(e): State<Arc<E2b>>, headers: HeaderMap, bytes: bytes::Bytes) -> Answer {
    let c = caller(&e, &headers)?;
    let n: NewSandbox = body(&bytes)?;
    if n.template_id.is_empty() {
        return Err(Failure::new(400, "templateID is required"));
    }
    refuse_unsupported(&n)?;
    let mut labels = n.metadata.clone().unwrap_or_default();
    if let Some(k) = labels.keys().find(|k| k.starts_with("e2b.")) {
        return Err(Failure::new(
            400,
            format!("metadata key {k:?}: keys starting with `e2b.` are forkbox's own"),
        ));
    }
    labels.insert(OWNER_LABEL.into(), c.owner.clone());
    labels.insert(TEMPLATE_LABEL.into(), n.template_id.clone());
    labels.insert(keys::STARTED_LABEL.into(), now_ms().to_string());
    let resume = n
        .auto_resume
        .as_ref()
        .and_then(|v| v.get("enabled"))
        .and_then(Value::as_bool);
    if resume == Some(true) {
        labels.insert(keys::AUTO_RESUME_LABEL.into(), "1".into());
    }
    if let Some(net) = &n.network {
        if net.allow_public_traffic == Some(false) {
            labels.insert(keys::PRIVATE_TRAFFIC_LABEL.into(), "1".into());
        }
        if let Some(mask) = net.mask_request_host.as_ref().filter(|m| !m.is_empty()) {
            axum::http::HeaderValue::from_str(mask).map_err(|_| {
                Failure::new(
                    400,
                    format!("maskRequestHost {mask:?} is not a host header"),
                )
            })?;
            labels.insert(keys::MASK_HOST_LABEL.into(), mask.clone());
        }
    }
    let env = crate::guest::env_file(&n.env_vars.clone().unwrap_or_default())
        .map_err(|m| Failure::new(400, m))?;
    let network = policy(
        n.network.as_ref(),
        n.allow_internet_access
            .or(n.network.as_ref().and_then(|x| x.allow_internet_access)),
    )?;
    let req = CreateRequest {
        labels,
        ttl_seconds: Some(n.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS).max(1)),
        ttl_action: Some(match (n.auto_pause, n.auto_pause_memory) {
            (Some(true), Some(false)) => TtlAction::HibernateDisk,
            (Some(true), _) => TtlAction::Hibernate,
            _ => TtlAction::Delete,
        }),
        // A paused sandbox made with autoResume wakes on the next call that needs it, as
        // E2B's does: forkbox's own waking on use.
        wake_on_use: resume,
        volumes: volumes::mounts(&c.owner, n.volume_mounts.as_deref().unwrap_or_default())?,
        network: Some(network.clone()),
        secrets: crate::rules::header_secrets(
            &e,
            &c.owner,
            n.network.as_ref().and_then(|x| x.rules.as_ref()),
            &network,
        )?,
        ..CreateRequest::default()
    };
    // A helper serving a volume's content calls makes room for the sandbox that mounts it.
    let asked: Vec<&str> = req.volumes.iter().map(|m| m.name.as_str()).collect();
    if !asked.is_empty() {
        volumes::door::release(&e, &asked).await;
    }
    let v = create_of_template(&e, &c, &n.template_id, req).await?;
    if !env.is_empty() {
        if let Err(f) = e.run_root(&v.info.id, crate::guest::write_env(&env)).await {
            let _ = c.client.delete(&v.info.id).await;
            return Err(f);
        }
    }
    Ok(status(StatusCode::CREATED, shape::sandbox(&v, &e.key)))
}

/// Creates a sandbox of `template`: a snapshot's name (a create from it is a copy), the code
/// interpreter's (a copy of its warm sandbox, the server and a kernel running), or an image.
async fn create_of_template(
    e: &E2b,
    c: &Caller,
    template: &str,
    mut req: CreateRequest,
) -> Result<SandboxView, Failure> {
    let theirs = keys::snapshot_is(&c.owner, template);
    if theirs && c.client.get_snapshot(template).await.is_ok() {
        req.snapshot = Some(template.to_owned());
        return create_building(e, &c.client, &req).await;
    }
    // `name:tag`: the build of the template the tag names.
    if template.contains(':') {
        let (name, tag) = crate::tags::split(template)?;
        let found = e.tags.get(&name, &tag).ok_or_else(|| {
            Failure::of(
                Code::ImageNotFound,
                format!("template {name} has no tag {tag}"),
            )
        })?;
        // That build saved running with its start command, when it is the one kept.
        if let Some(started) = crate::started::snapshot_of(&c.owner, &name) {
            if let Ok(m) = c.client.get_snapshot(&started).await {
                if m.image == found.image {
                    req.snapshot = Some(started);
                    return create_building(e, &c.client, &req).await;
                }
            }
        }
        req.image = Some(found.image);
        return create_building(e, &c.client, &req).await;
    }
    // A template built with a start command: the caller's sandbox of it, saved running.
    if let Some(started) = crate::started::snapshot_of(&c.owner, template) {
        if c.client.get_snapshot(&started).await.is_ok() {
            req.snapshot = Some(started);
            return create_building(e, &c.client, &req).await;
        }
    }
    if !interpreter::wanted(template) {
        req.image = Some(template.to_owned());
        return create_building(e, &c.client, &req).await;
    }
    // A create of a warm interpreter asks the daemon what warm() would ask, once.
    let warm = match interpreter::made(e).await {
        Some(warm) => warm,
        None => {
            crate::first::ready(e, interpreter::TEMPLATE).await?;
            interpreter::warm(e).await?
        }
    };
    req.snapshot = Some(warm.clone());
    match create_building(e, &c.client, &req).await {
        // The warm snapshot lost a disk it stands on (a template removed under it): made
        // again, once.
        Err(f) if f.code == Some(Code::SnapshotUnrestorable) => {
            interpreter::forget(e, &warm, &f.message).await;
            req.snapshot = Some(interpreter::warm(e).await?);
            create_building(e, &c.client, &req).await
        }
        r => r,
    }
}

/// Creates; when the image is one forkbox carries a recipe for and this daemon has not built
/// yet, builds it first in the background (once, however many creates ask), and says how far
/// it is when that takes longer than a create may wait ([`crate::first`]).
pub(crate) async fn create_building(
    e: &E2b,
    client: &Client,
    req: &CreateRequest,
) -> Result<SandboxView, Failure> {
    match client.create(req).await {
        Err(err) if err.code() == Code::ImageNotFound.as_str() => {
            let Some(name) = req.image.as_deref() else {
                return Err(err.into());
            };
            if crate::templates::seed(name).is_some() {
                crate::first::ready(e, name).await?;
            } else {
                // Neither built nor carried (unless built since): said so.
                ensure_built(e, client, name, &err.to_string()).await?;
            }
            client.create(req).await.map_err(Failure::from)
        }
        r => r.map_err(Failure::from),
    }
}

/// Builds image `name` from the recipe forkbox carries when this daemon has none of it yet
/// (once, however many creates ask), as the CLI does on first use.
pub(crate) async fn ensure_built(
    e: &E2b,
    client: &Client,
    name: &str,
    why: &str,
) -> Result<(), Failure> {
    if client.get_image(name).await.is_ok() {
        return Ok(());
    }
    let Some(seed) = crate::templates::seed(name) else {
        return Err(Failure::of(
            Code::ImageNotFound,
            format!(
                "template {name} is neither an image nor a snapshot here ({why}); build it \
                 with `forkbox image build`"
            ),
        ));
    };
    let _one = e.building.lock().await;
    if client.get_image(name).await.is_err() {
        tracing::info!("e2b: template {name} is not built yet; building it from forkbox's recipe");
        crate::templates::build(client, name, seed).await?;
    }
    Ok(())
}

// -- one sandbox ----------------------------------------------------------------------------

async fn info(State(e): State<Arc<E2b>>, headers: HeaderMap, Path(id): Path<String>) -> Answer {
    let c = caller(&e, &headers)?;
    let v = mine(&c, &id).await?;
    Ok(Json(shape::detail(&v, &e.key)).into_response())
}

async fn kill(State(e): State<Arc<E2b>>, headers: HeaderMap, Path(id): Path<String>) -> Answer {
    let c = caller(&e, &headers)?;
    mine(&c, &id).await?;
    c.client.delete(&id).await?;
    e.forget(&id);
    e.metrics.forget(&id);
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
struct Timeout {
    timeout: Option<u64>,
}

async fn connect(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: bytes::Bytes,
) -> Answer {
    let c = caller(&e, &headers)?;
    let t: Timeout = body(&bytes)?;
    let v = mine(&c, &id).await.map_err(|_| {
        Failure::of(
            Code::SandboxNotFound,
            format!("sandbox {id} not found (neither running nor paused)"),
        )
    })?;
    let (v, code) = match v.state {
        forkbox_api::SandboxState::Hibernated | forkbox_api::SandboxState::Sleeping => {
            (c.client.resume(&id).await?, StatusCode::CREATED)
        }
        _ => (v, StatusCode::OK),
    };
    // Connecting only ever extends a running sandbox's life (E2B's); a resumed one gets it.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let v = match t.timeout {
        Some(s) if code == StatusCode::OK && v.expires_unix.is_none_or(|end| end >= now + s) => v,
        Some(s) => c.client.set_ttl(&id, s.max(1)).await?,
        None => v,
    };
    Ok(status(code, shape::sandbox(&v, &e.key)))
}

async fn set_timeout(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: bytes::Bytes,
) -> Answer {
    let c = caller(&e, &headers)?;
    let t: Timeout = body(&bytes)?;
    let secs = t
        .timeout
        .ok_or_else(|| Failure::new(400, "timeout (seconds) is required"))?;
    mine(&c, &id).await?;
    c.client.set_ttl(&id, secs.max(1)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A pause's body: `memory: false` asks for a filesystem-only pause.
#[derive(Debug, Default, Deserialize)]
struct PauseRequest {
    memory: Option<bool>,
}

async fn pause(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: bytes::Bytes,
) -> Answer {
    let c = caller(&e, &headers)?;
    let asked: PauseRequest = body(&bytes)?;
    let v = mine(&c, &id).await?;
    if shape::state(&v) == "paused" {
        return Err(Failure::of(
            Code::SandboxHibernated,
            format!("sandbox {id} is already paused"),
        )
        .with_status(409));
    }
    // A filesystem-only pause keeps the files; the resume boots the guest from them.
    // With its memory, its processes sleep with it and keep their streams (a client may
    // reconnect to one after the resume).
    match asked.memory {
        Some(false) => {
            c.client.hibernate_files_only(&id).await?;
            e.forget(&id);
        }
        _ => {
            c.client.hibernate(&id).await?;
            e.forget_all_but_processes(&id);
        }
    };
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `start` and `end` of a metrics request (Unix seconds).
#[derive(Debug, Default, Deserialize)]
struct Range {
    start: Option<u64>,
    end: Option<u64>,
}

/// The sandbox's kept metrics in the asked range, a new sample taken first when the newest
/// is older than the collection bucket (`metrics`).
async fn metrics(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(r): Query<Range>,
) -> Answer {
    let c = caller(&e, &headers)?;
    let v = mine(&c, &id).await?;
    let now = std::time::SystemTime::now();
    if shape::state(&v) != "paused" && e.metrics.wants_sample(&id, now) {
        let out = e
            .run_root(
                &id,
                vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    crate::guest::METRICS_SCRIPT.into(),
                ],
            )
            .await?;
        e.metrics
            .keep(&id, crate::metrics::Sample::parse(now, &out));
    }
    let kept = e.metrics.range(&id, r.start, r.end);
    Ok(Json(Value::Array(kept.iter().map(|s| s.json()).collect())).into_response())
}

/// `update_network`: the sandbox's policy replaced (fields left out are cleared, as E2B has it).
async fn network(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: bytes::Bytes,
) -> Answer {
    let c = caller(&e, &headers)?;
    let n: Network = body(&bytes)?;
    mine(&c, &id).await?;
    if n.rules.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(Failure::unsupported(
            "changing a running sandbox's network `rules`: forkbox sets them at create",
        ));
    }
    let p = policy(Some(&n), n.allow_internet_access)?;
    c.client.set_network(&id, &p).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// -- listing ------------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
    order: Option<String>,
    template: Option<String>,
    started_after: Option<String>,
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The caller's sandboxes that pass the query's filters, newest first (oldest with
/// `order=asc`), as E2B lists them.
async fn listing(c: &Caller, q: &ListQuery) -> Result<Vec<SandboxView>, Failure> {
    let label = format!("{OWNER_LABEL}={}", c.owner);
    let mut all = c
        .client
        .list_where(forkbox_client::ListFilter {
            label: Some(&label),
            ..Default::default()
        })
        .await?;
    let want: Vec<(String, String)> = match &q.metadata {
        Some(m) => form(m),
        None => Vec::new(),
    };
    let states: Vec<&str> = q
        .state
        .as_deref()
        .map(|s| s.split(',').map(str::trim).collect())
        .unwrap_or_default();
    all.retain(|v| {
        want.iter()
            .all(|(k, val)| v.labels.get(k).is_some_and(|l| l == val))
            && (states.is_empty() || states.contains(&shape::state(v)))
            && q.template.as_ref().is_none_or(|t| &shape::template(v) == t)
    });
    arrange(all, q)
}

/// `all` made after the query's `startedAfter`, in its order (newest first by default), by
/// when each was made to the ms, then by id.
fn arrange(mut all: Vec<SandboxView>, q: &ListQuery) -> Result<Vec<SandboxView>, Failure> {
    if let Some(after) = &q.started_after {
        // As the SDKs send it: RFC 3339 with any offset (Python's `isoformat()` of an aware
        // time gives `+00:00`), to the microsecond.
        let t = time::OffsetDateTime::parse(after, &time::format_description::well_known::Rfc3339)
            .map_err(|e| {
                Failure::new(
                    400,
                    format!("startedAfter {after:?}: {e} (an RFC 3339 time: 2025-01-31T12:00:00Z)"),
                )
            })?;
        let ms = (t.unix_timestamp_nanos() / 1_000_000).max(0) as u64;
        // A sandbox started at the very time asked for is in (E2B's SDK lists with a
        // sandbox's own `startedAt`).
        all.retain(|v| shape::started_ms(v) >= ms);
    }
    all.sort_by(|a, b| (shape::started_ms(a), &a.info.id).cmp(&(shape::started_ms(b), &b.info.id)));
    match q.order.as_deref() {
        None | Some("desc") => all.reverse(),
        Some("asc") => {}
        Some(o) => return Err(Failure::new(400, format!("order {o:?}: `asc` or `desc`"))),
    }
    Ok(all)
}

/// `k=v&k2=v2` (percent-encoded) as pairs.
fn form(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (unpercent(k), unpercent(v))
        })
        .collect()
}

fn unpercent(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = s
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(x)) => {
                out.push(x);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (x, _) => out.push(x),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A page of `all`, and the token of the next when there is one (the index it starts at).
fn page<T>(all: Vec<T>, q: &ListQuery) -> Result<(Vec<T>, Option<String>), Failure> {
    let start = match &q.next_token {
        Some(t) => t
            .parse::<usize>()
            .map_err(|_| Failure::new(400, format!("nextToken {t:?} is not one this API gave")))?,
        None => 0,
    };
    let limit = q.limit.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
    let len = all.len();
    let items: Vec<T> = all.into_iter().skip(start).take(limit).collect();
    let next = (start + limit < len).then(|| (start + limit).to_string());
    Ok((items, next))
}

fn paged(items: Vec<Value>, next: Option<String>) -> Response {
    let mut r = Json(Value::Array(items)).into_response();
    if let Some(t) = next.and_then(|t| axum::http::HeaderValue::from_str(&t).ok()) {
        r.headers_mut().insert("x-next-token", t);
    }
    r
}

async fn list(State(e): State<Arc<E2b>>, headers: HeaderMap, Query(q): Query<ListQuery>) -> Answer {
    let c = caller(&e, &headers)?;
    let all = listing(&c, &q).await?;
    let (items, next) = page(all, &q)?;
    Ok(paged(items.iter().map(shape::listed).collect(), next))
}

/// SDKs before 2.x's paging list running sandboxes at `GET /sandboxes`.
async fn list_v1(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Query(mut q): Query<ListQuery>,
) -> Answer {
    let c = caller(&e, &headers)?;
    q.state.get_or_insert_with(|| "running".into());
    let all = listing(&c, &q).await?;
    Ok(Json(Value::Array(all.iter().map(shape::listed).collect())).into_response())
}

// -- snapshots and forks --------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
struct NewSnapshot {
    name: Option<String>,
}

async fn snapshot(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: bytes::Bytes,
) -> Answer {
    let c = caller(&e, &headers)?;
    let n: NewSnapshot = body(&bytes)?;
    mine(&c, &id).await?;
    let name = keys::snapshot_name(&c.owner, n.name.as_deref())?;
    let meta = c
        .client
        .snapshot(
            &id,
            &forkbox_api::SnapshotRequest {
                name: Some(name),
                ..Default::default()
            },
        )
        .await?;
    Ok(status(StatusCode::CREATED, snapshot_json(&meta.name)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

async fn list_snapshots(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Query(q): Query<SnapshotQuery>,
) -> Answer {
    let c = caller(&e, &headers)?;
    let mut all = c.client.list_snapshots().await?;
    all.retain(|s| {
        keys::snapshot_is(&c.owner, &s.name)
            && q.sandbox_id
                .as_ref()
                .is_none_or(|id| s.from_sandbox.as_ref() == Some(id))
            && q.name
                .as_ref()
                .is_none_or(|n| keys::snapshot_label(&s.name) == n)
    });
    all.sort_by_key(|s| s.created_unix);
    let lq = ListQuery {
        limit: q.limit,
        next_token: q.next_token.clone(),
        ..Default::default()
    };
    let (items, next) = page(all, &lq)?;
    Ok(paged(
        items.iter().map(|s| snapshot_json(&s.name)).collect(),
        next,
    ))
}

async fn delete_snapshot(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    let c = caller(&e, &headers)?;
    if !keys::snapshot_is(&c.owner, &id) {
        return Err(Failure::of(
            Code::SnapshotNotFound,
            format!("snapshot {id} not found"),
        ));
    }
    match c.client.delete_snapshot(&id).await {
        Ok(_) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(err) if err.status() == Some(404) => Err(Failure::of(
            Code::SnapshotNotFound,
            format!("snapshot {id} not found"),
        )),
        Err(err) => Err(err.into()),
    }
}

/// A snapshot as E2B lists it: its id, and the name the caller gave it.
fn snapshot_json(name: &str) -> Value {
    json!({ "snapshotID": name, "names": [keys::snapshot_label(name)] })
}

#[derive(Debug, Default, Deserialize)]
struct NewFork {
    timeout: Option<u64>,
    count: Option<u32>,
}

async fn fork(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: bytes::Bytes,
) -> Answer {
    let c = caller(&e, &headers)?;
    let n: NewFork = body(&bytes)?;
    let v = mine(&c, &id).await?;
    let count = n.count.unwrap_or(1);
    if !(1..=20).contains(&count) {
        return Err(Failure::new(400, format!("count {count}: give 1 to 20")));
    }
    let mut labels = v.labels.clone();
    labels.insert(OWNER_LABEL.into(), c.owner.clone());
    labels.insert(keys::STARTED_LABEL.into(), now_ms().to_string());
    let req = ForkRequest {
        count,
        labels,
        ttl_seconds: Some(n.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS).max(1)),
        network: Some(v.network.clone()),
        ..ForkRequest::default()
    };
    let r = c.client.fork(&id, &req).await?;
    let mut out: Vec<Value> = r
        .sandboxes
        .iter()
        .map(|s| json!({ "sandbox": shape::sandbox(s, &e.key) }))
        .collect();
    out.extend(
        r.failed
            .iter()
            .map(|f| json!({ "error": { "code": 500, "message": f } })),
    );
    Ok(status(StatusCode::CREATED, Value::Array(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// E2B's network fields as E2B reads them: open by default; a `denyOut` of some addresses
    /// keeps the rest open with `allowOut` winning over it (its addresses every port); a
    /// `denyOut` of everything, or internet access off, leaves only `allowOut`.
    #[test]
    fn e2b_network_fields_map_onto_allow_and_deny_lists() {
        let net = |allow: &[&str], deny: &[&str]| Network {
            allow_out: Some(allow.iter().map(|s| s.to_string()).collect()),
            deny_out: Some(deny.iter().map(|s| s.to_string()).collect()),
            ..Network::default()
        };
        let open = policy(None, None).expect("open");
        assert!(open.internet && open.allow.is_empty() && open.deny.is_empty());
        let some = policy(Some(&net(&["1.1.1.1"], &["1.1.1.0/24", "8.8.8.8"])), None)
            .expect("a deny list");
        assert!(some.internet);
        assert_eq!(some.deny, ["1.1.1.0/24", "8.8.8.8/32"]);
        assert_eq!(some.allow, ["1.1.1.1/32"]);
        assert!(some
            .permits_address("8.8.8.8", "8.8.8.8".parse().unwrap(), 443)
            .is_err());
        assert!(some
            .permits_address("1.1.1.1", "1.1.1.1".parse().unwrap(), 443)
            .is_ok());
        assert!(some
            .permits_address("1.1.1.2", "1.1.1.2".parse().unwrap(), 443)
            .is_err());
        let closed =
            policy(Some(&net(&["1.1.1.1", "pypi.org"], &["0.0.0.0/0"])), None).expect("deny all");
        assert!(!closed.internet && closed.deny.is_empty());
        assert_eq!(closed.allow, ["1.1.1.1/32", "pypi.org"]);
        let off = policy(Some(&net(&["pypi.org"], &[])), Some(false)).expect("internet off");
        assert!(!off.internet && off.allow == ["pypi.org"]);
    }

    fn view(id: &str, created_unix: u64, started_ms: Option<u64>) -> SandboxView {
        let mut labels = serde_json::Map::new();
        if let Some(ms) = started_ms {
            labels.insert(keys::STARTED_LABEL.into(), ms.to_string().into());
        }
        serde_json::from_value(json!({
            "id": id, "image": "base", "accel": {"accel": "tcg", "reason": ""},
            "cpus": 1, "memory_mib": 512, "guest_kernel": "k", "boot_ms": 0,
            "labels": labels, "created_unix": created_unix, "expires_unix": null,
            "from_pool": false, "state": "running", "failure": null, "ttl_action": "delete",
            "network": {"internet": false, "allow": []}, "node": null, "transfer": null,
        }))
        .expect("a view")
    }

    fn ids(q: &ListQuery, all: &[SandboxView]) -> Result<Vec<String>, u16> {
        arrange(all.to_vec(), q)
            .map(|v| v.into_iter().map(|v| v.info.id).collect())
            .map_err(|f| f.status)
    }

    #[test]
    fn listing_is_newest_first_to_the_ms_and_filtered_by_start() {
        // Made in the same second, the later one's id sorting first: the ms decide.
        let all = [
            view("sb-b", 1_700_000_000, Some(1_700_000_000_100)),
            view("sb-a", 1_700_000_000, Some(1_700_000_000_900)),
            view("sb-old", 1_600_000_000, None),
        ];
        let q = ListQuery::default();
        assert_eq!(ids(&q, &all).unwrap(), ["sb-a", "sb-b", "sb-old"]);
        let asc = ListQuery {
            order: Some("asc".into()),
            ..Default::default()
        };
        assert_eq!(ids(&asc, &all).unwrap(), ["sb-old", "sb-b", "sb-a"]);
        let after = ListQuery {
            started_after: Some("2023-11-14T22:13:20.500Z".into()),
            ..Default::default()
        };
        assert_eq!(ids(&after, &all).unwrap(), ["sb-a"]);
        // Python's isoformat: an offset and microseconds; the very ms a sandbox started is in.
        let same = ListQuery {
            started_after: Some("2023-11-14T22:13:20.100000+00:00".into()),
            ..Default::default()
        };
        assert_eq!(ids(&same, &all).unwrap(), ["sb-a", "sb-b"]);
        let bad = ListQuery {
            started_after: Some("yesterday".into()),
            ..Default::default()
        };
        assert_eq!(ids(&bad, &all), Err(400));
        let sideways = ListQuery {
            order: Some("sideways".into()),
            ..Default::default()
        };
        assert_eq!(ids(&sideways, &all), Err(400));
    }
}
