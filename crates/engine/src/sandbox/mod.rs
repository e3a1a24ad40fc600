//! A sandbox: one microVM booted from an image, with its own disk overlay, and the agent
//! connection to drive it.

// What a live sandbox is made of: its agent connection, transfers, network tunnels, disk watch.
pub mod activity;
pub mod client;
pub mod diskwatch;
pub mod files;
pub mod handshakes;
pub mod net;
pub mod secrets;
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
    /// set and its identity changed before it is returned.
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
            disk_dirs: snap
                .meta
                .disk_dirs
                .iter()
                .cloned()
                .chain([run.record.id.clone()])
                .fold(Vec::new(), |mut v, d| {
                    if !v.contains(&d) {
                        v.push(d);
                    }
                    v
                }),
            volumes: cfg.volumes.clone(),
        };
        let sb = Sandbox::assemble(info, image, vm, client, run);
        if let Err(e) = sb.set_network(cfg.network.clone()).await {
            sb.destroy().await;
            give_back(paths, &sb.info.id, cfg);
            return Err(e);
        }
        Ok(sb)
    }

    /// Applies a network policy (see [`crate::net`]): from now on the host opens the guest
    /// proxy's tunnels by it, and commands get the proxy in their environment.
    pub async fn set_network(&self, policy: crate::net::NetworkPolicy) -> Result<(), SandboxError> {
        policy.validate()?;
        let on = !policy.is_off();
        if let Err(e) = self.client.set_network(policy).await {
            return Err(died(e, &self.console, self.client.failure()).await);
        }
        // With a network, the guest trusts what the host trusts (a host behind a
        // TLS-inspecting proxy reaches registries through it; the bundle is public).
        if on {
            if let Some(bundle) = crate::net::host_ca_bundle().and_then(|p| std::fs::read(p).ok()) {
                if let Err(e) = self
                    .client
                    .write_file(crate::net::GUEST_CA, &bundle, 0o644)
                    .await
                {
                    return Err(died(e, &self.console, self.client.failure()).await);
                }
            }
        }
        Ok(())
    }

    /// Gives the sandbox `secrets` (see [`crate::secrets`]): its connections to their hosts
    /// end at a listener of its own, and the guest trusts the sandbox's CA (with the host's
    /// bundle) from now on. Call after [`Sandbox::set_network`] with a policy that allows the
    /// hosts.
    pub async fn set_secrets(
        &self,
        secrets: std::sync::Arc<crate::secrets::Secrets>,
    ) -> Result<(), SandboxError> {
        let proxy = crate::secrets::SecretProxy::start(secrets.clone())
            .await
            .map_err(|e| SandboxError::io("listen for the secrets' connections", e))?;
        let mut bundle = crate::net::host_ca_bundle()
            .and_then(|p| std::fs::read(p).ok())
            .unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(secrets.ca_pem().as_bytes());
        if let Err(e) = self
            .client
            .write_file(crate::net::GUEST_CA, &bundle, 0o644)
            .await
        {
            return Err(died(e, &self.console, self.client.failure()).await);
        }
        // And the guest's own store, for programs that read none of the variables (a public
        // certificate; an image without the store keeps the variables alone).
        let pem = secrets.ca_pem().as_bytes();
        if let Ok(mut store) = self.client.read_file(GUEST_STORE).await {
            if !store.windows(pem.len()).any(|w| w == pem) {
                if !store.is_empty() && !store.ends_with(b"\n") {
                    store.push(b'\n');
                }
                store.extend_from_slice(pem);
                if let Err(e) = self.client.write_file(GUEST_STORE, &store, 0o644).await {
                    tracing::info!(
                        "{}: the sandbox CA is not in the guest's store: {e}",
                        self.info.id
                    );
                }
            }
        }
        self.client
            .net
            .set_secrets(Some(std::sync::Arc::new(proxy)));
        Ok(())
    }

    /// The secrets in force.
    pub fn secrets(&self) -> Option<std::sync::Arc<crate::secrets::Secrets>> {
        self.client.net.secrets()
    }

    /// The network policy in force.
    pub fn network(&self) -> crate::net::NetworkPolicy {
        self.client.net.policy()
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
            for k in ["no_proxy", "NO_PROXY"] {
                env.push((k.into(), "localhost,127.0.0.1,::1".into()));
            }
            let secrets = self.client.net.secrets();
            if crate::net::host_ca_bundle().is_some() || secrets.is_some() {
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

/// What booting an image needs besides the image: kernel, initramfs (agent + modules) and the
/// accelerator. Worked out once per (home, kernel, accelerator choice) and agent binary, since
/// it reads and hashes the agent.
#[derive(Debug, Clone)]
pub struct BootKit {
    pub kernel: std::path::PathBuf,
    pub initramfs: std::path::PathBuf,
    pub accel: AccelDecision,
}

type KitKey = (std::path::PathBuf, String, AccelChoice);
type KitEntry = (std::path::PathBuf, Option<std::time::SystemTime>, BootKit);

pub async fn boot_kit(
    paths: &Paths,
    image: &Image,
    choice: AccelChoice,
) -> Result<BootKit, SandboxError> {
    static KITS: std::sync::Mutex<Vec<(KitKey, KitEntry)>> = std::sync::Mutex::new(Vec::new());
    let key: KitKey = (
        paths.home().to_path_buf(),
        image.meta.kernel.clone(),
        choice,
    );
    let mtime = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    {
        let kits = KITS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, (agent, at, kit))) = kits.iter().find(|(k, _)| *k == key) {
            if mtime(agent) == *at && kit.initramfs.is_file() {
                return Ok(kit.clone());
            }
        }
    }
    let kernel = Kernel::find(paths, &image.meta.kernel).ok_or_else(|| {
        crate::error::SetupError::BadKernel {
            release: image.meta.kernel.clone(),
            message: format!(
                "image {} boots it, but it is not in {}",
                image.reference(),
                paths.kernels().display()
            ),
        }
    })?;
    let (agent_path, agent) = crate::agent_bin::locate()?;
    let initramfs = kernel::initramfs(paths, &kernel, &agent)?;
    let accel = vm::decide(paths, choice, &kernel.vmlinuz(), &initramfs).await?;
    let kit = BootKit {
        kernel: kernel.vmlinuz(),
        initramfs,
        accel,
    };
    let mut kits = KITS.lock().unwrap_or_else(|p| p.into_inner());
    kits.retain(|(k, _)| *k != key);
    let at = mtime(&agent_path);
    kits.push((key, (agent_path, at, kit.clone())));
    Ok(kit)
}

