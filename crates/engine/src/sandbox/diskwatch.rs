//! A full host disk pauses a sandbox; it never loses a write.
//!
//! QEMU runs the root disk with `werror=enospc`: when a write to the sandbox's overlay fails
//! because the host's file system is full, QEMU stops the guest at that instant and keeps the
//! failed request, to retry it on `cont`. The guest sees nothing (no I/O error, no remount).
//! Each sandbox has a watcher on a second QMP monitor of its QEMU (`events.sock`): on a
//! `BLOCK_IO_ERROR` with `nospace` it records the sandbox as held by a full disk (new commands
//! are then refused in words instead of hanging), checks the free space of the overlay's file
//! system every second, and sends `cont` once [`RESUME_FREE_BYTES`] are free there. The
//! guest's `RESUME` clears the record.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Free space (for an unprivileged user, as QEMU is) at which a paused sandbox is resumed.
pub const RESUME_FREE_BYTES: u64 = 64 << 20;

/// Whether a sandbox is held by a full host disk, shared with its watcher.
#[derive(Debug, Clone, Default)]
pub struct DiskWatch {
    held: Arc<Mutex<Option<PathBuf>>>,
}

impl DiskWatch {
    /// The directory whose file system is full, while the sandbox is paused for it.
    pub fn held(&self) -> Option<PathBuf> {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn set(&self, v: Option<PathBuf>) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = v;
    }

    /// Starts watching the QEMU whose event monitor is `events`, writing its disk in
    /// `disk_dir`. The watcher ends when QEMU closes the monitor (it exited).
    pub fn spawn(events: PathBuf, disk_dir: PathBuf) -> DiskWatch {
        let w = DiskWatch::default();
        let me = w.clone();
        tokio::spawn(async move {
            if let Err(e) = me.run(&events, &disk_dir).await {
                tracing::debug!(socket = %events.display(), "disk watcher ended: {e}");
            }
        });
        w
    }

    async fn run(&self, events: &Path, disk_dir: &Path) -> std::io::Result<()> {
        // The monitor exists as soon as QEMU has initialised, which it has when a sandbox is
        // assembled; a QEMU from before this monitor existed simply has none.
        let stream = UnixStream::connect(events).await?;
        let (rd, mut wr) = stream.into_split();
        let mut lines = BufReader::new(rd).lines();
        // A guest already stopped for a full disk (this daemon adopted it after a restart)
        // shows as `io-error`, with no event to come.
        wr.write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"query-status\"}\n")
            .await?;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                line = lines.next_line() => {
                    let Some(line) = line? else { return Ok(()) };
                    let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
                    if v["return"]["status"] == "io-error" {
                        self.set(Some(disk_dir.to_path_buf()));
                    }
                    match v["event"].as_str() {
                        Some("BLOCK_IO_ERROR") if v["data"]["nospace"] == true => {
                            if self.held().is_none() {
                                tracing::warn!(
                                    dir = %disk_dir.display(),
                                    "the host's file system is full: sandbox paused until space is freed"
                                );
                            }
                            self.set(Some(disk_dir.to_path_buf()));
                        }
                        Some("RESUME") => self.set(None),
                        _ => {}
                    }
                }
                _ = tick.tick() => {
                    if self.held().is_some() && free_bytes(disk_dir) >= RESUME_FREE_BYTES {
                        tracing::info!(dir = %disk_dir.display(), "space freed: resuming the sandbox");
                        wr.write_all(b"{\"execute\":\"cont\"}\n").await?;
                    }
                }
            }
        }
    }
}

/// Bytes free for an unprivileged user on the file system holding `dir` (0 when unknown).
pub fn free_bytes(dir: &Path) -> u64 {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
        .unwrap_or(0)
}
