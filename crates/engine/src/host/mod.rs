//! The host under everything: forkbox's home and its layout (`paths`), set-up, the guest
//! kernel and initramfs, the agent binary, randomness, resource limits and descriptors, `/proc`,
//! logging of what guests say, metrics.

pub mod agent_bin;
pub(crate) mod cpio;
pub mod fds;
pub mod guestlog;
pub mod kernel;
pub mod limits;
pub mod metrics;
pub mod paths;
pub mod procfs;
pub mod random;
pub mod setup;
/// Removing trees without crossing a mount (the `forkbox-hostfs` crate).
pub use forkbox_hostfs as tree;
