//! Removing a tree forkbox made, and the mounts a killed build can leave in one.
//!
//! ```no_run
//! // A build's work directory, whatever a killed build left mounted in it.
//! let dir = std::path::Path::new("/var/lib/forkbox/images/x/.build-42");
//! for m in forkbox_hostfs::detach_mounts_under(dir) {
//!     eprintln!("detached {}", m.display());
//! }
//! forkbox_hostfs::remove_tree(dir)?;
//! # Ok::<(), forkbox_hostfs::TreeError>(())
//! ```
//!
//! `std::fs::remove_dir_all` descends into whatever is mounted inside the tree: a build root
//! that a killed `mmdebstrap` left with the host's `/dev/shm`, `/proc` and `/sys` bound into it
//! would have the host's shared memory, and every empty cgroup, removed through it. Every tree
//! forkbox removes goes through [`remove_tree`] instead, which opens each directory beneath its
//! parent with `openat2(RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS)`: it never crosses into another
//! mount (a bind mount of the same file system included), never follows a link, and stops at
//! the first mount point it meets, naming it.
#![forbid(unsafe_code)]

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Why a tree could not be removed (whatever came before the failure is gone).
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error(
        "{path} is a mount point inside a tree forkbox was removing; it was left as it is \
         (nothing beneath it was touched): unmount it (`umount -l {path}`) and remove the \
         tree again",
        path = .path.display()
    )]
    Mount { path: PathBuf },
    #[error("cannot {what} {path}: {source}", path = .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl From<TreeError> for std::io::Error {
    fn from(e: TreeError) -> std::io::Error {
        match e {
            TreeError::Io { source, .. } => source,
            mount => std::io::Error::other(mount),
        }
    }
}

impl TreeError {
    fn io(what: &'static str, path: &Path, e: Errno) -> TreeError {
        TreeError::Io {
            what,
            path: path.to_path_buf(),
            source: e.into(),
        }
    }
}

/// Removes `path` and everything beneath it, within the file system and mount `path` is on.
/// A missing `path` is already removed. A mount point anywhere in the tree (`path` itself
/// included) stops the removal with [`TreeError::Mount`] naming it, before anything beneath it
/// is touched; links are removed, never followed.
pub fn remove_tree(path: &Path) -> Result<(), TreeError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(TreeError::io("remove", path, Errno::INVAL));
    };
    let parent_dir = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let dir = match rustix::fs::open(
        parent_dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(TreeError::io("open", parent, e)),
    };
    remove_entry(dir.as_fd(), name, path)
}

/// [`remove_tree`] for a clean-up whose failure must not stop the caller: a failure is logged
/// (a mount point as a warning that names it) and the rest goes on.
pub fn discard_tree(path: &Path) {
    match remove_tree(path) {
        Ok(()) => {}
        Err(e @ TreeError::Mount { .. }) => tracing::warn!("{e}"),
        Err(e) => tracing::debug!("{e}"),
    }
}

/// Removes `name` in `parent` (shown as `path`), a directory depth first.
fn remove_entry(parent: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<(), TreeError> {
    let stat = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(s) => s,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(TreeError::io("look at", path, e)),
    };
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            // A file bound over another is a mount point too.
            Err(Errno::BUSY) => Err(TreeError::Mount {
                path: path.to_path_buf(),
            }),
            Err(e) => Err(TreeError::io("remove", path, e)),
        };
    }
    let dir = match open_beneath(parent, name) {
        Ok(fd) => fd,
        Err(Errno::XDEV) => {
            return Err(TreeError::Mount {
                path: path.to_path_buf(),
            })
        }
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(TreeError::io("open", path, e)),
    };
    for child in entries(&dir, path)? {
        let child = OsStr::from_bytes(child.to_bytes());
        remove_entry(dir.as_fd(), child, &path.join(child))?;
    }
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::BUSY) => Err(TreeError::Mount {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(TreeError::io("remove", path, e)),
    }
}

/// Opens the directory `name` in `parent` without crossing a mount or following a link.
fn open_beneath(parent: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_XDEV | ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH,
    )
}

