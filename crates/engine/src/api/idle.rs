//! Sleeping when idle and waking on use: the daemon's sweep hibernates a sandbox nothing has
//! used for its idle policy's time, and the next call that needs a sleeping sandbox whose use
//! wakes it resumes it first (one wake per sandbox however many calls arrive at once), so the
//! caller sees only the delay.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Engine, EngineError, IdleRequest, Life, SandboxView, TtlAction};

/// Per sandbox, held while it goes to sleep, wakes, hibernates or resumes: a call that finds
/// it in neither map (between the two) waits for the change to end.
#[derive(Default)]
pub(super) struct Transitions(std::sync::Mutex<std::collections::HashMap<String, Arc<Lock>>>);

type Lock = tokio::sync::Mutex<()>;

impl Transitions {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<Lock>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Engine {
    /// Sandbox `id`'s transition lock (made on first use).
    pub(super) fn transition(&self, id: &str) -> Arc<Lock> {
        self.transitions
            .lock()
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// Says sandbox `id` is between the maps, as `view` (see `Engine::between`).
    pub(super) fn set_between(&self, id: &str, view: SandboxView) {
        self.between_lock().insert(id.to_string(), view);
    }

    /// Says sandbox `id` is in a map again.
    pub(super) fn clear_between(&self, id: &str) {
        self.between_lock().remove(id);
    }

    pub(super) fn between_view(&self, id: &str) -> Option<SandboxView> {
        self.between_lock().get(id).cloned()
    }

    pub(super) fn between_views(&self) -> Vec<SandboxView> {
        self.between_lock().values().cloned().collect()
    }

    fn between_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, SandboxView>> {
        self.between.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets a sandbox's transition lock (it is gone).
    pub(super) fn forget_transition(&self, id: &str) {
        self.transitions.lock().remove(id);
    }

    /// Whether sandbox `id` runs, woken first when it sleeps and use wakes it. `false` for a
    /// sandbox hibernated without waking on use, and for one this engine does not have.
    pub(super) async fn awake(&self, id: &str) -> Result<bool, EngineError> {
        for _ in 0..4 {
            if self.sandboxes.read().await.contains_key(id) {
                return Ok(true);
            }
            let wakes = self
                .sleepers
                .read()
                .await
                .get(id)
                .map(|s| s.record.wake_on_use);
            match wakes {
                Some(false) => return Ok(false),
                Some(true) => {
                    let lock = self.transition(id);
                    let _changing = lock.lock().await;
                    // Another call may have woken it while this one waited.
                    if self.sleepers.read().await.contains_key(id) {
                        self.wake(id).await?;
                    }
                }
                None => {
                    // Neither running nor asleep: between the two, or unknown.
                    let lock = self.transitions.lock().get(id).cloned();
                    match lock {
                        Some(lock) => drop(lock.lock().await),
                        None => return Ok(false),
                    }
                }
            }
        }
        Ok(self.sandboxes.read().await.contains_key(id))
    }

    /// Resumes sleeping sandbox `id` for a call that needs it (its transition held).
    async fn wake(&self, id: &str) -> Result<(), EngineError> {
        let started = Instant::now();
        let view = self.resume_now(id).await.map_err(|e| {
            tracing::warn!("{id}: a use could not wake it: {e}");
            e
        })?;
        let took = started.elapsed();
        self.metrics.wake_seconds.observe(took.as_secs_f64());
        let restore = view.info.boot_ms as f64;
        tracing::info!(
            "{id}: woken by a use in {} ms (restore to agent-ready {restore:.0} ms; network, \
             secrets and record {:.0} ms)",
            took.as_millis(),
            (took.as_secs_f64() * 1000.0 - restore).max(0.0)
        );
        self.changed();
        Ok(())
    }

    /// Puts to sleep every sandbox nothing has used for its idle policy's time; their ids. The
    /// daemon calls this periodically.
    pub async fn sleep_idle(&self) -> Vec<String> {
        let due: Vec<(String, Duration)> = self
            .sandboxes
            .read()
            .await
            .iter()
            .filter_map(|(id, e)| {
                let after = Duration::from_secs(e.life.idle?.after_secs);
                let idle = e.sandbox.client().idle_for();
                (idle >= after && e.sandbox.client().failure().is_none())
                    .then(|| (id.clone(), after))
            })
            .collect();
        let mut slept = Vec::new();
        for (id, after) in due {
            let lock = self.transition(&id);
            let Ok(_changing) = lock.try_lock() else {
                continue; // changing already: a later sweep looks again
            };
            let started = Instant::now();
            match self.hibernate_now(&id, Some(after), true).await {
                Ok(Some(_)) => {
                    let took = started.elapsed();
                    self.metrics.sleep_seconds.observe(took.as_secs_f64());
                    tracing::info!(
                        "{id}: idle for {} s; asleep (saved in {} ms)",
                        after.as_secs(),
                        took.as_millis()
                    );
                    slept.push(id);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("{id}: idle, but it could not be put to sleep: {e}"),
            }
        }
        if !slept.is_empty() {
            self.changed();
        }
        slept
    }

    /// The TTLs that passed while their sandboxes slept: one that deletes deletes the sleeping
    /// sandbox (its ids returned), one that hibernates is spent (it is hibernated already, and
    /// waking it must not put it back to sleep at once).
    pub(super) async fn expire_sleepers(&self, now: u64) -> Vec<String> {
        let overdue: Vec<(String, TtlAction)> = self
            .sleepers
            .read()
            .await
            .iter()
            .filter(|(_, s)| s.record.expires_unix.is_some_and(|t| t <= now))
            .map(|(id, s)| (id.clone(), s.record.ttl_action))
            .collect();
        let mut deleted = Vec::new();
        for (id, action) in overdue {
            let lock = self.transition(&id);
            let Ok(_changing) = lock.try_lock() else {
                continue; // waking or going: the next sweep looks again
            };
            match action {
                TtlAction::Delete => match self.delete_sleeper(&id).await {
                    Ok(()) => deleted.push(id),
                    Err(e) => tracing::warn!("{id}: its TTL passed while asleep, not deleted: {e}"),
                },
                TtlAction::Hibernate | TtlAction::HibernateDisk => {
                    if let Err(e) = self.rewrite_sleeper(&id, |r| r.expires_unix = None).await {
                        tracing::warn!("{id}: its TTL passed while asleep: {e}");
                    }
                }
            }
        }
        deleted
    }

    /// Changes a sleeping sandbox's record, in memory and in its snapshot.
    async fn rewrite_sleeper(
        &self,
        id: &str,
        change: impl FnOnce(&mut crate::runstate::DaemonRecord),
    ) -> Result<SandboxView, EngineError> {
        let mut sleepers = self.sleepers.write().await;
        let s = sleepers
            .get_mut(id)
            .ok_or_else(|| EngineError::NoSuchSandbox(id.to_string()))?;
        let mut record = s.record.clone();
        change(&mut record);
        let store = crate::snapshot::SnapshotStore::new(&self.paths);
        let mut snap = store.get(&s.snapshot)?;
        snap.meta.hibernated = Some(record.clone());
        crate::snapshot::rewrite_meta(&snap)?;
        s.record = record;
        if !s.record.wake_on_use {
            // Nothing wakes it now: its forwards end, as a hibernation's do.
            s.ports.clear();
        }
        Ok(s.view(self.node.get()))
    }

    /// Deletes a sleeping (or hibernated) sandbox: the snapshot it sleeps in.
    pub(super) async fn delete_sleeper(&self, id: &str) -> Result<(), EngineError> {
        let Some(s) = self.sleepers.write().await.remove(id) else {
            return Err(EngineError::NoSuchSandbox(id.to_string()));
        };
        let store = crate::snapshot::SnapshotStore::new(&self.paths);
        let parent = store
            .get(&s.snapshot)
            .ok()
            .and_then(|x| x.meta.parent.clone());
        store.remove(&s.snapshot, &[])?;
        self.forget_transition(id);
        self.release_volumes(&s.info);
        // The fork's snapshot it was a copy of, if it was the last.
        self.drop_unused_auto(parent).await;
        Ok(())
    }

    /// A new idle policy for a running or sleeping sandbox.
    pub(super) async fn set_idle(
        &self,
        id: &str,
        r: IdleRequest,
    ) -> Result<SandboxView, EngineError> {
        let lock = self.transition(id);
        let _changing = lock.lock().await;
        // Without a word on waking: on with a policy; as it was when sleeping is turned off.
        let wake = |was: bool| r.wake_on_use.or(Some(r.idle.is_some() || was));
        let ttl_action = self
            .sandboxes
            .read()
            .await
            .get(id)
            .map(|e| (e.life.ttl_action, e.life.wake_on_use));
        if let Some((ttl_action, was)) = ttl_action {
            let life = Life::asked(Some(ttl_action), r.idle, wake(was))?;
            let mut map = self.sandboxes.write().await;
            let e = map
                .get_mut(id)
                .ok_or_else(|| EngineError::NoSuchSandbox(id.to_string()))?;
            e.life = life;
            e.persist(self.db.as_deref())?;
            e.sandbox.client().activity.touch();
            return Ok(e.view(self.node.get()));
        }
        let (ttl_action, was) = {
            let sleepers = self.sleepers.read().await;
            let s = sleepers
                .get(id)
                .ok_or_else(|| EngineError::NoSuchSandbox(id.to_string()))?;
            (s.record.ttl_action, s.record.wake_on_use)
        };
        let life = Life::asked(Some(ttl_action), r.idle, wake(was))?;
        self.rewrite_sleeper(id, |record| {
            record.idle = life.idle;
            record.wake_on_use = life.wake_on_use;
        })
        .await
    }
}
