//! QEMU's confinement, after Firecracker's jailer. Each QEMU starts, between fork and exec:
//!
//! - in new PID, mount, IPC, UTS and network namespaces (it needs no network: a sandbox has no
//!   network device, and its proxy's traffic goes through the agent channel, a Unix socket).
//!   QEMU is PID 1 of its namespace; the process forkbox started stays outside as its
//!   *holder*: it does nothing but wait for QEMU and exit with its status, and QEMU dies with it
//!   (parent-death signal), so killing either ends both; forkbox moves QEMU into its cgroups
//!   while it initialises ([`crate::limits`]);
//! - chrooted into a tmpfs (read-only once built) that holds only what this VM needs, each at
//!   its host path: `/usr` and the merged-usr links read-only, `/etc/ld.so.cache`, three
//!   device nodes (`null`, `urandom`, and `kvm` under KVM), the kernel and initramfs and the disk's
//!   backing chain read-only, and read-write its run directory (sockets), its own disk
//!   directory, and the directory of its RAM file. No `/proc`, no `/sys`, no other sandbox;
//! - as a user of its own (a random uid in a range no account uses) with the group
//!   `forkbox-vmm` (and `kvm` under KVM), without capabilities (`FORKBOX_JAIL_UID=off` keeps
//!   uid 0, for debugging);
//! - with `no_new_privs`, then QEMU's own seccomp filter (`-sandbox on,...`) and, from the
//!   host, its cgroup limits ([`crate::limits`]).
//!
//! A copy maps its snapshot's RAM file private. QEMU 8.2 and later open it read-only
//! (`readonly=on,rom=off`): the file is root's, only readable by `forkbox-vmm`, and bound
//! read-only into the jail, so a QEMU taken over from inside its guest cannot write the memory
//! its sibling copies map. QEMU before 8.2 opens it read-write (`readonly=on` would make the
//! guest's RAM a ROM): the file is then group-writable and its directory writable in the jail,
//! and such a QEMU could write the RAM file of the snapshot it was restored from (and so the
//! later copies of it); it sees no other. `forkbox doctor` says which holds.
//! `FORKBOX_JAIL=off` runs QEMU unconfined, as forkbox's own user (for debugging).

use std::ffi::CString;
use std::io::Error;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::VmError;

/// Uids given to QEMUs: `UID_BASE..UID_BASE + UID_RANGE`, far above any account's.
pub const UID_BASE: u32 = 2_000_000_000;
pub const UID_RANGE: u32 = 100_000_000;
/// The group of every jailed QEMU (may open snapshots' RAM files).
pub const GROUP: &str = "forkbox-vmm";

/// Whether QEMUs are confined (the default; `FORKBOX_JAIL=off` turns it off).
pub fn enabled() -> bool {
    std::env::var("FORKBOX_JAIL").map_or(true, |v| v != "off")
}

fn group_id(name: &str) -> Option<u32> {
    let text = std::fs::read_to_string("/etc/group").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then(|| f.nth(1)?.parse().ok())?
    })
}

