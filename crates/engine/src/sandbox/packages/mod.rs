//! The package cache: a home's sandboxes reach the package registries (npm's, PyPI's, or
//! others named in `FORKBOX_PACKAGE_HOSTS`) through the host, which keeps what they fetch.
//!
//! A guest's connection to a registry on port 443 ends at the cache's listener
//! ([`crate::intercept`]): its TLS is terminated with a certificate for the registry's name
//! from the home's CA (which every sandbox with a network trusts), and each HTTP/1.1 request
//! is answered here:
//!
//! - a GET without credentials, cookies or a range is answered from the cache when HTTP
//!   caching says the kept response is fresh ([`http_cache_semantics`], as a shared cache),
//!   revalidated with the registry when it is stale and has a validator, and fetched otherwise;
//!   a fetched response that may be kept is written whole to the cache first, then served
//!   from there;
//! - anything else (a publish, a login, a response that says `no-store` or `private`) goes to
//!   the registry and back as it is, kept nowhere.
//!
//! The host's own connections to the registry are its own (verified against the host's CA
//! bundle, kept alive, to the address the sandbox's policy resolved): a registry never waits
//! for an emulated guest's TLS handshake or its reading, which is what ended `npm ci`'s
//! connections under TCG (a registry resets a connection whose client says nothing for ~10 s).
//!
//! When a registry says nothing of freshness (no `Cache-Control` or `Expires`, as the npm and
//! PyPI mirrors here), an archive (an npm tarball, a PyPI file: immutable once published) is
//! taken as fresh for a year and any other document for five minutes (what npm's registry
//! says of its own). Keyed by URL, `Accept` and `Accept-Encoding`; within
//! `FORKBOX_PACKAGE_CACHE_MIB` (default 4096), the least used dropped first;
//! `FORKBOX_PACKAGE_CACHE=off` turns it off (registries are then tunnelled as any host).

mod serve;
pub mod store;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::ca::Ca;
use crate::intercept::{Listener, Target};

/// The registries cached unless `FORKBOX_PACKAGE_HOSTS` names others too.
pub const DEFAULT_HOSTS: &[&str] = &[
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    "pypi.org",
    "files.pythonhosted.org",
];

/// The cache's size unless `FORKBOX_PACKAGE_CACHE_MIB` says.
pub const DEFAULT_MIB: u64 = 4096;

/// What the cache covers and how much it keeps.
#[derive(Debug, Clone)]
pub struct Settings {
    pub hosts: Vec<String>,
    pub max_bytes: u64,
}

impl Settings {
    /// From `FORKBOX_PACKAGE_CACHE` (`off` turns the cache off), `FORKBOX_PACKAGE_CACHE_MIB`
    /// and `FORKBOX_PACKAGE_HOSTS` (more registries, comma-separated).
    pub fn from_env() -> Result<Option<Settings>, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = var("FORKBOX_PACKAGE_CACHE") {
            match v.trim() {
                "off" | "0" | "false" | "no" => return Ok(None),
                "on" | "1" | "true" | "yes" => {}
                other => {
                    return Err(format!(
                    "FORKBOX_PACKAGE_CACHE={other:?}: say `off` to turn the package cache off, or `on`"
                ))
                }
            }
        }
        let mib = match var("FORKBOX_PACKAGE_CACHE_MIB") {
            None => DEFAULT_MIB,
            Some(v) => v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|m| *m >= 16)
                .ok_or(format!(
                    "FORKBOX_PACKAGE_CACHE_MIB={v:?}: the package cache's size in MiB, at least 16"
                ))?,
        };
        let mut hosts: Vec<String> = DEFAULT_HOSTS.iter().map(|h| h.to_string()).collect();
        for h in var("FORKBOX_PACKAGE_HOSTS").unwrap_or_default().split(',') {
            let h = h.trim().to_ascii_lowercase();
            if h.is_empty() {
                continue;
            }
            forkbox_api::check_allow_entry(&h).map_err(|e| {
                format!("FORKBOX_PACKAGE_HOSTS: {e} (list registry host names, comma-separated)")
            })?;
            if h.contains(':') || h.starts_with("*.") {
                return Err(format!(
                    "FORKBOX_PACKAGE_HOSTS: {h:?}: a registry's host name alone (its HTTPS port 443 is cached)"
                ));
            }
            if !hosts.contains(&h) {
                hosts.push(h);
            }
        }
        Ok(Some(Settings {
            hosts,
            max_bytes: mib * 1024 * 1024,
        }))
    }
}

