//! Moving directory trees between the host and a sandbox as zstd-compressed tar streams.
//!
//! Downloads are the dangerous direction: the archive comes from the guest. It is unpacked only
//! into a directory this function creates (so nothing in it pre-exists), and only regular files
//! and directories with plain relative names are accepted: symlinks, hard links, device files,
//! absolute names and `..` are refused with an error naming the entry, and nothing is written
//! outside the destination.

use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
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

/// Copies the host directory `src` into the sandbox directory `dest` (created if missing).
/// Symlinks inside `src` are copied as links. Returns the compressed bytes sent.
pub async fn upload(client: &AgentClient, src: &Path, dest: &str) -> Result<u64, TransferError> {
    let (rx, packer) = pack(src)?;
    let sent = put_archive(client, dest, rx).await;
    let packed = packer.await.map_err(|e| TransferError::Io {
        what: "pack".into(),
        source: io::Error::other(e),
    })?;
    packed.map_err(io_err(format!("pack {}", src.display())))?;
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
    let (tx, rx) = mpsc::channel(8);
    let client = client.clone();
    tokio::spawn(async move {
        loop {
            let item = match replies.recv().await {
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
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        if kind.is_dir() {
            std::fs::create_dir_all(&target)
                .map_err(io_err(format!("create {}", target.display())))?;
        } else if kind.is_file() {
            if clean.as_os_str().is_empty() {
                return Err(TransferError::Refused {
                    entry: name,
                    why: "a file with an empty name",
                });
            }
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(io_err(format!("create {}", parent.display())))?;
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(mode)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&target)
                .map_err(io_err(format!("create {}", target.display())))?;
            io::copy(&mut entry, &mut f).map_err(io_err(format!("write {}", target.display())))?;
            files += 1;
        } else if kind.is_symlink() {
            return Err(TransferError::Refused {
                entry: name,
                why: "symlinks are not copied out of a sandbox",
            });
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

        let link = archive(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, "evil", "/etc").unwrap();
        });
        let e = unpack_checked(&link[..], &root).unwrap_err().to_string();
        assert!(e.contains("symlinks"), "{e}");

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