/// Starts QEMU for `cfg` on a new overlay over `base` and waits for the agent; `spawned` runs
/// right after QEMU starts (to record it). On failure QEMU is gone and the error says why.
async fn boot(
    base: &std::path::Path,
    cfg: &VmConfig,
    boot_timeout: Duration,
    spawned: impl FnOnce(&Vm) -> Result<(), VmError>,
) -> Result<(Vm, AgentClient), VmError> {
    vm::create_overlay(base, &cfg.disk).await?;
    let mut vm = Vm::spawn(cfg)?;
    if let Err(e) = spawned(&vm) {
        vm.kill().await;
        return Err(e);
    }
    enum Failed {
        Agent(AgentError),
        Timeout,
        Exited(String, String),
    }
    let agent_socket = cfg.agent_socket();
    let outcome = tokio::select! {
        c = tokio::time::timeout(boot_timeout, AgentClient::connect(&agent_socket)) => match c {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(Failed::Agent(e)),
            Err(_) => Err(Failed::Timeout),
        },
        (status, qemu_stderr) = vm.wait_exit() => Err(Failed::Exited(status, qemu_stderr)),
    };
    let failed = match outcome {
        Ok(client) => return Ok((vm, client)),
        Err(f) => f,
    };
    vm.kill().await;
    let console_tail = vm.console.settled_tail(20).await;
    Err(match failed {
        Failed::Agent(e) => VmError::Agent(e),
        Failed::Timeout => VmError::BootTimeout {
            secs: boot_timeout.as_secs(),
            accel: cfg.accel.to_string(),
            console_tail,
        },
        Failed::Exited(status, qemu_stderr) => VmError::DiedDuringBoot {
            status,
            qemu_stderr: if qemu_stderr.is_empty() {
                "(nothing)".into()
            } else {
                qemu_stderr
            },
            console_tail,
        },
    })
}

