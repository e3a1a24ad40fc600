//! Snapshots as the API lists them (and as `snapshot.json` keeps them).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::AccelDecision;

/// Names of snapshots made only to fork a sandbox (`fork-of-ID-…`); deleted with their last copy.
pub const AUTO_SNAPSHOT: &str = "fork-of-";
/// Names of snapshots that hold a hibernated sandbox (and then the copy resumed from it).
pub const HIBERNATION: &str = "hibernated-";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    Template,
    Snapshot,
}

/// What a snapshot's `vmstate` holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StateFormat {
    /// A migration stream without RAM (`x-ignore-shared`): templates, and snapshots saved by
    /// versions before `devices`. Loaded with `migrate-incoming`.
    #[default]
    Migration,
    /// QEMU's device state alone (`xen-save-devices-state`): snapshots of running sandboxes.
    /// Loaded by a QEMU started for it (see the engine's `vm::Start::Devices`).
    Devices,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct SnapshotMeta {
    pub name: String,
    pub kind: SnapshotKind,
    pub image: String,
    /// The guest kernel's file.
    #[serde(rename = "kernel_path", alias = "kernel")]
    #[schema(value_type = String)]
    pub kernel: PathBuf,
    #[serde(rename = "initramfs_path", alias = "initramfs")]
    #[schema(value_type = String)]
    pub initramfs: PathBuf,
    pub accel: AccelDecision,
    pub cpus: u32,
    pub memory_mib: u32,
    /// KiB of RAM the guest has past `memory_mib` (the engine's `vm::TCG_RAM_TAIL_KIB`); a
    /// copy must be given exactly the RAM its snapshot was saved with. Absent (0) in snapshots
    /// of versions before it.
    #[serde(default)]
    pub ram_tail_kib: u32,
    pub max_procs: u32,
    pub qemu_version: String,
    /// How its device state is written (absent: a migration stream).
    #[serde(default)]
    pub state: StateFormat,
    /// The snapshot (or template) the saved sandbox was a copy of; its disk backs this one's.
    pub parent: Option<String>,
    pub from_sandbox: Option<String>,
    pub created_unix: u64,
    /// How long the sandbox was paused while it was saved.
    pub pause_ms: Option<f64>,
    /// Wall time of the whole save.
    pub took_ms: u64,
    /// Bytes the RAM file occupies (its holes excluded).
    pub memory_bytes: u64,
    /// The frozen disk, when it is not `disk.qcow2` in the snapshot's directory (snapshots of
    /// sandboxes: a file under `disks/<sandbox>/`).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub disk: Option<PathBuf>,
    /// The `disks/<sandbox>/` directories this snapshot's disk chain goes through; they are
    /// kept while it exists.
    #[serde(default)]
    pub disk_dirs: Vec<String>,
    /// Set while this snapshot *is* a hibernated sandbox: what the daemon needs to list it
    /// and to resume it under the same id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernated: Option<DaemonRecord>,
    /// In listings: bytes only this snapshot holds on its node (its RAM file, device state and
    /// the disk files no other snapshot, template or sandbox uses): what deleting it frees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_alone_bytes: Option<u64>,
    /// Under KVM: the guest's CPU model and the host CPU it was saved on. A copy needs the same
    /// model and, for `host`, a CPU with every feature of that one. Absent under TCG (QEMU's
    /// own CPU, the same everywhere) and in snapshots of versions before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<GuestCpu>,
}

/// The CPU a KVM guest was given.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct GuestCpu {
    /// QEMU's `-cpu` model: `host` (the host's own, every feature) or a named one (`EPYC`,
    /// `Skylake-Server`, `x86-64-v3`…) that hosts of other generations can also give.
    pub model: String,
    /// The host CPU's `model name`.
    pub host: String,
    /// The host CPU's feature flags (`/proc/cpuinfo`), which a `host` guest may have used.
    pub flags: Vec<String>,
}

impl SnapshotMeta {
    /// Whether forkbox made it for its own ends (a fork of a running sandbox, a hibernation)
    /// rather than a user asking for it: lists leave such snapshots out unless asked.
    pub fn internal(&self) -> bool {
        self.hibernated.is_some()
            || self.name.starts_with(crate::AUTO_SNAPSHOT)
            || self.name.starts_with(HIBERNATION)
    }
}

/// What the daemon needs to take a sandbox over again.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct DaemonRecord {
    #[schema(value_type = Object)]
    pub info: serde_json::Value,
    pub labels: std::collections::BTreeMap<String, String>,
    pub expires_unix: Option<u64>,
    #[serde(default)]
    pub ttl_action: crate::TtlAction,
    #[serde(default)]
    pub created_unix: u64,
    #[serde(default)]
    pub network: crate::NetworkPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<crate::IdlePolicy>,
    #[serde(default)]
    pub wake_on_use: bool,
    /// Saved without its memory (E2B's filesystem-only pause): the machine id its guest had,
    /// which it boots again with from its own disk; none of its processes come back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub without_memory: Option<String>,
}
