//! Snapshots and templates: a VM saved as a RAM file, its device state and a frozen disk, from
//! which copies start in milliseconds.
//!
//! ```text
//! <dir>/mem            guest RAM, byte for byte (sparse: pages never touched are holes)
//! <dir>/vmstate        device state only (QEMU migration stream with `x-ignore-shared`)
//! <dir>/disk.qcow2     the disk as it was at that instant; never written again
//! <dir>/snapshot.json  what it is and what it needs (image, sizes, kernel, agent, QEMU)
//! ```
//!
//! A copy maps `mem` privately (`share=off`): it reads the snapshot's pages from the page cache,
//! shared with every other copy, and owns only the pages it writes. Its disk is a new qcow2
//! overlay on `disk.qcow2`. Device state is loaded with `-incoming defer` and a file passed
//! over QMP, which works under QEMU's strictest seccomp setting.
//!
//! *Templates* are snapshots made right after an image's first boot, one per (image, vCPUs,
//! memory, agent+kernel, QEMU, accelerator): `create` restores one instead of booting.
//!
//! Saving a *running* sandbox: its RAM is a private mapping of a file (its template's or
//! snapshot's `mem`), so its memory is that file plus the pages it has written since
//! ([`crate::ram`]). The save copies the file (its data only, in the kernel) and, at the same
//! time, the written pages into a shared mapping of the new file while the sandbox runs; then
//! it pauses it, writes its device state (`xen-save-devices-state`: no RAM), switches its disk
//! to a new overlay (the old one freezes and becomes the snapshot's disk), copies the written
//! pages once more (the first pass made their room and mapped it, so this is a plain memory
//! copy, on two threads) and lets it run. A fork's snapshot keeps its RAM file in memory when
//! the host has room ([`crate::fastram`]). The pause grows with the
//! pages the sandbox wrote, never with its RAM size, and each generation of forks starts from
//! its own file, so a fork of a fork costs what the last one changed.

// Saved state: RAM files (kept in memory when there is room), records of live VM processes,
// the daemon's catalogue.
pub mod chunks;
pub mod clock;
pub mod fastram;
pub mod ram;
pub mod retire;
pub mod runstate;
pub mod state;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::{SandboxError, VmError};
use crate::paths::{write_atomic, Paths};
use crate::vm::qmp::Qmp;
use crate::vm::{ram_tail_kib, AccelDecision, Memory, Start, Vm, VmConfig};

pub use forkbox_api::{SnapshotKind, SnapshotMeta, StateFormat, HIBERNATION};

pub const MEM: &str = "mem";
pub const VMSTATE: &str = "vmstate";
pub const DISK: &str = "disk.qcow2";
pub const META: &str = "snapshot.json";

/// A snapshot on disk.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub meta: SnapshotMeta,
}

impl Snapshot {
    pub fn load(dir: &Path) -> Option<Snapshot> {
        let meta = serde_json::from_slice(&std::fs::read(dir.join(META)).ok()?).ok()?;
        Some(Snapshot {
            dir: dir.to_path_buf(),
            meta,
        })
    }
    pub fn mem(&self) -> PathBuf {
        self.dir.join(MEM)
    }
    pub fn vmstate(&self) -> PathBuf {
        self.dir.join(VMSTATE)
    }
    pub fn disk(&self) -> PathBuf {
        self.meta
            .disk
            .clone()
            .unwrap_or_else(|| self.dir.join(DISK))
    }

    /// Refuses, in words, a snapshot this forkbox cannot restore: device state is only
    /// loadable by the QEMU that wrote it, and the guest runs the agent it was saved with.
    pub fn check_restorable(&self) -> Result<(), SnapshotError> {
        let ours = qemu_version();
        if self.meta.qemu_version != ours {
            return Err(SnapshotError::Incompatible {
                name: self.meta.name.clone(),
                why: format!(
                    "it was saved by {} and this host runs {ours}",
                    self.meta.qemu_version
                ),
            });
        }
        let tail = ram_tail_kib(self.meta.accel.accel);
        if self.meta.ram_tail_kib != tail {
            return Err(SnapshotError::Incompatible {
                name: self.meta.name.clone(),
                why: format!(
                    "its guest has {} KiB of RAM past {} MiB and this forkbox gives {tail} KiB \
                     (snapshots saved under TCG before this layout could miss pages); save it again",
                    self.meta.ram_tail_kib, self.meta.memory_mib
                ),
            });
        }
        // Not the kernel: a restored guest runs the kernel in its RAM and QEMU is not given
        // the file (a template made in a home whose kernel is gone still restores).
        for f in [self.mem(), self.vmstate(), self.disk()] {
            if !f.exists() {
                return Err(SnapshotError::Incompatible {
                    name: self.meta.name.clone(),
                    why: format!("{} is missing", f.display()),
                });
            }
        }
        // Nor a disk whose backing chain lost a file (a template removed under it).
        if let Some(gone) = crate::vm::jail::backing_chain(&self.disk())
            .into_iter()
            .find(|p| !p.exists())
        {
            return Err(SnapshotError::Incompatible {
                name: self.meta.name.clone(),
                why: format!(
                    "its disk stands on {}, which is gone; save the snapshot again",
                    gone.display()
                ),
            });
        }
        Ok(())
    }

