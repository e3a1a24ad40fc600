//! Directory trees as zstd-compressed tar streams, on the host: packing one to send, and
//! unpacking one that came from a sandbox with every entry checked.
//!
//! Unpacking is the dangerous direction: the archive comes from the guest. It is unpacked only
//! into a directory this crate creates (so nothing in it pre-exists), and only regular files
//! (sparse ones kept sparse), directories and symbolic links with plain relative names are
//! accepted. A link is made as a link and never followed: every directory an entry goes through
//! must be a real directory, and a file is written only under a name still free. Hard links,
//! device files, absolute names and `..` are refused with an error naming the entry, and nothing
//! is written outside the destination.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use tokio::sync::mpsc;

/// Bytes per chunk of a stream (the agent protocol's chunk).
pub const CHUNK: usize = forkbox_protocol::CHUNK;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{0} already exists; download into a directory that does not exist yet")]
    DestinationExists(PathBuf),
    #[error("{path} is not a directory on the host")]
    NotADirectory { path: PathBuf },
    #[error("refused archive entry {entry:?} from the sandbox: {why}")]
    Refused { entry: String, why: &'static str },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
}

/// An I/O error with what was being done.
pub fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ArchiveError {
    let what = what.into();
    move |source| ArchiveError::Io { what, source }
}

/// Forwards written bytes as chunks over a channel (from a blocking thread), each chunk made
/// into the channel's item by `wrap`.
pub struct ChannelWriter<T> {
    tx: mpsc::Sender<T>,
    buf: Vec<u8>,
    wrap: fn(Vec<u8>) -> T,
}

impl<T> ChannelWriter<T> {
    pub fn new(tx: mpsc::Sender<T>, wrap: fn(Vec<u8>) -> T) -> ChannelWriter<T> {
        ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
            wrap,
        }
    }
}

impl<T> Write for ChannelWriter<T> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
            self.tx
                .blocking_send((self.wrap)(chunk))
                .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "transfer aborted"))?;
        }
        Ok(())
    }
}

