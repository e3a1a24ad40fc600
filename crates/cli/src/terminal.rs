//! This process's terminal, for commands run on a terminal in a sandbox: its size, and raw
//! mode while keys go through to the command.

use forkbox_engine::api::TerminalSize;
use nix::sys::termios::{self, SetArg, Termios};

/// The size of the terminal on standard output (or input); 24 x 80 when neither is one.
pub fn size() -> TerminalSize {
    let fds: [&dyn std::os::fd::AsFd; 3] =
        [&std::io::stdout(), &std::io::stdin(), &std::io::stderr()];
    for fd in fds {
        if let Ok(ws) = rustix::termios::tcgetwinsize(fd) {
            if ws.ws_row > 0 && ws.ws_col > 0 {
                return TerminalSize {
                    rows: ws.ws_row,
                    cols: ws.ws_col,
                };
            }
        }
    }
    TerminalSize { rows: 24, cols: 80 }
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
