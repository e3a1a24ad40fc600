//! Building QEMU's command line and running it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use super::accel::Accel;
use crate::error::VmError;

/// Everything one VM needs.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub accel: Accel,
    pub cpus: u32,
    pub memory_mib: u32,
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    /// The sandbox's own qcow2 overlay over the image's root disk.
    pub disk: PathBuf,
    /// Sockets and the console log go here.
    pub run_dir: PathBuf,
    /// Kill QEMU when the process that started it dies (one-shot `run`).
    pub die_with_parent: bool,
    /// Most processes the guest's commands may have together.
    pub max_procs: u32,
    /// Where guest RAM lives.
    pub memory: Memory,
    /// Boot, or start paused for a saved state.
    pub start: Start,
    /// The volumes in its slots (the others hold an empty placeholder; see [`VOLUME_SLOTS`]).
    pub volumes: Vec<VolumeDisk>,
}

/// Disk slots every VM has for volumes, whatever it mounts: a virtio device cannot be added
/// to a running microvm, and a copy must have the devices its template had. A slot with no
/// volume holds a placeholder that reads zeros; the guest sees each slot as a disk with the
/// serial `fbvolN` and mounts a volume only when told to (after flushing what it cached of the
/// placeholder), so a volume of any size fits any slot.
pub const VOLUME_SLOTS: u32 = forkbox_api::MAX_VOLUMES_PER_SANDBOX as u32;

/// The size a slot's placeholder shows the guest: the largest volume's, so that any volume's
/// file system fits the device the guest knows.
const SLOT_BYTES: u64 = forkbox_api::MAX_VOLUME_MIB << 20;

/// A volume's disk in a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeDisk {
    pub slot: u32,
    pub disk: PathBuf,
    pub read_only: bool,
}

/// The serial of slot `slot`'s disk, by which the agent finds it.
pub fn slot_serial(slot: u32) -> String {
    format!("fbvol{slot}")
}

/// How a VM starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Boot the kernel.
    Boot,
    /// Paused, waiting for a migration stream (`-incoming defer -S`): templates.
    Incoming,
    /// Paused, waiting for a stream of device state alone, as `xen-save-devices-state` writes
    /// it (snapshots of running sandboxes): it has neither the configuration section nor the
    /// trailing description a migration has, so neither is expected
    /// (`migration.send-configuration=off`, `suppress-vmdesc=on`). Loaded with
    /// `migrate-incoming` like a migration (QEMU 7.2's `xen-load-devices-state` aborts outside
    /// Xen).
    Devices,
}

/// Where a VM's RAM lives. Every VM names its RAM object `ram`, so that device state saved by
/// one can be loaded by another whatever their backing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Memory {
    /// Private anonymous memory (only in configurations that start no QEMU).
    Anonymous,
    /// A file mapped shared: what the guest writes lands in the file. Snapshots and templates
    /// are made this way, so saving them writes only device state (`x-ignore-shared`).
    SharedFile(PathBuf),
    /// A RAM file mapped private: a copy reads the snapshot's pages from the page cache,
    /// shared with every other copy, and owns only the pages it writes (which is what saving
    /// it copies, see [`crate::ram`]). A cold boot maps an empty sparse file.
    PrivateFile(PathBuf),
}

impl VmConfig {
    pub fn agent_socket(&self) -> PathBuf {
        self.run_dir.join("agent.sock")
    }
    pub fn qmp_socket(&self) -> PathBuf {
        self.run_dir.join(QMP_SOCKET)
    }
    pub fn console_log(&self) -> PathBuf {
        self.run_dir.join("console.log")
    }
    pub fn console_socket(&self) -> PathBuf {
        self.run_dir.join("console.sock")
    }
    /// The QMP monitor the disk watcher listens on (the other, `qmp.sock`, is for commands).
    pub fn events_socket(&self) -> PathBuf {
        self.run_dir.join(EVENTS_SOCKET)
    }
}

/// The name, in a VM's run directory, of the QMP monitor that carries only events.
pub const EVENTS_SOCKET: &str = "events.sock";
/// QEMU's control socket, in a VM's run directory.
pub const QMP_SOCKET: &str = "qmp.sock";

