//! A daemon as one node of a cluster (`forkbox serve --cluster`): one API on every node.
//!
//! Every `/v1` call is answered by the node that receives it, after one decision made here, in
//! front of the router:
//!
//! - a call about a sandbox (`/v1/sandboxes/ID/…`) runs where the sandbox runs: here if this
//!   node's engine has it, else forwarded to its owner as etcd records it (streams included:
//!   the request and reply bodies are piped, not buffered); a sandbox whose node left is
//!   `sandbox_lost`;
//! - a create goes to the node placement picks ([`forkbox_cluster::placement`]), a copy of a
//!   snapshot to a node that holds it;
//! - a listing asks every live node for its own and adds the records of nodes that are gone,
//!   as `lost`;
//! - anything else (images, info, metrics) is this node's.
//!
//! A forwarded call carries the sending node's signature ([`forkbox_cluster::auth`]) and never
//! the user's token; the receiving node serves it as its own and forwards nothing further.
//! Creates, forks and deletes need etcd to record ownership: without quorum they are refused
//! with `cluster_unavailable`, while calls about this node's own sandboxes go on.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, Uri};
use axum::response::Response;
use forkbox_cluster::placement::{self, Want};
use forkbox_cluster::{auth as node_auth, Cluster, Config, NodeRecord};
use forkbox_engine::api::{ops, Code, Engine, SandboxView};
use forkbox_engine::paths::Paths;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;

use crate::refusal;

mod builds;
mod routing;
mod tls;
mod transfer;
pub use routing::{route, verify_peer};

/// How a daemon joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub endpoints: Vec<String>,
    pub node: String,
    pub advertise: String,
    pub secret: String,
    pub lease_secs: i64,
    /// Mutual TLS with the peers: a directory of `ca.pem`, `node.pem`, `node.key`.
    pub tls_dir: Option<PathBuf>,
}

/// Largest create or fork request body read to decide where it goes.
const MAX_DECISION_BODY: usize = 1 << 20;
/// Most bytes this node reads of another node's reply to its own call (a listing, a manifest,
/// a batch of chunks: each far smaller): a node never holds more of a peer's answer.
const MAX_PEER_REPLY: usize = 64 << 20;
/// How often a node rewrites its record and reconciles with etcd.
const PUBLISH_EVERY: Duration = Duration::from_secs(2);
/// Memory a create without `memory_mib` is placed for: the engine's default guest's.
fn default_memory_mib() -> u64 {
    u64::from(forkbox_engine::sandbox::SandboxConfig::default().memory_mib)
}

/// This daemon's part in the cluster.
pub struct Node {
    name: String,
    secret: String,
    engine: Arc<Engine>,
    paths: Paths,
    /// None until etcd first answered (the node serves its own sandboxes meanwhile).
    cluster: tokio::sync::RwLock<Option<Cluster>>,
    http: HttpClient<HttpConnector, Body>,
    /// Mutual TLS with the peers, when the node has a certificate: every call to a peer goes
    /// over it, and a peer's call reaches this node only over it.
    tls: Option<tls::NodeTls>,
    config: Config,
    /// Sandboxes this node recorded as its own in etcd (kept in the home, so a restart tells
    /// a record removed elsewhere from one never made).
    ledger: Mutex<BTreeSet<String>>,
    /// Snapshots being brought here from other nodes.
    pulls: transfer::Pulls,
    /// The progress of carried images this node built for the cluster.
    builds: builds::Builds,
}

fn ledger_path(paths: &Paths) -> PathBuf {
    paths.home().join("cluster-ledger.json")
}

