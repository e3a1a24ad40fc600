//! The daemon's log file, `daemon.log` in forkbox's home, with a size cap: past
//! [`DEFAULT_CAP`] bytes it becomes `daemon.log.1` (replacing the one before) and a new file
//! starts, so the log never holds more than twice the cap on disk whatever is logged.
//! What a guest can make the daemon log is also truncated, escaped and rate-limited where it
//! is logged (see `forkbox_engine::guestlog`); this cap is the last bound.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Bytes of `daemon.log` before it rotates.
pub const DEFAULT_CAP: u64 = 16 << 20;

struct Inner {
    file: File,
    written: u64,
}

#[derive(Clone)]
pub struct LogFile {
    path: PathBuf,
    cap: u64,
    inner: Arc<Mutex<Inner>>,
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

impl LogFile {
    pub fn open(path: &Path, cap: u64) -> io::Result<LogFile> {
        let file = open(path)?;
        let written = file.metadata()?.len();
        Ok(LogFile {
            path: path.to_path_buf(),
            cap,
            inner: Arc::new(Mutex::new(Inner { file, written })),
        })
    }

    fn write_line(&self, buf: &[u8]) -> io::Result<()> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.written + buf.len() as u64 > self.cap && inner.written > 0 {
            let old = self.path.with_extension("log.1");
            std::fs::rename(&self.path, &old)?;
            inner.file = open(&self.path)?;
            inner.written = 0;
        }
        // A single line longer than the cap is cut; its end says so.
        let keep = buf.len().min(self.cap as usize);
        inner.file.write_all(&buf[..keep])?;
        if keep < buf.len() {
            inner
                .file
                .write_all(b" [line cut at the log's size cap]\n")?;
        }
        inner.written += keep as u64;
        Ok(())
    }
}

/// One event's writer: `tracing_subscriber` formats an event into it and drops it, so each
/// event reaches the file in one write, whole.
pub struct EventWriter {
    log: LogFile,
    buf: Vec<u8>,
}

impl Write for EventWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            let _ = self.log.write_line(&self.buf);
            // Also on a terminal, when the daemon runs in the foreground.
            if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                let _ = std::io::stderr().write_all(&self.buf);
            }
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogFile {
    type Writer = EventWriter;
    fn make_writer(&'a self) -> EventWriter {
        EventWriter {
            log: self.clone(),
            buf: Vec::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    #[test]
    fn the_log_rotates_at_its_cap_and_keeps_one_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.log");
        let log = LogFile::open(&path, 1000).unwrap();
        for i in 0..500 {
            writeln!(log.make_writer(), "line {i:04} of the test log").unwrap();
        }
        let now = std::fs::metadata(&path).unwrap().len();
        let old = std::fs::metadata(dir.path().join("daemon.log.1"))
            .unwrap()
            .len();
        assert!(now <= 1000 && old <= 1000, "{now} {old}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("line 0499 of the test log\n"), "{text}");
        // One line longer than the cap is cut, not written whole.
        writeln!(log.make_writer(), "{}", "x".repeat(5000)).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() < 1100);
    }
}
