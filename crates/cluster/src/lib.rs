//! forkbox nodes as one cluster, on etcd v3.
//!
//! etcd holds the cluster's small, shared state; every node keeps its bulk data (images,
//! snapshots, disks) itself. The keys, all under `/forkbox/`:
//!
//! | key | value | life |
//! |---|---|---|
//! | `nodes/NAME` | [`NodeRecord`]: where to reach it, capacity, what it holds | the node's lease |
//! | `sandboxes/ID` | [`Ownership`]: the node that runs it, its view at creation | until deleted |
//! | `drained/NAME` | empty: no new placements on NAME | until undrained |
//! | `tokens/SHA256` | [`TokenRecord`]: a user token's hash, never the token | until revoked |
//! | `cluster/secret-check` | an HMAC of a fixed text under the cluster secret | forever |
//!
//! A node's record lives exactly as long as its lease: a node that dies drops out of
//! [`Cluster::nodes`] within the lease's time, and its sandboxes' ownership records then name a
//! node that is not there (listed `lost`). Ownership is taken with a create-if-absent
//! transaction (`create_revision == 0`), so two nodes can never both own one id. Every call to
//! etcd has a deadline: with quorum lost, what needs the cluster state fails at once with
//! [`Error::Unavailable`] instead of hanging.

pub mod auth;
pub mod placement;
pub mod tls;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use serde::{Deserialize, Serialize};

pub use forkbox_api::SandboxView;

const ROOT: &str = "/forkbox/";
/// How long one call to etcd may take before it is an error: longer than an etcd election
/// (a follower calls one after an election timeout, 1 s by etcd's default, randomized up to
/// twice that, and a vote takes a round trip), so the death of a leader costs a call a wait
/// and not an error. Without a quorum no leader comes, and every call fails within this.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// How long a connection to one member may take to open, and one attempt of a call may take
/// before it is made again within the deadline (a write a follower forwarded to a leader that
/// died is never answered: etcd gives up on it only after 7 s).
const ATTEMPT_DEADLINE: Duration = Duration::from_secs(2);
/// How long one step of the lease's keep-alive stream may take.
const KEEP_ALIVE_DEADLINE: Duration = Duration::from_secs(2);
/// A node's lease unless told otherwise: a dead node's sandboxes are `lost` within this.
pub const DEFAULT_LEASE_SECS: i64 = 5;
const RETRY_PAUSE: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the cluster state is unavailable (etcd at {endpoints} did not answer within {secs} s: \
         no quorum, or no member reachable); creates, forks and deletes wait for it, running \
         sandboxes still answer on their node: {detail}"
    )]
    Unavailable {
        endpoints: String,
        secs: u64,
        detail: String,
    },
    #[error(
        "node name {name:?} is held by a live node advertising {advertise} (its lease has {ttl} s \
         left); choose another --node, or stop that node first"
    )]
    NameTaken {
        name: String,
        advertise: String,
        ttl: i64,
    },
    #[error(
        "this node's cluster secret differs from the one the cluster at {endpoints} was made \
         with; give every node the same --cluster-secret (or FORKBOX_CLUSTER_SECRET)"
    )]
    SecretMismatch { endpoints: String },
    #[error("sandbox {id} is already owned by node {node}")]
    AlreadyOwned { id: String, node: String },
    #[error("etcd answered with a record forkbox cannot read at {key}: {detail}")]
    Corrupt { key: String, detail: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// What a node publishes about itself under its lease.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub name: String,
    /// Random, kept in the node's home: tells a restart of this node from another node that
    /// wants its name.
    pub node_id: String,
    /// The base URL other nodes forward to (`http://10.0.0.2:7070`).
    pub advertise: String,
    pub cpus: u32,
    /// Memory the host could still give guests (MemAvailable), MiB.
    pub mem_free_mib: u64,
    /// Free space in the node's home, MiB.
    pub disk_free_mib: u64,
    /// Sandboxes it runs (hibernated ones included).
    pub sandboxes: u32,
    /// Images it holds, `name@N`.
    pub images: Vec<String>,
    /// Snapshots it holds, by name.
    pub snapshots: Vec<String>,
    /// Volumes it holds, by name: a sandbox that mounts one is placed here.
    #[serde(default)]
    pub volumes: Vec<String>,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// The node's clock when it wrote this record (Unix ms): a node far off is refused.
    pub updated_unix_ms: u64,
    /// Its lease (set when read back).
    #[serde(default)]
    pub lease: i64,
    /// Whether an operator drained it (set when read back from `drained/NAME`).
    #[serde(default)]
    pub drained: bool,
}

