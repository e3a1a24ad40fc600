//! Records of live sandboxes under `run/`, and cleaning up after owners that died.
//!
//! Each sandbox has `run/<id>/` with `sandbox.json`: which image it uses, which process owns it
//! and which QEMU runs it. An owner that died (even by SIGKILL) leaves a record whose owner is
//! gone; the next engine start kills its QEMU, after checking that the PID is still that QEMU,
//! and removes the directory.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::paths::{write_atomic, Paths};

pub use crate::procfs::process_start;
pub use forkbox_api::DaemonRecord;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunRecord {
    pub id: String,
    pub image: String,
    pub owner_pid: u32,
    pub owner_start: u64,
    pub qemu_pid: Option<u32>,
    /// Start time of the QEMU process, to tell it from a later process with its PID.
    #[serde(default)]
    pub qemu_start: Option<u64>,
    pub created_unix: u64,
    /// Set once the daemon has recorded the sandbox (in its state database, before reporting
    /// it created): such a sandbox is the daemon's to re-adopt after a crash, and the sweep
    /// leaves it alone.
    #[serde(default, deserialize_with = "daemon_mark")]
    pub daemon: DaemonMark,
}

/// Whether a run record is the daemon's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(into = "bool")]
pub enum DaemonMark {
    #[default]
    No,
    Yes,
    /// Written by a forkbox before the state database: the record itself, to import.
    Legacy(Box<DaemonRecord>),
}

impl DaemonMark {
    pub fn is_some(&self) -> bool {
        *self != DaemonMark::No
    }
}

impl From<DaemonMark> for bool {
    fn from(m: DaemonMark) -> bool {
        m.is_some()
    }
}

fn daemon_mark<'de, D: serde::Deserializer<'de>>(d: D) -> Result<DaemonMark, D::Error> {
    Ok(match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => {
            DaemonMark::No
        }
        Some(serde_json::Value::Bool(true)) => DaemonMark::Yes,
        Some(v) => serde_json::from_value(v)
            .map(|r| DaemonMark::Legacy(Box::new(r)))
            .unwrap_or(DaemonMark::Yes),
    })
}

fn alive(pid: u32, start: u64) -> bool {
    process_start(pid) == Some(start)
}

pub struct RunDir {
    pub dir: PathBuf,
    pub record: RunRecord,
}

impl RunDir {
    pub fn create(paths: &Paths, id: &str, image: &str) -> std::io::Result<RunDir> {
        let dir = paths.run().join(id);
        fs::create_dir_all(&dir)?;
        fs::create_dir_all(paths.disks().join(id))?;
        let me = std::process::id();
        let record = RunRecord {
            id: id.into(),
            image: image.into(),
            owner_pid: me,
            owner_start: process_start(me).unwrap_or(0),
            qemu_pid: None,
            qemu_start: None,
            daemon: DaemonMark::No,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        let rd = RunDir { dir, record };
        rd.save()?;
        Ok(rd)
    }

    /// Takes over the record in `dir` for this process (after a restart).
    pub fn adopt(dir: &Path) -> Option<RunDir> {
        let mut record = read_record(dir)?;
        let me = std::process::id();
        record.owner_pid = me;
        record.owner_start = process_start(me).unwrap_or(0);
        let rd = RunDir {
            dir: dir.to_path_buf(),
            record,
        };
        rd.save().ok()?;
        Some(rd)
    }

    pub fn save(&self) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(&self.record).map_err(std::io::Error::other)?;
        write_atomic(&self.dir.join("sandbox.json"), &json)
    }

    pub fn remove(&self) {
        crate::tree::discard_tree(&self.dir);
        if let (Some(home), Some(id)) = (
            self.dir.parent().and_then(Path::parent),
            self.dir.file_name(),
        ) {
            crate::snapshot::release_disk_dir(home, &id.to_string_lossy());
        }
    }

    /// Where this sandbox's disk overlays live (created on first use).
    pub fn disk_dir(&self) -> PathBuf {
        let home = self
            .dir
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("/"));
        let id = self.dir.file_name().unwrap_or_default();
        home.join("disks").join(id)
    }
}

impl Drop for RunDir {
    /// A sandbox's files live exactly as long as its record in this process, so that an
    /// interrupted create (a dropped future) leaves nothing behind.
    fn drop(&mut self) {
        self.remove();
    }
}

/// Records of sandboxes a daemon reported created, for it to re-adopt: (directory, record).
pub fn daemon_records(paths: &Paths) -> Vec<(PathBuf, RunRecord)> {
    fs::read_dir(paths.run())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| read_record(&e.path()).map(|r| (e.path(), r)))
        .filter(|(_, r)| r.daemon.is_some())
        .collect()
}

fn read_record(dir: &Path) -> Option<RunRecord> {
    serde_json::from_slice(&fs::read(dir.join("sandbox.json")).ok()?).ok()
}

/// Sandboxes whose owner is alive, or that a daemon will re-adopt: (id, image reference).
pub fn live(paths: &Paths) -> Vec<(String, String)> {
    fs::read_dir(paths.run())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| read_record(&e.path()))
        .filter(|r| alive(r.owner_pid, r.owner_start) || r.daemon.is_some())
        .map(|r| (r.id, r.image))
        .collect()
}

