//! What a front end asks the engine for: each request is parsed into its type here, once, and
//! checked where it is turned into what the engine runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{AccelChoice, Invalid, NetworkPolicy, SandboxView, Seed};

/// Output a plain exec returns, per stream; the rest is cut and `*_truncated` set.
pub const OUTPUT_CAP: usize = 64 * 1024;
/// Longest timeout a command may ask for.
pub const MAX_TIMEOUT_SECS: u64 = 24 * 3600;

#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// NAME or NAME@N; the default image when absent.
    pub image: Option<String>,
    pub cpus: Option<u32>,
    pub memory_mib: Option<u32>,
    pub accel: Option<AccelChoice>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Delete the sandbox this many seconds from now (stored as an absolute deadline).
    pub ttl_seconds: Option<u64>,
    /// Most processes the sandbox's commands may have together.
    pub max_processes: Option<u32>,
    /// Start from this snapshot instead of the image's template (a fork of count 1). The
    /// image, vCPUs and memory are the snapshot's.
    pub snapshot: Option<String>,
    /// What the TTL does when it passes: delete (default) or hibernate.
    pub ttl_action: Option<TtlAction>,
    /// Root disk size in GiB (at least the image's); the filesystem grows to fill it.
    pub disk_gib: Option<u32>,
    /// What it may reach: off (no network) when absent; `{"internet": true}` or
    /// `{"allow": ["pypi.org", "*.pythonhosted.org"]}` through the host-side proxy.
    pub network: Option<NetworkPolicy>,
    /// In a cluster: the node to place it on (default: placed by capacity and locality).
    pub node: Option<String>,
    /// Secrets its requests carry: the guest's commands see a placeholder in `$NAME`, and the
    /// host puts the value in its place in HTTPS requests to the secret's hosts (which the
    /// network policy then allows). Values are write-only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::SecretSpec>,
    /// Sleep when idle: after this long with no command running, no open stream or port
    /// connection and no call for it, it is hibernated, and the next thing that needs it wakes
    /// it (see [`IdlePolicy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdlePolicy>,
    /// Whether a call that needs it wakes it while it is hibernated (an exec, a file call, an
    /// attach, a connection to a forwarded port or preview URL). Default: on with `idle`, off
    /// without (a sandbox hibernated by hand or by its TTL then waits for `resume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_on_use: Option<bool>,
    /// Volumes to mount (`forkbox volume create`): one sandbox mounts a volume read-write, or
    /// any number read-only; a volume is never part of a snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::VolumeMount>,
}

/// When a sandbox sleeps by itself: `after_secs` seconds (1 to 7 days) with nothing using it.
/// Used means a command running (a detached one too), a stream or terminal open, a port
/// forward's or preview URL's connection open, or any call for the sandbox. Asleep, it keeps its
/// memory, processes and files on disk and has no VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IdlePolicy {
    pub after_secs: u64,
    #[serde(default)]
    pub action: IdleAction,
}

/// Longest idle time a policy may give: a week.
pub const MAX_IDLE_SECS: u64 = 7 * 24 * 3600;

impl IdlePolicy {
    /// Hibernate after `after_secs` seconds unused (the one action there is).
    pub fn after(after_secs: u64) -> IdlePolicy {
        IdlePolicy {
            after_secs,
            action: IdleAction::Hibernate,
        }
    }

    /// A policy checked: `after_secs` within 1 second and [`MAX_IDLE_SECS`].
    pub fn checked(self) -> Result<IdlePolicy, Invalid> {
        if self.after_secs == 0 || self.after_secs > MAX_IDLE_SECS {
            return Err(Invalid(format!(
                "idle.after_secs {}: give 1 to {MAX_IDLE_SECS} seconds",
                self.after_secs
            )));
        }
        Ok(self)
    }
}

/// What idleness does to a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Saved to disk with its processes, its VM stopped; woken on use.
    #[default]
    Hibernate,
}

/// A new idle policy for a running or sleeping sandbox; `idle: null` turns sleeping off.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IdleRequest {
    pub idle: Option<IdlePolicy>,
    /// Whether use wakes it while it sleeps (default: on with `idle`; without, as it was, so a
    /// sleeping sandbox whose sleeping is turned off still wakes on its next use).
    #[serde(default)]
    pub wake_on_use: Option<bool>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TtlAction {
    #[default]
    Delete,
    Hibernate,
    /// Hibernate without the memory: its files kept, its processes gone; the resume boots it.
    HibernateDisk,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// A name for the snapshot; one is made up when absent.
    pub name: Option<String>,
    /// Leave the sandbox paused after saving it (default: it keeps running).
    #[serde(default)]
    pub stay_paused: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many copies, 1 to 10.
    pub count: u32,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub ttl_seconds: Option<u64>,
    pub max_processes: Option<u32>,
    /// The copies' network policy; when absent, a fork of a sandbox keeps the sandbox's and a
    /// fork of a snapshot has none.
    pub network: Option<NetworkPolicy>,
    /// In a cluster: the node the copies must go to (one that lacks the snapshot gets it from
    /// the nodes that hold it, by chunks).
    pub node: Option<String>,
    /// The copies' secrets, each copy with placeholders of its own; a copy never carries the
    /// source's secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::SecretSpec>,
    /// The copies' idle policy (none when absent: a copy does not inherit its source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdlePolicy>,
    /// Whether use wakes a sleeping copy (default: on with `idle`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_on_use: Option<bool>,
    /// More volumes for the copies to mount. A copy of a sandbox has the volumes it has
    /// read-only, at the same paths; never those it has read-write (one writer at a time: the
    /// fork's `notes` say so). Volumes are never in the snapshot: they are unmounted while the
    /// source is saved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::VolumeMount>,
}

