//! Applying OCI image layers (tar archives, gzip or zstd compressed or not) to a root directory
//! on the host, as a registry's image is unpacked.
//!
//! A layer is data from a stranger, unpacked by root: every path is resolved beneath the root
//! with `openat2(RESOLVE_BENEATH)`, so an absolute path, a `..` or a symbolic link that leads out
//! of the root (an absolute one, or a relative one that climbs above it) is refused by the kernel
//! itself, never written through. Whiteouts follow the OCI image spec: `.wh.NAME` removes NAME
//! from the layers below, `.wh..wh..opq` empties its directory of what the layers below put
//! there; both are applied before the layer's own entries, so they never hide those.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{
    fchmodat, mkdirat, mknodat, utimensat, FchmodatFlags, Mode, SFlag, UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Why a layer was refused or could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("entry {entry:?}: {message}")]
    Refused { entry: String, message: String },
    #[error("entry {entry:?}: {source}")]
    Io { entry: String, source: io::Error },
    #[error("the layer is not a readable tar archive: {0}")]
    Archive(io::Error),
}

fn refused(entry: &Path, message: impl Into<String>) -> LayerError {
    LayerError::Refused {
        entry: entry.display().to_string(),
        message: message.into(),
    }
}

fn io_at(entry: &Path) -> impl Fn(io::Error) -> LayerError + '_ {
    move |source| LayerError::Io {
        entry: entry.display().to_string(),
        source,
    }
}

/// An entry's path, made relative to the root: `./a/b` and `a/b` are `a/b`; an absolute path
/// or one with `..` is refused. The root itself is the empty path.
pub fn clean(path: &Path) -> Result<PathBuf, LayerError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(refused(path, "a path with `..` is refused")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(refused(path, "an absolute path is refused"))
            }
        }
    }
    Ok(out)
}

/// A root directory layers are applied to; every path is resolved beneath it.
pub struct Root {
    fd: OwnedFd,
    /// Bytes of file data the layers may still write (a layer's size says nothing of what it
    /// unpacks to).
    budget: std::cell::Cell<u64>,
    /// The budget given, for the refusal's words.
    room: u64,
}

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

impl Root {
    pub fn open(path: &Path) -> io::Result<Root> {
        let f = File::open(path)?;
        if !f.metadata()?.is_dir() {
            return Err(io::Error::other(format!(
                "{} is not a directory",
                path.display()
            )));
        }
        Ok(Root {
            fd: f.into(),
            budget: std::cell::Cell::new(u64::MAX),
            room: u64::MAX,
        })
    }

    /// At most `bytes` of file data may be unpacked into this root; past it a layer is refused.
    pub fn with_budget(mut self, bytes: u64) -> Root {
        self.budget.set(bytes);
        self.room = bytes;
        self
    }

    /// Opens `rel` (relative, cleaned) beneath the root, following only links that stay in it.
    fn open_beneath(&self, rel: &Path, flags: OFlag) -> Result<OwnedFd, Errno> {
        let rel: &Path = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = openat2(self.fd.as_raw_fd(), rel, how)?;
        // SAFETY: openat2 returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The directory `rel` beneath the root, creating what is missing (mode 0755, root's).
    /// `entry` names the layer entry for errors.
    fn dir(&self, rel: &Path, entry: &Path) -> Result<OwnedFd, LayerError> {
        let mut at = PathBuf::new();
        let mut fd = self
            .open_beneath(&at, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(|e| io_at(entry)(errno(e)))?;
        for c in rel.components() {
            at.push(c);
            fd = match self.open_beneath(&at, OFlag::O_PATH | OFlag::O_DIRECTORY) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => {
                    match mkdirat(
                        Some(fd.as_raw_fd()),
                        c.as_os_str(),
                        Mode::from_bits_truncate(0o755),
                    ) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(io_at(entry)(errno(e))),
                    }
                    self.open_beneath(&at, OFlag::O_PATH | OFlag::O_DIRECTORY)
                        .map_err(|e| self.why(e, &at, entry))?
                }
                Err(e) => return Err(self.why(e, &at, entry)),
            };
        }
        Ok(fd)
    }

    fn why(&self, e: Errno, at: &Path, entry: &Path) -> LayerError {
        match e {
            Errno::EXDEV => refused(
                entry,
                format!(
                    "{} is a link that leads out of the image's root",
                    at.display()
                ),
            ),
            Errno::ELOOP => refused(entry, format!("{} is a loop of links", at.display())),
            Errno::ENOTDIR => refused(entry, format!("{} is not a directory", at.display())),
            e => io_at(entry)(errno(e)),
        }
    }