/// Kernel command line of every guest.
///
/// Besides the console and the root disk: `cryptomgr.notests` skips the crypto self-tests
/// (~0.4 s of a TCG boot), `nokaslr` the kernel's relocation, `audit=0` the audit subsystem;
/// measured here they take a TCG boot from ~3.8 s to ~3.1 s to userspace.
///
/// An idle guest should not wake at all (under emulation each wake-up costs host CPU):
/// `nowatchdog` stops the soft-lockup watchdog (every CPU, every few seconds; a vCPU starved by
/// a busy host would only make it report false lockups), and `tsc=reliable` the clocksource
/// watchdog, which compared the TSC with jiffies twice a second and, with a vCPU starved by a
/// busy host, can declare the TSC unstable and move the guest's clock onto ticks that are lost;
/// `psi=0` the pressure-stall averaging (every 2 s).
pub const KERNEL_CMDLINE: &str =
    "console=ttyS0 quiet panic=-1 reboot=t 8250.nr_uarts=1 cryptomgr.notests nokaslr audit=0 nowatchdog tsc=reliable psi=0 forkbox.root=/dev/vda";

/// The host's TSC frequency in kHz. Under TCG the guest's TSC is the host's, and a guest on
/// `microvm` (no HPET, no PM timer) that must calibrate it against the PIT fails to, now and
/// then, and then hangs; telling it the frequency (`tsc_early_khz`) avoids that.
pub fn host_tsc_khz() -> Option<u64> {
    if let Some(k) = std::env::var("FORKBOX_TSC_KHZ")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return Some(k);
    }
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = info
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    Some((mhz * 1000.0) as u64)
}

pub fn kernel_cmdline(accel: Accel) -> String {
    match (accel, host_tsc_khz()) {
        (Accel::Tcg, Some(khz)) => format!("{KERNEL_CMDLINE} tsc_early_khz={khz}"),
        _ => KERNEL_CMDLINE.to_string(),
    }
}

/// Bytes of guest RAM added after the `memory_mib` under TCG (none under KVM).
///
/// QEMU 7.2 loses guest writes when it live-migrates a TCG guest whose RAM is a whole number
/// of 256 KiB: its fast dirty-bitmap sync clears the migration bits 64 pages at a time without
/// making the vCPUs' TLBs trap the next write again, so a page written after a sync through a
/// TLB entry filled earlier is never sent (fixed upstream in QEMU 9.0, "physmem: Fix migration
/// dirty bitmap coherency with TCG memory access"). Measured here: saving a sandbox that
/// writes 10 MB/s left 9 to 25 pages of the snapshot's RAM different from the paused source in
/// about half of the saves, and about one copy in thirty crashed. A RAM size that is not a
/// multiple of 256 KiB takes QEMU's page-by-page sync, which does reset the TLBs: with 8 KiB
/// more, 0 pages differed. KVM tracks dirty pages itself and keeps the exact size.
pub const TCG_RAM_TAIL_KIB: u32 = 8;

/// KiB of RAM a guest has past its `memory_mib` under `accel`.
/// 0 under KVM, and under TCG with a QEMU of 9.0 or later (which tracks dirty pages exactly).
pub fn ram_tail_kib(accel: Accel) -> u32 {
    match accel {
        Accel::Tcg if !super::program::exact_tcg_dirty_tracking() => TCG_RAM_TAIL_KIB,
        Accel::Tcg | Accel::Kvm => 0,
    }
}

/// The guest's RAM size in bytes: `memory_mib` and the tail `accel` adds.
pub fn ram_bytes(accel: Accel, memory_mib: u32) -> u64 {
    (u64::from(memory_mib) * 1024 + u64::from(ram_tail_kib(accel))) * 1024
}

/// The guest's RAM size, as given to `-m` and to the memory backend.
fn ram_size_arg(accel: Accel, memory_mib: u32) -> String {
    format!("{}K", ram_bytes(accel, memory_mib) / 1024)
}

/// QEMU's arguments for a VM: no default devices, no network device at all, the root disk,
/// the agent's virtio-serial port, an entropy source, QMP, and QEMU's seccomp sandbox.
pub fn qemu_args(cfg: &VmConfig) -> Vec<String> {
    let mut a = machine_args(cfg);
    a.extend(super::program::firmware_args());
    a.extend(accel_args(cfg.accel));
    a.extend([
        "-smp".into(),
        cfg.cpus.to_string(),
        "-m".into(),
        ram_size_arg(cfg.accel, cfg.memory_mib),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-no-reboot".into(),
    ]);
    a.extend(boot_args(cfg));
    a.extend(device_args(cfg));
    a.extend(start_args(cfg.start));
    a
}

fn show(p: &Path) -> String {
    p.display().to_string()
}