/// The `forkbox-vmm` group's id, creating the group (a system group) the first time.
pub fn vmm_gid() -> Result<u32, VmError> {
    static GID: OnceLock<Result<u32, String>> = OnceLock::new();
    GID.get_or_init(|| {
        if let Some(g) = group_id(GROUP) {
            return Ok(g);
        }
        let out = std::process::Command::new("groupadd")
            .args(["--system", GROUP])
            .output()
            .map_err(|e| format!("groupadd: {e}"))?;
        // Another process may have made it meanwhile.
        group_id(GROUP).ok_or_else(|| {
            format!(
                "groupadd --system {GROUP} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    })
    .clone()
    .map_err(|detail| VmError::Jail { detail })
}

fn cstr(p: &Path) -> Result<CString, VmError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| VmError::Jail {
        detail: format!("{} has a NUL byte", p.display()),
    })
}

/// One step of building the jail, prepared before fork so the child only makes system calls.
enum Op {
    Dir(CString),
    File(CString),
    Link {
        target: CString,
        at: CString,
    },
    Bind {
        src: CString,
        dst: CString,
        ro: bool,
    },
}

/// A jail, ready to be entered by a child between fork and exec.
pub struct Jail {
    root: CString,
    ops: Vec<Op>,
    pub uid: u32,
    gid: u32,
    groups: Vec<libc::gid_t>,
    die_with_parent: bool,
}

/// What a VM needs inside its jail.
pub struct Needs<'a> {
    pub run_dir: &'a Path,
    /// Read-write: its own disk directory, its RAM file's directory.
    pub rw: Vec<PathBuf>,
    /// Read-only: kernel, initramfs, the disk's backing chain, a QEMU outside `/usr`.
    pub ro: Vec<PathBuf>,
    /// Read-only, bound after everything else (over a writable directory holding it): a RAM
    /// file QEMU maps private.
    pub ro_last: Option<PathBuf>,
    pub kvm: bool,
    pub die_with_parent: bool,
}

/// Whether QEMU drops to a uid of its own: yes unless `FORKBOX_JAIL_UID=off` (debugging).
pub fn own_uid() -> bool {
    !std::env::var("FORKBOX_JAIL_UID").is_ok_and(|v| v == "off" || v == "0")
}

fn random_uid() -> Result<u32, VmError> {
    let mut b = [0u8; 4];
    crate::random::fill(&mut b).map_err(|e| VmError::io("draw the jail's user id", e))?;
    Ok(UID_BASE + u32::from_le_bytes(b) % UID_RANGE)
}

impl Jail {
    pub fn new(n: &Needs<'_>) -> Result<Jail, VmError> {
        let root = n.run_dir.join("jail");
        std::fs::create_dir_all(&root).map_err(|e| VmError::io("create the jail's root", e))?;
        let gid = vmm_gid()?;
        let uid = if own_uid() { random_uid()? } else { 0 };
        let mut ops = Vec::new();
        let inside = |p: &Path| -> Result<CString, VmError> {
            cstr(&root.join(p.strip_prefix("/").unwrap_or(p)))
        };
        let dirs_for = |p: &Path, ops: &mut Vec<Op>| -> Result<(), VmError> {
            let mut acc = PathBuf::from("/");
            for c in p.parent().into_iter().flat_map(|d| d.components().skip(1)) {
                acc.push(c);
                ops.push(Op::Dir(inside(&acc)?));
            }
            Ok(())
        };
        let bind = |src: &Path, ro: bool, ops: &mut Vec<Op>| -> Result<(), VmError> {
            let meta = std::fs::symlink_metadata(src)
                .map_err(|e| VmError::io(format!("find {} for the jail", src.display()), e))?;
            dirs_for(src, ops)?;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(src)
                    .map_err(|e| VmError::io(format!("read link {}", src.display()), e))?;
                ops.push(Op::Link {
                    target: cstr(&target)?,
                    at: inside(src)?,
                });
                return Ok(());
            }
            ops.push(if meta.is_dir() {
                Op::Dir(inside(src)?)
            } else {
                Op::File(inside(src)?)
            });
            ops.push(Op::Bind {
                src: cstr(src)?,
                dst: inside(src)?,
                ro,
            });
            Ok(())
        };
        for sys in [
            "/usr",
            "/lib",
            "/lib64",
            "/bin",
            "/sbin",
            "/etc/ld.so.cache",
        ] {
            if std::fs::symlink_metadata(sys).is_ok() {
                bind(Path::new(sys), true, &mut ops)?;
            }
        }
        let mut devices = vec!["/dev/null", "/dev/urandom"];
        let mut groups = vec![gid];
        if n.kvm {
            devices.push("/dev/kvm");
            if let Ok(m) = std::fs::metadata("/dev/kvm") {
                groups.push(std::os::unix::fs::MetadataExt::gid(&m));
            }
        }
        for d in devices {
            bind(Path::new(d), false, &mut ops)?;
        }
        for p in &n.ro {
            bind(p, true, &mut ops)?;
        }
        for p in n.rw.iter().map(PathBuf::as_path).chain([n.run_dir]) {
            bind(p, false, &mut ops)?;
        }
        if let Some(p) = &n.ro_last {
            bind(p, true, &mut ops)?;
        }
        Ok(Jail {
            root: cstr(&root)?,
            ops,
            uid,
            gid,
            groups,
            die_with_parent: n.die_with_parent,
        })
    }

    /// Enters the jail: called in the child between fork and exec.
    ///
    /// Only for a freshly forked child: it changes the calling process's namespaces, root,
    /// mounts and credentials for good. It makes system calls only (no allocation).
    pub fn enter(&self) -> std::io::Result<()> {
        self.unshare_onto_tmpfs()?;
        for op in &self.ops {
            self.apply(op)?;
        }
        self.seal_and_chroot()?;
        self.drop_privileges()?;
        // QEMU must be a child to be PID 1 of the new namespace.
        // SAFETY: fork in a process that has only this thread (a freshly forked child); both
        // sides go on with system calls only.
        let qemu = unsafe { libc::fork() };
        if qemu < 0 {
            return Err(Error::last_os_error());
        }
        if qemu == 0 {
            return qemu_side();
        }
        hold(qemu)
    }

    /// New namespaces (mount, IPC, UTS, network, PID), nothing propagating back to the host,
    /// and the jail's root as a fresh small tmpfs.
    fn unshare_onto_tmpfs(&self) -> std::io::Result<()> {
        let none = std::ptr::null();
        // SAFETY: the pointers are NUL-terminated literals or `self.root`, owned by `self`,
        // valid for the whole call; these calls read them and write no memory of this process.
        unsafe {
            check(libc::unshare(
                libc::CLONE_NEWNS
                    | libc::CLONE_NEWIPC
                    | libc::CLONE_NEWUTS
                    | libc::CLONE_NEWNET
                    | libc::CLONE_NEWPID,
            ))?;
            check(libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"tmpfs".as_ptr(),
                self.root.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=0755,size=1m".as_ptr().cast(),
            ))
        }
    }

    /// One step of building the jail's tree.
    fn apply(&self, op: &Op) -> std::io::Result<()> {
        let none = std::ptr::null();
        // SAFETY: every pointer is a NUL-terminated string owned by `op` (so by `self`), valid
        // for the whole call; these calls read them and write no memory of this process.
        unsafe {
            match op {
                // A path may already exist (inside an earlier, read-only bind): that is fine.
                Op::Dir(p) => {
                    if libc::mkdir(p.as_ptr(), 0o755) != 0
                        && libc::access(p.as_ptr(), libc::F_OK) != 0
                    {
                        return Err(Error::last_os_error());
                    }
                }
                Op::File(p) => {
                    let fd = libc::open(
                        p.as_ptr(),
                        libc::O_CREAT | libc::O_RDONLY | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd < 0 {
                        return Err(Error::last_os_error());
                    }
                    libc::close(fd);
                }
                Op::Link { target, at } => {
                    if libc::symlink(target.as_ptr(), at.as_ptr()) != 0
                        && Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                    {
                        return Err(Error::last_os_error());
                    }
                }
                Op::Bind { src, dst, ro } => {
                    check(libc::mount(
                        src.as_ptr(),
                        dst.as_ptr(),
                        none,
                        libc::MS_BIND,
                        std::ptr::null(),
                    ))?;
                    let mut flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID;
                    if *ro {
                        flags |= libc::MS_RDONLY | libc::MS_NODEV;
                    }
                    check(libc::mount(
                        none,
                        dst.as_ptr(),
                        none,
                        flags,
                        std::ptr::null(),
                    ))?;
                }
            }
        }
        Ok(())
    }

    /// The jail's own skeleton read-only, and the process inside it as its root.
    fn seal_and_chroot(&self) -> std::io::Result<()> {
        let none = std::ptr::null();
        // SAFETY: the pointers are NUL-terminated literals or `self.root`, valid for the whole
        // call; these calls read them and write no memory of this process.
        unsafe {
            check(libc::mount(
                none,
                self.root.as_ptr(),
                none,
                libc::MS_REMOUNT
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV
                    | libc::MS_NOEXEC,
                std::ptr::null(),
            ))?;
            check(libc::chdir(self.root.as_ptr()))?;
            check(libc::chroot(c".".as_ptr()))?;
            check(libc::chdir(c"/".as_ptr()))
        }
    }

    /// The VM's own user and groups, no new privileges ever, and the parent-death signal
    /// (changing credentials cleared it) when the VM is to die with its starter.
    fn drop_privileges(&self) -> std::io::Result<()> {
        // SAFETY: the group list is owned by `self` and valid for the call, which only reads
        // it; the other calls take plain integers.
        unsafe {
            if self.uid != 0 {
                check(libc::setgroups(self.groups.len(), self.groups.as_ptr()))?;
                check(libc::setresgid(self.gid, self.gid, self.gid))?;
                check(libc::setresuid(self.uid, self.uid, self.uid))?;
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            if self.die_with_parent {
                check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))?;
            }
        }
        Ok(())
    }
}

