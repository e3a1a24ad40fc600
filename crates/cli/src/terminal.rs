//! This process's terminal, for commands run on a terminal in a sandbox: its size, and raw
//! mode while keys go through to the command.

use forkbox_protocol::WinSize;
use nix::sys::termios::{self, SetArg, Termios};

/// The size of the terminal on standard output (or input); 24 x 80 when neither is one.
pub fn size() -> WinSize {
    let fds: [&dyn std::os::fd::AsFd; 3] =
        [&std::io::stdout(), &std::io::stdin(), &std::io::stderr()];
    for fd in fds {
        if let Ok(ws) = rustix::termios::tcgetwinsize(fd) {
            if ws.ws_row > 0 && ws.ws_col > 0 {
                return WinSize {
                    rows: ws.ws_row,
                    cols: ws.ws_col,
                };
            }
        }
    }
    WinSize { rows: 24, cols: 80 }
}

/// This process's standard input in chunks as it comes, read on a thread of its own (a read
/// blocks, and the command may end before it does); the channel closes at end of input.
pub fn stdin_chunks() -> tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let item = match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => Ok(buf[..n].to_vec()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            if tx.blocking_send(item).is_err() {
                return;
            }
        }
    });
    rx
}

/// Standard input in raw mode (no echo, no line editing, Ctrl-C a byte) until dropped.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// `None` when standard input is no terminal (then nothing changes).
    pub fn enter() -> Option<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}

/// Standard input's terminal without echo while this lives (a password typed is not shown).
pub struct NoEcho {
    saved: Termios,
}

impl NoEcho {
    pub fn new() -> std::io::Result<NoEcho> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin)?;
        let mut quiet = saved.clone();
        quiet.local_flags.remove(termios::LocalFlags::ECHO);
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &quiet)?;
        Ok(NoEcho { saved })
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}
