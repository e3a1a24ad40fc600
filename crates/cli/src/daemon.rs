//! `forkbox serve` and `forkbox sandbox ...`: the CLI as a client of the daemon's HTTP API.

use forkbox_engine::snapshot::SnapshotMeta;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use forkbox_client::{Client, Endpoint, Events};
use forkbox_engine::api::{
    CommandEvent, CreateRequest, ExecRequest, ForkRequest, SandboxState, SandboxView,
    SnapshotRequest, TtlAction,
};
use forkbox_engine::paths::Paths;
use forkbox_engine::vm::AccelChoice;

/// Network policy flags. Without either, no network at all.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NetArgs {
    /// Outbound access to the internet through forkbox's host-side proxy (never the host
    /// itself, loopback, link-local or metadata addresses).
    #[arg(long, conflicts_with = "allow")]
    pub internet: bool,
    /// Allow only this host (repeatable): pypi.org, *.pythonhosted.org, host:port, an IP.
    #[arg(long = "allow", value_name = "HOST")]
    pub allow: Vec<String>,
}

impl NetArgs {
    pub fn policy(&self) -> Option<forkbox_engine::net::NetworkPolicy> {
        (self.internet || !self.allow.is_empty()).then(|| forkbox_engine::net::NetworkPolicy {
            internet: self.internet,
            allow: self.allow.clone(),
        })
    }
}

