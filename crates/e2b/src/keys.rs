//! The keys of E2B's surface: whose a sandbox is (a label from the caller's API key), and each
//! sandbox's access token for its in-sandbox services (derived from this daemon's key and the
//! sandbox's id, so nothing is stored per sandbox and a daemon restart keeps them valid).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The label that says which API key made a sandbox: only that key sees it.
pub const OWNER_LABEL: &str = "e2b.owner";
/// The label of a sandbox made with `autoResume`: a call that needs it resumes it when paused.
pub const AUTO_RESUME_LABEL: &str = "e2b.auto-resume";
/// The label that keeps the template a sandbox was asked for by.
pub const TEMPLATE_LABEL: &str = "e2b.template";
/// When a sandbox was made, in ms since the epoch: E2B lists by it, newest first, and two made
/// in the same second keep their order.
pub const STARTED_LABEL: &str = "e2b.started-ms";
/// The label of a sandbox whose ports answer only requests with its traffic access token
/// (`allowPublicTraffic: false`).
pub const PRIVATE_TRAFFIC_LABEL: &str = "e2b.private-traffic";
/// The label holding `maskRequestHost`: the Host requests to the sandbox's ports carry
/// (`${PORT}` in it the port's number).
pub const MASK_HOST_LABEL: &str = "e2b.mask-request-host";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The owner label's value for API key `key`: the first 16 bytes of its SHA-256, in hex.
pub fn owner(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes())[..16])
}

/// This daemon's key from `file`, made (32 random bytes, mode 0600) on first use.
pub fn load_or_make(file: &Path) -> std::io::Result<[u8; 32]> {
    if let Ok(b) = std::fs::read(file) {
        if let Ok(k) = <[u8; 32]>::try_from(b.as_slice()) {
            return Ok(k);
        }
        return Err(std::io::Error::other(format!(
            "{} is not 32 bytes; remove it and a new key is made (sandboxes' access tokens then change)",
            file.display()
        )));
    }
    let mut k = [0u8; 32];
    random_bytes(&mut k)?;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)?;
    f.write_all(&k)?;
    Ok(k)
}

fn mac(key: &[u8; 32], purpose: &[u8], sandbox: &str) -> Hmac<Sha256> {
    #[allow(clippy::expect_used)]
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(purpose);
    m.update(sandbox.as_bytes());
    m
}

const ENVD: &[u8] = b"e2b-envd-access:";
const TRAFFIC: &[u8] = b"e2b-traffic-access:";

/// Sandbox `sandbox`'s traffic access token (`trafficAccessToken`): what a request to its
/// ports carries in `e2b-traffic-access-token` when its traffic is not public.
pub fn traffic_token(key: &[u8; 32], sandbox: &str) -> String {
    hex(&mac(key, TRAFFIC, sandbox).finalize().into_bytes())
}

/// Whether `token` is sandbox `sandbox`'s traffic access token (in constant time).
pub fn traffic_token_ok(key: &[u8; 32], sandbox: &str, token: &str) -> bool {
    unhex(token).is_some_and(|b| mac(key, TRAFFIC, sandbox).verify_slice(&b).is_ok())
}

/// Sandbox `sandbox`'s access token (`envdAccessToken`).
pub fn access_token(key: &[u8; 32], sandbox: &str) -> String {
    hex(&mac(key, ENVD, sandbox).finalize().into_bytes())
}

/// Whether `token` is sandbox `sandbox`'s access token (compared in constant time).
pub fn token_ok(key: &[u8; 32], sandbox: &str, token: &str) -> bool {
    let Some(bytes) = unhex(token) else {
        return false;
    };
    mac(key, ENVD, sandbox).verify_slice(&bytes).is_ok()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Fills `b` from the kernel's random source.
pub fn random_bytes(b: &mut [u8]) -> std::io::Result<()> {
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, b))
}

/// Random bytes in hex.
pub fn random_hex(n: usize) -> std::io::Result<String> {
    let mut b = vec![0u8; n];
    random_bytes(&mut b)?;
    Ok(hex(&b))
}

/// The forkbox name of a snapshot the caller whose key hashes to `owner` names `label` (one is
/// made up without): `e2b-OWNER12-LABEL`, so a key's snapshots are told by their names.
pub fn snapshot_name(owner: &str, label: Option<&str>) -> Result<String, crate::errors::Failure> {
    let label = match label {
        Some(l) => l.to_string(),
        None => random_hex(6).map_err(|e| crate::errors::Failure::new(500, e.to_string()))?,
    };
    let ok = !label.is_empty()
        && label.len() <= 48
        && label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !ok {
        return Err(crate::errors::Failure::new(
            400,
            format!("snapshot name {label:?}: 1-48 letters, digits, '-' or '_'"),
        ));
    }
    Ok(owned_name(owner, &label))
}

/// The forkbox name of what the owner `owner` calls `label` (a snapshot, a volume):
/// `e2b-OWNER12-LABEL`, so a key's own are told by their names.
pub fn owned_name(owner: &str, label: &str) -> String {
    format!("e2b-{}-{label}", &owner[..12])
}

/// The label of `name` when the owner `owner` made it.
pub fn owned_label<'a>(owner: &str, name: &'a str) -> Option<&'a str> {
    name.strip_prefix("e2b-")?
        .strip_prefix(&owner[..12])?
        .strip_prefix('-')
}

/// Whether snapshot `name` is one the owner `owner` made.
pub fn snapshot_is(owner: &str, name: &str) -> bool {
    owned_label(owner, name).is_some()
}

/// The name its maker gave snapshot or volume `name`.
pub fn snapshot_label(name: &str) -> &str {
    name.splitn(3, '-').nth(2).unwrap_or(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_sandboxs_token_opens_it_alone() {
        let k = [7u8; 32];
        let t = access_token(&k, "sb-a");
        assert!(token_ok(&k, "sb-a", &t));
        assert!(!token_ok(&k, "sb-b", &t));
        assert!(!token_ok(&[8u8; 32], "sb-a", &t));
        assert!(!token_ok(&k, "sb-a", "zz"));
        assert!(!token_ok(&k, "sb-a", ""));
        assert_ne!(owner("a"), owner("b"));
        assert_eq!(owner("a").len(), 32);
        let (a, b) = (owner("a"), owner("b"));
        let s = snapshot_name(&a, Some("ready")).unwrap();
        assert!(snapshot_is(&a, &s) && !snapshot_is(&b, &s));
        assert_eq!(snapshot_label(&s), "ready");
        assert!(snapshot_name(&a, Some("../x")).is_err());
        assert!(snapshot_is(&a, &snapshot_name(&a, None).unwrap()));
    }

    #[test]
    fn the_key_is_made_once_and_kept() {
        let dir = std::env::temp_dir().join(format!("fbx-e2b-key-{}", std::process::id()));
        let f = dir.join("e2b.key");
        let a = load_or_make(&f).unwrap();
        assert_eq!(load_or_make(&f).unwrap(), a);
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(&f, b"short").unwrap();
        assert!(load_or_make(&f).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
