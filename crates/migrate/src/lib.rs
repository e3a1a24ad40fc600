//! `forkbox migrate`: record which tests pass on the old toolchain, port the code in one fork
//! per plan on the new toolchain, and accept only ports that lose no test.
//!
//! ```text
//! baseline  old image: upload code, run the tests RUNS times, mark flaky tests
//! prepare   new image: upload code, `git init` + commit "baseline", setup steps, snapshot
//! fork      one copy of the snapshot per plan, all at once
//! port      each plan's porter in its fork
//! verify    the tests again in each fork; `git diff` against the baseline commit
//! decide    lost = passed before and not now (flaky excluded); smallest accepted diff wins
//! ```

pub mod decide;
pub mod flow;
pub mod llm;
pub mod plans;
pub mod report;
pub mod reports;

pub use flow::{migrate, Event, MigrateConfig, MigrateError, Progress};
