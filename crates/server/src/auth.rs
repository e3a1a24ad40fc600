//! Bearer tokens for the TCP listener. The Unix socket needs none: its mode (0600) is the check.
//!
//! Only a token's SHA-256 is stored (the `tokens` table of the daemon's `state.db`, mode 0600);
//! a request's token is hashed and compared with every stored hash in constant time. Tokens a
//! forkbox kept in `tokens.json` before are imported once.

use std::path::PathBuf;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use forkbox_engine::api::Code;
use forkbox_engine::paths::Paths;
use forkbox_engine::state::StateDb;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenRecord {
    pub name: String,
    pub sha256: String,
    pub created_unix: u64,
}

/// Where tokens were kept before `state.db`.
pub fn legacy_tokens_path(paths: &Paths) -> PathBuf {
    paths.home().join("tokens.json")
}

/// The state database, with any `tokens.json` of an earlier forkbox imported.
fn open(paths: &Paths) -> std::io::Result<StateDb> {
    std::fs::create_dir_all(paths.home())?;
    let db = StateDb::open(&paths.home().join("state.db")).map_err(std::io::Error::other)?;
    let legacy = legacy_tokens_path(paths);
    if let Ok(bytes) = std::fs::read(&legacy) {
        let old: Vec<TokenRecord> = serde_json::from_slice(&bytes).unwrap_or_default();
        for t in old {
            db.add_token(&t.name, &t.sha256, t.created_unix)
                .map_err(std::io::Error::other)?;
        }
        std::fs::rename(&legacy, legacy.with_extension("json.imported"))?;
    }
    Ok(db)
}

pub(crate) fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A token's SHA-256 as stored (hex).
pub fn hash_hex(token: &str) -> String {
    forkbox_engine::random::to_hex(&digest(token))
}

/// A new token: `fbx_` and 64 hex digits, or with `e2b` in the shape of an E2B API key
/// (`e2b_` and hex, which E2B's SDKs before 2.32 check for).
pub fn new_token(e2b: bool) -> std::io::Result<String> {
    let prefix = if e2b { "e2b" } else { "fbx" };
    Ok(format!("{prefix}_{}", forkbox_engine::random::hex(32)?))
}

/// Makes a new token ([`new_token`]), stores its hash, and returns the token (shown once).
pub fn create(paths: &Paths, name: &str, e2b: bool) -> std::io::Result<String> {
    let token = new_token(e2b)?;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    open(paths)?
        .add_token(
            name,
            &forkbox_engine::random::to_hex(&digest(&token)),
            created,
        )
        .map_err(std::io::Error::other)?;
    Ok(token)
}

/// Whether `token` is one of the stored ones. Every stored hash is compared, in constant time.
pub fn valid(paths: &Paths, token: &str) -> bool {
    let d = forkbox_engine::random::to_hex(&digest(token));
    let Ok(hashes) = open(paths).and_then(|db| db.token_hashes().map_err(std::io::Error::other))
    else {
        return false;
    };
    hashes
        .iter()
        .fold(subtle::Choice::from(0), |acc, h| {
            acc | h.as_bytes().ct_eq(d.as_bytes())
        })
        .into()
}

/// What the TCP listener checks callers against.
#[derive(Clone)]
pub struct Gate {
    pub paths: Paths,
    /// In a cluster: peers' signatures and the cluster's tokens count too.
    pub node: Option<std::sync::Arc<crate::cluster::Node>>,
}

