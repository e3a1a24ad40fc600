//! `forkbox run`: create a sandbox, run one command, stream its output, remove the sandbox.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use forkbox_engine::client::ExecEvent;
use forkbox_engine::image::ImageRef;
use forkbox_engine::paths::Paths;
use forkbox_engine::sandbox::{Sandbox, SandboxConfig, SandboxInfo};
use forkbox_engine::vm::{Accel, AccelChoice};
use forkbox_protocol::{ExecSpec, ExitStatus, Program};
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
    /// Through a running daemon: whether the sandbox came ready-made from its warm pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    from_pool: Option<bool>,
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
            return on_daemon(&c, &args, total).await;
        }
    }
    let cfg = SandboxConfig {
        image,
        cpus: args.cpus,
        memory_mib: args.memory,
        accel: args.accel,
        die_with_parent: true,
        max_procs: args.max_procs,
        network: args.net.policy().unwrap_or_default(),
        ..SandboxConfig::default()
    };
    let mut signals = Signals::new()?;
    // Creation itself can be interrupted; the engine removes what it made when dropped.
    let sandbox = tokio::select! {
        s = crate::daemon::said_after(Sandbox::create(paths, &cfg), starting(args.quiet)) => {
            s.context("could not start the sandbox")?
        }
        code = signals.next() => return Ok(ExitCode::from(code)),
    };
    let info = sandbox.info().clone();
    tcg_notice(&info, args.quiet);
    let spec = ExecSpec {
        program: Program::Argv(args.command.clone()),
        cwd: args.cwd.clone(),
        env: {
            let mut env = args.env.clone();
            if args.tty && !env.iter().any(|(k, _)| k == "TERM") {
                let term = std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into());
                env.push(("TERM".into(), term));
            }
            env
        },
        timeout_ms: args.timeout.map(|s| s * 1000),
        stdin: args.interactive,
        tty: args.tty.then(crate::terminal::size),
        user: None,
    };
    let exec_start = Instant::now();
    let outcome = tokio::select! {
        r = drive(&sandbox, spec, args.json, args.interactive) => Some(r),
        _ = signals.next() => None,
    };
    let exec_ms = exec_start.elapsed().as_millis() as u64;
    sandbox.destroy().await;
    let Some(result) = outcome else {
        eprintln!("forkbox: interrupted; the sandbox was removed");
        return Ok(ExitCode::from(130));
    };
    let (status, timed_out, stdout, stderr) = match result {
        Ok(r) => r,
        Err(e) => {
            // A command that cannot start exits as a shell would say: 127 not found, 126 not
            // runnable, with the same words as `sandbox exec` and the API.
            let cannot = e
                .downcast_ref::<forkbox_engine::error::SandboxError>()
                .and_then(forkbox_engine::commands::cannot_start);
            if let Some((code, message)) = cannot {
                eprintln!("forkbox: {message}");
                return Ok(ExitCode::from(code.clamp(0, 255) as u8));
            }
            return Err(e);
        }
    };
    if timed_out {
        eprintln!(
            "forkbox: the command timed out after {} s; it and every process it started were killed",
            args.timeout.unwrap_or(0)
        );
    }
    let code = status.as_shell_code();
    if args.json {
        let r = RunResult {
            sandbox: info,
            exit_code: code,
            signal: status.signal(),
            timed_out,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            duration_ms: exec_ms,
            total_ms: total.elapsed().as_millis() as u64,
            from_pool: None,
        };
        crate::print_json(&r)?;
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// How long a sandbox `run` made through the daemon outlives this process if it dies
/// without removing it (its TTL, renewed while the command runs).
const LEASE_SECS: u64 = 120;

/// `run` through the daemon: a sandbox from its warm pool (or restored for this call), the
/// command, the sandbox removed; a lease (TTL renewed while the command runs) removes it if
/// this process is killed.
async fn on_daemon(
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
                let r = c.exec(&id, &exec).await?;
                crate::print_json(&RunResult {
                    sandbox: info.clone(),
                    exit_code: r.exit_code,
                    signal: r.signal,
                    timed_out: r.timed_out,
                    stdout: r.stdout,
                    stderr: r.stderr,
                    duration_ms: exec_start.elapsed().as_millis() as u64,
                    total_ms: total.elapsed().as_millis() as u64,
                    from_pool: Some(view.from_pool),
                })?;
                Ok(ExitCode::from(r.exit_code.clamp(0, 255) as u8))
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

type Driven = (ExitStatus, bool, Vec<u8>, Vec<u8>);

async fn drive(
    sandbox: &Sandbox,
    spec: ExecSpec,
    collect: bool,
    interactive: bool,
) -> anyhow::Result<Driven> {
    let program = match &spec.program {
        Program::Argv(a) => a.join(" "),
        Program::Shell(s) => s.clone(),
    };
    let on_tty = spec.tty.is_some();
    let mut ex = sandbox
        .exec(spec)
        .await
        .with_context(|| format!("could not run `{program}`"))?;
    // Keys go through as typed while the command runs on a terminal; restored when this ends.
    let _raw = match on_tty && interactive {
        true => crate::terminal::RawMode::enter(),
        false => None,
    };
    let mut winch = match on_tty {
        true => tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok(),
        false => None,
    };
    let mut stdin_rx = interactive.then(crate::terminal::stdin_chunks);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        let ev = tokio::select! {
            ev = ex.next() => ev?,
            Some(()) = async { match winch.as_mut() { Some(w) => w.recv().await, None => std::future::pending().await } } => {
                ex.resize(crate::terminal::size()).await?;
                continue;
            }
            input = async { match stdin_rx.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } } => {
                // A read error ends the input as its end does.
                match input.and_then(Result::ok) {
                    Some(data) => ex.stdin(data).await?,
                    None => {
                        ex.close_stdin().await?;
                        stdin_rx = None;
                    }
                }
                continue;
            }
        };
        match ev {
            ExecEvent::Started { .. } => {}
            ExecEvent::Stdout(d) if collect => out.extend_from_slice(&d),
            ExecEvent::Stderr(d) if collect => err.extend_from_slice(&d),
            ExecEvent::Stdout(d) => {
                let mut o = std::io::stdout().lock();
                o.write_all(&d)?;
                o.flush()?;
            }
            ExecEvent::Stderr(d) => {
                let mut e = std::io::stderr().lock();
                e.write_all(&d)?;
                e.flush()?;
            }
            ExecEvent::Exited {
                status, timed_out, ..
            } => return Ok((status, timed_out, out, err)),
        }
    }
}
