//! Directory trees in and out of the guest as zstd-compressed tar streams.
//!
//! The host is trusted: an archive it sends is unpacked as it is (the `tar` crate still keeps
//! every entry inside `dest`). Archives the agent sends are checked by the host.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use forkbox_protocol::{AgentMsg, CHUNK};

use crate::serve::Outbox;

/// Reads the chunks of one upload as they arrive.
struct ChunkReader {
    rx: Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            match self.rx.recv() {
                Ok(b) => {
                    self.buf = b;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Uploads in progress, by request id.
#[derive(Clone, Default)]
pub struct Uploads(Arc<Mutex<HashMap<u32, SyncSender<Vec<u8>>>>>);

impl Uploads {
    pub fn chunk(&self, id: u32, dest: String, data: Vec<u8>, last: bool, out: &Outbox) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let tx = map.entry(id).or_insert_with(|| {
            let (tx, rx) = sync_channel::<Vec<u8>>(16);
            let out = out.clone();
            let uploads = self.clone();
            std::thread::spawn(move || {
                let result = unpack(
                    ChunkReader {
                        rx,
                        buf: Vec::new(),
                        pos: 0,
                    },
                    Path::new(&dest),
                );
                uploads
                    .0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                match result {
                    Ok(()) => out.send(&AgentMsg::Done { id }),
                    Err(e) => out.error(id, &e),
                }
            });
            tx
        });
        // A failed unpack has dropped its receiver; the rest of its chunks go nowhere.
        let _ = tx.send(data);
        if last {
            map.remove(&id);
        }
    }
}

fn unpack(source: impl Read, dest: &Path) -> io::Result<()> {
    if !dest.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not absolute", dest.display()),
        ));
    }
    std::fs::create_dir_all(dest)?;
    let decoder = ruzstd::decoding::StreamingDecoder::new(source).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a zstd stream: {e}"),
        )
    })?;
    let mut archive = tar::Archive::new(decoder);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(true);
    archive.unpack(dest).map_err(with_causes)
}

/// The error with what caused it (the tar crate's message names the entry; its cause, such
/// as "No space left on device", is what the user must read).
fn with_causes(e: io::Error) -> io::Error {
    let mut msg = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        msg = format!("{msg}: {c}");
        cause = c.source();
    }
    io::Error::new(e.kind(), msg)
}

/// Sends `FileData` chunks as the compressor writes them.
struct ChunkWriter<'a> {
    id: u32,
    out: &'a Outbox,
    buf: Vec<u8>,
}

impl Write for ChunkWriter<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            let data = std::mem::take(&mut self.buf);
            self.out.send(&AgentMsg::FileData { id: self.id, data });
        }
        Ok(())
    }
}

/// Sends `path` as a tar.zst stream. Symlinks are archived as links, never followed.
pub fn send(id: u32, path: &str, out: &Outbox) {
    let result = (|| -> io::Result<()> {
        let p = Path::new(path);
        let meta = std::fs::symlink_metadata(p)?;
        let (reader, mut writer) = io::pipe()?;
        let src = p.to_path_buf();
        let tar_thread = std::thread::spawn(move || -> io::Result<()> {
            let mut b = tar::Builder::new(&mut writer);
            b.follow_symlinks(false);
            if meta.is_dir() {
                b.append_dir_all(".", &src)?;
            } else {
                let name = src
                    .file_name()
                    .map(|n| n.to_os_string())
                    .unwrap_or_default();
                b.append_path_with_name(&src, name)?;
            }
            b.finish()
        });
        let mut w = ChunkWriter {
            id,
            out,
            buf: Vec::with_capacity(CHUNK),
        };
        ruzstd::encoding::compress(reader, &mut w, ruzstd::encoding::CompressionLevel::Fastest);
        w.flush()?;
        tar_thread
            .join()
            .map_err(|_| io::Error::other("archiver thread panicked"))?
    })();
    match result {
        Ok(()) => out.send(&AgentMsg::Done { id }),
        Err(e) => out.error(id, &e),
    }
}