/// Kills every QEMU process whose command line names this sandbox directory's agent socket.
pub fn kill_qemus_of(dir: &Path) {
    let needle = dir.join("agent.sock").display().to_string();
    let mut killed = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let is_qemu =
            fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.starts_with("qemu"));
        if is_qemu
            && fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            killed.push(pid);
        }
    }
    if killed.is_empty() {
        return;
    }
    // Once they are gone their cgroups can go too (a cgroup holding a dying process cannot).
    let start = std::time::Instant::now();
    while killed
        .iter()
        .any(|p| Path::new(&format!("/proc/{p}")).exists())
        && start.elapsed() < std::time::Duration::from_secs(3)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if let Some(name) = dir.file_name() {
        crate::limits::remove(name.to_string_lossy().trim_start_matches('.'));
    }
}

/// What a sweep removed.
#[derive(Debug, Default)]
pub struct Swept {
    /// Sandboxes whose owner died.
    pub sandboxes: Vec<String>,
    /// Half-made snapshots and templates of operations that were killed.
    pub unfinished: Vec<std::path::PathBuf>,
    /// Cgroups of QEMUs that are gone.
    pub cgroups: Vec<String>,
}

impl Swept {
    /// One sentence per kind of leftover, for a log.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.sandboxes.is_empty() {
            out.push(format!(
                "removed {} sandbox(es) whose owner died: {}",
                self.sandboxes.len(),
                self.sandboxes.join(", ")
            ));
        }
        if !self.unfinished.is_empty() {
            let names: Vec<String> = self
                .unfinished
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            out.push(format!(
                "removed {} unfinished snapshot(s) of killed operations: {}",
                names.len(),
                names.join(", ")
            ));
        }
        if !self.cgroups.is_empty() {
            out.push(format!(
                "removed {} cgroup(s) of QEMUs that are gone: {}",
                self.cgroups.len(),
                self.cgroups.join(", ")
            ));
        }
        out
    }
}

/// Kills and removes sandboxes whose owner died, and what killed operations left.
pub fn sweep(paths: &Paths) -> Swept {
    let mut cleaned = Vec::new();
    for e in fs::read_dir(paths.run()).into_iter().flatten().flatten() {
        let dir = e.path();
        match read_record(&dir) {
            Some(r) if alive(r.owner_pid, r.owner_start) => {}
            // The daemon re-adopts these (or cleans them) when it starts.
            Some(r) if r.daemon.is_some() => {}
            Some(r) => {
                // The record may predate the QEMU PID (its owner died right after starting it),
                // so look for the sandbox's QEMU by what its command line names.
                kill_qemus_of(&dir);
                crate::tree::discard_tree(&dir);
                cleaned.push(r.id);
            }
            None => {
                // A directory without a readable record is half-made; give its maker a minute.
                if untouched_for_a_minute(&e) {
                    kill_qemus_of(&dir);
                    crate::tree::discard_tree(&dir);
                    cleaned.push(e.file_name().to_string_lossy().into_owned());
                }
            }
        }
    }
    let mut unfinished: Vec<PathBuf> = [paths.snapshots(), paths.templates()]
        .iter()
        .flat_map(|root| crate::snapshot::SnapshotStore::sweep_dir(root))
        .collect();
    unfinished.extend(crate::fastram::sweep(paths));
    // Disk files brought from other nodes that no disk chain goes through any more.
    unfinished.extend(crate::snapshot::chunks::sweep_objects(
        paths,
        std::time::Duration::from_secs(60),
    ));
    let cgroups = crate::limits::sweep();
    // Disk overlays of sandboxes that are gone and that no snapshot needs.
    crate::snapshot::release_disk_dirs(
        paths.home(),
        fs::read_dir(paths.disks())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned()),
    );
    Swept {
        sandboxes: cleaned,
        unfinished,
        cgroups,
    }
}

/// Whether a directory entry has not been modified for a minute: what a sweep gives the
/// maker of something half-made before it takes it for abandoned.
pub(crate) fn untouched_for_a_minute(e: &fs::DirEntry) -> bool {
    e.metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|a| a.as_secs() > 60)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_dead_owner_is_swept() {
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::new(home.path());
        let rd = RunDir::create(&paths, "sb-live", "py@1").unwrap();
        assert_eq!(
            live(&paths),
            vec![("sb-live".to_string(), "py@1".to_string())]
        );
        let mut dead = RunDir::create(&paths, "sb-dead", "py@1").unwrap();
        dead.record.owner_start += 1; // the same PID, another process: not the owner
        dead.save().unwrap();
        let dead_dir = dead.dir.clone();
        std::mem::forget(dead); // as if its owner had been killed
        assert_eq!(sweep(&paths).sandboxes, vec!["sb-dead".to_string()]);
        assert!(rd.dir.exists());
        assert!(!dead_dir.exists());
        let dir = rd.dir.clone();
        drop(rd);
        assert!(
            !dir.exists(),
            "dropping the record removes the sandbox's files"
        );
    }
}
