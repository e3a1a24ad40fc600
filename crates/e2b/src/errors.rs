//! forkbox's error codes in the shapes E2B's SDKs require. The control plane answers
//! `{"code": <HTTP status>, "message": "…"}` with that status (Python's SDK parses every error
//! body and fails on one without `code`; JavaScript's `kill` reads `code == 404` from the body);
//! the in-sandbox services answer a Connect error code (`not_found`, …), which the SDKs map to
//! their exceptions (not_found → NotFound, unavailable → SandboxNotRunning, …).

use forkbox_api::Code;
use serde_json::{json, Value};

/// The control plane's error body for `code` with `message`, and its status.
pub fn control_plane(code: Code, message: &str) -> (u16, Value) {
    let status = code.http_status();
    (
        status,
        json!({ "code": status, "message": message, "error_code": code.as_str() }),
    )
}

/// The Connect code a service answers `code` with.
pub fn connect_code(code: Code) -> &'static str {
    match code {
        Code::BadRequest | Code::MisdirectedRequest => "invalid_argument",
        Code::Unauthorized => "unauthenticated",
        Code::PermissionDenied | Code::RefusedFromGuest => "permission_denied",
        Code::SandboxNotFound
        | Code::CommandNotFound
        | Code::SnapshotNotFound
        | Code::ImageNotFound
        | Code::NotFound => "not_found",
        Code::SnapshotExists => "already_exists",
        Code::SandboxHibernated
        | Code::SandboxNotHibernated
        | Code::SnapshotInUse
        | Code::ImageInUse
        | Code::Conflict => "failed_precondition",
        // The SDKs call a sandbox that does not answer "not running".
        Code::SandboxFailed
        | Code::SandboxLost
        | Code::ClusterUnavailable
        | Code::NodeUnreachable
        | Code::SetupNeeded => "unavailable",
        Code::PayloadTooLarge | Code::DiskFull | Code::HostDiskFull | Code::NoCapacity => {
            "resource_exhausted"
        }
        Code::BuildFailed | Code::Internal => "internal",
    }
}

/// The HTTP status a unary Connect call answers with for a Connect `code` (the protocol's
/// table).
pub fn connect_status(code: &str) -> u16 {
    match code {
        "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
        "unauthenticated" => 401,
        "permission_denied" => 403,
        "not_found" => 404,
        "already_exists" | "aborted" => 409,
        "resource_exhausted" => 429,
        "canceled" => 499,
        "unimplemented" => 501,
        "unavailable" => 503,
        "deadline_exceeded" => 504,
        _ => 500,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_both_shapes() {
        for c in Code::ALL {
            let (status, body) = control_plane(*c, "m");
            assert_eq!(body["code"], status, "{c:?}");
            assert_eq!(body["message"], "m");
            let connect = connect_code(*c);
            assert_ne!(connect_status(connect), 0);
        }
        assert_eq!(control_plane(Code::SandboxNotFound, "gone").0, 404);
        assert_eq!(connect_code(Code::SandboxNotFound), "not_found");
        assert_eq!(connect_status("not_found"), 404);
    }
}
