//! The image recipes that ship inside forkbox (the repository's `images/`), so that its images
//! build themselves on first use wherever the binary runs: by the CLI in its own home, and by a
//! cluster on the node a create is placed on. The table is the API crate's, which E2B's front
//! end reads too.

pub use forkbox_api::carried::{recipe, RECIPES};
