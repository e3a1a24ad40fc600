//! The warm pool, as `info` shows it.

use serde::{Deserialize, Serialize};

/// One configuration's pooled sandboxes, as `info` shows them.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PoolSlotView {
    pub image: String,
    pub cpus: u32,
    pub memory_mib: u32,
    pub ready: usize,
    /// Ready sandboxes it keeps now: the pool's size, or up to its maximum after a burst of
    /// creates (until the configuration goes unused for the idle time).
    pub target: usize,
    /// Seconds since a sandbox of this configuration was last created.
    pub idle_secs: u64,
}

/// The warm pool as `info` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PoolView {
    /// Ready sandboxes kept per configuration (`FORKBOX_POOL_SIZE`; 0: off).
    pub size: usize,
    /// The most a configuration keeps after bursts of creates (`FORKBOX_POOL_MAX`).
    pub max: usize,
    /// Guest memory all of them together may take (`FORKBOX_POOL_MEMORY_MIB`).
    pub memory_cap_mib: u64,
    /// Guest memory they take now.
    pub memory_mib: u64,
    /// A configuration unused this long gives its sandboxes back (`FORKBOX_POOL_IDLE_SECS`).
    pub idle_secs: u64,
    pub slots: Vec<PoolSlotView>,
}