/// Who owns a sandbox, recorded once when it is made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ownership {
    pub node: String,
    /// Its view when it was made (what a `lost` listing shows).
    pub view: SandboxView,
    /// Set when its node found it gone (after a restart of that node's host).
    #[serde(default)]
    pub lost: bool,
}

/// A user token as the cluster keeps it: its hash only.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenRecord {
    pub name: String,
    pub sha256: String,
    pub created_unix: u64,
}

/// One etcd member as `cluster status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    pub name: String,
    pub id: String,
    pub client_urls: Vec<String>,
    /// Whether it answered a status call in time.
    pub healthy: bool,
    pub is_leader: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How a node joins: where etcd is, its own name and address, and the cluster secret.
#[derive(Debug, Clone)]
pub struct Config {
    pub endpoints: Vec<String>,
    pub node: String,
    pub advertise: String,
    pub secret: String,
    pub lease_secs: i64,
    pub node_id: String,
    /// Mutual TLS: this node's certificate, key and the cluster CA (etcd is reached over TLS
    /// with them when its URLs are `https://`).
    pub tls: Option<tls::Identity>,
}

impl Config {
    /// Checks what can be checked before talking to etcd.
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() || self.endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(Error::Invalid(
                "--cluster needs etcd URLs, comma-separated (http://127.0.0.1:2379,…)".into(),
            ));
        }
        for e in &self.endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(Error::Invalid(format!(
                    "etcd URL {e:?} needs a scheme: http://HOST:PORT"
                )));
            }
        }
        if !node_name_ok(&self.node, 253) {
            return Err(Error::Invalid(format!(
                "node name {:?} must be 1-253 of a-z, 0-9, '-' and '.' (neither first nor last)",
                self.node
            )));
        }
        if !(self.advertise.starts_with("http://") || self.advertise.starts_with("https://")) {
            return Err(Error::Invalid(format!(
                "--advertise {:?} must be the URL other nodes reach this one at \
                 (http://ADDRESS:PORT of its --listen)",
                self.advertise
            )));
        }
        if self.tls.is_none() {
            if let Some(e) = self.endpoints.iter().find(|e| e.starts_with("https://")) {
                return Err(Error::Invalid(format!(
                    "etcd URL {e} is https: give --cluster-tls DIR (the cluster CA, or etcd's \
                     as etcd-ca.pem, and this node's certificate, which etcd takes as a client's)"
                )));
            }
            if self.advertise.starts_with("https://") {
                return Err(Error::Invalid(format!(
                    "--advertise {} is https: give --cluster-tls DIR (nodes speak mutual TLS \
                     with certificates of the cluster CA)",
                    self.advertise
                )));
            }
        }
        if self.secret.len() < 16 {
            return Err(Error::Invalid(
                "the cluster secret must be at least 16 characters (--cluster-secret or \
                 FORKBOX_CLUSTER_SECRET); every node needs the same one"
                    .into(),
            ));
        }
        if !(2..=60).contains(&self.lease_secs) {
            return Err(Error::Invalid(format!(
                "a lease of {} s is out of range: 2 to 60",
                self.lease_secs
            )));
        }
        Ok(())
    }
}

/// Whether `name` is a node's name of at most `max` bytes: a host name or a Kubernetes node
/// name (a DNS subdomain), of a-z, 0-9, '-' and '.', neither first nor last.
pub fn node_name_ok(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.'])
}

fn key(kind: &str, name: &str) -> String {
    format!("{ROOT}{kind}/{name}")
}

