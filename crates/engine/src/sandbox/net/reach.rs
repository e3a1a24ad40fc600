//! Which remotes a sandbox may reach and at which address: the policy's names, resolved on
//! the host, and the addresses no policy opens.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use forkbox_api::NetworkPolicy;

/// Where the guest's proxy listens.
pub const PROXY_PORT: u16 = 3128;

/// The host's CA bundle, if it has one where Debian, Fedora or `SSL_CERT_FILE` put it; looked
/// for once per process (every command of a sandbox with a network asks).
pub fn host_ca_bundle() -> Option<&'static std::path::Path> {
    static FOUND: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            std::env::var_os("SSL_CERT_FILE")
                .map(std::path::PathBuf::from)
                .into_iter()
                .chain([
                    std::path::PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
                    std::path::PathBuf::from("/etc/pki/tls/certs/ca-bundle.crt"),
                ])
                .find(|p| p.is_file())
        })
        .as_deref()
}

/// Where a sandbox with network keeps the host's CA bundle (public certificates: a host
/// behind a TLS-inspecting proxy reaches registries through it, and so must its guests).
pub const GUEST_CA: &str = "/run/forkbox-host-ca.crt";

/// The variables that point TLS clients (OpenSSL, Python, pip, curl, git, Node, npm) at a CA
/// bundle.
pub const CA_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "npm_config_cafile",
];

/// Cloud metadata and platform services outside the link-local ranges: Alibaba Cloud's
/// 100.100.100.200, Azure's wire server 168.63.129.16, AWS's IPv6 metadata fd00:ec2::254 and
/// its DNS fd00:ec2::253, Oracle Cloud's 192.0.0.192. (169.254.169.254 and fe80::/10, where
/// AWS, GCP, Azure, DigitalOcean and OpenStack answer, are link-local and refused as such.)
pub const METADATA: &[IpAddr] = &[
    IpAddr::V4(std::net::Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(std::net::Ipv4Addr::new(168, 63, 129, 16)),
    IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 0, 192)),
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x253)),
];

/// Addresses a sandbox may never reach, whatever its policy: the host's own, loopback,
/// link-local (with 169.254.169.254), cloud metadata ([`METADATA`]), multicast, unspecified,
/// broadcast; an IPv4 address written as IPv6 (mapped or NAT64 `64:ff9b::/96`) counts as itself.
pub fn never_reachable(ip: IpAddr, host_addrs: &[IpAddr]) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                    let o = v6.octets();
                    IpAddr::V4(std::net::Ipv4Addr::new(o[12], o[13], o[14], o[15]))
                } else {
                    ip
                }
            }
        },
        v4 => v4,
    };
    if host_addrs.contains(&ip)
        || METADATA.contains(&ip)
        || ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
    {
        return true;
    }
    match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast() || v4.octets()[0] == 0,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The addresses of this host's interfaces.
fn host_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| {
            let s = a.address?;
            if let Some(v4) = s.as_sockaddr_in() {
                return Some(IpAddr::V4(v4.ip()));
            }
            s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
        })
        .collect()
}

/// How long a name's addresses are kept: a package manager opens a connection per package,
/// and a resolver asked for one name a hundred times at once drops some of the questions.
const RESOLVED_FOR: Duration = Duration::from_secs(30);

type Resolved = std::collections::HashMap<(String, u16), (std::time::Instant, Vec<SocketAddr>)>;

/// `host:port`'s addresses: asked once at a time per name, and kept for [`RESOLVED_FOR`].
async fn lookup(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    use std::sync::{LazyLock, Mutex};
    static KEPT: LazyLock<Mutex<Resolved>> = LazyLock::new(Default::default);
    type Asking = std::collections::HashMap<(String, u16), std::sync::Arc<tokio::sync::Mutex<()>>>;
    static ASKING: LazyLock<Mutex<Asking>> = LazyLock::new(Default::default);
    let key = (host.to_ascii_lowercase(), port);
    let kept = || {
        let mut map = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (at, _)| at.elapsed() < RESOLVED_FOR);
        map.get(&key).map(|(_, a)| a.clone())
    };
    if let Some(a) = kept() {
        return Ok(a);
    }
    // One question per name at a time (other names are not held up): whoever waited finds
    // the answer kept.
    let gate = {
        let mut map = ASKING.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, g| std::sync::Arc::strong_count(g) > 1);
        map.entry(key.clone()).or_default().clone()
    };
    let _asking = gate.lock().await;
    if let Some(a) = kept() {
        return Ok(a);
    }
    let found: Vec<SocketAddr> = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::lookup_host((host, port)),
    )
    .await
    .map_err(|_| format!("resolving {host} timed out"))?
    .map_err(|e| format!("cannot resolve {host}: {e}"))?
    .collect();
    KEPT.lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, (std::time::Instant::now(), found.clone()));
    Ok(found)
}

/// Decides a tunnel request: the address to connect to, or why not.
pub async fn resolve(policy: &NetworkPolicy, host: &str, port: u16) -> Result<SocketAddr, String> {
    policy.permits_name(host, port)?;
    let found = lookup(host, port).await?;
    let own = host_addresses();
    let mut refused = Vec::new();
    let mut by_policy = None;
    for a in found {
        if never_reachable(a.ip(), &own) {
            refused.push(a.ip().to_string());
        } else if let Err(why) = policy.permits_address(host, a.ip(), port) {
            by_policy.get_or_insert(why);
        } else {
            return Ok(a);
        }
    }
    if let Some(why) = by_policy {
        return Err(why);
    }
    Err(format!(
        "{host} resolves only to addresses a sandbox may never reach (the host itself, loopback, link-local, cloud metadata): {}",
        refused.join(", ")
    ))
}
