//! A sandbox: one microVM booted from an image, with its own disk overlay, and the agent
//! connection to drive it.

// What a live sandbox is made of: its agent connection, transfers, network tunnels, disk watch.
pub mod activity;
pub mod ca;
pub mod client;
pub mod diskwatch;
pub mod files;
pub mod handshakes;
pub mod intercept;
pub mod net;
mod network;
pub mod packages;
mod reboot;
pub mod secrets;
mod starting;
pub mod volumes;

use std::time::{Duration, Instant};

use forkbox_protocol::ExecSpec;

use crate::client::{AgentClient, ExecEvent, Execution, Output};
use crate::error::{AgentError, SandboxError, VmError};
use crate::image::{env_pairs, Image, ImageRef, ImageStore};
use crate::kernel::{self, Kernel};
use crate::paths::Paths;
use crate::runstate::{self, RunDir};
use crate::snapshot::Snapshot;
use crate::vm::{self, AccelChoice, AccelDecision, Vm, VmConfig};

pub use forkbox_api::SandboxInfo;
use starting::{boot, disk_growth, fresh_identity, start_copy, Copy};
pub use starting::{boot_kit, ensure_template, BootKit};

pub const DEFAULT_MAX_PROCS: u32 = 4096;

/// The RAM file of a cold-booted sandbox, in its run directory.
const COLD_RAM: &str = "ram";

/// How a sandbox is made.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub image: ImageRef,
    pub cpus: u32,
    pub memory_mib: u32,
    pub accel: AccelChoice,
    /// Kill the VM if the creating process dies (one-shot use).
    pub die_with_parent: bool,
    /// Longest wait for the guest agent after QEMU starts.
    pub boot_timeout: Duration,
    /// Most processes the sandbox's commands may have together (a fork bomb stops there).
    pub max_procs: u32,
    /// Boot the kernel instead of restoring the image's template (slow; for comparisons).
    pub cold: bool,
    /// Grow the root disk (and its filesystem) to this many MiB; at least the image's size.
    /// Restored sandboxes only (every `create` restores); a cold boot keeps the image's size.
    pub disk_mib: Option<u64>,
    /// What the sandbox may reach (off: nothing).
    pub network: crate::net::NetworkPolicy,
    /// Volumes to attach, each in its slot (restored sandboxes only), taken for the sandbox
    /// as it is made (one writer or many readers; see [`volumes`]).
    pub volumes: Vec<forkbox_api::MountedVolume>,
    /// The guest has them mounted already: a sleeping sandbox waking, whose holds stand.
    pub volumes_in_guest: bool,
    /// The home's package cache, which its connections to registries go through (none: they
    /// are tunnelled as any host's).
    pub packages: Option<std::sync::Arc<crate::packages::PackageCache>>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            image: ImageRef {
                name: "python-bookworm".into(),
                version: None,
            },
            cpus: 1,
            memory_mib: 1024,
            accel: AccelChoice::Auto,
            die_with_parent: false,
            boot_timeout: Duration::from_secs(120),
            max_procs: DEFAULT_MAX_PROCS,
            cold: false,
            disk_mib: None,
            network: Default::default(),
            volumes: Vec::new(),
            volumes_in_guest: false,
            packages: None,
        }
    }
}

pub struct Sandbox {
    info: SandboxInfo,
    image: Image,
    vm: tokio::sync::Mutex<Vm>,
    console: vm::Console,
    client: AgentClient,
    run: std::sync::Mutex<RunDir>,
    destroyed: std::sync::atomic::AtomicBool,
    disk: crate::diskwatch::DiskWatch,
}

fn new_id() -> Result<String, SandboxError> {
    let hex = crate::random::hex(5).map_err(|e| SandboxError::io("draw a sandbox id", e))?;
    Ok(format!("sb-{hex}"))
}

/// Debian's system CA bundle in the guest (OpenSSL's default file there).
const GUEST_STORE: &str = "/etc/ssl/certs/ca-certificates.crt";