/// A system call's result as an error from `errno` when it failed.
fn check(r: libc::c_int) -> std::io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(Error::last_os_error())
    }
}

/// QEMU's side of the jail's fork: it dies with its holder and keeps no descriptor but
/// standard input, output and error past its exec.
fn qemu_side() -> std::io::Result<()> {
    // SAFETY: system calls on integers only, in the child of a fork that has one thread.
    unsafe {
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))?;
        // Whatever this process held without close-on-exec (inherited by whoever started
        // forkbox, or opened by a program that uses the engine) closes at exec. What QEMU
        // creates (sockets, snapshot files) is no one else's.
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 1u32 << 2) != 0 {
            for fd in 3..4096 {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        libc::umask(0o007);
    }
    Ok(())
}

/// The holder: PID 1's parent in the jail, with no descriptors (among them the pipe through
/// which the starting process learns that exec happened), waiting for QEMU and exiting as it
/// did. Never returns.
fn hold(qemu: libc::pid_t) -> ! {
    // SAFETY: system calls on integers, a NUL-terminated literal and a local status word;
    // `_exit` ends this process without running anything of the parent's.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            for fd in 3..1024 {
                libc::close(fd);
            }
        }
        libc::prctl(libc::PR_SET_NAME, c"forkbox-holder".as_ptr());
        let mut status = 0;
        loop {
            let r = libc::waitpid(qemu, &mut status, 0);
            if r == qemu {
                break;
            }
            if r < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            128 + libc::WTERMSIG(status)
        };
        libc::_exit(code);
    }
}