    /// Refuses, in words, a snapshot this host cannot run: one saved under KVM where KVM does
    /// not work, or with a CPU this host's falls short of (another node's generation).
    pub fn check_host(&self, paths: &Paths) -> Result<(), SnapshotError> {
        if self.meta.accel.accel != crate::vm::Accel::Kvm {
            return Ok(());
        }
        let why = crate::vm::kvm_refused(paths)
            .map(|reason| {
                format!(
                    "it was saved under KVM and this host runs guests under TCG ({reason}); restore it on a KVM host"
                )
            })
            .or_else(|| self.meta.cpu.as_ref().and_then(crate::vm::cpu::unfit));
        match why {
            Some(why) => Err(SnapshotError::Incompatible {
                name: self.meta.name.clone(),
                why,
            }),
            None => Ok(()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("no snapshot {0}")]
    NotFound(String),
    #[error("a snapshot named {0} exists already")]
    Exists(String),
    #[error("snapshot name {0:?} is not valid: use 1-63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit")]
    BadName(String),
    #[error("snapshot {name} cannot be deleted while {users} depend on it; delete those first")]
    InUse { name: String, users: String },
    #[error("snapshot {name} cannot be restored: {why}")]
    Incompatible { name: String, why: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let what = what.into();
    move |source| SnapshotError::Io { what, source }
}

pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
}

/// The QEMU in use, as it names itself (`QEMU emulator version 10.0.2 ...`), asked once.
pub fn qemu_version() -> String {
    crate::vm::program::banner()
}

/// Named snapshots under `snapshots/`.
pub struct SnapshotStore {
    root: PathBuf,
}

impl SnapshotStore {
    pub fn new(paths: &Paths) -> SnapshotStore {
        SnapshotStore {
            root: paths.snapshots(),
        }
    }

    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn get(&self, name: &str) -> Result<Snapshot, SnapshotError> {
        if !valid_name(name) {
            return Err(SnapshotError::BadName(name.into()));
        }
        Snapshot::load(&self.dir(name)).ok_or_else(|| SnapshotError::NotFound(name.into()))
    }

    pub fn list(&self) -> Vec<Snapshot> {
        let mut all: Vec<Snapshot> = std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| Snapshot::load(&e.path()))
            .collect();
        all.sort_by(|a, b| {
            (a.meta.created_unix, &a.meta.name).cmp(&(b.meta.created_unix, &b.meta.name))
        });
        all
    }

    /// Deletes a snapshot unless a live sandbox (`users`: ids of sandboxes restored from it)
    /// or another snapshot depends on it.
    pub fn remove(&self, name: &str, users: &[String]) -> Result<(), SnapshotError> {
        let snap = self.get(name)?;
        let mut deps: Vec<String> = users.iter().map(|u| format!("sandbox {u}")).collect();
        for s in self.list() {
            if s.meta.parent.as_deref() == Some(name) {
                deps.push(format!("snapshot {}", s.meta.name));
            }
        }
        if !deps.is_empty() {
            return Err(SnapshotError::InUse {
                name: name.into(),
                users: deps.join(", "),
            });
        }
        // Renamed away first, so a crash halfway leaves no half-snapshot under a real name.
        let doomed = self
            .root
            .join(format!(".deleting-{name}-{}", std::process::id()));
        std::fs::rename(&snap.dir, &doomed).map_err(io(format!("delete snapshot {name}")))?;
        crate::fastram::remove_snapshot_dir(&doomed)
            .map_err(io(format!("delete snapshot {name}")))?;
        if let Some(home) = self.root.parent() {
            release_disk_dirs(home, snap.meta.disk_dirs.clone());
        }
        Ok(())
    }

    /// Removes what an interrupted save or delete left behind.
    pub fn sweep(&self) -> Vec<PathBuf> {
        SnapshotStore::sweep_dir(&self.root)
    }

    /// Removes `.tmp-*` and `.deleting-*` entries of processes that are gone from `root`;
    /// returns what it removed.
    pub fn sweep_dir(root: &Path) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if let Some(rest) = n.strip_prefix(".tmp-").or(n.strip_prefix(".deleting-")) {
                if !maker_alive(rest) {
                    crate::runstate::kill_qemus_of(&e.path());
                    if crate::fastram::remove_snapshot_dir(&e.path()).is_ok() {
                        removed.push(e.path());
                    }
                }
            }
        }
        removed
    }
}

