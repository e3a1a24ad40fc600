//! Making a copy restored from a snapshot its own machine: fresh randomness, the right time,
//! its own name. Every copy of one snapshot starts with the same kernel RNG state; without this
//! they would all draw the same "random" numbers.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;

use forkbox_protocol::Refresh;

/// `RNDADDENTROPY`: `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG`: `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

pub fn apply(r: &Refresh) -> io::Result<()> {
    reseed(&r.entropy)?;
    set_clock(r.unix_secs, r.unix_nanos)?;
    // The /etc files are bind mounts of these tmpfs files (see boot::IDENTITY_FILES).
    let [(_, hostname_file), (_, machine_id_file)] = crate::boot::IDENTITY_FILES;
    if !r.hostname.is_empty() {
        nix::unistd::sethostname(&r.hostname).map_err(io::Error::from)?;
        fs::write(hostname_file, format!("{}\n", r.hostname))?;
    }
    // No machine id: the same machine resumed, which keeps its machine id and boot id.
    if !r.machine_id.is_empty() {
        fs::write(machine_id_file, format!("{}\n", r.machine_id))?;
        new_boot_id()?;
    }
    if r.grow_root_to > 0 {
        grow_root(r.grow_root_to)?;
    }
    if r.max_procs > 0 {
        fs::write(
            format!("{}/pids.max", crate::boot::COMMANDS_CGROUP),
            r.max_procs.to_string(),
        )?;
    }
    Ok(())
}

/// A boot id of the copy's own, drawn from the reseeded RNG.
fn new_boot_id() -> io::Result<()> {
    let mut b = [0u8; 16];
    io::Read::read_exact(&mut fs::File::open("/dev/urandom")?, &mut b)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    fs::write(
        crate::boot::BOOT_ID_FILE,
        format!(
            "{}-{}-{}-{}-{}\n",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        ),
    )
}

/// Credits `entropy` to the input pool, then forces the CRNG to reseed from it, so that
/// `/dev/urandom` and `getrandom()` diverge from every other copy at once.
fn reseed(entropy: &[u8]) -> io::Result<()> {
    if entropy.len() < 32 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "at least 32 bytes of entropy are needed to reseed",
        ));
    }
    let rnd = OpenOptions::new().write(true).open("/dev/urandom")?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let words = entropy.len().div_ceil(4);
    let mut info: Vec<u32> = vec![0; 2 + words];
    info[0] = (entropy.len() * 8) as u32;
    info[1] = entropy.len() as u32;
    for (i, chunk) in entropy.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        info[2 + i] = u32::from_ne_bytes(w);
    }
    // SAFETY: `info` is a live, properly aligned buffer laid out as `struct rand_pool_info`
    // with `buf_size` bytes of payload after the two ints; the kernel only reads it.
    if unsafe { libc::ioctl(rnd.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(rnd.as_raw_fd(), RNDRESEEDCRNG, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `EXT4_IOC_RESIZE_FS`: `_IOW('f', 16, __u64)`.
const EXT4_IOC_RESIZE_FS: libc::c_ulong = 0x4008_6610;

/// Grows the (mounted) root ext4 filesystem to `bytes`, once the kernel has seen the disk grow
/// (the host resizes it and the device announces the change asynchronously).
fn grow_root(bytes: u64) -> io::Result<()> {
    let started = std::time::Instant::now();
    loop {
        let sectors: u64 = fs::read_to_string("/sys/block/vda/size")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if sectors * 512 >= bytes {
            break;
        }
        if started.elapsed() > std::time::Duration::from_secs(10) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the root disk is {} bytes, not the {bytes} the host announced",
                    sectors * 512
                ),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let root = fs::File::open("/")?;
    let st = nix::sys::statfs::fstatfs(&root).map_err(io::Error::from)?;
    let blocks: u64 = bytes / st.block_size() as u64;
    // SAFETY: the ioctl reads one u64 (the new block count) from a live local.
    if unsafe { libc::ioctl(root.as_raw_fd(), EXT4_IOC_RESIZE_FS, &blocks as *const u64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_clock(secs: u64, nanos: u32) -> io::Result<()> {
    let ts = nix::sys::time::TimeSpec::new(secs as libc::time_t, nanos as libc::c_long);
    nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, ts).map_err(io::Error::from)
}
