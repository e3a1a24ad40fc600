//! E2B's volume content API (`/volumecontent/{volumeID}/…`: `Volume.read_file`, `write_file`,
//! `list`, `make_dir`, `get_info`, `exists`, `update_metadata`, `remove`), answered in a sandbox
//! that has the volume mounted ([`super::door`]). A call carries the volume's own token as its
//! bearer (what create and get give as `token`): a key of this daemon's, bound to the volume
//! and its birth, so a token outlives neither the volume nor a namesake made after it.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use super::door::{self, Access, Door};
use super::script::{self, ENTRY_FIELDS};
use crate::control::status;
use crate::errors::Failure;
use crate::{keys, E2b};

type Answer = Result<Response, Failure>;

pub(crate) fn router(state: Arc<E2b>) -> Router {
    Router::new()
        .route("/volumecontent/{id}/dir", get(list).post(make_dir))
        .route("/volumecontent/{id}/file", get(read).put(write))
        .route(
            "/volumecontent/{id}/path",
            get(stat).delete(remove).patch(patch),
        )
        // A file is written whole through the daemon, as envd's `/files` are (64 MiB).
        .layer(axum::extract::DefaultBodyLimit::max(
            forkbox_api::MAX_FILE_BYTES + (1 << 20),
        ))
        .with_state(state)
}

/// Volume `id`'s token: `volumeID` and its birth under this daemon's key.
pub(crate) fn token(key: &[u8; 32], id: &str, created_unix: u64) -> String {
    keys::access_token(key, &format!("volume-content/{id}/{created_unix}"))
}

#[derive(Debug, Deserialize)]
pub(crate) struct Asked {
    path: String,
    depth: Option<u32>,
    force: Option<bool>,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

/// The volume the call's token opens, checked.
async fn volume(e: &E2b, headers: &HeaderMap, id: &str) -> Result<(), Failure> {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| {
            Failure::new(
                401,
                "the volume's token is required as the bearer (`vol.token`)",
            )
        })?;
    let refused = || Failure::new(401, format!("the token is not volume {id}'s"));
    if !id.starts_with("e2b-") {
        return Err(refused());
    }
    let v = match e.daemon.get_volume(id).await {
        Ok(v) => v,
        Err(err) if err.status() == Some(404) => return Err(refused()),
        Err(err) => return Err(err.into()),
    };
    match keys::token_ok(
        &e.key,
        &format!("volume-content/{id}/{}", v.created_unix),
        bearer,
    ) {
        true => Ok(()),
        false => Err(refused()),
    }
}