/// The image's template for this size, made now if there is none (one boot, a few seconds
/// under TCG; concurrent callers wait for the one that builds it).
pub async fn ensure_template(
    paths: &Paths,
    cfg: &SandboxConfig,
    image: &Image,
    kit: &BootKit,
) -> Result<Snapshot, SandboxError> {
    use crate::snapshot::{self as snap, SnapshotKind};
    let key = template_key(cfg, image, kit);
    let root = paths.templates();
    let dest = root.join(&key);
    if let Some(t) = Snapshot::load(&dest) {
        return Ok(t);
    }
    std::fs::create_dir_all(&root)
        .map_err(|e| SandboxError::io(format!("create {}", root.display()), e))?;
    let lock = lock_template(root.join(format!(".{key}.lock"))).await?;
    if let Some(t) = Snapshot::load(&dest) {
        return Ok(t);
    }
    snap::SnapshotStore::sweep_dir(&root);
    let started = Instant::now();
    // Short: QEMU's sockets go in it, and a socket path has at most 107 bytes.
    let tmp = root
        .join(snap::tmp_name().map_err(|e| SandboxError::io("name a template's directory", e))?);
    crate::tree::discard_tree(&tmp);
    std::fs::create_dir_all(&tmp)
        .map_err(|e| SandboxError::io(format!("create {}", tmp.display()), e))?;
    let vm_cfg = VmConfig {
        accel: kit.accel.accel,
        cpus: cfg.cpus,
        memory_mib: cfg.memory_mib,
        kernel: kit.kernel.clone(),
        initramfs: kit.initramfs.clone(),
        disk: tmp.join(snap::DISK),
        run_dir: tmp.clone(),
        die_with_parent: true,
        max_procs: cfg.max_procs,
        memory: vm::Memory::SharedFile(tmp.join(snap::MEM)),
        start: vm::Start::Boot,
        volumes: Vec::new(),
    };
    let built = async {
        let (mut vm, client) = boot(&image.rootfs(), &vm_cfg, cfg.boot_timeout, |_| Ok(())).await?;
        let (qmp, state) = (vm_cfg.qmp_socket(), tmp.join(snap::VMSTATE));
        let saved = tokio::task::spawn_blocking(move || snap::save_shared(&qmp, &state))
            .await
            .map_err(|e| VmError::io("save the template", std::io::Error::other(e)))
            .and_then(|r| r);
        snap::reap(&mut vm, Duration::from_secs(5)).await;
        drop(client);
        saved
    }
    .await;
    let published = built.map_err(SandboxError::from).and_then(|()| {
        for f in [
            "agent.sock",
            vm::QMP_SOCKET,
            vm::EVENTS_SOCKET,
            "console.sock",
            "console.log",
            "qemu.stderr",
        ] {
            let _ = std::fs::remove_file(tmp.join(f));
        }
        let mut meta = snap::new_meta(
            key.clone(),
            SnapshotKind::Template,
            &vm_cfg,
            image.reference(),
            kit.accel.clone(),
            None,
            None,
        );
        meta.took_ms = started.elapsed().as_millis() as u64;
        meta.memory_bytes = snap::allocated_bytes(&tmp.join(snap::MEM));
        Ok(snap::publish(&tmp, &dest, &meta, true)?)
    });
    drop(lock);
    if published.is_err() {
        crate::tree::discard_tree(&tmp);
    }
    published
}

/// The template's key: the image's build (not only its name: a version number comes back
/// after its image is removed, and a template of the old build would show the new disk the old
/// one's memory), the VM's size and process cap, the initramfs and the accelerator.
fn template_key(cfg: &SandboxConfig, image: &Image, kit: &BootKit) -> String {
    let build = format!(
        "{}#{}#{}",
        image.reference(),
        image.meta.created_unix,
        std::fs::metadata(image.rootfs())
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                format!("{}.{}", m.mtime(), m.mtime_nsec())
            })
            .unwrap_or_default()
    );
    crate::snapshot::template_key(
        &build,
        cfg.cpus,
        cfg.memory_mib,
        cfg.max_procs,
        &kit.initramfs,
        &kit.accel,
    )
}

/// Holds the lock of a template being made (waited for off the runtime's threads).
async fn lock_template(
    path: std::path::PathBuf,
) -> Result<nix::fcntl::Flock<std::fs::File>, SandboxError> {
    tokio::task::spawn_blocking(move || {
        let f = std::fs::File::create(&path)?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| std::io::Error::from(e))
    })
    .await
    .map_err(|e| SandboxError::io("lock the template", std::io::Error::other(e)))?
    .map_err(|e| SandboxError::io("lock the template", e))
}

/// What a restore makes of a copy: its id and process cap, how long its start may take, the
/// size its root disk grows to, and when the restore started (for the timings in the log).
struct Copy<'a> {
    id: &'a str,
    max_procs: u32,
    boot_timeout: Duration,
    grow_to: Option<u64>,
    started: Instant,
}

/// The size in bytes a copy's root disk grows to when `disk_mib` asks for more than the
/// snapshot's; refused when it asks for less.
fn disk_growth(snap: &Snapshot, disk_mib: Option<u64>) -> Result<Option<u64>, SandboxError> {
    let Some(mib) = disk_mib else {
        return Ok(None);
    };
    let want = mib << 20;
    let have = crate::snapshot::virtual_size(&snap.disk())
        .map_err(|e| SandboxError::io(format!("read the size of {}", snap.disk().display()), e))?;
    if want < have {
        return Err(SandboxError::DiskTooSmall {
            asked_mib: mib,
            minimum_mib: have.div_ceil(1 << 20),
        });
    }
    Ok((want > have).then_some(want))
}