/// Reads chunks from a channel (on a blocking thread).
pub struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<Vec<u8>>) -> ChannelReader {
        ChannelReader {
            rx,
            buf: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            match self.rx.blocking_recv() {
                Some(b) => {
                    self.buf = b;
                    self.pos = 0;
                }
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Chunks of a tar.zst stream being made, and the task making them (its result says whether
/// the whole tree was read).
pub type Packing = (
    mpsc::Receiver<Vec<u8>>,
    tokio::task::JoinHandle<io::Result<()>>,
);

/// Packs the host directory `src` as a tar.zst stream of chunks (symlinks stay links).
pub fn pack(src: &Path) -> Result<Packing, ArchiveError> {
    if !src.is_dir() {
        return Err(ArchiveError::NotADirectory {
            path: src.to_path_buf(),
        });
    }
    let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
    let root = src.to_path_buf();
    let packer = tokio::task::spawn_blocking(move || -> io::Result<()> {
        let mut enc = zstd::Encoder::new(ChannelWriter::new(tx, |c| c), 3)?;
        {
            let mut b = tar::Builder::new(&mut enc);
            b.follow_symlinks(false);
            b.append_dir_all(".", &root)?;
            b.finish()?;
        }
        let mut writer = enc.finish()?;
        writer.flush()
    });
    Ok((rx, packer))
}

/// Re-encodes a gzip stream of chunks as zstd (what the guest unpacks), on a blocking thread,
/// for clients whose platform has gzip only (Node, Python's standard library). A stream that
/// is not gzip ends the output early, and the guest then refuses the truncated archive.
pub fn gzip_to_zstd(rx: mpsc::Receiver<Vec<u8>>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, out) = mpsc::channel::<Vec<u8>>(8);
    tokio::task::spawn_blocking(move || -> io::Result<()> {
        let mut gz = flate2::read::MultiGzDecoder::new(ChannelReader::new(rx));
        let mut enc = zstd::Encoder::new(ChannelWriter::new(tx, |c| c), 1)?;
        io::copy(&mut gz, &mut enc)?;
        enc.finish()?.flush()
    });
    out
}

/// Unpacks a tar.zst stream of chunks into the host directory `dest`, which must not exist yet;
/// on any error `dest` is removed again. Returns the number of files written.
/// `chunks` may carry the source's own errors (`E`), which end the unpacking.
pub async fn unpack_into<E: From<ArchiveError>>(
    mut chunks: mpsc::Receiver<Result<Vec<u8>, E>>,
    dest: &Path,
) -> Result<u64, E> {
    if dest.symlink_metadata().is_ok() {
        return Err(ArchiveError::DestinationExists(dest.to_path_buf()).into());
    }
    std::fs::create_dir(dest).map_err(io_err(format!("create {}", dest.display())))?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
    let root = dest.to_path_buf();
    let unpacker =
        tokio::task::spawn_blocking(move || unpack_checked(ChannelReader::new(rx), &root));
    let mut outcome = Ok(());
    while let Some(item) = chunks.recv().await {
        match item {
            Ok(data) => {
                if tx.send(data).await.is_err() {
                    break; // the unpacker stopped; its error says why
                }
            }
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    drop(tx);
    let unpacked = unpacker
        .await
        .map_err(|e| ArchiveError::Io {
            what: "unpack".into(),
            source: io::Error::other(e),
        })
        .and_then(|r| r);
    let result = outcome.and(unpacked.map_err(E::from));
    if result.is_err() {
        // Fail closed: nothing half-written stays behind (and nothing beyond a mount is
        // touched in removing it).
        forkbox_hostfs::discard_tree(dest);
    }
    result
}

/// Unpacks a tar.zst stream from the guest into `root`, accepting only plain files and
/// directories with relative names.
pub fn unpack_checked(source: impl Read, root: &Path) -> Result<u64, ArchiveError> {
    let dec = zstd::Decoder::new(source).map_err(io_err("start decompression"))?;
    let mut archive = tar::Archive::new(dec);
    let mut files = 0;
    for entry in archive.entries().map_err(io_err("read archive"))? {
        let mut entry = entry.map_err(io_err("read archive entry"))?;
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let rel = Path::new(
            std::str::from_utf8(&raw).map_err(|_| ArchiveError::Refused {
                entry: name.clone(),
                why: "name is not UTF-8",
            })?,
        );
        let mut clean = PathBuf::new();
        for c in rel.components() {
            match c {
                Component::Normal(p) => clean.push(p),
                Component::CurDir => {}
                Component::ParentDir => {
                    return Err(ArchiveError::Refused {
                        entry: name,
                        why: "`..` in its path",
                    })
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(ArchiveError::Refused {
                        entry: name,
                        why: "absolute path",
                    })
                }
            }
        }
        let kind = entry.header().entry_type();
        let target = root.join(&clean);
        if kind.is_dir() {
            real_dirs(root, &clean, &name)?;
        } else if kind.is_file() || kind == tar::EntryType::GNUSparse || kind.is_symlink() {
            let Some(parent) = clean.parent().filter(|_| !clean.as_os_str().is_empty()) else {
                return Err(ArchiveError::Refused {
                    entry: name,
                    why: "a file with an empty name",
                });
            };
            real_dirs(root, parent, &name)?;
            if kind.is_symlink() {
                // Kept as a link, its target as the sandbox wrote it; nothing here follows it
                // (parents are checked to be real directories, files written only under free names).
                let link = entry
                    .link_name()
                    .map_err(io_err("read a link's target"))?
                    .ok_or_else(|| ArchiveError::Refused {
                        entry: name.clone(),
                        why: "a link without a target",
                    })?;
                std::os::unix::fs::symlink(&link, &target)
                    .map_err(io_err(format!("link {}", target.display())))?;
            } else {
                // Only this function writes into the new directory, so a name found free here
                // stays free; tar's own unpacking then seeks over a sparse file's holes (a
                // 100 GiB sparse file takes no time and no space) and keeps the permission
                // bits only.
                if target.symlink_metadata().is_ok() {
                    return Err(ArchiveError::Refused {
                        entry: name,
                        why: "a second entry of that name",
                    });
                }
                entry
                    .unpack(&target)
                    .map_err(io_err(format!("write {}", target.display())))?;
            }
            files += 1;
        } else if kind.is_hard_link() {
            return Err(ArchiveError::Refused {
                entry: name,
                why: "hard links are not copied out of a sandbox",
            });
        } else {
            return Err(ArchiveError::Refused {
                entry: name,
                why: "device files, FIFOs and other special files are refused",
            });
        }
    }
    Ok(files)
}

/// Makes `rel` under `root` a chain of real directories, component by component: an existing
/// component must be a directory itself, never a link or a file, so no later entry can write
/// through a link the archive made.
fn real_dirs(root: &Path, rel: &Path, entry: &str) -> Result<(), ArchiveError> {
    let mut p = root.to_path_buf();
    for c in rel.components() {
        p.push(c);
        match p.symlink_metadata() {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ArchiveError::Refused {
                    entry: entry.to_string(),
                    why: "its path goes through a link or a file the archive made",
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(&p).map_err(io_err(format!("create {}", p.display())))?
            }
            Err(e) => return Err(io_err(format!("look at {}", p.display()))(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        zstd::encode_all(&b.into_inner().unwrap()[..], 1).unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // set_path refuses `..`; write the raw name as a hostile guest would.
        let bytes = name.as_bytes();
        h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    #[test]
    fn plain_files_and_dirs_unpack() {
        let dir = tempfile::tempdir().unwrap();
        let data = archive(|b| {
            file(b, "a/b/c.txt", b"hello");
            file(b, "./top", b"x");
        });
        assert_eq!(unpack_checked(&data[..], dir.path()).unwrap(), 2);
        assert_eq!(
            std::fs::read(dir.path().join("a/b/c.txt")).unwrap(),
            b"hello"
        );
    }

    #[test]
    fn links_stay_links_and_sparse_files_stay_sparse() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir(src.path().join("venv")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3", src.path().join("venv/python")).unwrap();
        std::os::unix::fs::symlink("python", src.path().join("venv/python3")).unwrap();
        let f = std::fs::File::create(src.path().join("disk.img")).unwrap();
        f.set_len(64 << 20).unwrap();
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut f = f;
            f.seek(SeekFrom::Start(32 << 20)).unwrap();
            f.write_all(b"data in the middle").unwrap();
        }
        // As the guest agent packs: links not followed, sparse files as GNU sparse entries.
        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        b.append_dir_all(".", src.path()).unwrap();
        let tar = b.into_inner().unwrap();
        let zst = zstd::encode_all(&tar[..], 1).unwrap();
        let dest = tempfile::tempdir().unwrap();
        let root = dest.path().join("out");
        std::fs::create_dir(&root).unwrap();
        unpack_checked(&zst[..], &root).unwrap();
        assert_eq!(
            std::fs::read_link(root.join("venv/python")).unwrap(),
            Path::new("/usr/bin/python3")
        );
        assert_eq!(
            std::fs::read_link(root.join("venv/python3")).unwrap(),
            Path::new("python")
        );
        let img = root.join("disk.img");
        let meta = std::fs::metadata(&img).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        assert!(
            std::os::unix::fs::MetadataExt::blocks(&meta) * 512 < 1 << 20,
            "{} bytes allocated",
            std::os::unix::fs::MetadataExt::blocks(&meta) * 512
        );
        let data = std::fs::read(&img).unwrap();
        assert_eq!(&data[32 << 20..(32 << 20) + 18], b"data in the middle");
    }

    #[test]
    fn hostile_entries_are_refused_and_nothing_escapes() {
        let outer = tempfile::tempdir().unwrap();
        let root = outer.path().join("dest");
        for (name, why) in [
            ("../escape", "`..`"),
            ("/etc/passwd-forkbox-test", "absolute"),
        ] {
            std::fs::create_dir_all(&root).unwrap();
            let data = archive(|b| file(b, name, b"bad"));
            let e = unpack_checked(&data[..], &root).unwrap_err().to_string();
            assert!(e.contains(why), "{name}: {e}");
        }
        assert!(!outer.path().join("escape").exists());
        assert!(!Path::new("/etc/passwd-forkbox-test").exists());

        // A link is kept as a link; nothing is ever written through it.
        for through in ["evil/passwd-forkbox-test", "evil/sub/passwd-forkbox-test"] {
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).unwrap();
            let link = archive(|b| {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, "evil", "/etc").unwrap();
                file(b, through, b"bad");
            });
            let e = unpack_checked(&link[..], &root).unwrap_err().to_string();
            assert!(e.contains("goes through a link"), "{e}");
            assert_eq!(
                std::fs::read_link(root.join("evil")).unwrap(),
                Path::new("/etc")
            );
            assert!(!Path::new("/etc/passwd-forkbox-test").exists());
            assert!(!Path::new("/etc/sub").exists());
        }
        // ... nor does a file entry replace it and write where it points.
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let target = outer.path().join("outside");
        std::fs::write(&target, b"mine").unwrap();
        let link = archive(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, "l", &target).unwrap();
            file(b, "l", b"bad");
        });
        assert!(unpack_checked(&link[..], &root).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"mine");
        std::fs::create_dir_all(&root).unwrap();

        let dev = archive(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Char);
            h.set_size(0);
            h.set_path("null").unwrap();
            h.set_cksum();
            b.append(&h, &[][..]).unwrap();
        });
        let e = unpack_checked(&dev[..], &root).unwrap_err().to_string();
        assert!(e.contains("device files"), "{e}");
    }
}