/// Whether the process that named a leftover `NAME-PID` (what follows `.tmp-` or
/// `.deleting-`) still runs.
pub(crate) fn maker_alive(rest: &str) -> bool {
    rest.rsplit('-')
        .next()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| Path::new(&format!("/proc/{p}")).exists())
}

/// Rewrites a snapshot's metadata (for the hibernation record, which comes and goes).
pub fn rewrite_meta(snap: &Snapshot) -> Result<(), SnapshotError> {
    let json = serde_json::to_vec_pretty(&snap.meta).map_err(|e| SnapshotError::Io {
        what: "encode snapshot.json".into(),
        source: std::io::Error::other(e),
    })?;
    write_atomic(&snap.dir.join(META), &json).map_err(io("write snapshot.json"))
}

/// The first `disk.qcow2`, `disk-1.qcow2`, ... that does not exist in `dir`.
pub fn next_disk(dir: &Path) -> PathBuf {
    let first = dir.join("disk.qcow2");
    if !first.exists() {
        return first;
    }
    (1..)
        .map(|n| dir.join(format!("disk-{n}.qcow2")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}

/// A short, unique name for a directory a save is assembled in (`.tmp-RANDOM-PID`, which
/// the sweep recognises); short because QEMU's sockets go in it.
pub fn tmp_name() -> std::io::Result<String> {
    Ok(format!(
        ".tmp-{}-{}",
        crate::random::hex(3)?,
        std::process::id()
    ))
}

/// Removes `disks/<id>/` once sandbox `id` is gone and no snapshot's disk chain goes
/// through it.
pub fn release_disk_dir(home: &Path, id: &str) {
    release_disk_dirs(home, [id.to_string()]);
}

/// [`release_disk_dir`] for several ids, reading the snapshots' metadata once.
pub fn release_disk_dirs(home: &Path, ids: impl IntoIterator<Item = String>) {
    let gone: Vec<String> = ids
        .into_iter()
        .filter(|id| !id.is_empty() && !id.contains('/') && !home.join("run").join(id).exists())
        .collect();
    if gone.is_empty() {
        return;
    }
    let needed: std::collections::BTreeSet<String> = std::fs::read_dir(home.join("snapshots"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Snapshot::load(&e.path()))
        .flat_map(|s| s.meta.disk_dirs)
        .collect();
    for id in gone.iter().filter(|id| !needed.contains(*id)) {
        crate::tree::discard_tree(&home.join("disks").join(id));
    }
}

/// Bytes a file occupies on disk.
pub fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What a VM restored from `snap` runs with, in `run_dir`, on the overlay `disk`.
pub fn restore_config(
    snap: &Snapshot,
    run_dir: &Path,
    disk: PathBuf,
    die_with_parent: bool,
) -> VmConfig {
    VmConfig {
        accel: snap.meta.accel.accel,
        cpus: snap.meta.cpus,
        memory_mib: snap.meta.memory_mib,
        kernel: snap.meta.kernel.clone(),
        initramfs: snap.meta.initramfs.clone(),
        disk,
        run_dir: run_dir.to_path_buf(),
        die_with_parent,
        max_procs: snap.meta.max_procs,
        memory: Memory::PrivateFile(crate::fastram::resolve(&snap.mem())),
        start: match snap.meta.state {
            StateFormat::Migration => Start::Incoming,
            StateFormat::Devices => Start::Devices,
        },
        volumes: Vec::new(),
    }
}

/// The size a disk image presents to the guest: a qcow2's virtual size, a raw file's length.
pub fn virtual_size(path: &Path) -> std::io::Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut head = [0u8; 32];
    let n = f.read(&mut head)?;
    if n == 32 && head[..4] == *b"QFI\xfb" {
        let mut size = [0u8; 8];
        size.copy_from_slice(&head[24..32]);
        return Ok(u64::from_be_bytes(size));
    }
    Ok(f.metadata()?.len())
}

/// Loads `vmstate` into a QEMU started with `-incoming defer` for it (see [`restore_config`])
/// and lets it run; with `grow_to`, the root disk is then grown to that many bytes (the guest
/// is told of the new size); with `slept`, the guest's clocks move on by that much first
/// ([`clock`]). `within`: how long QEMU may take to open its control socket (a QEMU that exits
/// meanwhile is the caller's to notice).
pub fn load_state(
    qmp_socket: &Path,
    vmstate: &Path,
    grow_to: Option<u64>,
    slept: Option<clock::Slept>,
    within: Duration,
) -> Result<(), VmError> {
    let mut q = Qmp::connect(qmp_socket, within)?;
    q.set_capabilities(&[("x-ignore-shared", true)])?;
    let f = match slept {
        Some(slept) => clock::state_file(vmstate, slept)?,
        None => {
            std::fs::File::open(vmstate).map_err(|e| VmError::io("open the device state", e))?
        }
    };
    q.pass_fd("state", std::os::fd::AsFd::as_fd(&f))?;
    drop(f);
    q.execute("migrate-incoming", json!({"uri": "fd:state"}))?;
    q.wait_migration(&["completed"], Duration::from_secs(60))?;
    // The source was paused when saved, so the copy stays paused until told.
    let started = Instant::now();
    loop {
        match q.status()?.as_str() {
            "paused" | "postmigrate" => break,
            "running" => return Ok(()),
            _ if started.elapsed() > Duration::from_secs(10) => {
                return Err(VmError::Qmp {
                    command: "migrate-incoming".into(),
                    message: "the VM did not settle after loading its state".into(),
                })
            }
            _ => std::thread::sleep(Duration::from_micros(200)),
        }
    }
    q.execute("cont", json!({}))?;
    if let Some(bytes) = grow_to {
        q.execute("block_resize", json!({"device": "root", "size": bytes}))?;
    }
    Ok(())
}

/// Saves a VM that runs with its RAM in a shared file: pause it, write its device state
/// (RAM skipped), and leave it paused. Used for templates (the VM is then shut down).
pub fn save_shared(qmp_socket: &Path, vmstate: &Path) -> Result<(), VmError> {
    let mut q = Qmp::connect(qmp_socket, Duration::from_secs(10))?;
    q.execute("stop", json!({}))?;
    q.set_capabilities(&[("x-ignore-shared", true)])?;
    let f =
        std::fs::File::create(vmstate).map_err(|e| VmError::io("create the device state", e))?;
    q.pass_fd("state", std::os::fd::AsFd::as_fd(&f))?;
    q.execute("migrate", json!({"uri": "fd:state"}))?;
    q.wait_migration(&["completed"], Duration::from_secs(60))?;
    f.sync_all()
        .map_err(|e| VmError::io("sync the device state", e))?;
    let _ = q.execute("quit", json!({}));
    Ok(())
}

/// What saving a running VM measured, and what it wrote on top of the RAM file it started from.
#[derive(Debug, Clone)]
pub struct SaveTiming {
    /// From the VM's STOP to its RESUME, by QEMU's own clock (NaN when it stays paused).
    pub pause_ms: f64,
    /// Bytes of written pages copied while it was paused.
    pub paused_copy_bytes: u64,
    /// The RAM file the VM started from and the pages written on top of it (see
    /// [`chunks::Written`]).
    pub written: chunks::Written,
}

/// Where a running VM is saved: `dir` gets `mem` and `vmstate`; `devstate` is a path in the
/// VM's own run directory, where its (jailed) QEMU may write; `new_overlay` is where the VM goes
/// on writing its disk.
pub struct SaveTarget<'a> {
    pub dir: &'a Path,
    pub devstate: &'a Path,
    pub new_overlay: &'a Path,
    /// Where the RAM file goes when it fits there (`dir/mem` is then a link to it); else
    /// `dir/mem` itself (see [`crate::fastram`]).
    pub in_memory: Option<&'a crate::fastram::Place>,
}

/// Saves the running VM whose QMP socket is `qmp_socket` and whose RAM is `ram` (see the
/// module's notes); returns the disk file that froze. The VM keeps running unless
/// `stay_paused` (then the written pages are copied once, paused). On failure the VM is resumed
/// (unless `stay_paused`) and nothing is frozen.
pub fn save_running(
    qmp_socket: &Path,
    ram: &crate::ram::GuestRam,
    to: &SaveTarget,
    stay_paused: bool,
) -> Result<(PathBuf, SaveTiming), VmError> {
    let started = Instant::now();
    let mark = |what: &str| {
        tracing::debug!(
            "save: {what} at {:.1} ms",
            started.elapsed().as_secs_f64() * 1000.0
        )
    };
    let list = || -> Result<Vec<std::ops::Range<u64>>, VmError> {
        let runs = ram
            .written()
            .map_err(|e| VmError::io("read the VM's page map", e))?;
        mark(&format!("{} runs of written pages listed", runs.len()));
        Ok(runs)
    };
    // What the guest wrote so far, and so about what the file will hold.
    let runs = list()?;
    let need = allocated_bytes(ram.file()) + runs.iter().map(|r| r.end - r.start).sum::<u64>();
    let mem = ram_file_path(to, need)?;
    let file = crate::ram::new_file(&mem, ram.len())
        .map_err(|e| VmError::io("create the new RAM file", e))?;
    // SAFETY: a file this save just made, in a directory nobody else writes until it is
    // published; the mapping is dropped before this function returns.
    let mut dest = unsafe { memmap2::MmapOptions::new().map_mut(&file) }
        .map_err(|e| VmError::io("map the new RAM file", e))?;
    let copy = |dest: &mut memmap2::MmapMut, runs: &[std::ops::Range<u64>]| {
        ram.copy_into(runs, dest)
            .map_err(|e| VmError::io("copy the VM's written pages", e))
    };
    running_pass(ram, &mem, &mut dest, &runs, stay_paused)?;
    mark("RAM file copied, written pages allocated, running");
    let mut q = Qmp::connect(qmp_socket, Duration::from_secs(10))?;
    q.execute("stop", json!({}))?;
    mark("stopped");
    let result = (|| {
        let frozen = active_disk(&mut q)?;
        q.execute(
            "xen-save-devices-state",
            json!({"filename": to.devstate.display().to_string(), "live": false}),
        )?;
        q.execute(
            "blockdev-snapshot-sync",
            json!({"device": "root", "snapshot-file": to.new_overlay.display().to_string(), "format": "qcow2"}),
        )?;
        mark("device state saved, disk frozen");
        let last = list()?;
        let copied = copy(&mut dest, &last)?;
        mark("written pages copied, paused");
        if !stay_paused {
            resume(&mut q)?;
        }
        Ok((frozen, copied, last))
    })();
    let (frozen, paused_copy_bytes, last) = match result {
        Ok(v) => v,
        Err(e) => {
            if !stay_paused {
                let _ = resume(&mut q);
            }
            let _ = std::fs::remove_file(to.devstate);
            return Err(e);
        }
    };
    let pause_ms = match (q.last_event("STOP"), q.last_event("RESUME")) {
        (Some(s), Some(r)) if r >= s => (r - s) as f64 / 1000.0,
        _ => f64::NAN,
    };
    std::fs::rename(to.devstate, to.dir.join(VMSTATE))
        .map_err(|e| VmError::io("move the device state", e))?;
    Ok((
        frozen,
        SaveTiming {
            pause_ms,
            paused_copy_bytes,
            written: chunks::Written {
                parent_mem: ram.file().to_path_buf(),
                runs: last.iter().map(|r| (r.start, r.end)).collect(),
            },
        },
    ))
}

/// Where a save's RAM file goes: in memory (linked from the snapshot's directory) when the
/// in-memory store has room for `need` bytes, else in the snapshot's directory.
fn ram_file_path(to: &SaveTarget, need: u64) -> Result<PathBuf, VmError> {
    match to.in_memory.and_then(|p| p.new_dir(need)) {
        Some(d) => {
            let file = d.join(MEM);
            std::os::unix::fs::symlink(&file, to.dir.join(MEM))
                .map_err(|e| VmError::io("link the RAM file", e))?;
            Ok(file)
        }
        None => Ok(to.dir.join(MEM)),
    }
}

/// While the VM runs: the parent RAM file's data copied into the new one `mem` (in the
/// kernel) and, at once, the pages the paused pass will write (`runs`) allocated and mapped in
/// `dest`, so that pass is a plain memory copy; where both write a page, the paused pass
/// writes it last.
fn running_pass(
    ram: &crate::ram::GuestRam,
    mem: &Path,
    dest: &mut memmap2::MmapMut,
    runs: &[std::ops::Range<u64>],
    stay_paused: bool,
) -> Result<(), VmError> {
    std::thread::scope(|s| {
        let base = s.spawn(|| {
            crate::ram::copy_data(ram.file(), mem, ram.len())
                .map_err(|e| VmError::io(format!("copy {}", ram.file().display()), e))
        });
        let first = match stay_paused {
            true => Ok(()),
            false => match crate::ram::populate(dest, runs) {
                Ok(()) => Ok(()),
                // A kernel before 5.14 (no MADV_POPULATE_WRITE): a first copy does it.
                Err(_) => ram
                    .copy_into(runs, dest)
                    .map(|_| ())
                    .map_err(|e| VmError::io("copy the VM's written pages", e)),
            },
        };
        let based = base.join().unwrap_or_else(|_| {
            Err(VmError::io(
                "copy the RAM file",
                std::io::Error::other("the copy panicked"),
            ))
        });
        based.and(first)
    })
}

/// Resumes a paused VM. QEMU refuses `cont` for a moment after some operations ("Migration is
/// not finalized yet"; seen on a busy host): so it asks again, for up to 5 s.
fn resume(q: &mut Qmp) -> Result<(), VmError> {
    let start = Instant::now();
    loop {
        match q.execute("cont", json!({})) {
            Err(VmError::Qmp { message, .. })
                if message.contains("not finalized")
                    && start.elapsed() < Duration::from_secs(5) =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r.map(|_| ()),
        }
    }
}

/// The file the VM's root disk writes to now.
fn active_disk(q: &mut Qmp) -> Result<PathBuf, VmError> {
    let v = q.execute("query-block", json!({}))?;
    v.as_array()
        .into_iter()
        .flatten()
        .find(|d| d["device"] == "root")
        .and_then(|d| d["inserted"]["file"].as_str())
        .map(PathBuf::from)
        .ok_or_else(|| VmError::Qmp {
            command: "query-block".into(),
            message: "the VM has no root disk".into(),
        })
}

/// Writes `meta` into `tmp` and moves `tmp` to `dest` in one step; the snapshot exists whole or
/// not at all. `durable`: its RAM and disk are synced to the disk first (a fork's snapshot, which
/// lives only as long as its copies, skips that: they read it from the page cache).
pub fn publish(
    tmp: &Path,
    dest: &Path,
    meta: &SnapshotMeta,
    durable: bool,
) -> Result<Snapshot, SnapshotError> {
    // A jailed QEMU wrote these files under a uid of its own: they are root's from now on.
    // (The jail's mount point, when the snapshot's directory was also the VM's run directory,
    // is an empty directory with no use any more.)
    let _ = std::fs::remove_dir(tmp.join("jail"));
    crate::vm::jail::reclaim(tmp).map_err(io(format!("take back {}", tmp.display())))?;
    if crate::vm::jail::enabled() && tmp.join(MEM).exists() {
        crate::vm::jail::share_file(&tmp.join(MEM), !crate::vm::program::readonly_private_ram())
            .map_err(|e| SnapshotError::Io {
                what: "share the RAM file with jailed QEMUs".into(),
                source: std::io::Error::other(e.to_string()),
            })?;
    }
    let disk = meta.disk.clone().unwrap_or_else(|| tmp.join(DISK));
    if durable {
        for f in [tmp.join(MEM), disk] {
            if let Ok(file) = std::fs::File::open(&f) {
                file.sync_all()
                    .map_err(io(format!("sync {}", f.display())))?;
            }
        }
    }
    let json = serde_json::to_vec_pretty(meta).map_err(|e| SnapshotError::Io {
        what: "encode snapshot.json".into(),
        source: std::io::Error::other(e),
    })?;
    write_atomic(&tmp.join(META), &json).map_err(io("write snapshot.json"))?;
    std::fs::rename(tmp, dest).map_err(io(format!("publish {}", dest.display())))?;
    if let Some(parent) = dest.parent().and_then(|p| std::fs::File::open(p).ok()) {
        let _ = parent.sync_all();
    }
    Snapshot::load(dest).ok_or_else(|| SnapshotError::NotFound(meta.name.clone()))
}

/// Everything that identifies a template: a template is restored only by a forkbox whose
/// kernel, agent (both in the initramfs's content hash), QEMU and accelerator match.
pub fn template_key(
    image: &str,
    cpus: u32,
    memory_mib: u32,
    max_procs: u32,
    initramfs: &Path,
    accel: &AccelDecision,
) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [
        image.to_string(),
        cpus.to_string(),
        memory_mib.to_string(),
        max_procs.to_string(),
        // Its name is its content hash; the directory may be reached through a link.
        initramfs
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        qemu_version(),
        accel.accel.to_string(),
        format!("ram+{}K", ram_tail_kib(accel.accel)),
        // What the template's kernel booted with.
        crate::vm::kernel_cmdline(accel.accel),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    // Under KVM, the CPU its guest found at boot: a new model, or under `host` another CPU,
    // makes a new template.
    if let Some(c) = crate::vm::cpu::guest(accel.accel) {
        h.update(format!("{}|{}|{}", c.model, c.host, c.flags.join(" ")).as_bytes());
        h.update([0]);
    }
    let d: String = h
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "{}-c{cpus}-m{memory_mib}-{d}",
        image.split('#').next().unwrap_or(image).replace('@', "-")
    )
}

