//! Node-to-node trust: a cluster secret every node holds, never a user's token.
//!
//! A forwarded request carries `x-forkbox-node: NAME;UNIX_MS;HMAC`, the HMAC-SHA256 under the
//! cluster secret of the node's name, the time, the method and the path with its query. The
//! receiving node accepts it only within [`MAX_SKEW_MS`] of its own clock, so a recorded header
//! cannot be replayed later, and a node whose clock is far off cannot call its peers (it is told
//! so). The secret itself never crosses the wire; a user's bearer token is checked by the node
//! that received the call and is dropped before forwarding.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The header a node signs its forwarded requests with.
pub const HEADER: &str = "x-forkbox-node";
/// How far a signature's time may be from the receiver's clock.
pub const MAX_SKEW_MS: u64 = 30_000;

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &str, parts: &[&[u8]]) -> Vec<u8> {
    // HMAC takes a key of any length.
    let Ok(mut m) = HmacSha256::new_from_slice(secret.as_bytes()) else {
        return Vec::new();
    };
    for p in parts {
        m.update(&(p.len() as u64).to_be_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the cluster stores to tell nodes with another secret: an HMAC of a fixed text.
pub fn secret_check(secret: &str) -> String {
    hex(&mac(secret, &[b"forkbox cluster secret check v1"]))
}

/// Constant-time equality.
pub fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// The header value for a request from `node` at `now_ms`.
pub fn sign(secret: &str, node: &str, now_ms: u64, method: &str, path_and_query: &str) -> String {
    let t = now_ms.to_string();
    let sig = mac(
        secret,
        &[
            node.as_bytes(),
            t.as_bytes(),
            method.as_bytes(),
            path_and_query.as_bytes(),
        ],
    );
    format!("{node};{t};{}", hex(&sig))
}

/// Why a node's header was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("malformed {HEADER} header")]
    Malformed,
    #[error(
        "node {node}'s clock is {skew_ms} ms off this node's (at most {MAX_SKEW_MS} ms): fix \
         its time (NTP)"
    )]
    Clock { node: String, skew_ms: u64 },
    #[error("node {node}'s signature does not verify: it has another cluster secret")]
    Signature { node: String },
}

/// Checks a header; the calling node's name when it verifies.
pub fn verify(
    secret: &str,
    header: &str,
    now_ms: u64,
    method: &str,
    path_and_query: &str,
) -> Result<String, Refused> {
    let mut parts = header.splitn(3, ';');
    let (Some(node), Some(t), Some(sig)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(Refused::Malformed);
    };
    let Ok(ts) = t.parse::<u64>() else {
        return Err(Refused::Malformed);
    };
    let expected = sign(secret, node, ts, method, path_and_query);
    if !equal(expected.as_bytes(), header.as_bytes()) || sig.is_empty() {
        return Err(Refused::Signature {
            node: node.to_string(),
        });
    }
    let skew_ms = now_ms.abs_diff(ts);
    if skew_ms > MAX_SKEW_MS {
        return Err(Refused::Clock {
            node: node.to_string(),
            skew_ms,
        });
    }
    Ok(node.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "a cluster secret of some length";

    #[test]
    fn a_signed_request_verifies_only_as_signed() {
        let h = sign(S, "a", 1_000_000, "GET", "/v1/sandboxes/x?local=1");
        assert_eq!(
            verify(S, &h, 1_000_500, "GET", "/v1/sandboxes/x?local=1"),
            Ok("a".to_string())
        );
        // Another path, method, secret, or a node name swapped in: refused.
        assert!(matches!(
            verify(S, &h, 1_000_500, "GET", "/v1/sandboxes/y?local=1"),
            Err(Refused::Signature { .. })
        ));
        assert!(matches!(
            verify(S, &h, 1_000_500, "DELETE", "/v1/sandboxes/x?local=1"),
            Err(Refused::Signature { .. })
        ));
        assert!(matches!(
            verify(
                "another secret entirely",
                &h,
                1_000_500,
                "GET",
                "/v1/sandboxes/x?local=1"
            ),
            Err(Refused::Signature { .. })
        ));
        let swapped = h.replacen("a;", "b;", 1);
        assert!(matches!(
            verify(S, &swapped, 1_000_500, "GET", "/v1/sandboxes/x?local=1"),
            Err(Refused::Signature { .. })
        ));
        assert_eq!(
            verify(S, "nonsense", 1, "GET", "/"),
            Err(Refused::Malformed)
        );
    }

    #[test]
    fn a_clock_far_off_is_refused_by_how_much() {
        let h = sign(S, "a", 1_000_000, "GET", "/v1/info");
        assert_eq!(
            verify(S, &h, 1_000_000 + MAX_SKEW_MS + 1, "GET", "/v1/info"),
            Err(Refused::Clock {
                node: "a".into(),
                skew_ms: MAX_SKEW_MS + 1
            })
        );
        assert!(verify(S, &h, 1_000_000 - 29_000, "GET", "/v1/info").is_ok());
    }

    #[test]
    fn the_secret_check_differs_by_secret() {
        assert_eq!(secret_check(S), secret_check(S));
        assert_ne!(secret_check(S), secret_check("another secret entirely"));
    }
}
