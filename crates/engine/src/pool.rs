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
use std::time::{Duration, Instant};

use crate::api::EngineError;
use crate::image::ImageStore;
use crate::paths::Paths;
use crate::sandbox::{Sandbox, SandboxConfig};

/// Ready sandboxes kept per configuration; `FORKBOX_POOL_SIZE` (0 turns the pool off).
pub const DEFAULT_SIZE: usize = 2;

/// Guest memory all pooled sandboxes together may take; `FORKBOX_POOL_MEMORY_MIB`.
pub const DEFAULT_MEMORY_MIB: u64 = 4096;
/// A configuration nobody created for this long gives its pooled sandboxes back;
/// `FORKBOX_POOL_IDLE_SECS`.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(600);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn size_from_env() -> usize {
    env_or("FORKBOX_POOL_SIZE", DEFAULT_SIZE)
}

fn warm_up() -> forkbox_protocol::ExecSpec {
    forkbox_protocol::ExecSpec {
        program: forkbox_protocol::Program::Argv(vec!["true".into()]),
        cwd: None,
        env: vec![],
        timeout_ms: Some(60_000),
        stdin: false,
        tty: None,
        user: None,
    }
}

struct Slot {
    ready: Vec<Sandbox>,
    filling: bool,
    /// What each of its sandboxes is: for `info` and the memory bound.
    image: String,
    cpus: u32,
    memory_mib: u32,
    /// The last create of this configuration.
    used: Instant,
}

impl Slot {
    fn new(cfg: &SandboxConfig, key: &str) -> Slot {
        Slot {
            ready: Vec::new(),
            filling: false,
            image: key.split('|').next().unwrap_or_default().to_string(),
            cpus: cfg.cpus,
            memory_mib: cfg.memory_mib,
            used: Instant::now(),
        }
    }
}

/// One configuration's pooled sandboxes, as `info` shows them.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PoolSlotView {
    pub image: String,
    pub cpus: u32,
    pub memory_mib: u32,
    pub ready: usize,
    /// Seconds since a sandbox of this configuration was last created.
    pub idle_secs: u64,
}

/// The warm pool as `info` shows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PoolView {
    /// Ready sandboxes kept per configuration (`FORKBOX_POOL_SIZE`; 0: off).
    pub size: usize,
    /// Guest memory all of them together may take (`FORKBOX_POOL_MEMORY_MIB`).
    pub memory_cap_mib: u64,
    /// Guest memory they take now.
    pub memory_mib: u64,
    /// A configuration unused this long gives its sandboxes back (`FORKBOX_POOL_IDLE_SECS`).
    pub idle_secs: u64,
    pub slots: Vec<PoolSlotView>,
}

#[derive(Clone)]
pub struct Pool {
    pub size: usize,
    memory_cap_mib: u64,
    idle: Duration,
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
            memory_cap_mib: env_or("FORKBOX_POOL_MEMORY_MIB", DEFAULT_MEMORY_MIB),
            idle: Duration::from_secs(env_or("FORKBOX_POOL_IDLE_SECS", DEFAULT_IDLE.as_secs())),
            slots: Default::default(),
        }
    }

    /// Guest memory the pool's sandboxes take, counting those being made.
    fn memory_mib(slots: &HashMap<String, Slot>) -> u64 {
        slots
            .values()
            .map(|s| (s.ready.len() + usize::from(s.filling)) as u64 * u64::from(s.memory_mib))
            .sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn take(&self, key: &str) -> Option<Sandbox> {
        let mut slots = self.lock();
        let slot = slots.get_mut(key)?;
        slot.used = Instant::now();
        slot.ready.pop()
    }

    /// Tops the pool for `key` up to its size in the background (one filler per key).
    pub fn refill(&self, key: String, paths: Paths, cfg: SandboxConfig) {
        if self.size == 0 {
            return;
        }
        {
            let mut slots = self.lock();
            let slot = slots
                .entry(key.clone())
                .or_insert_with(|| Slot::new(&cfg, &key));
            slot.used = Instant::now();
            if slot.filling || slot.ready.len() >= self.size {
                return;
            }
            slot.filling = true;
        }
        let pool = self.clone();
        tokio::spawn(async move {
            loop {
                let full = {
                    let slots = pool.lock();
                    let over = Pool::memory_mib(&slots) > pool.memory_cap_mib;
                    over || slots.get(&key).is_none_or(|s| s.ready.len() >= pool.size)
                };
                if full {
                    break;
                }
                match Sandbox::create(&paths, &cfg).await {
                    Ok(sb) => {
                        // Under TCG a restored copy runs its first command through code QEMU
                        // has not translated yet (~0.5 s); one command while it waits in the
                        // pool takes that cost off the user's first exec. Harmless under KVM.
                        let _ = sb.run(warm_up()).await;
                        let unwanted = match pool.lock().get_mut(&key) {
                            Some(slot) => {
                                slot.ready.push(sb);
                                None
                            }
                            // Drained meanwhile (its image removed): not wanted any more.
                            None => Some(sb),
                        };
                        if let Some(sb) = unwanted {
                            sb.destroy().await;
                            break;
                        }
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
        self.drain_where(|_| true).await;
    }

    /// Stops the pooled sandboxes of the configurations `which` picks and forgets those
    /// configurations (a filler still running throws away what it makes).
    async fn drain_where(&self, which: impl Fn(&Slot) -> bool) -> usize {
        let all: Vec<Sandbox> = {
            let mut slots = self.lock();
            let keys: Vec<String> = slots
                .iter()
                .filter(|(_, s)| which(s))
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter()
                .filter_map(|k| slots.remove(k))
                .flat_map(|s| s.ready)
                .collect()
        };
        let n = all.len();
        for sb in all {
            sb.destroy().await;
        }
        n
    }

    /// Stops the pooled sandboxes of image `reference` (NAME@N), so it can be removed.
    pub async fn drain_image(&self, reference: &str) -> usize {
        self.drain_where(|s| s.image == reference).await
    }

    /// Gives back the sandboxes of configurations nobody created within the idle time.
    pub async fn shrink_idle(&self) -> usize {
        let idle = self.idle;
        self.drain_where(|s| !s.filling && s.used.elapsed() >= idle)
            .await
    }

    /// Pooled sandboxes per configuration (for metrics and `info`).
    pub fn ready(&self) -> usize {
        self.lock().values().map(|s| s.ready.len()).sum()
    }

    pub fn view(&self) -> PoolView {
        let slots = self.lock();
        let mut views: Vec<PoolSlotView> = slots
            .values()
            .map(|s| PoolSlotView {
                image: s.image.clone(),
                cpus: s.cpus,
                memory_mib: s.memory_mib,
                ready: s.ready.len(),
                idle_secs: s.used.elapsed().as_secs(),
            })
            .collect();
        views.sort_by(|a, b| {
            (&a.image, a.cpus, a.memory_mib).cmp(&(&b.image, b.cpus, b.memory_mib))
        });
        PoolView {
            size: self.size,
            memory_cap_mib: self.memory_cap_mib,
            memory_mib: Pool::memory_mib(&slots),
            idle_secs: self.idle.as_secs(),
            slots: views,
        }
    }
}
