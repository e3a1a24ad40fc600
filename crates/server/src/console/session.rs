//! The console's sessions on TCP: a random cookie (kept here only as its hash) with a CSRF token
//! of its own, for 12 hours; forgotten when the daemon stops.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::HeaderValue;
use subtle::ConstantTimeEq;

use super::{COOKIE, CSRF_HEADER};

/// How long a session lasts.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions held at most (the oldest goes first).
const MAX_SESSIONS: usize = 1024;

struct Session {
    csrf: String,
    since: Instant,
}

#[derive(Default)]
pub struct Sessions {
    by_hash: Mutex<HashMap<[u8; 32], Session>>,
    /// The Unix socket's "session" (no login there): one CSRF token for the daemon's life.
    socket: std::sync::OnceLock<String>,
}

fn key(cookie: &str) -> [u8; 32] {
    *blake3::hash(cookie.as_bytes()).as_bytes()
}

impl Sessions {
    /// A new session: its cookie value and CSRF token.
    pub fn begin(&self) -> std::io::Result<(String, String)> {
        let cookie = forkbox_engine::random::hex(32)?;
        let csrf = forkbox_engine::random::hex(32)?;
        let mut all = self
            .by_hash
            .lock()
            .map_err(|_| std::io::Error::other("the console's sessions are poisoned"))?;
        all.retain(|_, s| s.since.elapsed() < LIFETIME);
        if all.len() >= MAX_SESSIONS {
            if let Some(oldest) = all.iter().min_by_key(|(_, s)| s.since).map(|(k, _)| *k) {
                all.remove(&oldest);
            }
        }
        all.insert(
            key(&cookie),
            Session {
                csrf: csrf.clone(),
                since: Instant::now(),
            },
        );
        Ok((cookie, csrf))
    }

    /// The CSRF token of the live session `cookie` names.
    pub fn csrf_of(&self, cookie: &str) -> Option<String> {
        let all = self.by_hash.lock().ok()?;
        all.get(&key(cookie))
            .filter(|s| s.since.elapsed() < LIFETIME)
            .map(|s| s.csrf.clone())
    }

    pub fn end(&self, cookie: &str) {
        if let Ok(mut all) = self.by_hash.lock() {
            all.remove(&key(cookie));
        }
    }

    pub fn socket_csrf(&self) -> String {
        self.socket
            .get_or_init(|| forkbox_engine::random::hex(32).unwrap_or_default())
            .clone()
    }
}

/// The console's cookie of a request.
pub fn cookie(req: &Request) -> Option<String> {
    crate::auth::cookie(req, COOKIE)
}

/// Whether the request carries `csrf` in its header (compared in constant time).
pub fn csrf_matches(req: &Request, csrf: &str) -> bool {
    req.headers()
        .get(CSRF_HEADER)
        .is_some_and(|v| bool::from(v.as_bytes().ct_eq(csrf.as_bytes())))
}

pub fn set_cookie(value: &str) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}",
        LIFETIME.as_secs()
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

pub fn cleared_cookie() -> HeaderValue {
    HeaderValue::from_static("forkbox_console=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// Field `name` of a form body (`application/x-www-form-urlencoded`).
pub fn form_field(body: &[u8], name: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    text.split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| percent_decode(v))
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_session_knows_its_csrf_token_until_it_ends() {
        let s = Sessions::default();
        let (cookie, csrf) = s.begin().unwrap();
        assert_eq!(s.csrf_of(&cookie).as_deref(), Some(csrf.as_str()));
        assert_eq!(s.csrf_of("someone-elses"), None);
        s.end(&cookie);
        assert_eq!(s.csrf_of(&cookie), None);
    }

    #[test]
    fn form_fields_are_decoded() {
        assert_eq!(
            form_field(b"a=1&token=fbx_ab%2Bc+d", "token").as_deref(),
            Some("fbx_ab+c d")
        );
        assert_eq!(
            form_field(b"token=%zz%4", "token").as_deref(),
            Some("%zz%4")
        );
        assert_eq!(form_field(b"x=1", "token"), None);
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_scoped_to_the_console() {
        let v = set_cookie("abc");
        let v = v.to_str().unwrap();
        for part in [
            "forkbox_console=abc",
            "Path=/ui",
            "HttpOnly",
            "SameSite=Strict",
        ] {
            assert!(v.contains(part), "{v}");
        }
    }
}