#[derive(clap::Subcommand)]
pub enum SandboxCmd {
    /// Create a sandbox; prints its id.
    Create {
        #[arg(long)]
        image: Option<String>,
        #[arg(long)]
        cpus: Option<u32>,
        /// Guest memory in MiB.
        #[arg(long)]
        memory: Option<u32>,
        #[arg(long, env = "FORKBOX_ACCEL")]
        accel: Option<AccelChoice>,
        /// A label K=V (repeatable).
        #[arg(long = "label", value_name = "K=V", value_parser = crate::run::parse_kv)]
        labels: Vec<(String, String)>,
        /// Delete the sandbox after this many seconds.
        #[arg(long)]
        ttl: Option<u64>,
        /// Start from this snapshot (its image, vCPUs and memory) instead of the image's template.
        #[arg(long, conflicts_with_all = ["image", "cpus", "memory"])]
        snapshot: Option<String>,
        /// What the TTL does when it passes: delete (default) or hibernate.
        #[arg(long, value_enum, requires = "ttl")]
        ttl_action: Option<TtlArg>,
        /// Root disk size in GiB (at least the image's); the filesystem grows to fill it.
        #[arg(long)]
        disk_gib: Option<u32>,
        #[command(flatten)]
        net: NetArgs,
        #[arg(long)]
        json: bool,
    },
    /// Save a sandbox to disk and stop its VM; it keeps its id.
    Hibernate {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Bring a hibernated sandbox back, with its processes.
    Resume {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Save a running sandbox (memory, processes, disk) as a snapshot; it keeps running.
    Snapshot {
        id: String,
        /// The snapshot's name (default: made up from the sandbox's id).
        #[arg(long)]
        name: Option<String>,
        /// Leave the sandbox paused.
        #[arg(long)]
        paused: bool,
        #[arg(long)]
        json: bool,
    },
    /// Fork a running sandbox or a snapshot into COUNT new sandboxes; prints their ids.
    Fork {
        /// A sandbox id or a snapshot name.
        source: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
        #[arg(long = "label", value_name = "K=V", value_parser = crate::run::parse_kv)]
        labels: Vec<(String, String)>,
        #[arg(long)]
        ttl: Option<u64>,
        /// The copies' network (default: a sandbox's own; none for a snapshot).
        #[command(flatten)]
        net: NetArgs,
        #[arg(long)]
        json: bool,
    },
    /// Set a sandbox's TTL anew, counted from now.
    Ttl {
        id: String,
        seconds: u64,
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a sandbox; prints its output and exits with its exit code.
    Exec {
        id: String,
        #[arg(long)]
        cwd: Option<String>,
        #[arg(long = "env", value_name = "K=V", value_parser = crate::run::parse_kv)]
        env: Vec<(String, String)>,
        /// Seconds before the command and everything it started are killed.
        #[arg(long)]
        timeout: Option<u64>,
        #[arg(long)]
        json: bool,
        /// Start the command and print its id instead of waiting; read it with `attach`.
        #[arg(long, conflicts_with = "json")]
        detach: bool,
        #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Follow a command started earlier (its output from the start, then live) and exit with its code.
    Attach { id: String, command_id: String },
    /// Send a signal to a command started earlier (default SIGTERM).
    Kill {
        id: String,
        command_id: String,
        #[arg(long, default_value_t = 15)]
        signal: i32,
    },
    /// Copy a host directory into the sandbox (as one tar.zst stream).
    Upload {
        id: String,
        host_dir: std::path::PathBuf,
        guest_dir: String,
        #[arg(long)]
        json: bool,
    },
    /// Copy a sandbox file or directory into a new host directory. Links, device files,
    /// absolute paths and `..` in what the sandbox sends are refused.
    Download {
        id: String,
        guest_path: String,
        /// Must not exist yet.
        host_dir: std::path::PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// List sandboxes.
    Ls {
        /// Only sandboxes with this label K=V.
        #[arg(long)]
        label: Option<String>,
        /// Only sandboxes in this state: running, disk_full, hibernated, failed.
        #[arg(long, value_parser = parse_state)]
        state: Option<SandboxState>,
        #[arg(long)]
        json: bool,
    },
    /// Stop and remove a sandbox.
    Rm {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum TtlArg {
    Delete,
    Hibernate,
}

#[derive(clap::Subcommand)]
pub enum SnapshotCmd {
    /// List snapshots.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot (refused while sandboxes or snapshots depend on it).
    Rm {
        name: String,
        #[arg(long)]
        json: bool,
    },
}

pub fn snapshot(paths: &Paths, cmd: SnapshotCmd) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let c = connect(paths).await?;
        match cmd {
            SnapshotCmd::Ls { json } => {
                let all: Vec<SnapshotMeta> = c.list_snapshots().await?;
                if json {
                    crate::print_json(&all)?;
                } else if all.is_empty() {
                    println!("no snapshots");
                } else {
                    println!(
                        "{:<32} {:<24} {:<16} {:<24} {:>8}",
                        "NAME", "IMAGE", "FROM", "PARENT", "RAM"
                    );
                    for m in all {
                        println!(
                            "{:<32} {:<24} {:<16} {:<24} {:>4} MiB",
                            m.name,
                            m.image,
                            m.from_sandbox.as_deref().unwrap_or("-"),
                            m.parent.as_deref().unwrap_or("-"),
                            m.memory_bytes >> 20
                        );
                    }
                }
                Ok(ExitCode::SUCCESS)
            }
            SnapshotCmd::Rm { name, json } => {
                let v = c.delete_snapshot(&name).await?;
                if json {
                    crate::print_json(&v)?;
                } else {
                    println!("removed {name}");
                }
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}

pub fn serve(
    paths: Paths,
    listen: Option<std::net::SocketAddr>,
    mcp_roots: Vec<std::path::PathBuf>,
) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // MCP over Streamable HTTP at /mcp: each session talks to this daemon through its socket.
    let mcp = forkbox_mcp::http_service(
        forkbox_server::socket_path(&paths),
        forkbox_mcp::Options {
            roots: mcp_roots,
            all: false,
        },
    );
    let extra = axum::Router::new().nest_service("/mcp", mcp);
    rt.block_on(forkbox_server::serve(paths, listen, Some(extra)))
        .context("the forkbox daemon failed")?;
    Ok(ExitCode::SUCCESS)
}

/// `forkbox mcp`: one MCP session over stdin/stdout against this home's daemon (started if
/// none runs) or `FORKBOX_API`; nothing but the protocol goes to stdout.
pub fn mcp(paths: &Paths, roots: Vec<std::path::PathBuf>, all: bool) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = connect(paths).await?;
        forkbox_mcp::serve_stdio(client, forkbox_mcp::Options { roots, all })
            .await
            .map_err(anyhow::Error::msg)
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `forkbox serve --detach`: a daemon for this home, started in the background unless one
/// already answers; prints its socket.
pub fn serve_detached(paths: &Paths) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let socket = forkbox_server::socket_path(paths);
    rt.block_on(async {
        if !forkbox_server::is_running(&socket).await {
            start_daemon(paths).await?;
        }
        anyhow::Ok(())
    })?;
    println!("{}", socket.display());
    Ok(ExitCode::SUCCESS)
}

/// The daemon of this forkbox home (started if none runs), or the API `FORKBOX_API` names:
/// `unix:/path/to.sock` (a private API such as the one `forkbox migrate` gives host porters),
/// or `http://host:port` with the bearer token in `FORKBOX_TOKEN`.
async fn connect(paths: &Paths) -> anyhow::Result<Client> {
    let endpoint = match Endpoint::from_env()? {
        Some(Endpoint::Unix(socket)) => {
            if !forkbox_server::is_running(&socket).await {
                bail!(
                    "no forkbox API answers on {} (from FORKBOX_API)",
                    socket.display()
                );
            }
            Endpoint::Unix(socket)
        }
        Some(http) => http,
        None => {
            let socket = forkbox_server::socket_path(paths);
            if !forkbox_server::is_running(&socket).await {
                start_daemon(paths).await?;
            }
            Endpoint::Unix(socket)
        }
    };
    Ok(Client::new(endpoint)?)
}

/// Starts `forkbox serve` in the background and waits for it to answer.
async fn start_daemon(paths: &Paths) -> anyhow::Result<()> {
    std::fs::create_dir_all(paths.home())?;
    // The daemon writes its log itself (`daemon.log`, size-capped); what else it prints (an
    // error at start, a panic) goes here, anew at each start.
    let log_path = paths.home().join("daemon.out");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&log_path)?;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve")
        .env("FORKBOX_HOME", paths.home())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().context("could not start the forkbox daemon")?;
    let socket = forkbox_server::socket_path(paths);
    for _ in 0..200 {
        if forkbox_server::is_running(&socket).await {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            bail!(
                "the forkbox daemon exited at start ({st}); see {} and daemon.log beside it",
                log_path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "the forkbox daemon did not start listening within 10 s; see {} and daemon.log beside it",
        log_path.display()
    )
}

/// Writes a command's events (stdout, stderr) as they come; returns its exit code.
async fn follow(mut events: Events<CommandEvent>) -> anyhow::Result<ExitCode> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    while let Some(ev) = events.next().await? {
        match ev {
            CommandEvent::Stdout { data_b64 } => {
                let mut o = std::io::stdout().lock();
                o.write_all(&b64.decode(data_b64).unwrap_or_default())?;
                o.flush()?;
            }
            CommandEvent::Stderr { data_b64 } => {
                let mut e = std::io::stderr().lock();
                e.write_all(&b64.decode(data_b64).unwrap_or_default())?;
                e.flush()?;
            }
            CommandEvent::Exit(exit) => {
                if exit.timed_out {
                    eprintln!("forkbox: the command timed out; it and every process it started were killed");
                }
                return Ok(ExitCode::from(exit.exit_code.clamp(0, 255) as u8));
            }
            CommandEvent::Error { message } => bail!("{message}"),
            CommandEvent::Command { .. } => {}
        }
    }
    bail!("the daemon's stream ended before the command did")
}

pub fn sandbox(paths: &Paths, cmd: SandboxCmd) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let c = connect(paths).await?;
        match cmd {
            SandboxCmd::Create {
                image,
                cpus,
                memory,
                accel,
                labels,
                ttl,
                snapshot,
                ttl_action,
                disk_gib,
                net,
                json,
            } => {
                let req = CreateRequest {
                    image,
                    cpus,
                    memory_mib: memory,
                    accel,
                    labels: labels.into_iter().collect(),
                    ttl_seconds: ttl,
                    max_processes: None,
                    snapshot,
                    disk_gib,
                    network: net.policy(),
                    ttl_action: ttl_action.map(|t| match t {
                        TtlArg::Delete => TtlAction::Delete,
                        TtlArg::Hibernate => TtlAction::Hibernate,
                    }),
                };
                let v = c.create(&req).await?;
                show(json, &v, || println!("{}", v.info.id))
            }
            SandboxCmd::Hibernate { id, json } => {
                let v = c.hibernate(&id).await?;
                show(json, &v, || println!("hibernated {id}"))
            }
            SandboxCmd::Resume { id, json } => {
                let v = c.resume(&id).await?;
                show(json, &v, || {
                    println!("resumed {id} in {} ms", v.info.boot_ms)
                })
            }
            SandboxCmd::Exec {
                id,
                cwd,
                env,
                timeout,
                json,
                detach,
                command,
            } => {
                let req = ExecRequest {
                    argv: Some(command),
                    cwd,
                    env: env.into_iter().collect(),
                    timeout_secs: timeout,
                    ..Default::default()
                };
                exec(&c, &id, &req, detach, json).await
            }
            SandboxCmd::Attach { id, command_id } => {
                follow(c.attach(&id, &command_id).await?).await
            }
            SandboxCmd::Kill {
                id,
                command_id,
                signal,
            } => {
                c.signal(&id, &command_id, signal).await?;
                Ok(ExitCode::SUCCESS)
            }
            SandboxCmd::Ttl { id, seconds, json } => {
                let v = c.set_ttl(&id, seconds).await?;
                show(json, &v, || {
                    println!("{id} expires at unix time {}", v.expires_unix.unwrap_or(0))
                })
            }
            SandboxCmd::Upload {
                id,
                host_dir,
                guest_dir,
                json,
            } => upload(&c, &id, &host_dir, &guest_dir, json).await,
            SandboxCmd::Download {
                id,
                guest_path,
                host_dir,
                json,
            } => download(&c, &id, &guest_path, &host_dir, json).await,
            SandboxCmd::Ls { label, state, json } => {
                let all = c.list(label.as_deref(), state).await?;
                show(json, &all, || print_sandboxes(&all))
            }
            SandboxCmd::Snapshot {
                id,
                name,
                paused,
                json,
            } => {
                let req = SnapshotRequest {
                    name,
                    stay_paused: paused,
                };
                let m = c.snapshot(&id, &req).await?;
                show(json, &m, || {
                    println!("{}", m.name);
                    eprintln!(
                        "saved in {} ms; the sandbox was paused {:.1} ms; {} MiB of RAM",
                        m.took_ms,
                        m.pause_ms.unwrap_or(f64::NAN),
                        m.memory_bytes >> 20
                    );
                })
            }
            SandboxCmd::Fork {
                source,
                count,
                labels,
                ttl,
                net,
                json,
            } => {
                let req = ForkRequest {
                    count,
                    labels: labels.into_iter().collect(),
                    ttl_seconds: ttl,
                    max_processes: None,
                    network: net.policy(),
                };
                let r = c.fork(&source, &req).await?;
                show(json, &r, || {
                    for v in &r.sandboxes {
                        println!("{}", v.info.id);
                    }
                    for f in &r.failed {
                        eprintln!("forkbox: a copy failed: {f}");
                    }
                    eprintln!(
                        "{} of {count} copies from snapshot {} in {} ms",
                        r.sandboxes.len(),
                        r.snapshot,
                        r.duration_ms
                    );
                })?;
                Ok(if r.failed.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                })
            }
            SandboxCmd::Rm { id, json } => {
                let v = c.delete(&id).await?;
                show(json, &v, || println!("removed {id}"))
            }
        }
    })
}

/// `v` as JSON, or as `text` prints it for people.
fn show(json: bool, v: &impl serde::Serialize, text: impl FnOnce()) -> anyhow::Result<ExitCode> {
    if json {
        crate::print_json(v)?;
    } else {
        text();
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs a command: detached (prints its id), plain (`--json`: one result) or streamed.
async fn exec(
    c: &Client,
    id: &str,
    req: &ExecRequest,
    detach: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if detach {
        println!("{}", c.start_command(id, req).await?.command_id);
        return Ok(ExitCode::SUCCESS);
    }
    if json {
        let r = c.exec(id, req).await?;
        crate::print_json(&r)?;
        return Ok(ExitCode::from(r.exit_code.clamp(0, 255) as u8));
    }
    follow(c.exec_events(id, req).await?).await
}

async fn upload(
    c: &Client,
    id: &str,
    host_dir: &std::path::Path,
    guest_dir: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let v = c.upload_dir(id, host_dir, guest_dir).await?;
    show(json, &v, || {
        println!(
            "uploaded {} to {id}:{guest_dir} ({} bytes compressed)",
            host_dir.display(),
            v.bytes
        )
    })
}

async fn download(
    c: &Client,
    id: &str,
    guest_path: &str,
    host_dir: &std::path::Path,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let files = c.download_into(id, guest_path, host_dir).await?;
    show(
        json,
        &serde_json::json!({ "files": files, "dest": host_dir }),
        || {
            println!(
                "downloaded {id}:{guest_path} to {} ({files} files)",
                host_dir.display()
            )
        },
    )
}

fn print_sandboxes(all: &[SandboxView]) {
    if all.is_empty() {
        println!("no sandboxes");
        return;
    }
    println!(
        "{:<16} {:<11} {:<24} {:<6} {:>5} {:>8}",
        "ID", "STATE", "IMAGE", "ACCEL", "CPUS", "MEMORY"
    );
    for v in all {
        let state = match v.state {
            SandboxState::Running => "running",
            SandboxState::DiskFull => "disk-full",
            SandboxState::Hibernated => "hibernated",
            SandboxState::Failed => "failed",
        };
        println!(
            "{:<16} {:<11} {:<24} {:<6} {:>5} {:>5} MiB",
            v.info.id, state, v.info.image, v.info.accel.accel, v.info.cpus, v.info.memory_mib
        );
    }
}

/// A `--state` value, parsed once.
pub fn parse_state(s: &str) -> Result<SandboxState, String> {
    serde_json::from_value(serde_json::Value::String(s.replace('-', "_")))
        .map_err(|_| format!("{s:?} is not one of running, disk_full, hibernated, failed"))
}
