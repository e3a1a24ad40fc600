//! `objects/` (disk files made from other nodes' chunks): what each snapshot holds alone,
//! and the sweep of files no disk chain goes through.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use super::{backing_of, local_snapshots};
use crate::paths::Paths;
use crate::snapshot::Snapshot;

/// `objects/`: disk files made from other nodes' chunks.
pub fn objects_dir(paths: &Paths) -> PathBuf {
    paths.home().join("objects")
}

/// The files of the disk chain from `top` down, as far as it can be followed (an unreadable
/// header or a loop ends it).
fn chain_files(top: PathBuf) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut at = Some(top);
    while let Some(p) = at.take() {
        if out.contains(&p) {
            break;
        }
        at = backing_of(&p).ok().flatten();
        out.push(p);
    }
    out
}

/// The qcow2 overlays of this home's sandboxes, live (`run/`) and kept for snapshots (`disks/`).
fn sandbox_overlays(paths: &Paths) -> Vec<PathBuf> {
    [paths.disks(), paths.run()]
        .iter()
        .flat_map(|root| std::fs::read_dir(root).into_iter().flatten().flatten())
        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten().flatten())
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|x| x == "qcow2"))
        .collect()
}

/// For each snapshot of this home (by name): the bytes only it holds (its RAM file, device
/// state, and the files of its disk chain no other snapshot, template or sandbox overlay
/// reaches).
pub fn held_alone(paths: &Paths, snaps: &[Snapshot]) -> HashMap<String, u64> {
    let mut users: HashMap<PathBuf, usize> = HashMap::new();
    let mut chains: Vec<(String, Vec<PathBuf>)> = Vec::new();
    let names: BTreeSet<&str> = snaps.iter().map(|s| s.meta.name.as_str()).collect();
    for s in local_snapshots(paths) {
        let chain = chain_files(s.disk());
        for f in &chain {
            *users.entry(f.clone()).or_default() += 1;
        }
        if names.contains(s.meta.name.as_str()) {
            chains.push((s.meta.name.clone(), chain));
        }
    }
    // An overlay reaches the files below it, not itself (a frozen one is a snapshot's own top).
    for o in sandbox_overlays(paths) {
        for p in chain_files(o).into_iter().skip(1) {
            *users.entry(p).or_default() += 1;
        }
    }
    let by_name: HashMap<&str, &Snapshot> =
        snaps.iter().map(|s| (s.meta.name.as_str(), s)).collect();
    chains
        .into_iter()
        .filter_map(|(name, chain)| {
            let s = by_name.get(name.as_str())?;
            let own = crate::snapshot::allocated_bytes(&crate::fastram::resolve(&s.mem()))
                + crate::snapshot::allocated_bytes(&s.vmstate());
            let disks: u64 = chain
                .iter()
                .filter(|f| users.get(*f).copied().unwrap_or(0) <= 1)
                .map(|f| crate::snapshot::allocated_bytes(f))
                .sum();
            Some((name, own + disks))
        })
        .collect()
}

/// Removes `objects/` files no disk chain of this home goes through (snapshots, templates,
/// sandboxes' overlays), and leftovers of assemblies whose process is gone; returns what it
/// removed. An object younger than `min_age` is kept (another process may be assembling the
/// snapshot that will use it); the engine sweeps with none under way and `min_age` zero.
pub fn sweep_objects(paths: &Paths, min_age: std::time::Duration) -> Vec<PathBuf> {
    let dir = objects_dir(paths);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut tops: Vec<PathBuf> = local_snapshots(paths).iter().map(Snapshot::disk).collect();
    tops.extend(sandbox_overlays(paths));
    // Every file a chain reaches is kept, however the chain ends (a file unreadable or a loop
    // ends the walk, never the keeping).
    let used: BTreeSet<PathBuf> = tops.into_iter().flat_map(chain_files).collect();
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let keep = match name.strip_prefix(".tmp-") {
            Some(rest) => crate::snapshot::maker_alive(rest),
            None => {
                used.contains(&p)
                    || e.metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age < min_age)
            }
        };
        if !keep && std::fs::remove_file(&p).is_ok() {
            removed.push(p);
        }
    }
    removed
}
