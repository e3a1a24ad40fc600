//! The descriptors a forkbox process holds and hands on.
//!
//! Whatever started forkbox may have left descriptors open without close-on-exec (a shell's
//! `exec 7</`, a supervisor's sockets). Passed on, they would reach every QEMU, outside its
//! chroot and mount namespace. So every forkbox process marks what it inherited close-on-exec
//! before it does anything else ([`seal_inherited`]); the daemon closes it outright; and each
//! jailed QEMU marks every descriptor above standard error close-on-exec once more between fork
//! and exec ([`crate::vm::jail`]), so a process that uses the engine as a library cannot leak
//! its own either.

use std::path::PathBuf;

/// `close_range(2)`'s flag: mark close-on-exec instead of closing.
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// The descriptors this process has open above standard error.
fn open_above_stderr() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect()
}

/// Marks every descriptor above standard error close-on-exec, so no child ever receives one
/// it was not given on purpose. Call it first in `main`. Returns how many were open.
pub fn seal_inherited() -> usize {
    let open = open_above_stderr();
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; it closes
    // none, so no descriptor owned by any part of this process becomes invalid.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if r != 0 {
        // Kernels before 5.11: one by one.
        for fd in &open {
            let _ = nix::fcntl::fcntl(*fd, nix::fcntl::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC));
        }
    }
    open.len()
}

/// Closes every descriptor above standard error. Only for the very start of a process (the
/// daemon's `main`), before it opens anything of its own: then every such descriptor is an
/// inherited one that nothing in this process owns. Returns how many it closed.
pub fn close_inherited() -> usize {
    let open = open_above_stderr();
    for fd in &open {
        // `read_dir` above had its own descriptor, closed before this loop; closing a number
        // that is no longer open only fails with EBADF.
        let _ = nix::unistd::close(*fd);
    }
    open.len()
}

/// The descriptors of process `pid` above standard error, with what each points to (for
/// `forkbox doctor` and the tests).
pub fn of_process(pid: u32) -> Vec<(i32, PathBuf)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut fds: Vec<(i32, PathBuf)> = dir
        .filter_map(|e| {
            let e = e.ok()?;
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            (fd > 2).then_some((fd, target))
        })
        .collect();
    fds.sort();
    fds
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn sealed_descriptors_do_not_reach_a_child() {
        // A descriptor without close-on-exec, as an inherited one would be.
        let f = std::fs::File::open("/").unwrap();
        let fd = f.as_raw_fd();
        nix::fcntl::fcntl(fd, nix::fcntl::F_SETFD(nix::fcntl::FdFlag::empty())).unwrap();
        let seen = |fd: i32| {
            std::process::Command::new("sh")
                .args(["-c", &format!("test -e /proc/self/fd/{fd}")])
                .status()
                .unwrap()
                .success()
        };
        assert!(
            seen(fd),
            "the test's descriptor should reach a child before sealing"
        );
        assert!(seal_inherited() >= 1);
        assert!(!seen(fd), "a sealed descriptor reached a child");
        drop(f);
    }
}
