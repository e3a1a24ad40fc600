//! envd's `/files`: `GET` reads one file, `POST` writes one or more (multipart, a part per
//! file named by its path, or one octet-stream body, gzip or not), through the daemon's file
//! calls, with root's privileges as envd has; a new file and the directories made for it then
//! belong to the call's user. A relative path is the user's home's.
//! Pre-signed URLs (`signature`, `signature_expiration`) stand in for the access token.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest as _, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use forkbox_api::Code;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{target, Target};
use crate::errors::Failure;
use crate::{guest, keys, E2b};

#[derive(Debug, Default, Deserialize)]
pub(super) struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<u64>,
}

/// The call's sandbox and user: by access token, or by a pre-signed URL's signature. A signed
/// URL made in URL mode names no sandbox (the SDK's sandbox URL is the daemon's): the sandbox
/// is the one whose access token the signature was made with.
async fn caller(e: &E2b, headers: &HeaderMap, q: &FilesQuery, op: &str) -> Result<Target, Failure> {
    let user = q.username.as_deref().unwrap_or("");
    let Some(sig) = &q.signature else {
        return target(e, headers, Some(user));
    };
    let path = q.path.as_deref().unwrap_or("");
    let signed_by = |id: &str| {
        let token = keys::access_token(&e.key, id);
        signature_ok(sig, path, op, user, &token, q.signature_expiration).then_some(token)
    };
    let named = headers
        .get(crate::SANDBOX_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty())
        .map(str::to_string);
    let found = match named {
        Some(id) => signed_by(&id).map(|token| (id, token)),
        None => e
            .daemon
            .list(None, None)
            .await
            .map_err(Failure::from)?
            .into_iter()
            .find_map(|v| signed_by(&v.info.id).map(|token| (v.info.id, token))),
    };
    let Some((id, token)) = found else {
        return Err(Failure::new(
            401,
            "the URL's signature is not valid for this file, operation and user",
        ));
    };
    if let Some(exp) = q.signature_expiration {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(u64::MAX);
        if now > exp {
            // envd's words.
            return Err(Failure::new(401, "signature is already expired"));
        }
    }
    let mut h = with_token(headers, &token);
    if let Ok(v) = id.parse() {
        h.insert(crate::SANDBOX_ID_HEADER, v);
    }
    target(e, &h, Some(user))
}

fn with_token(headers: &HeaderMap, token: &str) -> HeaderMap {
    let mut h = headers.clone();
    if let Ok(v) = token.parse() {
        h.insert(crate::ACCESS_TOKEN_HEADER, v);
    }
    h
}

/// E2B's v1 signature: `v1_` and the unpadded base64 of SHA-256 over
/// `path:operation:user:token[:expiration]`.
fn signature_ok(
    sig: &str,
    path: &str,
    op: &str,
    user: &str,
    token: &str,
    exp: Option<u64>,
) -> bool {
    let text = match exp {
        Some(x) => format!("{path}:{op}:{user}:{token}:{x}"),
        None => format!("{path}:{op}:{user}:{token}"),
    };
    use base64::Engine as _;
    let want = format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(text.as_bytes()))
    );
    subtle::ConstantTimeEq::ct_eq(want.as_bytes(), sig.as_bytes()).into()
}

/// The user a call runs as (the default one named) and that user's home.
async fn home(e: &E2b, t: &Target) -> Result<(String, String), Failure> {
    let key = (t.id.clone(), t.user.clone());
    if let Some(h) = e.homes.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(h.clone());
    }
    let r = e.exec(&t.id, guest::home(&t.user)).await?;
    let line = r.stdout.trim();
    let Some((u, h)) = line.split_once(':').filter(|_| r.exit_code == 0) else {
        return Err(Failure::new(
            400,
            format!("user {:?} does not exist in sandbox {}", t.user, t.id),
        ));
    };
    let found = (u.to_string(), h.to_string());
    e.homes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, found.clone());
    Ok(found)
}

/// `p` made absolute: a relative path is in the user's home (`~/` too).
fn absolute(p: &str, home: &str) -> String {
    let p = p.strip_prefix("~/").unwrap_or(p);
    if p.starts_with('/') {
        p.to_string()
    } else if p == "~" {
        home.to_string()
    } else {
        format!("{}/{p}", home.trim_end_matches('/'))
    }
}

