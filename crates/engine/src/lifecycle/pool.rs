//! The warm pool: a few sandboxes restored from a template ahead of time, already reseeded
//! and named, handed out by `create` and replaced in the background.
//!
//! A create that finds the pool of its configuration empty waits for a restore the pool has
//! under way instead of starting one of its own beside it (on a CPU-bound host two restores
//! side by side each take twice as long), and the pool starts restores for the creates that
//! wait, as many at a time as the host has cores (up to [`MAX_PARALLEL`]). A sandbox restored
//! for a waiting create goes to it at once, without the warm-up command. Only the very first
//! create of a configuration restores for itself: it may have to make the template, and says
//! so as it waits.
//!
//! A configuration keeps `FORKBOX_POOL_SIZE` sandboxes ready, and more after a burst: as many
//! as the most creates it has seen within a minute, up to `FORKBOX_POOL_MAX`, within the pool's
//! memory, until nobody creates it for the idle time (then it gives them all back and starts
//! over). Under TCG a restore costs ~0.12 s of CPU, so no refill keeps up with creates that
//! come back to back; a pool that has seen the burst once holds it the next time.
//!
//! Pooled sandboxes belong to the daemon process but have no daemon record: if the daemon
//! dies they are swept like any orphan, never re-adopted. Their clock keeps time while they
//! wait, and each was reseeded when it was restored, so a handed-out copy is as fresh as one
//! restored on request.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use crate::image::ImageStore;
use crate::paths::Paths;
use crate::sandbox::{Sandbox, SandboxConfig};

pub use forkbox_api::{PoolSlotView, PoolView};

/// Ready sandboxes kept per configuration at least; `FORKBOX_POOL_SIZE` (0 turns the pool off).
pub const DEFAULT_SIZE: usize = 2;

/// A configuration's pool grows to the most creates it has seen within [`DEMAND_WINDOW`], up
/// to this many ready sandboxes (`FORKBOX_POOL_MAX`), until it goes unused for the idle time.
pub const DEFAULT_MAX: usize = 16;
pub const DEMAND_WINDOW: Duration = Duration::from_secs(60);

/// Guest memory all pooled sandboxes together may take (`FORKBOX_POOL_MEMORY_MIB`): half the
/// host's memory, at least this much. (An idle pooled guest takes far less of the host
/// than its size, ~30 MiB under TCG, but it is handed out with all of it.)
pub const MIN_MEMORY_MIB: u64 = 4096;
/// A configuration nobody created for this long gives its pooled sandboxes back;
/// `FORKBOX_POOL_IDLE_SECS`.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(600);
/// Restores one configuration's pool runs at once while creates wait for them (fewer on a host
/// with fewer cores); one at a time when nobody waits.
pub const MAX_PARALLEL: usize = 4;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn size_from_env() -> usize {
    env_or("FORKBOX_POOL_SIZE", DEFAULT_SIZE)
}

fn default_memory_mib() -> u64 {
    let total_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    (total_kib / 1024 / 2).max(MIN_MEMORY_MIB)
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

/// The restores of one slot under way, so that a drain can wait for them to end (each throws
/// its sandbox away once it finds its slot gone).
#[derive(Default)]
struct Tasks {
    running: AtomicUsize,
    done: Notify,
}

impl Tasks {
    async fn idle(&self) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            done.await;
        }
    }
}

/// One restore of a slot, counted in its [`Tasks`] until it is dropped.
struct TaskGuard(Arc<Tasks>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.done.notify_waiters();
    }
}

struct Slot {
    /// Tells this slot from one made for the same key after a drain: a restore started for a
    /// drained slot throws its sandbox away.
    id: u64,
    tasks: Arc<Tasks>,
    ready: Vec<Sandbox>,
    /// Restores under way for this configuration whose sandbox is not handed over or kept yet
    /// (what planning counts). Not the same as `tasks`: a task is still running after that,
    /// while it stops a sandbox nobody wants and starts the next restores, and after its slot
    /// is gone.
    in_flight: usize,
    /// Creates waiting for one of them, first come first served; a sender whose create gave
    /// up is skipped.
    waiting: VecDeque<oneshot::Sender<Sandbox>>,
    /// What each of its sandboxes is: for `info` and the memory bound.
    image: String,
    cpus: u32,
    memory_mib: u32,
    /// The last create of this configuration.
    used: Instant,
    /// Its creates within the last [`DEMAND_WINDOW`], and the most there ever were: how
    /// many ready sandboxes it keeps (between the pool's size and its maximum).
    recent: VecDeque<Instant>,
    peak: usize,
}

