//! The engine's errors, and the HTTP status each maps to: one place for every front end.
//! Messages are meant for any client (the CLI, the SDKs, an agent over MCP), so they name no
//! command line.

use forkbox_protocol::ErrorKind;

use crate::error::{AgentError, ImageError, SandboxError};
use crate::files::TransferError;
use crate::snapshot::SnapshotError;

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
    #[error("bad request: {0}")]
    BadRequest(String),
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
}

impl EngineError {
    /// The HTTP status this error is answered with.
    pub fn http_status(&self) -> u16 {
        match self {
            EngineError::NoSuchSandbox(_) | EngineError::NoSuchCommand(..) => 404,
            EngineError::BadRequest(_) => 400,
            EngineError::Hibernated(_) | EngineError::NotHibernated(_) => 409,
            EngineError::Snapshot(e) | EngineError::Sandbox(SandboxError::Snapshot(e)) => {
                snapshot_status(e)
            }
            EngineError::Image(e) | EngineError::Sandbox(SandboxError::Image(e)) => image_status(e),
            EngineError::Sandbox(SandboxError::DiskTooSmall { .. } | SandboxError::Network(_)) => {
                400
            }
            EngineError::Sandbox(SandboxError::Agent(e)) => agent_status(e),
            EngineError::Sandbox(SandboxError::HostDiskFull { .. }) => 507,
            EngineError::Transfer(TransferError::Agent(e)) => agent_status(e),
            EngineError::Transfer(TransferError::Refused { .. }) => 502,
            EngineError::Transfer(_) | EngineError::Sandbox(_) | EngineError::State(_) => 500,
        }
    }
}

fn snapshot_status(e: &SnapshotError) -> u16 {
    match e {
        SnapshotError::NotFound(_) => 404,
        SnapshotError::Exists(_) | SnapshotError::InUse { .. } => 409,
        SnapshotError::BadName(_) | SnapshotError::Incompatible { .. } => 400,
        SnapshotError::Io { .. } => 500,
    }
}

fn image_status(e: &ImageError) -> u16 {
    match e {
        // Asking for an image that is not there is the request's fault, as when creating.
        ImageError::NotFound { .. } => 404,
        ImageError::BadReference(_) | ImageError::RecipeInvalid { .. } => 400,
        ImageError::InUse { .. } => 409,
        _ => 500,
    }
}

fn agent_status(e: &AgentError) -> u16 {
    match e {
        AgentError::Failed(_) => 409,
        AgentError::Refused { message, .. } if message.contains("No space left on device") => 507,
        AgentError::Refused { kind, .. } => match kind {
            ErrorKind::NotFound => 404,
            ErrorKind::PermissionDenied => 403,
            ErrorKind::InvalidRequest => 400,
            ErrorKind::Io => 500,
        },
        _ => 500,
    }
}
