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

// The engine in layers, top to bottom; a module names only its layer and those below
// (tests/layers.rs). The modules' own paths at the crate root (`forkbox_engine::paths`, …) are
// kept for the front ends.
pub mod api;
/// The errors of every layer (an error wraps the errors of what it called).
pub mod error;
pub mod host;
pub mod image;
pub mod lifecycle;
pub mod sandbox;
pub mod snapshot;
pub mod vm;

pub(crate) use host::cpio;
pub use host::{
    agent_bin, fds, guestlog, kernel, limits, metrics, paths, procfs, random, setup, tree,
};
pub use lifecycle::{commands, doctor, pool};
pub use sandbox::{
    activity, ca, client, diskwatch, files, intercept, net, packages, secrets, volumes,
};
pub use snapshot::{fastram, ram, runstate, state};

pub use forkbox_protocol as protocol;
