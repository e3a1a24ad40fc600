//! Waiting for a socket a starting QEMU is to open (its control and console sockets).

use std::path::Path;
use std::time::{Duration, Instant};

/// The tries at a socket QEMU has not opened yet. QEMU opens its sockets ~20 ms after it
/// starts on an idle host and seconds later on a busy one (5 s were measured beside two busy
/// loops and three other restores): tries come 0.5 ms apart at first, then further apart (up
/// to 10 ms), so that a long wait does not take CPU from the QEMU it waits for. They end at
/// `within`, or at once when the socket's directory is removed (the VM's start was given up:
/// nothing will open it).
pub(crate) struct SocketWait<'a> {
    path: &'a Path,
    started: Instant,
    within: Duration,
    pause: Duration,
}

impl<'a> SocketWait<'a> {
    pub(crate) fn new(path: &'a Path, within: Duration) -> Self {
        SocketWait {
            path,
            started: Instant::now(),
            within,
            pause: Duration::from_micros(500),
        }
    }

    /// How long to pause before the next try; `None`: give up.
    pub(crate) fn next_pause(&mut self) -> Option<Duration> {
        if self.started.elapsed() >= self.within || self.path.parent().is_some_and(|d| !d.exists())
        {
            return None;
        }
        let pause = self.pause;
        self.pause = (pause * 2).min(Duration::from_millis(10));
        Some(pause)
    }

    /// How long it has waited so far.
    pub(crate) fn waited(&self) -> Duration {
        self.started.elapsed()
    }
}