/// Starts the copy's QEMU on a new overlay, loads the snapshot's state and gives the guest its
/// fresh identity; a copy that dies or hangs meanwhile is killed and said plainly.
async fn start_copy(
    snap: &Snapshot,
    vm_cfg: &crate::vm::VmConfig,
    run: &mut RunDir,
    copy: Copy<'_>,
) -> Result<(Vm, AgentClient), VmError> {
    let Copy {
        id,
        max_procs,
        boot_timeout,
        grow_to,
        started,
    } = copy;
    let mark = |what: &str| {
        tracing::debug!(
            "restore {id}: {what} at {:.1} ms",
            started.elapsed().as_secs_f64() * 1000.0
        );
    };

    vm::create_overlay(&snap.disk(), &vm_cfg.disk).await?;
    mark("overlay");
    let mut vm = Vm::spawn(vm_cfg)?;
    mark("spawned");
    run.record.qemu_pid = Some(vm.pid);
    run.record.qemu_start = crate::procfs::process_start(vm.pid);
    run.save().map_err(|e| VmError::io("record the VM", e))?;
    let ready = async {
        let (qmp, state) = (vm_cfg.qmp_socket(), snap.vmstate());
        // A busy host can keep a starting QEMU from its CPU for seconds (10 s were seen
        // beside two busy loops and three other restores): it gets as long as a boot.
        tokio::task::spawn_blocking(move || {
            crate::snapshot::load_state(&qmp, &state, grow_to, boot_timeout)
        })
        .await
        .map_err(|e| VmError::io("load the device state", std::io::Error::other(e)))??;
        mark("state loaded, running");
        // A busy guest on a busy host can take a while to answer; as long as a boot.
        let client =
            tokio::time::timeout(boot_timeout, AgentClient::connect(&vm_cfg.agent_socket()))
                .await
                .map_err(|_| VmError::BootTimeout {
                    secs: boot_timeout.as_secs(),
                    accel: vm_cfg.accel.to_string(),
                    console_tail: "(restored from a snapshot; the agent did not answer)".into(),
                })??;
        mark("agent hello");
        let mut refresh = fresh_identity(id, max_procs, crate::random::fill)
            .map_err(|e| VmError::io("draw the copy's fresh entropy", e))?;
        refresh.grow_root_to = grow_to.unwrap_or(0);
        client.refresh(refresh).await?;
        mark("refreshed");
        Ok::<_, VmError>(client)
    };
    let outcome = tokio::select! {
        r = ready => r,
        (status, qemu_stderr) = vm.wait_exit() => Err(VmError::DiedDuringBoot {
            status,
            qemu_stderr,
            console_tail: "(restored from a snapshot)".into(),
        }),
    };
    match outcome {
        Ok(client) => Ok((vm, client)),
        Err(VmError::Agent(AgentError::Disconnected)) => {
            // The copy died: say what QEMU and the guest said.
            let (status, qemu_stderr) =
                match tokio::time::timeout(Duration::from_secs(2), vm.wait_exit()).await {
                    Ok(s) => s,
                    Err(_) => {
                        vm.kill().await;
                        ("killed after its agent hung up".into(), String::new())
                    }
                };
            Err(VmError::DiedDuringBoot {
                status,
                qemu_stderr,
                console_tail: vm.console.settled_tail(20).await,
            })
        }
        Err(e) => {
            vm.kill().await;
            Err(e)
        }
    }
}

/// A new identity for a restored copy: fresh entropy (from `draw`, the OS's RNG), the host's
/// time, its own names. No identity without the entropy: a copy not reseeded would share its
/// parent's randomness, so it is not handed out.
fn fresh_identity(
    id: &str,
    max_procs: u32,
    draw: impl Fn(&mut [u8]) -> std::io::Result<()>,
) -> std::io::Result<forkbox_protocol::Refresh> {
    let mut entropy = vec![0u8; 64];
    draw(&mut entropy)?;
    let mut mid = [0u8; 16];
    draw(&mut mid)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Ok(forkbox_protocol::Refresh {
        entropy,
        unix_secs: now.as_secs(),
        unix_nanos: now.subsec_nanos(),
        hostname: id.to_string(),
        machine_id: crate::random::to_hex(&mid),
        max_procs,
        grow_root_to: 0,
    })
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A copy's identity comes with fresh entropy or not at all: a draw that fails is the
    /// restore's error (the copy is not handed out), never an identity with zeroed entropy.
    #[test]
    fn no_fresh_identity_without_entropy() {
        let refused = fresh_identity("sb-1", 64, |_| Err(std::io::Error::other("no entropy")));
        assert_eq!(refused.unwrap_err().to_string(), "no entropy");
        let a = fresh_identity("sb-1", 64, crate::random::fill).unwrap();
        let b = fresh_identity("sb-2", 64, crate::random::fill).unwrap();
        assert_eq!(a.entropy.len(), 64);
        assert_ne!(a.entropy, b.entropy);
        assert_ne!(a.machine_id, b.machine_id);
        assert_eq!(a.machine_id.len(), 32);
        assert_eq!(b.hostname, "sb-2");
    }
}
