//! The one way into the engine: each operation a type of its own ([`ops`]), tied to its reply,
//! carried out by [`Engine::call`]. The HTTP server turns each request into one, the CLI's
//! in-process engine (image builds without a daemon, `forkbox run`) calls the same, and every
//! client of the daemon (the CLI's sandbox commands, the Rust client, the SDKs, the MCP server)
//! reaches it through the server. The request and reply types are `forkbox-api`'s, re-exported
//! here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::error::SandboxError;
use crate::image::ImageRef;
use crate::paths::Paths;
use crate::pool::Taken;
use crate::sandbox::{Sandbox, SandboxConfig};

mod cells;
mod commands;
mod error;
mod idle;
mod lifecycle;
mod migrations;
pub mod ops;
mod ports;
mod request;
mod store_ops;
mod transfer;
mod volumes;

pub use transfer::MAX_CHUNKS_PER_CALL;

pub use error::{image_code, sandbox_code, EngineError};
pub use forkbox_api::*;
pub use ops::Operation;
pub use request::*;
pub use store_ops::up_to_date;

/// Commands whose output a sandbox keeps at most (finished ones are dropped oldest first).
pub const KEEP_COMMANDS: usize = 64;

struct Entry {
    commands: std::sync::Mutex<HashMap<String, Arc<crate::commands::CommandLog>>>,
    next_command: std::sync::atomic::AtomicU64,
    sandbox: Arc<Sandbox>,
    labels: BTreeMap<String, String>,
    created_unix: u64,
    expires_unix: Option<u64>,
    from_pool: bool,
    life: Life,
    /// Its port forwards (their listeners end with it, and sleep with it when use wakes it).
    ports: std::sync::Mutex<Vec<ports::Forward>>,
    /// Held while its code server is being started (one start at a time).
    code_start: Arc<tokio::sync::Mutex<()>>,
}

/// What a sandbox does by itself: what its TTL does when it passes, whether it sleeps when
/// idle, and whether use wakes it while it sleeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Life {
    ttl_action: TtlAction,
    idle: Option<IdlePolicy>,
    wake_on_use: bool,
}

impl Life {
    /// A request's: the idle policy checked, waking on use by default when it has one.
    fn asked(
        ttl_action: Option<TtlAction>,
        idle: Option<IdlePolicy>,
        wake_on_use: Option<bool>,
    ) -> Result<Life, EngineError> {
        let idle = idle
            .map(IdlePolicy::checked)
            .transpose()
            .map_err(|e| EngineError::BadRequest(e.0))?;
        Ok(Life {
            ttl_action: ttl_action.unwrap_or_default(),
            idle,
            wake_on_use: wake_on_use.unwrap_or(idle.is_some()),
        })
    }

    /// A record's (a sandbox taken over, or waking).
    fn of(record: &crate::runstate::DaemonRecord) -> Life {
        Life {
            ttl_action: record.ttl_action,
            idle: record.idle,
            wake_on_use: record.wake_on_use,
        }
    }
}

/// A hibernated sandbox: its whole state is the snapshot `snapshot`.
struct Sleeper {
    info: SandboxInfo,
    record: crate::runstate::DaemonRecord,
    snapshot: String,
    created_unix: u64,
    /// Its secrets, held in memory while it sleeps (never in its snapshot).
    secrets: Option<Arc<crate::secrets::Secrets>>,
    /// The port forwards of a sandbox that use wakes: still listening, a connection wakes it.
    ports: Vec<ports::Forward>,
    /// Its commands' logs and the number of the last, back with it when it wakes.
    commands: (HashMap<String, Arc<crate::commands::CommandLog>>, u64),
}

impl Drop for Sleeper {
    /// A sleeper that goes without waking (removed, or woken from its disk alone): the
    /// commands that slept with it end.
    fn drop(&mut self) {
        self.commands.0.values().for_each(|log| log.release());
    }
}

impl Sleeper {
    fn view(&self, node: Option<&String>) -> SandboxView {
        SandboxView {
            // No VM while it sleeps.
            info: SandboxInfo {
                qemu_pid: 0,
                ..self.info.clone()
            },
            labels: self.record.labels.clone(),
            created_unix: self.created_unix,
            expires_unix: self.record.expires_unix,
            from_pool: false,
            state: if self.record.wake_on_use {
                SandboxState::Sleeping
            } else {
                SandboxState::Hibernated
            },
            failure: None,
            ttl_action: self.record.ttl_action,
            idle: self.record.idle,
            wake_on_use: self.record.wake_on_use,
            network: self.record.network.clone(),
            node: node.cloned(),
            transfer: None,
            secrets: self.secrets.as_ref().map(|s| s.views()).unwrap_or_default(),
            network_log: Vec::new(),
        }
    }
}

