//! `filesystem.Filesystem`: stat, list, make, move and remove as envd does them: with root's
//! privileges, relative paths in the home of the user the call names, the directories made
//! given to that user; by the scripts of [`crate::guest`]; watches in [`super::watch`].

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{awake_target, unary, Target};
use crate::errors::Failure;
use crate::{guest, E2b};

#[derive(Debug, Default, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Default, Deserialize)]
struct ListRequest {
    #[serde(default)]
    path: String,
    depth: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

/// `POST /filesystem.Filesystem/{method}`.
pub(super) async fn call(
    State(e): State<Arc<E2b>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if method == "WatchDir" {
        return super::watch::watch_dir(e, headers, body).await;
    }
    super::unary_answer(body, |bytes| async move {
        unary_call(&e, &headers, &method, &bytes).await
    })
    .await
}

async fn unary_call(
    e: &E2b,
    headers: &HeaderMap,
    method: &str,
    bytes: &[u8],
) -> Result<Value, Failure> {
    let t = awake_target(e, headers).await?;
    match method {
        "Stat" => {
            let r: PathRequest = unary(bytes)?;
            let out = script(e, &t, &guest::stat_script(), &[path(&r.path)?]).await?;
            Ok(json!({ "entry": one(&out, &r.path)? }))
        }
        "MakeDir" => {
            let r: PathRequest = unary(bytes)?;
            let out = script(e, &t, &guest::make_dir_script(), &[path(&r.path)?]).await?;
            Ok(json!({ "entry": one(&out, &r.path)? }))
        }
        "Move" => {
            let r: MoveRequest = unary(bytes)?;
            let (s, d) = (path(&r.source)?, path(&r.destination)?);
            let out = script(e, &t, &guest::move_script(), &[s, d]).await?;
            Ok(json!({ "entry": one(&out, &r.destination)? }))
        }
        "ListDir" => {
            let r: ListRequest = unary(bytes)?;
            let depth = r.depth.unwrap_or(1).max(1).to_string();
            let out = script(e, &t, &guest::list_script(), &[path(&r.path)?, &depth]).await?;
            // By path, as envd lists them (a directory's order is the file system's).
            let mut entries: Vec<Value> = entries(&out);
            entries.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
            Ok(json!({ "entries": entries }))
        }
        "Remove" => {
            let r: PathRequest = unary(bytes)?;
            script(e, &t, &guest::remove_script(), &[path(&r.path)?]).await?;
            Ok(json!({}))
        }
        "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
            super::watch::unary(e, &t, method, bytes).await
        }
        m => Err(Failure::new(
            501,
            format!("filesystem.Filesystem has no method {m}"),
        )),
    }
}

/// A path as given (relative ones are the user's home's), refused when empty or with NUL.
pub(super) fn path(p: &str) -> Result<&str, Failure> {
    if p.is_empty() || p.contains('\0') || p.len() > 4096 {
        return Err(Failure::new(
            400,
            "the path is empty, has a NUL byte, or is over 4096 bytes",
        ));
    }
    Ok(p)
}

/// Runs a file script as envd does its file calls: with root's privileges in the call's user's
/// home (relative paths are the home's), what it makes given to the user; its stdout, or its
/// failure in envd's terms.
pub(super) async fn script(
    e: &E2b,
    t: &Target,
    script: &str,
    args: &[&str],
) -> Result<String, Failure> {
    let r = e.exec(&t.id, guest::in_home(&t.user, script, args)).await?;
    let what = args.first().copied().unwrap_or("");
    match r.exit_code {
        0 => Ok(r.stdout),
        2 => Err(Failure::new(404, format!("path {what} not found"))),
        17 => Err(Failure::new(409, format!("path {what} already exists"))),
        20 => Err(Failure::new(400, format!("path {what} is not a directory"))),
        126 => Err(Failure::new(400, r.stderr.trim().to_string())),
        _ if r.stderr.contains("Permission denied") => Err(Failure::new(
            403,
            format!(
                "permission denied for user {}: {}",
                shown(&t.user),
                r.stderr.trim()
            ),
        )),
        // envd answers a full disk on these calls as an internal error (507 is /files' alone).
        _ if r.stderr.contains("No space left") => {
            Err(Failure::new(500, r.stderr.trim().to_string()))
        }
        n => Err(Failure::new(
            500,
            format!("{what}: {} ({n})", r.stderr.trim()),
        )),
    }
}

fn shown(user: &str) -> &str {
    if user.is_empty() {
        "(default)"
    } else {
        user
    }
}

fn one(out: &str, asked: &str) -> Result<Value, Failure> {
    entries(out)
        .into_iter()
        .next()
        .ok_or_else(|| Failure::new(500, format!("{asked}: the guest gave no entry")))
}

/// Entries as `find -printf` wrote them ([`guest::ENTRY_FORMAT`]), as envd's `EntryInfo`,
/// with the metadata the agent's helper wrote after them ([`guest::META_MARK`]).
pub(super) fn entries(out: &str) -> Vec<Value> {
    let (listed, meta) = match out.split_once(guest::META_MARK) {
        Some((l, m)) => (l, metadata(m)),
        None => (out, BTreeMap::new()),
    };
    listed
        .split('\0')
        .filter(|r| !r.is_empty())
        .filter_map(entry)
        .map(|mut v| {
            let m = v["path"].as_str().and_then(|p| meta.get(p));
            if let Some(m) = m {
                v["metadata"] = json!(m);
            }
            v
        })
        .collect()
}

