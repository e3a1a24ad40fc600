//! Moving directory trees between the host and a sandbox as zstd-compressed tar streams.
//!
//! Downloads are the dangerous direction: the archive comes from the guest. It is unpacked only
//! into a directory this function creates (so nothing in it pre-exists), and only regular files
//! (sparse ones kept sparse), directories and symbolic links with plain relative names are
//! accepted. A link is made as a link and never followed: every directory an entry goes through
//! must be a real directory, and a file is written only under a name still free. Hard links, device files,
//! absolute names and `..` are refused with an error naming the entry, and nothing is written
//! outside the destination.

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use forkbox_protocol::{AgentMsg, HostMsg, CHUNK};
use tokio::sync::mpsc;

use crate::client::AgentClient;
use crate::error::AgentError;

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("{0} already exists; download into a directory that does not exist yet")]
    DestinationExists(PathBuf),
    #[error("{path} is not a directory on the host")]
    NotADirectory { path: PathBuf },
    #[error("refused archive entry {entry:?} from the sandbox: {why}")]
    Refused { entry: String, why: &'static str },
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> TransferError {
    let what = what.into();
    move |source| TransferError::Io { what, source }
}

/// Forwards written bytes as chunks over a channel (from a blocking thread), each chunk made
/// into the channel's item by `wrap`.
struct ChannelWriter<T> {
    tx: mpsc::Sender<T>,
    buf: Vec<u8>,
    wrap: fn(Vec<u8>) -> T,
}

impl<T> ChannelWriter<T> {
    fn new(tx: mpsc::Sender<T>, wrap: fn(Vec<u8>) -> T) -> ChannelWriter<T> {
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
struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
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
pub fn pack(src: &Path) -> Result<Packing, TransferError> {
    if !src.is_dir() {
        return Err(TransferError::NotADirectory {
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
        let mut gz = flate2::read::MultiGzDecoder::new(ChannelReader {
            rx,
            buf: Vec::new(),
            pos: 0,
        });
        let mut enc = zstd::Encoder::new(ChannelWriter::new(tx, |c| c), 1)?;
        io::copy(&mut gz, &mut enc)?;
        enc.finish()?.flush()
    });
    out
}

/// Re-encodes a zstd stream of chunks from the guest as gzip, on a blocking thread; an error
/// from the guest or a broken stream ends it early (the client then sees a broken transfer).
pub fn zstd_to_gzip(
    mut rx: mpsc::Receiver<Result<Vec<u8>, AgentError>>,
) -> mpsc::Receiver<Result<Vec<u8>, AgentError>> {
    let (plain_tx, plain_rx) = mpsc::channel::<Vec<u8>>(8);
    let (tx, out) = mpsc::channel::<Result<Vec<u8>, AgentError>>(8);
    let errors = tx.clone();
    tokio::spawn(async move {
        while let Some(item) = rx.recv().await {
            match item {
                Ok(c) => {
                    if plain_tx.send(c).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = errors.send(Err(e)).await;
                    return;
                }
            }
        }
    });
    tokio::task::spawn_blocking(move || -> io::Result<()> {
        let mut dec = zstd::Decoder::new(ChannelReader {
            rx: plain_rx,
            buf: Vec::new(),
            pos: 0,
        })?;
        let mut enc = flate2::write::GzEncoder::new(
            ChannelWriter::new(tx.clone(), Ok),
            flate2::Compression::fast(),
        );
        let copied = io::copy(&mut dec, &mut enc).and_then(|_| enc.finish()?.flush());
        if let Err(e) = &copied {
            let _ = tx.blocking_send(Err(AgentError::Io {
                what: "re-encode the archive as gzip".into(),
                source: io::Error::new(e.kind(), e.to_string()),
            }));
        }
        copied
    });
    out
}

/// Streams a tar.zst archive into the sandbox directory `dest` (created if missing).
/// Returns the compressed bytes sent.
pub async fn put_archive(
    client: &AgentClient,
    dest: &str,
    mut chunks: mpsc::Receiver<Vec<u8>>,
) -> Result<u64, TransferError> {
    let (id, mut replies) = client.route_for_transfer();
    let mut sent = 0u64;
    let result = async {
        while let Some(chunk) = chunks.recv().await {
            sent += chunk.len() as u64;
            client
                .send_msg(&HostMsg::PutArchive {
                    id,
                    dest: dest.into(),
                    data: chunk,
                    last: false,
                })
                .await?;
        }
        client
            .send_msg(&HostMsg::PutArchive {
                id,
                dest: dest.into(),
                data: Vec::new(),
                last: true,
            })
            .await?;
        match replies.recv().await {
            Some(AgentMsg::Done { .. }) => Ok(sent),
            Some(AgentMsg::Error { kind, message, .. }) => {
                Err(AgentError::Refused { kind, message }.into())
            }
            Some(other) => Err(AgentError::Unexpected(format!("{other:?}")).into()),
            None => Err(AgentError::Disconnected.into()),
        }
    }
    .await;
    client.unroute_transfer(id);
    result
}

/// The tar.zst file `path` as a stream of 1 MiB chunks (for [`put_archive`]), read on a
/// blocking thread.
fn file_chunks(path: &Path) -> Packing {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(4);
    let path = path.to_path_buf();
    let reader = tokio::task::spawn_blocking(move || -> io::Result<()> {
        let mut f = std::fs::File::open(&path)?;
        loop {
            let mut buf = vec![0u8; 1 << 20];
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            buf.truncate(n);
            if tx.blocking_send(buf).is_err() {
                return Ok(());
            }
        }
    });
    (rx, reader)
}

/// Saves the sandbox path `src` as a tar.zst file `dest` on the host (to send to another
/// sandbox with [`upload_archive`]); returns its size.
pub async fn save_archive(
    client: &AgentClient,
    src: &str,
    dest: &Path,
) -> Result<u64, TransferError> {
    use tokio::io::AsyncWriteExt;
    let mut chunks = get_archive(client, src).await?;
    let mut f = tokio::fs::File::create(dest)
        .await
        .map_err(io_err(format!("create {}", dest.display())))?;
    let mut size = 0u64;
    while let Some(chunk) = chunks.recv().await {
        let chunk = chunk?;
        size += chunk.len() as u64;
        f.write_all(&chunk)
            .await
            .map_err(io_err(format!("write {}", dest.display())))?;
    }
    f.flush()
        .await
        .map_err(io_err(format!("write {}", dest.display())))?;
    Ok(size)
}

/// Copies the host directory `src` into the sandbox directory `dest` (created if missing).
/// Symlinks inside `src` are copied as links. Returns the compressed bytes sent.
pub async fn upload(client: &AgentClient, src: &Path, dest: &str) -> Result<u64, TransferError> {
    let (rx, packer) = pack(src)?;
    let sent = put_archive(client, dest, rx).await;
    finished(packer, format!("pack {}", src.display())).await?;
    sent
}

/// The outcome of the task that made a stream's chunks (`what` it did, for the error).
async fn finished(
    task: tokio::task::JoinHandle<io::Result<()>>,
    what: String,
) -> Result<(), TransferError> {
    let done = task.await.map_err(|e| TransferError::Io {
        what: what.clone(),
        source: io::Error::other(e),
    })?;
    done.map_err(io_err(what))
}

/// Unpacks the host's tar.zst file `archive` (one [`save_archive`] wrote, or a build context)
/// into the sandbox directory `dest`. Returns the bytes sent.
pub async fn upload_archive(
    client: &AgentClient,
    archive: &Path,
    dest: &str,
) -> Result<u64, TransferError> {
    let (rx, reader) = file_chunks(archive);
    let sent = put_archive(client, dest, rx).await;
    finished(reader, format!("read {}", archive.display())).await?;
    sent
}

/// Streams the sandbox path `src` out as tar.zst chunks; the last item is the outcome.
pub async fn get_archive(
    client: &AgentClient,
    src: &str,
) -> Result<mpsc::Receiver<Result<Vec<u8>, AgentError>>, TransferError> {
    let (id, mut replies) = client.route_for_transfer();
    client
        .send_msg(&HostMsg::GetArchive {
            id,
            path: src.into(),
        })
        .await?;
    // The first answer is awaited here, so a path that cannot be sent (missing, unreadable)
    // is an error of this call, before any stream starts: an HTTP client gets a 404 in words,
    // not a stream that breaks off.
    let first = replies.recv().await;
    if let Some(AgentMsg::Error { kind, message, .. }) = first {
        client.unroute_transfer(id);
        let message = format!("{src}: {message}");
        return Err(AgentError::Refused { kind, message }.into());
    }
    let (tx, rx) = mpsc::channel(8);
    let client = client.clone();
    tokio::spawn(async move {
        let mut first = Some(first);
        loop {
            let reply = match first.take() {
                Some(reply) => reply,
                None => replies.recv().await,
            };
            let item = match reply {
                Some(AgentMsg::FileData { data, .. }) => Ok(data),
                Some(AgentMsg::Done { .. }) => break,
                Some(AgentMsg::Error { kind, message, .. }) => {
                    Err(AgentError::Refused { kind, message })
                }
                Some(other) => Err(AgentError::Unexpected(format!("{other:?}"))),
                None => Err(AgentError::Disconnected),
            };
            let stop = item.is_err();
            if tx.send(item).await.is_err() || stop {
                break;
            }
        }
        client.unroute_transfer(id);
    });
    Ok(rx)
}

/// Unpacks a tar.zst stream of chunks into the host directory `dest`, which must not exist yet;
/// on any error `dest` is removed again. Returns the number of files written.
pub async fn unpack_into(
    mut chunks: mpsc::Receiver<Result<Vec<u8>, TransferError>>,
    dest: &Path,
) -> Result<u64, TransferError> {
    if dest.symlink_metadata().is_ok() {
        return Err(TransferError::DestinationExists(dest.to_path_buf()));
    }
    std::fs::create_dir(dest).map_err(io_err(format!("create {}", dest.display())))?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
    let root = dest.to_path_buf();
    let unpacker = tokio::task::spawn_blocking(move || {
        unpack_checked(
            ChannelReader {
                rx,
                buf: Vec::new(),
                pos: 0,
            },
            &root,
        )
    });
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
    let unpacked = unpacker.await.map_err(|e| TransferError::Io {
        what: "unpack".into(),
        source: io::Error::other(e),
    })?;
    let result = outcome.and(unpacked);
    if result.is_err() {
        // Fail closed: nothing half-written stays behind.
        let _ = std::fs::remove_dir_all(dest);
    }
    result
}

/// Copies the sandbox path `src` (a file or a directory) into the host directory `dest`, which
/// must not exist yet. Returns the number of files written.
pub async fn download(client: &AgentClient, src: &str, dest: &Path) -> Result<u64, TransferError> {
    if dest.symlink_metadata().is_ok() {
        return Err(TransferError::DestinationExists(dest.to_path_buf()));
    }
    let mut from_guest = get_archive(client, src).await?;
    let (tx, rx) = mpsc::channel(8);
    let forward = tokio::spawn(async move {
        while let Some(item) = from_guest.recv().await {
            if tx.send(item.map_err(TransferError::from)).await.is_err() {
                break;
            }
        }
    });
    let result = unpack_into(rx, dest).await;
    forward.abort();
    result
}

/// Unpacks a tar.zst stream from the guest into `root`, accepting only plain files and
/// directories with relative names.
pub fn unpack_checked(source: impl Read, root: &Path) -> Result<u64, TransferError> {
    let dec = zstd::Decoder::new(source).map_err(io_err("start decompression"))?;
    let mut archive = tar::Archive::new(dec);
    let mut files = 0;
    for entry in archive.entries().map_err(io_err("read archive"))? {
        let mut entry = entry.map_err(io_err("read archive entry"))?;
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let rel = Path::new(
            std::str::from_utf8(&raw).map_err(|_| TransferError::Refused {
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
                    return Err(TransferError::Refused {
                        entry: name,
                        why: "`..` in its path",
                    })
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(TransferError::Refused {
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
                return Err(TransferError::Refused {
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
                    .ok_or_else(|| TransferError::Refused {
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
                    return Err(TransferError::Refused {
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
            return Err(TransferError::Refused {
                entry: name,
                why: "hard links are not copied out of a sandbox",
            });
        } else {
            return Err(TransferError::Refused {
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
fn real_dirs(root: &Path, rel: &Path, entry: &str) -> Result<(), TransferError> {
    let mut p = root.to_path_buf();
    for c in rel.components() {
        p.push(c);
        match p.symlink_metadata() {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(TransferError::Refused {
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
