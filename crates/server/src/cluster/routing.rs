//! A cluster node's routing: every call passes [`route`], which serves it here, forwards it
//! to the node that owns what it is about, places a create, or lists the whole cluster; what a
//! call served here creates, forks or deletes is recorded in etcd.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use forkbox_cluster::placement::{self, Want};
use forkbox_cluster::{auth as node_auth, Cluster, NodeRecord};
use forkbox_engine::api::{ops, Code, ForkResult, SandboxState, SandboxView, Transfer};

use super::transfer::{self, HOLDER_HEADER};
use super::{default_memory_mib, Node, MAX_DECISION_BODY};
use crate::refusal;

/// What a request is, for routing.
enum Target {
    List,
    Create,
    Sandbox(String),
    Snapshot(String),
    SnapshotList,
    MigrationList,
    VolumeList,
    /// A new volume: made on the node it names, else here.
    VolumeCreate,
    Volume(String),
    Build(String),
    Local,
}

fn classify(method: &Method, path: &str) -> Target {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, segs.as_slice()) {
        (&Method::GET, ["v1", "sandboxes"]) => Target::List,
        (&Method::POST, ["v1", "sandboxes"]) => Target::Create,
        (_, ["v1", "sandboxes", id, ..]) if !id.is_empty() => Target::Sandbox(id.to_string()),
        (&Method::GET, ["v1", "snapshots"]) => Target::SnapshotList,
        (&Method::GET, ["v1", "migrations"]) => Target::MigrationList,
        (&Method::GET, ["v1", "volumes"]) => Target::VolumeList,
        (&Method::POST, ["v1", "volumes"]) => Target::VolumeCreate,
        (_, ["v1", "volumes", name]) if !name.is_empty() => Target::Volume(name.to_string()),
        (&Method::GET, ["v1", "cluster", "builds", image]) => Target::Build(image.to_string()),
        (_, ["v1", "snapshots", name, ..]) if !name.is_empty() => {
            Target::Snapshot(name.to_string())
        }
        _ => Target::Local,
    }
}

/// What a locally served call changes in etcd.
#[derive(Clone, Copy, PartialEq)]
enum Effect {
    None,
    Creates,
    Forks,
    Deletes,
    /// Makes or removes a snapshot or a volume: this node's record (what it holds) is
    /// rewritten at once, so a fork of it (a create that mounts it) through another node finds
    /// it.
    Snapshots,
}

fn effect(method: &Method, path: &str) -> Effect {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, segs.as_slice()) {
        (&Method::POST, ["v1", "sandboxes"]) => Effect::Creates,
        (&Method::POST, ["v1", "sandboxes", _, "fork"]) => Effect::Forks,
        (&Method::POST, ["v1", "snapshots", _, "fork"]) => Effect::Forks,
        (&Method::DELETE, ["v1", "sandboxes", _]) => Effect::Deletes,
        (&Method::POST, ["v1", "sandboxes", _, "snapshot" | "hibernate" | "resume"]) => {
            Effect::Snapshots
        }
        (&Method::DELETE, ["v1", "snapshots", _]) => Effect::Snapshots,
        (&Method::POST, ["v1", "volumes"]) | (&Method::DELETE, ["v1", "volumes", _]) => {
            Effect::Snapshots
        }
        _ => Effect::None,
    }
}

/// The middleware every request of a cluster node passes.
pub async fn route(State(node): State<Arc<Node>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    // A peer's call is this node's to serve: forwarded once, never again.
    if req.headers().contains_key(node_auth::HEADER) {
        if let Err(e) = verify_peer(&node, &req) {
            return refusal(Code::Unauthorized, e);
        }
        return match transfer::serve(&node, req).await {
            Ok(r) => r,
            Err(req) => local(&node, req, next).await,
        };
    }
    match classify(req.method(), &path) {
        Target::Local => next.run(req).await,
        Target::List => list(&node, req).await,
        Target::SnapshotList => list_everywhere(&node, req, "snapshots").await,
        Target::MigrationList => list_everywhere(&node, req, "migrations").await,
        Target::VolumeList => list_everywhere(&node, req, "volumes").await,
        Target::VolumeCreate => volume_create(&node, req, next).await,
        Target::Volume(name) => by_volume(&node, name, req, next).await,
        Target::Build(image) => super::builds::route(&node, &image, req).await,
        Target::Create => create(&node, req, next).await,
        Target::Sandbox(id) => by_owner(&node, id, req, next).await,
        Target::Snapshot(name) => by_holder(&node, name, req, next).await,
    }
}

