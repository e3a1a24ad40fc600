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
    /// A bug in forkbox (a request's task panicked, a reply of the wrong kind): never the
    /// request's fault.
    #[error("internal error: {0}")]
    Internal(String),
}

impl EngineError {
    /// A stable name for what went wrong, the same from every front end (`error.code` in the
    /// API's answers and in the CLI's `--json` errors).
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::NoSuchSandbox(_) => "sandbox_not_found",
            EngineError::NoSuchCommand(..) => "command_not_found",
            EngineError::Hibernated(_) => "sandbox_hibernated",
            EngineError::NotHibernated(_) => "sandbox_not_hibernated",
            EngineError::BadRequest(_) => "bad_request",
            EngineError::Snapshot(e) | EngineError::Sandbox(SandboxError::Snapshot(e)) => match e {
                SnapshotError::NotFound(_) => "snapshot_not_found",
                SnapshotError::Exists(_) => "snapshot_exists",
                SnapshotError::InUse { .. } => "snapshot_in_use",
                SnapshotError::BadName(_) | SnapshotError::Incompatible { .. } => "bad_request",
                SnapshotError::Io { .. } => "internal",
            },
            EngineError::Image(e) | EngineError::Sandbox(SandboxError::Image(e)) => image_code(e),
            EngineError::Sandbox(SandboxError::HostDiskFull { .. }) => "host_disk_full",
            EngineError::Sandbox(SandboxError::Agent(AgentError::Failed(_))) => "sandbox_failed",
            e => match e.http_status() {
                400 => "bad_request",
                403 => "permission_denied",
                404 => "not_found",
                409 => "conflict",
                502 => "refused_from_guest",
                507 => "disk_full",
                _ => "internal",
            },
        }
    }

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
            EngineError::Transfer(_)
            | EngineError::Sandbox(_)
            | EngineError::State(_)
            | EngineError::Internal(_) => 500,
        }
    }
}

/// [`EngineError::code`] of an image error, for front ends that meet one directly.
pub fn image_code(e: &ImageError) -> &'static str {
    match e {
        ImageError::NotFound { .. } => "image_not_found",
        ImageError::InUse { .. } => "image_in_use",
        ImageError::BadReference(_)
        | ImageError::VersionNeeded { .. }
        | ImageError::RecipeInvalid { .. }
        | ImageError::RecipeUnreadable { .. } => "bad_request",
        ImageError::BuildFailed { .. } => "build_failed",
        _ => "internal",
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
        ImageError::BadReference(_)
        | ImageError::VersionNeeded { .. }
        | ImageError::RecipeInvalid { .. } => 400,
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
