//! E2B's secrets (`/secrets`: `Secret.create`, `update`, `get_info`, `list`, `exists`,
//! `destroy`): each key's own, by id (`sec_…`) or name. A value is write-only: no answer holds
//! it, and it leaves the daemon only at egress, put by the host into the requests a sandbox's
//! network rule names (`Secret.fill(name)`, `${e2b.secrets.NAME}`, in a rule's headers; see
//! [`resolve`]), never into a guest.
//!
//! They are kept in `e2b-secrets.json` in forkbox's home (mode 0600), each value sealed with
//! AES-256-GCM under a key derived from this daemon's E2B key (`e2b.key`, 0600): no value is
//! written in clear to any file. That keeps values out of copies of the state file and of
//! anything a sandbox writes; root on the host, who can read the key, can read them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::control::{body, caller, status};
use crate::errors::Failure;
use crate::{keys, E2b};

type Answer = Result<Response, Failure>;

/// Longest value (E2B's placeholders go into headers).
const MAX_VALUE: usize = forkbox_api::MAX_SECRET_LEN;
/// Most secrets one key may keep.
const MAX_PER_KEY: usize = 1000;

/// One secret as kept: its metadata and its sealed value.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Kept {
    id: String,
    name: String,
    version: u64,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    created: String,
    updated: String,
    /// base64 of the nonce and the AES-256-GCM ciphertext of the value.
    sealed: String,
}

/// Every key's secrets (by owner), kept in their file.
pub(crate) struct Secrets {
    file: PathBuf,
    key: LessSafeKey,
    all: Mutex<BTreeMap<String, Vec<Kept>>>,
}

impl Secrets {
    /// The secrets kept in `file`, sealed under a key derived from `daemon_key`.
    pub(crate) fn load(file: PathBuf, daemon_key: &[u8; 32]) -> Secrets {
        #[allow(clippy::expect_used)]
        let mut m = Hmac::<Sha256>::new_from_slice(daemon_key).expect("HMAC takes any key");
        m.update(b"e2b-secrets-at-rest");
        let raw = m.finalize().into_bytes();
        #[allow(clippy::expect_used)]
        let key = LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &raw).expect("a 32-byte key is AES-256's"),
        );
        let all = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Secrets {
            file,
            key,
            all: Mutex::new(all),
        }
    }

    fn seal(&self, id: &str, value: &str) -> Result<String, Failure> {
        let mut nonce = [0u8; NONCE_LEN];
        keys::random_bytes(&mut nonce)
            .map_err(|e| Failure::new(500, format!("draw a nonce: {e}")))?;
        let mut data = value.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(id.as_bytes()),
                &mut data,
            )
            .map_err(|_| Failure::new(500, "sealing a secret failed"))?;
        let mut out = nonce.to_vec();
        out.extend(data);
        Ok(base64::engine::general_purpose::STANDARD.encode(out))
    }

    fn open(&self, k: &Kept) -> Option<String> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&k.sealed)
            .ok()?;
        let (nonce, data) = raw.split_at_checked(NONCE_LEN)?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut data = data.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(k.id.as_bytes()), &mut data)
            .ok()?;
        String::from_utf8(plain.to_vec()).ok()
    }

    /// Runs `f` on `owner`'s secrets and writes them all if it succeeds.
    fn change<T>(
        &self,
        owner: &str,
        f: impl FnOnce(&mut Vec<Kept>) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let mut all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        let mut mine = all.get(owner).cloned().unwrap_or_default();
        let out = f(&mut mine)?;
        let mut next = all.clone();
        next.insert(owner.to_string(), mine);
        let json = serde_json::to_vec(&next)
            .map_err(|e| Failure::new(500, format!("encode the secrets: {e}")))?;
        write_private(&self.file, &json)
            .map_err(|e| Failure::new(500, format!("keep the secrets: {e}")))?;
        *all = next;
        Ok(out)
    }

    fn mine(&self, owner: &str) -> Vec<Kept> {
        let all = self.all.lock().unwrap_or_else(|p| p.into_inner());
        all.get(owner).cloned().unwrap_or_default()
    }

    /// `owner`'s secret `name`'s value.
    pub(crate) fn value(&self, owner: &str, name: &str) -> Option<String> {
        let k = self.mine(owner).into_iter().find(|k| k.name == name)?;
        self.open(&k)
    }
}

/// Writes `bytes` to `file` whole (a temporary file renamed), readable by root alone.
fn write_private(file: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = file.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)
}

