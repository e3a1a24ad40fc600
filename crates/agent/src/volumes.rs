//! Volumes: disks in the VM's volume slots, mounted where the host says. Each slot is a
//! virtio disk with the serial `fbvolN`; it held a placeholder (zeros) when the guest booted,
//! and may have held another volume before, so its cached blocks are dropped before a mount.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use forkbox_protocol::GuestMount;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// `BLKFLSBUF`: `_IO(0x12, 97)`: write back and drop a block device's cached blocks.
const BLKFLSBUF: libc::c_ulong = 0x1261;

/// Mounts each volume; on a failure, unmounts those this call mounted and says which failed.
pub fn mount_all(mounts: &[GuestMount]) -> io::Result<()> {
    let mut done: Vec<&str> = Vec::new();
    for m in mounts {
        if let Err(e) = mount_one(m) {
            for p in done.iter().rev() {
                let _ = umount2(*p, MntFlags::empty());
            }
            return Err(io::Error::new(
                e.kind(),
                format!("mount the volume in slot {} on {}: {e}", m.serial, m.path),
            ));
        }
        done.push(&m.path);
    }
    Ok(())
}

fn mount_one(m: &GuestMount) -> io::Result<()> {
    let dev = device_of(&m.serial)?;
    flush(&dev)?;
    fs::create_dir_all(&m.path)?;
    let mut flags = MsFlags::MS_NODEV | MsFlags::MS_NOSUID;
    if m.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    mount(
        Some(&dev),
        m.path.as_str(),
        Some("ext4"),
        flags,
        None::<&str>,
    )
    .map_err(io::Error::from)
}

/// Unmounts each path; refused, with none unmounted, while a process uses one (it says which).
pub fn unmount_all(paths: &[String]) -> io::Result<()> {
    // First check that none is busy: unmounting some and not others would leave a half state.
    for p in paths {
        if let Some(pids) = busy(Path::new(p)) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("{p} is in use by process(es) {pids}: stop them (or leave that directory) first"),
            ));
        }
    }
    for p in paths {
        let dev = mounted_device(p);
        umount2(p.as_str(), MntFlags::empty())
            .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("unmount {p}: {e}")))?;
        if let Some(dev) = dev {
            flush(&dev)?;
        }
    }
    Ok(())
}

/// The disk whose serial is `serial` (`/sys/block/vdX/serial`).
fn device_of(serial: &str) -> io::Result<PathBuf> {
    for e in fs::read_dir("/sys/block")?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.starts_with("vd") {
            continue;
        }
        if fs::read_to_string(e.path().join("serial")).is_ok_and(|s| s.trim() == serial) {
            return Ok(PathBuf::from(format!("/dev/{name}")));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no disk with serial {serial} (this guest has no volume slots: an older template?)"
        ),
    ))
}

fn flush(dev: &Path) -> io::Result<()> {
    let f = fs::File::open(dev)?;
    // SAFETY: BLKFLSBUF takes no argument and touches no user memory.
    if unsafe { libc::ioctl(f.as_raw_fd(), BLKFLSBUF, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The device mounted at `path`, from `/proc/self/mounts`.
fn mounted_device(path: &str) -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mounts").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let dev = f.next()?;
        (f.next()? == path).then(|| PathBuf::from(dev))
    })
}

/// The processes with a file, a working directory or a root under `dir`, if any.
fn busy(dir: &Path) -> Option<String> {
    let mut pids = Vec::new();
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Ok(pid) = name.parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let under = |p: PathBuf| p.starts_with(dir);
        let proc = e.path();
        let mut uses = ["cwd", "root"]
            .iter()
            .any(|l| fs::read_link(proc.join(l)).is_ok_and(under));
        if !uses {
            uses = fs::read_dir(proc.join("fd"))
                .map(|fds| {
                    fds.flatten()
                        .any(|fd| fs::read_link(fd.path()).is_ok_and(under))
                })
                .unwrap_or(false);
        }
        if uses {
            pids.push(pid.to_string());
        }
    }
    (!pids.is_empty()).then(|| pids.join(", "))
}