impl Sandbox {
    pub async fn create(paths: &Paths, cfg: &SandboxConfig) -> Result<Sandbox, SandboxError> {
        runstate::sweep(paths);
        let started = Instant::now();
        let image = ImageStore::new(paths).resolve(&cfg.image)?;
        vm::program::require()?;
        let kit = boot_kit(paths, &image, cfg.accel).await?;
        if cfg.cold {
            if !cfg.volumes.is_empty() {
                return Err(crate::error::VolumeError::Bad(
                    "a cold boot mounts no volumes: leave out cold, or the volumes".into(),
                )
                .into());
            }
            let sb = Sandbox::cold_boot(paths, cfg, image, kit, started).await?;
            sb.client.net.set_packages(cfg.packages.clone());
            sb.set_network(cfg.network.clone()).await?;
            return Ok(sb);
        }
        let template = ensure_template(paths, cfg, &image, &kit).await?;
        let origin = format!("template:{}", template.meta.name);
        Sandbox::restore(paths, &template, origin, cfg, started, None).await
    }

    /// Boots the image's kernel (seconds under TCG).
    async fn cold_boot(
        paths: &Paths,
        cfg: &SandboxConfig,
        image: Image,
        kit: BootKit,
        started: Instant,
    ) -> Result<Sandbox, SandboxError> {
        let id = new_id()?;
        let mut run = RunDir::create(paths, &id, &image.reference())
            .map_err(|e| SandboxError::io(format!("create run directory for {id}"), e))?;
        let vm_cfg = VmConfig {
            accel: kit.accel.accel,
            cpus: cfg.cpus,
            memory_mib: cfg.memory_mib,
            kernel: kit.kernel.clone(),
            initramfs: kit.initramfs.clone(),
            disk: run.disk_dir().join("disk.qcow2"),
            run_dir: run.dir.clone(),
            die_with_parent: cfg.die_with_parent,
            max_procs: cfg.max_procs,
            memory: vm::Memory::PrivateFile(run.dir.join(COLD_RAM)),
            start: vm::Start::Boot,
            volumes: Vec::new(),
        };
        // An empty sparse file, mapped private: the guest's RAM is then the pages it writes,
        // as in every restored copy, and is saved the same way.
        let ram_bytes = vm::ram_bytes(kit.accel.accel, cfg.memory_mib);
        if let Err(e) = crate::ram::zero_file(&run.dir.join(COLD_RAM), ram_bytes) {
            run.remove();
            return Err(SandboxError::io("create the guest's RAM file", e));
        }
        let booted = boot(&image.rootfs(), &vm_cfg, cfg.boot_timeout, |vm| {
            run.record.qemu_pid = Some(vm.pid);
            run.record.qemu_start = crate::procfs::process_start(vm.pid);
            run.save().map_err(|e| VmError::io("record the VM", e))
        })
        .await;
        let (vm, client) = match booted {
            Ok(v) => v,
            Err(e) => {
                run.remove();
                return Err(e.into());
            }
        };
        let info = SandboxInfo {
            id,
            image: image.reference(),
            accel: kit.accel,
            cpus: cfg.cpus,
            memory_mib: cfg.memory_mib,
            guest_kernel: client.hello.kernel.clone(),
            qemu_pid: vm.pid,
            boot_ms: started.elapsed().as_millis() as u64,
            origin: None,
            max_procs: cfg.max_procs,
            kernel: kit.kernel,
            initramfs: kit.initramfs,
            disk_dirs: vec![run.record.id.clone()],
            volumes: Vec::new(),
        };
        Ok(Sandbox::assemble(info, image, vm, client, run))
    }

