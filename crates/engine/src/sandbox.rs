//! A sandbox: one microVM booted from an image, with its own disk overlay, and the agent
//! connection to drive it.

use std::time::{Duration, Instant};

use forkbox_protocol::ExecSpec;
use serde::Serialize;

use crate::client::{AgentClient, ExecEvent, Execution, Output};
use crate::error::{AgentError, SandboxError, VmError};
use crate::image::{env_pairs, Image, ImageRef, ImageStore};
use crate::kernel::{self, Kernel};
use crate::paths::Paths;
use crate::runstate::{self, RunDir};
use crate::vm::{self, AccelChoice, AccelDecision, Vm, VmConfig};

pub const DEFAULT_MAX_PROCS: u32 = 4096;

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
        }
    }
}

/// What a sandbox is, for people and for `--json`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SandboxInfo {
    pub id: String,
    pub image: String,
    pub accel: AccelDecision,
    pub cpus: u32,
    pub memory_mib: u32,
    pub guest_kernel: String,
    pub qemu_pid: u32,
    /// From the decision to start until the agent answered.
    pub boot_ms: u64,
}

pub struct Sandbox {
    info: SandboxInfo,
    image: Image,
    vm: tokio::sync::Mutex<Vm>,
    console: vm::Console,
    client: AgentClient,
    run: std::sync::Mutex<RunDir>,
    destroyed: std::sync::atomic::AtomicBool,
}

fn new_id() -> String {
    let mut b = [0u8; 5];
    let _ = getrandom::getrandom(&mut b);
    format!(
        "sb-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

impl Sandbox {
    pub async fn create(paths: &Paths, cfg: &SandboxConfig) -> Result<Sandbox, SandboxError> {
        runstate::sweep(paths);
        let image = ImageStore::new(paths).resolve(&cfg.image)?;
        crate::setup::require(vm::QEMU)?;
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
        let (_, agent) = crate::agent_bin::locate()?;
        let initramfs = kernel::initramfs(paths, &kernel, &agent)?;
        let accel = vm::decide(paths, cfg.accel, &kernel.vmlinuz(), &initramfs).await?;

        let start = Instant::now();
        let id = new_id();
        let mut run = RunDir::create(paths, &id, &image.reference())
            .map_err(|e| SandboxError::io(format!("create run directory for {id}"), e))?;
        let vm_cfg = VmConfig {
            accel: accel.accel,
            cpus: cfg.cpus,
            memory_mib: cfg.memory_mib,
            kernel: kernel.vmlinuz(),
            initramfs,
            disk: run.dir.join("disk.qcow2"),
            run_dir: run.dir.clone(),
            die_with_parent: cfg.die_with_parent,
            max_procs: cfg.max_procs,
        };
        let booted = async {
            vm::create_overlay(&image.rootfs(), &vm_cfg.disk).await?;
            let mut vm = Vm::spawn(&vm_cfg)?;
            run.record.qemu_pid = Some(vm.pid);
            run.record.qemu_start = crate::runstate::process_start(vm.pid);
            run.save().map_err(|e| VmError::io("record the VM", e))?;
            let sock = vm_cfg.agent_socket();
            let connect = AgentClient::connect(&sock);
            enum Failed {
                Agent(AgentError),
                Timeout,
                Exited(String, String),
            }
            let outcome = tokio::select! {
                c = tokio::time::timeout(cfg.boot_timeout, connect) => match c {
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
                    secs: cfg.boot_timeout.as_secs(),
                    accel: accel.accel.to_string(),
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
            accel,
            cpus: cfg.cpus,
            memory_mib: cfg.memory_mib,
            guest_kernel: client.hello.kernel.clone(),
            qemu_pid: vm.pid,
            boot_ms: start.elapsed().as_millis() as u64,
        };
        Ok(Sandbox::assemble(info, image, vm, client, run))
    }

    fn assemble(
        info: SandboxInfo,
        image: Image,
        vm: Vm,
        client: AgentClient,
        run: RunDir,
    ) -> Sandbox {
        Sandbox {
            info,
            image,
            console: vm.console.clone(),
            vm: tokio::sync::Mutex::new(vm),
            client,
            run: std::sync::Mutex::new(run),
            destroyed: false.into(),
        }
    }

    pub fn info(&self) -> &SandboxInfo {
        &self.info
    }

    pub fn client(&self) -> &AgentClient {
        &self.client
    }

    /// Starts a command with the image's environment under the request's. A command with a
    /// timeout is also watched from the host: should the guest not report it killed within a
    /// grace period after the timeout, the sandbox is treated as broken.
    pub async fn exec(&self, mut spec: ExecSpec) -> Result<SandboxExecution, SandboxError> {
        let mut env = env_pairs(&self.image.meta.env);
        env.append(&mut spec.env);
        spec.env = env;
        let deadline = spec
            .timeout_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms) + HOST_GRACE);
        let timeout_secs = spec.timeout_ms.unwrap_or(0) / 1000;
        let inner = match self.client.exec(spec).await {
            Ok(i) => i,
            Err(e) => return Err(died(e, &self.console).await),
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

    /// Records what the daemon needs to re-adopt this sandbox after a crash (written to disk,
    /// synced, before it returns). With `None`, the sandbox is no longer the daemon's.
    pub fn set_daemon_record(
        &self,
        record: Option<crate::runstate::DaemonRecord>,
    ) -> Result<(), SandboxError> {
        let mut run = self.run_dir();
        run.record.daemon = record;
        run.save()
            .map_err(|e| SandboxError::io(format!("record sandbox {}", self.info.id), e))
    }

    /// Takes over a sandbox whose daemon died: checks that its QEMU is still the one recorded,
    /// reconnects to its console and its agent. `None` when it is gone (its files are removed).
    pub async fn adopt(
        paths: &Paths,
        dir: &std::path::Path,
    ) -> Option<(Sandbox, crate::runstate::DaemonRecord)> {
        let run = RunDir::adopt(dir)?;
        let record = run.record.daemon.clone()?;
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
        };
        let mut vm = Vm::adopt(&cfg, run.record.qemu_pid?, run.record.qemu_start?)?;
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
        Some((Sandbox::assemble(info, image, vm, client, run), record))
    }

    /// Stops the VM and removes everything the sandbox had on the host. Idempotent.
    pub async fn destroy(&self) {
        self.vm.lock().await.kill().await;
        self.run_dir().remove();
        self.destroyed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

async fn died(e: AgentError, console: &vm::Console) -> SandboxError {
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
            Err(e) => Err(died(e, &self.console).await),
        }
    }

    async fn checked(&self, r: Result<(), AgentError>) -> Result<(), SandboxError> {
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(died(e, &self.console).await),
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
}
