//! The error vocabulary: every `code` an answer may carry, with its HTTP status. One list for
//! the engine, the server, the Rust client, MCP and both SDKs (whose error classes are checked
//! against [`Code::ALL`]).

use serde::{Deserialize, Serialize};

/// A request the API refuses as it reads it (a bad path, a terminal size out of range): the
/// engine answers it as `bad_request`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

macro_rules! codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal, $status:literal;)+) => {
        /// What went wrong, for programs: a stable name, the same from every front end.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum Code {
            $($(#[doc = $doc])* $variant,)+
        }

        impl Code {
            /// Every code, in the order of the list.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)+];

            /// The name on the wire (`error.code`, the CLI's `--json` errors).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $name,)+
                }
            }

            /// The HTTP status an answer with this code has.
            pub const fn http_status(self) -> u16 {
                match self {
                    $(Code::$variant => $status,)+
                }
            }

            /// The code of that name.
            pub fn parse(name: &str) -> Option<Code> {
                match name {
                    $($name => Some(Code::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

codes! {
    /// The request is malformed or asks for something impossible (its message says what).
    BadRequest = "bad_request", 400;
    /// A body over the API's limit for it (a JSON request's, a file's).
    PayloadTooLarge = "payload_too_large", 413;
    /// No bearer token, or not a valid one (TCP listener).
    Unauthorized = "unauthorized", 401;
    /// The guest refused for lack of permission, or the request came from a web page.
    PermissionDenied = "permission_denied", 403;
    SandboxNotFound = "sandbox_not_found", 404;
    CommandNotFound = "command_not_found", 404;
    SnapshotNotFound = "snapshot_not_found", 404;
    ImageNotFound = "image_not_found", 404;
    VolumeNotFound = "volume_not_found", 404;
    /// A path in the sandbox that is not there, or a route the API does not have.
    NotFound = "not_found", 404;
    SandboxHibernated = "sandbox_hibernated", 409;
    SandboxNotHibernated = "sandbox_not_hibernated", 409;
    /// Its guest broke the agent protocol; delete it.
    SandboxFailed = "sandbox_failed", 409;
    SnapshotExists = "snapshot_exists", 409;
    SnapshotInUse = "snapshot_in_use", 409;
    /// A snapshot this host cannot restore (another QEMU saved it, a disk it stands on is
    /// gone): the words say why; save it again.
    SnapshotUnrestorable = "snapshot_unrestorable", 409;
    ImageInUse = "image_in_use", 409;
    VolumeExists = "volume_exists", 409;
    /// A volume mounted read-write by one sandbox, or read-only by some (the message names
    /// them): it cannot be removed, nor mounted read-write by another.
    VolumeInUse = "volume_in_use", 409;
    Conflict = "conflict", 409;
    /// The request's `Host` is not a name of this daemon (DNS rebinding).
    MisdirectedRequest = "misdirected_request", 421;
    /// The sandbox's side refused an archive entry (a link out of the tree, a device file).
    RefusedFromGuest = "refused_from_guest", 502;
    /// The sandbox's own disk is full.
    DiskFull = "disk_full", 507;
    /// The host's file system is full; the sandbox is paused, nothing lost.
    HostDiskFull = "host_disk_full", 507;
    /// The host is not set up for sandboxes yet (no guest kernel, no agent, a missing
    /// program): `forkbox setup`, or the words say what.
    SetupNeeded = "setup_needed", 503;
    /// An image build's step failed; nothing was kept.
    BuildFailed = "build_failed", 500;
    /// Its node left the cluster (died or lost its lease): nothing on that node can be reached.
    SandboxLost = "sandbox_lost", 409;
    /// The cluster's state (etcd) has no quorum: creates, forks and deletes wait for it.
    ClusterUnavailable = "cluster_unavailable", 503;
    /// No node of the cluster has room for what was asked (the message says what is short).
    NoCapacity = "no_capacity", 503;
    /// The node that owns the sandbox did not answer a forwarded call.
    NodeUnreachable = "node_unreachable", 502;
    /// A bug in forkbox, or the host failing under it: never the request's fault.
    Internal = "internal", 500;
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong, for people: the same words every front end shows.
    pub error: String,
    /// What went wrong, for programs: a stable name (`sandbox_not_found`, `image_in_use`,
    /// `bad_request`, …), the same in the CLI's `--json` errors.
    pub code: String,
}

impl ErrorBody {
    pub fn new(code: Code, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: message.into(),
            code: code.as_str().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_name_that_reads_back_and_a_status_of_an_error() {
        let mut seen = std::collections::HashSet::new();
        for &c in Code::ALL {
            assert!(seen.insert(c.as_str()), "{c} twice");
            assert_eq!(Code::parse(c.as_str()), Some(c));
            assert_eq!(
                serde_json::to_value(c).ok(),
                Some(serde_json::Value::String(c.as_str().into()))
            );
            assert!((400..600).contains(&c.http_status()), "{c}");
        }
        assert_eq!(Code::parse("no_such_code"), None);
    }
}