impl Slot {
    fn new(id: u64, cfg: &SandboxConfig, key: &str) -> Slot {
        Slot {
            id,
            tasks: Arc::default(),
            ready: Vec::new(),
            in_flight: 0,
            waiting: VecDeque::new(),
            image: key.split('|').next().unwrap_or_default().to_string(),
            cpus: cfg.cpus,
            memory_mib: cfg.memory_mib,
            used: Instant::now(),
            recent: VecDeque::new(),
            peak: 0,
        }
    }

    /// Counts a create now.
    fn created(&mut self) {
        let now = Instant::now();
        self.used = now;
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > DEMAND_WINDOW)
        {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        self.peak = self.peak.max(self.recent.len());
    }

    /// Ready sandboxes it keeps: the pool's size, more after a burst of creates.
    fn target(&self, size: usize, max: usize) -> usize {
        if size == 0 {
            return 0;
        }
        self.peak.clamp(size, max.max(size))
    }

    /// Restores under way that no create waits for: they will be the pool's.
    fn spare(&self) -> usize {
        self.in_flight.saturating_sub(self.waiting.len())
    }

    /// Guest memory the pool holds or is making for this configuration (a restore a create
    /// waits for is that create's).
    fn pool_memory_mib(&self) -> u64 {
        (self.ready.len() + self.spare()) as u64 * u64::from(self.memory_mib)
    }

    /// Gives `sb` to the first create still waiting; hands it back when none is.
    fn hand_over(&mut self, mut sb: Sandbox) -> Option<Sandbox> {
        while let Some(tx) = self.waiting.pop_front() {
            match tx.send(sb) {
                Ok(()) => return None,
                Err(back) => sb = back,
            }
        }
        Some(sb)
    }
}

/// What a create gets from the pool.
pub enum Taken {
    /// A sandbox restored and warmed up ahead of time.
    Ready(Box<Sandbox>),
    /// One the pool is restoring for this create; an error (the restore failed, the
    /// configuration was drained) means: restore for yourself.
    Coming(oneshot::Receiver<Sandbox>),
    /// Nothing: restore for yourself (the pool is off, or this is the configuration's first
    /// create).
    Miss,
}

/// A configuration's slot in numbers.
#[derive(Debug, Clone, Copy)]
struct Counts {
    ready: usize,
    in_flight: usize,
    waiting: usize,
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Ready sandboxes wanted.
    size: usize,
    /// Restores at once while creates wait.
    parallel: usize,
    /// One sandbox's guest memory.
    memory_mib: u64,
    /// What the whole pool holds or is making now.
    pool_mib: u64,
    cap_mib: u64,
}

/// How many restores to start for a slot: one for each waiting create that has none coming,
/// and those that top the pool up to its size within its memory; at most `parallel` under way
/// while creates wait, else one.
fn restores_to_start(mut c: Counts, l: Limits) -> usize {
    let limit = if c.waiting == 0 { 1 } else { l.parallel.max(1) };
    let mut pool_mib = l.pool_mib;
    let mut n = 0;
    while c.in_flight < limit {
        let unserved = c.waiting > c.in_flight;
        let spare = c.in_flight.saturating_sub(c.waiting);
        let top_up = c.ready + spare < l.size && pool_mib + l.memory_mib <= l.cap_mib;
        if !unserved && !top_up {
            break;
        }
        if !unserved {
            pool_mib += l.memory_mib;
        }
        c.in_flight += 1;
        n += 1;
    }
    n
}

#[derive(Default)]
struct Slots {
    by_key: HashMap<String, Slot>,
    next_id: u64,
}

#[derive(Clone)]
pub struct Pool {
    pub size: usize,
    max: usize,
    memory_cap_mib: u64,
    idle: Duration,
    /// Restores at once for creates that wait.
    parallel: usize,
    slots: Arc<Mutex<Slots>>,
}

