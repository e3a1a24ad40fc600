//! Logging what a guest caused. A guest is hostile and can make the host log as often as it
//! likes, with strings of its choosing; so every guest-supplied string is cut and escaped
//! before it reaches the log ([`quote`]: no newline can forge a line, no megabyte name fills
//! the disk), and each sandbox's guest-caused lines are rate-limited ([`RateLimit`]): past the
//! budget they are counted, and the next line that passes says how many were left out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Characters of a guest-supplied string that reach a log line.
pub const QUOTE_CHARS: usize = 96;

/// `s`, cut to [`QUOTE_CHARS`] characters and escaped (control characters, newlines, quotes
/// and backslashes as Rust escapes), in double quotes; a cut string says how long it was.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(QUOTE_CHARS + 24);
    out.push('"');
    let mut chars = s.chars();
    for c in chars.by_ref().take(QUOTE_CHARS) {
        out.extend(c.escape_debug());
    }
    out.push('"');
    if chars.next().is_some() {
        out.push_str(&format!("… ({} bytes)", s.len()));
    }
    out
}

/// Lines allowed per window, and the window.
const BURST: u32 = 20;
const WINDOW: Duration = Duration::from_secs(10);

/// At most [`BURST`] lines per [`WINDOW`] for one sandbox.
pub struct RateLimit {
    state: Mutex<State>,
}

struct State {
    since: Instant,
    used: u32,
    dropped: u64,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            state: Mutex::new(State {
                since: Instant::now(),
                used: 0,
                dropped: 0,
            }),
        }
    }
}

impl RateLimit {
    /// Whether a line may be logged now; `Some(n)` with the lines left out before it.
    pub fn admit(&self) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.since.elapsed() >= WINDOW {
            s.since = Instant::now();
            s.used = 0;
        }
        if s.used >= BURST {
            s.dropped += 1;
            return None;
        }
        s.used += 1;
        Some(std::mem::take(&mut s.dropped))
    }
}

/// Logs a guest-caused event at INFO through `limit`; `$msg` must already quote what the
/// guest supplied.
#[macro_export]
macro_rules! guest_info {
    ($limit:expr, $($arg:tt)*) => {
        if let Some(dropped) = $limit.admit() {
            let msg = format!($($arg)*);
            if dropped > 0 {
                tracing::info!("{msg} ({dropped} similar line(s) left out: rate limit)");
            } else {
                tracing::info!("{msg}");
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_cuts_long_strings_and_escapes_newlines() {
        let q = quote(&format!("evil\nINFO forged line{}", "x".repeat(1 << 20)));
        assert!(!q.contains('\n'), "{q}");
        assert!(q.contains("\\n"), "{q}");
        assert!(q.len() < 200, "{}", q.len());
        assert!(q.ends_with("(1048597 bytes)"), "{q}");
        assert_eq!(quote("pypi.org"), "\"pypi.org\"");
    }

    #[test]
    fn the_rate_limit_counts_what_it_leaves_out() {
        let l = RateLimit::default();
        for _ in 0..BURST {
            assert_eq!(l.admit(), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(l.admit(), None);
        }
        // A new window reports the five.
        l.state.lock().unwrap_or_else(|p| p.into_inner()).since -= WINDOW;
        assert_eq!(l.admit(), Some(5));
    }
}
