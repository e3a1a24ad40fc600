//! E2B's template builds, as `Template.build` of E2B's SDKs (2.45 and newer) calls them: the
//! build requested (`POST /v3/templates`), each COPY's files uploaded by their hash to a
//! signed URL, the build started with its steps (`POST /v2/templates/{id}/builds/{build}`)
//! and its status and logs polled by offset. A front end over forkbox's own API: the steps
//! become a Dockerfile ([`crate::steps`]) the daemon builds in sandboxes as the caller (their
//! key is their forkbox token), under the template's name; with a start command, a sandbox of
//! the image runs it until its ready command succeeds and is saved, so that `Sandbox.create`
//! of the template gives a copy with it running.
//!
//! Builds are kept in memory (a daemon restarted forgets the build records, not the images
//! they made). The cache is the whole build's (`?if_changed=true` on the daemon's Dockerfile
//! build): a build whose steps, files and base are those of the template's newest image takes
//! it, its log saying `CACHED`; any change runs every step (no per-step layers), and
//! `skip_cache()` builds anew.

use std::collections::HashMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use forkbox_client::Client;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::control::{body, caller, status};
use crate::errors::Failure;
use crate::steps::{self, Step};
use crate::{keys, E2b};

type Answer = Result<Response, Failure>;

/// The builds this front end started, by build id, and where uploads are kept.
pub(crate) struct Builds {
    dir: PathBuf,
    all: Mutex<HashMap<String, Build>>,
}

struct Build {
    template: String,
    /// The tags it gets when it is ready.
    tags: Vec<String>,
    owner: String,
    status: &'static str,
    entries: Vec<Value>,
    reason: Option<Value>,
}

impl Builds {
    /// The builds of a front end starting: uploads a killed daemon left half written
    /// (`.HASH.PID`) are removed.
    pub(crate) fn new(dir: PathBuf) -> Builds {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with('.') {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Builds {
            dir,
            all: Mutex::default(),
        }
    }

    fn with<T>(&self, id: &str, f: impl FnOnce(&mut Build) -> T) -> Option<T> {
        let mut all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        all.get_mut(id).map(f)
    }

    fn log(&self, id: &str, level: &str, message: impl Into<String>) {
        let entry = json!({
            "timestamp": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            "level": level,
            "message": message.into(),
        });
        self.with(id, |b| b.entries.push(entry));
    }

    fn upload(&self, hash: &str) -> PathBuf {
        self.dir.join(hash)
    }
}

impl E2b {
    pub(crate) fn builds_log(&self, build: &str, message: String) {
        self.builds.log(build, "info", message);
    }
}

pub(crate) fn router(state: Arc<E2b>) -> axum::Router {
    use axum::routing::{get, post, put};
    axum::Router::new()
        .route("/v3/templates", post(request_build))
        .route("/templates/{id}/files/{hash}", get(upload_link))
        .route("/e2b/uploads/{hash}", put(upload))
        .route("/v2/templates/{id}/builds/{build}", post(start_build))
        .route("/templates/{id}/builds/{build}/status", get(build_status))
        .route("/templates/aliases/{alias}", get(alias))
        .with_state(state)
}

/// Whether a request is an upload to a URL this front end signed (it carries no key).
pub(crate) fn is_upload(uri: &axum::http::Uri) -> bool {
    uri.path().starts_with("/e2b/uploads/")
}

fn new_build_id() -> Result<String, Failure> {
    let h = keys::random_hex(16).map_err(|e| Failure::new(500, e.to_string()))?;
    Ok(format!(
        "{}-{}-4{}-a{}-{}",
        &h[..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    ))
}

/// E2B's template names: `^[a-z0-9-_]+$` (lowercased), and tags `^[a-z0-9-_.]+$`.
fn name_and_tags(name: &str, tags: &[String]) -> Result<(String, Vec<String>), Failure> {
    let (n, tag) = match name.split_once(':') {
        Some((n, t)) => (n, Some(t)),
        None => (name, None),
    };
    let n = n.to_ascii_lowercase();
    let ok = |s: &str, dot: bool| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes().all(|b| {
                b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b == b'-'
                    || b == b'_'
                    || (dot && b == b'.')
            })
    };
    if !ok(&n, false) {
        return Err(Failure::new(
            400,
            format!("Invalid name/tag: template name {n:?} must be lowercase letters, digits, '-' and '_'"),
        ));
    }
    let mut all: Vec<String> = tag.into_iter().map(str::to_string).collect();
    all.extend(tags.iter().cloned());
    for t in &all {
        if !ok(t, true) || t == "default" && tag.is_some() {
            return Err(Failure::new(400, format!("Invalid name/tag: tag {t:?}")));
        }
    }
    if all.is_empty() {
        all.push("default".into());
    }
    Ok((n, all))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewBuild {
    #[serde(default)]
    name: String,
    #[serde(default)]
    tags: Vec<String>,
}

async fn request_build(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    bytes: bytes::Bytes,
) -> Answer {
    let c = caller(&e, &headers)?;
    let n: NewBuild = body(&bytes)?;
    let (name, tags) = name_and_tags(&n.name, &n.tags)?;
    let id = new_build_id()?;
    e.builds
        .all
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            id.clone(),
            Build {
                template: name.clone(),
                tags: tags.clone(),
                owner: c.owner,
                status: "waiting",
                entries: Vec::new(),
                reason: None,
            },
        );
    Ok(status(
        StatusCode::ACCEPTED,
        json!({"templateID": name, "buildID": id, "public": false,
               "names": [name], "aliases": [name], "tags": tags}),
    ))
}

fn check_hash(hash: &str) -> Result<(), Failure> {
    if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(Failure::new(
            400,
            format!("{hash:?} is not a files hash (64 hex digits)"),
        ))
    }
}