impl Entry {
    fn new(
        sandbox: Arc<Sandbox>,
        labels: BTreeMap<String, String>,
        created_unix: u64,
        expires_unix: Option<u64>,
        from_pool: bool,
        life: Life,
    ) -> Entry {
        Entry {
            commands: Default::default(),
            next_command: Default::default(),
            sandbox,
            labels,
            created_unix,
            expires_unix,
            from_pool,
            life,
            ports: Default::default(),
            code_start: Default::default(),
        }
    }

    fn record(&self) -> Result<crate::runstate::DaemonRecord, EngineError> {
        let info = serde_json::to_value(self.sandbox.info()).map_err(|e| {
            EngineError::Internal(format!("a sandbox record that does not serialize: {e}"))
        })?;
        Ok(crate::runstate::DaemonRecord {
            info,
            labels: self.labels.clone(),
            expires_unix: self.expires_unix,
            ttl_action: self.life.ttl_action,
            created_unix: self.created_unix,
            network: self.sandbox.network(),
            idle: self.life.idle,
            wake_on_use: self.life.wake_on_use,
            without_memory: None,
        })
    }

    /// Puts the sandbox in the daemon's state database (durable when this returns), then
    /// marks its run record as the daemon's. Without a database (an in-process engine), the
    /// sandbox lives only as long as this process.
    fn persist(&self, db: Option<&crate::state::StateDb>) -> Result<(), EngineError> {
        let Some(db) = db else {
            return Ok(());
        };
        db.put(&self.sandbox.info().id, &self.record()?)?;
        self.sandbox.set_daemon_owned(true)?;
        Ok(())
    }

    fn view(&self, node: Option<&String>) -> SandboxView {
        let failure = self.sandbox.client().failure();
        SandboxView {
            info: self.sandbox.info().clone(),
            labels: self.labels.clone(),
            created_unix: self.created_unix,
            expires_unix: self.expires_unix,
            from_pool: self.from_pool,
            state: if failure.is_some() {
                SandboxState::Failed
            } else if self.sandbox.check_disk_held() {
                SandboxState::DiskFull
            } else {
                SandboxState::Running
            },
            failure,
            ttl_action: self.life.ttl_action,
            idle: self.life.idle,
            wake_on_use: self.life.wake_on_use,
            network: self.sandbox.network(),
            node: node.cloned(),
            transfer: None,
            secrets: self
                .sandbox
                .secrets()
                .map(|s| s.views())
                .unwrap_or_default(),
            network_log: self.sandbox.client().net.notes(),
        }
    }
}

/// Long-lived sandboxes, owned by one process (the daemon).
pub struct Engine {
    paths: Paths,
    sandboxes: tokio::sync::RwLock<HashMap<String, Entry>>,
    metrics: crate::metrics::Metrics,
    pool: crate::pool::Pool,
    sleepers: tokio::sync::RwLock<HashMap<String, Sleeper>>,
    /// The daemon's state database; none for an engine that lives only in its process.
    db: Option<Arc<crate::state::StateDb>>,
    /// Its VMs die with the thread that started them (an engine of a one-shot command such
    /// as `forkbox run`, on one thread); a daemon's outlive any one request.
    vms_die_with_thread: bool,
    /// Its node's name in a cluster, set once when the daemon joins one: every view says it.
    node: std::sync::OnceLock<String>,
    /// What this node told other nodes of its snapshots' chunks.
    served: transfer::Served,
    /// Held (read) while a snapshot is assembled from chunks, (write) while `objects/` is swept.
    assembling: tokio::sync::RwLock<()>,
    /// Moves on with every change an operation or the sweep makes.
    changes: Changes,
    /// Runs of `forkbox migrate` that registered here.
    migrations: migrations::Migrations,
    /// Held per sandbox while it goes to sleep, wakes, hibernates or resumes.
    transitions: idle::Transitions,
    /// The views of sandboxes between the running and sleeping maps (set before one leaves
    /// one map, cleared after it is in the other), so a listing always shows them.
    between: std::sync::Mutex<HashMap<String, SandboxView>>,
    /// This engine as its daemon holds it ([`Engine::bind`]): what a port forward of a
    /// sleeping sandbox wakes it through.
    me: std::sync::OnceLock<std::sync::Weak<Engine>>,
    /// The home's package cache, opened when the first sandbox is made (none: turned off).
    packages: std::sync::OnceLock<Option<Arc<crate::packages::PackageCache>>>,
}

/// A counter that moves on with every change to what the engine holds (an operation that is
/// not marked `[keeps]`, a TTL that ran out): what a live view (the console's event stream)
/// waits on, instead of asking again and again.
struct Changes(tokio::sync::watch::Sender<u64>);

impl Default for Changes {
    fn default() -> Self {
        Changes(tokio::sync::watch::channel(0).0)
    }
}