/// What makes two creates interchangeable: the resolved image and everything in the template.
pub fn key(paths: &Paths, cfg: &SandboxConfig) -> Result<String, crate::error::SandboxError> {
    let image = ImageStore::new(paths).resolve(&cfg.image)?;
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
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Pool {
            size,
            max: env_or("FORKBOX_POOL_MAX", DEFAULT_MAX),
            memory_cap_mib: env_or("FORKBOX_POOL_MEMORY_MIB", default_memory_mib()),
            idle: Duration::from_secs(env_or("FORKBOX_POOL_IDLE_SECS", DEFAULT_IDLE.as_secs())),
            parallel: cores.clamp(1, MAX_PARALLEL),
            slots: Default::default(),
        }
    }

    /// Guest memory the pool's sandboxes take, counting those being made for it.
    fn memory_mib(slots: &Slots) -> u64 {
        slots.by_key.values().map(Slot::pool_memory_mib).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sandbox for a create of `cfg` (whose key is `key`), and the restores that keep the
    /// pool topped up and serve the creates that wait.
    pub fn get(&self, key: &str, paths: &Paths, cfg: &SandboxConfig) -> Taken {
        if self.size == 0 {
            return Taken::Miss;
        }
        let (taken, start) = {
            let mut slots = self.lock();
            let known = slots.by_key.contains_key(key);
            if !known {
                let id = slots.next_id;
                slots.next_id += 1;
                slots
                    .by_key
                    .insert(key.to_string(), Slot::new(id, cfg, key));
            }
            let Some(slot) = slots.by_key.get_mut(key) else {
                return Taken::Miss;
            };
            slot.created();
            let taken = match slot.ready.pop() {
                Some(sb) => Taken::Ready(Box::new(sb)),
                None if known => {
                    let (tx, rx) = oneshot::channel();
                    slot.waiting.push_back(tx);
                    Taken::Coming(rx)
                }
                None => Taken::Miss,
            };
            (taken, self.plan(&mut slots, key))
        };
        self.start(key, start, paths, cfg);
        taken
    }

    /// Starts counting the restores `key` needs now as under way (see [`restores_to_start`]);
    /// returns the slot's id and a guard for each.
    fn plan(&self, slots: &mut Slots, key: &str) -> (u64, Vec<TaskGuard>) {
        let pool_mib = Pool::memory_mib(slots);
        let Some(slot) = slots.by_key.get_mut(key) else {
            return (0, Vec::new());
        };
        let n = restores_to_start(
            Counts {
                ready: slot.ready.len(),
                in_flight: slot.in_flight,
                waiting: slot.waiting.len(),
            },
            Limits {
                size: slot.target(self.size, self.max),
                parallel: self.parallel,
                memory_mib: u64::from(slot.memory_mib),
                pool_mib,
                cap_mib: self.memory_cap_mib,
            },
        );
        slot.in_flight += n;
        slot.tasks.running.fetch_add(n, Ordering::SeqCst);
        let guards = (0..n).map(|_| TaskGuard(slot.tasks.clone())).collect();
        (slot.id, guards)
    }

    fn start(
        &self,
        key: &str,
        (slot_id, guards): (u64, Vec<TaskGuard>),
        paths: &Paths,
        cfg: &SandboxConfig,
    ) {
        for guard in guards {
            let (pool, key, paths, cfg) =
                (self.clone(), key.to_string(), paths.clone(), cfg.clone());
            tokio::spawn(async move { pool.fill(key, slot_id, guard, paths, cfg).await });
        }
    }

    /// One restore for slot `slot_id` of `key`: to a create waiting by then, else warmed up
    /// into the pool; then whatever restores the slot needs next.
    async fn fill(
        self,
        key: String,
        slot_id: u64,
        guard: TaskGuard,
        paths: Paths,
        cfg: SandboxConfig,
    ) {
        let made = Sandbox::create(&paths, &cfg).await;
        let (unwanted, to_warm, next) = {
            let mut slots = self.lock();
            match (made, slots.by_key.get_mut(&key).filter(|s| s.id == slot_id)) {
                // Drained meanwhile (its image removed): not wanted any more.
                (Ok(sb), None) => (Some(sb), None, (0, Vec::new())),
                (Err(_), None) => (None, None, (0, Vec::new())),
                (Err(e), Some(slot)) => {
                    tracing::warn!("warm pool for {key}: {e}");
                    slot.in_flight -= 1;
                    // The creates this restore was for restore for themselves (and report
                    // what goes wrong); no retry here.
                    while slot.waiting.len() > slot.in_flight {
                        slot.waiting.pop_back();
                    }
                    (None, None, (0, Vec::new()))
                }
                (Ok(sb), Some(slot)) => match slot.hand_over(sb) {
                    None => {
                        slot.in_flight -= 1;
                        (None, None, self.plan(&mut slots, &key))
                    }
                    Some(sb) => (None, Some(sb), (0, Vec::new())),
                },
            }
        };
        match to_warm {
            Some(sb) => {
                self.warm_and_keep(key, slot_id, guard, sb, paths, cfg)
                    .await
            }
            None => self.finish(&key, unwanted, next, guard, &paths, &cfg).await,
        }
    }

    /// Runs the warm-up in `sb` (under TCG a restored copy runs its first command through code
    /// QEMU has not translated yet, ~0.3 s; harmless under KVM), then gives it to a create
    /// that came meanwhile or keeps it.
    async fn warm_and_keep(
        self,
        key: String,
        slot_id: u64,
        guard: TaskGuard,
        sb: Sandbox,
        paths: Paths,
        cfg: SandboxConfig,
    ) {
        let _ = sb.run(warm_up()).await;
        let (unwanted, next) = {
            let mut slots = self.lock();
            match slots.by_key.get_mut(&key).filter(|s| s.id == slot_id) {
                None => (Some(sb), (0, Vec::new())),
                Some(slot) => {
                    if let Some(sb) = slot.hand_over(sb) {
                        slot.ready.push(sb);
                    }
                    slot.in_flight -= 1;
                    (None, self.plan(&mut slots, &key))
                }
            }
        };
        self.finish(&key, unwanted, next, guard, &paths, &cfg).await;
    }

    /// The end of a restore's task: the sandbox nobody wants any more stopped, the restores its
    /// slot needs next started, and only then the task no longer counted (a drain waits for
    /// that, so it returns with no VM of the pool left running).
    async fn finish(
        &self,
        key: &str,
        unwanted: Option<Sandbox>,
        next: (u64, Vec<TaskGuard>),
        guard: TaskGuard,
        paths: &Paths,
        cfg: &SandboxConfig,
    ) {
        if let Some(sb) = unwanted {
            sb.destroy().await;
        }
        self.start(key, next, paths, cfg);
        drop(guard);
    }

    /// Stops every pooled sandbox.
    pub async fn drain(&self) {
        self.drain_where(|_| true).await;
    }

    /// Stops the pooled sandboxes of the configurations `which` picks and forgets those
    /// configurations (a restore still under way throws away what it makes; a create that
    /// waited for it restores for itself).
    async fn drain_where(&self, which: impl Fn(&Slot) -> bool) -> usize {
        let removed: Vec<Slot> = {
            let mut slots = self.lock();
            let keys: Vec<String> = slots
                .by_key
                .iter()
                .filter(|(_, s)| which(s))
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| slots.by_key.remove(k)).collect()
        };
        let mut n = 0;
        let mut tasks = Vec::new();
        for slot in removed {
            tasks.push(slot.tasks);
            for sb in slot.ready {
                sb.destroy().await;
                n += 1;
            }
        }
        // Restores still under way end by throwing their sandboxes away: none is left
        // running when this returns (a daemon shutting down, an image about to be removed).
        for t in tasks {
            if tokio::time::timeout(Duration::from_secs(120), t.idle())
                .await
                .is_err()
            {
                tracing::warn!("warm pool: a restore still ran 120 s after its drain");
            }
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
        self.drain_where(|s| s.in_flight == 0 && s.used.elapsed() >= idle)
            .await
    }

    /// Pooled sandboxes per configuration (for metrics and `info`).
    pub fn ready(&self) -> usize {
        self.lock().by_key.values().map(|s| s.ready.len()).sum()
    }

    pub fn view(&self) -> PoolView {
        let slots = self.lock();
        let mut views: Vec<PoolSlotView> = slots
            .by_key
            .values()
            .map(|s| PoolSlotView {
                image: s.image.clone(),
                cpus: s.cpus,
                memory_mib: s.memory_mib,
                ready: s.ready.len(),
                target: s.target(self.size, self.max),
                idle_secs: s.used.elapsed().as_secs(),
            })
            .collect();
        views.sort_by(|a, b| {
            (&a.image, a.cpus, a.memory_mib).cmp(&(&b.image, b.cpus, b.memory_mib))
        });
        PoolView {
            size: self.size,
            max: self.max.max(self.size),
            memory_cap_mib: self.memory_cap_mib,
            memory_mib: Pool::memory_mib(&slots),
            idle_secs: self.idle.as_secs(),
            slots: views,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(size: usize, pool_mib: u64, cap_mib: u64) -> Limits {
        Limits {
            size,
            parallel: 2,
            memory_mib: 1024,
            pool_mib,
            cap_mib,
        }
    }

    fn counts(ready: usize, in_flight: usize, waiting: usize) -> Counts {
        Counts {
            ready,
            in_flight,
            waiting,
        }
    }

    #[test]
    fn tops_up_one_at_a_time_when_nobody_waits() {
        assert_eq!(restores_to_start(counts(0, 0, 0), lim(2, 0, 4096)), 1);
        assert_eq!(restores_to_start(counts(0, 1, 0), lim(2, 1024, 4096)), 0);
        assert_eq!(restores_to_start(counts(2, 0, 0), lim(2, 2048, 4096)), 0);
        assert_eq!(restores_to_start(counts(1, 0, 0), lim(2, 1024, 4096)), 1);
    }

    #[test]
    fn waiting_creates_get_restores_of_their_own_up_to_the_parallel_limit() {
        // One waits, one restore under way (counted as the waiter's): the pool is still short
        // of its size, so a second starts beside it.
        assert_eq!(restores_to_start(counts(0, 1, 1), lim(2, 0, 4096)), 1);
        // Three wait, none under way: two at once, the third waits for one of them.
        assert_eq!(restores_to_start(counts(0, 0, 3), lim(2, 0, 4096)), 2);
        assert_eq!(restores_to_start(counts(0, 2, 3), lim(2, 0, 4096)), 0);
        // Under way for every waiter and for the pool: nothing more.
        assert_eq!(restores_to_start(counts(1, 2, 1), lim(2, 2048, 4096)), 0);
    }

    #[test]
    fn the_memory_cap_bounds_the_pool_but_not_a_waiting_create() {
        // Full: no top-up...
        assert_eq!(restores_to_start(counts(0, 0, 0), lim(2, 4096, 4096)), 0);
        // ... but a create that waits is served (its sandbox is the create's, not the pool's).
        assert_eq!(restores_to_start(counts(0, 0, 1), lim(2, 4096, 4096)), 1);
        // Room for one more 1 GiB sandbox in the pool.
        assert_eq!(restores_to_start(counts(0, 0, 0), lim(2, 3072, 4096)), 1);
    }

    #[test]
    fn a_burst_of_creates_raises_what_a_configuration_keeps_up_to_the_maximum() {
        let mut slot = Slot::new(0, &SandboxConfig::default(), "python-bookworm@1|1|1024");
        assert_eq!(slot.target(2, 8), 2);
        slot.created();
        assert_eq!(slot.target(2, 8), 2);
        for _ in 0..4 {
            slot.created();
        }
        assert_eq!(slot.target(2, 8), 5);
        for _ in 0..10 {
            slot.created();
        }
        assert_eq!(slot.target(2, 8), 8);
        // A maximum below the size means the size; a pool that is off keeps nothing.
        assert_eq!(slot.target(10, 4), 10);
        assert_eq!(slot.target(0, 8), 0);
        assert_eq!(slot.image, "python-bookworm@1");
    }

    #[tokio::test]
    async fn a_drain_waits_for_the_restores_under_way() {
        let tasks = Arc::new(Tasks::default());
        tasks.idle().await;
        tasks.running.fetch_add(2, Ordering::SeqCst);
        let (a, b) = (TaskGuard(tasks.clone()), TaskGuard(tasks.clone()));
        let ended = Arc::new(AtomicUsize::new(0));
        for (guard, ms) in [(a, 50u64), (b, 150)] {
            let ended = ended.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                ended.fetch_add(1, Ordering::SeqCst);
                drop(guard);
            });
        }
        tokio::time::timeout(Duration::from_secs(5), tasks.idle())
            .await
            .unwrap();
        assert_eq!(ended.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_pool_of_size_zero_starts_nothing_unless_asked() {
        assert_eq!(restores_to_start(counts(0, 0, 0), lim(0, 0, 4096)), 0);
        assert_eq!(restores_to_start(counts(0, 0, 1), lim(0, 0, 4096)), 1);
    }
}
