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
        | Code::VolumeNotFound
        | Code::NotFound => "not_found",
        Code::SnapshotExists | Code::VolumeExists => "already_exists",
        Code::SandboxHibernated
        | Code::SandboxNotHibernated
        | Code::SnapshotInUse
        | Code::SnapshotUnrestorable
        | Code::ImageInUse
        | Code::VolumeInUse
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

/// What went wrong with one E2B call: its HTTP status, its words, and forkbox's code when it
/// came from the daemon. Answered in the control plane's shape ([`Failure::into_response`]) or
/// as a Connect error ([`Failure::connect`]).
#[derive(Debug, Clone)]
pub struct Failure {
    pub status: u16,
    pub message: String,
    pub code: Option<Code>,
}

impl Failure {
    pub fn new(status: u16, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
            code: None,
        }
    }

    pub fn of(code: Code, message: impl Into<String>) -> Failure {
        Failure {
            status: code.http_status(),
            message: message.into(),
            code: Some(code),
        }
    }

    /// The same failure answered with HTTP status `status`.
    pub fn with_status(mut self, status: u16) -> Failure {
        self.status = status;
        self
    }

    /// What forkbox does not do, said where E2B's SDK would have used it.
    pub fn unsupported(what: &str) -> Failure {
        Failure::new(400, format!("forkbox does not support {what}"))
    }

    /// The Connect error code and message this failure is on the data plane.
    pub fn connect(&self) -> (&'static str, &str) {
        let code = match self.code {
            Some(c) => connect_code(c),
            None => match self.status {
                400 => "invalid_argument",
                401 => "unauthenticated",
                403 => "permission_denied",
                404 => "not_found",
                409 => "already_exists",
                429 | 507 => "resource_exhausted",
                501 => "unimplemented",
                502 | 503 => "unavailable",
                504 => "deadline_exceeded",
                _ => "internal",
            },
        };
        (code, &self.message)
    }

    /// The Connect error as a unary call's answer: its status and `{"code","message"}`.
    pub fn connect_response(&self) -> axum::response::Response {
        use axum::response::IntoResponse;
        let (code, message) = self.connect();
        let status = axum::http::StatusCode::from_u16(connect_status(code))
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            axum::Json(json!({ "code": code, "message": message })),
        )
            .into_response()
    }
}

impl From<forkbox_client::ClientError> for Failure {
    fn from(e: forkbox_client::ClientError) -> Failure {
        match &e {
            forkbox_client::ClientError::Api { status, code, .. } => Failure {
                status: *status,
                message: e.to_string(),
                code: Code::parse(code),
            },
            _ => Failure::new(503, e.to_string()),
        }
    }
}

impl axum::response::IntoResponse for Failure {
    /// The control plane's shape, `{"code": <status>, "message", "error_code"?}`.
    fn into_response(self) -> axum::response::Response {
        let status = axum::http::StatusCode::from_u16(self.status)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        let mut body = json!({ "code": self.status, "message": self.message });
        if let Some(c) = self.code {
            body["error_code"] = json!(c.as_str());
        }
        (status, axum::Json(body)).into_response()
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
