//! `forkbox run`: create a sandbox, run one command, stream its output, remove the sandbox.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use forkbox_engine::api::{Engine, Stream};
use forkbox_engine::image::ImageRef;
use forkbox_engine::paths::Paths;
use forkbox_engine::sandbox::SandboxInfo;
use forkbox_engine::vm::{Accel, AccelChoice};
use tokio::signal::unix::{signal, SignalKind};

#[derive(clap::Args)]
pub struct RunArgs {
    /// Image to boot: NAME (newest version) or NAME@N.
    #[arg(long, default_value = "python-bookworm", env = "FORKBOX_IMAGE")]
    image: String,
    /// Virtual CPUs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    cpus: u32,
    /// Guest memory: 512m, 2g, or a number of MiB.
    #[arg(long, default_value = "1024", value_parser = crate::units::memory_mib)]
    memory: u32,
    /// Most processes the command and everything it starts may have together.
    #[arg(long, default_value_t = forkbox_engine::sandbox::DEFAULT_MAX_PROCS, value_parser = clap::value_parser!(u32).range(16..=1_000_000))]
    max_procs: u32,
    /// Kill the command and everything it started after this long: 90, 5s, 10m (at most 24 h).
    #[arg(long, value_parser = crate::units::timeout)]
    timeout: Option<u64>,
    /// Working directory in the guest (default /root).
    #[arg(long)]
    cwd: Option<String>,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_kv)]
    env: Vec<(String, String)>,
    /// Accelerator: auto (KVM where this host can run a standard guest, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto", env = "FORKBOX_ACCEL")]
    accel: AccelChoice,
    /// Pass this process's standard input to the command.
    #[arg(short = 'i', long)]
    interactive: bool,
    /// Run the command on a terminal (the size of this one, kept in step); with -i on a
    /// terminal, keys go through as typed (Ctrl-C interrupts the command).
    #[arg(short = 't', long, conflicts_with = "json")]
    tty: bool,
    #[command(flatten)]
    net: crate::daemon::NetArgs,
    /// Mount a volume: NAME:/path (read-write) or NAME:/path:ro, repeatable (`forkbox volume
    /// create` makes one; it outlives the run).
    #[arg(long = "volume", value_name = "NAME:/PATH[:ro]", value_parser = crate::units::volume_mount)]
    volumes: Vec<forkbox_engine::api::VolumeMount>,
    /// Print one JSON object with the result instead of streaming the output.
    #[arg(long)]
    json: bool,
    /// Say nothing of forkbox's own on standard error (the TCG notice, progress), errors aside.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// The command and its arguments (after `--`).
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not K=V")),
    }
}

#[derive(serde::Serialize)]
struct RunResult {
    sandbox: SandboxInfo,
    exit_code: i32,
    signal: Option<i32>,
    timed_out: bool,
    stdout: String,
    stderr: String,
    /// The command's own time, as `duration_ms` of an exec result.
    duration_ms: u64,
    /// With the sandbox's start and removal.
    total_ms: u64,
    /// Whether the sandbox came ready-made from a running daemon's warm pool.
    from_pool: bool,
}

pub fn run(paths: &Paths, args: RunArgs) -> anyhow::Result<ExitCode> {
    // One thread: QEMU is started with PR_SET_PDEATHSIG, which fires when the *thread* that
    // started it ends; the main thread lives exactly as long as the sandbox should.
    let rt = crate::daemon::current_thread()?;
    rt.block_on(run_async(paths, args))
}

async fn run_async(paths: &Paths, args: RunArgs) -> anyhow::Result<ExitCode> {
    let total = Instant::now();
    let image: ImageRef = args.image.parse()?;
    crate::bundled::ensure(paths, &image, args.quiet).await?;
    // A running daemon hands out a ready copy from its warm pool: the command starts without
    // waiting for a restore (FORKBOX_RUN_LOCAL=1 makes the sandbox in this process instead).
    let local = std::env::var_os("FORKBOX_RUN_LOCAL").is_some_and(|v| !v.is_empty() && v != "0");
    if !local {
        if let Some(c) = crate::daemon::running_daemon(paths).await? {
            return through_api(&c, &args, total).await;
        }
    }
    one_shot(paths, &args, total).await
}

/// `run` without a daemon: an engine of this process's own ([`Engine::one_shot`]: its VMs die
/// with this thread), served on a private socket and driven by the same client calls as a
/// daemon, so a run has one path and one set of errors whichever engine serves it.
async fn one_shot(paths: &Paths, args: &RunArgs, total: Instant) -> anyhow::Result<ExitCode> {
    let dir = tempfile::Builder::new()
        .prefix("forkbox-run-")
        .tempdir()
        .context("could not make a directory for this run's socket")?;
    let socket = dir.path().join("api.sock");
    let engine = Arc::new(Engine::one_shot(paths.clone()));
    let server = forkbox_server::spawn_private(engine.clone(), &socket)
        .context("could not serve this run's engine on its socket")?;
    let client = forkbox_client::Client::new(forkbox_client::Endpoint::Unix(socket))?;
    let code = through_api(&client, args, total).await;
    server.abort();
    engine.shutdown().await;
    code
}