pub(crate) fn router(state: Arc<E2b>) -> Router {
    Router::new()
        .route("/secrets", post(create).get(list))
        .route("/secrets/{id}", get(info).post(update).delete(destroy))
        .with_state(state)
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

fn shown(k: &Kept) -> Value {
    json!({
        "secretID": k.id,
        "name": k.name,
        "currentVersion": k.version,
        "metadata": k.metadata,
        "createdAt": k.created,
        "updatedAt": k.updated,
    })
}

fn not_found(id: &str) -> Failure {
    Failure::new(404, format!("secret {id} not found"))
}

/// A name as E2B's SDKs check it (it goes into `${e2b.secrets.NAME}`), kept lowercase.
fn checked_name(name: &str) -> Result<String, Failure> {
    let bad = name.is_empty()
        || name.len() > 256
        || name.chars().any(|c| c == '{' || c == '}' || c.is_control());
    if bad {
        return Err(Failure::new(
            400,
            format!("secret name {name:?}: 1-256 characters, no '{{', '}}' nor control characters"),
        ));
    }
    Ok(name.to_lowercase())
}

fn checked_value(value: &str) -> Result<(), Failure> {
    if value.is_empty() || value.len() > MAX_VALUE || value.chars().any(|c| c.is_control()) {
        return Err(Failure::new(
            400,
            "a secret's value: 1 byte to 16 KiB, no line breaks nor control characters (it goes \
             into a header)",
        ));
    }
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
struct NewSecret {
    name: String,
    value: String,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

async fn create(State(e): State<Arc<E2b>>, headers: HeaderMap, bytes: bytes::Bytes) -> Answer {
    let c = caller(&e, &headers)?;
    let n: NewSecret = body(&bytes)?;
    let name = checked_name(&n.name)?;
    checked_value(&n.value)?;
    let id = format!(
        "sec_{}",
        keys::random_hex(16).map_err(|e| Failure::new(500, e.to_string()))?
    );
    let sealed = e.secrets.seal(&id, &n.value)?;
    let k = e.secrets.change(&c.owner, |mine| {
        if mine.iter().any(|k| k.name == name) {
            return Err(Failure::new(409, format!("secret {name} already exists")));
        }
        if mine.len() >= MAX_PER_KEY {
            return Err(Failure::new(
                429,
                format!("a key keeps at most {MAX_PER_KEY} secrets"),
            ));
        }
        let at = now();
        let k = Kept {
            id,
            name,
            version: 1,
            metadata: n.metadata.unwrap_or_default(),
            created: at.clone(),
            updated: at,
            sealed,
        };
        mine.push(k.clone());
        Ok(k)
    })?;
    Ok(status(StatusCode::CREATED, shown(&k)))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    limit: Option<usize>,
    next_token: Option<String>,
}

async fn list(State(e): State<Arc<E2b>>, headers: HeaderMap, Query(p): Query<Page>) -> Answer {
    let c = caller(&e, &headers)?;
    let mine = e.secrets.mine(&c.owner);
    let start: usize = match p.next_token.as_deref() {
        None | Some("") => 0,
        Some(t) => t
            .parse()
            .map_err(|_| Failure::new(400, format!("nextToken {t:?} is not one this API gave")))?,
    };
    let limit = p.limit.unwrap_or(100).clamp(1, 100);
    let page: Vec<Value> = mine.iter().skip(start).take(limit).map(shown).collect();
    let mut r = status(StatusCode::OK, Value::Array(page));
    if start + limit < mine.len() {
        if let Ok(v) = axum::http::HeaderValue::from_str(&(start + limit).to_string()) {
            r.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(r)
}

fn find<'a>(mine: &'a [Kept], sel: &str) -> Option<&'a Kept> {
    mine.iter()
        .find(|k| k.id == sel)
        .or_else(|| mine.iter().find(|k| k.name == sel.to_lowercase()))
}

async fn info(State(e): State<Arc<E2b>>, headers: HeaderMap, Path(id): Path<String>) -> Answer {
    let c = caller(&e, &headers)?;
    let mine = e.secrets.mine(&c.owner);
    let k = find(&mine, &id).ok_or_else(|| not_found(&id))?;
    Ok(status(StatusCode::OK, shown(k)))
}

#[derive(Debug, Default, Deserialize)]
struct Update {
    value: String,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

async fn update(
    State(e): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: bytes::Bytes,
) -> Answer {
    let c = caller(&e, &headers)?;
    let u: Update = body(&bytes)?;
    checked_value(&u.value)?;
    let k = e.secrets.change(&c.owner, |mine| {
        let at = find(mine, &id)
            .map(|k| k.id.clone())
            .ok_or_else(|| not_found(&id))?;
        let sealed = e.secrets.seal(&at, &u.value)?;
        let k = mine
            .iter_mut()
            .find(|k| k.id == at)
            .ok_or_else(|| not_found(&id))?;
        k.sealed = sealed;
        k.version += 1;
        if let Some(m) = u.metadata {
            k.metadata = m;
        }
        k.updated = now();
        Ok(k.clone())
    })?;
    Ok(status(StatusCode::OK, shown(&k)))
}

async fn destroy(State(e): State<Arc<E2b>>, headers: HeaderMap, Path(id): Path<String>) -> Answer {
    let c = caller(&e, &headers)?;
    e.secrets.change(&c.owner, |mine| {
        let at = find(mine, &id)
            .map(|k| k.id.clone())
            .ok_or_else(|| not_found(&id))?;
        mine.retain(|k| k.id != at);
        Ok(())
    })?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `text` with each placeholder of `owner`'s secrets (`${e2b.secrets.NAME}`) replaced by its
/// value, in one pass (a value is never read for placeholders); a name the owner has no
/// secret of is refused.
pub(crate) fn resolve(e: &E2b, owner: &str, text: &str) -> Result<String, Failure> {
    const OPEN: &str = "${e2b.secrets.";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        let after = &rest[at + OPEN.len()..];
        let Some(end) = after.find('}') else { break };
        let name = &after[..end];
        let value = e
            .secrets
            .value(owner, &name.to_lowercase())
            .ok_or_else(|| {
                Failure::new(
                    400,
                    format!("network rule: no secret named {name:?} (make it with Secret.create)"),
                )
            })?;
        out.push_str(&rest[..at]);
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
