//! Port forwards: a listener on the host whose connections become connections to a port on the
//! guest's own 127.0.0.1, over the agent channel (a sandbox has no network device).

use serde::{Deserialize, Serialize};

/// `POST /v1/sandboxes/{id}/ports`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortRequest {
    /// The port a program in the guest listens on (on 127.0.0.1 or any address), 1-65535.
    pub guest_port: u16,
    /// The host port to listen on (default: one the system picks).
    pub host_port: Option<u16>,
    /// The host address to listen on (default 127.0.0.1).
    pub address: Option<String>,
}

/// A port forward in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PortView {
    pub guest_port: u16,
    pub host_port: u16,
    pub address: String,
    /// `http://ADDRESS:HOST_PORT/`, for a guest port that serves HTTP.
    pub url: String,
    /// Through the daemon's TCP listener, when it has one: `http://PORT-ID.localhost:P/?
    /// forkbox_preview=TOKEN`, the token good for this sandbox and port alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_url: Option<String>,
}
