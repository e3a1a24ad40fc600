//! What the engine answers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{AccelDecision, ExitInfo, NetworkPolicy, PoolView, SandboxInfo, Stream, TtlAction};

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SandboxView {
    #[serde(flatten)]
    pub info: SandboxInfo,
    pub labels: BTreeMap<String, String>,
    pub created_unix: u64,
    /// When the daemon deletes it, if it has a TTL.
    pub expires_unix: Option<u64>,
    /// Whether it came ready-made from the warm pool (restored from the template ahead of
    /// time, already reseeded and named) rather than being restored for this request.
    #[serde(default)]
    pub from_pool: bool,
    /// `running`, `disk_full` (paused by a full host file system, nothing lost; resumes by
    /// itself once space is freed), `sleeping` (saved to disk, no VM; woken by the next call
    /// that needs it), `hibernated` (saved to disk, no VM, resumed by `resume`)
    /// `failed` (its guest broke the agent protocol; `failure` says how; delete it), or in a
    /// cluster `lost` (its node died or left; delete it).
    pub state: SandboxState,
    /// Why the sandbox failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    #[serde(default)]
    pub ttl_action: TtlAction,
    #[serde(default)]
    pub network: NetworkPolicy,
    /// The node that runs it, in a cluster (`forkbox serve --cluster`); absent on one daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// In a cluster, when the snapshot it started from was brought from other nodes for it:
    /// what moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<Transfer>,
    /// Its secrets' names and hosts (never their values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::SecretView>,
    /// When it sleeps by itself, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<crate::IdlePolicy>,
    /// Whether use wakes it while it sleeps.
    #[serde(default)]
    pub wake_on_use: bool,
    /// What the host decided about its connections lately, oldest first (at most
    /// [`NETWORK_LOG_LINES`]): tunnels refused by its policy, connections ended and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_log: Vec<NetworkNote>,
}

/// The most lines a sandbox's [`SandboxView::network_log`] keeps.
pub const NETWORK_LOG_LINES: usize = 64;

/// One line of a sandbox's network log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NetworkNote {
    pub at_unix: u64,
    pub text: String,
}

/// A snapshot or image brought to a node from the nodes that held it, by chunks: what moved
/// and what the node already had.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Transfer {
    /// The snapshot brought (with the image it needs, when the node lacked that too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The image brought (`NAME@N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The node it was brought to.
    pub node: String,
    /// The nodes chunks came from.
    pub from: Vec<String>,
    /// Bytes of chunks fetched from other nodes (the manifest not counted).
    pub bytes_moved: u64,
    /// Bytes of the RAM layers and disk files this node lacked (what a copy of everything
    /// above what it held would move; chunks found in its own files are not moved).
    pub needed_bytes: u64,
    /// Bytes of the manifest (the chunks' names, the device state).
    pub manifest_bytes: u64,
    pub chunks_fetched: u64,
    /// Chunks this node read from files it already held.
    pub chunks_local: u64,
    /// RAM layers copied whole from a RAM file this node held, of the snapshot's layers.
    pub layers_held: u32,
    pub layers: u32,
    /// Chunks that arrived corrupt (their bytes did not hash to their name) and were fetched
    /// again elsewhere.
    pub chunks_refetched: u64,
    /// Wall time from asking for the manifest to the snapshot published here.
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Running,
    DiskFull,
    Hibernated,
    /// Hibernated, and woken by the next call that needs it (`wake_on_use`).
    Sleeping,
    Failed,
    /// Its node left the cluster (`node` says which); what it held is gone with that node.
    Lost,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecResult {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

/// An image, as every front end shows it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImageView {
    /// `NAME@N`.
    pub reference: String,
    pub name: String,
    pub version: u32,
    /// The Debian suite it is built on.
    pub suite: String,
    /// What it was built on, when not a fresh Debian root: a forkbox image (`NAME@N`) or a
    /// registry's image pinned to its digest (`HOST/PATH@sha256:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The registry image under it, pinned (`HOST/PATH@sha256:…`), also through other images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulled: Option<String>,
    /// Where commands start unless they say (a registry image's `WorkingDir`); `/root` if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Who commands run as unless they say (a registry image's `User`); root if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The guest kernel release its sandboxes boot (as `guest_kernel` of a sandbox).
    #[serde(rename = "guest_kernel", alias = "kernel")]
    pub kernel: String,
    pub content_mib: u64,
    pub disk_mib: u64,
    pub created_unix: u64,
    pub build_seconds: f64,
    /// Environment every command in a sandbox of this image gets.
    pub env: BTreeMap<String, String>,
}