/// What `xattrs get` wrote: a path, then key and value fields, an empty field after the last;
/// by path.
fn metadata(out: &str) -> BTreeMap<&str, BTreeMap<&str, &str>> {
    let mut all = BTreeMap::new();
    let mut fields = out.split('\0');
    while let Some(path) = fields.next().filter(|p| !p.is_empty()) {
        let mut pairs = BTreeMap::new();
        while let Some(k) = fields.next().filter(|k| !k.is_empty()) {
            pairs.insert(k, fields.next().unwrap_or(""));
        }
        all.insert(path, pairs);
    }
    all
}

fn entry(rec: &str) -> Option<Value> {
    let f: Vec<&str> = rec.splitn(10, '\t').collect();
    let [kind, target_kind, size, mode, perms, owner, group, mtime, link, path] = f[..] else {
        return None;
    };
    let kind_of = |k: &str| match k {
        "d" => "FILE_TYPE_DIRECTORY",
        _ => "FILE_TYPE_FILE",
    };
    let name = path.rsplit('/').next().unwrap_or(path);
    let secs: f64 = mtime.parse().unwrap_or(0.0);
    let modified = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(secs.max(0.0));
    let mut v = json!({
        "name": name,
        "type": if kind == "l" { kind_of(target_kind) } else { kind_of(kind) },
        "path": path,
        "size": size,
        "mode": u32::from_str_radix(mode, 8).unwrap_or(0),
        "permissions": perms,
        "owner": owner,
        "group": group,
        "modifiedTime": humantime::format_rfc3339_nanos(modified).to_string(),
    });
    if kind == "l" {
        v["symlinkTarget"] = json!(link_target(path, link));
    }
    Some(v)
}

/// A link's target as envd gives it: absolute, a relative one taken from the link's directory
/// (`.` and `..` folded).
fn link_target(path: &str, link: &str) -> String {
    let joined = match link.starts_with('/') {
        true => link.to_string(),
        false => format!("{}/{link}", path.rsplit_once('/').map_or("", |(d, _)| d)),
    };
    let mut parts: Vec<&str> = Vec::new();
    for p in joined.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The scripts run under this host's `sh` as in a guest and their entries read back.
    #[test]
    fn entries_are_read_from_what_find_prints() {
        let dir = std::env::temp_dir().join(format!("fbx-e2b-fs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink("a.txt", dir.join("link")).unwrap();
        let helper = format!(
            "#!/bin/sh\ncat > /dev/null; printf '%s\\0author\\0mish\\0k\\0v=w\\0\\0' '{}/a.txt'\n",
            dir.display()
        );
        let helper_file = dir.with_extension("helper");
        std::fs::write(&helper_file, helper).unwrap();
        std::fs::set_permissions(
            &helper_file,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let run = |script: String, args: &[&str]| {
            let out = std::process::Command::new("/bin/sh")
                // Never the host's PID 1: a helper that prints one path's metadata.
                .env("FORKBOX_XATTRS", &helper_file)
                .arg("-c")
                .arg(script)
                .arg("t")
                .args(args)
                .output()
                .unwrap();
            (
                out.status.code().unwrap(),
                String::from_utf8(out.stdout).unwrap(),
            )
        };
        let d = dir.to_str().unwrap();
        let (code, out) = run(guest::list_script(), &[d, "1"]);
        assert_eq!(code, 0);
        let mut es = entries(&out);
        es.sort_by_key(|v| v["name"].as_str().unwrap().to_string());
        assert_eq!(es.len(), 3);
        assert_eq!(es[0]["name"], "a.txt");
        assert_eq!(es[0]["size"], "5");
        assert_eq!(es[0]["type"], "FILE_TYPE_FILE");
        // The helper's metadata lands on its path's entry, and on no other.
        assert_eq!(es[0]["metadata"], json!({ "author": "mish", "k": "v=w" }));
        assert!(es[1].get("metadata").is_none());
        assert_eq!(es[1]["type"], "FILE_TYPE_FILE");
        // A link's target, resolved from its directory, as envd gives it.
        assert_eq!(es[1]["symlinkTarget"], format!("{d}/a.txt"));
        assert_eq!(es[2]["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(es[2]["path"], format!("{d}/sub"));
        assert_eq!(run(guest::stat_script(), &[&format!("{d}/nope")]).0, 2);
        assert_eq!(run(guest::make_dir_script(), &[&format!("{d}/sub")]).0, 17);
        let (code, out) = run(
            guest::move_script(),
            &[&format!("{d}/a.txt"), &format!("{d}/x/b.txt")],
        );
        assert_eq!(code, 0);
        assert_eq!(entries(&out)[0]["path"], format!("{d}/x/b.txt"));
        assert_eq!(run(guest::remove_script(), &[&format!("{d}/x/")]).0, 0);
        assert!(!dir.join("x").exists());
        assert_eq!(link_target("/home/user/d/l", "t.txt"), "/home/user/d/t.txt");
        assert_eq!(link_target("/home/user/d/l", "../e/./t"), "/home/user/e/t");
        assert_eq!(link_target("/home/user/l", "/etc/hosts"), "/etc/hosts");
        // Removing what is not there succeeds, as envd's does.
        assert_eq!(run(guest::remove_script(), &[&format!("{d}/x/")]).0, 0);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_file(&helper_file).unwrap();
    }
}