impl Changes {
    fn bump(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Engine {
    pub fn new(paths: Paths) -> Engine {
        Engine {
            paths,
            sandboxes: Default::default(),
            metrics: Default::default(),
            pool: crate::pool::Pool::new(crate::pool::size_from_env()),
            sleepers: Default::default(),
            db: None,
            vms_die_with_thread: false,
            node: std::sync::OnceLock::new(),
            served: Default::default(),
            assembling: Default::default(),
            changes: Default::default(),
            migrations: Default::default(),
            transitions: Default::default(),
            between: Default::default(),
            me: std::sync::OnceLock::new(),
            packages: std::sync::OnceLock::new(),
        }
    }

    /// The home's package cache (`FORKBOX_PACKAGE_CACHE` and its kin; see
    /// [`crate::packages`]), opened the first time a sandbox is made.
    pub fn packages(&self) -> Result<Option<Arc<crate::packages::PackageCache>>, EngineError> {
        if let Some(p) = self.packages.get() {
            return Ok(p.clone());
        }
        let opened = match crate::packages::Settings::from_env().map_err(EngineError::BadRequest)? {
            None => None,
            // Nothing to verify a registry against: its connections are tunnelled as they are.
            Some(_) if crate::net::host_ca_bundle().is_none() => {
                tracing::warn!(
                    "the package cache is off: this host has no CA bundle to verify registries \
                     against (install ca-certificates, or set SSL_CERT_FILE)"
                );
                None
            }
            Some(settings) => Some(
                crate::packages::PackageCache::open(&self.paths.package_cache(), settings)
                    .map_err(EngineError::Internal)?,
            ),
        };
        Ok(self.packages.get_or_init(|| opened).clone())
    }

    /// Tells the engine how its daemon holds it, so that a connection to a sleeping
    /// sandbox's forwarded port can wake it (without, forwards end when it sleeps).
    pub fn bind(self: &Arc<Self>) {
        let _ = self.me.set(Arc::downgrade(self));
    }

    /// A receiver that sees a new value after each change to what this engine holds.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.0.subscribe()
    }

    /// Says that what this engine holds changed outside an operation.
    pub(crate) fn changed(&self) {
        self.changes.bump();
    }

    /// The daemon's engine: what it reports created is in `state.db` in forkbox's home, and a
    /// daemon started again takes it over (`adopt_all`).
    pub fn durable(paths: Paths) -> Result<Engine, EngineError> {
        std::fs::create_dir_all(paths.home())
            .map_err(|e| EngineError::Sandbox(SandboxError::io("create forkbox's home", e)))?;
        let db = crate::state::StateDb::open(&paths.home().join("state.db"))?;
        Ok(Engine {
            db: Some(Arc::new(db)),
            ..Engine::new(paths)
        })
    }

    /// An engine with no warm pool and nothing recorded for a daemon: the CLI's image
    /// builds, lists and removals without a daemon.
    /// Names this engine's node in a cluster: every view it gives says `node`. Once; a second
    /// name is refused.
    pub fn set_node(&self, name: &str) -> Result<(), EngineError> {
        match self.node.set(name.to_string()) {
            Ok(()) => {
                self.metrics.label_node(name);
                Ok(())
            }
            Err(_) if self.node.get().map(String::as_str) == Some(name) => Ok(()),
            Err(_) => Err(EngineError::BadRequest(format!(
                "this engine is node {:?} already",
                self.node.get().map(String::as_str).unwrap_or_default()
            ))),
        }
    }

    /// A request pinned to a node must have reached that node: a daemon outside a cluster, or
    /// another node, refuses it rather than place it silently elsewhere.
    fn pinned_here(&self, pinned: Option<&str>) -> Result<(), EngineError> {
        match (pinned, self.node()) {
            (None, _) => Ok(()),
            (Some(p), Some(me)) if p == me => Ok(()),
            (Some(p), Some(me)) => Err(EngineError::BadRequest(format!(
                "node {p:?} was asked for, and this is node {me}"
            ))),
            (Some(p), None) => Err(EngineError::BadRequest(format!(
                "node {p:?} was asked for, and this daemon is not in a cluster (started without \
                 --cluster): leave out the node"
            ))),
        }
    }

    /// Whether sandbox `id` is this engine's (running or hibernated): a map look-up, no view.
    pub async fn has(&self, id: &str) -> bool {
        self.sandboxes.read().await.contains_key(id) || self.sleepers.read().await.contains_key(id)
    }

    /// Its node's name in a cluster.
    pub fn node(&self) -> Option<&str> {
        self.node.get().map(String::as_str)
    }

    pub fn private(paths: Paths) -> Engine {
        Engine {
            pool: crate::pool::Pool::new(0),
            ..Engine::new(paths)
        }
    }

    /// The engine of one run in this process (`forkbox run` without a daemon, `forkbox
    /// migrate`): no warm pool, nothing recorded for a daemon, and every VM dies with the
    /// thread that started it, so a process killed outright leaves no VM behind. Call it from
    /// threads that live as long as the sandboxes should (a runtime's own, not a blocking
    /// pool's).
    pub fn one_shot(paths: Paths) -> Engine {
        Engine {
            vms_die_with_thread: true,
            ..Engine::private(paths)
        }
    }

    pub fn paths(&self) -> &Paths {
        &self.paths
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// Stops the pooled sandboxes of configurations nobody created for a while; how many.
    pub async fn shrink_pool(&self) -> usize {
        self.pool.shrink_idle().await
    }

    /// Samples every sandbox's VM for CPU and memory accounting; `interval_s` since the last.
    pub async fn sample(&self, interval_s: f64) {
        for (id, e) in self.sandboxes.read().await.iter() {
            self.metrics.sample(
                id,
                e.sandbox.info().qemu_pid,
                interval_s,
                e.sandbox.client().net.counts(),
            );
        }
        if let Some(Some(cache)) = self.packages.get() {
            let c = cache.counts();
            let answers = [
                ("hit", c.hits),
                ("revalidated", c.revalidated),
                ("fetched", c.fetched),
                ("passed", c.passed),
            ];
            self.metrics.package_cache(&answers, cache.size().0);
        }
    }

    async fn removed(&self, entry: Entry) {
        let id = entry.sandbox.info().id.clone();
        self.forget_transition(&id);
        Engine::end_ports(&entry.ports).await;
        entry.sandbox.destroy().await;
        self.release_volumes(entry.sandbox.info());
        if let Some(db) = &self.db {
            if let Err(e) = db.remove(&id) {
                tracing::warn!("{id}: deleted, but its record stays in the state database: {e}");
            }
        }
        self.metrics.sandboxes.dec();
        self.metrics.forget(&id);
        // A snapshot made only to fork a sandbox goes with its last copy.
        let origin = entry.sandbox.info().origin_snapshot().map(str::to_string);
        self.drop_unused_auto(origin).await;
    }

    /// Removes the snapshots forkbox made for itself (a fork's, a hibernation's) that nothing
    /// uses any more, from `origin` up its chain of parents: a copy that slept and woke runs on
    /// its hibernation's snapshot, whose parent is its fork's; both go with it. One that a
    /// sandbox (running or asleep) or a later snapshot still needs stays, and so do its parents.
    async fn drop_unused_auto(&self, mut origin: Option<String>) {
        let store = crate::snapshot::SnapshotStore::new(&self.paths);
        let mut dropped = false;
        while let Some(name) = origin.take() {
            let auto =
                name.starts_with(AUTO_SNAPSHOT) || name.starts_with(crate::snapshot::HIBERNATION);
            let asleep = self
                .sleepers
                .read()
                .await
                .values()
                .any(|s| s.snapshot == name);
            if !auto || asleep || !self.snapshot_users(&name).await.is_empty() {
                break;
            }
            let parent = store.get(&name).ok().and_then(|s| s.meta.parent.clone());
            // Refused while a snapshot depends on it.
            if store.remove(&name, &[]).is_err() {
                break;
            }
            dropped = true;
            origin = parent;
        }
        if dropped {
            self.sweep_objects().await;
        }
    }

    /// Live sandboxes restored from snapshot `name`.
    async fn snapshot_users(&self, name: &str) -> Vec<String> {
        self.sandboxes
            .read()
            .await
            .values()
            .filter(|e| e.sandbox.info().origin_snapshot() == Some(name))
            .map(|e| e.sandbox.info().id.clone())
            .collect()
    }

    async fn snapshot(
        &self,
        id: &str,
        r: SnapshotRequest,
    ) -> Result<crate::snapshot::Snapshot, EngineError> {
        let (sb, _) = self.get(id).await?;
        let name = match r.name {
            Some(n) => n,
            None => format!("{id}-{}", random_suffix()?),
        };
        if r.stay_paused && !sb.info().volumes.is_empty() {
            return Err(EngineError::BadRequest(format!(
                "{id} has volumes mounted, and a snapshot holds none: they are unmounted while it is saved and mounted again after, which a sandbox that stays paused cannot do; leave out stay_paused"
            )));
        }
        without_volumes(&sb, sb.snapshot(&self.paths, &name, r.stay_paused, true)).await
    }

    /// Saves sandbox `source` for copies of it: a snapshot that goes with its last copy (and
    /// is not synced to the disk, see `snapshot::publish`).
    async fn save_for_copies(
        &self,
        source: &str,
    ) -> Result<crate::snapshot::Snapshot, EngineError> {
        let (sb, _) = self.get(source).await?;
        let name = format!("{AUTO_SNAPSHOT}{source}-{}", random_suffix()?);
        without_volumes(&sb, sb.snapshot(&self.paths, &name, false, false)).await
    }

    /// The network policy of copies of `source` (a sandbox's own when the request names
    /// none), checked, and whether `source` is a running sandbox.
    async fn fork_network(
        &self,
        source: &str,
        r: &ForkRequest,
    ) -> Result<(NetworkPolicy, bool), EngineError> {
        let source_network = self
            .sandboxes
            .read()
            .await
            .get(source)
            .map(|e| e.sandbox.network());
        let is_sandbox = source_network.is_some();
        validate_secrets(&r.secrets).map_err(|e| EngineError::BadRequest(e.to_string()))?;
        let network = with_secret_hosts(
            r.network.clone().or(source_network).unwrap_or_default(),
            &r.secrets,
        );
        network
            .validate()
            .map_err(|e| EngineError::BadRequest(format!("network: {e}")))?;
        Ok((network, is_sandbox))
    }

    async fn fork(&self, source: &str, r: ForkRequest) -> Result<ForkResult, EngineError> {
        within("count", r.count, 1..=MAX_FORK)?;
        self.pinned_here(r.node.as_deref())?;
        let life = Life::asked(None, r.idle, r.wake_on_use)?;
        let started = std::time::Instant::now();
        // A sleeping source that use wakes is woken: a fork uses it.
        self.awake(source).await?;
        let store = crate::snapshot::SnapshotStore::new(&self.paths);
        let (network, is_sandbox) = self.fork_network(source, &r).await?;
        let (copy_volumes, notes) = self.fork_volumes(source, &r).await?;
        let (snap, pause_ms) = if is_sandbox {
            let s = self.save_for_copies(source).await?;
            let pause = s.meta.pause_ms;
            (s, pause)
        } else {
            match store.get(source) {
                Ok(s) => (s, None),
                Err(crate::snapshot::SnapshotError::NotFound(_))
                | Err(crate::snapshot::SnapshotError::BadName(_)) => {
                    return Err(EngineError::BadRequest(format!(
                        "{source} is neither a sandbox nor a snapshot"
                    )))
                }
                Err(e) => return Err(e.into()),
            }
        };
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..r.count {
            let req = CreateRequest {
                labels: r.labels.clone(),
                ttl_seconds: r.ttl_seconds,
                max_processes: r.max_processes,
                ..Default::default()
            };
            let (paths, snap) = (self.paths.clone(), snap.clone());
            // The copy's network is set as it is restored, before it is handed out.
            let cfg = SandboxConfig {
                network: network.clone(),
                volumes: copy_volumes.clone(),
                ..self.config(&req)?
            };
            let secrets = r.secrets.clone();
            tasks.spawn(async move {
                let origin = format!("snapshot:{}", snap.meta.name);
                let sb =
                    Sandbox::restore(&paths, &snap, origin, &cfg, std::time::Instant::now(), None)
                        .await?;
                // Each copy its own placeholders and CA; none carries the source's secrets.
                if let Err(e) = give_secrets(&sb, &secrets).await {
                    discard(&paths, &sb).await;
                    return Err(e);
                }
                Ok::<_, EngineError>(sb)
            });
        }
        let mut sandboxes = Vec::new();
        let mut failed = Vec::new();
        let expires_unix = r.ttl_seconds.map(deadline).transpose()?;
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(Ok(sb)) => match self
                    .register(Arc::new(sb), r.labels.clone(), expires_unix, false, life)
                    .await
                {
                    Ok(v) => sandboxes.push(v),
                    Err(e) => failed.push(e.to_string()),
                },
                Ok(Err(e)) => failed.push(e.to_string()),
                Err(e) => failed.push(format!("the copy's task failed: {e}")),
            }
        }
        if sandboxes.is_empty() && is_sandbox && snap.meta.name.starts_with(AUTO_SNAPSHOT) {
            let _ = store.remove(&snap.meta.name, &[]);
        }
        sandboxes.sort_by(|a, b| a.info.id.cmp(&b.info.id));
        Ok(ForkResult {
            snapshot: snap.meta.name.clone(),
            pause_ms,
            sandboxes,
            failed,
            duration_ms: started.elapsed().as_millis() as u64,
            transfer: None,
            notes,
        })
    }