/// Whether the request's node signature verifies (a peer's call); the refusal's words if not.
pub fn verify_peer(node: &Node, req: &Request) -> Result<(), String> {
    let header = req
        .headers()
        .get(node_auth::HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let caller = node_auth::verify(
        &node.secret,
        header,
        forkbox_cluster::now_ms(),
        req.method().as_str(),
        pq,
    )
    .map_err(|e| e.to_string())?;
    if !node.requires_tls() {
        return Ok(());
    }
    // With certificates, the signature is the second check: the first is the TLS client
    // certificate, which must name the node the call is signed as.
    match req.extensions().get::<crate::listen::PeerCertificate>() {
        None => Err(format!(
            "a call signed as node {caller} came without TLS: this cluster's nodes speak mutual \
             TLS, so a peer needs --cluster-tls with a certificate of the cluster CA; nothing \
             was done"
        )),
        Some(crate::listen::PeerCertificate(Some(n))) if *n == caller => Ok(()),
        Some(crate::listen::PeerCertificate(Some(n))) => Err(format!(
            "a call signed as node {caller} came with node {n}'s certificate; nothing was done"
        )),
        Some(crate::listen::PeerCertificate(None)) => Err(format!(
            "a call signed as node {caller} came with a certificate that names no node; \
             nothing was done"
        )),
    }
}

/// Serves a call here, recording in etcd what it creates or deletes.
async fn local(node: &Node, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let effect = effect(req.method(), &path);
    if effect == Effect::None {
        return next.run(req).await;
    }
    if effect == Effect::Snapshots {
        let r = next.run(req).await;
        if r.status().is_success() {
            node.publish_now().await;
        }
        return r;
    }
    let c = match node.quorum().await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let (req, body) = match read_json(req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let pinned = body.get("node").and_then(|n| n.as_str());
    let source = path.trim_matches('/').split('/').nth(2).unwrap_or_default();
    if effect == Effect::Forks {
        if let Some(p) = pinned.filter(|p| *p != node.name) {
            return fork_elsewhere(node, &c, source, p, req).await;
        }
    }
    let hint = req
        .headers()
        .get(HOLDER_HEADER)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    let transfer = match brought(node, hint, &path, effect, &body).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    if effect == Effect::Forks {
        let count = body.get("count").and_then(|c| c.as_u64()).unwrap_or(1);
        if let Some(r) = node.room_for_copies(source, count).await {
            return r;
        }
    }
    let id = path
        .trim_matches('/')
        .split('/')
        .nth(2)
        .unwrap_or_default()
        .to_string();
    if effect == Effect::Deletes {
        node.ledger_edit(|l| {
            l.remove(&id);
        });
    }
    let r = next.run(req).await;
    if effect == Effect::Deletes && r.status() == StatusCode::NOT_FOUND {
        // A record of this node's whose VM is gone (lost when the host restarted): deleting
        // it removes the record.
        if let Ok(Some(o)) = c.owner(&id).await {
            if o.node == node.name && c.forget(&id).await.is_ok() {
                return axum::Json(forkbox_engine::api::Deleted { deleted: id }).into_response();
            }
        }
    }
    if !r.status().is_success() {
        return r;
    }
    match effect {
        Effect::Creates => record_created(node, &c, r, transfer).await,
        Effect::Forks => {
            let r = record_forked(node, &c, r, transfer).await;
            node.publish_now().await;
            r
        }
        Effect::Deletes => {
            if let Err(e) = c.forget(&id).await {
                tracing::warn!("{id}: deleted; its cluster record stays until etcd answers: {e}");
            }
            r
        }
        Effect::None | Effect::Snapshots => r,
    }
}

/// Brings here the snapshot a fork of a snapshot or a create from one starts from, when this
/// node lacks it: what moved, if anything.
async fn brought(
    node: &Node,
    hint: Option<String>,
    path: &str,
    effect: Effect,
    body: &serde_json::Value,
) -> Result<Option<Transfer>, Response> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let name = match (effect, segs.as_slice()) {
        // `/v1/sandboxes/NAME/fork` names a snapshot too when no sandbox has that id.
        (Effect::Forks, ["v1", "snapshots" | "sandboxes", name, "fork"]) => {
            if node.engine.has(name).await {
                return Ok(None);
            }
            name.to_string()
        }
        (Effect::Creates, _) => match body.get("snapshot").and_then(|s| s.as_str()) {
            Some(s) => s.to_string(),
            None => {
                let image = match body.get("image").and_then(|s| s.as_str()) {
                    Some(i) => i.to_string(),
                    None => forkbox_engine::sandbox::SandboxConfig::default()
                        .image
                        .to_string(),
                };
                return node.pull_image(&image).await;
            }
        },
        _ => return Ok(None),
    };
    node.pull(&name, hint.as_deref()).await
}

/// Copies of `source` (a sandbox or snapshot of this node's) made on node `target`: a sandbox
/// is saved here first; `target` brings the snapshot by chunks and makes the copies; the save
/// made for it here goes once it answered.
async fn fork_elsewhere(
    node: &Node,
    c: &Cluster,
    source: &str,
    target: &str,
    req: Request,
) -> Response {
    let live = match live_nodes(c, Some(target)).await {
        Ok(n) => n,
        Err(e) => return Node::unavailable(e),
    };
    let want = Want {
        pinned: Some(target),
        memory_mib: default_memory_mib(),
        ..Want::default()
    };
    let to = match placement::place(&live, &want) {
        Ok(n) => match live.iter().find(|r| r.name == n) {
            Some(r) => r.clone(),
            None => return Node::unavailable(format!("node {n}'s record went meanwhile")),
        },
        Err(e) => return place_refusal(e),
    };
    let started = std::time::Instant::now();
    let is_sandbox = node.engine.has(source).await;
    let (name, pause_ms) = if is_sandbox {
        match node
            .engine
            .call(ops::SaveForCopies {
                id: source.to_string(),
            })
            .await
        {
            Ok(m) => (m.name, m.pause_ms),
            Err(e) => return crate::engine_error(e),
        }
    } else {
        (source.to_string(), None)
    };
    let (mut parts, body) = req.into_parts();
    let Ok(uri) = format!("/v1/snapshots/{name}/fork").parse::<Uri>() else {
        return refusal(Code::BadRequest, format!("{name} cannot be in a path"));
    };
    parts.uri = uri;
    if let Ok(v) = HeaderValue::from_str(&node.name) {
        parts.headers.insert(HOLDER_HEADER, v);
    }
    let r = node.forward(&to, Request::from_parts(parts, body)).await;
    if is_sandbox {
        // The copies' node holds its own copy of the save now (or the fork failed).
        if let Err(e) = node
            .engine
            .call(ops::DeleteSnapshot { name: name.clone() })
            .await
        {
            tracing::warn!("{name}: made for copies on {target}, not removed: {e}");
        }
        node.publish_now().await;
    }
    if !r.status().is_success() {
        return r;
    }
    match body_json::<ForkResult>(r).await {
        Ok((parts, mut f)) => {
            f.pause_ms = pause_ms.or(f.pause_ms);
            f.duration_ms = started.elapsed().as_millis() as u64;
            (parts, axum::Json(f)).into_response()
        }
        Err(r) => r,
    }
}

/// Reads a JSON body (bounded) and gives the request back with it, and the body parsed (null
/// when it is not JSON: the handler then says what is wrong with it).
async fn read_json(req: Request) -> Result<(Request, serde_json::Value), Response> {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_DECISION_BODY).await {
        Ok(b) => b,
        Err(e) => return Err(refusal(Code::PayloadTooLarge, e.to_string())),
    };
    let v = serde_json::from_slice(&bytes).unwrap_or_default();
    Ok((Request::from_parts(parts, Body::from(bytes)), v))
}