/// The microvm machine and the memory backend its RAM lives in.
fn machine_args(cfg: &VmConfig) -> Vec<String> {
    let machine = "microvm,x-option-roms=off,rtc=on,isa-serial=on,acpi=on,memory-backend=ram";
    let size = format!("size={}", ram_size_arg(cfg.accel, cfg.memory_mib));
    let ram = match &cfg.memory {
        Memory::Anonymous => format!("memory-backend-ram,id=ram,{size}"),
        Memory::SharedFile(f) => {
            format!(
                "memory-backend-file,id=ram,{size},mem-path={},share=on",
                show(f)
            )
        }
        // Read-only where QEMU can (8.2): the file is opened read-only and mapped private,
        // the guest's RAM stays writable (`rom=off`), its writes never reach the file.
        Memory::PrivateFile(f) if super::program::readonly_private_ram() => {
            format!(
                "memory-backend-file,id=ram,{size},mem-path={},share=off,readonly=on,rom=off",
                show(f)
            )
        }
        Memory::PrivateFile(f) => {
            format!(
                "memory-backend-file,id=ram,{size},mem-path={},share=off",
                show(f)
            )
        }
    };
    vec![
        "-M".into(),
        match cfg.start {
            Start::Devices => format!("{machine},suppress-vmdesc=on"),
            _ => machine.into(),
        },
        "-object".into(),
        ram,
    ]
}

/// The accelerator and the CPU model that goes with it: all that differs between KVM and TCG.
fn accel_args(accel: Accel) -> [String; 4] {
    match accel {
        Accel::Kvm => [
            "-accel".into(),
            "kvm".into(),
            "-cpu".into(),
            super::cpu::qemu_cpu(Accel::Kvm),
        ],
        Accel::Tcg => [
            "-accel".into(),
            // The translation cache defaults to 1 GiB; 256 MiB is ample for one small guest
            // and keeps QEMU inside its host memory allowance (limits::OVERHEAD_MIB).
            "tcg,thread=multi,tb-size=256".into(),
            "-cpu".into(),
            "max".into(),
        ],
    }
}

/// The kernel and initramfs, only for a boot. QEMU keeps a copy of both for its whole life
/// (fw_cfg's data, ~16 MiB of its own memory), and a VM restored from a template or snapshot
/// never reads them: its guest is past its boot, and -no-reboot makes a reboot the end of the
/// VM, not a new boot.
fn boot_args(cfg: &VmConfig) -> Vec<String> {
    if cfg.start != Start::Boot {
        return Vec::new();
    }
    vec![
        "-kernel".into(),
        show(&cfg.kernel),
        "-initrd".into(),
        show(&cfg.initramfs),
        "-append".into(),
        format!(
            "{} forkbox.max_procs={}",
            kernel_cmdline(cfg.accel),
            cfg.max_procs
        ),
    ]
}

/// The console, the disk watcher's monitor, the root disk, the agent's port, the entropy
/// source, QMP and QEMU's seccomp sandbox.
fn device_args(cfg: &VmConfig) -> Vec<String> {
    vec![
        "-chardev".into(),
        format!(
            "socket,id=console,path={},server=on,wait=off",
            show(&cfg.console_socket())
        ),
        "-serial".into(),
        "chardev:console".into(),
        // A second QMP monitor, only for the disk watcher's events (crate::diskwatch).
        "-chardev".into(),
        format!(
            "socket,id=events,path={},server=on,wait=off",
            show(&cfg.events_socket())
        ),
        "-mon".into(),
        "chardev=events,mode=control".into(),
        "-drive".into(),
        format!(
            // A full host disk stops the guest and keeps the failed write for `cont`
            // (crate::diskwatch); a read error reaches the guest.
            "id=root,file={},format=qcow2,if=none,cache=unsafe,discard=unmap,werror=enospc,rerror=report",
            show(&cfg.disk)
        ),
        "-device".into(),
        "virtio-blk-device,drive=root".into(),
    ]
    .into_iter()
    .chain(volume_args(cfg))
    .chain([
        "-device".into(),
        "virtio-serial-device,max_ports=2".into(),
        "-chardev".into(),
        format!(
            "socket,id=agent,path={},server=on,wait=off",
            show(&cfg.agent_socket())
        ),
        "-device".into(),
        format!(
            "virtserialport,chardev=agent,name={}",
            forkbox_protocol::PORT_NAME
        ),
        "-object".into(),
        "rng-random,id=rng0,filename=/dev/urandom".into(),
        "-device".into(),
        "virtio-rng-device,rng=rng0".into(),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", show(&cfg.qmp_socket())),
        "-sandbox".into(),
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
    ])
    .collect()
}