fn upload_token(e: &E2b, hash: &str) -> String {
    keys::access_token(&e.key, &format!("template-upload/{hash}"))
}

/// Where a COPY's files go: present when an upload of that hash is kept; the URL carries its
/// own signature (the SDK sends no key with it).
async fn upload_link(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Path((_id, hash)): Path<(String, String)>,
) -> Answer {
    caller(&e, &headers)?;
    check_hash(&hash)?;
    // The name the SDK reached this daemon by: HTTP/2's authority, HTTP/1.1's Host.
    let host = uri
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            headers
                .get(axum::http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        })
        .ok_or_else(|| Failure::new(400, "the request names no host to upload to"))?;
    let scheme = if e.domain.is_some() { "https" } else { "http" };
    let url = format!(
        "{scheme}://{host}/e2b/uploads/{hash}?signature={}",
        upload_token(&e, &hash)
    );
    let present = e.builds.upload(&hash).is_file();
    Ok(status(
        StatusCode::CREATED,
        json!({"present": present, "url": url}),
    ))
}

#[derive(Debug, Deserialize)]
struct Signed {
    #[serde(default)]
    signature: String,
}

/// Most bytes one COPY's upload may hold.
const MAX_UPLOAD: u64 = 4 << 30;

async fn upload(
    State(e): State<Arc<E2b>>,
    Path(hash): Path<String>,
    Query(q): Query<Signed>,
    body: axum::body::Body,
) -> Answer {
    check_hash(&hash)?;
    if !keys::token_ok(&e.key, &format!("template-upload/{hash}"), &q.signature) {
        return Err(Failure::new(
            403,
            "the upload URL's signature is not this daemon's",
        ));
    }
    std::fs::create_dir_all(&e.builds.dir)
        .map_err(|err| Failure::new(500, format!("keep the upload: {err}")))?;
    let tmp = e.builds.dir.join(format!(".{hash}.{}", std::process::id()));
    let written = write_capped(body, &tmp).await;
    match written {
        Ok(()) => std::fs::rename(&tmp, e.builds.upload(&hash))
            .map_err(|err| Failure::new(500, format!("keep the upload: {err}")))?,
        Err(f) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(f);
        }
    }
    Ok(StatusCode::OK.into_response())
}

async fn write_capped(body: axum::body::Body, path: &FsPath) -> Result<(), Failure> {
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    let io = |err: std::io::Error| Failure::new(500, format!("keep the upload: {err}"));
    let mut f = tokio::fs::File::create(path).await.map_err(io)?;
    let mut stream = body.into_data_stream();
    let mut size = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|err| Failure::new(400, format!("the upload broke off: {err}")))?;
        size += chunk.len() as u64;
        if size > MAX_UPLOAD {
            return Err(Failure::new(413, "an upload holds at most 4 GiB"));
        }
        f.write_all(&chunk).await.map_err(io)?;
    }
    f.flush().await.map_err(io)
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Start {
    #[serde(default)]
    steps: Vec<Step>,
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<Value>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
    /// `skip_cache()` before the base: nothing is taken from an earlier build.
    #[serde(default)]
    force: Option<bool>,
}