    /// Writes `data` to `rel` (replacing whatever is there), mode 0644 unless it exists:
    /// for the few files forkbox itself puts into a root.
    pub fn write_file(&self, rel: &Path, data: &[u8]) -> Result<(), LayerError> {
        let rel = clean(rel)?;
        let (parent, name) = split(&rel)?;
        let dir = self.dir(parent, &rel)?;
        remove_at(&dir, name).map_err(io_at(&rel))?;
        let mut f = create_file(&dir, name, 0o644).map_err(io_at(&rel))?;
        io::Write::write_all(&mut f, data).map_err(io_at(&rel))
    }

    /// Reads the file `rel`, following only links that stay beneath the root.
    pub fn read_file(&self, rel: &Path) -> io::Result<Vec<u8>> {
        let rel = clean(rel).map_err(|e| io::Error::other(e.to_string()))?;
        // Non-blocking: a FIFO in a stranger's image must not hang the build.
        let fd = self
            .open_beneath(&rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK)
            .map_err(errno)?;
        let mut f = File::from(fd);
        if !f.metadata()?.is_file() {
            return Err(io::Error::other(format!("{} is not a file", rel.display())));
        }
        let mut out = Vec::new();
        f.read_to_end(&mut out)?;
        Ok(out)
    }

    /// Makes `rel` a symbolic link to `target` (replacing whatever is there).
    pub fn symlink(&self, rel: &Path, target: &Path) -> Result<(), LayerError> {
        let rel = clean(rel)?;
        let (parent, name) = split(&rel)?;
        let dir = self.dir(parent, &rel)?;
        remove_at(&dir, name).map_err(io_at(&rel))?;
        symlinkat(target, Some(dir.as_raw_fd()), name).map_err(|e| io_at(&rel)(errno(e)))
    }

    /// Makes the directory `rel` (and its parents) if it is missing.
    pub fn ensure_dir(&self, rel: &Path, mode: u32) -> Result<(), LayerError> {
        let rel = clean(rel)?;
        let existed = self
            .open_beneath(&rel, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .is_ok();
        self.dir(&rel, &rel)?;
        if !existed {
            let (parent, name) = split(&rel)?;
            let dir = self.dir(parent, &rel)?;
            fchmodat(
                Some(dir.as_raw_fd()),
                name,
                Mode::from_bits_truncate(mode),
                FchmodatFlags::FollowSymlink,
            )
            .map_err(|e| io_at(&rel)(errno(e)))?;
        }
        Ok(())
    }

    /// Applies one layer (an uncompressed, gzip or zstd tar in `blob`).
    pub fn apply(&self, blob: &Path) -> Result<LayerStats, LayerError> {
        let mut stats = LayerStats::default();
        // Whiteouts first: they remove what the layers below put there, never this layer's.
        for_each_entry(blob, |entry| {
            let path = entry.path().map_err(LayerError::Archive)?.into_owned();
            let rel = clean(&path)?;
            let Some(name) = rel.file_name().map(OsStr::to_os_string) else {
                return Ok(());
            };
            let parent = rel.parent().unwrap_or(Path::new(""));
            if name.as_bytes() == OPAQUE.as_bytes() {
                if let Some(dir) = self.whiteout_dir(parent, &rel)? {
                    empty_dir(&dir).map_err(io_at(&rel))?;
                }
                stats.whiteouts += 1;
            } else if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT.as_bytes()) {
                if hidden.is_empty() || hidden == b"." || hidden == b".." {
                    return Err(refused(&rel, "a whiteout must name a file"));
                }
                if let Some(dir) = self.whiteout_dir(parent, &rel)? {
                    remove_at(&dir, OsStr::from_bytes(hidden)).map_err(io_at(&rel))?;
                }
                stats.whiteouts += 1;
            }
            Ok(())
        })?;
        for_each_entry(blob, |mut entry| {
            let path = entry.path().map_err(LayerError::Archive)?.into_owned();
            let rel = clean(&path)?;
            if rel
                .file_name()
                .is_some_and(|n| n.as_bytes().starts_with(WHITEOUT.as_bytes()))
            {
                return Ok(());
            }
            self.entry(&rel, &mut entry, &mut stats)
        })?;
        Ok(stats)
    }