    /// Starts a copy of a snapshot or template: a new disk overlay on its frozen disk, its RAM
    /// file mapped private, its device state loaded; then the copy's RNG is reseeded, its clock
    /// set and its identity changed before it is returned. Given `id`, it is that sandbox woken
    /// from its hibernation: the same machine, which keeps its machine id and boot id.
    pub async fn restore(
        paths: &Paths,
        snap: &Snapshot,
        origin: String,
        cfg: &SandboxConfig,
        started: Instant,
        id: Option<String>,
    ) -> Result<Sandbox, SandboxError> {
        snap.check_restorable()?;
        snap.check_host(paths)?;
        let image = ImageStore::new(paths).resolve(&snap.meta.image.parse()?)?;
        // A sandbox given its id is one woken from its own hibernation.
        let resumed = id.is_some();
        let id = match id {
            Some(id) => id,
            None => new_id()?,
        };
        let mut run = RunDir::create(paths, &id, &snap.meta.image)
            .map_err(|e| SandboxError::io(format!("create run directory for {id}"), e))?;
        let mut vm_cfg = crate::snapshot::restore_config(
            snap,
            &run.dir,
            crate::snapshot::next_disk(&run.disk_dir()),
            cfg.die_with_parent,
        );
        vm_cfg.volumes = match take_volumes(paths, &id, cfg).await {
            Ok(v) => v,
            Err(e) => {
                run.remove();
                return Err(e);
            }
        };
        let max_procs = cfg.max_procs;
        let boot_timeout = cfg.boot_timeout;
        let grow_to = disk_growth(snap, cfg.disk_mib)?;
        let copy = Copy {
            id: &id,
            resumed,
            max_procs,
            boot_timeout,
            grow_to,
            started,
        };
        let restored = match start_copy(snap, &vm_cfg, &mut run, copy).await {
            Ok((mut vm, client)) => match mount_volumes(&client, cfg).await {
                Ok(()) => Ok((vm, client)),
                Err(e) => {
                    vm.kill().await;
                    Err(e)
                }
            },
            Err(e) => Err(SandboxError::from(e)),
        };
        let (vm, client) = match restored {
            Ok(v) => v,
            Err(e) => {
                run.remove();
                give_back(paths, &id, cfg);
                return Err(e);
            }
        };
        let info = SandboxInfo {
            id,
            image: snap.meta.image.clone(),
            accel: snap.meta.accel.clone(),
            cpus: snap.meta.cpus,
            memory_mib: snap.meta.memory_mib,
            guest_kernel: client.hello.kernel.clone(),
            qemu_pid: vm.pid,
            boot_ms: started.elapsed().as_millis() as u64,
            origin: Some(origin),
            max_procs,
            kernel: snap.meta.kernel.clone(),
            initramfs: snap.meta.initramfs.clone(),
            disk_dirs: reboot::disk_dirs(snap, &run.record.id),
            volumes: cfg.volumes.clone(),
        };
        let sb = Sandbox::assemble(info, image, vm, client, run);
        sb.client.net.set_packages(cfg.packages.clone());
        if let Err(e) = sb.set_network(cfg.network.clone()).await {
            sb.destroy().await;
            give_back(paths, &sb.info.id, cfg);
            return Err(e);
        }
        Ok(sb)
    }

