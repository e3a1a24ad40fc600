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
    /// subdomains), `host:port`, an IP address (`10.0.0.5`, `[fd00::1]:8080`), a network
    /// (`10.0.0.0/24`: every port). With `internet` and `deny`: the exceptions to `deny`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// With `internet`: what stays out of reach, by name (`example.org`, `*.example.org`),
    /// address or network (`10.0.0.0/8`), on every port unless one is given. An `allow`
    /// entry that also matches wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("give `internet: true` or an `allow` list, not both (with `internet`, `allow` entries are exceptions to a `deny` list)")]
    Both,
    #[error("allow entry {0:?}: use a host name (pypi.org), *.domain, host:port, an IP address or a network (10.0.0.0/24)")]
    BadEntry(String),
    #[error("deny entry {0:?}: use a host name (example.org), *.domain, an IP address or a network (10.0.0.0/8), optionally :port")]
    BadDeny(String),
    #[error("`deny` narrows `internet: true`; without it only the `allow` list is reached")]
    DenyWithoutInternet,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Lowercase name or IP text; for `*.x`, `x` with `subdomains`.
    pub(crate) host: String,
    pub(crate) subdomains: bool,
    pub(crate) port: Option<u16>,
    /// A network (`10.0.0.0/8`): it matches addresses in it.
    pub(crate) net: Option<ipnet::IpNet>,
}

impl Entry {
    /// Whether it names `host`:`port` (by name or address); with no port of its own, 80
    /// and 443, or every port when `every_port` (a deny entry's) or for a network.
    fn matches(&self, host: &str, port: u16, every_port: bool) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name_ok = match (&self.net, self.subdomains) {
            (Some(net), _) => host.parse::<IpAddr>().is_ok_and(|ip| net.contains(&ip)),
            (None, true) => host.ends_with(&format!(".{}", self.host)),
            (None, false) => host == self.host,
        };
        let port_ok = match self.port {
            Some(p) => p == port,
            None => every_port || self.net.is_some() || port == 80 || port == 443,
        };
        name_ok && port_ok
    }
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
            net: None,
        });
    }
    if host.contains('/') {
        let net: ipnet::IpNet = host.parse().ok()?;
        return Some(Entry {
            host: net.trunc().to_string(),
            subdomains: false,
            port,
            net: Some(net.trunc()),
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
        net: None,
    })
}

/// Whether allow-list entry `entry` (a secret's host, too) names `host`:`port`: the name
/// itself, or for `*.x` a subdomain of `x`, or an address in a network; the entry's port, or
/// 80 and 443 when it has none (every port for a network).
pub fn entry_matches(entry: &str, host: &str, port: u16) -> bool {
    parse_entry(entry).is_some_and(|e| e.matches(host, port, false))
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
        if self.internet && !self.allow.is_empty() && self.deny.is_empty() {
            return Err(PolicyError::Both);
        }
        if !self.internet && !self.deny.is_empty() {
            return Err(PolicyError::DenyWithoutInternet);
        }
        for e in &self.allow {
            parse_entry(e).ok_or_else(|| PolicyError::BadEntry(e.clone()))?;
        }
        for e in &self.deny {
            parse_entry(e).ok_or_else(|| PolicyError::BadDeny(e.clone()))?;
        }
        Ok(())
    }

    fn allowed(&self, host: &str, port: u16) -> bool {
        self.allow.iter().any(|e| entry_matches(e, host, port))
    }

    fn denied(&self, host: &str, port: u16) -> Option<&str> {
        self.deny
            .iter()
            .find(|e| parse_entry(e).is_some_and(|d| d.matches(host, port, true)))
            .map(String::as_str)
    }

    /// Whether the policy lets a program ask for `host`:`port` before it is resolved: a
    /// refusal is final; `Ok` may still be refused by address ([`Self::permits_address`]).
    pub fn permits_name(&self, host: &str, port: u16) -> Result<(), String> {
        if self.is_off() {
            return Err("the network is off for this sandbox (create it with network {internet: true} or an allow list)".into());
        }
        if self.allowed(host, port) {
            return Ok(());
        }
        if let Some(e) = self.denied(host, port).filter(|_| self.internet) {
            return Err(format!(
                "{host}:{port} is denied by this sandbox's deny entry {e:?}"
            ));
        }
        // A name may still resolve into an allowed network.
        let by_network = self
            .allow
            .iter()
            .any(|e| parse_entry(e).is_some_and(|e| e.net.is_some()));
        if self.internet || (by_network && host.parse::<IpAddr>().is_err()) {
            return Ok(());
        }
        Err(format!("{host}:{port} is not in this sandbox's allow list"))
    }

    /// Whether `host`:`port`, which the guest asked for by name or address, may be reached at
    /// address `ip` it resolved to: allowed by its name or address, or on the internet and not
    /// denied (an allow entry wins over a deny entry).
    pub fn permits_address(&self, host: &str, ip: IpAddr, port: u16) -> Result<(), String> {
        let addr = ip.to_string();
        if self.allowed(host, port) || self.allowed(&addr, port) {
            return Ok(());
        }
        if !self.internet {
            return Err(format!(
                "{host}:{port} ({addr}) is not in this sandbox's allow list"
            ));
        }
        match self.denied(&addr, port) {
            Some(e) => Err(format!(
                "{host}:{port} ({addr}) is denied by this sandbox's deny entry {e:?}"
            )),
            None => Ok(()),
        }
    }
}
