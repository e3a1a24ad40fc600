//! Where a fork's snapshot keeps its RAM file: in memory (tmpfs) when the host has room.
//!
//! A fork of a running sandbox makes a snapshot that lives only as long as its copies and is
//! never synced (see [`crate::snapshot::publish`]). With its RAM file on the home's disk, the
//! save paid a block allocation per page it wrote and the host a writeback of pages nobody
//! needed on disk: measured here, the first copy of 100 MB of written pages into a new file on
//! ext4 took 300-440 ms with the guest running, where the same copy into pages that exist took
//! ~40 ms. On tmpfs the file is the page cache its copies read anyway, with nothing to write
//! back.
//!
//! ```text
//! /dev/shm/forkbox-<uid>/<home hash>/home        the forkbox home this belongs to
//! /dev/shm/forkbox-<uid>/<home hash>/<id>/mem    one snapshot's RAM
//! <home>/snapshots/<name>/mem -> .../<id>/mem    (a symbolic link)
//! ```
//!
//! Each snapshot has a directory of its own, so a jailed QEMU given its RAM file's directory
//! sees no other snapshot's RAM. `FORKBOX_FORK_RAM=disk` keeps every RAM file on the disk;
//! `FORKBOX_FORK_RAM=DIR` puts them under `DIR` (a tmpfs, for the point of it). A snapshot
//! goes to the disk when the tmpfs would keep less than [`RESERVE_MIB`] (or a tenth of its
//! size) free.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::paths::Paths;

/// MiB of the tmpfs a fork leaves free, at least (and at least a tenth of it).
pub const RESERVE_MIB: u64 = 512;

/// Where this home's in-memory RAM files go.
#[derive(Debug, Clone)]
pub struct Place {
    home: PathBuf,
    root: PathBuf,
    /// Bytes to leave free on a file system of the given size.
    reserve: fn(u64) -> u64,
}

/// What a fork leaves free on a tmpfs of `size` bytes: [`RESERVE_MIB`], or a tenth of it.
fn reserve(size: u64) -> u64 {
    (RESERVE_MIB << 20).max(size / 10)
}

/// This home's in-memory place, or `None` (RAM files are kept on the disk).
pub fn place(paths: &Paths) -> Option<Place> {
    let base = match std::env::var("FORKBOX_FORK_RAM")
        .ok()
        .filter(|v| !v.is_empty())
    {
        Some(v) if v == "disk" || v == "off" => return None,
        Some(dir) => PathBuf::from(dir),
        None => {
            let shm = Path::new("/dev/shm");
            if !is_tmpfs(shm) {
                return None;
            }
            shm.join(format!("forkbox-{}", nix::unistd::geteuid()))
        }
    };
    Some(Place {
        home: paths.home().to_path_buf(),
        root: base.join(home_hash(paths.home())),
        reserve,
    })
}

fn is_tmpfs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// A short name for a home, the same for every path that reaches it.
fn home_hash(home: &Path) -> String {
    use sha2::{Digest, Sha256};
    let home = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
    let d = Sha256::digest(home.as_os_str().as_encoded_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

impl Place {
    /// The directory this home's in-memory RAM files go under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A new, empty directory for one snapshot's RAM file of about `need` bytes, when the file
    /// system keeps its reserve free after it; else `None` (the caller uses the disk).
    pub fn new_dir(&self, need: u64) -> Option<PathBuf> {
        let root = &self.root;
        // The file system it goes on: the nearest directory of it that exists.
        let fs = root.ancestors().find(|a| a.exists())?;
        let s = nix::sys::statvfs::statvfs(fs).ok()?;
        let size = s.blocks().saturating_mul(s.fragment_size());
        let free = s.blocks_available().saturating_mul(s.fragment_size());
        if free < need.saturating_add((self.reserve)(size)) {
            return None;
        }
        let made = (|| -> io::Result<PathBuf> {
            if !root.exists() {
                let base = root.parent().unwrap_or(root);
                std::fs::create_dir_all(base)?;
                std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o700))?;
                std::fs::create_dir_all(root)?;
            }
            let marker = root.join("home");
            if !marker.exists() {
                crate::paths::write_atomic(&marker, self.home.as_os_str().as_encoded_bytes())?;
            }
            let dir = root.join(crate::snapshot::tmp_name()?.trim_start_matches(".tmp-"));
            std::fs::create_dir(&dir)?;
            Ok(dir)
        })();
        match made {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!(
                    "RAM files in {} are not possible ({e}): using the disk",
                    root.display()
                );
                None
            }
        }
    }
}

/// Where a snapshot directory's RAM file lives, when it is a link into an in-memory root.
fn target(snapshot_dir: &Path) -> Option<PathBuf> {
    let link = std::fs::read_link(snapshot_dir.join(crate::snapshot::MEM)).ok()?;
    let dir = link.parent()?.to_path_buf();
    // Only ever a directory of ours: its parent holds the `home` marker.
    dir.parent()?.join("home").exists().then_some(dir)
}