    /// Saves this running sandbox as an immutable snapshot (memory, processes, disk); it
    /// keeps running unless `stay_paused`. The pause it saw is in the snapshot's metadata.
    /// `durable`: synced to the disk before it is published (see [`crate::snapshot::publish`]).
    pub async fn snapshot(
        &self,
        paths: &Paths,
        name: &str,
        stay_paused: bool,
        durable: bool,
    ) -> Result<Snapshot, SandboxError> {
        use crate::snapshot::{self as snap, SnapshotError, SnapshotKind};
        if !snap::valid_name(name) {
            return Err(SnapshotError::BadName(name.into()).into());
        }
        let started = Instant::now();
        let root = paths.snapshots();
        let dest = root.join(name);
        if dest.exists() {
            return Err(SnapshotError::Exists(name.into()).into());
        }
        // One save at a time per sandbox, and never while it is being destroyed.
        let _vm = self.vm.lock().await;
        let tmp = root.join(
            snap::tmp_name().map_err(|e| SandboxError::io("name a snapshot's directory", e))?,
        );
        std::fs::create_dir_all(&tmp)
            .map_err(|e| SandboxError::io(format!("create {}", tmp.display()), e))?;
        let (qmp, devstate, new_overlay) = {
            let r = self.run_dir();
            (
                r.dir.join(vm::QMP_SOCKET),
                r.dir.join("devstate.tmp"),
                snap::next_disk(&r.disk_dir()),
            )
        };
        let pid = self.info.qemu_pid;
        let dir = tmp.clone();
        // A snapshot that is not synced (a fork's) keeps its RAM in memory when there is room.
        let in_memory = if durable {
            None
        } else {
            crate::fastram::place(paths)
        };
        let saved = tokio::task::spawn_blocking(move || {
            let ram = crate::ram::GuestRam::of_qemu(pid)
                .map_err(|e| VmError::io("find the VM's RAM", e))?;
            let target = snap::SaveTarget {
                dir: &dir,
                devstate: &devstate,
                new_overlay: &new_overlay,
                in_memory: in_memory.as_ref(),
            };
            snap::save_running(&qmp, &ram, &target, stay_paused)
        })
        .await
        .map_err(|e| VmError::io("save the sandbox", std::io::Error::other(e)))
        .and_then(|r| r);
        let (frozen, timing) = match saved {
            Ok(v) => v,
            Err(e) => {
                let _ = crate::fastram::remove_snapshot_dir(&tmp);
                return Err(e.into());
            }
        };
        let (copied, paused) = (timing.paused_copy_bytes >> 20, timing.pause_ms);
        tracing::debug!("snapshot {name}: {copied} MiB copied while paused {paused:.1} ms");
        let finish = || -> Result<Snapshot, SnapshotError> {
            let mut meta = snap::SnapshotMeta {
                state: snap::StateFormat::Devices,
                pause_ms: Some(timing.pause_ms),
                memory_bytes: snap::allocated_bytes(&tmp.join(snap::MEM)),
                // The frozen overlay stays where it is (under disks/), where the sandbox's new
                // overlay and any later snapshot's find it; this snapshot keeps that directory.
                disk: Some(frozen.clone()),
                disk_dirs: self.info.disk_dirs.clone(),
                ..snap::new_meta(
                    name.to_string(),
                    SnapshotKind::Snapshot,
                    &self.shape(),
                    self.info.image.clone(),
                    self.info.accel.clone(),
                    self.info.origin_snapshot().map(str::to_string),
                    Some(self.info.id.clone()),
                )
            };
            meta.took_ms = started.elapsed().as_millis() as u64;
            // What it wrote on its parent's RAM: a node holding the parent needs only that.
            timing.written.save(&tmp).map_err(|e| SnapshotError::Io {
                what: "record the written pages".into(),
                source: e,
            })?;
            snap::publish(&tmp, &dest, &meta, durable)
        };
        match finish() {
            Ok(s) => Ok(s),
            Err(e) => {
                let _ = crate::fastram::remove_snapshot_dir(&tmp);
                Err(e.into())
            }
        }
    }

    /// What a VM of this sandbox's shape is (kernel, sizes, accelerator), for its snapshots.
    fn shape(&self) -> VmConfig {
        VmConfig {
            accel: self.info.accel.accel,
            cpus: self.info.cpus,
            memory_mib: self.info.memory_mib,
            kernel: self.info.kernel.clone(),
            initramfs: self.info.initramfs.clone(),
            disk: Default::default(),
            run_dir: Default::default(),
            die_with_parent: false,
            max_procs: self.info.max_procs,
            memory: vm::Memory::Anonymous,
            start: vm::Start::Boot,
            volumes: Vec::new(),
        }
    }

    fn assemble(
        info: SandboxInfo,
        image: Image,
        vm: Vm,
        client: AgentClient,
        run: RunDir,
    ) -> Sandbox {
        let disk =
            crate::diskwatch::DiskWatch::spawn(run.dir.join(vm::EVENTS_SOCKET), run.disk_dir());
        client.net.set_name(&info.id);
        Sandbox {
            disk,
            info,
            image,
            console: vm.console.clone(),
            vm: tokio::sync::Mutex::new(vm),
            client,
            run: std::sync::Mutex::new(run),
            destroyed: false.into(),
        }
    }

    /// Unmounts its volumes in the guest (before a snapshot: a volume is never in one).
    pub async fn unmount_volumes(&self) -> Result<(), SandboxError> {
        if self.info.volumes.is_empty() {
            return Ok(());
        }
        let paths = self.info.volumes.iter().map(|v| v.path.clone()).collect();
        self.client.unmount(paths).await.map_err(|e| match e {
            AgentError::Refused { message, .. } => crate::error::VolumeError::InUse {
                name: self
                    .info
                    .volumes
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                holders: format!(
                    "a snapshot of {} holds no volume, so they are unmounted while it is saved, and {message}",
                    self.info.id
                ),
            }
            .into(),
            e => SandboxError::from(e),
        })
    }