pub(crate) fn new_meta(
    name: String,
    kind: SnapshotKind,
    cfg: &VmConfig,
    image: String,
    accel: AccelDecision,
    parent: Option<String>,
    from_sandbox: Option<String>,
) -> SnapshotMeta {
    SnapshotMeta {
        name,
        kind,
        image,
        kernel: cfg.kernel.clone(),
        initramfs: cfg.initramfs.clone(),
        accel,
        cpus: cfg.cpus,
        memory_mib: cfg.memory_mib,
        ram_tail_kib: ram_tail_kib(cfg.accel),
        max_procs: cfg.max_procs,
        qemu_version: qemu_version(),
        state: StateFormat::Migration,
        parent,
        from_sandbox,
        created_unix: now_unix(),
        pause_ms: None,
        took_ms: 0,
        memory_bytes: 0,
        disk: None,
        disk_dirs: Vec::new(),
        hibernated: None,
        held_alone_bytes: None,
        cpu: crate::vm::cpu::guest(cfg.accel),
    }
}

/// Waits for a VM this process started to exit (after `quit`), killing it past `within`.
pub async fn reap(vm: &mut Vm, within: Duration) {
    if tokio::time::timeout(within, vm.wait_exit()).await.is_err() {
        vm.kill().await;
    }
}

