//! Builds under way, as any process reading the home sees them (`forkbox image ls`, E2B's
//! creates of a template still building): a build keeps `images/NAME/.progress-PID` (when it
//! started, its latest step) from its start to its end. One whose process is gone is not shown,
//! and the next build of its name removes it.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::BuildEvent;
use crate::paths::{write_atomic, Paths};
use crate::procfs::process_start;

const PREFIX: &str = ".progress-";

/// A build under way: its image's name and how far it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnderWay {
    pub name: String,
    /// The building process, and its start time (to tell it from a reused PID).
    pub pid: u32,
    pub pid_start: u64,
    pub started_unix: u64,
    /// The step that runs (`n` of `total`; 0 before the first).
    pub step: u32,
    pub total: u32,
    pub what: String,
}

impl UnderWay {
    /// Seconds since it started.
    pub fn seconds(&self) -> u64 {
        now().saturating_sub(self.started_unix)
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn alive(u: &UnderWay) -> bool {
    process_start(u.pid) == Some(u.pid_start)
}

fn read(path: &Path) -> Option<UnderWay> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

/// The progress file of one build, removed when the build ends (however it ends).
pub(crate) struct Progress {
    path: PathBuf,
    state: UnderWay,
}

impl Progress {
    /// A build of `name` starts in this process. Progress is advisory: a file that cannot be
    /// written makes the build no less a build.
    pub(crate) fn start(paths: &Paths, name: &str) -> Progress {
        let dir = paths.images().join(name);
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let stale = e.file_name().to_string_lossy().starts_with(PREFIX)
                && read(&e.path()).is_none_or(|u| !alive(&u));
            if stale {
                let _ = fs::remove_file(e.path());
            }
        }
        let pid = std::process::id();
        let p = Progress {
            path: dir.join(format!("{PREFIX}{pid}")),
            state: UnderWay {
                name: name.to_string(),
                pid,
                pid_start: process_start(pid).unwrap_or(0),
                started_unix: now(),
                step: 0,
                total: 0,
                what: String::new(),
            },
        };
        p.save();
        p
    }

    fn save(&self) {
        if let Ok(json) = serde_json::to_vec(&self.state) {
            let _ = write_atomic(&self.path, &json);
        }
    }

    /// Takes a step's start into the file.
    pub(crate) fn see(&mut self, ev: &BuildEvent) {
        if let BuildEvent::Step { n, total, what } = ev {
            self.state.step = *n;
            self.state.total = *total;
            self.state.what = what.clone();
            self.save();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The builds under way in this home, by name (their processes alive).
pub fn under_way(paths: &Paths) -> Vec<UnderWay> {
    let mut found = Vec::new();
    for name_dir in fs::read_dir(paths.images()).into_iter().flatten().flatten() {
        for e in fs::read_dir(name_dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if !e.file_name().to_string_lossy().starts_with(PREFIX) {
                continue;
            }
            if let Some(u) = read(&e.path()).filter(alive) {
                found.push(u);
            }
        }
    }
    found.sort_by(|a, b| {
        a.name
            .cmp(&b.name)
            .then(a.started_unix.cmp(&b.started_unix))
    });
    found
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_build_is_seen_while_it_runs_and_a_dead_ones_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::new(dir.path().to_path_buf());
        assert!(under_way(&paths).is_empty());
        let mut p = Progress::start(&paths, "base");
        p.see(&BuildEvent::Step {
            n: 2,
            total: 5,
            what: "apt-get install".into(),
        });
        p.see(&BuildEvent::Log("a line".into()));
        let seen = under_way(&paths);
        assert_eq!(seen.len(), 1);
        assert_eq!((seen[0].step, seen[0].total), (2, 5));
        assert_eq!(seen[0].what, "apt-get install");
        // A file a killed build left (its PID's start differs): not shown, and the next build
        // of the name removes it.
        let dead = UnderWay {
            pid_start: seen[0].pid_start + 1,
            ..seen[0].clone()
        };
        let left = paths.images().join("base").join(format!("{PREFIX}1"));
        fs::write(&left, serde_json::to_vec(&dead).unwrap()).unwrap();
        assert_eq!(under_way(&paths).len(), 1);
        drop(p);
        assert!(under_way(&paths).is_empty());
        let again = Progress::start(&paths, "base");
        assert!(!left.exists());
        drop(again);
        assert!(paths
            .images()
            .join("base")
            .read_dir()
            .unwrap()
            .next()
            .is_none());
    }
}