/// How the cache answered, since it opened.
#[derive(Default, Debug)]
pub struct Counts {
    /// Answered from the cache without asking the registry.
    pub hits: AtomicU64,
    /// Answered from the cache after the registry said it had not changed.
    pub revalidated: AtomicU64,
    /// Fetched from the registry and kept.
    pub fetched: AtomicU64,
    /// Carried to the registry and back, kept nowhere.
    pub passed: AtomicU64,
    /// Bytes of bodies sent to guests from the cache.
    pub bytes_from_cache: AtomicU64,
    /// Bytes of bodies fetched from registries.
    pub bytes_fetched: AtomicU64,
}

/// The figures of [`Counts`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountsNow {
    pub hits: u64,
    pub revalidated: u64,
    pub fetched: u64,
    pub passed: u64,
    pub bytes_from_cache: u64,
    pub bytes_fetched: u64,
}

/// A home's package cache.
pub struct PackageCache {
    settings: Settings,
    ca: Ca,
    store: store::Store,
    listener: tokio::sync::OnceCell<Listener>,
    /// The host's connections per registry name and address (kept alive between requests).
    clients: Mutex<HashMap<(String, SocketAddr), reqwest::Client>>,
    counts: Counts,
    /// A lock per key being answered (see [`PackageCache::asking`]).
    asking: Mutex<HashMap<store::Key, Arc<tokio::sync::Mutex<()>>>>,
    me: Weak<PackageCache>,
}

impl std::fmt::Debug for PackageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackageCache")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl PackageCache {
    /// The cache kept in `dir` (its CA in `dir/ca.key`, its responses in `dir/store`).
    pub fn open(dir: &Path, settings: Settings) -> Result<Arc<PackageCache>, String> {
        let ca = Ca::kept_in(dir, "forkbox package cache CA")?;
        let store = store::Store::open(&dir.join("store"), settings.max_bytes)
            .map_err(|e| format!("open the package cache in {}: {e}", dir.display()))?;
        Ok(Arc::new_cyclic(|me| PackageCache {
            settings,
            ca,
            store,
            listener: tokio::sync::OnceCell::new(),
            clients: Mutex::new(HashMap::new()),
            counts: Counts::default(),
            asking: Mutex::new(HashMap::new()),
            me: me.clone(),
        }))
    }

    /// Whether a guest's connection to `host`:`port` goes through the cache.
    pub fn covers(&self, host: &str, port: u16) -> bool {
        port == 443
            && self
                .settings
                .hosts
                .iter()
                .any(|h| h.eq_ignore_ascii_case(host))
    }

    /// The registries it covers.
    pub fn hosts(&self) -> &[String] {
        &self.settings.hosts
    }

    /// The CA's certificate, PEM: every guest with a network trusts it.
    pub fn ca_pem(&self) -> &str {
        self.ca.pem()
    }

    /// How it answered so far.
    pub fn counts(&self) -> CountsNow {
        let c = &self.counts;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CountsNow {
            hits: get(&c.hits),
            revalidated: get(&c.revalidated),
            fetched: get(&c.fetched),
            passed: get(&c.passed),
            bytes_from_cache: get(&c.bytes_from_cache),
            bytes_fetched: get(&c.bytes_fetched),
        }
    }

    /// Bytes and responses kept.
    pub fn size(&self) -> (u64, usize) {
        self.store.size()
    }

    /// A connection for a guest's tunnel to `target` (a registry this covers), served here.
    pub async fn connect(&self, target: Target) -> std::io::Result<tokio::net::TcpStream> {
        let me = self.me.clone();
        let listener = self
            .listener
            .get_or_try_init(|| {
                Listener::start(Arc::new(move |stream, target| {
                    let me = me.clone();
                    Box::pin(async move {
                        if let Some(cache) = me.upgrade() {
                            serve::connection(cache, stream, target).await;
                        }
                    })
                }))
            })
            .await?;
        listener.connect(target).await
    }

    /// Held while a request for `key` is answered: a second request for it waits, then finds
    /// what the first kept. (A response that may not be kept is asked for by each in turn.)
    async fn asking(&self, key: &store::Key) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.asking.lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|_, l| Arc::strong_count(l) > 1);
            map.entry(key.clone()).or_default().clone()
        };
        lock.lock_owned().await
    }

    /// The host's client for `t`'s registry at the address its policy resolved.
    fn client(&self, t: &Target) -> Result<reqwest::Client, String> {
        let key = (t.host.to_ascii_lowercase(), t.addr);
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let tls = (*crate::ca::upstream_config()?).clone();
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .resolve(&t.host, t.addr)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .http1_only()
            .connect_timeout(crate::intercept::UPSTREAM)
            .read_timeout(std::time::Duration::from_secs(60))
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| format!("a client for {}: {e}", t.host))?;
        clients.insert(key, client.clone());
        Ok(client)
    }
}