impl From<SnapshotError> for SandboxError {
    fn from(e: SnapshotError) -> Self {
        SandboxError::Snapshot(e)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A snapshot.json as written before the RAM tail existed (no `ram_tail_kib`), for a TCG
    /// guest: read as 0. A snapshot whose tail is not the one this QEMU gives TCG guests (8 KiB
    /// before 9.0, none from 9.0) is refused in words; the same with the right tail restores.
    #[test]
    fn a_tcg_snapshot_without_the_ram_tail_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for f in [MEM, VMSTATE, DISK, "vmlinuz"] {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        let old = json!({
            "name": "old", "kind": "snapshot", "image": "python-bookworm@1",
            "kernel": dir.path().join("vmlinuz"), "initramfs": dir.path().join("vmlinuz"),
            "accel": {"accel": "tcg", "reason": "test"}, "cpus": 2, "memory_mib": 1024,
            "max_procs": 512, "qemu_version": qemu_version(), "parent": null,
            "from_sandbox": null, "created_unix": 0, "pause_ms": null, "took_ms": 0,
            "memory_bytes": 0
        });
        std::fs::write(dir.path().join(META), old.to_string()).unwrap();
        let mut snap = Snapshot::load(dir.path()).expect("an old snapshot.json still reads");
        assert_eq!(snap.meta.ram_tail_kib, 0);
        let ours = ram_tail_kib(crate::vm::Accel::Tcg);
        snap.meta.ram_tail_kib = crate::vm::TCG_RAM_TAIL_KIB - ours;
        let err = snap.check_restorable().unwrap_err().to_string();
        assert!(
            err.contains("save it again") && err.contains("old"),
            "{err}"
        );

        snap.meta.ram_tail_kib = ours;
        snap.check_restorable().unwrap();

        // Its kernel's file gone (a template made in a home that is gone): still restorable,
        // as a restore never reads it; its RAM file gone: refused, naming it.
        std::fs::remove_file(dir.path().join("vmlinuz")).unwrap();
        snap.check_restorable().unwrap();
        std::fs::remove_file(dir.path().join(MEM)).unwrap();
        let err = snap.check_restorable().unwrap_err().to_string();
        assert!(err.contains("mem is missing"), "{err}");
    }

    /// A snapshot whose disk is an overlay on a template that was removed since: refused in
    /// words naming the missing file (qemu-img's "Could not open backing file" came later and
    /// said nothing of the snapshot); with its backing file there, restorable.
    #[test]
    fn a_snapshot_whose_disk_lost_its_backing_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for f in [MEM, VMSTATE, META] {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        let base = dir.path().join("template.qcow2");
        let qemu_img = |args: &[&str]| {
            let ok = std::process::Command::new("qemu-img").args(args).status();
            assert!(ok.unwrap().success(), "qemu-img {args:?}");
        };
        qemu_img(&["create", "-q", "-f", "qcow2", base.to_str().unwrap(), "1M"]);
        let disk = dir.path().join(DISK);
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            "qcow2",
            "-b",
            base.to_str().unwrap(),
            disk.to_str().unwrap(),
        ]);
        let mut meta: SnapshotMeta = serde_json::from_value(json!({
            "name": "warm", "kind": "snapshot", "image": "python-bookworm@1",
            "kernel": "vmlinuz", "initramfs": "initrd",
            "accel": {"accel": "tcg", "reason": "test"}, "cpus": 1, "memory_mib": 256,
            "max_procs": 512, "qemu_version": qemu_version(), "parent": null,
            "from_sandbox": null, "created_unix": 0, "pause_ms": null, "took_ms": 0,
            "memory_bytes": 0
        }))
        .unwrap();
        meta.ram_tail_kib = ram_tail_kib(crate::vm::Accel::Tcg);
        let snap = Snapshot {
            dir: dir.path().to_path_buf(),
            meta,
        };
        snap.check_restorable().unwrap();
        std::fs::remove_file(&base).unwrap();
        let err = snap.check_restorable().unwrap_err().to_string();
        assert!(
            err.contains("warm") && err.contains("template.qcow2") && err.contains("gone"),
            "{err}"
        );
    }

    /// A snapshot saved under KVM, on a host whose verdict is TCG: refused in words before any
    /// QEMU starts; where KVM works, restorable (its CPU is this host's).
    #[test]
    fn a_kvm_snapshot_is_refused_where_kvm_does_not_work() {
        let dir = tempfile::tempdir().unwrap();
        for f in [MEM, VMSTATE, DISK] {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::new(home.path().to_path_buf());
        let mut meta = new_meta(
            "kvm-made".into(),
            SnapshotKind::Snapshot,
            &VmConfig {
                accel: crate::vm::Accel::Kvm,
                cpus: 1,
                memory_mib: 256,
                kernel: "vmlinuz".into(),
                initramfs: "initrd".into(),
                disk: "disk".into(),
                run_dir: dir.path().into(),
                die_with_parent: false,
                max_procs: 64,
                memory: Memory::Anonymous,
                start: Start::Boot,
                volumes: Vec::new(),
            },
            "python-bookworm@1".into(),
            AccelDecision {
                accel: crate::vm::Accel::Kvm,
                reason: "test".into(),
            },
            None,
            None,
        );
        assert!(meta
            .cpu
            .as_ref()
            .is_some_and(|c| c.model == "host" && !c.host.is_empty()));
        std::fs::write(dir.path().join(META), serde_json::to_vec(&meta).unwrap()).unwrap();
        let verdict = |works: bool| {
            std::fs::create_dir_all(paths.accel_verdict().parent().unwrap()).unwrap();
            let v = json!({"host": format!("{}|probe.cpio", crate::vm::host_fingerprint()),
                           "kvm_works": works, "reason": "paravirtual KVM"});
            std::fs::write(paths.accel_verdict(), v.to_string()).unwrap();
        };
        verdict(false);
        let snap = Snapshot::load(dir.path()).unwrap();
        let err = snap.check_host(&paths).unwrap_err().to_string();
        assert!(
            err.contains("kvm-made")
                && err.contains("saved under KVM")
                && err.contains("restore it on a KVM host"),
            "{err}"
        );
        if std::path::Path::new("/dev/kvm").exists() {
            verdict(true);
            snap.check_host(&paths).unwrap();
            meta.cpu
                .as_mut()
                .unwrap()
                .flags
                .push("no_such_feature".into());
            std::fs::write(dir.path().join(META), serde_json::to_vec(&meta).unwrap()).unwrap();
            let err = Snapshot::load(dir.path())
                .unwrap()
                .check_host(&paths)
                .unwrap_err()
                .to_string();
            assert!(err.contains("no_such_feature"), "{err}");
        }
        // Under TCG nothing of the host's matters.
        meta.accel.accel = crate::vm::Accel::Tcg;
        std::fs::write(dir.path().join(META), serde_json::to_vec(&meta).unwrap()).unwrap();
        verdict(false);
        Snapshot::load(dir.path())
            .unwrap()
            .check_host(&paths)
            .unwrap();
    }
}