/// The volume slots: a volume's raw disk, or the placeholder. A volume's writes reach its file
/// when the guest flushes (`cache=writeback`: an fsync in the guest is one on the host); a host
/// error reaches the guest (`werror=report`); a discard is ignored (it would punch holes in
/// the space the volume took when it was made).
fn volume_args(cfg: &VmConfig) -> Vec<String> {
    let mut a = Vec::new();
    for slot in 0..VOLUME_SLOTS {
        let id = format!("vol{slot}");
        match cfg.volumes.iter().find(|v| v.slot == slot) {
            Some(v) => a.extend([
                "-drive".into(),
                format!(
                    "id={id},file={},format=raw,if=none,cache=writeback,discard=ignore,detect-zeroes=off,werror=report,rerror=report,read-only={}",
                    show(&v.disk),
                    if v.read_only { "on" } else { "off" }
                ),
            ]),
            None => a.extend([
                "-blockdev".into(),
                format!("driver=null-co,node-name={id},size={SLOT_BYTES},read-zeroes=on"),
            ]),
        }
        a.extend([
            "-device".into(),
            format!("virtio-blk-device,drive={id},serial={}", slot_serial(slot)),
        ]);
    }
    a
}

/// How the VM starts: booting, or waiting for the state of a template or snapshot. `-S`: stay
/// paused once the state is in, whatever the source's run state was; a copy is started by
/// `cont` after its load.
fn start_args(start: Start) -> Vec<String> {
    match start {
        Start::Boot => Vec::new(),
        Start::Incoming => vec!["-incoming".into(), "defer".into(), "-S".into()],
        Start::Devices => vec![
            "-global".into(),
            "migration.send-configuration=off".into(),
            "-incoming".into(),
            "defer".into(),
            "-S".into(),
        ],
    }
}

