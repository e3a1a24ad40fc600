//! A sandbox as every front end sees it, and the accelerator it runs on.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AccelChoice {
    #[default]
    Auto,
    Kvm,
    Tcg,
}

impl std::str::FromStr for AccelChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(AccelChoice::Auto),
            "kvm" => Ok(AccelChoice::Kvm),
            "tcg" => Ok(AccelChoice::Tcg),
            _ => Err(format!("{s:?} is not an accelerator: use auto, kvm or tcg")),
        }
    }
}

/// The accelerator a sandbox runs on, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AccelDecision {
    pub accel: Accel,
    pub reason: String,
}

/// What a sandbox is, for people and for `--json`.
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct SandboxInfo {
    pub id: String,
    pub image: String,
    pub accel: AccelDecision,
    pub cpus: u32,
    pub memory_mib: u32,
    /// The guest kernel's release (as `kernels` in `info` lists them).
    pub guest_kernel: String,
    /// Its QEMU process; absent while it has no VM (hibernated).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub qemu_pid: u32,
    /// From the decision to start until the agent answered (restored copies: until the
    /// copy had been refreshed and answered).
    pub boot_ms: u64,
    /// What it was restored from: `template:KEY` or `snapshot:NAME`; none for a cold boot.
    #[serde(default)]
    pub origin: Option<String>,
    #[serde(default)]
    pub max_procs: u32,
    /// The guest kernel's file.
    #[serde(default, rename = "kernel_path", alias = "kernel")]
    #[schema(value_type = String)]
    pub kernel: std::path::PathBuf,
    #[serde(default, rename = "initramfs_path", alias = "initramfs")]
    #[schema(value_type = String)]
    pub initramfs: std::path::PathBuf,
    /// The `disks/<id>/` directories its disk chain goes through, its own last.
    #[serde(default)]
    pub disk_dirs: Vec<String>,
    /// The volumes it has mounted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::MountedVolume>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl SandboxInfo {
    /// The snapshot (not template) this sandbox was restored from.
    pub fn origin_snapshot(&self) -> Option<&str> {
        self.origin.as_deref()?.strip_prefix("snapshot:")
    }
}
