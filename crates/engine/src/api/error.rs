//! The engine's errors, and the HTTP status each maps to: one place for every front end.
//! Messages are meant for any client (the CLI, the SDKs, an agent over MCP), so they name no
//! command line.

use forkbox_protocol::ErrorKind;

use crate::error::{AgentError, ImageError, SandboxError, VmError};
use crate::files::{ArchiveError, TransferError};
use crate::snapshot::SnapshotError;
pub use forkbox_api::Code;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no sandbox {0}")]
    NoSuchSandbox(String),
    #[error("sandbox {0} is hibernated; resume it first")]
    Hibernated(String),
    #[error("sandbox {0} is running, not hibernated")]
    NotHibernated(String),
    #[error("sandbox {0} has no command {1}")]
    NoSuchCommand(String, String),
    #[error("no migration run {0}")]
    NoSuchMigration(String),
    /// Something a sandbox's own server names (a code context) is not there.
    #[error("{0}")]
    NotFound(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The request cannot be carried out in the state the thing it names is in.
    #[error("{0}")]
    Conflict(String),
    /// A request body over its limit.
    #[error("the request is too large: {0}")]
    TooLarge(String),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Transfer(#[from] TransferError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// A bug in forkbox (a request's task panicked, a reply of the wrong kind): never the
    /// request's fault.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<forkbox_api::Invalid> for EngineError {
    fn from(e: forkbox_api::Invalid) -> EngineError {
        EngineError::BadRequest(e.0)
    }
}

impl EngineError {
    /// A stable name for what went wrong, the same from every front end (`error.code` in the
    /// API's answers and in the CLI's `--json` errors); its HTTP status comes with it.
    pub fn code(&self) -> Code {
        match self {
            EngineError::NoSuchSandbox(_) => Code::SandboxNotFound,
            EngineError::NoSuchCommand(..) => Code::CommandNotFound,
            EngineError::Hibernated(_) => Code::SandboxHibernated,
            EngineError::NotHibernated(_) => Code::SandboxNotHibernated,
            EngineError::NoSuchMigration(_) | EngineError::NotFound(_) => Code::NotFound,
            EngineError::Conflict(_) => Code::Conflict,
            EngineError::BadRequest(_) => Code::BadRequest,
            EngineError::TooLarge(_) => Code::PayloadTooLarge,
            EngineError::Snapshot(e) => snapshot_code(e),
            EngineError::Sandbox(e) => sandbox_code(e),
            EngineError::Image(e) => image_code(e),
            EngineError::Transfer(e) => transfer_code(e),
            EngineError::State(_) | EngineError::Internal(_) => Code::Internal,
        }
    }

    /// The HTTP status this error is answered with: its code's.
    pub fn http_status(&self) -> u16 {
        self.code().http_status()
    }
}

/// [`EngineError::code`] of a sandbox's error, for front ends that meet one directly.
pub fn sandbox_code(e: &SandboxError) -> Code {
    match e {
        SandboxError::Snapshot(e) => snapshot_code(e),
        SandboxError::Image(e) => image_code(e),
        SandboxError::HostDiskFull { .. } => Code::HostDiskFull,
        SandboxError::Setup(_) | SandboxError::Vm(VmError::CpuModel { .. }) => Code::SetupNeeded,
        SandboxError::DiskTooSmall { .. } | SandboxError::Network(_) => Code::BadRequest,
        SandboxError::Agent(e) => agent_code(e),
        SandboxError::Volume(e) => volume_code(e),
        _ => Code::Internal,
    }
}

/// [`EngineError::code`] of a volume's error.
pub fn volume_code(e: &crate::error::VolumeError) -> Code {
    use crate::error::VolumeError;
    match e {
        VolumeError::NotFound(_) => Code::VolumeNotFound,
        VolumeError::Exists(_) => Code::VolumeExists,
        VolumeError::InUse { .. } => Code::VolumeInUse,
        VolumeError::NoRoom { .. } => Code::NoCapacity,
        VolumeError::Bad(_) => Code::BadRequest,
        VolumeError::Io { .. } => Code::Internal,
    }
}

/// [`EngineError::code`] of an image error, for front ends that meet one directly.
pub fn image_code(e: &ImageError) -> Code {
    match e {
        ImageError::NotFound { .. } => Code::ImageNotFound,
        ImageError::InUse { .. } => Code::ImageInUse,
        ImageError::BadReference(_)
        | ImageError::VersionNeeded { .. }
        | ImageError::RecipeInvalid { .. }
        | ImageError::RecipeUnreadable { .. } => Code::BadRequest,
        ImageError::BuildFailed { .. } => Code::BuildFailed,
        _ => Code::Internal,
    }
}

fn snapshot_code(e: &SnapshotError) -> Code {
    match e {
        SnapshotError::NotFound(_) => Code::SnapshotNotFound,
        SnapshotError::Exists(_) => Code::SnapshotExists,
        SnapshotError::InUse { .. } => Code::SnapshotInUse,
        SnapshotError::BadName(_) => Code::BadRequest,
        SnapshotError::Incompatible { .. } => Code::SnapshotUnrestorable,
        SnapshotError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::StorageFull
                || source.raw_os_error() == Some(libc::ENOSPC) =>
        {
            Code::NoCapacity
        }
        SnapshotError::Io { .. } => Code::Internal,
    }
}

fn transfer_code(e: &TransferError) -> Code {
    match e {
        TransferError::Agent(e) => agent_code(e),
        TransferError::Archive(ArchiveError::Refused { .. }) => Code::RefusedFromGuest,
        TransferError::Archive(_) => Code::Internal,
    }
}

fn agent_code(e: &AgentError) -> Code {
    match e {
        AgentError::Failed(_) => Code::SandboxFailed,
        AgentError::Refused { message, .. } if message.contains("No space left on device") => {
            Code::DiskFull
        }
        AgentError::Refused { kind, .. } => match kind {
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::PermissionDenied => Code::PermissionDenied,
            ErrorKind::InvalidRequest => Code::BadRequest,
            ErrorKind::Io => Code::Internal,
        },
        _ => Code::Internal,
    }
}
