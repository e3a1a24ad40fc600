//! What a sandbox boots from: the boot kit (kernel, initramfs, accelerator), the image's
//! template (a booted image saved right after its agent answered), and a copy of a template
//! or snapshot started.

use super::*;

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
pub(super) async fn boot(
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
        warm_shell(&client).await;
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
    match &published {
        Ok(t) => {
            for gone in snap::retire::retire_replaced(paths, &t.meta) {
                tracing::info!("removed {}: {key} replaces it", gone.display());
            }
        }
        Err(_) => crate::tree::discard_tree(&tmp),
    }
    published
}

/// What a template's guest runs before it is saved: a login shell on a terminal, left at once
/// (`exit`), so that the files a sandbox's first shell reads (bash and its libraries,
/// `/etc/profile`, the bashrc files, readline's `inputrc`, the terminal's terminfo entry, the
/// user database) are in the saved page cache. Under TCG a sandbox's first terminal showed its
/// prompt 0.45 s after its input, 0.2-0.3 s from a warmed template (the next one: 0.06 s; the
/// rest is QEMU translating the guest's code anew in each sandbox). Best effort: an image
/// without bash, or a shell that does not end within seconds, saves the template as booted.
/// No history is written (`HISTFILE` empty).
const WARM_UP: &str = "login shell on a terminal, exit";

async fn warm_shell(client: &AgentClient) {
    let spec = ExecSpec {
        program: forkbox_protocol::Program::Argv(vec![
            "/bin/sh".into(),
            "-c".into(),
            "command -v bash >/dev/null 2>&1 || exit 0; exec bash -i -l".into(),
        ]),
        cwd: None,
        env: vec![
            ("TERM".into(), "xterm-256color".into()),
            ("HISTFILE".into(), String::new()),
        ],
        timeout_ms: Some(10_000),
        stdin: true,
        tty: Some(forkbox_protocol::WinSize { rows: 24, cols: 80 }),
        user: None,
    };
    let warmed = async {
        let mut ex = client.exec(spec).await?;
        ex.stdin(b"exit\n".to_vec()).await?;
        let mut out = Output::default();
        while !out.absorb(ex.next().await?) {}
        Ok::<_, AgentError>(out)
    };
    match tokio::time::timeout(Duration::from_secs(15), warmed).await {
        Ok(Ok(out)) if out.code() == 0 => {}
        Ok(Ok(out)) => tracing::debug!("template warm-up: the shell ended {}", out.code()),
        Ok(Err(e)) => tracing::debug!("template warm-up: {e}"),
        Err(_) => tracing::debug!("template warm-up: no end within 15 s"),
    }
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
        &format!("{build}#{WARM_UP}"),
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
pub(super) struct Copy<'a> {
    pub(super) id: &'a str,
    /// The same sandbox woken (its snapshot its own hibernation), not a new copy: it keeps its
    /// machine id and boot id.
    pub(super) resumed: bool,
    pub(super) max_procs: u32,
    pub(super) boot_timeout: Duration,
    pub(super) grow_to: Option<u64>,
    pub(super) started: Instant,
}

/// The size in bytes a copy's root disk grows to when `disk_mib` asks for more than the
/// snapshot's; refused when it asks for less.
pub(super) fn disk_growth(
    snap: &Snapshot,
    disk_mib: Option<u64>,
) -> Result<Option<u64>, SandboxError> {
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
pub(super) async fn start_copy(
    snap: &Snapshot,
    vm_cfg: &crate::vm::VmConfig,
    run: &mut RunDir,
    copy: Copy<'_>,
) -> Result<(Vm, AgentClient), VmError> {
    let Copy {
        id,
        resumed,
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
        // A guest woken from hibernation under TCG sees the time it slept pass (its clocks
        // are QEMU's; under KVM they are the kernel's).
        let slept = match (resumed, vm_cfg.accel, vm::host_tsc_khz()) {
            (true, vm::Accel::Tcg, Some(khz)) => crate::snapshot::clock::Slept::since(&state, khz),
            _ => None,
        };
        // A busy host can keep a starting QEMU from its CPU for seconds (10 s were seen
        // beside two busy loops and three other restores): it gets as long as a boot.
        tokio::task::spawn_blocking(move || {
            crate::snapshot::load_state(&qmp, &state, grow_to, slept, boot_timeout)
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
        if resumed {
            refresh.machine_id.clear();
        }
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
pub(super) fn fresh_identity(
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
