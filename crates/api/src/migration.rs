//! Runs of `forkbox migrate` as the daemon knows them: a run registers when a daemon is there
//! (`POST /v1/migrations`), tells its progress as it goes, and its verdicts when it ends; the
//! daemon keeps the last runs after they end, for the console.

use serde::{Deserialize, Serialize};

/// The most runs a daemon keeps (the oldest ended one goes first).
pub const KEEP_MIGRATIONS: usize = 50;
/// The largest report a run may leave with the daemon.
pub const MAX_REPORT_BYTES: usize = 8 << 20;

/// What a run says of itself when it starts.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MigrationStart {
    /// The code being ported (its directory on the host).
    pub code: String,
    /// The image it passes on, and the one it is ported to (`NAME@N` or a name).
    pub from: String,
    pub to: String,
    /// The test command.
    pub test: String,
    /// The plans' names, in order.
    pub plans: Vec<String>,
    /// The run's process on the daemon's host: a run whose process is gone without ending
    /// is shown as `gone`.
    pub pid: u32,
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MigrationState {
    Running,
    /// It ended with verdicts (a winner or none).
    Done,
    /// It ended with an error before its verdicts.
    Failed,
    /// Its process went away without saying it ended.
    Gone,
}

/// A plan's progress.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlanProgress {
    pub plan: String,
    /// Its fork's phase now (`forking`, `porting`, `testing`, `done`...).
    pub phase: String,
    /// Tests counted so far in its test run.
    pub tests: usize,
    /// When it entered that phase.
    pub since_unix: u64,
}

/// A plan's verdict.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PlanVerdict {
    pub plan: String,
    pub accepted: bool,
    pub reason: String,
    /// Tests that passed on the old toolchain and fail after this plan's port.
    pub lost: Vec<String>,
    pub diff_lines: u64,
    /// `git diff --stat` of its port.
    pub diff_stat: String,
}

/// An event of a run.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum MigrationEvent {
    /// A step of the run as a whole.
    Note { text: String },
    /// A plan's fork entered a phase, or counted more tests.
    Phase {
        plan: String,
        phase: String,
        tests: usize,
    },
    /// The baseline: tests that pass on the old toolchain, of how many.
    Baseline { passed: usize, total: usize },
    /// The run ended: its verdicts, the winner, and its report (HTML) to keep; or the error
    /// that ended it.
    Ended {
        #[serde(default)]
        verdicts: Vec<PlanVerdict>,
        winner: Option<String>,
        error: Option<String>,
        /// `report.html` as the run wrote it (at most [`MAX_REPORT_BYTES`]).
        report_html: Option<String>,
        /// Where the run wrote its report on the host.
        out_dir: Option<String>,
    },
}

/// A run as the daemon knows it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MigrationView {
    pub id: String,
    #[serde(flatten)]
    pub start: MigrationStart,
    pub state: MigrationState,
    pub started_unix: u64,
    pub ended_unix: Option<u64>,
    /// The last steps of the run (at most 20).
    pub notes: Vec<String>,
    /// Each plan's progress, in the order of `plans`.
    pub progress: Vec<PlanProgress>,
    pub baseline: Option<(usize, usize)>,
    pub verdicts: Vec<PlanVerdict>,
    pub winner: Option<String>,
    pub error: Option<String>,
    /// Whether the daemon holds its report (`/ui/migrations/{id}/report`).
    pub has_report: bool,
    pub out_dir: Option<String>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_run_reads_back_as_it_was_written() {
        // (Its start is flattened into it: no field of the view may share a start's name.)
        let v = MigrationView {
            id: "mg-1".into(),
            start: MigrationStart {
                code: "/c".into(),
                from: "a".into(),
                to: "b".into(),
                test: "t".into(),
                plans: vec!["p".into()],
                pid: 1,
            },
            state: MigrationState::Running,
            started_unix: 1,
            ended_unix: None,
            notes: vec![],
            progress: vec![PlanProgress {
                plan: "p".into(),
                phase: "testing".into(),
                tests: 2,
                since_unix: 1,
            }],
            baseline: Some((1, 2)),
            verdicts: vec![],
            winner: None,
            error: None,
            has_report: false,
            out_dir: None,
        };
        let json = serde_json::to_string(&v).unwrap();
        let back: MigrationView = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        let ev: MigrationEvent =
            serde_json::from_str(r#"{"type":"phase","plan":"p","phase":"x","tests":1}"#).unwrap();
        assert!(matches!(ev, MigrationEvent::Phase { tests: 1, .. }));
    }
}