/// Most copies one fork call makes.
pub const MAX_FORK: u32 = 20;

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ForkResult {
    /// The snapshot the copies were made from (made by this call when forking a sandbox).
    pub snapshot: String,
    /// How long the source sandbox was paused, when one was saved.
    pub pause_ms: Option<f64>,
    pub sandboxes: Vec<SandboxView>,
    /// Copies that could not be made, with why; the others are unaffected.
    pub failed: Vec<String>,
    pub duration_ms: u64,
    /// In a cluster, when the copies were made on a node that did not hold the snapshot: what
    /// moved to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<crate::Transfer>,
    /// What the copies were not given of their source, and why (a volume it has read-write).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Run this argv directly...
    pub argv: Option<Vec<String>>,
    /// ...or this string with `/bin/sh -c`.
    pub shell: Option<String>,
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Kill the command after this many seconds (at most 24 h)...
    pub timeout_secs: Option<u64>,
    /// ...or milliseconds; not both.
    pub timeout_ms: Option<u64>,
    /// The command reads standard input sent to `POST …/commands/{cid}/stdin` (started
    /// commands only); otherwise its standard input is empty (`/dev/null`).
    #[serde(default)]
    pub stdin: bool,
    /// Run the command on a terminal of this size: its output (both streams in one) comes as
    /// stdout, closing its stdin types end-of-file, `POST …/commands/{cid}/resize` resizes it.
    #[serde(default)]
    pub tty: Option<TerminalSize>,
}

/// A terminal's size in characters.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    pub rows: u16,
    pub cols: u16,
}

impl From<forkbox_protocol::WinSize> for TerminalSize {
    fn from(w: forkbox_protocol::WinSize) -> TerminalSize {
        TerminalSize {
            rows: w.rows,
            cols: w.cols,
        }
    }
}

impl TerminalSize {
    /// Checked: 1 to 1000 rows and columns.
    pub fn checked(self) -> Result<forkbox_protocol::WinSize, Invalid> {
        if !(1..=1000).contains(&self.rows) || !(1..=1000).contains(&self.cols) {
            return Err(Invalid(format!(
                "terminal size {}x{} is not 1 to 1000 rows and columns",
                self.rows, self.cols
            )));
        }
        Ok(forkbox_protocol::WinSize {
            rows: self.rows,
            cols: self.cols,
        })
    }
}

/// Builds an image: the next version of `name`, from a recipe in the seed shape.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildRequest {
    pub name: String,
    #[serde(default)]
    pub recipe: Seed,
    /// Build only if the newest version of `name` came from a different recipe.
    #[serde(default)]
    pub if_changed: bool,
}

/// Most bytes one file read or write carries; larger trees go as archives.
pub const MAX_FILE_BYTES: usize = 64 << 20;
/// Most entries a directory listing returns.
pub const MAX_DIR_ENTRIES: usize = 10_000;

/// A path in a sandbox, checked once: absolute (a relative one is taken from `/root`, where
/// commands start), no NUL, at most 4096 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestPath(String);

impl GuestPath {
    pub fn parse(p: &str) -> Result<GuestPath, Invalid> {
        if p.is_empty() {
            return Err(Invalid("the path is empty".into()));
        }
        if p.contains('\0') || p.len() > 4096 {
            return Err(Invalid(format!(
                "path {:?} has a NUL byte or is over 4096 bytes",
                p.chars().take(64).collect::<String>()
            )));
        }
        Ok(GuestPath(if p.starts_with('/') {
            p.to_string()
        } else {
            format!("/root/{p}")
        }))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for GuestPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How an archive of a tree is compressed on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum ArchiveFormat {
    /// tar compressed with zstd: what the guest reads and writes.
    #[default]
    #[serde(rename = "tar.zst")]
    TarZst,
    /// tar compressed with gzip, re-encoded on the host (for clients with gzip only).
    #[serde(rename = "tar.gz")]
    TarGz,
}
