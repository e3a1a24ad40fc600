//! The warm pool: a few sandboxes restored from a template ahead of time, already reseeded
//! and named, handed out by `create` and replaced in the background. A create that finds the
//! pool empty restores from the template itself (and the pool refills after it).
//!
//! Pooled sandboxes belong to the daemon process but have no daemon record: if the daemon
//! dies they are swept like any orphan, never re-adopted. Their clock keeps time while they
//! wait, and each was reseeded when it was restored, so a handed-out copy is as fresh as one
//! restored on request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::api::EngineError;
use crate::image::ImageStore;
use crate::paths::Paths;
use crate::sandbox::{Sandbox, SandboxConfig};

/// Ready sandboxes kept per configuration; `FORKBOX_POOL_SIZE` (0 turns the pool off).
pub const DEFAULT_SIZE: usize = 2;

pub fn size_from_env() -> usize {
    std::env::var("FORKBOX_POOL_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SIZE)
}

fn warm_up() -> forkbox_protocol::ExecSpec {
    forkbox_protocol::ExecSpec {
        program: forkbox_protocol::Program::Argv(vec!["true".into()]),
        cwd: None,
        env: vec![],
        timeout_ms: Some(60_000),
        stdin: false,
    }
}

#[derive(Default)]
struct Slot {
    ready: Vec<Sandbox>,
    filling: bool,
}

#[derive(Clone)]
pub struct Pool {
    pub size: usize,
    slots: Arc<Mutex<HashMap<String, Slot>>>,
}

/// What makes two creates interchangeable: the resolved image and everything in the template.
pub fn key(paths: &Paths, cfg: &SandboxConfig) -> Result<String, EngineError> {
    let image = ImageStore::new(paths)
        .resolve(&cfg.image)
        .map_err(|e| EngineError::Sandbox(e.into()))?;
    Ok(format!(
        "{}|{}|{}|{}|{:?}",
        image.reference(),
        cfg.cpus,
        cfg.memory_mib,
        cfg.max_procs,
        cfg.accel
    ))
}

impl Pool {
    pub fn new(size: usize) -> Pool {
        Pool {
            size,
            slots: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn take(&self, key: &str) -> Option<Sandbox> {
        self.lock().get_mut(key).and_then(|s| s.ready.pop())
    }

    /// Tops the pool for `key` up to its size in the background (one filler per key).
    pub fn refill(&self, key: String, paths: Paths, cfg: SandboxConfig) {
        if self.size == 0 {
            return;
        }
        {
            let mut slots = self.lock();
            let slot = slots.entry(key.clone()).or_default();
            if slot.filling || slot.ready.len() >= self.size {
                return;
            }
            slot.filling = true;
        }
        let pool = self.clone();
        tokio::spawn(async move {
            loop {
                let full = pool
                    .lock()
                    .get(&key)
                    .is_some_and(|s| s.ready.len() >= pool.size);
                if full {
                    break;
                }
                match Sandbox::create(&paths, &cfg).await {
                    Ok(sb) => {
                        // Under TCG a restored copy runs its first command through code QEMU
                        // has not translated yet (~0.5 s); one command while it waits in the
                        // pool takes that cost off the user's first exec. Harmless under KVM.
                        let _ = sb.run(warm_up()).await;
                        pool.lock().entry(key.clone()).or_default().ready.push(sb)
                    }
                    Err(e) => {
                        tracing::warn!("warm pool for {key}: {e}");
                        break;
                    }
                }
            }
            if let Some(s) = pool.lock().get_mut(&key) {
                s.filling = false;
            }
        });
    }

    /// Stops every pooled sandbox.
    pub async fn drain(&self) {
        let all: Vec<Sandbox> = self
            .lock()
            .values_mut()
            .flat_map(|s| s.ready.drain(..))
            .collect();
        for sb in all {
            sb.destroy().await;
        }
    }

    /// Pooled sandboxes per configuration (for metrics and `info`).
    pub fn ready(&self) -> usize {
        self.lock().values().map(|s| s.ready.len()).sum()
    }
}
