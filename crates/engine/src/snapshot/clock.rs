//! A sandbox woken from hibernation sees the time it slept pass, as E2B's sandboxes do after a
//! pause: a timer that fell due while it slept (a `sleep 2` begun just before a pause) fires
//! as it wakes instead of running its whole course again after.
//!
//! Under TCG the guest's clocks are QEMU's: its TSC (the clocksource the guest kernel uses,
//! at the host's TSC rate, see [`crate::vm::host_tsc_khz`]) counts from QEMU's tick
//! offset, and its timer interrupts from QEMU's virtual clock. Both stand still while the VM
//! is stopped and are saved in the device state's `timer` section (QEMU's `vmstate_timers`:
//! the tick offset, 8 unused bytes and the virtual clock's offset, each a big-endian `int64`,
//! holding the ticks and nanoseconds the VM had run when it stopped). A resume moves both on
//! by the time asleep before QEMU loads them.
//!
//! The move is at most [`MOST`]: a guest whose clock jumps further sees work that began before
//! the jump outlast the kernel's stall detectors (RCU's warns at 21 s), and the timekeeping
//! arithmetic of its TSC clocksource is exact only up to about 440 s at once. Past that the
//! guest's monotonic clock resumes from [`MOST`] later; its wall clock is set to the host's on
//! every resume either way. Under KVM the clock is the kernel's (kvmclock) and is left alone.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::error::VmError;

/// The longest sleep a woken guest's monotonic clock is moved on by.
pub const MOST: Duration = Duration::from_secs(10);

/// A migration stream's first bytes (`QEMU_VM_FILE_MAGIC`).
const MAGIC: &[u8] = b"QEVM";
/// `QEMU_VM_SECTION_FULL`, the byte before a section's id.
const SECTION_FULL: u8 = 0x04;
/// The `timer` section's header after its id: the name's length and name, instance 0,
/// version 2.
const TIMER_HEADER: &[u8] = b"\x05timer\x00\x00\x00\x00\x00\x00\x00\x02";

/// How long a hibernated guest slept, and its TSC's rate.
#[derive(Debug, Clone, Copy)]
pub struct Slept {
    pub slept: Duration,
    pub tsc_khz: u64,
}

impl Slept {
    /// Since the device state `vmstate` was written (as its guest stopped), for a guest under
    /// TCG at the host's TSC rate `tsc_khz`.
    pub fn since(vmstate: &Path, tsc_khz: u64) -> Option<Slept> {
        let written = std::fs::metadata(vmstate).ok()?.modified().ok()?;
        let slept = SystemTime::now().duration_since(written).ok()?;
        Some(Slept { slept, tsc_khz })
    }
}

