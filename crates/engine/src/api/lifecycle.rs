//! A sandbox's life beyond one request: taken over after a daemon restart, hibernated and
//! resumed, expired at its TTL, stopped with the daemon.

use std::sync::Arc;

use super::*;

impl Engine {
    /// Takes over the sandboxes a daemon that died had reported created; those whose VM is gone
    /// are cleaned up. Returns the ids adopted.
    pub async fn adopt_all(&self) -> Vec<String> {
        let mut adopted = Vec::new();
        let Some(db) = &self.db else {
            return adopted;
        };
        let marked = crate::runstate::daemon_records(&self.paths);
        // Records a forkbox from before the state database kept in the run directory.
        for (_, r) in &marked {
            if let crate::runstate::DaemonMark::Legacy(rec) = &r.daemon {
                if matches!(db.get(&r.id), Ok(None)) {
                    if let Err(e) = db.put(&r.id, rec) {
                        tracing::warn!("{}: could not import its record: {e}", r.id);
                    }
                }
            }
        }
        let records = match db.all() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cannot read the state database: {e}");
                return adopted;
            }
        };
        for (id, rec) in records {
            let dir = self.paths.run().join(&id);
            match Sandbox::adopt(&self.paths, &dir, &rec).await {
                Some(sandbox) => {
                    let sandbox = Arc::new(sandbox);
                    let (sb, policy, who) = (sandbox.clone(), rec.network.clone(), id.clone());
                    let apply = async move {
                        if let Err(e) = sb.set_network(policy).await {
                            tracing::warn!(
                                "{who}: its network policy could not be applied ({e}); it stays off"
                            );
                        }
                    };
                    // A guest stopped by a full disk answers once it runs again.
                    if sandbox.check_disk_held() {
                        tokio::spawn(apply);
                    } else {
                        apply.await;
                    }
                    let life = Life::of(&rec);
                    let entry = Entry::new(
                        sandbox,
                        rec.labels,
                        rec.created_unix,
                        rec.expires_unix,
                        false,
                        life,
                    );
                    self.sandboxes.write().await.insert(id.clone(), entry);
                    self.added();
                    adopted.push(id);
                }
                None => {
                    tracing::warn!("{id}: its VM is gone; removing its files");
                    crate::runstate::kill_qemus_of(&dir);
                    crate::tree::discard_tree(&dir);
                    let _ = db.remove(&id);
                }
            }
        }
        // A run directory marked as the daemon's with no record is one whose delete was
        // interrupted: finish it.
        for (dir, r) in marked {
            if !self.sandboxes.read().await.contains_key(&r.id) {
                tracing::warn!("{}: not in the state database; removing its files", r.id);
                crate::runstate::kill_qemus_of(&dir);
                crate::tree::discard_tree(&dir);
            }
        }
        adopted.extend(self.adopt_sleepers().await);
        adopted
    }

    /// Takes over the hibernated (and sleeping) sandboxes: snapshots carrying their record.
    async fn adopt_sleepers(&self) -> Vec<String> {
        let mut adopted = Vec::new();
        for snap in crate::snapshot::SnapshotStore::new(&self.paths).list() {
            if let Some(record) = snap.meta.hibernated.clone() {
                let Ok(info) = serde_json::from_value::<SandboxInfo>(record.info.clone()) else {
                    continue;
                };
                let id = info.id.clone();
                if self.sandboxes.read().await.contains_key(&id) {
                    continue;
                }
                self.sleepers.write().await.insert(
                    id.clone(),
                    Sleeper {
                        info,
                        created_unix: record.created_unix,
                        record,
                        snapshot: snap.meta.name.clone(),
                        // A daemon that starts holds no secrets: they were in the memory of
                        // the one before.
                        secrets: None,
                        ports: Vec::new(),
                        commands: Default::default(),
                    },
                );
                adopted.push(id);
            }
        }
        adopted
    }

    /// Saves a running sandbox to disk under the same id and stops its VM; without `memory`,
    /// its files only (see [`Sandbox::boot_from_disk`]).
    pub(super) async fn hibernate(
        &self,
        id: &str,
        memory: bool,
    ) -> Result<SandboxView, EngineError> {
        let lock = self.transition(id);
        let _changing = lock.lock().await;
        match self.hibernate_now(id, None, memory).await? {
            Some(view) => Ok(view),
            None => Err(EngineError::Internal(format!("{id} was not hibernated"))),
        }
    }

    /// [`Engine::hibernate`] with the sandbox's transition held; with `idle_for`, only if
    /// nothing has used it for that long (checked once it is out of the running map, so no
    /// call can take it meanwhile): `None` when something had.
    pub(super) async fn hibernate_now(
        &self,
        id: &str,
        idle_for: Option<std::time::Duration>,
        memory: bool,
    ) -> Result<Option<SandboxView>, EngineError> {
        // Listed as what it becomes while it is saved.
        let going = self.sandboxes.read().await.get(id).map(|e| {
            let mut v = e.view(self.node.get());
            v.state = match e.life.wake_on_use {
                true => SandboxState::Sleeping,
                false => SandboxState::Hibernated,
            };
            v.info.qemu_pid = 0;
            v
        });
        if let Some(v) = going {
            self.set_between(id, v);
        }
        let r = self.hibernate_moving(id, idle_for, memory).await;
        self.clear_between(id);
        r
    }

    async fn hibernate_moving(
        &self,
        id: &str,
        idle_for: Option<std::time::Duration>,
        memory: bool,
    ) -> Result<Option<SandboxView>, EngineError> {
        let entry = self.sandboxes.write().await.remove(id);
        let Some(entry) = entry else {
            if self.sleepers.read().await.contains_key(id) {
                return Err(EngineError::Hibernated(id.to_string()));
            }
            return Err(EngineError::NoSuchSandbox(id.to_string()));
        };
        if idle_for.is_some_and(|d| entry.sandbox.client().idle_for() < d) {
            self.sandboxes.write().await.insert(id.to_string(), entry);
            return Ok(None);
        }
        let name = format!("{}{id}-{}", crate::snapshot::HIBERNATION, random_suffix()?);
        let record = match sleep_record(&entry, memory).await {
            Ok(r) => r,
            Err(e) => {
                self.sandboxes.write().await.insert(id.to_string(), entry);
                return Err(e);
            }
        };
        // Its commands sleep with it when its memory is kept: they wait for the connection
        // that wakes it rather than ending with this one.
        let held: Vec<Arc<crate::commands::CommandLog>> = match record.without_memory {
            Some(_) => Vec::new(),
            None => entry
                .commands
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .filter(|log| log.hold())
                .cloned()
                .collect(),
        };
        let saved = async {
            let mut snap = entry
                .sandbox
                .snapshot(&self.paths, &name, true, true)
                .await?;
            snap.meta.hibernated = Some(record.clone());
            crate::snapshot::rewrite_meta(&snap)?;
            Ok::<_, EngineError>(snap)
        }
        .await;
        let snap = match saved {
            Ok(s) => s,
            Err(e) => {
                // Still running (the save resumes it on failure): put it back.
                held.iter().for_each(|log| log.release());
                self.sandboxes.write().await.insert(id.to_string(), entry);
                if let Ok(s) = crate::snapshot::SnapshotStore::new(&self.paths).get(&name) {
                    let _ =
                        crate::snapshot::SnapshotStore::new(&self.paths).remove(&s.meta.name, &[]);
                }
                return Err(e);
            }
        };
        let info = entry.sandbox.info().clone();
        // A sandbox that use wakes keeps its port forwards listening: a connection wakes it.
        let ports = match entry.life.wake_on_use {
            true => std::mem::take(&mut *entry.ports.lock().unwrap_or_else(|p| p.into_inner())),
            false => Vec::new(),
        };
        // Its VM goes; its disks stay (the snapshot's chain holds them). From here its record
        // is the snapshot's.
        entry.sandbox.destroy().await;
        if let Some(db) = &self.db {
            if let Err(e) = db.remove(id) {
                tracing::warn!(
                    "{id}: hibernated, but its running record stays in the state database: {e}"
                );
            }
        }
        self.metrics.sandboxes.dec();
        self.metrics.forget(id);
        let sleeper = Sleeper {
            info,
            created_unix: record.created_unix,
            record,
            snapshot: snap.meta.name.clone(),
            secrets: entry.sandbox.secrets(),
            ports,
            commands: (
                std::mem::take(&mut *entry.commands.lock().unwrap_or_else(|p| p.into_inner())),
                entry
                    .next_command
                    .load(std::sync::atomic::Ordering::Relaxed),
            ),
        };
        let view = sleeper.view(self.node.get());
        self.sleepers.write().await.insert(id.to_string(), sleeper);
        Ok(Some(view))
    }

    /// Brings a hibernated sandbox back, with its processes, under its id.
    pub(super) async fn resume(&self, id: &str) -> Result<SandboxView, EngineError> {
        let lock = self.transition(id);
        let _changing = lock.lock().await;
        self.resume_now(id).await
    }

    /// [`Engine::resume`] with the sandbox's transition held.
    pub(super) async fn resume_now(&self, id: &str) -> Result<SandboxView, EngineError> {
        // Listed as it was until it runs.
        let sleeping = self
            .sleepers
            .read()
            .await
            .get(id)
            .map(|s| s.view(self.node.get()));
        if let Some(v) = sleeping {
            self.set_between(id, v);
        }
        let r = self.resume_moving(id).await;
        self.clear_between(id);
        r
    }

    async fn resume_moving(&self, id: &str) -> Result<SandboxView, EngineError> {
        let mut sleeper = match self.sleepers.write().await.remove(id) {
            Some(s) => s,
            None if self.sandboxes.read().await.contains_key(id) => {
                return Err(EngineError::NotHibernated(id.to_string()))
            }
            None => return Err(EngineError::NoSuchSandbox(id.to_string())),
        };
        let store = crate::snapshot::SnapshotStore::new(&self.paths);
        let restored = async {
            let mut snap = store.get(&sleeper.snapshot)?;
            let cfg = SandboxConfig {
                max_procs: sleeper.info.max_procs.max(16),
                die_with_parent: false,
                // Its guest has them mounted, and its holds stood while it slept.
                volumes: sleeper.info.volumes.clone(),
                volumes_in_guest: true,
                packages: self.packages()?,
                ..SandboxConfig::default()
            };
            let sb = match &sleeper.record.without_memory {
                // Paused without its memory: booted from its disk.
                Some(machine_id) => {
                    Sandbox::boot_from_disk(&self.paths, &snap, &cfg, id.to_string(), machine_id)
                        .await?
                }
                None => {
                    let origin = format!("snapshot:{}", snap.meta.name);
                    let at = std::time::Instant::now();
                    Sandbox::restore(&self.paths, &snap, origin, &cfg, at, Some(id.to_string()))
                        .await?
                }
            };
            // From here the sandbox is a running copy of the snapshot, which goes with it.
            snap.meta.hibernated = None;
            crate::snapshot::rewrite_meta(&snap)?;
            Ok::<_, EngineError>(sb)
        }
        .await;
        let sb = match restored {
            Ok(sb) => sb,
            Err(e) => {
                self.sleepers.write().await.insert(id.to_string(), sleeper);
                return Err(e);
            }
        };
        if let Err(e) = sb.set_network(sleeper.record.network.clone()).await {
            sb.destroy().await;
            return Err(e.into());
        }
        // Its secrets, with the placeholders its processes hold, come back with it.
        if let Some(secrets) = sleeper.secrets.clone() {
            if let Err(e) = sb.set_secrets(secrets).await {
                sb.destroy().await;
                return Err(e.into());
            }
        }
        // The same sandbox as before it slept: it keeps when it was created, and its forwards.
        let entry = Entry::new(
            Arc::new(sb),
            sleeper.record.labels.clone(),
            sleeper.created_unix,
            sleeper.record.expires_unix,
            false,
            Life::of(&sleeper.record),
        );
        *entry.ports.lock().unwrap_or_else(|p| p.into_inner()) = std::mem::take(&mut sleeper.ports);
        let (commands, last) = std::mem::take(&mut sleeper.commands);
        // A guest booted from its disk runs none of the commands it ran; one restored from its
        // memory runs them on, their output coming on the new connection.
        if sleeper.record.without_memory.is_none() {
            for log in commands.values().filter(|log| log.held()) {
                let ex = entry.sandbox.adopt_command(log.agent_id());
                if log.is_quiet() {
                    entry.sandbox.client().quiet(log.agent_id());
                }
                log.wake(ex);
            }
            *entry.commands.lock().unwrap_or_else(|p| p.into_inner()) = commands;
        }
        entry
            .next_command
            .store(last, std::sync::atomic::Ordering::Relaxed);
        self.keep(entry).await
    }

    /// Deletes the sandboxes whose TTL has passed; returns their ids. The daemon calls this
    /// periodically.
    pub async fn expire(&self) -> Vec<String> {
        let now = now_unix();
        let expired: Vec<Entry> = {
            let mut map = self.sandboxes.write().await;
            let ids: Vec<String> = map
                .iter()
                .filter(|(_, e)| e.expires_unix.is_some_and(|t| t <= now))
                .filter(|(_, e)| e.life.ttl_action == TtlAction::Delete)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        let sleepy: Vec<(String, bool)> = self
            .sandboxes
            .read()
            .await
            .iter()
            .filter(|(_, e)| e.expires_unix.is_some_and(|t| t <= now))
            .filter(|(_, e)| e.life.ttl_action != TtlAction::Delete)
            .map(|(id, e)| (id.clone(), e.life.ttl_action == TtlAction::Hibernate))
            .collect();
        let hibernated = !sleepy.is_empty();
        for (id, memory) in sleepy {
            if let Err(e) = self.hibernate(&id, memory).await {
                tracing::warn!("{id}: its TTL passed but it could not be hibernated: {e}");
            }
        }
        let mut ids = Vec::new();
        for e in expired {
            ids.push(e.sandbox.info().id.clone());
            self.removed(e).await;
        }
        ids.extend(self.expire_sleepers(now).await);
        if hibernated || !ids.is_empty() {
            self.changed();
        }
        ids
    }

    /// Stops every sandbox (on daemon shutdown).
    pub async fn shutdown(&self) {
        self.pool.drain().await;
        let all: Vec<Entry> = self
            .sandboxes
            .write()
            .await
            .drain()
            .map(|(_, e)| e)
            .collect();
        for e in all {
            self.removed(e).await;
        }
    }
}

/// The record a sandbox sleeps with (a TTL that hibernated it is spent); without `memory`, its
/// guest's files written to its disk and its machine id read first.
async fn sleep_record(
    entry: &Entry,
    memory: bool,
) -> Result<crate::runstate::DaemonRecord, EngineError> {
    let mut record = entry.record()?;
    record.expires_unix = record.expires_unix.filter(|t| *t > now_unix());
    if !memory {
        record.without_memory = Some(entry.sandbox.files_only_pause().await?);
    }
    Ok(record)
}