async fn body_json<T: serde::de::DeserializeOwned>(
    r: Response,
) -> Result<(axum::http::response::Parts, T), Response> {
    let (mut parts, body) = r.into_parts();
    // The reply is written anew (another length).
    parts.headers.remove(header::CONTENT_LENGTH);
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => return Err(refusal(Code::Internal, e.to_string())),
    };
    match serde_json::from_slice(&bytes) {
        Ok(v) => Ok((parts, v)),
        Err(e) => Err(refusal(Code::Internal, format!("an engine reply: {e}"))),
    }
}

/// Records a new sandbox as this node's; one that cannot be recorded is removed again.
async fn record_created(
    node: &Node,
    c: &Cluster,
    r: Response,
    transfer: Option<Transfer>,
) -> Response {
    let (parts, mut view) = match body_json::<SandboxView>(r).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Err(e) = node.own(c, &view).await {
        let _ = node
            .engine
            .call(ops::Delete {
                id: view.info.id.clone(),
            })
            .await;
        return Node::unavailable(format!("the sandbox was made and removed again: {e}"));
    }
    view.transfer = transfer;
    (parts, axum::Json(view)).into_response()
}

/// Records a fork's copies; a copy that cannot be recorded is removed and listed as failed.
async fn record_forked(
    node: &Node,
    c: &Cluster,
    r: Response,
    transfer: Option<Transfer>,
) -> Response {
    let (parts, mut f) = match body_json::<ForkResult>(r).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut kept = Vec::new();
    for v in std::mem::take(&mut f.sandboxes) {
        match node.own(c, &v).await {
            Ok(()) => kept.push(v),
            Err(e) => {
                let _ = node
                    .engine
                    .call(ops::Delete {
                        id: v.info.id.clone(),
                    })
                    .await;
                f.failed.push(format!(
                    "{}: not recorded in the cluster, removed: {e}",
                    v.info.id
                ));
            }
        }
    }
    for v in &mut kept {
        v.transfer = transfer.clone();
    }
    f.sandboxes = kept;
    f.transfer = transfer;
    (parts, axum::Json(f)).into_response()
}