fn prefix(kind: &str) -> String {
    format!("{ROOT}{kind}/")
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How far this node's clock may be from another node's before it is refused (the same window
/// a node's signature is accepted in).
pub const MAX_CLOCK_SKEW_MS: u64 = auth::MAX_SKEW_MS;

/// Whether this node's clock (`now_ms`) agrees with the live `nodes`' own, read from their
/// records (each rewritten at least every `publish_every_ms`): a node far off is refused at
/// its join, by how much and against whom, instead of failing every forwarded call later.
pub fn check_clock(
    now_ms: u64,
    nodes: &[NodeRecord],
    me: &str,
    publish_every_ms: u64,
) -> Result<()> {
    for n in nodes
        .iter()
        .filter(|n| n.name != me && n.updated_unix_ms > 0)
    {
        // Their record is at most publish_every old: their clock now is in
        // [updated, updated + publish_every] (plus what reading took).
        let (lo, hi) = (
            n.updated_unix_ms,
            n.updated_unix_ms + publish_every_ms + 1_000,
        );
        let off = if now_ms < lo {
            lo - now_ms
        } else {
            now_ms.saturating_sub(hi)
        };
        if off > MAX_CLOCK_SKEW_MS {
            let how = if now_ms < lo { "behind" } else { "ahead of" };
            return Err(Error::Invalid(format!(
                "this node's clock is {} s {how} node {}'s (at most {} s apart): fix the time \
                 (NTP) on one of them",
                off / 1000,
                n.name,
                MAX_CLOCK_SKEW_MS / 1000
            )));
        }
    }
    Ok(())
}

/// A node's handle on the cluster. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    cfg: Arc<Config>,
    lease: Arc<AtomicI64>,
    /// The endpoints the client balances over (the given ones, then etcd's member list).
    endpoints: Arc<std::sync::Mutex<BTreeSet<String>>>,
}

impl Cluster {
    /// Connects to etcd (lazily: members that do not answer yet are retried) and checks the
    /// cluster secret against the one the cluster was made with.
    pub async fn connect(cfg: Config) -> Result<Cluster> {
        cfg.validate()?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(ATTEMPT_DEADLINE)
            .with_timeout(ATTEMPT_DEADLINE)
            .with_keep_alive(Duration::from_secs(2), ATTEMPT_DEADLINE)
            .with_require_leader(true);
        if let Some(id) = &cfg.tls {
            tls::install_provider();
            if cfg.endpoints.iter().any(|e| e.starts_with("https://")) {
                options = options.with_tls(id.etcd());
            }
        }
        let client = Client::connect(&cfg.endpoints, Some(options))
            .await
            .map_err(|e| Error::Invalid(format!("etcd endpoints {:?}: {e}", cfg.endpoints)))?;
        let c = Cluster {
            client,
            endpoints: Arc::new(std::sync::Mutex::new(
                cfg.endpoints.iter().cloned().collect(),
            )),
            cfg: Arc::new(cfg),
            lease: Arc::new(AtomicI64::new(0)),
        };
        c.check_secret().await?;
        Ok(c)
    }

    /// An operator's handle (`forkbox cluster status`, `node drain`, cluster tokens): not a
    /// node, never registered.
    pub async fn operator(
        endpoints: Vec<String>,
        secret: String,
        tls: Option<tls::Identity>,
    ) -> Result<Cluster> {
        Cluster::connect(Config {
            endpoints,
            node: "operator".into(),
            advertise: "http://operator".into(),
            secret,
            lease_secs: DEFAULT_LEASE_SECS,
            node_id: String::new(),
            tls,
        })
        .await
    }

    pub fn node(&self) -> &str {
        &self.cfg.node
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    fn unavailable(&self, detail: impl std::fmt::Display) -> Error {
        Error::Unavailable {
            endpoints: self.cfg.endpoints.join(","),
            secs: DEADLINE.as_secs(),
            detail: detail.to_string(),
        }
    }

    /// Runs one etcd call under the deadline, again on a member that answers when one did not
    /// (a killed member's connection fails once before the balancer drops it), again while the
    /// members elect a leader ("no leader", "leader changed": a killed leader), and again when
    /// an attempt was not answered in its own bound (a follower forwarded it to a leader that
    /// died), as etcd's own clients retry an unavailable endpoint. Every call made here is safe
    /// to make twice: reads, puts and deletes of whole values, lease grants (an extra one
    /// expires), and transactions whose compare recognizes this node's own earlier write.
    async fn call<T, F, Fut>(&self, mut f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let end = tokio::time::Instant::now() + DEADLINE;
        loop {
            let left = end.saturating_duration_since(tokio::time::Instant::now());
            let attempt = left.min(ATTEMPT_DEADLINE);
            let e = match tokio::time::timeout(attempt, f(self.client.clone())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => e,
                Err(_) if attempt < left => continue,
                Err(_) => return Err(self.unavailable("timed out")),
            };
            // Unavailable: no leader, leader changed, a member stopping; Unknown: a stream
            // cut; Cancelled and DeadlineExceeded: an attempt's bound passed in the transport
            // ("Timeout expired"); the transport: a member's connection refused or reset.
            let transient = match &e {
                etcd_client::Error::GRpcStatus(s) => matches!(
                    s.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::Unknown
                        | tonic::Code::Cancelled
                        | tonic::Code::DeadlineExceeded
                ),
                etcd_client::Error::TransportError(_) => true,
                _ => false,
            };
            if !transient || tokio::time::Instant::now() + RETRY_PAUSE >= end {
                return Err(self.unavailable(e));
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// One call of the lease's keep-alive stream, not repeated: under a bound no longer than the
    /// shortest lease (2 s), so a stream stuck on a dead leader is dropped and the node joins
    /// again instead of losing its lease silently.
    async fn once<T>(
        &self,
        f: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(KEEP_ALIVE_DEADLINE, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.unavailable(e)),
            Err(_) => Err(self.unavailable("timed out")),
        }
    }

    async fn check_secret(&self) -> Result<()> {
        let k = key("cluster", "secret-check");
        let mine = auth::secret_check(&self.cfg.secret);
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(k.clone(), mine.clone(), None)])
            .or_else([TxnOp::get(k.clone(), None)]);
        let r = self.txn(txn).await?;
        if r.succeeded() {
            return Ok(());
        }
        let held = first_value(&r.op_responses()).unwrap_or_default();
        if auth::equal(&held, mine.as_bytes()) {
            Ok(())
        } else {
            Err(Error::SecretMismatch {
                endpoints: self.cfg.endpoints.join(","),
            })
        }
    }

    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        self.call(|mut c| {
            let t = txn.clone();
            async move { c.txn(t).await }
        })
        .await
    }

    async fn put(&self, k: &str, v: Vec<u8>) -> Result<()> {
        self.call(|mut c| {
            let (k, v) = (k.to_string(), v.clone());
            async move { c.put(k, v, None).await }
        })
        .await
        .map(|_| ())
    }

    async fn delete(&self, k: &str) -> Result<()> {
        self.call(|mut c| {
            let k = k.to_string();
            async move { c.delete(k, None).await }
        })
        .await
        .map(|_| ())
    }

    async fn revoke(&self, lease: i64) -> Result<()> {
        self.call(|mut c| async move { c.lease_revoke(lease).await })
            .await
            .map(|_| ())
    }

    /// Whether etcd can commit now (a linearizable read answered within the deadline).
    pub async fn require_quorum(&self) -> Result<()> {
        let k = key("cluster", "secret-check");
        self.call(|mut c| {
            let k = k.clone();
            async move { c.get(k, None).await }
        })
        .await
        .map(|_| ())
    }

    /// Registers this node under a new lease: refused when a live node of another identity
    /// holds the name; a record of this node's own earlier life is taken over.
    pub async fn join(&self, record: &NodeRecord) -> Result<i64> {
        let ttl = self.cfg.lease_secs;
        let lease = self
            .call(|mut c| async move { c.lease_grant(ttl, None).await })
            .await?
            .id();
        let k = key("nodes", &self.cfg.node);
        let value = encode(record);
        let put = TxnOp::put(
            k.clone(),
            value.clone(),
            Some(PutOptions::new().with_lease(lease)),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([put.clone()])
            .or_else([TxnOp::get(k.clone(), None)]);
        let r = self.txn(txn).await?;
        if !r.succeeded() {
            let (value, held_lease) = first_kv(&r.op_responses()).unwrap_or_default();
            let mut held: NodeRecord = decode(&k, &value)?;
            held.lease = held_lease;
            if held.node_id != self.cfg.node_id {
                let _ = self.revoke(lease).await;
                let held_lease = held.lease;
                let ttl = self
                    .call(|mut c| async move { c.lease_time_to_live(held_lease, None).await })
                    .await
                    .map(|t| t.ttl())
                    .unwrap_or(-1);
                return Err(Error::NameTaken {
                    name: self.cfg.node.clone(),
                    advertise: held.advertise,
                    ttl,
                });
            }
            if held.lease == lease {
                // The first attempt of the put above landed; its answer was lost.
                self.lease.store(lease, Ordering::SeqCst);
                return Ok(lease);
            }
            // This node before a crash: take its name over and end the old lease.
            let swap = Txn::new()
                .when([Compare::lease(k.clone(), CompareOp::Equal, held.lease)])
                .and_then([put]);
            self.txn(swap).await?;
            let _ = self.revoke(held.lease).await;
        }
        self.lease.store(lease, Ordering::SeqCst);
        Ok(lease)
    }

    /// Rewrites this node's record (capacity, holdings) under its lease.
    pub async fn publish(&self, record: &NodeRecord) -> Result<()> {
        let lease = self.lease.load(Ordering::SeqCst);
        let k = key("nodes", &self.cfg.node);
        // Only while the lease is still the one on the key: after a lease loss, `join` again.
        let txn = Txn::new()
            .when([Compare::lease(k.clone(), CompareOp::Equal, lease)])
            .and_then([TxnOp::put(
                k,
                encode(record),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let r = self.txn(txn).await?;
        if r.succeeded() {
            Ok(())
        } else {
            Err(self.unavailable("this node's lease ended; it registers again"))
        }
    }

    /// Keeps the lease alive until it is lost (returns then: the caller joins again).
    pub async fn keep_alive(&self) -> Result<()> {
        let lease = self.lease.load(Ordering::SeqCst);
        let mut lc = self.client.lease_client();
        let (mut keeper, mut stream) = self.once(lc.keep_alive(lease)).await?;
        let every = Duration::from_millis((self.cfg.lease_secs as u64 * 1000) / 3);
        loop {
            self.once(keeper.keep_alive()).await?;
            match self.once(stream.message()).await? {
                Some(r) if r.ttl() > 0 => {}
                _ => return Err(self.unavailable(format!("lease {lease:x} expired"))),
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Ends this node's lease at once (a clean stop: its record goes now, not in a lease time).
    pub async fn leave(&self) {
        let lease = self.lease.swap(0, Ordering::SeqCst);
        if lease != 0 {
            let _ = self.revoke(lease).await;
        }
    }

    async fn list(&self, kind: &str, serializable: bool) -> Result<Vec<(String, Vec<u8>)>> {
        let mut options = GetOptions::new().with_prefix();
        if serializable {
            options = options.with_serializable();
        }
        let p = prefix(kind);
        let mut r = self
            .call(|mut c| {
                let (p, o) = (p.clone(), options.clone());
                async move { c.get(p, Some(o)).await }
            })
            .await?;
        Ok(r.take_kvs()
            .into_iter()
            .map(|kv| {
                let name = String::from_utf8_lossy(kv.key())
                    .trim_start_matches(&prefix(kind))
                    .to_string();
                (name, kv.value().to_vec())
            })
            .collect())
    }

    /// The live nodes (each with its lease and whether it is drained), by name. A member-local
    /// read: it answers without quorum, from that member's latest state.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let options = GetOptions::new().with_prefix().with_serializable();
        // Both reads at once: this is on every forwarded call's path.
        let (drained, mut r) = tokio::try_join!(self.list("drained", true), async {
            self.call(|mut c| {
                let o = options.clone();
                async move { c.get(prefix("nodes"), Some(o)).await }
            })
            .await
        })?;
        let drained: BTreeSet<String> = drained.into_iter().map(|(n, _)| n).collect();
        let mut nodes = Vec::new();
        for item in r.take_kvs() {
            let k = String::from_utf8_lossy(item.key()).to_string();
            let mut n: NodeRecord = decode(&k, item.value())?;
            n.lease = item.lease();
            n.drained = drained.contains(&n.name);
            nodes.push(n);
        }
        Ok(nodes)
    }

    /// Stops (or, with `on == false`, resumes) placements on `node`.
    pub async fn drain(&self, node: &str, on: bool) -> Result<()> {
        let k = key("drained", node);
        if on {
            self.put(&k, Vec::new()).await?;
        } else {
            self.delete(&k).await?;
        }
        Ok(())
    }

    /// Claims the build of image `name` for this node, under its lease (a builder that dies
    /// loses its claim with its lease): `None` when this node holds the claim now, else the
    /// name of the node that does. One claim per name in the whole cluster, by a
    /// create-if-absent transaction.
    pub async fn claim_build(&self, name: &str) -> Result<Option<String>> {
        let k = key("builds", name);
        let lease = self.lease.load(Ordering::SeqCst);
        let put = TxnOp::put(
            k.clone(),
            self.cfg.node.as_bytes().to_vec(),
            Some(PutOptions::new().with_lease(lease)),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([put])
            .or_else([TxnOp::get(k.clone(), None)]);
        let r = self.txn(txn).await?;
        if r.succeeded() {
            return Ok(None);
        }
        let held = String::from_utf8_lossy(&first_value(&r.op_responses()).unwrap_or_default())
            .into_owned();
        // An attempt of this call that landed before its answer was lost is this node's too.
        Ok((held != self.cfg.node).then_some(held))
    }

    /// The node whose claim to build image `name` etcd holds, if any.
    pub async fn builder(&self, name: &str) -> Result<Option<String>> {
        let k = key("builds", name);
        let mut r = self
            .call(|mut c| {
                let k = k.clone();
                async move { c.get(k, None).await }
            })
            .await?;
        Ok(r.take_kvs()
            .into_iter()
            .next()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    /// Ends this node's claim of the build of image `name` (built, or failed).
    pub async fn release_build(&self, name: &str) -> Result<()> {
        let k = key("builds", name);
        let txn = Txn::new()
            .when([Compare::value(
                k.clone(),
                CompareOp::Equal,
                self.cfg.node.as_bytes().to_vec(),
            )])
            .and_then([TxnOp::delete(k, None)]);
        self.txn(txn).await.map(|_| ())
    }

    /// Records `view` as owned by this node; refused if any node owns that id.
    pub async fn own(&self, view: &SandboxView) -> Result<()> {
        let k = key("sandboxes", &view.info.id);
        let record = Ownership {
            node: self.cfg.node.clone(),
            view: view.clone(),
            lost: false,
        };
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(k.clone(), encode(&record), None)])
            .or_else([TxnOp::get(k.clone(), None)]);
        let r = self.txn(txn).await?;
        if r.succeeded() {
            tracing::info!(
                "{}: owned by {} (recorded in etcd)",
                view.info.id,
                self.cfg.node
            );
            return Ok(());
        }
        let held: Ownership = decode(&k, &first_value(&r.op_responses()).unwrap_or_default())?;
        if held.node == self.cfg.node {
            return Ok(());
        }
        Err(Error::AlreadyOwned {
            id: view.info.id.clone(),
            node: held.node,
        })
    }

    /// The owner of sandbox `id`, if any node owns it. A member-local read first (it answers
    /// without quorum); a miss is asked again of the leader (a member that lags would not have
    /// a record made a moment ago), and stands as a miss when that cannot answer.
    pub async fn owner(&self, id: &str) -> Result<Option<Ownership>> {
        if let Some(o) = self.owner_read(id, true).await? {
            return Ok(Some(o));
        }
        Ok(self.owner_read(id, false).await.unwrap_or(None))
    }

    async fn owner_read(&self, id: &str, serializable: bool) -> Result<Option<Ownership>> {
        let k = key("sandboxes", id);
        let mut options = GetOptions::new();
        if serializable {
            options = options.with_serializable();
        }
        let mut r = self
            .call(|mut c| {
                let (k, o) = (k.clone(), options.clone());
                async move { c.get(k, Some(o)).await }
            })
            .await?;
        match r.take_kvs().into_iter().next() {
            Some(item) => Ok(Some(decode(&k, item.value())?)),
            None => Ok(None),
        }
    }

    /// The live nodes as the leader knows them (a node that joined a moment ago included), or,
    /// without quorum, as this member does: what decides that a node is gone.
    pub async fn nodes_fresh(&self) -> Result<Vec<NodeRecord>> {
        let options = GetOptions::new().with_prefix();
        let fresh = self
            .call(|mut c| {
                let o = options.clone();
                async move { c.get(prefix("nodes"), Some(o)).await }
            })
            .await;
        match fresh {
            Ok(mut r) => r
                .take_kvs()
                .into_iter()
                .map(|item| {
                    let k = String::from_utf8_lossy(item.key()).to_string();
                    let mut n: NodeRecord = decode(&k, item.value())?;
                    n.lease = item.lease();
                    Ok(n)
                })
                .collect(),
            Err(_) => self.nodes().await,
        }
    }

    /// Every ownership record (member-local read: for listings).
    pub async fn owned(&self) -> Result<Vec<Ownership>> {
        self.owned_read(true).await
    }

    /// Every ownership record as the leader has them: what a node acts on (stopping a VM
    /// whose record is gone must never follow a member that lags behind a record just made).
    pub async fn owned_fresh(&self) -> Result<Vec<Ownership>> {
        self.owned_read(false).await
    }

    async fn owned_read(&self, serializable: bool) -> Result<Vec<Ownership>> {
        self.list("sandboxes", serializable)
            .await?
            .into_iter()
            .map(|(id, v)| decode(&key("sandboxes", &id), &v))
            .collect()
    }

    /// Removes the record of sandbox `id` if this node owns it.
    pub async fn forget(&self, id: &str) -> Result<()> {
        let k = key("sandboxes", id);
        let Some(o) = self.owner(id).await? else {
            return Ok(());
        };
        if o.node != self.cfg.node {
            return Ok(());
        }
        self.delete(&k).await?;
        tracing::info!(
            "{id}: no longer owned by {} (record removed)",
            self.cfg.node
        );
        Ok(())
    }

    /// Removes the record of `id` owned by `node` (a lost sandbox's, by any node: its node is
    /// gone, and a user deleted it).
    pub async fn remove_record(&self, id: &str, node: &str) -> Result<()> {
        let k = key("sandboxes", id);
        let Some(o) = self.owner(id).await? else {
            return Ok(());
        };
        if o.node != node {
            return Err(Error::AlreadyOwned {
                id: id.to_string(),
                node: o.node,
            });
        }
        self.delete(&k).await
    }

    /// Marks this node's record of `id` lost (its VM is gone), or, with `lost == false`, found
    /// again (its VM is back: the node re-adopted it).
    pub async fn mark_lost(&self, id: &str, lost: bool) -> Result<()> {
        let k = key("sandboxes", id);
        let Some(mut o) = self.owner(id).await? else {
            return Ok(());
        };
        if o.node != self.cfg.node || o.lost == lost {
            return Ok(());
        }
        o.lost = lost;
        self.put(&k, encode(&o)).await?;
        match lost {
            true => tracing::info!("{id}: marked lost by {} (its VM is gone)", self.cfg.node),
            false => tracing::info!("{id}: found again by {} (re-adopted)", self.cfg.node),
        }
        Ok(())
    }

    /// Stores a user token's hash cluster-wide.
    pub async fn add_token(&self, t: &TokenRecord) -> Result<()> {
        self.put(&key("tokens", &t.sha256), encode(t)).await
    }

    /// Every stored token hash (member-local read: works without quorum, sees a revocation as
    /// soon as that member has applied it).
    pub async fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.tokens_read(true).await
    }

    /// The token hashes as the leader has them (a token made a moment ago included).
    pub async fn tokens_fresh(&self) -> Result<Vec<TokenRecord>> {
        self.tokens_read(false).await
    }

    async fn tokens_read(&self, serializable: bool) -> Result<Vec<TokenRecord>> {
        self.list("tokens", serializable)
            .await?
            .into_iter()
            .map(|(h, v)| decode(&key("tokens", &h), &v))
            .collect()
    }

    /// Revokes every token named `name`; how many there were.
    pub async fn revoke_tokens(&self, name: &str) -> Result<usize> {
        let mut n = 0;
        for t in self.tokens_fresh().await? {
            if t.name == name {
                self.delete(&key("tokens", &t.sha256)).await?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Follows etcd's member list: members added since are reached too, removed ones no more
    /// (the given endpoints are only where to start). What changed.
    pub async fn sync_endpoints(&self) -> Result<Vec<String>> {
        let list = self
            .call(|mut c| async move { c.member_list().await })
            .await?;
        let now: BTreeSet<String> = list
            .members()
            .iter()
            .flat_map(|m| m.client_urls().iter().cloned())
            .collect();
        if now.is_empty() {
            return Ok(Vec::new());
        }
        let before = match self.endpoints.lock() {
            Ok(e) => e.clone(),
            Err(_) => return Ok(Vec::new()),
        };
        let mut changed = Vec::new();
        for url in now.difference(&before) {
            if self.client.add_endpoint(url).await.is_ok() {
                changed.push(format!("+{url}"));
            }
        }
        for url in before.difference(&now) {
            if self.client.remove_endpoint(url).await.is_ok() {
                changed.push(format!("-{url}"));
            }
        }
        if let Ok(mut e) = self.endpoints.lock() {
            *e = now;
        }
        Ok(changed)
    }

    /// etcd's members, each asked for its status with the deadline.
    pub async fn members(&self) -> Result<Vec<MemberStatus>> {
        let list = self
            .call(|mut c| async move { c.member_list().await })
            .await?;
        let mut out = Vec::new();
        for m in list.members() {
            let mut s = MemberStatus {
                name: m.name().to_string(),
                id: format!("{:x}", m.id()),
                client_urls: m.client_urls().to_vec(),
                healthy: false,
                is_leader: false,
                error: None,
            };
            match m.client_urls().first() {
                Some(url) => match member_status(url).await {
                    Ok(leader) => {
                        s.healthy = true;
                        s.is_leader = leader == m.id();
                    }
                    Err(e) => s.error = Some(e),
                },
                None => s.error = Some("no client URL".into()),
            }
            out.push(s);
        }
        Ok(out)
    }
}

async fn member_status(url: &str) -> std::result::Result<u64, String> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(1));
    let fut = async {
        let mut c = Client::connect([url], Some(options)).await?;
        c.status().await
    };
    match tokio::time::timeout(Duration::from_secs(2), fut).await {
        Ok(Ok(s)) => Ok(s.leader()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".into()),
    }
}

fn first_value(ops: &[TxnOpResponse]) -> Option<Vec<u8>> {
    first_kv(ops).map(|(value, _)| value)
}

/// The value and lease of the first key a transaction's get read.
fn first_kv(ops: &[TxnOpResponse]) -> Option<(Vec<u8>, i64)> {
    ops.iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| (kv.value().to_vec(), kv.lease())),
        _ => None,
    })
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing these plain records cannot fail (no maps with non-string keys).
    serde_json::to_vec(v).unwrap_or_default()
}

fn decode<T: for<'de> Deserialize<'de>>(key: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Corrupt {
        key: key.to_string(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(name: &str, updated_unix_ms: u64) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            updated_unix_ms,
            ..NodeRecord::default()
        }
    }

    #[test]
    fn a_clock_far_from_another_nodes_is_refused_saying_by_how_much() {
        let now = 1_000_000_000;
        let nodes = [
            at("me", now - 90_000_000),
            at("b", now - 1_500),
            at("c", now + 400),
        ];
        // Its own old record is no measure; b wrote 1.5 s ago (its clock now at most 1.5 s past
        // that, + 1 s of reading), c's clock is 0.4 s ahead.
        assert!(check_clock(now, &nodes, "me", 2_000).is_ok());
        let e = check_clock(now + 60_000, &nodes, "me", 2_000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("58 s ahead of node b's"), "{e}");
        let e = check_clock(now - 45_000, &nodes, "me", 2_000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("43 s behind node b's"), "{e}");
    }
}