    fn added(&self) {
        self.metrics.sandboxes.inc();
    }

    /// Carries out `op`: the one way into the engine, whatever the front end.
    pub async fn call<O: Operation>(&self, op: O) -> Result<O::Reply, EngineError> {
        let reply = op.run(self).await;
        if O::CHANGES {
            self.changed();
        }
        reply
    }

    fn list_snapshots(&self) -> Vec<SnapshotMeta> {
        let all = crate::snapshot::SnapshotStore::new(&self.paths).list();
        let alone = crate::snapshot::chunks::held_alone(&self.paths, &all);
        all.into_iter()
            .map(|s| SnapshotMeta {
                held_alone_bytes: alone.get(&s.meta.name).copied(),
                ..s.meta
            })
            .collect()
    }

    fn snapshot_names(&self) -> Vec<String> {
        crate::snapshot::SnapshotStore::new(&self.paths)
            .list()
            .into_iter()
            .map(|s| s.meta.name)
            .collect()
    }

    fn get_snapshot(&self, name: &str) -> Result<SnapshotMeta, EngineError> {
        Ok(crate::snapshot::SnapshotStore::new(&self.paths)
            .get(name)?
            .meta)
    }

    /// A sandbox's view, hibernated or running; looking neither wakes it nor counts as a use.
    async fn view(&self, id: &str) -> Result<SandboxView, EngineError> {
        if let Some(e) = self.sandboxes.read().await.get(id) {
            return Ok(e.view(self.node.get()));
        }
        if let Some(s) = self.sleepers.read().await.get(id) {
            return Ok(s.view(self.node.get()));
        }
        self.between_view(id)
            .ok_or_else(|| EngineError::NoSuchSandbox(id.to_string()))
    }

