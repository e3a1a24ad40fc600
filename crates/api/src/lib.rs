//! forkbox's public API as types: every request, reply, event and error of the HTTP API, the
//! error `code` vocabulary with its HTTP statuses, and the route table. No engine, no I/O:
//! anything that talks to forkbox (the Rust client, the MCP server, a gateway) needs only this,
//! and the engine, the server and the OpenAPI document are built on the same types.
#![forbid(unsafe_code)]

pub mod carried;
pub mod code;
mod command;
mod error;
mod migration;
mod network;
mod pool;
mod port;
mod recipe;
mod reply;
mod request;
pub mod routes;
mod sandbox;
mod secret;
mod snapshot;
mod volume;

pub use code::{CodeContext, CodeContextRequest, CodeEvent, CodeResult, RunCodeRequest};
pub use command::*;
pub use error::{Code, ErrorBody, Invalid};
pub use migration::*;
pub use network::*;
pub use pool::*;
pub use port::*;
pub use recipe::*;
pub use reply::*;
pub use request::*;
pub use sandbox::*;
pub use secret::*;
pub use snapshot::*;
pub use volume::*;
