//! forkbox's sandboxes in E2B's shapes: `Sandbox` (create, connect), `ListedSandbox` (list) and
//! `SandboxDetail` (info), as the SDKs' generated models read them.

use std::time::{Duration, UNIX_EPOCH};

use forkbox_api::{SandboxState, SandboxView, TtlAction};
use serde_json::{json, Map, Value};

use crate::keys::{self, OWNER_LABEL, TEMPLATE_LABEL};

/// The `clientID` every sandbox reports (E2B's names its orchestrator node).
const CLIENT_ID: &str = "forkbox";

fn rfc3339(unix: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(unix)).to_string()
}

/// The template a sandbox was asked for (its image when made by forkbox's own API).
pub fn template(v: &SandboxView) -> String {
    v.labels
        .get(TEMPLATE_LABEL)
        .cloned()
        .unwrap_or_else(|| v.info.image.clone())
}

/// The caller's metadata: every label but the front end's own.
pub fn metadata(v: &SandboxView) -> Map<String, Value> {
    v.labels
        .iter()
        .filter(|(k, _)| !k.starts_with("e2b."))
        .map(|(k, val)| (k.clone(), json!(val)))
        .collect()
}

/// Whether the caller whose key hashes to `owner` may see `v`.
pub fn owned_by(v: &SandboxView, owner: &str) -> bool {
    v.labels.get(OWNER_LABEL).map(String::as_str) == Some(owner)
}

/// `running` or `paused`, as E2B says them (a sandbox paused by a full disk counts as running:
/// it goes on by itself).
pub fn state(v: &SandboxView) -> &'static str {
    match v.state {
        SandboxState::Hibernated | SandboxState::Sleeping => "paused",
        _ => "running",
    }
}

/// The `Sandbox` a create or connect answers.
pub fn sandbox(v: &SandboxView, key: &[u8; 32]) -> Value {
    json!({
        "templateID": template(v),
        "alias": template(v),
        "sandboxID": v.info.id,
        "clientID": CLIENT_ID,
        "envdVersion": crate::ENVD_VERSION,
        "envdAccessToken": keys::access_token(key, &v.info.id),
        "trafficAccessToken": traffic_token(v, key),
        "domain": null,
    })
}

/// Whether label `label` of `v` is set (`1`).
fn flag(v: &SandboxView, label: &str) -> bool {
    v.labels.get(label).is_some_and(|x| x == "1")
}

/// Whether a use of `v` while it is paused resumes it: E2B's `autoResume`, or forkbox's own
/// waking on use.
pub fn auto_resumes(v: &SandboxView) -> bool {
    v.wake_on_use || flag(v, keys::AUTO_RESUME_LABEL)
}

/// Whether `v`'s ports answer only requests with its traffic access token
/// (`allowPublicTraffic: false`).
pub fn private_traffic(v: &SandboxView) -> bool {
    flag(v, keys::PRIVATE_TRAFFIC_LABEL)
}

/// The sandbox's traffic access token when its traffic is not public, else null.
fn traffic_token(v: &SandboxView, key: &[u8; 32]) -> Value {
    match private_traffic(v) {
        true => json!(keys::traffic_token(key, &v.info.id)),
        false => Value::Null,
    }
}

/// When `v` was made, in ms since the epoch (made through E2B's API: to the ms).
pub fn started_ms(v: &SandboxView) -> u64 {
    v.labels
        .get(keys::STARTED_LABEL)
        .and_then(|s| s.parse().ok())
        .unwrap_or(v.created_unix * 1000)
}

/// A `ListedSandbox`.
pub fn listed(v: &SandboxView) -> Value {
    // E2B's sandboxes always end; one without a TTL here is given a far end.
    let end = v.expires_unix.unwrap_or(v.created_unix + 100 * 365 * 86400);
    json!({
        "templateID": template(v),
        "alias": template(v),
        "sandboxID": v.info.id,
        "clientID": CLIENT_ID,
        "startedAt": humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(started_ms(v))).to_string(),
        "endAt": rfc3339(end),
        "cpuCount": v.info.cpus,
        "memoryMB": v.info.memory_mib,
        // The root disk's size is the image's; forkbox's listing does not carry it.
        "diskSizeMB": 0,
        "state": state(v),
        "envdVersion": crate::ENVD_VERSION,
        "metadata": metadata(v),
        "volumeMounts": crate::volumes::shown(v),
    })
}

/// A `SandboxDetail`.
pub fn detail(v: &SandboxView, key: &[u8; 32]) -> Value {
    let mut d = listed(v);
    let on_timeout = match v.ttl_action {
        TtlAction::Hibernate | TtlAction::HibernateDisk => "pause",
        TtlAction::Delete => "kill",
    };
    d["envdAccessToken"] = json!(keys::access_token(key, &v.info.id));
    d["trafficAccessToken"] = traffic_token(v, key);
    d["domain"] = Value::Null;
    d["allowInternetAccess"] = json!(v.network.internet);
    if !v.network.internet {
        d["network"] = json!({ "allowOut": v.network.allow, "denyOut": ["0.0.0.0/0"] });
    } else if !v.network.deny.is_empty() {
        d["network"] = json!({ "allowOut": v.network.allow, "denyOut": v.network.deny });
    }
    d["lifecycle"] = json!({ "autoResume": auto_resumes(v), "onTimeout": on_timeout });
    d
}