/// This node's identity, made once and kept in its home.
fn node_id(paths: &Paths) -> std::io::Result<String> {
    let p = paths.home().join("node-id");
    match std::fs::read_to_string(&p) {
        Ok(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        _ => {
            let id = forkbox_engine::random::hex(16)?;
            std::fs::write(&p, &id)?;
            Ok(id)
        }
    }
}

fn io(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Joins the cluster, or fails at once for what no retry mends (a bad option, another secret,
/// a name a live node holds). An etcd that does not answer yet is retried in the background
/// while the node serves its own sandboxes.
pub async fn start(
    engine: Arc<Engine>,
    paths: Paths,
    opts: ClusterOptions,
) -> std::io::Result<Arc<Node>> {
    let identity = match &opts.tls_dir {
        Some(d) => Some(forkbox_cluster::tls::Identity::load(d, &opts.node).map_err(io)?),
        None => None,
    };
    let node_tls = identity
        .as_ref()
        .map(tls::NodeTls::new)
        .transpose()
        .map_err(io)?;
    // With certificates, peers reach this node's listener over TLS on the same port.
    let advertise = match (&identity, opts.advertise.strip_prefix("http://")) {
        (Some(_), Some(rest)) => format!("https://{rest}"),
        _ => opts.advertise.clone(),
    };
    let cfg = Config {
        endpoints: opts.endpoints.clone(),
        node: opts.node.clone(),
        advertise,
        secret: opts.secret.clone(),
        lease_secs: opts.lease_secs,
        node_id: node_id(&paths)?,
        tls: identity,
    };
    cfg.validate().map_err(io)?;
    engine.set_node(&opts.node).map_err(io)?;
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    connector.set_nodelay(true);
    let ledger: BTreeSet<String> = std::fs::read(ledger_path(&paths))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let node = Arc::new(Node {
        name: opts.node.clone(),
        secret: opts.secret.clone(),
        engine,
        paths,
        cluster: Default::default(),
        http: HttpClient::builder(TokioExecutor::new()).build(connector),
        tls: node_tls,
        config: cfg.clone(),
        ledger: Mutex::new(ledger),
        pulls: Default::default(),
        builds: Default::default(),
    });
    match node.join(&cfg).await {
        Ok(()) => {}
        Err(e @ forkbox_cluster::Error::Unavailable { .. }) => {
            tracing::warn!("cluster: {e}; serving this node's own sandboxes, retrying")
        }
        Err(e) => return Err(io(e)),
    }
    tokio::spawn(node.clone().maintain(cfg));
    Ok(node)
}

impl Node {
    pub fn name(&self) -> &str {
        &self.name
    }

    async fn cluster(&self) -> Option<Cluster> {
        self.cluster.read().await.clone()
    }

    async fn join(&self, cfg: &Config) -> forkbox_cluster::Result<()> {
        let c = Cluster::connect(cfg.clone()).await?;
        let every = PUBLISH_EVERY.as_millis() as u64;
        forkbox_cluster::check_clock(
            forkbox_cluster::now_ms(),
            &c.nodes().await?,
            &cfg.node,
            every,
        )?;
        for change in c.sync_endpoints().await.unwrap_or_default() {
            tracing::info!("cluster: etcd endpoint {change} (from its member list)");
        }
        c.join(&self.record(cfg).await).await?;
        *self.cluster.write().await = Some(c.clone());
        self.reconcile(&c, true).await;
        // Said once the node serves as a member (a reader of this log may act on it).
        tracing::info!(
            "cluster: joined as node {} ({}), lease {} s",
            cfg.node,
            cfg.advertise,
            cfg.lease_secs
        );
        Ok(())
    }

    /// Keeps the lease, the record and the reconciliation going; joins again after a loss.
    async fn maintain(self: Arc<Self>, cfg: Config) {
        let mut publisher: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            let Some(c) = self.cluster().await else {
                tokio::time::sleep(PUBLISH_EVERY).await;
                if let Err(e) = self.join(&cfg).await {
                    tracing::warn!("cluster: {e}; retrying");
                }
                continue;
            };
            if publisher.is_none() {
                let me = self.clone();
                let cfg = cfg.clone();
                publisher = Some(tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(PUBLISH_EVERY).await;
                        if let Some(c) = me.cluster().await {
                            if let Err(e) = c.publish(&me.record(&cfg).await).await {
                                tracing::warn!("cluster: publishing this node's record: {e}");
                            }
                            me.reconcile(&c, false).await;
                            for change in c.sync_endpoints().await.unwrap_or_default() {
                                tracing::info!("cluster: etcd endpoint {change} (member list)");
                            }
                        }
                    }
                }));
            }
            if let Err(e) = c.keep_alive().await {
                tracing::warn!("cluster: {e}; registering again");
            }
            // The lease is gone or etcd is away: register anew (a new lease) once it answers.
            loop {
                match c.join(&self.record(&cfg).await).await {
                    Ok(_) => {
                        tracing::info!("cluster: registered again as {}", cfg.node);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("cluster: {e}; retrying");
                        tokio::time::sleep(PUBLISH_EVERY).await;
                    }
                }
            }
        }
    }

    /// What this node publishes: its capacity and holdings now.
    async fn record(&self, cfg: &Config) -> NodeRecord {
        let images = match self.engine.call(ops::ListImages {}).await {
            Ok(v) => v.into_iter().map(|i| i.reference).collect(),
            Err(_) => Vec::new(),
        };
        let snapshots = self
            .engine
            .call(ops::SnapshotNames {})
            .await
            .unwrap_or_default();
        let volumes = match self.engine.call(ops::ListVolumes {}).await {
            Ok(v) => v.into_iter().map(|v| v.name).collect(),
            Err(_) => Vec::new(),
        };
        let info = self.engine.call(ops::Info {}).await.ok();
        NodeRecord {
            volumes,
            name: cfg.node.clone(),
            node_id: cfg.node_id.clone(),
            advertise: cfg.advertise.clone(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            mem_free_mib: mem_available_mib(),
            disk_free_mib: disk_free_mib(self.paths.home()),
            sandboxes: info.as_ref().map_or(0, |i| i.sandboxes as u32),
            images,
            snapshots,
            accel: info
                .and_then(|i| i.accel)
                .map(|a| a.accel.to_string())
                .unwrap_or_default(),
            updated_unix_ms: forkbox_cluster::now_ms(),
            lease: 0,
            drained: false,
        }
    }

    fn save_ledger(&self, ledger: &BTreeSet<String>) {
        if let Ok(bytes) = serde_json::to_vec(ledger) {
            let tmp = ledger_path(&self.paths).with_extension("tmp");
            if std::fs::write(&tmp, bytes).is_ok() {
                let _ = std::fs::rename(&tmp, ledger_path(&self.paths));
            }
        }
    }

    fn ledger_edit(&self, f: impl FnOnce(&mut BTreeSet<String>)) {
        let Ok(mut l) = self.ledger.lock() else {
            return;
        };
        f(&mut l);
        self.save_ledger(&l);
    }

    fn in_ledger(&self, id: &str) -> bool {
        self.ledger.lock().is_ok_and(|l| l.contains(id))
    }

    /// Records a sandbox made here as this node's.
    async fn own(&self, c: &Cluster, view: &SandboxView) -> forkbox_cluster::Result<()> {
        c.own(view).await?;
        self.ledger_edit(|l| {
            l.insert(view.info.id.clone());
        });
        Ok(())
    }

    /// Observe both sides, compare, act: when the node (re)joins, a record of this node's whose
    /// sandbox is gone is marked lost (its host restarted under it); a record marked lost whose
    /// sandbox is here again is found; a sandbox whose record was removed elsewhere is stopped;
    /// a sandbox that was never recorded (made before this node joined) is recorded now. Only
    /// at a join is an absence taken as a loss: while the node runs, its engine is the truth,
    /// and a sandbox between two homes (being hibernated, say) is not lost.
    async fn reconcile(&self, c: &Cluster, joining: bool) {
        let Ok(local) = self
            .engine
            .call(ops::List {
                label: None,
                state: None,
            })
            .await
        else {
            return;
        };
        // The leader's records, never a lagging member's: this decides what to stop. Without
        // quorum, nothing is decided this round.
        let Ok(records) = c.owned_fresh().await else {
            return;
        };
        let mine: BTreeSet<String> = records
            .iter()
            .filter(|o| o.node == self.name)
            .map(|o| o.view.info.id.clone())
            .collect();
        let here: BTreeSet<String> = local.iter().map(|v| v.info.id.clone()).collect();
        for o in records.iter().filter(|o| o.node == self.name) {
            let id = &o.view.info.id;
            if here.contains(id) && o.lost {
                let _ = c.mark_lost(id, false).await;
            } else if joining && !here.contains(id) && !o.lost && !self.deleting(id) {
                let _ = c.mark_lost(id, true).await;
            } else if !joining && !here.contains(id) && self.deleting(id) {
                // Deleted here while etcd could not take the record's removal: remove it now.
                let _ = c.forget(id).await;
            }
        }
        for v in local.iter().filter(|v| !mine.contains(&v.info.id)) {
            let id = &v.info.id;
            if self.in_ledger(id) {
                // Recorded once and removed since (deleted through another node while this
                // one was away): the record is the truth.
                tracing::info!("{id}: its cluster record is gone; stopping it");
                let _ = self.engine.call(ops::Delete { id: id.clone() }).await;
                self.ledger_edit(|l| {
                    l.remove(id);
                });
            } else if let Err(e) = self.own(c, v).await {
                tracing::warn!("{id}: could not record it in the cluster: {e}");
            }
        }
    }

    /// A delete of this node's is under way (its record goes after the VM).
    fn deleting(&self, id: &str) -> bool {
        !self.in_ledger(id)
    }

    /// Whether this node has memory for `count` copies of `source` (a sandbox or snapshot of
    /// its own) made here: a fork that does not fit is refused, saying what is short and how
    /// to make the copies elsewhere, rather than half made.
    async fn room_for_copies(&self, source: &str, count: u64) -> Option<Response> {
        let memory = match self
            .engine
            .call(ops::Get {
                id: source.to_string(),
            })
            .await
        {
            Ok(v) => u64::from(v.info.memory_mib),
            Err(_) => match self
                .engine
                .call(ops::GetSnapshot {
                    name: source.to_string(),
                })
                .await
            {
                Ok(s) => u64::from(s.memory_mib),
                Err(_) => return None, // the engine says what is wrong with the source
            },
        };
        let record = NodeRecord {
            name: self.name.clone(),
            mem_free_mib: mem_available_mib(),
            disk_free_mib: disk_free_mib(self.paths.home()),
            ..NodeRecord::default()
        };
        let want = Want {
            pinned: Some(&self.name),
            memory_mib: memory,
            count: u32::try_from(count).unwrap_or(u32::MAX),
            ..Want::default()
        };
        placement::place(&[record], &want).err().map(|e| {
            refusal(
                Code::NoCapacity,
                format!(
                    "{e}; the copies of a sandbox are made on its node, {}, unless pinned to \
                     another (--node / node=: the snapshot is brought there)",
                    self.name
                ),
            )
        })
    }

    /// Rewrites this node's record now (after a change of what it holds).
    async fn publish_now(&self) {
        if let Some(c) = self.cluster().await {
            if let Err(e) = c.publish(&self.record(&self.config).await).await {
                tracing::warn!("cluster: publishing this node's record: {e}");
            }
        }
    }

    /// Sandboxes the TTL sweep removed: their records go too.
    pub async fn forget(&self, ids: &[String]) {
        let Some(c) = self.cluster().await else {
            return;
        };
        for id in ids {
            self.ledger_edit(|l| {
                l.remove(id);
            });
            if let Err(e) = c.forget(id).await {
                tracing::warn!("{id}: its cluster record stays: {e}");
            }
        }
    }

    /// Whether a token's SHA-256 is one of the cluster's (a member-local read: a revocation is
    /// seen as soon as that member applied it).
    pub async fn token_valid(&self, digest: &[u8; 32]) -> bool {
        let Some(c) = self.cluster().await else {
            return false;
        };
        let want = forkbox_engine::random::to_hex(digest);
        let holds = |all: &[forkbox_cluster::TokenRecord]| -> bool {
            all.iter()
                .fold(subtle::Choice::from(0), |acc, t| {
                    use subtle::ConstantTimeEq;
                    acc | t.sha256.as_bytes().ct_eq(want.as_bytes())
                })
                .into()
        };
        // This member's copy first; a miss is asked of the leader (a token made a moment ago
        // on another node may not have reached this member yet).
        match c.tokens().await {
            Ok(all) if holds(&all) => true,
            Ok(_) => c.tokens_fresh().await.is_ok_and(|all| holds(&all)),
            Err(e) => {
                tracing::warn!("cluster tokens unreadable: {e}");
                false
            }
        }
    }

    /// Ends this node's lease (a clean stop).
    pub async fn leave(&self) {
        if let Some(c) = self.cluster().await {
            c.leave().await;
        }
    }

    fn unavailable(e: impl std::fmt::Display) -> Response {
        refusal(Code::ClusterUnavailable, e.to_string())
    }

    async fn quorum(&self) -> Result<Cluster, Response> {
        let Some(c) = self.cluster().await else {
            return Err(Self::unavailable(
                "this node has not reached etcd yet: creates, forks and deletes wait for it",
            ));
        };
        c.require_quorum().await.map_err(Self::unavailable)?;
        Ok(c)
    }

    /// The record of the live node that owns sandbox `id`, when that is another node (a
    /// preview opened here is carried there; `None` when it runs here or no live node owns
    /// it).
    pub async fn owner_elsewhere(&self, id: &str) -> Option<NodeRecord> {
        if self.engine.has(id).await {
            return None;
        }
        let c = self.cluster().await?;
        let (owner, live) = tokio::try_join!(c.owner(id), c.nodes()).ok()?;
        let owner = owner.filter(|o| o.node != self.name)?;
        live.into_iter().find(|n| n.name == owner.node)
    }

    /// What this node's TCP listener takes peers' TLS connections with (None without
    /// certificates).
    pub fn tls_config(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.tls.as_ref().map(tls::NodeTls::server_config)
    }

    /// A byte stream to `target`'s listener: over mutual TLS when this node has a certificate.
    pub async fn dial(
        &self,
        target: &NodeRecord,
    ) -> Result<Box<dyn crate::listen::Stream>, String> {
        let uri = target.advertise.parse::<Uri>().map_err(|_| {
            format!(
                "node {} advertises {:?}, not a URL",
                target.name, target.advertise
            )
        })?;
        let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
        self.scheme_agrees(target)?;
        let dial = async {
            match &self.tls {
                Some(t) => t
                    .dial(&target.name, &authority)
                    .await
                    .map(|s| Box::new(s) as Box<dyn crate::listen::Stream>),
                None => tokio::net::TcpStream::connect(&authority)
                    .await
                    .map(|s| Box::new(s) as Box<dyn crate::listen::Stream>),
            }
        };
        tokio::time::timeout(Duration::from_secs(5), dial)
            .await
            .map_err(|_| std::io::Error::other("timed out"))
            .and_then(|r| r)
            .map_err(|e| {
                format!(
                    "node {} ({}) did not answer: {e}",
                    target.name, target.advertise
                )
            })
    }

    /// Refuses a call between a node with certificates and one without (or the other way):
    /// nothing goes between them in clear.
    fn scheme_agrees(&self, target: &NodeRecord) -> Result<(), String> {
        let https = target.advertise.starts_with("https://");
        match (self.tls.is_some(), https) {
            (true, false) => Err(format!(
                "node {} runs without mutual TLS (it advertises {}): this node calls its peers \
                 only over TLS; give {} --cluster-tls with a certificate of the cluster CA",
                target.name, target.advertise, target.name
            )),
            (false, true) => Err(format!(
                "node {} speaks mutual TLS (it advertises {}): give this node --cluster-tls \
                 with a certificate of the cluster CA",
                target.name, target.advertise
            )),
            _ => Ok(()),
        }
    }

    /// Whether peers must call this node over mutual TLS.
    pub fn requires_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The secret every node of this cluster shares.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Sends `req` to `target` as this node: signed, without the user's credentials.
    async fn forward(&self, target: &NodeRecord, req: Request) -> Response {
        let (mut parts, body) = req.into_parts();
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let url = format!("{}{pq}", target.advertise.trim_end_matches('/'));
        let Ok(uri) = url.parse::<Uri>() else {
            return refusal(
                Code::Internal,
                format!(
                    "node {} advertises {:?}, not a URL",
                    target.name, target.advertise
                ),
            );
        };
        parts.uri = uri;
        parts.headers.remove(header::AUTHORIZATION);
        parts.headers.remove(header::HOST);
        let sig = node_auth::sign(
            &self.secret,
            &self.name,
            forkbox_cluster::now_ms(),
            parts.method.as_str(),
            &pq,
        );
        match HeaderValue::from_str(&sig) {
            Ok(v) => parts.headers.insert(node_auth::HEADER, v),
            Err(_) => return refusal(Code::Internal, "a node signature is not a header value"),
        };
        if let Err(e) = self.scheme_agrees(target) {
            return refusal(Code::NodeUnreachable, e);
        }
        let req = Request::from_parts(parts, body);
        let sent = match &self.tls {
            Some(t) => match t.client(&target.name) {
                Ok(c) => c.request(req).await,
                Err(e) => return refusal(Code::Internal, e),
            },
            None => self.http.request(req).await,
        };
        match sent {
            Ok(r) => r.map(Body::new),
            Err(e) => refusal(
                Code::NodeUnreachable,
                format!(
                    "node {} ({}) did not answer: {}",
                    target.name,
                    target.advertise,
                    tls::causes(&e)
                ),
            ),
        }
    }

    /// A signed call of this node's to `target`: the reply's bytes, or why not (its status
    /// and the start of its body for an answer that is not a success).
    async fn peer_call(
        &self,
        target: &NodeRecord,
        method: Method,
        pq: &str,
        body: Vec<u8>,
    ) -> Result<axum::body::Bytes, String> {
        let req = Request::builder()
            .method(method)
            .uri(pq)
            .body(Body::from(body))
            .map_err(|e| e.to_string())?;
        let r = self.forward(target, req).await;
        let status = r.status();
        let bytes = http_body_util::Limited::new(r.into_body(), MAX_PEER_REPLY)
            .collect()
            .await
            .map_err(|e| format!("the reply broke off or passed {MAX_PEER_REPLY} bytes: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "{status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            ));
        }
        Ok(bytes)
    }

    /// A node's `GET` of `pq`, parsed.
    async fn fetch<T: serde::de::DeserializeOwned>(
        &self,
        target: &NodeRecord,
        pq: &str,
    ) -> Result<T, String> {
        let bytes = self.peer_call(target, Method::GET, pq, Vec::new()).await?;
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    }
}

fn mem_available_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

fn disk_free_mib(home: &std::path::Path) -> u64 {
    nix::sys::statvfs::statvfs(home)
        .map(|s| (s.blocks_available() * s.fragment_size()) >> 20)
        .unwrap_or(0)
}