/// envd's error body on `/files`: `{"code", "message"}` with the status.
fn refusal(f: Failure) -> Response {
    let status = match f.code {
        Some(Code::DiskFull) | Some(Code::HostDiskFull) => 507,
        _ => f.status,
    };
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(json!({ "code": status, "message": f.message })),
    )
        .into_response()
}

/// `GET /files?path=&username=`.
pub(super) async fn read(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Query(q): Query<FilesQuery>,
) -> Response {
    match read_one(&e, &headers, &q).await {
        Ok(data) => ([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response(),
        Err(f) => refusal(f),
    }
}

async fn read_one(e: &E2b, headers: &HeaderMap, q: &FilesQuery) -> Result<Bytes, Failure> {
    let t = caller(e, headers, q, "read").await?;
    e.awake(&t.id).await?;
    let asked = q
        .path
        .as_deref()
        .ok_or_else(|| Failure::new(400, "the path query parameter is missing"))?;
    let (_, home) = home(e, &t).await?;
    let path = absolute(super::filesystem::path(asked)?, &home);
    match e.daemon.read_file(&t.id, &path).await {
        Ok(b) => Ok(b),
        Err(err) if err.status() == Some(404) => {
            Err(Failure::new(404, format!("file {path} was not found")))
        }
        Err(err) => Err(err.into()),
    }
}

/// `POST /files?path=&username=`.
pub(super) async fn write(
    State(e): State<Arc<E2b>>,
    Query(q): Query<FilesQuery>,
    req: Request,
) -> Response {
    match write_all(&e, &q, req).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(f) => refusal(f),
    }
}

async fn write_all(e: &E2b, q: &FilesQuery, req: Request) -> Result<Value, Failure> {
    let headers = req.headers().clone();
    let t = caller(e, &headers, q, "write").await?;
    // Refused before anything is written.
    let meta = metadata(&headers)?;
    e.awake(&t.id).await?;
    let (user, home) = home(e, &t).await?;
    let files = bodies(q, req).await?;
    if files.is_empty() {
        return Err(Failure::new(400, "the request carried no file"));
    }
    let mut paths = Vec::new();
    for (path, _) in &files {
        paths.push(absolute(super::filesystem::path(path)?, &home));
    }
    // As envd: the directories made (and given to the user), then the files written as root
    // and the new ones given to the user.
    let fresh: Vec<bool> = match user.as_str() {
        "root" => vec![false; paths.len()],
        _ => {
            let mut argv = vec![
                "/bin/sh".to_string(),
                "-c".into(),
                guest::PREPARE_WRITE_SCRIPT.into(),
                "e2b".into(),
                user.clone(),
            ];
            argv.extend(paths.iter().cloned());
            let out = e.run_root(&t.id, argv).await?;
            out.lines().map(|l| l == "new").collect()
        }
    };
    for ((_, data), path) in files.into_iter().zip(&paths) {
        e.daemon.write_file(&t.id, path, data, 0o644).await?;
    }
    let made: Vec<String> = paths
        .iter()
        .zip(fresh.iter().chain(std::iter::repeat(&false)))
        .filter(|(_, new)| **new)
        .map(|(p, _)| p.clone())
        .collect();
    if !made.is_empty() {
        let mut argv = vec![
            "/bin/sh".to_string(),
            "-c".into(),
            guest::CHOWN_SCRIPT.into(),
            "e2b".into(),
            user.clone(),
        ];
        argv.extend(made);
        e.run_root(&t.id, argv).await?;
    }
    // A file written whole lost its metadata (the agent's write); the request's is set.
    if !meta.is_empty() {
        let mut argv = vec![
            guest::XATTRS_HELPER.to_string(),
            "xattrs".into(),
            "set".into(),
        ];
        argv.extend(meta.iter().map(|(k, v)| format!("{k}={v}")));
        argv.push("--".into());
        argv.extend(paths.iter().cloned());
        e.run_root(&t.id, argv).await.map_err(|f| {
            Failure::new(
                400,
                format!("the files' metadata could not be kept: {}", f.message),
            )
        })?;
    }
    Ok(Value::Array(
        paths
            .iter()
            .map(|p| {
                let name = p.rsplit('/').next().unwrap_or(p);
                let mut v = json!({ "name": name, "type": "file", "path": p });
                if !meta.is_empty() {
                    v["metadata"] = json!(meta);
                }
                v
            })
            .collect(),
    ))
}

/// The metadata a write carries in `X-Metadata-KEY: VALUE` headers (keys lowercased, as envd
/// keeps them), refused as envd refuses it: keys of HTTP token characters, values of
/// printable US-ASCII.
fn metadata(headers: &HeaderMap) -> Result<BTreeMap<String, String>, Failure> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else {
            continue;
        };
        let value = value
            .to_str()
            .ok()
            .filter(|v| v.bytes().all(|b| (0x20..=0x7e).contains(&b)))
            .ok_or_else(|| {
                Failure::new(
                    400,
                    format!("metadata {key:?}: values are printable US-ASCII"),
                )
            })?;
        if key.is_empty() {
            return Err(Failure::new(400, "a metadata key is empty"));
        }
        out.insert(key.to_string(), value.to_string());
    }
    Ok(out)
}