/// A volume's path as E2B's API takes it: absolute (a relative one is the root's), slashes
/// folded, no trailing one; `.` and `..` folded, never above the root.
pub(crate) fn normal(p: &str) -> Result<String, Failure> {
    if p.contains('\0') || p.len() > 4096 {
        return Err(Failure::new(
            400,
            "the path has a NUL byte or is over 4096 bytes",
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." if parts.pop().is_none() => {
                return Err(Failure::new(
                    400,
                    format!("path {p:?} leads out of the volume"),
                ));
            }
            ".." => {}
            c => parts.push(c),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Runs `op` on `path` through `door`; its stdout, or the failure its exit code says.
async fn run(e: &E2b, door: &Door, op: &str, path: &str, args: &[&str]) -> Result<String, Failure> {
    let r = e
        .exec(&door.sandbox, script::argv(op, &door.root, path, args))
        .await?;
    match r.exit_code {
        0 => Ok(r.stdout),
        2 => Err(Failure::new(404, format!("Path {path} not found"))),
        17 => Err(Failure::new(409, format!("Path {path} already exists"))),
        20 => Err(Failure::new(
            409,
            format!("a parent of {path} is not a directory"),
        )),
        21 => Err(Failure::new(409, format!("Path {path} is a directory"))),
        22 => Err(Failure::new(
            400,
            format!("path {path} leads out of the volume"),
        )),
        n => Err(Failure::new(
            500,
            format!("{op} {path}: {} ({n})", r.stderr.trim()),
        )),
    }
}

/// Entries as [`script::ENTRY_FORMAT`] wrote them, as E2B's `VolumeEntryStat`; each one's
/// path is `base` joined with what find printed (nothing: `base` itself).
pub(crate) fn entries(out: &str, base: &str) -> Vec<Value> {
    let fields: Vec<&str> = out.split('\0').collect();
    fields
        .chunks_exact(ENTRY_FIELDS)
        .map(|f| {
            let path = match f[9] {
                "" => base.to_string(),
                rel => format!("{}/{rel}", base.trim_end_matches('/')),
            };
            let name = path.rsplit('/').next().unwrap_or("").to_string();
            let time = |s: &str| {
                let secs: f64 = s.parse().unwrap_or(0.0);
                let t = UNIX_EPOCH + Duration::from_secs_f64(secs.max(0.0));
                humantime::format_rfc3339_millis(t).to_string()
            };
            let num = |s: &str| s.parse::<u64>().unwrap_or(0);
            let mut v = json!({
                "name": name,
                "type": match f[0] { "f" => "file", "d" => "directory", "l" => "symlink", _ => "unknown" },
                "path": path,
                "size": num(f[1]),
                "mode": u32::from_str_radix(f[2], 8).unwrap_or(0),
                "uid": num(f[3]),
                "gid": num(f[4]),
                "atime": time(f[5]),
                "ctime": time(f[6]),
                "mtime": time(f[7]),
            });
            if f[0] == "l" {
                v["target"] = json!(f[8]);
            }
            v
        })
        .collect()
}

fn one(out: &str, path: &str) -> Result<Value, Failure> {
    entries(out, path)
        .into_iter()
        .next()
        .ok_or_else(|| Failure::new(500, format!("{path}: the sandbox gave no entry")))
}

/// The call's volume checked and its sandbox opened; the asked path, normalised.
async fn open(
    e: &E2b,
    headers: &HeaderMap,
    id: &str,
    q: &Asked,
    access: Access,
) -> Result<(Door, String), Failure> {
    volume(e, headers, id).await?;
    let path = normal(&q.path)?;
    Ok((door::open(e, id, access).await?, path))
}

fn opt(n: Option<u32>) -> String {
    n.map(|n| n.to_string()).unwrap_or_default()
}

fn octal(n: Option<u32>) -> String {
    n.map(|n| format!("{:o}", n & 0o7777)).unwrap_or_default()
}

async fn list(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Asked>,
) -> Answer {
    let (door, path) = open(&e, &headers, &id, &q, Access::Read).await?;
    let depth = q.depth.unwrap_or(1).clamp(1, 64).to_string();
    let out = run(&e, &door, "list", &path, &[&depth])
        .await
        .map_err(|f| match f.status {
            409 => Failure::new(404, format!("Path {path} is not a directory")),
            _ => f,
        })?;
    Ok(status(StatusCode::OK, Value::Array(entries(&out, &path))))
}

async fn make_dir(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Asked>,
) -> Answer {
    let (door, path) = open(&e, &headers, &id, &q, Access::Write).await?;
    let force = q.force.unwrap_or(false).to_string();
    let args = [force.as_str(), &opt(q.uid), &opt(q.gid), &octal(q.mode)];
    let out = run(&e, &door, "mkdir", &path, &args).await?;
    Ok(status(StatusCode::CREATED, one(&out, &path)?))
}

async fn stat(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Asked>,
) -> Answer {
    let (door, path) = open(&e, &headers, &id, &q, Access::Read).await?;
    let out = run(&e, &door, "stat", &path, &[]).await?;
    Ok(status(StatusCode::OK, one(&out, &path)?))
}

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

async fn patch(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Asked>,
    body: Bytes,
) -> Answer {
    let m: Metadata = crate::control::body(&body)?;
    let (door, path) = open(&e, &headers, &id, &q, Access::Write).await?;
    let args = [opt(m.uid), opt(m.gid), octal(m.mode)];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&e, &door, "patch", &path, &args).await?;
    Ok(status(StatusCode::OK, one(&out, &path)?))
}

async fn remove(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Asked>,
) -> Answer {
    let (door, path) = open(&e, &headers, &id, &q, Access::Write).await?;
    run(&e, &door, "remove", &path, &[]).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn read(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Asked>,
) -> Answer {
    let (door, path) = open(&e, &headers, &id, &q, Access::Read).await?;
    run(&e, &door, "read", &path, &[])
        .await
        .map_err(|f| match f.status {
            409 => Failure::new(404, format!("Path {path} not found")),
            _ => f,
        })?;
    let guest = format!("{}{path}", door.root);
    let data = e.daemon.read_file(&door.sandbox, &guest).await?;
    Ok((
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        data,
    )
        .into_response())
}

async fn write(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Asked>,
    body: Bytes,
) -> Answer {
    let (door, path) = open(&e, &headers, &id, &q, Access::Write).await?;
    if path == "/" {
        return Err(Failure::new(409, "Path / is a directory"));
    }
    let force = q.force.unwrap_or(false).to_string();
    run(&e, &door, "write", &path, &[&force]).await?;
    let guest = format!("{}{path}", door.root);
    let mode = q.mode.map_or(0o644, |m| m & 0o7777);
    e.daemon
        .write_file(&door.sandbox, &guest, body.to_vec(), mode)
        .await?;
    let args = [opt(q.uid), opt(q.gid), octal(Some(mode))];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&e, &door, "written", &path, &args).await?;
    Ok(status(StatusCode::CREATED, one(&out, &path)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_folded_and_kept_in_the_volume() {
        assert_eq!(normal("").unwrap(), "/");
        assert_eq!(normal("a//b/").unwrap(), "/a/b");
        assert_eq!(normal("/a/./b/../c").unwrap(), "/a/c");
        assert!(normal("/../etc/passwd").is_err());
        assert!(normal("/a/../../b").is_err());
        assert!(normal("/a\0b").is_err());
    }

    #[test]
    fn entries_are_read_from_what_find_prints() {
        let out = "f\x0013\x00644\x001000\x001000\x001700000000.5\x001700000000\x001700000001\x00\x00\x00\
                   l\x000\x00777\x000\x000\x001\x001\x001\x00../x\x00sub/ln\x00";
        let v = entries(out, "/dir");
        assert_eq!(v.len(), 2);
        assert_eq!(v[0]["path"], "/dir");
        assert_eq!(v[0]["name"], "dir");
        assert_eq!(v[0]["type"], "file");
        assert_eq!(v[0]["mode"], 0o644);
        assert_eq!(v[0]["uid"], 1000);
        assert_eq!(v[0]["atime"], "2023-11-14T22:13:20.500Z");
        assert_eq!(v[1]["path"], "/dir/sub/ln");
        assert_eq!(v[1]["type"], "symlink");
        assert_eq!(v[1]["target"], "../x");
    }
}
