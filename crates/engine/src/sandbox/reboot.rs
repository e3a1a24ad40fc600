//! A sandbox paused without its memory (E2B's filesystem-only pause), and started again: its
//! guest's writes are synced to its disk before it is saved, and the resume boots the kernel
//! from that disk, with the current agent, under the same id, hostname and machine id, with a
//! new boot id and none of its processes.

use super::*;

impl Sandbox {
    /// Before a pause without memory: the guest's files written to its disk; its machine id
    /// (given back to it after the boot). Refused for a sandbox with volumes (a boot mounts
    /// none).
    pub async fn files_only_pause(&self) -> Result<String, SandboxError> {
        if !self.info.volumes.is_empty() {
            return Err(crate::error::VolumeError::Bad(format!(
                "{} has volumes mounted, which a boot from its disk would not mount again: \
                 pause it with its memory",
                self.info.id
            ))
            .into());
        }
        let out = self
            .run(ExecSpec {
                program: forkbox_protocol::Program::Shell("sync && cat /etc/machine-id".into()),
                cwd: Some("/".into()),
                env: vec![],
                timeout_ms: Some(120_000),
                stdin: false,
                tty: None,
                user: None,
            })
            .await?;
        if out.status.is_none_or(|s| s.as_shell_code() != 0) {
            return Err(SandboxError::io(
                "write the guest's files to its disk",
                std::io::Error::other(format!(
                    "`sync` ended with {:?}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )),
            ));
        }
        Ok(out.stdout_text().trim().to_string())
    }

    /// Boots sandbox `id` from the disk of `snap`, its hibernation without memory: a new
    /// overlay on that disk, the current boot kit, then its names given back (`machine_id`
    /// as it had; a new boot id comes with the boot).
    pub async fn boot_from_disk(
        paths: &Paths,
        snap: &Snapshot,
        cfg: &SandboxConfig,
        id: String,
        machine_id: &str,
    ) -> Result<Sandbox, SandboxError> {
        snap.check_restorable()?;
        let started = Instant::now();
        let image = ImageStore::new(paths).resolve(&snap.meta.image.parse()?)?;
        vm::program::require()?;
        let kit = boot_kit(paths, &image, cfg.accel).await?;
        let mut run = RunDir::create(paths, &id, &snap.meta.image)
            .map_err(|e| SandboxError::io(format!("create run directory for {id}"), e))?;
        let vm_cfg = VmConfig {
            accel: kit.accel.accel,
            cpus: snap.meta.cpus,
            memory_mib: snap.meta.memory_mib,
            kernel: kit.kernel.clone(),
            initramfs: kit.initramfs.clone(),
            disk: crate::snapshot::next_disk(&run.disk_dir()),
            run_dir: run.dir.clone(),
            die_with_parent: cfg.die_with_parent,
            max_procs: cfg.max_procs,
            memory: vm::Memory::PrivateFile(run.dir.join(COLD_RAM)),
            start: vm::Start::Boot,
            volumes: Vec::new(),
        };
        let ram_bytes = vm::ram_bytes(kit.accel.accel, snap.meta.memory_mib);
        if let Err(e) = crate::ram::zero_file(&run.dir.join(COLD_RAM), ram_bytes) {
            run.remove();
            return Err(SandboxError::io("create the guest's RAM file", e));
        }
        let booted = async {
            let (mut vm, client) = boot(&snap.disk(), &vm_cfg, cfg.boot_timeout, |vm| {
                run.record.qemu_pid = Some(vm.pid);
                run.record.qemu_start = crate::procfs::process_start(vm.pid);
                run.save().map_err(|e| VmError::io("record the VM", e))
            })
            .await?;
            let named = async {
                let mut names = fresh_identity(&id, cfg.max_procs, crate::random::fill)
                    .map_err(|e| VmError::io("draw the guest's fresh entropy", e))?;
                if !machine_id.is_empty() {
                    names.machine_id = machine_id.to_string();
                }
                client.refresh(names).await.map_err(VmError::from)
            };
            match named.await {
                Ok(()) => Ok((vm, client)),
                Err(e) => {
                    vm.kill().await;
                    Err(e)
                }
            }
        }
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
            image: snap.meta.image.clone(),
            accel: kit.accel,
            cpus: snap.meta.cpus,
            memory_mib: snap.meta.memory_mib,
            guest_kernel: client.hello.kernel.clone(),
            qemu_pid: vm.pid,
            boot_ms: started.elapsed().as_millis() as u64,
            origin: Some(format!("snapshot:{}", snap.meta.name)),
            max_procs: cfg.max_procs,
            kernel: kit.kernel,
            initramfs: kit.initramfs,
            disk_dirs: disk_dirs(snap, &run.record.id),
            volumes: Vec::new(),
        };
        let sb = Sandbox::assemble(info, image, vm, client, run);
        sb.client.net.set_packages(cfg.packages.clone());
        Ok(sb)
    }
}

/// The disk directories a sandbox started from `snap` stands on: the snapshot's, then its own
/// (`own`), each once.
pub(super) fn disk_dirs(snap: &Snapshot, own: &str) -> Vec<String> {
    snap.meta
        .disk_dirs
        .iter()
        .map(String::as_str)
        .chain([own])
        .fold(Vec::new(), |mut v, d| {
            if !v.iter().any(|x: &String| x == d) {
                v.push(d.to_string());
            }
            v
        })
}