/// Creates a copy-on-write qcow2 overlay over `base`: an image's raw root disk, or the frozen
/// qcow2 disk of a template or snapshot.
pub async fn create_overlay(base: &Path, overlay: &Path) -> Result<(), VmError> {
    // The overlay records its backing file's real path: one reached through a link (a home
    // that links another's images) would break, and would give a jail the wrong path to bind,
    // once the link is gone.
    let base = &std::fs::canonicalize(base).map_err(|e| VmError::Overlay {
        image: base.display().to_string(),
        detail: format!("cannot resolve its path: {e}"),
    })?;
    let base_format = if base.extension().is_some_and(|e| e == "qcow2") {
        "qcow2"
    } else {
        "raw"
    };
    // Bases never change (images, templates' and snapshots' frozen disks), and a new overlay
    // of one is the same bytes every time: the first is made by qemu-img, the next copied
    // (spawning qemu-img costs ~30 ms of CPU, which ten copies of a fork would pay at once).
    let key = std::fs::metadata(base).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        (base.clone(), m.len(), m.mtime(), m.mtime_nsec(), m.ino())
    });
    // The copies of a fork all ask at once: one runs qemu-img, the others wait and copy.
    static MAKING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _making = MAKING.lock().await;
    if let Some(bytes) = key.as_ref().and_then(overlay_cache::get) {
        drop(_making);
        return tokio::fs::write(overlay, bytes.as_slice())
            .await
            .map_err(|e| VmError::Overlay {
                image: base.display().to_string(),
                detail: format!("write {}: {e}", overlay.display()),
            });
    }
    let qemu_img = crate::setup::require("qemu-img").map_err(|e| VmError::Overlay {
        image: base.display().to_string(),
        detail: e.to_string(),
    })?;
    let out = Command::new(qemu_img)
        .args([
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            base_format,
            "-o",
            "extended_l2=on,cluster_size=128k",
            "-b",
        ])
        .arg(base)
        .arg(overlay)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| VmError::Overlay {
            image: base.display().to_string(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(VmError::Overlay {
            image: base.display().to_string(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    if let (Some(key), Ok(bytes)) = (key, tokio::fs::read(overlay).await) {
        overlay_cache::put(key, bytes);
    }
    Ok(())
}

/// New overlays by their base (see [`create_overlay`]); the most recent few.
mod overlay_cache {
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};

    /// A base's path, length, modification time (s, ns) and inode.
    pub type Key = (PathBuf, u64, i64, i64, u64);
    const KEEP: usize = 32;
    static CACHE: Mutex<Vec<(Key, Arc<Vec<u8>>)>> = Mutex::new(Vec::new());

    pub fn get(key: &Key) -> Option<Arc<Vec<u8>>> {
        let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        cache.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    pub fn put(key: Key, bytes: Vec<u8>) {
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|(k, _)| *k != key);
        if cache.len() >= KEEP {
            cache.remove(0);
        }
        cache.push((key, Arc::new(bytes)));
    }
}

/// A running QEMU process: one this process started, or one it adopted after a restart.
pub struct Vm {
    /// Present when this process started QEMU.
    child: Option<Child>,
    pub pid: u32,
    pub console: Console,
    stderr_log: PathBuf,
    /// Name of its host cgroup (`forkbox/<name>`).
    cgroup: String,
}

/// The host cgroup of a VM is named after its run directory (the sandbox id, or the
/// temporary directory of a template or a snapshot's receiver).
fn cgroup_name(cfg: &VmConfig) -> String {
    cfg.run_dir
        .file_name()
        .map(|n| n.to_string_lossy().trim_start_matches('.').to_string())
        .unwrap_or_else(|| "vm".into())
}

/// The guest's serial console, captured by the host into a log file of bounded size: a guest
/// that prints without end costs the host at most `CONSOLE_CAP` bytes of disk.
#[derive(Clone)]
pub struct Console {
    log: PathBuf,
    done: tokio::sync::watch::Receiver<bool>,
}

/// Largest size of a console log; past it the log restarts with its last `CONSOLE_KEEP` bytes.
pub const CONSOLE_CAP: u64 = 1 << 20;
const CONSOLE_KEEP: usize = 64 * 1024;

impl Console {
    fn capture(socket: PathBuf, log: PathBuf) -> Console {
        let (tx, done) = tokio::sync::watch::channel(false);
        let path = log.clone();
        tokio::spawn(async move {
            let _ = capture_console(&socket, &path).await;
            let _ = tx.send(true);
        });
        Console { log, done }
    }

    /// The last `lines` lines, once the console has closed (the VM exited) or after a short
    /// wait, so that a crashed guest's last words are in.
    pub async fn settled_tail(&self, lines: usize) -> String {
        let mut done = self.done.clone();
        let _ = tokio::time::timeout(Duration::from_secs(2), done.wait_for(|d| *d)).await;
        console_tail(&self.log, lines)
    }

    pub fn tail(&self, lines: usize) -> String {
        console_tail(&self.log, lines)
    }
}

async fn capture_console(socket: &Path, log: &Path) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    // As long as a boot may take (the default boot timeout).
    let mut wait = super::socket_wait::SocketWait::new(socket, Duration::from_secs(120));
    let mut stream = loop {
        match tokio::net::UnixStream::connect(socket).await {
            Ok(s) => break s,
            Err(e) => match wait.next_pause() {
                Some(pause) => tokio::time::sleep(pause).await,
                None => return Err(e),
            },
        }
    };
    let mut file = tokio::fs::File::create(log).await?;
    let mut written: u64 = 0;
    let mut recent: std::collections::VecDeque<u8> = Default::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        recent.extend(&buf[..n]);
        let excess = recent.len().saturating_sub(CONSOLE_KEEP);
        recent.drain(..excess);
        if written + n as u64 > CONSOLE_CAP {
            // Start the log again with only its most recent part.
            file.set_len(0).await?;
            file = tokio::fs::File::create(log).await?;
            let (a, b) = recent.as_slices();
            file.write_all(a).await?;
            file.write_all(b).await?;
            written = recent.len() as u64;
        } else {
            file.write_all(&buf[..n]).await?;
            written += n as u64;
        }
    }
}

/// How much of QEMU's stderr log an error message quotes.
const STDERR_QUOTE: u64 = 4 * 1024;

impl VmConfig {
    /// QEMU's stderr goes to a file, not a pipe: a pipe would break (and SIGPIPE QEMU) when the
    /// process that started it dies, and the daemon's VMs must outlive a daemon crash.
    pub fn stderr_log(&self) -> PathBuf {
        self.run_dir.join("qemu.stderr")
    }
}

/// The QEMU a jail's holder started (its only child), waiting briefly for the fork.
fn qemu_of_holder(holder: u32) -> Option<u32> {
    let path = format!("/proc/{holder}/task/{holder}/children");
    for _ in 0..2000 {
        match std::fs::read_to_string(&path) {
            Ok(s) => {
                if let Some(pid) = s.split_whitespace().next().and_then(|p| p.parse().ok()) {
                    return Some(pid);
                }
            }
            // The holder is gone: QEMU failed at once.
            Err(_) => return None,
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// The jail a VM's QEMU runs in (see [`super::jail`]); gives it the files it writes.
fn jail_for(cfg: &VmConfig) -> Result<super::jail::Jail, VmError> {
    use super::jail;
    let mut rw = Vec::new();
    let disk_dir = cfg.disk.parent().unwrap_or(Path::new("/")).to_path_buf();
    let mut ro = match cfg.start {
        Start::Boot => vec![cfg.kernel.clone(), cfg.initramfs.clone()],
        Start::Incoming | Start::Devices => Vec::new(),
    };
    ro.extend(jail::backing_chain(&cfg.disk));
    ro.extend(super::program::foreign_prefix());
    ro.extend(
        cfg.volumes
            .iter()
            .filter(|v| v.read_only)
            .map(|v| v.disk.clone()),
    );
    rw.extend(
        cfg.volumes
            .iter()
            .filter(|v| !v.read_only)
            .map(|v| v.disk.clone()),
    );
    let mut ram = None;
    let mut mine = vec![cfg.run_dir.clone(), disk_dir.clone()];
    match &cfg.memory {
        Memory::Anonymous => {}
        Memory::SharedFile(f) => mine.push(f.parent().unwrap_or(Path::new("/")).to_path_buf()),
        // QEMU opens it read-only: the file alone, read-only, bound over whatever holds it.
        Memory::PrivateFile(f) if super::program::readonly_private_ram() => {
            jail::share_file(f, false)?;
            ram = Some(f.clone());
        }
        Memory::PrivateFile(f) => {
            jail::share_file(f, true)?;
            let dir = f.parent().unwrap_or(Path::new("/")).to_path_buf();
            if !mine.contains(&dir) {
                rw.push(dir);
            }
        }
    }
    mine.sort();
    mine.dedup();
    let j = jail::Jail::new(&jail::Needs {
        run_dir: &cfg.run_dir,
        rw: mine
            .iter()
            .filter(|p| **p != cfg.run_dir)
            .cloned()
            .chain(rw)
            .collect(),
        ro,
        ro_last: ram.clone(),
        kvm: cfg.accel == Accel::Kvm,
        die_with_parent: cfg.die_with_parent,
    })?;
    for p in &mine {
        jail::give(p, j.uid)?;
    }
    if let Some(f) = &ram {
        // `give` handed what is in the run directory to the jail's uid; a RAM file there (a
        // cold boot's, a resumed hibernation's) goes back to root.
        jail::share_file(f, false)?;
    }
    Ok(j)
}

impl Vm {
    pub fn spawn(cfg: &VmConfig) -> Result<Vm, VmError> {
        let program = super::program::program().unwrap_or_else(|| PathBuf::from(super::QEMU));
        let stderr = std::fs::File::create(cfg.stderr_log())
            .map_err(|e| VmError::io("create QEMU's stderr log", e))?;
        let mut cmd = Command::new(&program);
        cmd.args(qemu_args(cfg))
            .envs(super::program::module_env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            // A VM whose owner dropped it (an abandoned create) must not outlive it; a VM
            // that outlives a crash of its owner is found again through its run record.
            .kill_on_drop(true)
            // Its own process group: Ctrl-C reaches the front-end, which then cleans up.
            .process_group(0);
        let cgroup = cgroup_name(cfg);
        let limits = crate::limits::Limits::for_vm(cfg.cpus, cfg.memory_mib);
        let jailed = super::jail::enabled();
        if jailed {
            let jail = jail_for(cfg)?;
            // SAFETY: `enter` runs in the child between fork and exec and makes only system
            // calls on data prepared before the fork (see `Jail::enter`); it sets the
            // parent-death signal itself, after changing credentials (which clears it).
            unsafe {
                cmd.pre_exec(move || jail.enter());
            }
        } else if cfg.die_with_parent {
            // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of
            // the parent; it runs in the child between fork and exec. The signal fires when the
            // *thread* that forked exits, so callers spawn from a thread that lives as long as
            // the VM should (a runtime worker, not a blocking-pool thread).
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().map_err(|source| VmError::Spawn {
            program: program.display().to_string(),
            source,
        })?;
        let pid = match (jailed, child.id()) {
            // The child is QEMU's holder; QEMU is its only child.
            (true, Some(holder)) => qemu_of_holder(holder).ok_or_else(|| VmError::Jail {
                detail: format!("QEMU did not start under its holder (PID {holder})"),
            })?,
            (_, pid) => pid.unwrap_or(0),
        };
        // Into its cgroups while it initialises (before any guest code runs under TCG; a
        // move into a cgroup v1 memory controller costs ~20 ms here, which this overlaps).
        if let Err(e) = crate::limits::apply(&cgroup, pid, limits) {
            tracing::warn!("no host limits for this VM's QEMU: {e}");
        }
        let console = Console::capture(cfg.console_socket(), cfg.console_log());
        Ok(Vm {
            child: Some(child),
            pid,
            console,
            stderr_log: cfg.stderr_log(),
            cgroup,
        })
    }

    /// Takes over a QEMU that an earlier process started for `cfg`'s run directory, after
    /// checking that `pid` is still that QEMU (`start` is its start time).
    pub fn adopt(cfg: &VmConfig, pid: u32, start: u64) -> Option<Vm> {
        if crate::procfs::process_start(pid) != Some(start) {
            return None;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        if !String::from_utf8_lossy(&cmdline).contains(&cfg.agent_socket().display().to_string()) {
            return None;
        }
        let console = Console::capture(cfg.console_socket(), cfg.console_log());
        Some(Vm {
            child: None,
            pid,
            console,
            stderr_log: cfg.stderr_log(),
            cgroup: cgroup_name(cfg),
        })
    }

    /// Waits for QEMU to exit; returns its status and what it printed on stderr.
    pub async fn wait_exit(&mut self) -> (String, String) {
        let r = self.wait_exit_inner().await;
        crate::limits::remove_when_empty(&self.cgroup).await;
        r
    }

    async fn wait_exit_inner(&mut self) -> (String, String) {
        let status = match self.child.as_mut() {
            Some(c) => match c.wait().await {
                Ok(s) => s.to_string(),
                Err(e) => format!("unknown status ({e})"),
            },
            None => {
                while std::path::Path::new(&format!("/proc/{}", self.pid)).exists() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                "exited".into()
            }
        };
        (status, self.stderr_tail())
    }

    fn stderr_tail(&self) -> String {
        file_tail(&self.stderr_log, STDERR_QUOTE)
            .map(|t| t.trim().to_string())
            .unwrap_or_default()
    }

    /// Stops the VM at once. The guest's disk is disposable, so nothing is flushed.
    pub async fn kill(&mut self) {
        self.kill_process().await;
        crate::limits::remove_when_empty(&self.cgroup).await;
    }

    async fn kill_process(&mut self) {
        match self.child.as_mut() {
            Some(c) => {
                // QEMU first (a jailed QEMU's holder exits once it has reaped it), then the
                // process started (the holder, or QEMU itself).
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                if tokio::time::timeout(Duration::from_secs(5), c.wait())
                    .await
                    .is_err()
                {
                    let _ = c.start_kill();
                    let _ = c.wait().await;
                }
            }
            None => {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                // Not our child: its parent (or init) reaps it; wait until it is gone.
                for _ in 0..100 {
                    if crate::procfs::process_start(self.pid).is_none() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
}

/// Console lines that say why a guest died.
const HEADLINES: &[&str] = &[
    "Kernel panic",
    "Oops",
    "BUG:",
    "Out of memory",
    "forkbox-agent:",
];

/// The last `max` bytes of a file, as text; `None` when it cannot be read.
fn file_tail(path: &Path, max: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    f.seek(SeekFrom::Start(len.saturating_sub(max))).ok()?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

pub fn console_tail(path: &Path, lines: usize) -> String {
    let Some(text) = file_tail(path, 16 * 1024) else {
        return "(no console output)".into();
    };
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    let mut tail = all[start..].join("\n");
    // A kernel's last words are followed by a long stack trace: keep the headline too.
    if let Some(head) = all[..start]
        .iter()
        .rev()
        .find(|l| HEADLINES.iter().any(|h| l.contains(h)))
    {
        tail = format!("{head}\n[...]\n{tail}");
    }
    if tail.trim().is_empty() {
        "(no console output)".into()
    } else {
        tail
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cfg(accel: Accel) -> VmConfig {
        VmConfig {
            accel,
            cpus: 2,
            memory_mib: 512,
            kernel: "/k".into(),
            initramfs: "/i".into(),
            disk: "/d.qcow2".into(),
            run_dir: "/run/x".into(),
            die_with_parent: false,
            max_procs: 100,
            memory: Memory::Anonymous,
            start: Start::Boot,
            volumes: Vec::new(),
        }
    }

    /// Every VM has its volume slots; a volume's disk in its slot, read-only where asked.
    #[test]
    fn volume_slots_hold_a_placeholder_or_a_volume() {
        let mut c = cfg(Accel::Tcg);
        let a = qemu_args(&c).join(" ");
        for slot in 0..VOLUME_SLOTS {
            assert!(
                a.contains(&format!("driver=null-co,node-name=vol{slot},")),
                "{a}"
            );
            assert!(
                a.contains(&format!(
                    "virtio-blk-device,drive=vol{slot},serial=fbvol{slot}"
                )),
                "{a}"
            );
        }
        c.volumes = vec![VolumeDisk {
            slot: 1,
            disk: "/v/cache/disk.ext4".into(),
            read_only: true,
        }];
        let a = qemu_args(&c).join(" ");
        assert!(
            a.contains("id=vol1,file=/v/cache/disk.ext4,format=raw,if=none,cache=writeback"),
            "{a}"
        );
        assert!(
            a.contains("read-only=on") && !a.contains("node-name=vol1,"),
            "{a}"
        );
    }

    /// A copy's RAM file: read-only where QEMU can open it so (8.2), never shared.
    #[test]
    fn a_copy_maps_its_ram_file_private_and_read_only_where_qemu_can() {
        let mut c = cfg(Accel::Tcg);
        c.memory = Memory::PrivateFile("/s/mem".into());
        let a = qemu_args(&c).join(" ");
        assert!(a.contains("mem-path=/s/mem,share=off"), "{a}");
        assert_eq!(
            a.contains("share=off,readonly=on,rom=off"),
            super::super::program::readonly_private_ram(),
            "{a}"
        );
        c.memory = Memory::SharedFile("/t/mem".into());
        let a = qemu_args(&c).join(" ");
        assert!(
            a.contains("mem-path=/t/mem,share=on") && !a.contains("readonly"),
            "{a}"
        );
    }

    #[test]
    fn no_network_device_and_seccomp_on() {
        let a = qemu_args(&cfg(Accel::Tcg)).join(" ");
        assert!(a.contains("-nodefaults"));
        assert!(!a.contains("-netdev") && !a.contains("-nic") && !a.contains("virtio-net"));
        assert!(a.contains(
            "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
        ));
        assert!(a.contains("-accel tcg,thread=multi,tb-size=256 -cpu max"));
        // Before QEMU 9.0, 512 MiB and 8 KiB: not a multiple of 256 KiB, so QEMU 7.2 tracks a
        // TCG guest's writes page by page during a live save (see TCG_RAM_TAIL_KIB); from 9.0
        // the exact size.
        let kib = match super::super::program::exact_tcg_dirty_tracking() {
            true => 524288,
            false => 524296,
        };
        assert!(a.contains(&format!("-smp 2 -m {kib}K")), "{a}");
        assert!(a.contains(&format!("id=ram,size={kib}K")), "{a}");
        let k = qemu_args(&cfg(Accel::Kvm)).join(" ");
        assert!(k.contains("-m 524288K") && k.contains("id=ram,size=524288K"));
        assert!(a.contains("name=org.forkbox.agent.0"));
    }

    #[test]
    fn console_tail_keeps_the_panic_headline() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("console.log");
        let mut text = String::from("boot\nKernel panic - not syncing: sysrq triggered crash\n");
        for i in 0..30 {
            text += &format!("trace {i}\n");
        }
        std::fs::write(&log, text).unwrap();
        let tail = console_tail(&log, 5);
        assert!(tail.starts_with("Kernel panic - not syncing"), "{tail}");
        assert!(tail.ends_with("trace 29"), "{tail}");
        assert_eq!(
            console_tail(&dir.path().join("absent"), 5),
            "(no console output)"
        );
    }

    #[test]
    fn an_incoming_vm_stays_paused_after_its_load() {
        let mut c = cfg(Accel::Tcg);
        assert!(!qemu_args(&c).iter().any(|a| a == "-incoming" || a == "-S"));
        c.start = Start::Incoming;
        let a = qemu_args(&c).join(" ");
        assert!(a.ends_with("-incoming defer -S"), "{a}");
        c.start = Start::Devices;
        let a = qemu_args(&c).join(" ");
        assert!(
            a.ends_with("-global migration.send-configuration=off -incoming defer -S")
                && a.contains("memory-backend=ram,suppress-vmdesc=on"),
            "{a}"
        );
    }

    #[test]
    fn only_a_boot_is_given_the_kernel() {
        let mut c = cfg(Accel::Tcg);
        let boot = qemu_args(&c);
        for flag in ["-kernel", "-initrd", "-append"] {
            assert!(boot.iter().any(|a| a == flag), "{flag} missing from a boot");
        }
        for start in [Start::Incoming, Start::Devices] {
            c.start = start;
            let a = qemu_args(&c);
            assert!(
                !a.iter()
                    .any(|a| a == "-kernel" || a == "-initrd" || a == "-append"),
                "{start:?}: {a:?}"
            );
        }
    }

    #[test]
    fn kvm_uses_host_cpu() {
        let a = qemu_args(&cfg(Accel::Kvm)).join(" ");
        assert!(a.contains("-accel kvm -cpu host"));
    }
}
