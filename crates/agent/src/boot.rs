//! Guest start-up: from the initramfs to the sandbox's root disk.

use std::ffi::CString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{mount, MsFlags};

/// Where the initramfs keeps the modules to load, named so that sorting gives load order.
const MODULE_DIR: &str = "/forkbox/modules";
const NEW_ROOT: &str = "/newroot";

pub fn uptime_ms() -> u64 {
    fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|f| f.parse::<f64>().ok())
        })
        .map(|s| (s * 1000.0) as u64)
        .unwrap_or(0)
}

fn ctx(what: impl Into<String>) -> impl FnOnce(nix::Error) -> io::Error {
    let what = what.into();
    move |e| io::Error::other(format!("{what}: {e}"))
}

fn mount_fs(
    src: &str,
    target: &str,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> io::Result<()> {
    fs::create_dir_all(target)?;
    mount(Some(src), target, Some(fstype), flags, data)
        .map_err(ctx(format!("mount {fstype} on {target}")))
}

/// Boots the guest and returns the path of the host channel.
pub fn boot() -> io::Result<PathBuf> {
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount_fs("proc", "/proc", "proc", nosuid, None)?;
    // Only readable once /proc is mounted.
    let cmdline = fs::read_to_string("/proc/cmdline")?;
    mount_fs("sysfs", "/sys", "sysfs", nosuid, None)?;
    mount_fs(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )?;

    if cmdline.split_whitespace().any(|w| w == "forkbox.probe=1") {
        // The host checks whether this machine's accelerator can run a standard guest at all.
        println!("FORKBOX-PROBE-OK");
        power_off();
    }

    load_modules()?;
    let root = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("forkbox.root="))
        .unwrap_or("/dev/vda");
    wait_for(Path::new(root), Duration::from_secs(20))?;
    fs::create_dir_all(NEW_ROOT)?;
    mount(
        Some(root),
        NEW_ROOT,
        Some("ext4"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(ctx(format!("mount root disk {root}")))?;
    switch_root()?;

    mount_fs(
        "tmpfs",
        "/tmp",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )?;
    mount_fs(
        "tmpfs",
        "/run",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )?;
    mount_fs(
        "devpts",
        "/dev/pts",
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("gid=5,mode=620,ptmxmode=666"),
    )?;
    mount_fs(
        "tmpfs",
        "/dev/shm",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )?;
    // Per-command cgroups let a timeout kill every process a command started, even those
    // that left its process group. Without cgroup2 the agent falls back to process groups.
    match mount_fs("cgroup2", "/sys/fs/cgroup", "cgroup2", nosuid, None) {
        Ok(()) => {
            let max = cmdline
                .split_whitespace()
                .find_map(|w| w.strip_prefix("forkbox.max_procs="));
            if let Err(e) = commands_cgroup(max) {
                eprintln!("forkbox-agent: cannot set up the commands' cgroup: {e}");
            }
        }
        Err(e) => eprintln!("forkbox-agent: {e}; timeouts will kill process groups only"),
    }
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        let _ = std::os::unix::fs::symlink(target, link);
    }
    let _ = nix::unistd::sethostname("forkbox");
    quiet_when_idle();
    identity_files();
    if let Err(e) = loopback_up() {
        eprintln!("forkbox-agent: could not bring up lo: {e}");
    }
    find_port(Duration::from_secs(20))
}

/// Fewer wake-ups of an idle guest (under emulation each one costs host CPU; measured with
/// the kernel's timer trace, these were most of an idle guest's): the compaction thread
/// otherwise checks every 500 ms whether to compact ahead of need, and the per-CPU memory
/// statistics are folded every second.
fn quiet_when_idle() {
    for (knob, value) in [
        ("/proc/sys/vm/compaction_proactiveness", "0"),
        ("/proc/sys/vm/stat_interval", "10"),
    ] {
        if let Err(e) = fs::write(knob, value) {
            eprintln!("forkbox-agent: {knob}: {e}");
        }
    }
}

/// `/etc/hostname` and `/etc/machine-id` are bind mounts of files in `/run` (tmpfs), so a copy
/// restored from a snapshot takes its new identity without writing to its disk (which costs
/// hundreds of milliseconds of cold code under TCG).
pub const IDENTITY_FILES: [(&str, &str); 2] = [
    ("/etc/hostname", "/run/forkbox-hostname"),
    ("/etc/machine-id", "/run/forkbox-machine-id"),
];

/// The kernel's boot id is fixed at boot, so every copy of a snapshot would report its
/// template's: `/proc/sys/kernel/random/boot_id` is a bind mount of this file, which
/// [`crate::refresh`] gives a new id in each copy.
pub const BOOT_ID_FILE: &str = "/run/forkbox-boot-id";
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

fn identity_files() {
    let r = fs::read_to_string(BOOT_ID)
        .and_then(|id| fs::write(BOOT_ID_FILE, id))
        .and_then(|()| {
            mount(
                Some(BOOT_ID_FILE),
                BOOT_ID,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(io::Error::from)
        });
    if let Err(e) = r {
        eprintln!("forkbox-agent: cannot bind {BOOT_ID_FILE} over {BOOT_ID}: {e}");
    }
    for (etc, run) in IDENTITY_FILES {
        let initial = if etc.ends_with("hostname") {
            "forkbox\n"
        } else {
            ""
        };
        let r = fs::write(run, initial)
            .and_then(|()| {
                if !Path::new(etc).exists() {
                    fs::write(etc, "")?;
                }
                Ok(())
            })
            .and_then(|()| {
                mount(Some(run), etc, None::<&str>, MsFlags::MS_BIND, None::<&str>)
                    .map_err(io::Error::from)
            });
        if let Err(e) = r {
            eprintln!("forkbox-agent: cannot bind {run} over {etc}: {e}");
        }
    }
}

/// Every command runs in a cgroup under `/sys/fs/cgroup/commands`, whose `pids.max` caps the
/// processes all commands together may have (a fork bomb stops there; the agent, outside it,
/// keeps answering).
pub const COMMANDS_CGROUP: &str = "/sys/fs/cgroup/commands";

fn commands_cgroup(max_procs: Option<&str>) -> io::Result<()> {
    fs::create_dir_all(COMMANDS_CGROUP)?;
    if let Some(max) = max_procs {
        fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+pids")?;
        fs::write(format!("{COMMANDS_CGROUP}/pids.max"), max)?;
    }
    Ok(())
}

fn load_modules() -> io::Result<()> {
    let mut names: Vec<PathBuf> = match fs::read_dir(MODULE_DIR) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    names.sort();
    for path in names {
        let file = fs::File::open(&path)?;
        let empty = CString::default();
        match nix::kmod::finit_module(&file, &empty, nix::kmod::ModuleInitFlags::empty()) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => {
                return Err(io::Error::other(format!(
                    "load module {}: {e}",
                    path.display()
                )))
            }
        }
        // The module's bytes are no longer needed; free the initramfs memory they hold.
        let _ = fs::remove_file(&path);
    }
    Ok(())
}

fn wait_for(path: &Path, limit: Duration) -> io::Result<()> {
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() > limit {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} did not appear within {limit:?}", path.display()),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Moves the kernel filesystems into the new root and makes it `/`, as switch_root(8) does.
fn switch_root() -> io::Result<()> {
    for m in ["/dev", "/proc", "/sys"] {
        let target = format!("{NEW_ROOT}{m}");
        fs::create_dir_all(&target)?;
        mount(
            Some(m),
            target.as_str(),
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        )
        .map_err(ctx(format!("move {m}")))?;
    }
    let _ = fs::remove_file("/init");
    std::env::set_current_dir(NEW_ROOT)?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(ctx("move new root to /"))?;
    nix::unistd::chroot(".").map_err(ctx("chroot"))?;
    std::env::set_current_dir("/")?;
    Ok(())
}

fn loopback_up() -> io::Result<()> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo\0".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is a socket we own and `req` is a valid ifreq living across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Finds the virtio-serial port named for the agent.
fn find_port(limit: Duration) -> io::Result<PathBuf> {
    let start = Instant::now();
    loop {
        if let Ok(rd) = fs::read_dir("/sys/class/virtio-ports") {
            for e in rd.flatten() {
                let name = fs::read_to_string(e.path().join("name")).unwrap_or_default();
                if name.trim() == forkbox_protocol::PORT_NAME {
                    let dev = Path::new("/dev").join(e.file_name());
                    wait_for(&dev, Duration::from_secs(5))?;
                    return Ok(dev);
                }
            }
        }
        if start.elapsed() > limit {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no virtio port named {}", forkbox_protocol::PORT_NAME),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn power_off() -> ! {
    nix::unistd::sync();
    let _ = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_POWER_OFF);
    // PID 1 must not exit; if power-off failed there is nothing better to do than wait.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
