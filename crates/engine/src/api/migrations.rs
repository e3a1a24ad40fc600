//! Runs of `forkbox migrate` registered with the daemon: kept in memory and in
//! `migrations/runs.json` under the home (so a restarted daemon still shows them), each ended
//! run's report beside it as `migrations/ID.html`; the last [`KEEP_MIGRATIONS`] runs.

use std::path::PathBuf;

use super::{
    Engine, EngineError, MigrationEvent, MigrationStart, MigrationState, MigrationView,
    PlanProgress, KEEP_MIGRATIONS, MAX_REPORT_BYTES,
};
use crate::error::SandboxError;

/// Notes a run keeps (the last ones).
const KEEP_NOTES: usize = 20;

#[derive(Default)]
pub(super) struct Migrations {
    runs: std::sync::Mutex<Option<Vec<MigrationView>>>,
}

fn dir(engine: &Engine) -> PathBuf {
    engine.paths.home().join("migrations")
}

fn io(what: &str, e: std::io::Error) -> EngineError {
    EngineError::Sandbox(SandboxError::io(what, e))
}

fn alive(pid: u32) -> bool {
    pid > 0 && std::path::Path::new(&format!("/proc/{pid}")).exists()
}

impl Engine {
    /// Runs the daemon knows, newest first; a running one whose process is gone is `gone`.
    pub(super) fn migrations(&self) -> Result<Vec<MigrationView>, EngineError> {
        self.with_runs(|runs| {
            let mut changed = false;
            for r in runs.iter_mut() {
                if r.state == MigrationState::Running && !alive(r.start.pid) {
                    r.state = MigrationState::Gone;
                    changed = true;
                }
            }
            let mut all = runs.clone();
            all.reverse();
            Ok((all, changed))
        })
    }

    pub(super) fn start_migration(
        &self,
        start: MigrationStart,
    ) -> Result<MigrationView, EngineError> {
        if start.plans.is_empty() || start.plans.len() > 64 {
            return Err(EngineError::BadRequest(
                "a migration names 1 to 64 plans".into(),
            ));
        }
        let id = format!(
            "mg-{}",
            crate::random::hex(5).map_err(|e| io("draw an id", e))?
        );
        let now = super::now_unix();
        let view = MigrationView {
            id,
            progress: start
                .plans
                .iter()
                .map(|p| PlanProgress {
                    plan: p.clone(),
                    phase: "waiting".into(),
                    tests: 0,
                    since_unix: now,
                })
                .collect(),
            start,
            state: MigrationState::Running,
            started_unix: now,
            ended_unix: None,
            notes: vec![],
            baseline: None,
            verdicts: vec![],
            winner: None,
            error: None,
            has_report: false,
            out_dir: None,
        };
        self.with_runs(|runs| {
            runs.push(view.clone());
            let excess = runs.len().saturating_sub(KEEP_MIGRATIONS);
            for gone in runs.drain(..excess) {
                let _ = std::fs::remove_file(dir(self).join(format!("{}.html", gone.id)));
            }
            Ok((view, true))
        })
    }

    pub(super) fn migration_event(
        &self,
        id: &str,
        event: MigrationEvent,
    ) -> Result<MigrationView, EngineError> {
        if let MigrationEvent::Ended {
            report_html: Some(html),
            ..
        } = &event
        {
            if html.len() > MAX_REPORT_BYTES {
                return Err(EngineError::BadRequest(format!(
                    "a report of {} bytes is over the {MAX_REPORT_BYTES} a daemon keeps",
                    html.len()
                )));
            }
            std::fs::create_dir_all(dir(self)).map_err(|e| io("create migrations/", e))?;
            crate::paths::write_atomic(&dir(self).join(format!("{id}.html")), html.as_bytes())
                .map_err(|e| io("keep a migration's report", e))?;
        }
        self.with_runs(|runs| {
            let run = runs
                .iter_mut()
                .find(|r| r.id == id)
                .ok_or_else(|| EngineError::NoSuchMigration(id.to_string()))?;
            apply(run, event);
            Ok((run.clone(), true))
        })
    }

    /// A kept report's HTML.
    pub fn migration_report(&self, id: &str) -> Option<Vec<u8>> {
        let ok = id.starts_with("mg-") && id[3..].chars().all(|c| c.is_ascii_hexdigit());
        ok.then(|| std::fs::read(dir(self).join(format!("{id}.html"))).ok())
            .flatten()
    }

    /// `f` on the runs (read from disk the first time), saving them when it says they changed.
    fn with_runs<T>(
        &self,
        f: impl FnOnce(&mut Vec<MigrationView>) -> Result<(T, bool), EngineError>,
    ) -> Result<T, EngineError> {
        let mut guard = self
            .migrations
            .runs
            .lock()
            .map_err(|_| EngineError::Internal("the migration runs are poisoned".into()))?;
        let runs = guard.get_or_insert_with(|| {
            std::fs::read(dir(self).join("runs.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default()
        });
        let (out, changed) = f(runs)?;
        if changed && self.db.is_some() {
            let json = serde_json::to_vec(&*runs)
                .map_err(|e| EngineError::Internal(format!("migration runs as JSON: {e}")))?;
            std::fs::create_dir_all(dir(self)).map_err(|e| io("create migrations/", e))?;
            crate::paths::write_atomic(&dir(self).join("runs.json"), &json)
                .map_err(|e| io("save the migration runs", e))?;
        }
        Ok(out)
    }
}

fn apply(run: &mut MigrationView, event: MigrationEvent) {
    let now = super::now_unix();
    match event {
        MigrationEvent::Note { text } => {
            run.notes.push(text);
            let excess = run.notes.len().saturating_sub(KEEP_NOTES);
            run.notes.drain(..excess);
        }
        MigrationEvent::Phase { plan, phase, tests } => {
            match run.progress.iter_mut().find(|p| p.plan == plan) {
                Some(p) => {
                    if p.phase != phase {
                        p.since_unix = now;
                    }
                    p.phase = phase;
                    p.tests = tests;
                }
                None => run.progress.push(PlanProgress {
                    plan,
                    phase,
                    tests,
                    since_unix: now,
                }),
            }
        }
        MigrationEvent::Baseline { passed, total } => run.baseline = Some((passed, total)),
        MigrationEvent::Ended {
            verdicts,
            winner,
            error,
            report_html,
            out_dir,
        } => {
            run.state = if error.is_some() {
                MigrationState::Failed
            } else {
                MigrationState::Done
            };
            run.ended_unix = Some(now);
            run.verdicts = verdicts;
            run.winner = winner;
            run.error = error;
            run.has_report = report_html.is_some();
            run.out_dir = out_dir;
        }
    }
}
