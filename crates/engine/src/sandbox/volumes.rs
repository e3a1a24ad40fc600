//! Volumes: disks of their own, each with its own ext4 file system, that outlive the sandboxes
//! that mount them and are never part of a snapshot.
//!
//! A volume is a directory under `volumes/` in forkbox's home: `disk.ext4` (a raw file whose
//! whole size is allocated when it is made, so that a write the guest was told succeeded never
//! meets a full host disk: a full volume is the guest's own `ENOSPC`), `volume.json` (its name,
//! size and birth) and `holders.json`, the sandboxes that have it mounted. Who may mount it is
//! decided under an exclusive `flock` of its `.lock`, by every process that uses this home (the
//! daemon, a one-shot `forkbox run`): one sandbox read-write, or any number read-only. A holder
//! is live while the process that took it runs, its run directory exists, or it sleeps (its
//! hibernation snapshot exists); the others, left by a crash, are dropped when next read.
//! QEMU's own image locking (on by default) backs this up: a second writer cannot open the file.

use std::path::{Path, PathBuf};

use forkbox_api::{VolumeHolder, VolumeView};
use serde::{Deserialize, Serialize};

use crate::error::VolumeError;
use crate::paths::Paths;

const DISK: &str = "disk.ext4";
const META: &str = "volume.json";
const HOLDERS: &str = "holders.json";
const LOCK: &str = ".lock";
/// Free space a new volume must leave in the home's file system: the sandboxes' own disks,
/// snapshots and templates live there too, and a host disk a volume filled would pause them.
pub const HOST_RESERVE_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    name: String,
    size_bytes: u64,
    created_unix: u64,
}

/// A sandbox that has a volume mounted, and the process that took it for the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Holder {
    sandbox: String,
    read_only: bool,
    pid: u32,
    pid_start: u64,
}

/// The volumes of one forkbox home.
pub struct VolumeStore {
    root: PathBuf,
    paths: Paths,
}

impl VolumeStore {
    pub fn new(paths: &Paths) -> VolumeStore {
        VolumeStore {
            root: paths.volumes(),
            paths: paths.clone(),
        }
    }

    fn dir(&self, name: &str) -> Result<PathBuf, VolumeError> {
        if !forkbox_api::valid_volume_name(name) {
            return Err(VolumeError::Bad(format!("{name:?} is not a volume name")));
        }
        Ok(self.root.join(name))
    }

    /// The disk of volume `name` (for the jail and QEMU), if it exists.
    pub fn disk(&self, name: &str) -> Result<PathBuf, VolumeError> {
        let dir = self.dir(name)?;
        if !dir.join(META).is_file() {
            return Err(VolumeError::NotFound(name.into()));
        }
        Ok(dir.join(DISK))
    }

    /// Makes volume `name` of `bytes`: its space taken on the host at once, its file system
    /// made. Built aside and renamed into place: two creates of one name, one wins.
    pub fn create(&self, name: &str, bytes: u64) -> Result<VolumeView, VolumeError> {
        let dir = self.dir(name)?;
        std::fs::create_dir_all(&self.root)
            .map_err(|e| VolumeError::io(name, "create the volumes directory", e))?;
        if dir.exists() {
            return Err(VolumeError::Exists(name.into()));
        }
        let tmp = self.root.join(format!(
            ".new-{name}-{}",
            crate::random::hex(4).map_err(|e| VolumeError::io(name, "draw a name", e))?
        ));
        let made = self.make(name, bytes, &tmp);
        let placed = made.and_then(|meta| {
            // rename(2) onto an existing non-empty directory fails: the name is taken.
            std::fs::rename(&tmp, &dir).map_err(|e| match e.raw_os_error() {
                Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => VolumeError::Exists(name.into()),
                _ => VolumeError::io(name, "put it in place", e),
            })?;
            Ok(meta)
        });
        match placed {
            Ok(meta) => Ok(self.view_of(meta, Vec::new())),
            Err(e) => {
                crate::tree::discard_tree(&tmp);
                Err(e)
            }
        }
    }