/// How long a sandbox `run` made through the daemon outlives this process if it dies
/// without removing it (its TTL, renewed while the command runs).
const LEASE_SECS: u64 = 120;

/// `run` through an engine's API (a running daemon's, or this process's own): a sandbox
/// (from a daemon's warm pool, or restored for this call), the command, the sandbox removed; a
/// lease (TTL renewed while the command runs) removes it from a daemon if this process is
/// killed.
async fn through_api(
    c: &forkbox_client::Client,
    args: &RunArgs,
    total: Instant,
) -> anyhow::Result<ExitCode> {
    let req = forkbox_engine::api::CreateRequest {
        image: Some(args.image.clone()),
        cpus: Some(args.cpus),
        memory_mib: Some(args.memory),
        accel: Some(args.accel),
        labels: [("forkbox-run".to_string(), std::process::id().to_string())].into(),
        ttl_seconds: Some(LEASE_SECS),
        max_processes: Some(args.max_procs),
        snapshot: None,
        ttl_action: None,
        disk_gib: None,
        network: args.net.policy(),
        node: None,
        secrets: args.net.secrets.clone(),
        volumes: args.volumes.clone(),
        ..Default::default()
    };
    let mut signals = Signals::new()?;
    let view = tokio::select! {
        v = crate::daemon::said_after(c.create(&req), starting(args.quiet)) => {
            v.context("could not start the sandbox")?
        }
        // A sandbox the daemon makes meanwhile goes when its lease ends.
        code = signals.next() => return Ok(ExitCode::from(code)),
    };
    let info = view.info.clone();
    tcg_notice(&info, args.quiet);
    let id = info.id.clone();
    let exec = forkbox_engine::api::ExecRequest {
        argv: Some(args.command.clone()),
        cwd: args.cwd.clone(),
        env: args.env.iter().cloned().collect(),
        timeout_secs: args.timeout,
        ..Default::default()
    };
    let lease = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(LEASE_SECS / 4)).await;
            let _ = c.set_ttl(&id, LEASE_SECS).await;
        }
    };
    let exec_start = Instant::now();
    let outcome = tokio::select! {
        r = async {
            if args.json {
                // The whole output (a plain exec's reply caps it).
                let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
                let events = c.exec_events(&id, &exec).await?;
                let ended = crate::daemon::drain(events, |stream, data| {
                    match stream {
                        Stream::Stdout => stdout.extend_from_slice(data),
                        Stream::Stderr => stderr.extend_from_slice(data),
                    }
                    Ok(())
                })
                .await?;
                let exit = match ended {
                    Ok(exit) => exit,
                    Err(code) => return Ok(ExitCode::from(code.clamp(0, 255) as u8)),
                };
                crate::print_json(&RunResult {
                    sandbox: info.clone(),
                    exit_code: exit.exit_code,
                    signal: exit.signal,
                    timed_out: exit.timed_out,
                    stdout: String::from_utf8_lossy(&stdout).into_owned(),
                    stderr: String::from_utf8_lossy(&stderr).into_owned(),
                    duration_ms: exec_start.elapsed().as_millis() as u64,
                    total_ms: total.elapsed().as_millis() as u64,
                    from_pool: view.from_pool,
                })?;
                Ok(ExitCode::from(exit.exit_code.clamp(0, 255) as u8))
            } else {
                let how = crate::daemon::How {
                    interactive: args.interactive,
                    tty: args.tty,
                    detach: false,
                    json: false,
                };
                crate::daemon::exec(c, &id, exec.clone(), how).await
            }
        } => Some(r),
        _ = lease => None,
        _ = signals.next() => None,
    };
    let _ = c.delete(&id).await;
    match outcome {
        Some(r) => r,
        None => {
            eprintln!("forkbox: interrupted; the sandbox was removed");
            Ok(ExitCode::from(130))
        }
    }
}

/// What a start that takes over a second says (nothing with `--quiet`).
fn starting(quiet: bool) -> Option<&'static str> {
    (!quiet).then_some(
        "starting the sandbox (the first of an image and size boots once to make its template: \
         a few seconds)",
    )
}

/// The signals that end a run: SIGINT, SIGTERM and SIGHUP.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next one to come, as the exit code a shell gives it (128 + its number).
    async fn next(&mut self) -> u8 {
        tokio::select! {
            _ = self.int.recv() => 130,
            _ = self.term.recv() => 143,
            _ = self.hup.recv() => 129,
        }
    }
}

fn tcg_notice(info: &SandboxInfo, quiet: bool) {
    let hushed =
        std::env::var_os("FORKBOX_NO_TCG_NOTICE").is_some_and(|v| !v.is_empty() && v != "0");
    if info.accel.accel == Accel::Tcg && !quiet && !hushed {
        eprintln!(
            "forkbox: TCG, software emulation ({}): slower, and QEMU's confinement is the \
             security boundary (FORKBOX_NO_TCG_NOTICE=1 hides this)",
            info.accel.reason
        );
    }
}
