//! E2B's volumes (`/volumes`): each a forkbox volume named `e2b-OWNER12-NAME`, so a key sees
//! only its own, mounted through a create's `volumeMounts` read-write (E2B's volumes have no
//! read-only mounts; forkbox's one-writer rule then holds: a second sandbox that mounts a
//! volume another has is refused, naming it). Their files are read and written without a
//! sandbox of the caller's through E2B's content API ([`content`]).

mod content;
pub(crate) mod door;
mod script;

pub(crate) use content::router;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use forkbox_api::{Code, VolumeCreateRequest, VolumeMount, VolumeView};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::control::{body, caller, status};
use crate::errors::Failure;
use crate::{keys, E2b};

type Answer = Result<Response, Failure>;

#[derive(Debug, Default, Deserialize)]
struct NewVolume {
    name: String,
}

/// The forkbox name of the caller's volume `name`.
pub(crate) fn forkbox_name(owner: &str, name: &str) -> Result<String, Failure> {
    let ok = !name.is_empty()
        && name.len() <= 46
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(Failure::new(
            400,
            format!("volume name {name:?}: 1-46 of lowercase letters, digits, '-', '_' or '.'"),
        ));
    }
    Ok(keys::owned_name(owner, name))
}

fn shape(e: &E2b, owner: &str, v: &VolumeView) -> Option<Value> {
    let name = keys::owned_label(owner, &v.name)?;
    let token = content::token(&e.key, &v.name, v.created_unix);
    Some(json!({ "volumeID": v.name, "name": name, "token": token }))
}

fn not_found(id: &str) -> Failure {
    Failure::of(Code::VolumeNotFound, format!("volume {id} not found"))
}

pub(crate) async fn create(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    bytes: bytes::Bytes,
) -> Answer {
    let c = caller(&e, &headers)?;
    let n: NewVolume = body(&bytes)?;
    let name = forkbox_name(&c.owner, &n.name)?;
    let v = c
        .client
        .create_volume(&VolumeCreateRequest {
            name,
            size: None,
            node: None,
        })
        .await?;
    let shaped = shape(&e, &c.owner, &v).unwrap_or(Value::Null);
    Ok(status(StatusCode::CREATED, shaped))
}

pub(crate) async fn list(State(e): State<Arc<E2b>>, headers: HeaderMap) -> Answer {
    let c = caller(&e, &headers)?;
    let all: Vec<Value> = c
        .client
        .list_volumes()
        .await?
        .iter()
        .filter_map(|v| shape(&e, &c.owner, v))
        .map(|mut v| {
            v.as_object_mut().map(|o| o.remove("token"));
            v
        })
        .collect();
    Ok(status(StatusCode::OK, Value::Array(all)))
}

/// The caller's volume `id` (others' are not found, as an unknown one).
async fn mine(c: &crate::control::Caller, id: &str) -> Result<VolumeView, Failure> {
    if keys::owned_label(&c.owner, id).is_none() {
        return Err(not_found(id));
    }
    match c.client.get_volume(id).await {
        Ok(v) => Ok(v),
        Err(e) if e.status() == Some(404) => Err(not_found(id)),
        Err(e) => Err(e.into()),
    }
}

pub(crate) async fn info(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    let c = caller(&e, &headers)?;
    let v = mine(&c, &id).await?;
    Ok(status(
        StatusCode::OK,
        shape(&e, &c.owner, &v).unwrap_or(Value::Null),
    ))
}

pub(crate) async fn destroy(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    let c = caller(&e, &headers)?;
    mine(&c, &id).await?;
    door::release(&e, &[&id]).await;
    c.client.remove_volume(&id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A create's `volumeMounts` (`[{name, path}]`) as forkbox's mounts of the caller's volumes.
pub(crate) fn mounts(owner: &str, asked: &[Value]) -> Result<Vec<VolumeMount>, Failure> {
    asked
        .iter()
        .map(|m| {
            let field = |k: &str| {
                m.get(k).and_then(Value::as_str).ok_or_else(|| {
                    Failure::new(400, format!("volumeMounts: each needs a `{k}` (a string)"))
                })
            };
            let mount = VolumeMount {
                name: forkbox_name(owner, field("name")?)?,
                path: field("path")?.to_string(),
                read_only: false,
            };
            mount.checked().map_err(|e| Failure::new(400, e.0))?;
            Ok(mount)
        })
        .collect()
}

/// A sandbox's `volumeMounts` as E2B shows them: the names its owner gave (a sandbox is shown
/// only to its owner, whose volumes alone it can mount).
pub(crate) fn shown(v: &forkbox_api::SandboxView) -> Value {
    Value::Array(
        v.info
            .volumes
            .iter()
            .map(|m| {
                let name = match m.name.starts_with("e2b-") {
                    true => keys::snapshot_label(&m.name),
                    false => &m.name,
                };
                json!({ "name": name, "path": m.path })
            })
            .collect(),
    )
}