    /// A new TTL, counted from now.
    async fn set_ttl(&self, id: &str, ttl_seconds: u64) -> Result<SandboxView, EngineError> {
        let expires = deadline(ttl_seconds)?;
        let mut map = self.sandboxes.write().await;
        let e = map
            .get_mut(id)
            .ok_or_else(|| EngineError::NoSuchSandbox(id.to_string()))?;
        e.expires_unix = Some(expires);
        e.persist(self.db.as_deref())?;
        Ok(e.view(self.node.get()))
    }

    /// Replaces a running sandbox's network policy (a sandbox with secrets keeps its own: their
    /// hosts and CA are part of it).
    async fn set_network(
        &self,
        id: &str,
        policy: NetworkPolicy,
    ) -> Result<SandboxView, EngineError> {
        let map = self.sandboxes.read().await;
        let Some(e) = map.get(id) else {
            if self.sleepers.read().await.contains_key(id) {
                return Err(EngineError::Hibernated(id.to_string()));
            }
            return Err(EngineError::NoSuchSandbox(id.to_string()));
        };
        if e.sandbox.secrets().is_some() {
            return Err(EngineError::Conflict(format!(
                "sandbox {id} has secrets, whose hosts are part of its network policy; it keeps \
                 its policy (make a new sandbox for another)"
            )));
        }
        e.sandbox.set_network(policy).await?;
        e.persist(self.db.as_deref())?;
        Ok(e.view(self.node.get()))
    }

