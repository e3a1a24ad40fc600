//! What a sandbox is doing for its callers, for sleeping when idle: when it was last used, and
//! whether anything holds it now (a request to its agent in flight, a command running, a port
//! connection open).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shared by a sandbox's agent client (every request in flight holds it) and its port
/// forwards (every connection holds it).
#[derive(Debug)]
pub struct Activity {
    last: Mutex<Instant>,
    open: AtomicUsize,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            last: Mutex::new(Instant::now()),
            open: AtomicUsize::new(0),
        }
    }
}

impl Activity {
    /// Marks the sandbox used now.
    pub fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Holds the sandbox busy until the guard goes (and marks it used at both ends).
    pub fn hold(self: &Arc<Self>) -> Busy {
        self.open.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Busy(self.clone())
    }

    /// How long nothing has used it: zero while something holds it.
    pub fn idle_for(&self, in_flight: usize) -> Duration {
        if in_flight > 0 || self.open.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }
}

/// Something holding a sandbox busy (see [`Activity::hold`]).
#[derive(Debug)]
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_is_never_idle_and_release_counts_as_use() {
        let a = Arc::new(Activity::default());
        std::thread::sleep(Duration::from_millis(20));
        assert!(a.idle_for(0) >= Duration::from_millis(20));
        assert_eq!(a.idle_for(1), Duration::ZERO, "a request in flight");
        let held = a.hold();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(a.idle_for(0), Duration::ZERO, "a connection open");
        drop(held);
        assert!(
            a.idle_for(0) < Duration::from_millis(20),
            "its end is a use"
        );
    }
}
