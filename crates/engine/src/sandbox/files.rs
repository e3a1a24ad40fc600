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
use std::path::Path;

use forkbox_protocol::{AgentMsg, HostMsg};
use tokio::sync::mpsc;

pub use forkbox_archive::{gzip_to_zstd, pack, unpack_checked, unpack_into, ArchiveError, Packing};
use forkbox_archive::{io_err, ChannelReader, ChannelWriter};

use crate::client::AgentClient;
use crate::error::AgentError;

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The host side of a transfer: packing, or unpacking with every entry checked.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Agent(#[from] AgentError),
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
        let mut dec = zstd::Decoder::new(ChannelReader::new(plain_rx))?;
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
    let done = task.await.map_err(|e| ArchiveError::Io {
        what: what.clone(),
        source: io::Error::other(e),
    })?;
    Ok(done.map_err(io_err(what))?)
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

/// Copies the sandbox path `src` (a file or a directory) into the host directory `dest`, which
/// must not exist yet. Returns the number of files written.
pub async fn download(client: &AgentClient, src: &str, dest: &Path) -> Result<u64, TransferError> {
    if dest.symlink_metadata().is_ok() {
        return Err(ArchiveError::DestinationExists(dest.to_path_buf()).into());
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
