//! What the host's `/proc` says about a process.

use std::fs;

/// Start time of a running process (clock ticks since boot), to tell a PID from its reuse;
/// `None` for a process that is gone or a zombie.
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    // A zombie has ended; only its exit status is left for its parent to collect.
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}
