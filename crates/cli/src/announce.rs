//! A `forkbox migrate` run told to the daemon of its home when one runs, so the daemon's
//! console shows it live and keeps it after it ends: registered at the start, its progress
//! posted as it goes (bursts folded: the newest phase of each plan, every note), its verdicts
//! and report at the end. Without a daemon, or when the daemon stops answering, the run goes
//! on the same; the daemon is told, never asked.

use std::collections::BTreeMap;
use std::time::Duration;

use forkbox_engine::api::{MigrationEvent, MigrationStart, PlanVerdict, MAX_REPORT_BYTES};
use forkbox_engine::paths::Paths;
use forkbox_migrate::flow::{Event, MigrateConfig, MigrateReport};
use tokio::sync::mpsc;

/// The least time between two posts of progress.
const PACE: Duration = Duration::from_millis(200);

pub struct Announcer {
    tx: std::sync::Mutex<Option<mpsc::UnboundedSender<MigrationEvent>>>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Announcer {
    /// Registers the run with the daemon of `paths`, if one answers.
    pub async fn start(paths: &Paths, cfg: &MigrateConfig) -> Announcer {
        let none = Announcer {
            tx: Default::default(),
            task: Default::default(),
        };
        let Ok(Some(client)) = crate::daemon::running_daemon(paths).await else {
            return none;
        };
        let start = MigrationStart {
            code: std::fs::canonicalize(&cfg.code)
                .unwrap_or_else(|_| cfg.code.clone())
                .display()
                .to_string(),
            from: cfg.from.clone(),
            to: cfg.to.clone(),
            test: cfg.test.clone(),
            plans: cfg.plans.iter().map(|p| p.name.clone()).collect(),
            pid: std::process::id(),
        };
        let id = match client.start_migration(&start).await {
            Ok(v) => v.id,
            Err(e) => {
                eprintln!("forkbox: the daemon was not told of this run (its console will not show it): {e}");
                return none;
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(post_all(client, id, rx));
        Announcer {
            tx: std::sync::Mutex::new(Some(tx)),
            task: std::sync::Mutex::new(Some(task)),
        }
    }

    /// Passes a progress event on.
    pub fn event(&self, ev: Event<'_>) {
        let Ok(tx) = self.tx.lock() else { return };
        let Some(tx) = tx.as_ref() else { return };
        let _ = tx.send(match ev {
            Event::Note(text) => MigrationEvent::Note {
                text: text.to_string(),
            },
            Event::Fork { plan, phase, tests } => MigrationEvent::Phase {
                plan: plan.to_string(),
                phase: phase.to_string(),
                tests,
            },
        });
    }

    /// Tells the end (the report, or the error) and waits a little for it to be posted.
    pub async fn finish(&self, report: Result<&MigrateReport, String>, out: &std::path::Path) {
        let Some(tx) = self.tx.lock().ok().and_then(|mut t| t.take()) else {
            return;
        };
        let end = match report {
            Ok(r) => {
                if let Some(b) = baseline(r) {
                    let _ = tx.send(b);
                }
                ended(r, out)
            }
            Err(error) => MigrationEvent::Ended {
                verdicts: vec![],
                winner: None,
                error: Some(error),
                report_html: None,
                out_dir: Some(out.display().to_string()),
            },
        };
        let _ = tx.send(end);
        drop(tx);
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

fn baseline(r: &MigrateReport) -> Option<MigrationEvent> {
    let results = serde_json::to_value(&r.baseline.results).ok()?;
    let all = results.as_object()?;
    let passed = all
        .values()
        .filter(|o| o.as_str() == Some("passed"))
        .count();
    Some(MigrationEvent::Baseline {
        passed,
        total: all.len(),
    })
}

fn ended(r: &MigrateReport, out: &std::path::Path) -> MigrationEvent {
    let verdicts = r
        .verdicts
        .iter()
        .map(|v| {
            let run = r.plans.iter().find(|p| p.plan == v.plan);
            PlanVerdict {
                plan: v.plan.clone(),
                accepted: v.accepted,
                reason: v.reason.clone(),
                lost: v.lost.clone(),
                diff_lines: run.map_or(0, |p| p.diff_lines),
                diff_stat: run.map(|p| p.diff_stat.clone()).unwrap_or_default(),
            }
        })
        .collect();
    let report_html = std::fs::read_to_string(out.join("report.html"))
        .ok()
        .filter(|h| h.len() <= MAX_REPORT_BYTES);
    MigrationEvent::Ended {
        verdicts,
        winner: r.winner.clone(),
        error: None,
        report_html,
        out_dir: Some(
            std::fs::canonicalize(out)
                .unwrap_or_else(|_| out.to_path_buf())
                .display()
                .to_string(),
        ),
    }
}

/// Posts events in order, a burst folded into its notes and each plan's newest phase.
async fn post_all(
    client: forkbox_client::Client,
    id: String,
    mut rx: mpsc::UnboundedReceiver<MigrationEvent>,
) {
    let mut warned = false;
    while let Some(first) = rx.recv().await {
        let mut burst = vec![first];
        while let Ok(ev) = rx.try_recv() {
            burst.push(ev);
        }
        for ev in fold(burst) {
            if let Err(e) = client.migration_event(&id, &ev).await {
                if !warned {
                    eprintln!("forkbox: the daemon was not told of this run's progress: {e}");
                    warned = true;
                }
            }
        }
        tokio::time::sleep(PACE).await;
    }
}

/// A burst of events with each plan's phases but its newest dropped (notes and the end kept,
/// in order).
fn fold(burst: Vec<MigrationEvent>) -> Vec<MigrationEvent> {
    let mut newest: BTreeMap<String, usize> = BTreeMap::new();
    for (i, ev) in burst.iter().enumerate() {
        if let MigrationEvent::Phase { plan, .. } = ev {
            newest.insert(plan.clone(), i);
        }
    }
    burst
        .into_iter()
        .enumerate()
        .filter(|(i, ev)| match ev {
            MigrationEvent::Phase { plan, .. } => newest.get(plan) == Some(i),
            _ => true,
        })
        .map(|(_, ev)| ev)
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn phase(plan: &str, tests: usize) -> MigrationEvent {
        MigrationEvent::Phase {
            plan: plan.into(),
            phase: "testing".into(),
            tests,
        }
    }

    #[test]
    fn a_burst_keeps_notes_and_each_plans_newest_phase() {
        let note = MigrationEvent::Note { text: "n".into() };
        let folded = fold(vec![phase("a", 1), note, phase("b", 1), phase("a", 7)]);
        let said: Vec<String> = folded
            .iter()
            .map(|e| match e {
                MigrationEvent::Phase { plan, tests, .. } => format!("{plan}{tests}"),
                MigrationEvent::Note { text } => text.clone(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(said, ["n", "b1", "a7"]);
    }
}