    /// Mounts its volumes again (after a snapshot).
    pub async fn remount_volumes(&self) -> Result<(), SandboxError> {
        if self.info.volumes.is_empty() {
            return Ok(());
        }
        Ok(self.client.mount(guest_mounts(&self.info.volumes)).await?)
    }

    pub fn info(&self) -> &SandboxInfo {
        &self.info
    }

    pub fn client(&self) -> &AgentClient {
        &self.client
    }

    /// Refuses, in words, once the host has stopped talking to the guest (it broke the agent
    /// protocol: see [`AgentClient::failure`]), and while the sandbox is paused by a full host
    /// disk (see [`crate::diskwatch`]): a command would wait for the space to come back.
    pub fn check_usable(&self) -> Result<(), SandboxError> {
        if let Some(why) = self.client.failure() {
            return Err(SandboxError::Agent(AgentError::Failed(why)));
        }
        match self.disk.held() {
            None => Ok(()),
            Some(dir) => Err(SandboxError::HostDiskFull {
                free_mib: crate::diskwatch::free_bytes(&dir) >> 20,
                dir,
            }),
        }
    }

    /// Whether a full host disk holds the sandbox now.
    pub fn check_disk_held(&self) -> bool {
        self.disk.held().is_some()
    }

    /// The last `lines` lines of the guest's console.
    pub fn console_tail(&self, lines: usize) -> String {
        self.console.tail(lines)
    }