/// The files a write carries: (path, bytes) each.
async fn bodies(q: &FilesQuery, req: Request) -> Result<Vec<(String, Vec<u8>)>, Failure> {
    let kind = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let gzip = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    if kind.starts_with("multipart/form-data") {
        let mut m = axum::extract::Multipart::from_request(req, &())
            .await
            .map_err(|err| Failure::new(400, format!("the multipart body: {err}")))?;
        let mut out = Vec::new();
        while let Some(field) = m
            .next_field()
            .await
            .map_err(|err| Failure::new(400, format!("the multipart body: {err}")))?
        {
            let name = field.file_name().map(str::to_string);
            let data = field
                .bytes()
                .await
                .map_err(|err| Failure::new(400, format!("a file of the multipart body: {err}")))?;
            let path = match (&q.path, name) {
                (Some(p), _) => p.clone(),
                (None, Some(n)) => n,
                (None, None) => {
                    return Err(Failure::new(
                        400,
                        "a file part names no path (give ?path= or a filename)",
                    ))
                }
            };
            out.push((path, maybe_gunzip(data.to_vec(), gzip)?));
        }
        return Ok(out);
    }
    let path = q
        .path
        .clone()
        .ok_or_else(|| Failure::new(400, "an octet-stream upload needs ?path="))?;
    let data = axum::body::to_bytes(req.into_body(), forkbox_api::MAX_FILE_BYTES)
        .await
        .map_err(|err| {
            Failure::new(
                413,
                format!(
                    "the file: {err} (one write carries at most {} MiB)",
                    forkbox_api::MAX_FILE_BYTES >> 20
                ),
            )
        })?;
    Ok(vec![(path, maybe_gunzip(data.to_vec(), gzip)?)])
}

fn maybe_gunzip(data: Vec<u8>, gzip: bool) -> Result<Vec<u8>, Failure> {
    if !gzip {
        return Ok(data);
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data.as_slice())
        .take(forkbox_api::MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|err| Failure::new(400, format!("the gzip body: {err}")))?;
    if out.len() > forkbox_api::MAX_FILE_BYTES {
        return Err(Failure::new(413, "the file is over 64 MiB unpacked"));
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_signatures() {
        assert_eq!(absolute("a.txt", "/home/user"), "/home/user/a.txt");
        assert_eq!(absolute("~/a", "/home/user/"), "/home/user/a");
        assert_eq!(absolute("/etc/x", "/root"), "/etc/x");
        use base64::Engine as _;
        let sig = format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD
                .encode(Sha256::digest(b"/a:read:user:tok:99"))
        );
        assert!(signature_ok(&sig, "/a", "read", "user", "tok", Some(99)));
        assert!(!signature_ok(&sig, "/a", "write", "user", "tok", Some(99)));
        assert!(!signature_ok(&sig, "/a", "read", "user", "tok", None));
    }
}