    /// Deletes a snapshot no sandbox (running or hibernated in it) depends on.
    async fn delete_snapshot(&self, name: String) -> Result<Deleted, EngineError> {
        let mut users = self.snapshot_users(&name).await;
        for (id, s) in self.sleepers.read().await.iter() {
            if s.snapshot == name {
                users.push(format!("{id} (hibernated in it)"));
            }
        }
        crate::snapshot::SnapshotStore::new(&self.paths).remove(&name, &users)?;
        self.sweep_objects().await;
        Ok(Deleted { deleted: name })
    }

    /// Stops and removes a sandbox, or the snapshot a hibernated one sleeps in.
    async fn delete(&self, id: String) -> Result<Deleted, EngineError> {
        // One going to sleep or waking is deleted once it has.
        if self.between_view(&id).is_some() {
            let lock = self.transition(&id);
            drop(lock.lock().await);
        }
        if self.sleepers.read().await.contains_key(&id) {
            self.delete_sleeper(&id).await?;
            return Ok(Deleted { deleted: id });
        }
        let entry = self
            .sandboxes
            .write()
            .await
            .remove(&id)
            .ok_or(EngineError::NoSuchSandbox(id.clone()))?;
        self.removed(entry).await;
        Ok(Deleted { deleted: id })
    }

    /// A live sandbox, for the streaming transfers (archives) that carry bodies and so are not
    /// commands; refused in words, like an exec, while a full host disk holds it.
    pub async fn sandbox(&self, id: &str) -> Result<Arc<Sandbox>, EngineError> {
        let sb = self.get(id).await?.0;
        sb.check_usable()?;
        Ok(sb)
    }

    /// Sandboxes (hibernated ones too) with the label and in the state given, oldest first.
    async fn list(
        &self,
        label: Option<(String, String)>,
        state: Option<SandboxState>,
    ) -> Vec<SandboxView> {
        let labelled = |labels: &BTreeMap<String, String>| {
            label.as_ref().is_none_or(|(k, v)| labels.get(k) == Some(v))
        };
        let mut all: Vec<SandboxView> = self
            .sandboxes
            .read()
            .await
            .values()
            .filter(|e| labelled(&e.labels))
            .map(|e| e.view(self.node.get()))
            .collect();
        all.extend(
            self.sleepers
                .read()
                .await
                .values()
                .filter(|s| labelled(&s.record.labels))
                .map(|s| s.view(self.node.get())),
        );
        // Read last: one moving between the maps is in one of the three.
        let moving = self.between_views();
        let seen: std::collections::HashSet<String> =
            all.iter().map(|v| v.info.id.clone()).collect();
        all.extend(
            moving
                .into_iter()
                .filter(|v| !seen.contains(&v.info.id) && labelled(&v.labels)),
        );
        all.retain(|v| state.is_none_or(|s| v.state == s));
        all.sort_by(|a, b| (a.created_unix, &a.info.id).cmp(&(b.created_unix, &b.info.id)));
        all
    }

