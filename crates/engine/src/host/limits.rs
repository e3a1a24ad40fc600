//! Host-side limits on each QEMU process: memory, CPU and tasks, in a cgroup of its own
//! (`forkbox/<sandbox-id>`). These machines mount cgroup v1 controllers with an empty cgroup2
//! hierarchy beside them; where cgroup2 has the controllers (most current hosts) it is used
//! instead. A guest can then exhaust only its own allowance: a runaway QEMU (say, a TCG
//! translation cache that grows) is stopped by the kernel before it hurts the host or the
//! other sandboxes.

use std::fs;
use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";
/// QEMU's own needs besides guest RAM: the TCG translation cache (capped by `tb-size`),
/// device emulation, the page tables of the guest mapping.
pub const OVERHEAD_MIB: u64 = 512;
/// QEMU threads: vCPUs, I/O workers (up to 64), RCU, migration, monitor.
pub const MAX_TASKS: u32 = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub tasks: u32,
    /// CPU time per 100 ms period, in microseconds.
    pub cpu_quota_us: u64,
}

impl Limits {
    pub fn for_vm(cpus: u32, memory_mib: u32) -> Limits {
        Limits {
            memory_bytes: (memory_mib as u64 + OVERHEAD_MIB) << 20,
            tasks: MAX_TASKS,
            // The vCPUs plus half a core for QEMU's own threads.
            cpu_quota_us: cpus as u64 * 100_000 + 50_000,
        }
    }
}

/// Which cgroup interface this host offers for the controllers forkbox needs.
fn v2_has_controllers() -> bool {
    fs::read_to_string(Path::new(ROOT).join("cgroup.controllers"))
        .map(|c| {
            ["memory", "pids", "cpu"]
                .iter()
                .all(|w| c.split_whitespace().any(|x| x == *w))
        })
        .unwrap_or(false)
}

fn dirs(id: &str) -> Vec<PathBuf> {
    if v2_has_controllers() {
        vec![Path::new(ROOT).join("forkbox").join(id)]
    } else {
        ["memory", "pids", "cpu"]
            .iter()
            .map(|c| Path::new(ROOT).join(c).join("forkbox").join(id))
            .collect()
    }
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    fs::write(dir.join(file), value).map_err(|e| format!("{}/{file}: {e}", dir.display()))
}

/// Puts `pid` (all its threads) in the cgroup of sandbox `id` with `limits`. Returns a
/// description of what was applied, or why nothing could be.
pub fn apply(id: &str, pid: u32, limits: Limits) -> Result<String, String> {
    if v2_has_controllers() {
        let parent = Path::new(ROOT).join("forkbox");
        fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        let _ = write(
            Path::new(ROOT),
            "cgroup.subtree_control",
            "+memory +pids +cpu",
        );
        write(&parent, "cgroup.subtree_control", "+memory +pids +cpu")?;
        let dir = parent.join(id);
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        write(&dir, "memory.max", &limits.memory_bytes.to_string())?;
        write(&dir, "pids.max", &limits.tasks.to_string())?;
        write(&dir, "cpu.max", &format!("{} 100000", limits.cpu_quota_us))?;
        write(&dir, "cgroup.procs", &pid.to_string())?;
        return Ok("cgroup v2 (memory, pids, cpu)".into());
    }
    for dir in dirs(id) {
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let ctrl = dir
            .parent()
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match ctrl.as_str() {
            "memory" => write(
                &dir,
                "memory.limit_in_bytes",
                &limits.memory_bytes.to_string(),
            )?,
            "pids" => write(&dir, "pids.max", &limits.tasks.to_string())?,
            "cpu" => {
                write(&dir, "cpu.cfs_period_us", "100000")?;
                write(&dir, "cpu.cfs_quota_us", &limits.cpu_quota_us.to_string())?;
            }
            _ => {}
        }
        write(&dir, "cgroup.procs", &pid.to_string())?;
    }
    Ok("cgroup v1 (memory, pids, cpu)".into())
}

/// Removes the (now empty) cgroups of sandbox `id`; false while one still holds a process.
pub fn remove(id: &str) -> bool {
    dirs(id)
        .into_iter()
        .all(|dir| fs::remove_dir(&dir).is_ok() || !dir.exists())
}

/// Removes the cgroups of sandbox `id` once its QEMU is gone: a killed process leaves its
/// cgroup a moment after its parent saw it exit, so this tries again for up to a second.
pub async fn remove_when_empty(id: &str) {
    for _ in 0..40 {
        if remove(id) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    tracing::warn!("{id}: its cgroups still hold a process; the next sweep removes them");
}

/// Removes the empty cgroups of sandboxes that are gone; returns their names.
pub fn sweep() -> Vec<String> {
    let mut removed = Vec::new();
    let parents: Vec<PathBuf> = if v2_has_controllers() {
        vec![Path::new(ROOT).join("forkbox")]
    } else {
        ["memory", "pids", "cpu"]
            .iter()
            .map(|c| Path::new(ROOT).join(c).join("forkbox"))
            .collect()
    };
    for p in parents {
        for e in fs::read_dir(p).into_iter().flatten().flatten() {
            // rmdir fails on a cgroup that still has processes: those are left alone.
            if fs::remove_dir(e.path()).is_ok() {
                removed.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    removed.sort();
    removed.dedup();
    removed
}

/// The cgroup paths a process is in, one line per hierarchy (from /proc/PID/cgroup).
pub fn of_process(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
}

/// Raises this process's soft limit on open files to its hard limit: every tunnel of a
/// sandbox's network is a descriptor (up to [`crate::net::MAX_TUNNELS`] per sandbox), and the
/// usual soft limit of 1024 would cap a few sandboxes running `npm ci` together. Returns the
/// limit in force.
pub fn raise_open_files() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(_) => soft,
        },
        Ok((soft, _)) => soft,
        Err(_) => 0,
    }
}
