//! Where a build of a name happens, `images/NAME/.build-PID/`, and what builds that were
//! killed leave there.
//!
//! A build holds its name's lock from start to commit, so whoever holds the lock knows that
//! every other `.build-*` of the name is a dead build's. Those are removed by
//! [`crate::tree::remove_tree`], which never crosses a mount; mounts a dead build left (a
//! forkbox from before builds ran in a mount namespace of their own left the host's
//! `/dev/shm`, `/proc` and `/sys` bound into its root) are detached first and named in the log.

use std::fs;
use std::path::{Path, PathBuf};

use super::store::{ImageMeta, ImageStore};
use crate::error::ImageError;
use crate::paths::{write_atomic, Paths};
use crate::tree;

/// A build's work directory, under the name's lock (one build per name at a time, so versions
/// are never handed out twice).
pub(super) struct Workspace {
    _lock: nix::fcntl::Flock<fs::File>,
    name_dir: PathBuf,
    pub(super) work: PathBuf,
    store: ImageStore,
}

/// Takes the lock of `name_dir` (waiting for it with `wait`, else only if it is free).
fn lock(name_dir: &Path, wait: bool) -> Result<Option<nix::fcntl::Flock<fs::File>>, ImageError> {
    let lock_file = fs::File::create(name_dir.join(".lock"))
        .map_err(|e| ImageError::io("create build lock", e))?;
    let how = match wait {
        true => nix::fcntl::FlockArg::LockExclusive,
        false => nix::fcntl::FlockArg::LockExclusiveNonblock,
    };
    match nix::fcntl::Flock::lock(lock_file, how) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) if !wait => Ok(None),
        Err((_, e)) => Err(ImageError::io("lock image name", e.into())),
    }
}

/// Removes what dead builds of one name left (the caller holds the name's lock): their mounts
/// detached, then their trees. Returns a line for each thing done.
fn sweep_dead_builds(name_dir: &Path) -> Vec<String> {
    let mut done = Vec::new();
    for e in fs::read_dir(name_dir).into_iter().flatten().flatten() {
        if !e.file_name().to_string_lossy().starts_with(".build-") {
            continue;
        }
        let dir = e.path();
        for m in tree::detach_mounts_under(&dir) {
            tracing::warn!(
                "detached {}, which a killed image build left mounted",
                m.display()
            );
            done.push(format!(
                "detached {} (left mounted by a killed build)",
                m.display()
            ));
        }
        match tree::remove_tree(&dir) {
            Ok(()) => done.push(format!("removed {} (a killed build's)", dir.display())),
            Err(e) => {
                tracing::warn!("{e}");
                done.push(e.to_string());
            }
        }
    }
    done
}

/// At a daemon's start: what dead builds of every image name left (names being built now by
/// another process are left to that process). Returns a line for each thing done.
pub fn sweep_builds(paths: &Paths) -> Vec<String> {
    let mut done = Vec::new();
    for e in fs::read_dir(paths.images()).into_iter().flatten().flatten() {
        let name_dir = e.path();
        if !name_dir.is_dir() || name_dir.symlink_metadata().is_ok_and(|m| m.is_symlink()) {
            continue;
        }
        if let Ok(Some(_held)) = lock(&name_dir, false) {
            done.extend(sweep_dead_builds(&name_dir));
        }
    }
    done
}

impl Workspace {
    pub(super) fn open(paths: &Paths, name: &str) -> Result<Workspace, ImageError> {
        let name_dir = paths.images().join(name);
        fs::create_dir_all(&name_dir)
            .map_err(|e| ImageError::io(format!("create {}", name_dir.display()), e))?;
        let lock = lock(&name_dir, true)?.ok_or_else(|| {
            ImageError::io("lock image name", std::io::ErrorKind::WouldBlock.into())
        })?;
        sweep_dead_builds(&name_dir);
        let work = name_dir.join(format!(".build-{}", std::process::id()));
        fs::create_dir_all(&work)
            .map_err(|e| ImageError::io(format!("create {}", work.display()), e))?;
        Ok(Workspace {
            _lock: lock,
            name_dir,
            work,
            store: ImageStore::new(paths),
        })
    }

    /// Makes the work directory (its `rootfs.ext4` written) the name's next version, with
    /// `meta` (its version set here) and `files` beside it.
    pub(super) fn commit(
        self,
        mut meta: ImageMeta,
        files: &[(&str, &[u8])],
    ) -> Result<super::Image, ImageError> {
        meta.version = self.store.next_version(&meta.name);
        let io = |e| ImageError::io("write image metadata", e);
        for (name, bytes) in files {
            write_atomic(&self.work.join(name), bytes).map_err(io)?;
        }
        let json = serde_json::to_vec_pretty(&meta)
            .map_err(|e| ImageError::io("encode image.json", e.into()))?;
        write_atomic(&self.work.join("image.json"), &json).map_err(io)?;
        let dest = self.name_dir.join(meta.version.to_string());
        fs::rename(&self.work, &dest)
            .map_err(|e| ImageError::io(format!("move image into {}", dest.display()), e))?;
        let _ = fs::File::open(&self.name_dir).and_then(|d| d.sync_all());
        self.store.resolve(&super::ImageRef {
            name: meta.name.clone(),
            version: Some(meta.version),
        })
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        // Gone once committed (renamed); a failed build's leftovers go here.
        tree::discard_tree(&self.work);
    }
}