/// Progress of an image build, streamed as newline-delimited JSON (`type` tells which).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BuildProgress {
    /// A step starts: `n` of `total`.
    Step { n: u32, total: u32, what: String },
    /// A line of the running step's output.
    Log { line: String },
    /// The newest version of the name already came from this recipe (`if_changed`).
    UpToDate { image: ImageView },
    /// Built.
    Done { image: ImageView },
    /// The build failed; nothing was kept. `code` and `status` as an error answer's.
    Error {
        message: String,
        status: u16,
        #[serde(default)]
        code: String,
    },
}

/// One event of a streamed command, as newline-delimited JSON (`type` tells which): first
/// `command`, then output chunks, then `exit` or `error`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CommandEvent {
    Command {
        command_id: String,
    },
    Stdout {
        data_b64: String,
    },
    Stderr {
        data_b64: String,
    },
    Exit(ExitInfo),
    /// The command could not run, or the sandbox failed under it. `exit_code` is set when it
    /// could not start as a shell says it (127: not found, 126: not runnable).
    Error {
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
}

/// What `path` holds, one entry per name (not recursive).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DirListing {
    pub path: String,
    pub entries: Vec<DirEntry>,
    /// Set when the directory held more than [`crate::MAX_DIR_ENTRIES`] names; the rest are
    /// left out.
    pub truncated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DirEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: EntryKind,
    pub size: u64,
    /// Permission bits, e.g. 0o644 = 420.
    pub mode: u32,
    pub modified_unix: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One file written.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Written {
    pub path: String,
    pub bytes: u64,
}

/// A build under way in the daemon's home (by the daemon, or by a CLI of the same home).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BuildView {
    /// The image's name (its next version is what builds).
    pub name: String,
    /// The step that runs, `step` of `total` (0 of 0 before the first).
    pub step: u32,
    pub total: u32,
    /// What the step does.
    pub what: String,
    pub started_unix: u64,
    /// Seconds since it started.
    pub seconds: u64,
}

/// `2 min 10 s so far`, of `seconds`.
pub fn so_far(seconds: u64) -> String {
    format!("{} min {:02} s so far", seconds / 60, seconds % 60)
}

impl BuildView {
    /// `step 3 of 5: what (2 min 10 s so far)`, as every front end says it.
    pub fn summary(&self) -> String {
        let so_far = so_far(self.seconds);
        match self.step {
            0 => format!("starting ({so_far})"),
            n => format!("step {n} of {}: {} ({so_far})", self.total, self.what),
        }
    }
}

/// The first build of a carried image in a cluster, as the node that builds it logs it: the
/// lines from `?from=` on (`next` is where the next call starts).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BuildLogView {
    pub image: String,
    /// The node that builds it.
    pub node: String,
    /// Steps (`[n/total] what (at S s)`) and the build's log, in order.
    pub lines: Vec<String>,
    pub next: usize,
    /// Whether the build ended (built, or `error`).
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The daemon and its host.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InfoView {
    pub version: String,
    pub protocol_version: u32,
    pub home: String,
    /// The accelerator sandboxes get here (`kvm` or `tcg`) and why; absent before set-up.
    pub accel: Option<AccelDecision>,
    pub kernels: Vec<String>,
    pub images: Vec<String>,
    pub sandboxes: usize,
    /// The warm pool: ready sandboxes per configuration, and its bounds.
    pub pool: PoolView,
    /// This daemon's node name when it is a cluster's node (`serve --cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The QEMU its sandboxes run on, as it names itself (`QEMU emulator version 10.0.2 ...`):
    /// a snapshot saved by another restores nowhere here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu: Option<String>,
}

/// What a delete removed.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Deleted {
    pub deleted: String,
}

/// A command's output past chunk `from` (`GET .../commands/{cid}?from=N`), and its exit once
/// it ended.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CommandPoll {
    pub command_id: String,
    pub chunks: Vec<PolledChunk>,
    /// Pass as `from` next time.
    pub next: usize,
    /// Output dropped because the command printed more than is kept.
    pub dropped_bytes: u64,
    pub exit: Option<ExitInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PolledChunk {
    pub stream: Stream,
    pub data_b64: String,
}

/// A command started in the background.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CommandStarted {
    pub command_id: String,
}

/// Standard input passed to a started command.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StdinWritten {
    pub bytes: u64,
    /// Whether its standard input was closed after them (the command reads end of file).
    pub closed: bool,
}

/// An archive unpacked: the compressed bytes it took.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Unpacked {
    pub bytes: u64,
}

/// The daemon answers.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Health {
    pub ok: bool,
    /// forkbox's version.
    pub version: String,
    /// The host <-> guest agent protocol's version.
    pub protocol_version: u32,
}