/// Refuses requests without a valid `Authorization: Bearer` token (in a cluster: one of the
/// cluster's, or a peer node's signature instead).
pub async fn require_token(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    if let Some(node) = &gate.node {
        if req.headers().contains_key(forkbox_cluster::auth::HEADER) {
            return match crate::cluster::verify_peer(node, &req) {
                Ok(()) => next.run(req).await,
                Err(e) => crate::refusal(Code::Unauthorized, e),
            };
        }
    }
    let paths = &gate.paths;
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let ok = match (token, &gate.node) {
        (Some(t), _) if valid(paths, t) => true,
        (Some(t), Some(node)) => node.token_valid(&digest(t)).await,
        _ => false,
    };
    match ok {
        true => next.run(req).await,
        false => {
            let mut r = crate::refusal(
                Code::Unauthorized,
                "a valid bearer token is required; create one with `forkbox token create`",
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            r
        }
    }
}

/// Whether a `Host` header names this daemon: an IP literal, `localhost`, or a name listed
/// in `FORKBOX_ALLOWED_HOSTS` (comma-separated). Anything else is a name some other party
/// controls pointing at this daemon: a DNS-rebinding page in a browser, say.
pub fn host_allowed(host: &str, allowed: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => {
            return rest
                .split(']')
                .next()
                .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name == "localhost"
        || allowed
            .split(',')
            .map(|a| a.trim().trim_end_matches('.').to_ascii_lowercase())
            .any(|a| !a.is_empty() && a == name)
}

/// Refuses what only a web browser sends on the TCP listener: a request with an `Origin`
/// (no CORS grant is ever made, so a page may not read or drive the API), or with a `Host`
/// that is not this daemon's (DNS rebinding; see [`host_allowed`]).
pub async fn refuse_browsers(req: Request, next: Next) -> Response {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes());
        return crate::refusal(
            Code::PermissionDenied,
            format!(
                "requests from web pages are refused (this one came from {}); forkbox's API is for programs, which send no Origin",
                forkbox_engine::guestlog::quote(&origin)
            ),
        );
    }
    if let Some(refused) = misdirected(&req) {
        return refused;
    }
    next.run(req).await
}

/// The refusal of a request whose `Host` is not this daemon's (see [`host_allowed`]).
pub fn misdirected(req: &Request) -> Option<Response> {
    let host = req
        .headers()
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .unwrap_or_default();
    let allowed = std::env::var("FORKBOX_ALLOWED_HOSTS").unwrap_or_default();
    (!host.is_empty() && !host_allowed(&host, &allowed)).then(|| {
        crate::refusal(
            Code::MisdirectedRequest,
            format!(
                "Host {} is not a name of this daemon; use its IP address or localhost, or list the name in FORKBOX_ALLOWED_HOSTS where the daemon runs",
                forkbox_engine::guestlog::quote(&host)
            ),
        )
    })
}

/// The value of cookie `name` a request carries.
pub fn cookie(req: &Request, name: &str) -> Option<String> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_localhost_and_listed_names_are_hosts_of_the_daemon() {
        for ok in [
            "127.0.0.1:7070",
            "10.0.0.5",
            "[::1]:7070",
            "localhost:7070",
            "LOCALHOST.",
            "build.internal:7070",
        ] {
            assert!(host_allowed(ok, "build.internal"), "{ok}");
        }
        for bad in [
            "evil.example:7070",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "[evil]",
            "build.internal.evil:1",
        ] {
            assert!(!host_allowed(bad, "build.internal"), "{bad}");
        }
    }

    #[test]
    fn created_tokens_are_valid_and_others_are_not() {
        let home = std::env::temp_dir().join(format!("forkbox-tokens-{}", std::process::id()));
        let paths = Paths::new(&home);
        assert!(!valid(&paths, "fbx_nothing"));
        let t = create(&paths, "ci", false).unwrap();
        let u = create(&paths, "other", true).unwrap();
        assert!(t.starts_with("fbx_") && u.starts_with("e2b_"));
        assert!(u[4..].chars().all(|c| c.is_ascii_hexdigit()), "{u}");
        assert!(valid(&paths, &t) && valid(&paths, &u));
        assert!(!valid(&paths, &t[..t.len() - 1]));
        assert!(!valid(&paths, ""));
        let stored = std::fs::read(paths.home().join("state.db")).unwrap();
        assert!(
            !String::from_utf8_lossy(&stored).contains(&t),
            "the token itself must not be stored"
        );
        let _ = std::fs::remove_dir_all(&home);
    }

    #[test]
    fn tokens_of_an_earlier_forkbox_are_imported() {
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::new(home.path());
        let token = "fbx_old";
        let old = vec![TokenRecord {
            name: "old".into(),
            sha256: forkbox_engine::random::to_hex(&digest(token)),
            created_unix: 1,
        }];
        std::fs::write(
            legacy_tokens_path(&paths),
            serde_json::to_vec(&old).unwrap(),
        )
        .unwrap();
        assert!(valid(&paths, token));
        assert!(!legacy_tokens_path(&paths).exists());
        assert!(valid(&paths, token), "still valid once imported");
    }
}
