//! E2B's template tags: a tag is a movable name for one build of a template, which is one
//! version of the forkbox image of the template's name (`name:tag` → `name@N`). A build's tags
//! (`default` when it names none) point at it when it is ready; `assign_tags` points more at
//! the build a `name[:tag]` names; `remove_tags` takes them off. Kept in a file of the home's,
//! so they outlive the daemon.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::control::{body, caller, status};
use crate::errors::Failure;
use crate::E2b;

type Answer = Result<Response, Failure>;

/// One tag: the build it names and that build's image.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Tag {
    pub build: String,
    pub image: String,
    pub created: String,
}

/// Every template's tags (template → tag → build).
type All = BTreeMap<String, BTreeMap<String, Tag>>;

pub(crate) struct Tags {
    file: PathBuf,
    all: Mutex<All>,
}

impl Tags {
    pub(crate) fn load(file: PathBuf) -> Tags {
        let all = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Tags {
            file,
            all: Mutex::new(all),
        }
    }

    fn change<T>(&self, f: impl FnOnce(&mut All) -> T) -> T {
        let mut all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        let r = f(&mut all);
        if let Ok(text) = serde_json::to_vec_pretty(&*all) {
            let tmp = self.file.with_extension("tmp");
            let saved = self
                .file
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::write(&tmp, text))
                .and_then(|()| std::fs::rename(&tmp, &self.file));
            if let Err(e) = saved {
                tracing::warn!(
                    "e2b: template tags not saved in {}: {e}",
                    self.file.display()
                );
            }
        }
        r
    }

    /// Points `tags` of `template` at `tag`'s build.
    pub(crate) fn set(&self, template: &str, tags: &[String], tag: &Tag) {
        self.change(|all| {
            let t = all.entry(template.to_string()).or_default();
            for name in tags {
                t.insert(name.clone(), tag.clone());
            }
        });
    }

    pub(crate) fn get(&self, template: &str, tag: &str) -> Option<Tag> {
        let all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        all.get(template).and_then(|t| t.get(tag)).cloned()
    }
}

/// `name[:tag]` → (name, tag), the tag `default` when none is given; refused in E2B's words
/// when a part is empty.
pub(crate) fn split(target: &str) -> Result<(String, String), Failure> {
    let (n, t) = target.split_once(':').unwrap_or((target, "default"));
    if n.is_empty() || t.is_empty() {
        return Err(Failure::new(400, format!("Invalid name/tag: {target:?}")));
    }
    Ok((n.to_ascii_lowercase(), t.to_string()))
}

/// A tag to give: E2B's `^[a-z0-9-_.]+$`.
fn check_tag(t: &str) -> Result<(), Failure> {
    let ok = !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Failure::new(400, format!("Invalid name/tag: tag {t:?}")))
    }
}

pub(crate) fn router(state: Arc<E2b>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/templates/tags", post(assign).delete(remove))
        .route("/templates/{id}/tags", get(list))
        .with_state(state)
}

#[derive(Debug, Default, Deserialize)]
struct Assign {
    #[serde(default)]
    target: String,
    #[serde(default)]
    tags: Vec<String>,
}

async fn assign(State(e): State<Arc<E2b>>, headers: HeaderMap, bytes: bytes::Bytes) -> Answer {
    caller(&e, &headers)?;
    let a: Assign = body(&bytes)?;
    let (name, tag) = split(&a.target)?;
    for t in &a.tags {
        check_tag(t)?;
    }
    let Some(found) = e.tags.get(&name, &tag) else {
        return Err(Failure::new(
            404,
            format!("template {name} has no tag {tag}"),
        ));
    };
    e.tags.set(&name, &a.tags, &found);
    Ok(status(
        StatusCode::CREATED,
        json!({"buildID": found.build, "tags": a.tags}),
    ))
}

#[derive(Debug, Default, Deserialize)]
struct Remove {
    #[serde(default)]
    name: String,
    #[serde(default)]
    tags: Vec<String>,
}

async fn remove(State(e): State<Arc<E2b>>, headers: HeaderMap, bytes: bytes::Bytes) -> Answer {
    caller(&e, &headers)?;
    let r: Remove = body(&bytes)?;
    if r.name.is_empty() || r.name.contains(':') {
        return Err(Failure::new(
            400,
            format!("Invalid name {:?}: a template's name, no tag", r.name),
        ));
    }
    if r.tags.iter().any(|t| t == "default") {
        return Err(Failure::new(400, "the tag default cannot be removed"));
    }
    let name = r.name.to_ascii_lowercase();
    let missing = e.tags.change(|all| {
        let t = all.entry(name.clone()).or_default();
        r.tags
            .iter()
            .filter(|tag| t.remove(*tag).is_none())
            .cloned()
            .collect::<Vec<_>>()
    });
    if !missing.is_empty() {
        return Err(Failure::new(
            404,
            format!("template {name} has no tag(s) {}", missing.join(", ")),
        ));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list(State(e): State<Arc<E2b>>, headers: HeaderMap, Path(id): Path<String>) -> Answer {
    caller(&e, &headers)?;
    let name = id.split(':').next().unwrap_or(&id).to_ascii_lowercase();
    let all = e.tags.all.lock().unwrap_or_else(|p| p.into_inner());
    let Some(tags) = all.get(&name) else {
        return Err(Failure::new(404, format!("template {name} not found")));
    };
    let rows: Vec<serde_json::Value> = tags
        .iter()
        .map(|(tag, t)| json!({"tag": tag, "buildID": t.build, "createdAt": t.created}))
        .collect();
    Ok(status(StatusCode::OK, json!(rows)))
}