async fn start_build(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path((id, build)): Path<(String, String)>,
    bytes: bytes::Bytes,
) -> Answer {
    let c = caller(&e, &headers)?;
    let start: Start = body(&bytes)?;
    let owned = e.builds.with(&build, |b| {
        if b.owner != c.owner || b.template != id {
            return Err(Failure::new(
                404,
                format!("no build {build} of template {id}"),
            ));
        }
        if b.status != "waiting" {
            return Err(Failure::new(400, "build is not in waiting state"));
        }
        b.status = "building";
        Ok(())
    });
    owned.unwrap_or_else(|| {
        Err(Failure::new(
            404,
            format!("no build {build} of template {id}"),
        ))
    })?;
    let (e2, owner) = (e.clone(), c.owner.clone());
    tokio::spawn(async move {
        let r = run(&e2, &c.client, &owner, &build, &id, &start).await;
        let (status, reason) = match r {
            Ok(()) => ("ready", None),
            Err((step, message)) => {
                e2.builds.log(&build, "error", message.clone());
                ("error", Some(json!({"message": message, "step": step})))
            }
        };
        e2.builds.with(&build, |b| {
            b.status = status;
            b.reason = reason;
        });
    });
    Ok((
        StatusCode::ACCEPTED,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        "{}",
    )
        .into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusQuery {
    #[serde(default)]
    logs_offset: usize,
    limit: Option<usize>,
}

async fn build_status(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path((id, build)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> Answer {
    let c = caller(&e, &headers)?;
    let limit = q.limit.unwrap_or(100).min(100);
    let view = e.builds.with(&build, |b| {
        if b.owner != c.owner || b.template != id {
            return None;
        }
        let page: Vec<Value> = b
            .entries
            .iter()
            .skip(q.logs_offset)
            .take(limit)
            .cloned()
            .collect();
        let mut v = json!({"templateID": id, "buildID": build, "status": b.status,
                           "logs": [], "logEntries": page});
        if let Some(r) = &b.reason {
            v["reason"] = r.clone();
        }
        Some(v)
    });
    match view.flatten() {
        Some(v) => Ok(status(StatusCode::OK, v)),
        None => Err(Failure::new(
            404,
            format!("no build {build} of template {id}"),
        )),
    }
}

/// Whether a template exists: an image of that name here, or one forkbox carries a recipe
/// for (built on first use).
async fn alias(State(e): State<Arc<E2b>>, headers: HeaderMap, Path(alias): Path<String>) -> Answer {
    let c = caller(&e, &headers)?;
    let name = alias.split(':').next().unwrap_or(&alias);
    if c.client.get_image(name).await.is_ok() || crate::templates::seed(name).is_some() {
        return Ok(status(
            StatusCode::OK,
            json!({"templateID": name, "public": false}),
        ));
    }
    Err(Failure::new(404, format!("template {alias} not found")))
}

type StepFailure = (String, String);

fn at_base(message: impl Into<String>) -> StepFailure {
    ("base".into(), message.into())
}

/// The whole build: the base made ready, the Dockerfile built, the start command's sandbox
/// saved. A failure names the step (`base`, a step's number, `finalize`).
async fn run(
    e: &Arc<E2b>,
    client: &Client,
    owner: &str,
    build: &str,
    template: &str,
    start: &Start,
) -> Result<(), StepFailure> {
    let base = base_of(e, client, build, start).await?;
    let plan = steps::plan(&base, &start.steps).map_err(|(k, m)| (k.to_string(), m))?;
    // forkbox's cache is the whole build's: the newest image of the template, when it was
    // made of the same steps, files and base, is taken as it is; `skip_cache()` anywhere
    // builds anew.
    let cache = !start.force.unwrap_or(false) && !start.steps.iter().any(|s| s.force == Some(true));
    e.builds.log(
        build,
        "info",
        format!(
            "[builder] {} step(s) from {base}; {}",
            start.steps.len(),
            if cache {
                "the template's newest image is reused if it was made of the same steps, files and base (forkbox caches whole builds, not each step)"
            } else {
                "skip_cache: every step runs"
            }
        ),
    );
    let context = context(&e.builds, &plan).map_err(at_base)?;
    let mut events = client
        .build_dockerfile(template, None, &[], cache, reqwest::Body::from(context))
        .await
        .map_err(|err| at_base(err.to_string()))?;
    let mut at: Option<usize> = None;
    loop {
        let ev = events
            .next()
            .await
            .map_err(|err| at_base(err.to_string()))?;
        match ev {
            Some(forkbox_api::BuildProgress::Step { n, total, what }) => {
                at = plan
                    .origin
                    .get((n as usize).saturating_sub(1))
                    .copied()
                    .flatten();
                e.builds
                    .log(build, "info", format!("[builder {n}/{total}] {what}"));
            }
            Some(forkbox_api::BuildProgress::Log { line }) => e.builds.log(build, "info", line),
            Some(forkbox_api::BuildProgress::Done { image }) => {
                tag(e, build, template, &image.reference);
                break;
            }
            Some(forkbox_api::BuildProgress::UpToDate { image }) => {
                e.builds.log(
                    build,
                    "info",
                    format!(
                        "CACHED: all {} step(s): {} was made of the same steps, files and base",
                        start.steps.len(),
                        image.reference
                    ),
                );
                tag(e, build, template, &image.reference);
                break;
            }
            Some(forkbox_api::BuildProgress::Error { message, .. }) => {
                let step = at.map_or("base".to_string(), |k| k.to_string());
                return Err((step, message));
            }
            None => return Err(at_base("the build ended without saying it was done")),
        }
    }
    if let Some(cmd) = &start.start_cmd {
        let ready = start.ready_cmd.clone().unwrap_or_else(|| "sleep 20".into());
        crate::started::save(e, client, owner, build, template, cmd, &ready)
            .await
            .map_err(|m| ("finalize".to_string(), m))?;
    }
    e.builds
        .log(build, "info", format!("template {template} is ready"));
    Ok(())
}

/// Points the build's tags at the image it made.
fn tag(e: &E2b, build: &str, template: &str, image: &str) {
    let tags = e.builds.with(build, |b| b.tags.clone()).unwrap_or_default();
    let t = crate::tags::Tag {
        build: build.to_string(),
        image: image.to_string(),
        created: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
    };
    e.tags.set(template, &tags, &t);
    e.builds
        .log(build, "info", format!("{image} tagged {}", tags.join(", ")));
}

/// The image a build starts from: a template (a forkbox image, or one forkbox carries a
/// recipe for, built first), E2B's default base image (forkbox's `base`, its counterpart), or
/// a registry's image (pulled by the daemon).
async fn base_of(
    e: &Arc<E2b>,
    client: &Client,
    build: &str,
    start: &Start,
) -> Result<String, StepFailure> {
    if start.from_image_registry.is_some() {
        return Err(at_base(
            "registry credentials in a template are not taken: log the daemon in with `forkbox image login REGISTRY`",
        ));
    }
    let (name, carried) = match (&start.from_template, &start.from_image) {
        (Some(t), _) => (t.split(':').next().unwrap_or(t).to_string(), true),
        (None, Some(i)) if matches!(i.as_str(), "e2bdev/base" | "e2bdev/base:latest") => {
            e.builds.log(
                build,
                "info",
                format!("{i} is E2B's base image: forkbox builds from its own `base` image"),
            );
            ("base".to_string(), true)
        }
        (None, Some(i)) => (i.clone(), false),
        (None, None) => ("base".to_string(), true),
    };
    if carried {
        e.builds
            .log(build, "info", format!("[base] template {name}"));
        crate::control::ensure_built(e, client, &name, "the template a build starts from")
            .await
            .map_err(|f| at_base(f.message))?;
    }
    Ok(name)
}

/// The build's context as tar.zst: the Dockerfile, and each upload's entries under `HASH/`
/// (gzip or plain tar, as the SDK sent it).
fn context(builds: &Builds, plan: &steps::Plan) -> Result<Vec<u8>, String> {
    let mut out = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(plan.dockerfile.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    out.append_data(&mut h, "Dockerfile", plan.dockerfile.as_bytes())
        .map_err(|err| err.to_string())?;
    for hash in &plan.uploads {
        let file = builds.upload(hash);
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut std::fs::File::open(&file)
                .map_err(|err| format!("the files of COPY {hash} were not uploaded: {err}"))?,
            &mut raw,
        )
        .map_err(|err| err.to_string())?;
        let reader: Box<dyn std::io::Read> = if raw.starts_with(&[0x1f, 0x8b]) {
            Box::new(flate2::read::GzDecoder::new(&raw[..]))
        } else {
            Box::new(&raw[..])
        };
        let mut archive = tar::Archive::new(reader);
        for entry in archive
            .entries()
            .map_err(|err| format!("upload {hash}: {err}"))?
        {
            let mut entry = entry.map_err(|err| format!("upload {hash}: {err}"))?;
            let path = entry.path().map_err(|err| err.to_string())?.into_owned();
            if path.is_absolute()
                || path
                    .components()
                    .any(|c| c == std::path::Component::ParentDir)
            {
                return Err(format!(
                    "upload {hash}: entry {} leaves the context",
                    path.display()
                ));
            }
            let mut header = entry.header().clone();
            let name = FsPath::new(hash).join(&path);
            if header.entry_type().is_symlink() {
                let target = entry
                    .link_name()
                    .map_err(|err| err.to_string())?
                    .unwrap_or_default()
                    .into_owned();
                out.append_link(&mut header, &name, &target)
                    .map_err(|err| err.to_string())?;
            } else {
                out.append_data(&mut header, &name, &mut entry)
                    .map_err(|err| format!("upload {hash}: {}: {err}", path.display()))?;
            }
        }
    }
    let tar = out.into_inner().map_err(|err| err.to_string())?;
    zstd::encode_all(&tar[..], 3).map_err(|err| err.to_string())
}

/// How long a start command's ready command is tried, as E2B's builder does (every 2 s).
pub(crate) const READY_WITHIN: Duration = Duration::from_secs(600);
