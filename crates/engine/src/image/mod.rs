//! Images: immutable, versioned root filesystems built from a recipe.
//!
//! An image `NAME@N` is a directory `images/NAME/N/` holding `rootfs.ext4` (read-only; every
//! sandbox writes to its own overlay), `recipe.toml` (what it was built from) and `image.json`
//! ([`ImageMeta`]). N counts the builds of NAME; `NAME` alone means the newest.

mod build;
pub mod bundled;
mod context;
mod docker;
pub mod dockerfile;
pub mod inputs;
pub mod layers;
pub mod oci;
pub mod progress;
mod recipe;
mod store;
mod workspace;

pub use build::{build, contained, env_pairs, BuildEvent};
pub use context::Context;
pub use docker::{build_dockerfile, build_dockerfile_of, inputs_of, DockerBuild};
pub use recipe::{valid_name, Base, Recipe, Seed, DEFAULT_SUITE, SUITES};
pub use store::{Image, ImageMeta, ImageRef, ImageStore, IMAGE_FORMAT};
pub use workspace::sweep_builds;