    /// Starts a command with the image's environment under the request's. A command with a
    /// timeout is also watched from the host: should the guest not report it killed within a
    /// grace period after the timeout, the sandbox is treated as broken.
    pub async fn exec(&self, mut spec: ExecSpec) -> Result<SandboxExecution, SandboxError> {
        self.check_usable()?;
        let mut env = env_pairs(&self.image.meta.env);
        if !self.client.net.policy().is_off() {
            let proxy = format!("http://127.0.0.1:{}", crate::net::PROXY_PORT);
            for k in ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"] {
                env.push((k.into(), proxy.clone()));
            }
            // The guest's own addresses, 0.0.0.0 among them (`curl http://0.0.0.0:PORT`
            // reaches a server of the guest's; through the proxy it would be refused).
            for k in ["no_proxy", "NO_PROXY"] {
                env.push((k.into(), "localhost,127.0.0.1,::1,0.0.0.0".into()));
            }
            let secrets = self.client.net.secrets();
            let packages = self.client.net.packages().is_some();
            if crate::net::host_ca_bundle().is_some() || secrets.is_some() || packages {
                for k in crate::net::CA_ENV {
                    env.push(((*k).into(), crate::net::GUEST_CA.into()));
                }
            }
            // The secrets' placeholders, never their values.
            env.extend(secrets.iter().flat_map(|s| s.env()));
        }
        env.append(&mut spec.env);
        spec.env = env;
        // A registry image's WorkingDir and User, unless the request names its own.
        if spec.cwd.is_none() {
            spec.cwd.clone_from(&self.image.meta.workdir);
        }
        if spec.user.is_none() {
            spec.user.clone_from(&self.image.meta.user);
        }
        let deadline = spec
            .timeout_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms) + HOST_GRACE);
        let timeout_secs = spec.timeout_ms.unwrap_or(0) / 1000;
        let inner = match self.client.exec(spec).await {
            Ok(i) => i,
            Err(e) => return Err(died(e, &self.console, self.client.failure()).await),
        };
        Ok(SandboxExecution {
            inner,
            deadline,
            timeout_secs,
            console: self.console.clone(),
        })
    }

    /// Command `id` of the connection before a sleep, running on in the guest that woke:
    /// what it prints from now on, and its end.
    pub fn adopt_command(&self, id: u32) -> SandboxExecution {
        SandboxExecution {
            inner: self.client.adopt(id),
            deadline: None,
            timeout_secs: 0,
            console: self.console.clone(),
        }
    }

    /// Runs a command to completion and collects its output.
    pub async fn run(&self, spec: ExecSpec) -> Result<Output, SandboxError> {
        let mut ex = self.exec(spec).await?;
        let mut out = Output::default();
        while !out.absorb(ex.next().await?) {}
        Ok(out)
    }

    fn run_dir(&self) -> std::sync::MutexGuard<'_, RunDir> {
        self.run.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the sandbox as the daemon's (its record is in the daemon's state database), so
    /// that no sweep removes it while the daemon is down; written and synced before it returns.
    pub fn set_daemon_owned(&self, owned: bool) -> Result<(), SandboxError> {
        let mut run = self.run_dir();
        run.record.daemon = if owned {
            crate::runstate::DaemonMark::Yes
        } else {
            crate::runstate::DaemonMark::No
        };
        run.save()
            .map_err(|e| SandboxError::io(format!("record sandbox {}", self.info.id), e))
    }

    /// Takes over a sandbox whose daemon died: checks that its QEMU is still the one recorded,
    /// reconnects to its console and its agent. `None` when it is gone (its files are removed).
    pub async fn adopt(
        paths: &Paths,
        dir: &std::path::Path,
        record: &crate::runstate::DaemonRecord,
    ) -> Option<Sandbox> {
        let run = RunDir::adopt(dir)?;
        let info: SandboxInfo = serde_json::from_value(record.info.clone()).ok()?;
        let image = ImageStore::new(paths)
            .resolve(&run.record.image.parse().ok()?)
            .ok()?;
        let cfg = VmConfig {
            accel: info.accel.accel,
            cpus: info.cpus,
            memory_mib: info.memory_mib,
            kernel: Default::default(),
            initramfs: Default::default(),
            disk: run.dir.join("disk.qcow2"),
            run_dir: run.dir.clone(),
            die_with_parent: false,
            max_procs: 0,
            memory: vm::Memory::Anonymous,
            start: vm::Start::Boot,
            volumes: Vec::new(),
        };
        let mut vm = Vm::adopt(&cfg, run.record.qemu_pid?, run.record.qemu_start?)?;
        // A guest stopped by a full host disk cannot answer its agent until space is back: it
        // is adopted as it is (its disk watcher resumes it), never taken for dead.
        let qmp = cfg.qmp_socket();
        let status = tokio::task::spawn_blocking(move || {
            let mut q = crate::vm::qmp::Qmp::connect(&qmp, Duration::from_secs(5))?;
            let status = q.status()?;
            // A daemon that died while it saved the sandbox left it paused: it runs again.
            if status == "paused" {
                let _ = q.execute("cont", serde_json::json!({}));
            }
            Ok::<_, VmError>(status)
        })
        .await;
        if let Ok(Ok(s)) = &status {
            if s == "io-error" {
                match AgentClient::connect_stopped(&cfg.agent_socket()).await {
                    Ok(client) => {
                        let held = run.disk_dir();
                        let sb = Sandbox::assemble(info, image, vm, client, run);
                        sb.disk.set(Some(held));
                        return Some(sb);
                    }
                    Err(e) => tracing::warn!("{}: its agent's socket: {e}", info.id),
                }
            }
        }
        let client = match tokio::time::timeout(
            Duration::from_secs(15),
            AgentClient::connect(&cfg.agent_socket()),
        )
        .await
        {
            Ok(Ok(c)) => c,
            _ => {
                vm.kill().await;
                return None;
            }
        };
        Some(Sandbox::assemble(info, image, vm, client, run))
    }

    /// Boots `image` cold, an image that need not be in the store (a build's stage).
    pub async fn boot_unlisted(
        paths: &Paths,
        cfg: &SandboxConfig,
        image: Image,
    ) -> Result<Sandbox, SandboxError> {
        runstate::sweep(paths);
        let started = Instant::now();
        vm::program::require()?;
        let kit = boot_kit(paths, &image, cfg.accel).await?;
        let sb = Sandbox::cold_boot(paths, cfg, image, kit, started).await?;
        sb.client.net.set_packages(cfg.packages.clone());
        if let Err(e) = sb.set_network(cfg.network.clone()).await {
            sb.destroy().await;
            return Err(e);
        }
        Ok(sb)
    }

    /// Writes the sandbox's root disk, flattened (its image and every write since), to `dest`
    /// as a raw file, once the guest has flushed its writes and its VM has stopped; then
    /// removes the sandbox.
    pub async fn export_root(&self, dest: &std::path::Path) -> Result<(), SandboxError> {
        let flushed = self
            .run(ExecSpec {
                program: forkbox_protocol::Program::Argv(vec!["sync".into()]),
                cwd: Some("/".into()),
                env: vec![],
                timeout_ms: Some(300_000),
                stdin: false,
                tty: None,
                user: None,
            })
            .await;
        let result = match flushed {
            Ok(out) if out.status.is_some_and(|s| s.as_shell_code() == 0) => {
                // The guest's `sync` is not enough: QEMU can still hold what it has not
                // written of the qcow2 overlay (its tables of where each written cluster is).
                // Stopping the VM flushes every block device; killing it right after the sync
                // lost a whole build stage's files on a loaded host (3 builds of 5; none of 4
                // with the stop).
                let qmp = self.run_dir().dir.join(vm::QMP_SOCKET);
                let stopped = tokio::task::spawn_blocking(move || {
                    let mut q = crate::vm::qmp::Qmp::connect(&qmp, Duration::from_secs(10))?;
                    q.execute("stop", serde_json::json!({})).map(drop)
                })
                .await
                .map_err(|e| SandboxError::io("stop the VM", std::io::Error::other(e)))
                .and_then(|r| r.map_err(SandboxError::from));
                self.vm.lock().await.kill().await;
                match stopped {
                    Ok(()) => {
                        let disk = self.run_dir().disk_dir().join("disk.qcow2");
                        convert_raw(&disk, dest).await
                    }
                    Err(e) => Err(e),
                }
            }
            Ok(out) => Err(SandboxError::io(
                "flush the guest's writes",
                std::io::Error::other(format!("`sync` ended with {:?}", out.status)),
            )),
            Err(e) => Err(e),
        };
        self.destroy().await;
        result
    }

    /// Stops the VM and removes everything the sandbox had on the host. Idempotent.
    pub async fn destroy(&self) {
        self.vm.lock().await.kill().await;
        self.run_dir().remove();
        self.destroyed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// `qemu-img convert` of a disk chain into one raw file (sparse where the disk is zero).
async fn convert_raw(disk: &std::path::Path, dest: &std::path::Path) -> Result<(), SandboxError> {
    let qemu_img = crate::setup::require("qemu-img")?;
    let out = tokio::process::Command::new(qemu_img)
        .args(["convert", "-q", "-O", "raw"])
        .arg(disk)
        .arg(dest)
        .output()
        .await
        .map_err(|e| SandboxError::io("run qemu-img convert", e))?;
    if !out.status.success() {
        return Err(SandboxError::io(
            "flatten the root disk",
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        ));
    }
    Ok(())
}

/// Takes the volumes `cfg` asks for, for sandbox `id`: their disks in their slots. A sandbox
/// waking takes again what it held (its holds stood while it slept). Off the runtime's
/// threads: it may wait for another process's lock, and checks the file system of a volume no
/// sandbox had.
async fn take_volumes(
    paths: &Paths,
    id: &str,
    cfg: &SandboxConfig,
) -> Result<Vec<vm::VolumeDisk>, SandboxError> {
    if cfg.volumes.is_empty() {
        return Ok(Vec::new());
    }
    let (paths, id, cfg) = (paths.clone(), id.to_string(), cfg.clone());
    tokio::task::spawn_blocking(move || take_volumes_now(&paths, &id, &cfg))
        .await
        .map_err(|e| SandboxError::io("take the volumes", std::io::Error::other(e)))?
}

fn take_volumes_now(
    paths: &Paths,
    id: &str,
    cfg: &SandboxConfig,
) -> Result<Vec<vm::VolumeDisk>, SandboxError> {
    let store = crate::volumes::VolumeStore::new(paths);
    let mut disks = Vec::new();
    for v in &cfg.volumes {
        match store.take(&v.name, id, v.read_only, !cfg.volumes_in_guest) {
            Ok(disk) => disks.push(vm::VolumeDisk {
                slot: v.slot,
                disk,
                read_only: v.read_only,
            }),
            Err(e) => {
                give_back(paths, id, cfg);
                return Err(e.into());
            }
        }
    }
    Ok(disks)
}

/// Gives back the volumes `cfg` took for sandbox `id`, which is not made after all (a sandbox
/// waking keeps its holds: it still sleeps).
fn give_back(paths: &Paths, id: &str, cfg: &SandboxConfig) {
    if !cfg.volumes_in_guest {
        let names = cfg.volumes.iter().map(|v| v.name.as_str());
        crate::volumes::VolumeStore::new(paths).release(id, names);
    }
}

/// Has the guest mount the volumes `cfg` asks for (none for a sandbox waking: its guest has
/// them mounted).
async fn mount_volumes(client: &AgentClient, cfg: &SandboxConfig) -> Result<(), SandboxError> {
    if cfg.volumes_in_guest || cfg.volumes.is_empty() {
        return Ok(());
    }
    Ok(client.mount(guest_mounts(&cfg.volumes)).await?)
}

fn guest_mounts(volumes: &[forkbox_api::MountedVolume]) -> Vec<forkbox_protocol::GuestMount> {
    volumes
        .iter()
        .map(|v| forkbox_protocol::GuestMount {
            serial: vm::slot_serial(v.slot),
            path: v.path.clone(),
            read_only: v.read_only,
        })
        .collect()
}

async fn died(e: AgentError, console: &vm::Console, failure: Option<String>) -> SandboxError {
    if let Some(why) = failure {
        return SandboxError::Agent(AgentError::Failed(why));
    }
    match e {
        AgentError::Disconnected => SandboxError::Died {
            error: e,
            console_tail: console.settled_tail(20).await,
        },
        other => SandboxError::Agent(other),
    }
}

/// Extra time the host gives the guest to report a timed-out command killed.
pub const HOST_GRACE: Duration = Duration::from_secs(15);

impl Drop for Sandbox {
    fn drop(&mut self) {
        if !self.destroyed.load(std::sync::atomic::Ordering::SeqCst) {
            // The QEMU child is killed on drop (kill_on_drop); remove the files now.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.info.qemu_pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            self.run_dir().remove();
        }
    }
}

/// A command running in a sandbox.
pub struct SandboxExecution {
    inner: Execution,
    deadline: Option<Instant>,
    timeout_secs: u64,
    console: vm::Console,
}

impl SandboxExecution {
    /// Its request's number on the agent connection.
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// Takes over `before`'s deadline, less the time its sandbox slept since `lost_at` (the
    /// guest's clock stood still meanwhile).
    pub fn carry_on(&mut self, before: &SandboxExecution, lost_at: Instant) {
        self.deadline = before
            .deadline
            .map(|d| Instant::now() + d.saturating_duration_since(lost_at));
        self.timeout_secs = before.timeout_secs;
    }

    pub async fn next(&mut self) -> Result<ExecEvent, SandboxError> {
        let ev = match self.deadline {
            None => self.inner.next().await,
            Some(d) => match tokio::time::timeout_at(d.into(), self.inner.next()).await {
                Ok(ev) => ev,
                Err(_) => {
                    return Err(SandboxError::Unresponsive {
                        secs: self.timeout_secs,
                    })
                }
            },
        };
        match ev {
            Ok(ev) => Ok(ev),
            Err(e) => Err(died(e, &self.console, self.inner.failure()).await),
        }
    }

    async fn checked(&self, r: Result<(), AgentError>) -> Result<(), SandboxError> {
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(died(e, &self.console, self.inner.failure()).await),
        }
    }

    pub async fn stdin(&self, data: Vec<u8>) -> Result<(), SandboxError> {
        self.checked(self.inner.stdin(data).await).await
    }

    pub async fn close_stdin(&self) -> Result<(), SandboxError> {
        self.checked(self.inner.close_stdin().await).await
    }

    pub async fn signal(&self, sig: i32) -> Result<(), SandboxError> {
        self.checked(self.inner.signal(sig).await).await
    }

    /// A new size for the terminal of a command run on one.
    pub async fn resize(&self, size: forkbox_protocol::WinSize) -> Result<(), SandboxError> {
        self.checked(self.inner.resize(size).await).await
    }
}