/// A call about sandbox `id`: here if it runs here, else on its owner.
async fn by_owner(node: &Node, id: String, req: Request, next: Next) -> Response {
    if node.engine.has(&id).await {
        return local(node, req, next).await;
    }
    let Some(c) = node.cluster().await else {
        return local(node, req, next).await;
    };
    // The owner and the live nodes, read at once (member-local reads, no cache).
    let (owner, live) = match tokio::try_join!(c.owner(&id), c.nodes()) {
        Ok(x) => x,
        Err(e) => return Node::unavailable(e),
    };
    let owner = match owner {
        Some(o) => o,
        // No sandbox of that id: a fork's source may be a snapshot's name.
        None => return by_holder(node, id, req, next).await,
    };
    if owner.node == node.name {
        return local(node, req, next).await;
    }
    // A node missing from this member's list may have joined a moment ago: the leader says.
    let live = match live.iter().any(|n| n.name == owner.node) {
        true => live,
        false => c.nodes_fresh().await.unwrap_or(live),
    };
    match live.iter().find(|n| n.name == owner.node) {
        // A live owner answers for its own, lost or not (it re-adopts what is back).
        Some(target) => node.forward(target, req).await,
        _ if req.method() == Method::DELETE => match c.remove_record(&id, &owner.node).await {
            Ok(()) => {
                tracing::info!("{id}: lost with node {}; its record removed", owner.node);
                axum::Json(forkbox_engine::api::Deleted { deleted: id }).into_response()
            }
            Err(e) => Node::unavailable(e),
        },
        _ => refusal(
            Code::SandboxLost,
            format!(
                "sandbox {id} is lost: its node {} left the cluster (died or lost its lease); \
                 delete it to remove its record",
                owner.node
            ),
        ),
    }
}

