//! What a sandbox may reach: its network policy, checked once, whatever the front end.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// What a sandbox may reach. Off (the default) is no network at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Any host on the internet (never the host itself, loopback, link-local or metadata).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub internet: bool,
    /// Only these: `pypi.org` (that name, ports 80 and 443), `*.pythonhosted.org` (its
    /// subdomains), `host:port`, an IP address (`10.0.0.5`, `[fd00::1]:8080`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("give `internet: true` or an `allow` list, not both")]
    Both,
    #[error("allow entry {0:?}: use a host name (pypi.org), *.domain, host:port or an IP address")]
    BadEntry(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Lowercase name or IP text; for `*.x`, `x` with `subdomains`.
    pub(crate) host: String,
    pub(crate) subdomains: bool,
    pub(crate) port: Option<u16>,
}

pub(crate) fn parse_entry(e: &str) -> Option<Entry> {
    let e = e.trim().to_ascii_lowercase();
    let (host, port) = if let Some(rest) = e.strip_prefix('[') {
        let (h, p) = rest.split_once(']')?;
        let port = match p {
            "" => None,
            p => Some(p.strip_prefix(':')?.parse().ok()?),
        };
        (h.to_string(), port)
    } else if e.matches(':').count() == 1 {
        let (h, p) = e.split_once(':')?;
        (h.to_string(), Some(p.parse().ok()?))
    } else {
        (e.clone(), None)
    };
    if host.parse::<IpAddr>().is_ok() {
        return Some(Entry {
            host,
            subdomains: false,
            port,
        });
    }
    let (name, subdomains) = match host.strip_prefix("*.").or(host.strip_prefix('.')) {
        Some(n) => (n.to_string(), true),
        None => (host.trim_end_matches('.').to_string(), false),
    };
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
        });
    ok.then_some(Entry {
        host: name,
        subdomains,
        port,
    })
}

/// Whether allow-list entry `entry` (a secret's host, too) names `host`:`port`: the name
/// itself, or for `*.x` a subdomain of `x`; the entry's port, or 80 and 443 when it has none.
pub fn entry_matches(entry: &str, host: &str, port: u16) -> bool {
    let Some(e) = parse_entry(entry) else {
        return false;
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name_ok = if e.subdomains {
        host.ends_with(&format!(".{}", e.host))
    } else {
        host == e.host
    };
    let port_ok = match e.port {
        Some(p) => p == port,
        None => port == 80 || port == 443,
    };
    name_ok && port_ok
}

/// Checks one allow entry as [`NetworkPolicy::validate`] would.
pub fn check_allow_entry(e: &str) -> Result<String, PolicyError> {
    parse_entry(e)
        .map(|_| e.to_string())
        .ok_or_else(|| PolicyError::BadEntry(e.to_string()))
}

impl NetworkPolicy {
    pub fn is_off(&self) -> bool {
        !self.internet && self.allow.is_empty()
    }

    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.internet && !self.allow.is_empty() {
            return Err(PolicyError::Both);
        }
        for e in &self.allow {
            parse_entry(e).ok_or_else(|| PolicyError::BadEntry(e.clone()))?;
        }
        Ok(())
    }

    /// Whether the policy lets a program ask for `host`:`port` (before resolution).
    pub fn permits_name(&self, host: &str, port: u16) -> Result<(), String> {
        if self.is_off() {
            return Err("the network is off for this sandbox (create it with network {internet: true} or an allow list)".into());
        }
        if self.internet {
            return Ok(());
        }
        let allowed = self.allow.iter().any(|e| entry_matches(e, host, port));
        if allowed {
            Ok(())
        } else {
            Err(format!("{host}:{port} is not in this sandbox's allow list"))
        }
    }
}
