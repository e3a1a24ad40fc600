//! Bearer tokens for the TCP listener. The Unix socket needs none: its mode (0600) is the check.
//!
//! Only a token's SHA-256 is stored (`tokens.json` in forkbox's home, mode 0600); a request's
//! token is hashed and compared with every stored hash in constant time.

use std::path::PathBuf;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use forkbox_engine::paths::{write_atomic, Paths};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenRecord {
    pub name: String,
    pub sha256: String,
    pub created_unix: u64,
}

pub fn tokens_path(paths: &Paths) -> PathBuf {
    paths.home().join("tokens.json")
}

fn load(paths: &Paths) -> Vec<TokenRecord> {
    std::fs::read(tokens_path(paths))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Makes a new token, stores its hash, and returns the token (shown once).
pub fn create(paths: &Paths, name: &str) -> std::io::Result<String> {
    let mut raw = [0u8; 32];
    getrandom::getrandom(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
    let token = format!("fbx_{}", hex(&raw));
    let mut all = load(paths);
    all.push(TokenRecord {
        name: name.to_string(),
        sha256: hex(&digest(&token)),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    });
    let json = serde_json::to_vec_pretty(&all).map_err(std::io::Error::other)?;
    write_atomic(&tokens_path(paths), &json)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tokens_path(paths), std::fs::Permissions::from_mode(0o600))?;
    Ok(token)
}

/// Whether `token` is one of the stored ones. Every stored hash is compared, in constant time.
pub fn valid(paths: &Paths, token: &str) -> bool {
    let d = hex(&digest(token));
    load(paths)
        .iter()
        .fold(subtle::Choice::from(0), |acc, t| {
            acc | t.sha256.as_bytes().ct_eq(d.as_bytes())
        })
        .into()
}

/// Refuses requests without a valid `Authorization: Bearer` token.
pub async fn require_token(State(paths): State<Paths>, req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match token {
        Some(t) if valid(&paths, t) => next.run(req).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(serde_json::json!({ "error": "a valid bearer token is required; create one with `forkbox token create`" })),
        )
            .into_response(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn created_tokens_are_valid_and_others_are_not() {
        let home = std::env::temp_dir().join(format!("forkbox-tokens-{}", std::process::id()));
        let paths = Paths::new(&home);
        assert!(!valid(&paths, "fbx_nothing"));
        let t = create(&paths, "ci").unwrap();
        let u = create(&paths, "other").unwrap();
        assert!(valid(&paths, &t) && valid(&paths, &u));
        assert!(!valid(&paths, &t[..t.len() - 1]));
        assert!(!valid(&paths, ""));
        let stored = std::fs::read_to_string(tokens_path(&paths)).unwrap();
        assert!(!stored.contains(&t), "the token itself must not be stored");
        let _ = std::fs::remove_dir_all(&home);
    }
}
