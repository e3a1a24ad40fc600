//! The forkbox engine: images, microVMs and sandboxes.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use forkbox_engine::{paths::Paths, sandbox::{Sandbox, SandboxConfig}};
//! use forkbox_protocol::{ExecSpec, Program};
//! let paths = Paths::from_env();
//! let sb = Sandbox::create(&paths, &SandboxConfig::default()).await?;
//! let out = sb.client().run(ExecSpec {
//!     program: Program::Shell("uname -r".into()),
//!     cwd: None, env: vec![], timeout_ms: Some(10_000), stdin: false, tty: None,
//! }).await?;
//! println!("guest kernel {}", out.stdout_text());
//! sb.destroy().await;
//! # Ok(()) }
//! ```

pub mod agent_bin;
pub mod api;
pub mod client;
pub mod commands;
mod cpio;
pub mod diskwatch;
pub mod doctor;
pub mod error;
pub mod fastram;
pub mod fds;
pub mod files;
pub mod guestlog;
pub mod image;
pub mod kernel;
pub mod limits;
pub mod metrics;
pub mod net;
pub mod paths;
pub mod pool;
pub mod procfs;
pub mod ram;
pub mod random;
pub mod runstate;
pub mod sandbox;
pub mod setup;
pub mod snapshot;
pub mod state;
pub mod vm;

pub use forkbox_protocol as protocol;