/// The names in a directory (all read before any is removed), without `.` and `..`.
fn entries(dir: &OwnedFd, path: &Path) -> Result<Vec<std::ffi::CString>, TreeError> {
    let mut names = Vec::new();
    let mut reader = Dir::read_from(dir).map_err(|e| TreeError::io("read", path, e))?;
    for entry in reader.by_ref() {
        let entry = entry.map_err(|e| TreeError::io("read", path, e))?;
        let name: &CStr = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Mount points at or beneath `under` in the calling thread's mount namespace (from
/// `/proc/thread-self/mountinfo`: a namespace may be a thread's own), deepest first: the
/// order they can be unmounted in.
pub fn mounts_under(under: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(OsStr::from_bytes(&unescape(p))))
        .filter(|p| p.starts_with(under))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (b[i], octal) {
            (b'\\', Some(v)) => {
                out.push(v);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Detaches every mount at or beneath `under`, deepest first (`umount -l`: a process that
/// still uses one keeps it until it lets go, but it is gone from the tree at once). Returns
/// those it detached.
pub fn detach_mounts_under(under: &Path) -> Vec<PathBuf> {
    let mut detached = Vec::new();
    // A stacked mount point is listed once per mount; go until none is left or none goes.
    loop {
        let mut any = false;
        for m in mounts_under(under) {
            if rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH).is_ok() {
                any = true;
                detached.push(m);
            }
        }
        if !any {
            break;
        }
    }
    detached
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_files_links_and_nested_directories_but_not_what_links_point_at() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let t = tmp.path().join("tree");
        std::fs::create_dir_all(t.join("a/b/c")).unwrap();
        std::fs::write(t.join("a/b/c/f"), "y").unwrap();
        std::os::unix::fs::symlink(&outside, t.join("a/link")).unwrap();
        std::fs::write(t.join("top"), "z").unwrap();
        remove_tree(&t).unwrap();
        assert!(!t.exists());
        assert!(
            outside.join("keep").exists(),
            "a link's target is not touched"
        );
        remove_tree(&t).expect("a missing tree is already removed");
    }

    #[test]
    fn escapes_in_mountinfo_are_undone() {
        assert_eq!(unescape(r"/a\040b\011c\134d"), b"/a b\tc\\d".to_vec());
        assert_eq!(unescape(r"/trailing\04"), b"/trailing\\04".to_vec());
    }

    /// A tree with a bind mount inside (in a mount namespace of this test's thread, so nothing
    /// is ever visible to the host): the removal stops at the mount, names it, and leaves what
    /// is beneath it; once it is detached the tree goes.
    #[test]
    fn a_bind_mount_inside_is_never_descended_into_and_is_named() {
        use nix::mount::{mount, MsFlags};
        assert!(
            nix::unistd::geteuid().is_root(),
            "forkbox's tests run as root (a mount namespace is made here)"
        );
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
            .expect("a mount namespace of this thread's own");
        let none: Option<&str> = None;
        mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("host-shm");
        std::fs::create_dir(&host).unwrap();
        std::fs::write(host.join("another-program"), "kept").unwrap();
        let t = tmp.path().join("images/x/.build-1");
        let inside = t.join("root/dev/shm");
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::write(t.join("root/file"), "gone").unwrap();
        mount(Some(&host), &inside, none, MsFlags::MS_BIND, none).unwrap();
        let err = remove_tree(&t).unwrap_err();
        assert!(
            matches!(&err, TreeError::Mount { path } if *path == inside),
            "{err}"
        );
        assert!(err.to_string().contains("dev/shm"), "{err}");
        assert!(host.join("another-program").exists());
        assert_eq!(mounts_under(&t), vec![inside.clone()]);
        // The mount point itself is refused too.
        assert!(matches!(remove_tree(&inside), Err(TreeError::Mount { .. })));
        assert_eq!(detach_mounts_under(&t), vec![inside.clone()]);
        assert!(mounts_under(&t).is_empty());
        remove_tree(&t).unwrap();
        assert!(!t.exists());
        assert!(host.join("another-program").exists());
    }
}