    fn make(&self, name: &str, bytes: u64, tmp: &Path) -> Result<Meta, VolumeError> {
        let free = crate::diskwatch::free_bytes(&self.root);
        if free < bytes.saturating_add(HOST_RESERVE_BYTES) {
            return Err(self.no_room(name, bytes));
        }
        std::fs::create_dir(tmp).map_err(|e| VolumeError::io(name, "create its directory", e))?;
        let disk = tmp.join(DISK);
        let file = std::fs::File::create(&disk)
            .map_err(|e| VolumeError::io(name, "create its disk", e))?;
        // All of it now: a full host disk is met here, in words, not by the guest mid-write.
        if let Err(e) = nix::fcntl::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            nix::fcntl::FallocateFlags::empty(),
            0,
            bytes as libc::off_t,
        ) {
            return Err(match e {
                nix::errno::Errno::ENOSPC => self.no_room(name, bytes),
                e => VolumeError::io(name, "allocate its space", e.into()),
            });
        }
        drop(file);
        mkfs(name, &disk)?;
        share(&disk).map_err(|e| VolumeError::io(name, "set its owner", e))?;
        let meta = Meta {
            name: name.into(),
            size_bytes: bytes,
            created_unix: now_unix(),
        };
        let text = serde_json::to_vec_pretty(&meta).unwrap_or_default();
        crate::paths::write_atomic(&tmp.join(META), &text)
            .map_err(|e| VolumeError::io(name, "record it", e))?;
        Ok(meta)
    }

    fn no_room(&self, name: &str, bytes: u64) -> VolumeError {
        VolumeError::NoRoom {
            name: name.into(),
            want_mib: bytes >> 20,
            free_mib: crate::diskwatch::free_bytes(&self.root) >> 20,
            reserve_mib: HOST_RESERVE_BYTES >> 20,
            dir: self.root.clone(),
        }
    }

    /// Every volume, by name, with its live holders.
    pub fn list(&self) -> Vec<VolumeView> {
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut names: Vec<String> = rd
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| forkbox_api::valid_volume_name(n))
            .collect();
        names.sort();
        names.iter().filter_map(|n| self.get(n).ok()).collect()
    }

    pub fn get(&self, name: &str) -> Result<VolumeView, VolumeError> {
        let meta = self.meta(name)?;
        let holders = self.with_lock(name, |held| Ok(held.clone()))?;
        Ok(self.view_of(meta, holders))
    }

    fn meta(&self, name: &str) -> Result<Meta, VolumeError> {
        let path = self.dir(name)?.join(META);
        let text = std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => VolumeError::NotFound(name.into()),
            _ => VolumeError::io(name, "read its record", e),
        })?;
        serde_json::from_slice(&text)
            .map_err(|e| VolumeError::io(name, "read its record", std::io::Error::other(e)))
    }

    fn view_of(&self, meta: Meta, holders: Vec<Holder>) -> VolumeView {
        VolumeView {
            name: meta.name,
            size_bytes: meta.size_bytes,
            created_unix: meta.created_unix,
            holders: holders
                .into_iter()
                .map(|h| VolumeHolder {
                    sandbox: h.sandbox,
                    read_only: h.read_only,
                })
                .collect(),
            node: None,
        }
    }

    /// Removes volume `name` and everything on it; refused while a sandbox has it mounted.
    pub fn remove(&self, name: &str) -> Result<(), VolumeError> {
        let dir = self.dir(name)?;
        self.meta(name)?;
        let gone = self.root.join(format!(
            ".gone-{name}-{}",
            crate::random::hex(4).map_err(|e| VolumeError::io(name, "draw a name", e))?
        ));
        self.with_lock(name, |held| {
            if !held.is_empty() {
                return Err(in_use(name, held));
            }
            // Out of its name while the lock is held: no mount can take it from here.
            std::fs::rename(&dir, &gone).map_err(|e| VolumeError::io(name, "remove it", e))
        })?;
        crate::tree::remove_tree(&gone)
            .map_err(|e| VolumeError::io(name, "remove its files", e.into()))
    }

    /// Takes volume `name` for sandbox `sandbox`: read-write if no sandbox has it, read-only if
    /// none has it read-write; otherwise refused, naming who has it. With `check`, the first
    /// holder finds its file system replayed (`e2fsck -p`: a writer that died leaves a journal
    /// to replay, which a read-only mount could not); a sleeping sandbox waking takes its
    /// volume again without (its guest has it mounted). Its disk.
    pub fn take(
        &self,
        name: &str,
        sandbox: &str,
        read_only: bool,
        check: bool,
    ) -> Result<PathBuf, VolumeError> {
        let disk = self.disk(name)?;
        self.with_lock(name, |held| {
            held.retain(|h| h.sandbox != sandbox);
            let writer = held.iter().any(|h| !h.read_only);
            if (!read_only && !held.is_empty()) || writer {
                return Err(in_use(name, held));
            }
            if held.is_empty() && check {
                fsck(&self.paths, name, &disk)?;
            }
            let pid = std::process::id();
            held.push(Holder {
                sandbox: sandbox.into(),
                read_only,
                pid,
                pid_start: crate::procfs::process_start(pid).unwrap_or(0),
            });
            Ok(())
        })?;
        Ok(disk)
    }

    /// Gives back the volumes `names` that `sandbox` holds (it was deleted, or its creation
    /// failed).
    pub fn release<'a>(&self, sandbox: &str, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            let r = self.with_lock(name, |held| {
                held.retain(|h| h.sandbox != sandbox);
                Ok(())
            });
            match r {
                Ok(()) | Err(VolumeError::NotFound(_)) => {}
                Err(e) => tracing::warn!("{sandbox}: volume {name} not given back: {e}"),
            }
        }
    }

    /// Runs `f` on the volume's live holders under its lock, and writes them back if `f` changed
    /// them.
    fn with_lock<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut Vec<Holder>) -> Result<T, VolumeError>,
    ) -> Result<T, VolumeError> {
        let dir = self.dir(name)?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => VolumeError::NotFound(name.into()),
                _ => VolumeError::io(name, "open its lock", e),
            })?;
        let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| VolumeError::io(name, "lock it", e.into()))?;
        // Removed while this waited for the lock.
        if !dir.join(META).is_file() {
            return Err(VolumeError::NotFound(name.into()));
        }
        let path = dir.join(HOLDERS);
        let read: Vec<Holder> = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let mut held: Vec<Holder> = read.iter().filter(|h| self.live(h)).cloned().collect();
        let out = f(&mut held)?;
        if held != read {
            let text = serde_json::to_vec_pretty(&held).unwrap_or_default();
            crate::paths::write_atomic(&path, &text)
                .map_err(|e| VolumeError::io(name, "record who has it", e))?;
        }
        Ok(out)
    }

    /// Whether a holder still stands: its process runs, or its sandbox is there (running, or
    /// asleep in its hibernation snapshot).
    fn live(&self, h: &Holder) -> bool {
        if crate::procfs::process_start(h.pid).is_some_and(|s| s == h.pid_start) {
            return true;
        }
        if self.paths.run().join(&h.sandbox).is_dir() {
            return true;
        }
        let sleeping = format!("{}{}-", crate::snapshot::HIBERNATION, h.sandbox);
        std::fs::read_dir(self.paths.snapshots())
            .map(|rd| {
                rd.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(&sleeping))
            })
            .unwrap_or(false)
    }
}