    /// The directory `rel` if it exists beneath the root (whiteouts never create one).
    fn existing_dir(&self, rel: &Path, entry: &Path) -> Result<OwnedFd, LayerError> {
        self.open_beneath(rel, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(|e| self.why(e, rel, entry))
    }

    /// The directory a whiteout acts in; none if it does not exist (nothing to hide), refused
    /// if the path leads out of the root.
    fn whiteout_dir(&self, rel: &Path, entry: &Path) -> Result<Option<OwnedFd>, LayerError> {
        match self.open_beneath(rel, OFlag::O_PATH | OFlag::O_DIRECTORY) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT | Errno::ENOTDIR) => Ok(None),
            Err(e) => Err(self.why(e, rel, entry)),
        }
    }

    fn entry<R: Read>(
        &self,
        rel: &Path,
        entry: &mut tar::Entry<'_, R>,
        stats: &mut LayerStats,
    ) -> Result<(), LayerError> {
        use tar::EntryType as T;
        let header = entry.header().clone();
        let kind = header.entry_type();
        if rel.as_os_str().is_empty() {
            // The root itself: its metadata is forkbox's.
            return Ok(());
        }
        if matches!(
            kind,
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink
        ) {
            return Ok(());
        }
        let (parent, name) = split(rel)?;
        let dir = self.dir(parent, rel)?;
        let io = io_at(rel);
        match kind {
            T::Directory => {
                ensure_dir(&dir, name).map_err(&io)?;
                stats.dirs += 1;
            }
            T::Regular | T::Continuous | T::GNUSparse => {
                remove_at(&dir, name).map_err(&io)?;
                let mut f = create_file(&dir, name, 0o600).map_err(&io)?;
                let budget = self.budget.get();
                let n = io::copy(&mut entry.take(budget.saturating_add(1)), &mut f).map_err(&io)?;
                if n > budget {
                    return Err(refused(
                        rel,
                        format!(
                            "the layers unpack to more than the host's disk can take: {} MB were free past the 2 GiB forkbox keeps free; free some disk and pull again",
                            self.room / 1_000_000
                        ),
                    ));
                }
                self.budget.set(budget - n);
                stats.bytes += n;
                stats.files += 1;
            }
            T::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(LayerError::Archive)?
                    .ok_or_else(|| refused(rel, "a symbolic link without a target"))?
                    .into_owned();
                remove_at(&dir, name).map_err(&io)?;
                symlinkat(&target, Some(dir.as_raw_fd()), name).map_err(|e| io(errno(e)))?;
                stats.links += 1;
            }
            T::Link => {
                let target = entry
                    .link_name()
                    .map_err(LayerError::Archive)?
                    .ok_or_else(|| refused(rel, "a hard link without a target"))?
                    .into_owned();
                let target = clean(&target)?;
                let (tparent, tname) = split(&target)?;
                let tdir = self.existing_dir(tparent, rel)?;
                remove_at(&dir, name).map_err(&io)?;
                linkat(
                    Some(tdir.as_raw_fd()),
                    tname,
                    Some(dir.as_raw_fd()),
                    name,
                    AtFlags::empty(),
                )
                .map_err(|e| io(errno(e)))?;
                stats.links += 1;
                // A hard link shares its target's metadata.
                return Ok(());
            }
            T::Char | T::Block | T::Fifo => {
                remove_at(&dir, name).map_err(&io)?;
                make_node(&dir, name, &header).map_err(&io)?;
                stats.files += 1;
            }
            other => {
                return Err(refused(
                    rel,
                    format!("entry type {other:?} is not supported"),
                ));
            }
        }
        set_metadata(&dir, name, &header).map_err(&io)
    }
}

/// A directory `name` in `dir`: kept if there is one, made (in place of anything else) if not.
fn ensure_dir(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let st = nix::sys::stat::fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW);
    match st {
        Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR => {
            return Ok(())
        }
        Ok(_) => remove_at(dir, name)?,
        Err(_) => {}
    }
    mkdirat(Some(dir.as_raw_fd()), name, Mode::from_bits_truncate(0o700)).map_err(errno)
}

/// A device file or FIFO `name` in `dir`, as the entry `header` describes it.
fn make_node(dir: &OwnedFd, name: &OsStr, header: &tar::Header) -> io::Result<()> {
    let sflag = match header.entry_type() {
        tar::EntryType::Char => SFlag::S_IFCHR,
        tar::EntryType::Block => SFlag::S_IFBLK,
        _ => SFlag::S_IFIFO,
    };
    let dev = nix::sys::stat::makedev(
        u64::from(header.device_major().ok().flatten().unwrap_or(0)),
        u64::from(header.device_minor().ok().flatten().unwrap_or(0)),
    );
    let mode = Mode::from_bits_truncate(0o600);
    mknodat(Some(dir.as_raw_fd()), name, sflag, mode, dev).map_err(errno)
}