    /// A running sandbox and its view, woken first if it sleeps and use wakes it; the call
    /// counts as a use of it.
    async fn get(&self, id: &str) -> Result<(Arc<Sandbox>, SandboxView), EngineError> {
        // Twice: it may go to sleep between waking and being taken.
        for _ in 0..2 {
            if !self.awake(id).await? {
                if self.sleepers.read().await.contains_key(id) {
                    return Err(EngineError::Hibernated(id.to_string()));
                }
                return Err(EngineError::NoSuchSandbox(id.to_string()));
            }
            if let Some(e) = self.sandboxes.read().await.get(id) {
                e.sandbox.client().activity.touch();
                return Ok((e.sandbox.clone(), e.view(self.node.get())));
            }
        }
        Err(EngineError::NoSuchSandbox(id.to_string()))
    }

    /// The sandbox configuration a request asks for, checked.
    fn config(&self, r: &CreateRequest) -> Result<SandboxConfig, EngineError> {
        let mut cfg = SandboxConfig::default();
        if let Some(i) = &r.image {
            cfg.image = i
                .parse::<ImageRef>()
                .map_err(|e| EngineError::Sandbox(e.into()))?;
        }
        if let Some(c) = r.cpus {
            cfg.cpus = within("cpus", c, 1..=64)?;
        }
        if let Some(m) = r.memory_mib {
            cfg.memory_mib = within("memory_mib", m, 128..=65536)?;
        }
        cfg.accel = r.accel.unwrap_or_default();
        if let Some(p) = r.max_processes {
            cfg.max_procs = within("max_processes", p, 16..=1_000_000)?;
        }
        if let Some(g) = r.disk_gib {
            cfg.disk_mib = Some(within("disk_gib", g, 1..=2048)? as u64 * 1024);
        }
        cfg.volumes = volumes::slotted(&self.paths, &r.volumes)?;
        // The daemon outlives any one request; its VMs must not die with a request's thread.
        cfg.die_with_parent = self.vms_die_with_thread;
        cfg.packages = self.packages()?;
        Ok(cfg)
    }

    async fn create(&self, r: CreateRequest) -> Result<SandboxView, EngineError> {
        self.pinned_here(r.node.as_deref())?;
        let cfg = self.config(&r)?;
        let life = Life::asked(r.ttl_action, r.idle, r.wake_on_use)?;
        validate_secrets(&r.secrets).map_err(|e| EngineError::BadRequest(e.to_string()))?;
        let network = with_secret_hosts(r.network.clone().unwrap_or_default(), &r.secrets);
        network
            .validate()
            .map_err(|e| EngineError::BadRequest(format!("network: {e}")))?;
        let expires_unix = r.ttl_seconds.map(deadline).transpose()?;
        let started = std::time::Instant::now();
        let mut from_pool = false;
        let sandbox = match &r.snapshot {
            // The pool's sandboxes mount nothing.
            None if self.pool.size > 0 && cfg.volumes.is_empty() => {
                let key = crate::pool::key(&self.paths, &cfg)?;
                match self.pool.get(&key, &self.paths, &cfg) {
                    Taken::Ready(sb) => {
                        from_pool = true;
                        *sb
                    }
                    Taken::Coming(rx) => match rx.await {
                        Ok(sb) => sb,
                        Err(_) => Sandbox::create(&self.paths, &cfg).await?,
                    },
                    Taken::Miss => Sandbox::create(&self.paths, &cfg).await?,
                }
            }
            None => Sandbox::create(&self.paths, &cfg).await?,
            Some(name) => {
                if r.image.is_some() || r.cpus.is_some() || r.memory_mib.is_some() {
                    return Err(EngineError::BadRequest(
                        "a sandbox made from a snapshot has the snapshot's image, cpus and memory; leave them out".into(),
                    ));
                }
                let snap = crate::snapshot::SnapshotStore::new(&self.paths).get(name)?;
                Sandbox::restore(
                    &self.paths,
                    &snap,
                    format!("snapshot:{name}"),
                    &cfg,
                    started,
                    None,
                )
                .await?
            }
        };
        if let Err(e) = sandbox.set_network(network).await {
            discard(&self.paths, &sandbox).await;
            return Err(e.into());
        }
        if let Err(e) = give_secrets(&sandbox, &r.secrets).await {
            discard(&self.paths, &sandbox).await;
            return Err(e);
        }
        let view = self
            .register(Arc::new(sandbox), r.labels, expires_unix, from_pool, life)
            .await?;
        self.metrics
            .create_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(view)
    }