/// Removes a snapshot's directory and, when its RAM file is in memory, that file's directory.
pub fn remove_snapshot_dir(dir: &Path) -> io::Result<()> {
    if let Some(ram) = target(dir) {
        crate::tree::discard_tree(&ram);
    }
    crate::tree::remove_tree(dir).map_err(Into::into)
}

/// The file a snapshot's `mem` is: the link's target for a RAM file in memory.
pub fn resolve(mem: &Path) -> PathBuf {
    match std::fs::read_link(mem) {
        Ok(t) if t.is_absolute() => t,
        _ => mem.to_path_buf(),
    }
}

/// Removes in-memory RAM files no snapshot of this home links to (older than a minute: a save
/// may be making one), and the roots of homes that no longer exist; returns what it removed.
pub fn sweep(paths: &Paths) -> Vec<PathBuf> {
    match place(paths) {
        Some(p) => sweep_in(paths, &p.root),
        None => Vec::new(),
    }
}

fn sweep_in(paths: &Paths, root: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let linked: std::collections::BTreeSet<PathBuf> = [paths.snapshots(), paths.templates()]
        .iter()
        .flat_map(|r| std::fs::read_dir(r).into_iter().flatten().flatten())
        .filter_map(|e| target(&e.path()))
        .collect();
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let p = e.path();
        let old = crate::runstate::untouched_for_a_minute(&e);
        if p.is_dir() && old && !linked.contains(&p) && crate::tree::remove_tree(&p).is_ok() {
            removed.push(p);
        }
    }
    // Other homes' roots whose home was deleted (tests' homes, a removed installation).
    for e in root
        .parent()
        .and_then(|b| std::fs::read_dir(b).ok())
        .into_iter()
        .flatten()
        .flatten()
    {
        let p = e.path();
        let home = std::fs::read(p.join("home")).ok().map(|h| {
            PathBuf::from(std::ffi::OsString::from(
                String::from_utf8_lossy(&h).into_owned(),
            ))
        });
        if p != root && home.is_some_and(|h| !h.exists()) && crate::tree::remove_tree(&p).is_ok() {
            removed.push(p);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The reserve is 512 MiB, or a tenth of a large tmpfs.
    #[test]
    fn a_fork_leaves_a_reserve_free() {
        assert_eq!(reserve(1 << 30), 512 << 20);
        assert_eq!(reserve(24 << 30), (24 << 30) / 10);
    }

    /// A RAM file in memory is found through its snapshot's link, removed with it, and swept
    /// once no snapshot links to it; the root of a deleted home goes too. (No reserve: the
    /// temporary directory's file system may have less than 512 MiB free.)
    #[test]
    fn ram_dirs_go_with_their_snapshots() {
        let shm = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::new(home.path());
        let root = shm.path().join("forkbox-0").join("h");
        let place = Place {
            home: home.path().into(),
            root: root.clone(),
            reserve: |_| 0,
        };
        let dir = place.new_dir(1 << 20).unwrap();
        std::fs::write(dir.join("mem"), b"ram").unwrap();
        let snap = paths.snapshots().join("s1");
        std::fs::create_dir_all(&snap).unwrap();
        std::os::unix::fs::symlink(dir.join("mem"), snap.join("mem")).unwrap();
        assert_eq!(resolve(&snap.join("mem")), dir.join("mem"));
        assert_eq!(target(&snap), Some(dir.clone()));
        // Far more than the file system has: the disk is chosen.
        assert!(place.new_dir(u64::MAX / 2).is_none());
        remove_snapshot_dir(&snap).unwrap();
        assert!(!dir.exists() && !snap.exists());
        // A link to anything but one of ours is never followed into a removal.
        let foreign = tempfile::tempdir().unwrap();
        std::fs::write(foreign.path().join("mem"), b"x").unwrap();
        std::fs::create_dir_all(&snap).unwrap();
        std::os::unix::fs::symlink(foreign.path().join("mem"), snap.join("mem")).unwrap();
        remove_snapshot_dir(&snap).unwrap();
        assert!(foreign.path().join("mem").exists());
        // A deleted home's root is swept by any other home's sweep.
        let gone = tempfile::tempdir().unwrap();
        let gone_root = shm.path().join("forkbox-0").join("g");
        let gone_place = Place {
            home: gone.path().into(),
            root: gone_root.clone(),
            reserve: |_| 0,
        };
        gone_place.new_dir(0).unwrap();
        drop(gone);
        let swept = sweep_in(&paths, &root);
        assert!(swept.contains(&gone_root), "{swept:?}");
        assert!(!gone_root.exists());
    }
}