/// A call about snapshot `name`: on a node that holds it (this one first). A fork of it goes
/// where placement puts the copies among the holders.
async fn by_holder(node: &Node, name: String, req: Request, next: Next) -> Response {
    let here = node
        .engine
        .call(ops::GetSnapshot { name: name.clone() })
        .await
        .is_ok();
    let Some(c) = node.cluster().await.filter(|_| !here) else {
        return local(node, req, next).await;
    };
    let live = match c.nodes().await {
        Ok(n) => n,
        Err(e) => return Node::unavailable(e),
    };
    // A snapshot saved a moment ago on another node may not be in this member's copy yet:
    // when no node holds it here, the leader says.
    let live = match live.iter().any(|n| n.snapshots.contains(&name)) {
        true => live,
        false => c.nodes_fresh().await.unwrap_or(live),
    };
    let is_fork = req.method() == Method::POST && req.uri().path().ends_with("/fork");
    if !is_fork {
        return match live.iter().find(|n| n.snapshots.contains(&name)) {
            Some(holder) => node.forward(holder, req).await,
            None => local(node, req, next).await,
        };
    }
    let (req, body) = match read_json(req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let pinned = body.get("node").and_then(|n| n.as_str());
    let count = body.get("count").and_then(|c| c.as_u64()).unwrap_or(1);
    let live = match pinned.filter(|p| !live.iter().any(|n| n.name == *p)) {
        Some(_) => c.nodes_fresh().await.unwrap_or(live),
        None => live,
    };
    let want = Want {
        pinned,
        snapshot: Some(&name),
        memory_mib: default_memory_mib(),
        count: u32::try_from(count).unwrap_or(u32::MAX),
        ..Want::default()
    };
    match placement::place(&live, &want) {
        Ok(n) if n == node.name => local(node, req, next).await,
        Ok(n) => match live.iter().find(|r| r.name == n) {
            Some(target) => node.forward(target, req).await,
            None => local(node, req, next).await,
        },
        Err(placement::PlaceError::NoHolder(_)) => local(node, req, next).await,
        Err(e) => place_refusal(e),
    }
}

/// A new volume: on the node it names (which must be live), else here.
async fn volume_create(node: &Node, req: Request, next: Next) -> Response {
    let (req, body) = match read_json(req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(pinned) = body
        .get("node")
        .and_then(|n| n.as_str())
        .filter(|p| *p != node.name)
    else {
        return local(node, req, next).await;
    };
    let Some(c) = node.cluster().await else {
        return Node::unavailable("this node has not reached etcd yet");
    };
    let live = match live_nodes(&c, Some(pinned)).await {
        Ok(n) => n,
        Err(e) => return Node::unavailable(e),
    };
    match live.iter().find(|n| n.name == pinned) {
        Some(target) => node.forward(target, req).await,
        None => place_refusal(placement::PlaceError::UnknownNode {
            name: pinned.to_string(),
            live: live
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// A call about volume `name`: on the node it lives on (this one first).
async fn by_volume(node: &Node, name: String, req: Request, next: Next) -> Response {
    let here = node
        .engine
        .call(ops::GetVolume { name: name.clone() })
        .await
        .is_ok();
    let Some(c) = node.cluster().await.filter(|_| !here) else {
        return local(node, req, next).await;
    };
    let live = match c.nodes_fresh().await {
        Ok(n) => n,
        Err(e) => return Node::unavailable(e),
    };
    match live.iter().find(|n| n.volumes.contains(&name)) {
        Some(holder) => node.forward(holder, req).await,
        None => local(node, req, next).await,
    }
}

/// The live nodes as this etcd member has them; when `pinned` names one it lacks (a node that
/// joined a moment ago), as the leader has them.
async fn live_nodes(c: &Cluster, pinned: Option<&str>) -> forkbox_cluster::Result<Vec<NodeRecord>> {
    let live = c.nodes().await?;
    match pinned {
        Some(p) if !live.iter().any(|n| n.name == p) => c.nodes_fresh().await,
        _ => Ok(live),
    }
}

fn place_refusal(e: placement::PlaceError) -> Response {
    use placement::PlaceError as P;
    let code = match &e {
        P::UnknownNode { .. } => Code::BadRequest,
        P::Drained(_) => Code::Conflict,
        P::NoHolder(_) => Code::SnapshotNotFound,
        P::NoVolume(_) => Code::VolumeNotFound,
        P::VolumeElsewhere { .. } => Code::Conflict,
        P::NoRoom { .. } => Code::NoCapacity,
    };
    refusal(code, e.to_string())
}

/// A create: placed, then made here or on the chosen node.
async fn create(node: &Node, req: Request, next: Next) -> Response {
    let Some(c) = node.cluster().await else {
        return Node::unavailable("this node has not reached etcd yet: creates wait for it");
    };
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_DECISION_BODY).await {
        Ok(b) => b,
        Err(e) => return refusal(Code::PayloadTooLarge, e.to_string()),
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let (pinned, image, snapshot) = (text("node"), text("image"), text("snapshot"));
    let memory = v.get("memory_mib").and_then(|m| m.as_u64());
    let volumes: Vec<String> = v
        .get("volumes")
        .and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|m| m.get("name")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let decided = std::time::Instant::now();
    let live = match live_nodes(&c, pinned.as_deref()).await {
        Ok(n) => n,
        Err(e) => return Node::unavailable(e),
    };
    let want = Want {
        pinned: pinned.as_deref(),
        image: image.as_deref(),
        snapshot: snapshot.as_deref(),
        memory_mib: memory.unwrap_or(default_memory_mib()),
        count: 1,
        volumes: &volumes,
    };
    let chosen = match placement::place(&live, &want) {
        Ok(n) => n,
        Err(e) => return place_refusal(e),
    };
    tracing::info!(
        "placement: a create goes to {chosen} (decided in {} µs: nodes read from etcd and ranked)",
        decided.elapsed().as_micros()
    );
    let req = Request::from_parts(parts, Body::from(bytes));
    match live.iter().find(|n| n.name == chosen) {
        Some(target) if chosen != node.name => node.forward(target, req).await,
        _ => local(node, req, next).await,
    }
}

/// Every live node's sandboxes, and the records of those whose node is gone, as `lost`.
async fn list(node: &Node, req: Request) -> Response {
    let Some(c) = node.cluster().await else {
        return Node::unavailable("this node has not reached etcd yet: it cannot list the cluster");
    };
    let (live, records) = match tokio::try_join!(c.nodes(), c.owned()) {
        Ok(x) => x,
        Err(e) => return Node::unavailable(e),
    };
    let pq = req
        .uri()
        .path_and_query()
        .map_or("/v1/sandboxes", |p| p.as_str());
    let query: std::collections::HashMap<String, String> = req
        .uri()
        .query()
        .map(|q| {
            q.split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    let answers = futures_util::future::join_all(
        live.iter()
            .map(|n| async move { (n, node.fetch::<Vec<SandboxView>>(n, pq).await) }),
    )
    .await;
    let mut all: Vec<SandboxView> = Vec::new();
    let mut answered = BTreeSet::new();
    for (n, a) in answers {
        match a {
            Ok(views) => {
                answered.insert(n.name.clone());
                all.extend(views);
            }
            Err(e) => {
                // A 4xx is the request's fault, the same on every node: say it once.
                if e.starts_with("400") {
                    return refusal(Code::BadRequest, e);
                }
                tracing::warn!("listing: node {} did not answer: {e}", n.name);
            }
        }
    }
    let seen: BTreeSet<String> = all.iter().map(|v| v.info.id.clone()).collect();
    let wants_state = query.get("state").map(String::as_str);
    for o in records {
        if seen.contains(&o.view.info.id) || answered.contains(&o.node) && !o.lost {
            continue;
        }
        let gone = o.lost || !live.iter().any(|n| n.name == o.node);
        let mut v = o.view;
        v.node = Some(o.node.clone());
        if gone {
            v.state = SandboxState::Lost;
            v.failure = Some(format!("its node {} left the cluster", o.node));
        } else {
            v.failure = Some(format!("its node {} did not answer the listing", o.node));
        }
        let keep = query.get("node").is_none_or(|n| *n == o.node)
            && wants_state.is_none_or(|s| s == "lost" && gone)
            && query.get("label").is_none_or(|kv| {
                kv.split_once('=')
                    .is_some_and(|(k, val)| v.labels.get(k).map(String::as_str) == Some(val))
            });
        if keep {
            all.push(v);
        }
    }
    all.sort_by(|a, b| (a.created_unix, &a.info.id).cmp(&(b.created_unix, &b.info.id)));
    (StatusCode::OK, axum::Json(all)).into_response()
}

/// Every live node's snapshots or migrations (`what`), each with the node that holds it.
async fn list_everywhere(node: &Node, req: Request, what: &str) -> Response {
    let Some(c) = node.cluster().await else {
        return Node::unavailable("this node has not reached etcd yet");
    };
    let live = match c.nodes().await {
        Ok(n) => n,
        Err(e) => return Node::unavailable(e),
    };
    let pq = req.uri().path_and_query().map_or("/v1", |p| p.as_str());
    let mut all: Vec<serde_json::Value> = Vec::new();
    for n in &live {
        match node.fetch::<Vec<serde_json::Value>>(n, pq).await {
            Ok(mut v) => {
                for s in &mut v {
                    if let Some(o) = s.as_object_mut() {
                        o.insert("node".into(), n.name.clone().into());
                    }
                }
                all.extend(v);
            }
            Err(e) => tracing::warn!("listing {what}: node {} did not answer: {e}", n.name),
        }
    }
    axum::Json(all).into_response()
}
