//! Typed errors, one enum per domain. Messages say what failed, on what, and what to do.

use std::path::PathBuf;

const SETUP_HINT: &str = "run `forkbox setup` (as root) to install it";

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(
        "forkbox setup installs Debian packages and must run as root; try `sudo forkbox setup`"
    )]
    NotRoot,
    #[error("forkbox setup needs apt-get (Debian or Ubuntu); on other systems install QEMU (qemu-system-x86_64, qemu-img), mmdebstrap and e2fsprogs by hand")]
    NoApt,
    #[error("`{command}` failed ({status}): {detail}")]
    CommandFailed {
        command: String,
        status: String,
        detail: String,
    },
    #[error("no guest kernel in {dir}; {SETUP_HINT}", dir = .dir.display())]
    NoKernel { dir: PathBuf },
    #[error(
        "guest kernel {release} is unusable: {message}; remove it and run `forkbox setup` again"
    )]
    BadKernel { release: String, message: String },
    #[error("{program} was not found on this host; {SETUP_HINT}")]
    MissingProgram { program: String },
    #[error(
        "the guest agent binary was not found (looked in: {looked}); install forkbox with \
         scripts/install.sh (it puts the agent in PREFIX/lib/forkbox), or point FORKBOX_AGENT at it"
    )]
    NoAgent { looked: String },
    #[error("the guest agent at {path} is dynamically linked and cannot run as PID 1 in the guest; build it with scripts/build.sh", path = .path.display())]
    AgentNotStatic { path: PathBuf },
    #[error(
        "apt offers no version of {package}; check /etc/apt/sources.list and run `apt-get update`"
    )]
    NoPackage { package: String },
    #[error("apt offers {packages} in no common version (QEMU's candidate is {version}); add the Debian release they come from to apt's sources, or install them by hand in one `apt-get install`")]
    NoCommonVersion { packages: String, version: String },
    #[error("apt offers QEMU {offered} on {release}, older than 9.0 (copies could write their snapshot's RAM file; TCG guests need padded RAM); install QEMU 9.0 or later (Debian 13 has 10.0), or keep this one with `forkbox setup --qemu=system` (`forkbox doctor` then says what it leaves open)")]
    NoRecentQemu { offered: String, release: String },
    #[error("installing forkbox's packages would remove {packages}, which forkbox does not own; nothing was changed; decide by hand with `{command}`")]
    WouldRemove { packages: String, command: String },
    #[error("{program} does not run after installing {package}; see `{program} --version` and `apt-get install --reinstall {package}`")]
    DoesNotRun { program: String, package: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl SetupError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SetupError::Io {
            what: what.into(),
            source,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("recipe file {path} cannot be read: {source}", path = .path.display())]
    RecipeUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("recipe {path} is not valid: {message}", path = .path.display())]
    RecipeInvalid { path: PathBuf, message: String },
    #[error("no image {reference}; {available}")]
    NotFound {
        reference: String,
        available: String,
    },
    #[error("{0:?} is not an image reference: use NAME or NAME@N, where NAME is letters, digits, '-', '_' or '.'")]
    BadReference(String),
    #[error("removing an image needs its version, {name}@N; {versions}")]
    VersionNeeded { name: String, versions: String },
    #[error("image {reference} is in use by sandbox(es) {sandboxes}; remove them first")]
    InUse {
        reference: String,
        sandboxes: String,
    },
    #[error("image {name} is broken: {message}; remove it and build it again")]
    Corrupt { name: String, message: String },
    #[error("cannot pull {reference}: {message}")]
    Registry { reference: String, message: String },
    #[error("layer {layer} of {reference} is refused: {source}")]
    Layer {
        reference: String,
        layer: String,
        source: crate::image::layers::LayerError,
    },
    #[error("building image {name} failed at step '{step}': {message}")]
    BuildFailed {
        name: String,
        step: String,
        message: String,
    },
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl ImageError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ImageError::Io {
            what: what.into(),
            source,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("could not confine QEMU: {detail} (FORKBOX_JAIL=off runs it unconfined)")]
    Jail { detail: String },
    #[error("KVM was requested, but this host cannot run a standard guest under KVM ({reason}); use --accel tcg, or --accel auto to choose")]
    KvmUnavailable { reason: String },
    #[error("{reason}")]
    CpuModel { reason: String },
    #[error("QEMU could not be started ({program}): {source}; {SETUP_HINT}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("the VM exited before its agent was ready ({status}).\nQEMU said: {qemu_stderr}\nlast console lines:\n{console_tail}")]
    DiedDuringBoot {
        status: String,
        qemu_stderr: String,
        console_tail: String,
    },
    #[error("the VM's agent did not answer within {secs} s of start (accelerator {accel}).\nlast console lines:\n{console_tail}")]
    BootTimeout {
        secs: u64,
        accel: String,
        console_tail: String,
    },
    #[error("could not create the disk overlay for {image}: {detail}")]
    Overlay { image: String, detail: String },
    #[error("QEMU refused `{command}`: {message}")]
    Qmp { command: String, message: String },
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl VmError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        VmError::Io {
            what: what.into(),
            source,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the connection to the guest agent was lost (the VM stopped or crashed)")]
    Disconnected,
    /// The host stopped talking to this guest: it broke the protocol (see
    /// [`crate::client::AgentClient::failure`]).
    #[error("the sandbox failed: {0}; nothing more can run in it, delete it")]
    Failed(String),
    #[error(transparent)]
    Protocol(#[from] forkbox_protocol::ProtocolError),
    #[error("in the sandbox: {message}")]
    Refused {
        kind: forkbox_protocol::ErrorKind,
        message: String,
    },
    #[error("unexpected reply from the guest agent: {0}")]
    Unexpected(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error("{error}\nlast console lines of the VM:\n{console_tail}")]
    Died {
        error: AgentError,
        console_tail: String,
    },
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error(transparent)]
    Snapshot(crate::snapshot::SnapshotError),
    #[error("network policy: {0}")]
    Network(#[from] crate::net::PolicyError),
    #[error("a disk of {asked_mib} MiB is smaller than the image's ({minimum_mib} MiB); ask for at least that")]
    DiskTooSmall { asked_mib: u64, minimum_mib: u64 },
    #[error("the command did not finish within its timeout of {secs} s plus a grace period, and the guest agent did not report it killed: the guest is overloaded (a fork bomb, memory pressure) or its agent is stuck. The sandbox still runs; delete it if it does not recover")]
    Unresponsive { secs: u64 },
    #[error("the host's file system holding {} is full ({free_mib} MiB free): the sandbox is paused where it stood, nothing lost, and resumes by itself once {} MiB are free there; free space on the host (deleting old snapshots frees the most)", dir.display(), crate::diskwatch::RESUME_FREE_BYTES >> 20)]
    HostDiskFull {
        dir: std::path::PathBuf,
        free_mib: u64,
    },
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

/// What can go wrong with a volume.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("no volume {0} (forkbox volume ls lists them; forkbox volume create {0} makes it)")]
    NotFound(String),
    #[error("volume {0} exists already")]
    Exists(String),
    #[error("volume {name} is in use: {holders}")]
    InUse { name: String, holders: String },
    #[error("no room for volume {name}: it takes {want_mib} MiB on the host at once and must leave {reserve_mib} MiB free for sandboxes, and {} has {free_mib} MiB free", dir.display())]
    NoRoom {
        name: String,
        want_mib: u64,
        free_mib: u64,
        reserve_mib: u64,
        dir: PathBuf,
    },
    #[error("{0}")]
    Bad(String),
    #[error("volume {name}: {what}: {source}")]
    Io {
        name: String,
        what: String,
        source: std::io::Error,
    },
}

impl VolumeError {
    pub fn io(name: &str, what: impl Into<String>, source: std::io::Error) -> Self {
        VolumeError::Io {
            name: name.to_string(),
            what: what.into(),
            source,
        }
    }
}

impl SandboxError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SandboxError::Io {
            what: what.into(),
            source,
        }
    }
}