fn in_use(name: &str, held: &[Holder]) -> VolumeError {
    let holders = match held.iter().find(|h| !h.read_only) {
        Some(w) => format!("sandbox {} has it read-write", w.sandbox),
        None => format!(
            "mounted read-only by {}",
            held.iter()
                .map(|h| h.sandbox.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    VolumeError::InUse {
        name: name.into(),
        holders,
    }
}

/// An ext4 file system on the whole file: no reserved blocks (it is all the user's), no discard
/// (that would punch holes in the space taken for it), tables initialised lazily by the guest,
/// its top directory writable by all (sticky).
fn mkfs(name: &str, disk: &Path) -> Result<(), VolumeError> {
    let opts = "nodiscard,lazy_itable_init=1,lazy_journal_init=1";
    let mkfs = ["-q", "-F", "-m", "0", "-E", opts];
    tool(name, "mkfs.ext4", &mkfs, disk, "make its file system")?;
    // Its top directory open to every user of the guest, as /tmp is (a sandbox's commands may
    // run as a user of their own): mkfs makes it root's, 0755.
    let sif = ["-w", "-R", "sif / mode 041777"];
    tool(
        name,
        "debugfs",
        &sif,
        disk,
        "open its top directory to the guest's users",
    )
}

/// Runs host program `program` with `args` on `disk`; its words when it fails.
fn tool(
    name: &str,
    program: &str,
    args: &[&str],
    disk: &Path,
    what: &str,
) -> Result<(), VolumeError> {
    let path = crate::setup::require(program)
        .map_err(|e| VolumeError::Bad(format!("volume {name}: {e}")))?;
    let out = std::process::Command::new(path)
        .args(args)
        .arg(disk)
        .output()
        .map_err(|e| VolumeError::io(name, format!("run {program}"), e))?;
    if !out.status.success() {
        return Err(VolumeError::io(
            name,
            what,
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        ));
    }
    Ok(())
}

/// Replays its journal and checks it (`e2fsck -p`: what needs a person is refused in words).
/// Guests wrote it: the check runs confined, as a QEMU does ([`crate::vm::confined`]).
fn fsck(paths: &Paths, name: &str, disk: &Path) -> Result<(), VolumeError> {
    let Ok(e2fsck) = crate::setup::require("e2fsck") else {
        return Ok(());
    };
    let arg = disk.to_string_lossy();
    let out = crate::vm::confined::run(paths, &e2fsck, &["-p", &arg], &[disk.to_path_buf()])
        .map_err(|e| VolumeError::io(name, "run e2fsck", std::io::Error::other(e.to_string())))?;
    // 0: clean; 1: errors corrected.
    match out.status.code() {
        Some(0) | Some(1) => Ok(()),
        _ => Err(VolumeError::io(
            name,
            "check its file system (e2fsck -p)",
            std::io::Error::other(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        )),
    }
}

/// The disk is root's and the QEMUs' group's (a jailed QEMU runs as a uid of its own in that
/// group): read-write for them, bound read-only into the jail of a QEMU that mounts it so.
fn share(disk: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if crate::vm::jail::enabled() {
        return crate::vm::jail::share_file(disk, true).map_err(std::io::Error::other);
    }
    std::fs::set_permissions(disk, std::fs::Permissions::from_mode(0o660))
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, VolumeStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = VolumeStore::new(&Paths::new(dir.path()));
        (dir, s)
    }

    /// One writer or many readers; a holder whose sandbox is gone (its process dead, no run
    /// directory, not asleep) is dropped.
    #[test]
    fn one_writer_or_many_readers() {
        if crate::setup::require("mkfs.ext4").is_err() {
            return;
        }
        let (_d, s) = store();
        s.create("cache", 16 << 20).unwrap();
        assert!(matches!(
            s.create("cache", 16 << 20),
            Err(VolumeError::Exists(_))
        ));
        let size = std::fs::metadata(s.disk("cache").unwrap()).unwrap().len();
        assert_eq!(size, 16 << 20);
        s.take("cache", "sb-a", false, true).unwrap();
        let e = s.take("cache", "sb-b", true, true).unwrap_err().to_string();
        assert!(e.contains("sb-a has it read-write"), "{e}");
        assert!(matches!(s.remove("cache"), Err(VolumeError::InUse { .. })));
        s.release("sb-a", ["cache"]);
        s.take("cache", "sb-b", true, true).unwrap();
        s.take("cache", "sb-c", true, true).unwrap();
        let e = s
            .take("cache", "sb-d", false, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("read-only by sb-b, sb-c"), "{e}");
        // Left by a process that died, for sandboxes that are gone.
        let path = s.dir("cache").unwrap().join(HOLDERS);
        let text = std::fs::read_to_string(&path).unwrap().replace(
            &format!("\"pid\": {}", std::process::id()),
            "\"pid\": 999999999",
        );
        std::fs::write(&path, text).unwrap();
        s.take("cache", "sb-d", false, true).unwrap();
        s.release("sb-d", ["cache"]);
        s.remove("cache").unwrap();
        assert!(matches!(s.get("cache"), Err(VolumeError::NotFound(_))));
    }
}