/// Makes `path` (and, for a directory, what is directly in it) the jailed QEMU's.
pub fn give(path: &Path, uid: u32) -> Result<(), VmError> {
    let gid = vmm_gid()?;
    let own = |p: &Path| {
        std::os::unix::fs::lchown(p, Some(uid), Some(gid))
            .map_err(|e| VmError::io(format!("give {} to the VM's user", p.display()), e))
    };
    own(path)?;
    if path.is_dir() {
        for e in std::fs::read_dir(path).map_err(|e| VmError::io("list a VM directory", e))? {
            let e = e.map_err(|e| VmError::io("list a VM directory", e))?;
            if e.file_name() != "jail" {
                own(&e.path())?;
            }
        }
    }
    Ok(())
}

/// A file jailed processes use (QEMUs, [`super::confined`] checks): root's, readable by the
/// `forkbox-vmm` group and writable by it with `group_writes`; nobody else's. A RAM file copies
/// map private is group-writable only for a QEMU before 8.2, which opens it read-write.
pub fn share_file(path: &Path, group_writes: bool) -> Result<(), VmError> {
    use std::os::unix::fs::PermissionsExt;
    let gid = vmm_gid()?;
    let mode = if group_writes { 0o660 } else { 0o640 };
    std::os::unix::fs::chown(path, Some(0), Some(gid))
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
        .map_err(|e| VmError::io(format!("set the owner of {}", path.display()), e))
}

/// Gives a finished snapshot's files back to root (a jailed QEMU wrote them).
pub fn reclaim(dir: &Path) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(0), Some(0))?;
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        std::os::unix::fs::lchown(&p, Some(0), Some(0))?;
    }
    Ok(())
}

/// The files a qcow2 disk reads through its backing chain (not the disk itself), from the
/// qcow2 headers: each names its backing file at a fixed place. Ends at a raw file.
pub fn backing_chain(disk: &Path) -> Vec<PathBuf> {
    use std::io::{Read, Seek, SeekFrom};
    let mut chain = Vec::new();
    let mut cur = disk.to_path_buf();
    while chain.len() < 64 {
        let Ok(mut f) = std::fs::File::open(&cur) else {
            break;
        };
        let mut h = [0u8; 20];
        if f.read_exact(&mut h).is_err() || &h[..4] != b"QFI\xfb" {
            break;
        }
        let off = u64::from_be_bytes(h[8..16].try_into().unwrap_or_default());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap_or_default()) as usize;
        if off == 0 || len == 0 || len > 4096 {
            break;
        }
        let mut name = vec![0u8; len];
        if f.seek(SeekFrom::Start(off)).is_err() || f.read_exact(&mut name).is_err() {
            break;
        }
        let p = PathBuf::from(std::ffi::OsStr::from_bytes(&name));
        let p = if p.is_absolute() {
            p
        } else {
            cur.parent().unwrap_or(Path::new("/")).join(p)
        };
        chain.push(p.clone());
        cur = p;
    }
    chain
}
