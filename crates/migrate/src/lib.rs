//! `forkbox migrate`: record which tests pass on the old toolchain, port the code in one fork
//! per plan on the new toolchain, and accept only ports that lose no test.
//!
//! ```text
//! baseline  old image: upload code, run the tests RUNS times, mark flaky tests
//! prepare   new image: upload code, `git init` + commit "baseline", setup steps, snapshot
//! fork      one copy of the snapshot per plan, all at once
//! port      each plan's porter in its fork; its patch = `git diff` against the prepared tree,
//!           taken before any test runs (what a test run writes is undone after it)
//! verify    the tests again in each fork
//! decide    lost = passed before and failed, errored or missing now (flaky excluded; see
//!           `decide`); changes to test files listed (`integrity`), rejected with
//!           `protect_tests`; smallest accepted diff wins
//! ```

pub mod decide;
pub mod flow;
pub mod integrity;
pub mod llm;
pub mod plans;
pub mod report;
pub mod runners;
mod suite;

pub use flow::{migrate, Event, MigrateConfig, MigrateError, Progress, REPORT_SCHEMA};
/// Reading test results (its own crate, shared with the MCP server).
pub use forkbox_reports as reports;