/// The device state `vmstate`, its clocks moved on by `slept`, in a file of memory for QEMU to
/// load: the snapshot's own stays as it was, so a resume tried again starts from it. A state
/// this cannot move is loaded as it is (the guest's clock then stands still over the sleep, as
/// it did before this), saying why.
pub fn state_file(vmstate: &Path, slept: Slept) -> Result<File, VmError> {
    let state = std::fs::read(vmstate).map_err(|e| VmError::io("read the device state", e))?;
    let moved = match moved_on(&state, slept.slept, slept.tsc_khz) {
        Ok(moved) => moved,
        Err(why) => {
            tracing::warn!(
                "{}: the guest's clock stays where it stopped: {why}",
                vmstate.display()
            );
            return File::open(vmstate).map_err(|e| VmError::io("open the device state", e));
        }
    };
    let fd = nix::sys::memfd::memfd_create(
        c"forkbox-vmstate",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .map_err(|e| VmError::io("make a memory file for the device state", e.into()))?;
    let mut f = File::from(fd);
    use std::io::{Seek, Write};
    f.write_all(&moved)
        .and_then(|()| f.rewind())
        .map_err(|e| VmError::io("write the device state to memory", e))?;
    Ok(f)
}

/// `state` (a QEMU device state stream) with the guest's TSC and QEMU's virtual clock moved on
/// by `slept` (at most [`MOST`]), the TSC running at `tsc_khz`. A stream without exactly one
/// `timer` section of the layout above is refused, never guessed at.
pub fn moved_on(state: &[u8], slept: Duration, tsc_khz: u64) -> Result<Vec<u8>, String> {
    if !state.starts_with(MAGIC) {
        return Err("the device state is not a QEMU migration stream".into());
    }
    let at = timer_fields(state)?;
    let by = slept.min(MOST);
    let ns = by.as_nanos() as i64;
    let ticks = (by.as_nanos() * u128::from(tsc_khz) / 1_000_000) as i64;
    let mut out = state.to_vec();
    add(&mut out, at, ticks, "tick")?;
    add(&mut out, at + 16, ns, "virtual clock")?;
    Ok(out)
}

/// Where the one `timer` section's fields begin.
fn timer_fields(state: &[u8]) -> Result<usize, String> {
    let found: Vec<usize> = state
        .windows(TIMER_HEADER.len())
        .enumerate()
        .filter(|(i, w)| *w == TIMER_HEADER && *i >= 5 && state[i - 5] == SECTION_FULL)
        .map(|(i, _)| i + TIMER_HEADER.len())
        .collect();
    match found[..] {
        [at] if at + 24 <= state.len() => Ok(at),
        [] => Err("the device state has no timer section (version 2)".into()),
        [_] => Err("the device state ends inside its timer section".into()),
        _ => Err(format!(
            "the device state has {} timer sections",
            found.len()
        )),
    }
}

/// Adds `by` to the big-endian `int64` at `at`, which must be a time the VM has run (not
/// negative).
fn add(state: &mut [u8], at: usize, by: i64, what: &str) -> Result<(), String> {
    let field = &mut state[at..at + 8];
    let was = i64::from_be_bytes(field.try_into().expect("8 bytes"));
    if was < 0 {
        return Err(format!("the saved {what} offset is negative ({was})"));
    }
    let now = was
        .checked_add(by)
        .ok_or_else(|| format!("the saved {what} offset {was} overflows"))?;
    field.copy_from_slice(&now.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream as QEMU writes it: magic and version, a section before the timer's, the
    /// timer's section with `ticks`, 8 unused bytes and `clock`, its footer, a section after.
    fn stream(ticks: i64, clock: i64) -> Vec<u8> {
        let mut s = b"QEVM\x00\x00\x00\x03".to_vec();
        s.extend_from_slice(b"\x04\x00\x00\x00\x01\x04ram0\x00\x00\x00\x00\x00\x00\x00\x01junk");
        s.extend_from_slice(b"\x04\x00\x00\x00\x02");
        s.extend_from_slice(TIMER_HEADER);
        s.extend_from_slice(&ticks.to_be_bytes());
        s.extend_from_slice(&[0xaa; 8]);
        s.extend_from_slice(&clock.to_be_bytes());
        s.extend_from_slice(b"\x7e\x00\x00\x00\x02\x04\x00\x00\x00\x03\x05timer");
        s
    }

    fn fields(s: &[u8]) -> (i64, [u8; 8], i64) {
        let at = timer_fields(s).unwrap();
        (
            i64::from_be_bytes(s[at..at + 8].try_into().unwrap()),
            s[at + 8..at + 16].try_into().unwrap(),
            i64::from_be_bytes(s[at + 16..at + 24].try_into().unwrap()),
        )
    }

    #[test]
    fn the_tsc_and_the_virtual_clock_move_on_by_the_sleep() {
        let s = stream(6_371_105_368, 2_454_087_541);
        let out = moved_on(&s, Duration::from_millis(1500), 2_596_120).unwrap();
        assert_eq!(out.len(), s.len());
        assert_eq!(
            fields(&out),
            (
                6_371_105_368 + 3_894_180_000,
                [0xaa; 8],
                2_454_087_541 + 1_500_000_000
            )
        );
        // Nothing else changes.
        let at = timer_fields(&s).unwrap();
        assert_eq!(out[..at], s[..at]);
        assert_eq!(out[at + 24..], s[at + 24..]);
    }

    #[test]
    fn a_long_sleep_moves_the_clock_on_by_the_most() {
        let s = stream(0, 0);
        let out = moved_on(&s, Duration::from_secs(3600), 1_000_000).unwrap();
        assert_eq!(fields(&out), (10_000_000_000, [0xaa; 8], 10_000_000_000));
    }

    #[test]
    fn streams_it_cannot_read_for_certain_are_refused() {
        let bad = |s: &[u8]| moved_on(s, Duration::from_secs(1), 1_000_000).unwrap_err();
        assert!(bad(b"not a stream").contains("not a QEMU migration stream"));
        assert!(bad(b"QEVM\x00\x00\x00\x03").contains("no timer section"));
        let mut two = stream(1, 1);
        two.extend_from_slice(&stream(1, 1)[8..]);
        assert!(bad(&two).contains("2 timer sections"));
        let s = stream(1, 1);
        let at = timer_fields(&s).unwrap();
        assert!(bad(&s[..at + 20]).contains("ends inside"));
        assert!(bad(&stream(-5, 1)).contains("negative"));
        assert!(bad(&stream(i64::MAX, 1)).contains("overflows"));
    }
}