/// The entry's owner, mode (not a symbolic link's: it has none) and modification time, on
/// `name` in `dir` (never through a link).
fn set_metadata(dir: &OwnedFd, name: &OsStr, header: &tar::Header) -> io::Result<()> {
    let mode = header.mode().unwrap_or(0o644) & 0o7777;
    let uid = header.uid().unwrap_or(0) as u32;
    let gid = header.gid().unwrap_or(0) as u32;
    fchownat(
        Some(dir.as_raw_fd()),
        name,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(errno)?;
    if header.entry_type() != tar::EntryType::Symlink {
        // After the owner: chown clears set-id bits.
        fchmodat(
            Some(dir.as_raw_fd()),
            name,
            Mode::from_bits_truncate(mode),
            FchmodatFlags::FollowSymlink,
        )
        .map_err(errno)?;
    }
    let mtime = TimeSpec::new(header.mtime().unwrap_or(0) as i64, 0);
    utimensat(
        Some(dir.as_raw_fd()),
        name,
        &mtime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(errno)
}

/// What a layer held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LayerStats {
    pub files: u64,
    pub dirs: u64,
    pub links: u64,
    pub whiteouts: u64,
    pub bytes: u64,
}

fn split(rel: &Path) -> Result<(&Path, &OsStr), LayerError> {
    let name = rel
        .file_name()
        .ok_or_else(|| refused(rel, "names no file"))?;
    Ok((rel.parent().unwrap_or(Path::new("")), name))
}

fn create_file(dir: &OwnedFd, name: &OsStr, mode: u32) -> io::Result<File> {
    let fd = nix::fcntl::openat(
        Some(dir.as_raw_fd()),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map_err(errno)?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Removes `name` in `dir` (a directory with all it holds); nothing there is no error.
fn remove_at(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    match unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(Errno::EISDIR) => {
            let fd = nix::fcntl::openat(
                Some(dir.as_raw_fd()),
                name,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(errno)?;
            // SAFETY: openat returned a new descriptor that nothing else owns.
            let sub = unsafe { OwnedFd::from_raw_fd(fd) };
            empty_dir(&sub)?;
            unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::RemoveDir).map_err(errno)
        }
        Err(e) => Err(errno(e)),
    }
}

/// Removes everything in the directory `dir`, never following a link.
fn empty_dir(dir: &OwnedFd) -> io::Result<()> {
    let fd = nix::fcntl::openat(
        Some(dir.as_raw_fd()),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno)?;
    let mut listing = nix::dir::Dir::from_fd(fd).map_err(errno)?;
    let names: Vec<OsString> = listing
        .iter()
        .filter_map(Result::ok)
        .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    drop(listing);
    let here = dir.as_fd().try_clone_to_owned()?;
    for n in names {
        remove_at(&here, &n)?;
    }
    Ok(())
}

/// Calls `f` with each entry of the (possibly compressed) tar in `blob`.
fn for_each_entry(
    blob: &Path,
    mut f: impl FnMut(tar::Entry<'_, Box<dyn Read>>) -> Result<(), LayerError>,
) -> Result<(), LayerError> {
    let mut file = BufReader::new(File::open(blob).map_err(LayerError::Archive)?);
    let mut magic = [0u8; 4];
    let n = read_up_to(&mut file, &mut magic).map_err(LayerError::Archive)?;
    let head = io::Cursor::new(magic[..n].to_vec());
    let whole = head.chain(file);
    let reader: Box<dyn Read> = if magic[..n].starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(whole))
    } else if magic[..n] == [0x28, 0xb5, 0x2f, 0xfd] {
        Box::new(zstd::stream::read::Decoder::new(whole).map_err(LayerError::Archive)?)
    } else {
        Box::new(whole)
    };
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(LayerError::Archive)? {
        f(entry.map_err(LayerError::Archive)?)?;
    }
    Ok(())
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::fs;

    /// A tar layer from (path, kind) pairs: kind "d" a directory, "f:TEXT" a file, "l:TARGET" a
    /// symbolic link, "h:TARGET" a hard link. Paths are written as given, `..` and `/` too.
    fn layer(dir: &Path, name: &str, entries: &[(&str, &str)]) -> PathBuf {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o755);
            h.set_mtime(1_700_000_000);
            let data: &[u8] = if let Some(text) = kind.strip_prefix("f:") {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(text.len() as u64);
                text.as_bytes()
            } else if let Some(t) = kind.strip_prefix("l:") {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                h.set_link_name(t).unwrap();
                &[]
            } else if let Some(t) = kind.strip_prefix("h:") {
                h.set_entry_type(tar::EntryType::Link);
                h.set_size(0);
                h.set_link_name(t).unwrap();
                &[]
            } else {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                &[]
            };
            // set_path refuses `..`; a hostile layer writes the bytes itself.
            let bytes = path.as_bytes();
            h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            h.set_cksum();
            b.append(&h, data).unwrap();
        }
        let p = dir.join(name);
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut gz = gz;
        io::Write::write_all(&mut gz, &b.into_inner().unwrap()).unwrap();
        fs::write(&p, gz.finish().unwrap()).unwrap();
        p
    }

    #[test]
    fn layers_stack_with_whiteouts_and_opaque_directories() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir(&root).unwrap();
        let r = Root::open(&root).unwrap();
        let l1 = layer(
            t.path(),
            "1",
            &[
                ("etc", "d"),
                ("etc/a", "f:one"),
                ("etc/b", "f:two"),
                ("opt/keep/x", "f:x"),
                ("opt/old/y", "f:y"),
                ("usr/lib", "d"),
                ("lib", "l:usr/lib"),
                ("./etc/hard", "h:etc/a"),
            ],
        );
        let l2 = layer(
            t.path(),
            "2",
            &[
                ("etc/.wh.b", "f:"),
                ("opt/old/.wh..wh..opq", "f:"),
                ("opt/old/new", "f:new"),
                ("lib/libz.so", "f:z"),
                ("etc/a", "f:ONE"),
            ],
        );
        r.apply(&l1).unwrap();
        let s = r.apply(&l2).unwrap();
        assert_eq!(s.whiteouts, 2);
        assert_eq!(fs::read_to_string(root.join("etc/a")).unwrap(), "ONE");
        // The hard link kept the first layer's file: the second replaced the name, not the data.
        assert_eq!(fs::read_to_string(root.join("etc/hard")).unwrap(), "one");
        assert!(!root.join("etc/b").exists());
        assert!(root.join("opt/keep/x").exists());
        assert!(!root.join("opt/old/y").exists());
        assert_eq!(fs::read_to_string(root.join("opt/old/new")).unwrap(), "new");
        // A relative link inside the root is followed, as a container runtime would.
        assert_eq!(
            fs::read_to_string(root.join("usr/lib/libz.so")).unwrap(),
            "z"
        );
        assert!(!root.join(".wh.b").exists() && !root.join("etc/.wh.b").exists());
    }

    #[test]
    fn hostile_layers_are_refused_without_writing_outside() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let root = t.path().join("root");
        fs::create_dir(&root).unwrap();
        let r = Root::open(&root).unwrap();
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case<'_>] = &[
            ("dotdot", &[("../outside/owned", "f:x")], "`..`"),
            ("absolute", &[("/tmp/owned", "f:x")], "absolute"),
            (
                "abslink",
                &[
                    (
                        "escape",
                        &*Box::leak(format!("l:{}", outside.display()).into_boxed_str()),
                    ),
                    ("escape/owned", "f:x"),
                ],
                "leads out",
            ),
            (
                "rellink",
                &[("a/up", "l:../../outside"), ("a/up/owned", "f:x")],
                "leads out",
            ),
            ("hardlink", &[("h", "h:../outside/secret")], "`..`"),
            ("whiteout", &[("../outside/.wh.secret", "f:")], "`..`"),
        ];
        fs::write(outside.join("secret"), "s").unwrap();
        for (name, entries, why) in cases {
            let l = layer(t.path(), name, entries);
            let e = r.apply(&l).unwrap_err().to_string();
            assert!(e.contains(why), "{name}: {e}");
        }
        let left: Vec<_> = fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![OsString::from("secret")],
            "something was written outside"
        );
        // Writing forkbox's own files goes through the same checks.
        let e = r.write_file(Path::new("escape/hosts"), b"x").unwrap_err();
        assert!(e.to_string().contains("leads out"), "{e}");
    }

    #[test]
    fn a_layer_that_unpacks_past_the_budget_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir(&root).unwrap();
        let big = "x".repeat(5000);
        let l = layer(
            t.path(),
            "bomb",
            &[("a", "f:small"), ("b", &format!("f:{big}"))],
        );
        let r = Root::open(&root).unwrap().with_budget(4096);
        let e = r.apply(&l).unwrap_err().to_string();
        assert!(e.contains("more than the host's disk can take"), "{e}");
        // What was written stays within the budget.
        let written = fs::metadata(root.join("b")).map(|m| m.len()).unwrap_or(0);
        assert!(written <= 4097, "{written}");
    }

    #[test]
    fn garbage_is_not_a_layer() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir(&root).unwrap();
        let g = t.path().join("g");
        fs::write(&g, vec![0x1f, 0x8b, 1, 2, 3, 4, 5]).unwrap();
        assert!(Root::open(&root).unwrap().apply(&g).is_err());
    }
}