    /// Makes a new sandbox the daemon's: on disk before it is reported created, so a daemon
    /// that crashes from here on re-adopts it.
    async fn register(
        &self,
        sandbox: Arc<Sandbox>,
        labels: BTreeMap<String, String>,
        expires_unix: Option<u64>,
        from_pool: bool,
        life: Life,
    ) -> Result<SandboxView, EngineError> {
        let entry = Entry::new(sandbox, labels, now_unix(), expires_unix, from_pool, life);
        self.keep(entry).await
    }

    /// Makes `entry` the daemon's, as [`Engine::register`] does for a new one.
    async fn keep(&self, entry: Entry) -> Result<SandboxView, EngineError> {
        if let Err(e) = entry.persist(self.db.as_deref()) {
            discard(&self.paths, &entry.sandbox).await;
            return Err(e);
        }
        let view = entry.view(self.node.get());
        self.sandboxes
            .write()
            .await
            .insert(view.info.id.clone(), entry);
        self.added();
        Ok(view)
    }
}

/// `policy` allowing the hosts of `secrets` too (a policy that allows the internet already does).
fn with_secret_hosts(mut policy: NetworkPolicy, secrets: &[SecretSpec]) -> NetworkPolicy {
    if policy.internet {
        return policy;
    }
    for h in secrets.iter().flat_map(|s| &s.hosts) {
        if !policy.allow.contains(h) {
            policy.allow.push(h.clone());
        }
    }
    policy
}

/// Gives `sandbox` secrets made from `specs` (none when empty).
async fn give_secrets(sandbox: &Sandbox, specs: &[SecretSpec]) -> Result<(), EngineError> {
    if specs.is_empty() {
        return Ok(());
    }
    let secrets =
        crate::secrets::Secrets::new(&sandbox.info().id, specs).map_err(EngineError::Internal)?;
    sandbox.set_secrets(Arc::new(secrets)).await?;
    Ok(())
}

/// Stops a sandbox that was never handed out (or could not be kept), and gives back its
/// volumes.
async fn discard(paths: &Paths, sandbox: &Sandbox) {
    sandbox.destroy().await;
    volumes::release(paths, sandbox.info());
}

/// Runs `save` with the sandbox's volumes unmounted in its guest (a snapshot holds no volume),
/// and mounts them again after, whether it saved or not.
async fn without_volumes(
    sb: &Sandbox,
    save: impl std::future::Future<Output = Result<crate::snapshot::Snapshot, SandboxError>>,
) -> Result<crate::snapshot::Snapshot, EngineError> {
    sb.unmount_volumes().await?;
    let saved = save.await;
    let back = sb.remount_volumes().await;
    let snap = saved?;
    back?;
    Ok(snap)
}

/// Six random hex digits that tell apart names made for one sandbox.
fn random_suffix() -> Result<String, EngineError> {
    crate::random::hex(3).map_err(|e| SandboxError::io("draw a random name", e).into())
}

/// The longest TTL a sandbox may have: 30 days.
pub const MAX_TTL_SECS: u64 = 30 * 24 * 3600;

/// The absolute deadline for a TTL.
fn deadline(ttl_seconds: u64) -> Result<u64, EngineError> {
    if ttl_seconds == 0 || ttl_seconds > MAX_TTL_SECS {
        return Err(EngineError::BadRequest(format!(
            "ttl_seconds {ttl_seconds} is not between 1 and {MAX_TTL_SECS} (30 days)"
        )));
    }
    Ok(now_unix() + ttl_seconds)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn exec_requests_need_exactly_one_program() {
        assert!(exec_spec(ExecRequest {
            argv: Some(vec!["ls".into()]),
            ..Default::default()
        })
        .is_ok());
        assert!(exec_spec(ExecRequest {
            shell: Some("ls".into()),
            ..Default::default()
        })
        .is_ok());
        assert!(exec_spec(ExecRequest::default()).is_err());
        assert!(exec_spec(ExecRequest {
            argv: Some(vec![]),
            ..Default::default()
        })
        .is_err());
        assert!(exec_spec(ExecRequest {
            argv: Some(vec!["a".into()]),
            shell: Some("b".into()),
            ..Default::default()
        })
        .is_err());
        assert!(exec_spec(ExecRequest {
            shell: Some("x".into()),
            timeout_secs: Some(0),
            ..Default::default()
        })
        .is_err());
    }

    #[test]
    fn output_is_cut_at_the_cap() {
        let (s, t) = commands::cut(vec![b'a'; OUTPUT_CAP + 1]);
        assert!(t);
        assert_eq!(s.len(), OUTPUT_CAP);
        let (s, t) = commands::cut(b"ok".to_vec());
        assert_eq!((s.as_str(), t), ("ok", false));
    }
}
