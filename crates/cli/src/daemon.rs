//! `forkbox serve` and `forkbox sandbox ...`: the CLI as a client of the daemon's HTTP API.

use forkbox_engine::snapshot::SnapshotMeta;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use forkbox_engine::api::{CreateRequest, ExecRequest, ExecResult, SandboxView};
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
        #[arg(long)]
        state: Option<String>,
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
        let c = Client::connect(paths).await?;
        match cmd {
            SnapshotCmd::Ls { json } => {
                let all: Vec<SnapshotMeta> = c.call(c.http.get(c.url("/snapshots"))).await?;
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
                let v: serde_json::Value = c
                    .call(c.http.delete(c.url(&format!("/snapshots/{name}"))))
                    .await?;
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

pub fn serve(paths: Paths, listen: Option<std::net::SocketAddr>) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(forkbox_server::serve(paths, listen))
        .context("the forkbox daemon failed")?;
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

struct Client {
    http: reqwest::Client,
    /// `http://forkbox/v1` over a Unix socket, or a TCP daemon's `/v1`.
    base: String,
}

impl Client {
    /// The daemon of this forkbox home (started if none runs), or the API `FORKBOX_API` names:
    /// `unix:/path/to.sock` (a private API such as the one `forkbox migrate` gives host
    /// porters), or `http://host:port` with the bearer token in `FORKBOX_TOKEN`.
    async fn connect(paths: &Paths) -> anyhow::Result<Client> {
        let api = std::env::var("FORKBOX_API").unwrap_or_default();
        if api.starts_with("http://") || api.starts_with("https://") {
            let mut headers = reqwest::header::HeaderMap::new();
            if let Ok(token) = std::env::var("FORKBOX_TOKEN") {
                let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                    .context("FORKBOX_TOKEN is not a valid header value")?;
                v.set_sensitive(true);
                headers.insert(reqwest::header::AUTHORIZATION, v);
            }
            let http = reqwest::Client::builder()
                .default_headers(headers)
                .build()?;
            return Ok(Client {
                http,
                base: format!("{}/v1", api.trim_end_matches('/')),
            });
        }
        let socket = match api
            .strip_prefix("unix:")
            .or(Some(api.as_str()).filter(|a| a.starts_with('/')))
        {
            Some(path) => {
                let socket = std::path::PathBuf::from(path);
                if !forkbox_server::is_running(&socket).await {
                    bail!("no forkbox API answers on {path} (from FORKBOX_API)");
                }
                socket
            }
            None if !api.is_empty() => {
                bail!("FORKBOX_API={api:?}: give unix:/path/to/socket or http://host:port")
            }
            None => {
                let socket = forkbox_server::socket_path(paths);
                if !forkbox_server::is_running(&socket).await {
                    start_daemon(paths).await?;
                }
                socket
            }
        };
        let http = reqwest::Client::builder().unix_socket(socket).build()?;
        Ok(Client {
            http,
            base: "http://forkbox/v1".into(),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> anyhow::Result<T> {
        let resp = send(req).await?;
        let body = resp.bytes().await?;
        serde_json::from_slice(&body).context("unreadable answer from the forkbox daemon")
    }
}

/// Sends a request; an answer other than success becomes an error with the daemon's words.
async fn send(req: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
    let resp = req
        .send()
        .await
        .context("the forkbox daemon did not answer")?;
    if resp.status().is_success() {
        return Ok(resp);
    }
    let status = resp.status();
    let body = resp.bytes().await.unwrap_or_default();
    let msg = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["error"].as_str().map(String::from))
        .unwrap_or_else(|| format!("{status}: {}", String::from_utf8_lossy(&body)));
    bail!("{msg}")
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

/// Runs a command through the daemon's streaming exec, writing its output as it comes.
async fn stream_exec(c: &Client, id: &str, req: &ExecRequest) -> anyhow::Result<ExitCode> {
    let resp = c
        .http
        .post(c.url(&format!("/sandboxes/{id}/exec")))
        .query(&[("stream", "true")])
        .json(req);
    follow(send(resp).await?).await
}

/// Writes a command's NDJSON events (stdout, stderr) as they come; returns its exit code.
/// `resp` is a successful answer (see [`send`]).
async fn follow(resp: reqwest::Response) -> anyhow::Result<ExitCode> {
    use base64::Engine as _;
    use futures_util::StreamExt;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut body = resp.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        pending.extend_from_slice(&chunk.context("the stream from the daemon broke")?);
        while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            let ev: serde_json::Value =
                serde_json::from_slice(&line).context("unreadable event from the daemon")?;
            let data = || {
                b64.decode(ev["data_b64"].as_str().unwrap_or_default())
                    .unwrap_or_default()
            };
            match ev["type"].as_str() {
                Some("stdout") => {
                    let mut o = std::io::stdout().lock();
                    o.write_all(&data())?;
                    o.flush()?;
                }
                Some("stderr") => {
                    let mut e = std::io::stderr().lock();
                    e.write_all(&data())?;
                    e.flush()?;
                }
                Some("exit") => {
                    if ev["timed_out"] == true {
                        eprintln!("forkbox: the command timed out; it and every process it started were killed");
                    }
                    let code = ev["exit_code"].as_i64().unwrap_or(-1);
                    return Ok(ExitCode::from(code.clamp(0, 255) as u8));
                }
                Some("error") => bail!("{}", ev["message"].as_str().unwrap_or("exec failed")),
                _ => {}
            }
        }
    }
    bail!("the daemon's stream ended before the command did")
}

pub fn sandbox(paths: &Paths, cmd: SandboxCmd) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let c = Client::connect(paths).await?;
        match cmd {
            SandboxCmd::Hibernate { id, json } => {
                let v: SandboxView = c.call(c.http.post(c.url(&format!("/sandboxes/{id}/hibernate")))).await?;
                if json {
                    crate::print_json(&v)?;
                } else {
                    println!("hibernated {id}");
                }
                Ok(ExitCode::SUCCESS)
            }
            SandboxCmd::Resume { id, json } => {
                let v: SandboxView = c.call(c.http.post(c.url(&format!("/sandboxes/{id}/resume")))).await?;
                if json {
                    crate::print_json(&v)?;
                } else {
                    println!("resumed {id} in {} ms", v.info.boot_ms);
                }
                Ok(ExitCode::SUCCESS)
            }
            SandboxCmd::Create { image, cpus, memory, accel, labels, ttl, snapshot, ttl_action, disk_gib, net, json } => {
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
                        TtlArg::Delete => forkbox_engine::api::TtlAction::Delete,
                        TtlArg::Hibernate => forkbox_engine::api::TtlAction::Hibernate,
                    }),
                };
                let v: SandboxView = c.call(c.http.post(c.url("/sandboxes")).json(&req)).await?;
                if json {
                    crate::print_json(&v)?;
                } else {
                    println!("{}", v.info.id);
                }
                Ok(ExitCode::SUCCESS)
            }
            SandboxCmd::Exec { id, cwd, env, timeout, json, detach, command } => {
                let req = ExecRequest {
                    argv: Some(command),
                    shell: None,
                    cwd,
                    env: env.into_iter().collect(),
                    timeout_secs: timeout,
                    timeout_ms: None,
                };
                if detach {
                    let v: serde_json::Value = c.call(c.http.post(c.url(&format!("/sandboxes/{id}/commands"))).json(&req)).await?;
                    println!("{}", v["command_id"].as_str().unwrap_or_default());
                    return Ok(ExitCode::SUCCESS);
                }
                if json {
                    let r: ExecResult = c.call(c.http.post(c.url(&format!("/sandboxes/{id}/exec"))).json(&req)).await?;
                    crate::print_json(&r)?;
                    return Ok(ExitCode::from(r.exit_code.clamp(0, 255) as u8));
                }
                stream_exec(&c, &id, &req).await
            }
            SandboxCmd::Attach { id, command_id } => {
                let resp = c
                    .http
                    .get(c.url(&format!("/sandboxes/{id}/commands/{command_id}/events")));
                follow(send(resp).await?).await
            }
            SandboxCmd::Kill { id, command_id, signal } => {
                let resp = c
                    .http
                    .post(c.url(&format!("/sandboxes/{id}/commands/{command_id}/signal")))
                    .json(&serde_json::json!({ "signal": signal }));
                send(resp).await?;
                Ok(ExitCode::SUCCESS)
            }
            SandboxCmd::Ttl { id, seconds, json } => {
                let v: SandboxView = c
                    .call(c.http.post(c.url(&format!("/sandboxes/{id}/ttl"))).json(&serde_json::json!({ "ttl_seconds": seconds })))
                    .await?;
                if json {
                    crate::print_json(&v)?;
                } else {
                    println!("{id} expires at unix time {}", v.expires_unix.unwrap_or(0));
                }
                Ok(ExitCode::SUCCESS)
            }
            SandboxCmd::Upload { id, host_dir, guest_dir, json } => {
                let (rx, packer) = forkbox_engine::files::pack(&host_dir)?;
                let stream = tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok::<_, std::io::Error>);
                let req = c
                    .http
                    .put(c.url(&format!("/sandboxes/{id}/archive")))
                    .query(&[("path", &guest_dir)])
                    .body(reqwest::Body::wrap_stream(stream));
                let v: serde_json::Value = c.call(req).await?;
                packer.await?.with_context(|| format!("could not pack {}", host_dir.display()))?;
                if json {
                    crate::print_json(&v)?;
                } else {
                    println!("uploaded {} to {id}:{guest_dir} ({} bytes compressed)", host_dir.display(), v["bytes"]);
                }
                Ok(ExitCode::SUCCESS)
            }
            SandboxCmd::Download { id, guest_path, host_dir, json } => {
                use futures_util::StreamExt;
                let resp = c
                    .http
                    .get(c.url(&format!("/sandboxes/{id}/archive")))
                    .query(&[("path", &guest_path)]);
                let resp = send(resp).await?;
                let (tx, rx) = tokio::sync::mpsc::channel(8);
                let feed = tokio::spawn(async move {
                    let mut body = resp.bytes_stream();
                    while let Some(item) = body.next().await {
                        let item = item.map(|b| b.to_vec()).map_err(|e| forkbox_engine::files::TransferError::Io {
                            what: "download from the daemon (the sandbox may have refused the path)".into(),
                            source: std::io::Error::other(e),
                        });
                        if tx.send(item).await.is_err() {
                            break;
                        }
                    }
                });
                let files = forkbox_engine::files::unpack_into(rx, &host_dir).await;
                feed.abort();
                let files = files?;
                if json {
                    crate::print_json(&serde_json::json!({ "files": files, "dest": host_dir }))?;
                } else {
                    println!("downloaded {id}:{guest_path} to {} ({files} files)", host_dir.display());
                }
                Ok(ExitCode::SUCCESS)
            }
            SandboxCmd::Ls { label, state, json } => {
                let mut req = c.http.get(c.url("/sandboxes"));
                if let Some(l) = &label {
                    req = req.query(&[("label", l)]);
                }
                if let Some(s) = &state {
                    req = req.query(&[("state", s)]);
                }
                let all: Vec<SandboxView> = c.call(req).await?;
                if json {
                    crate::print_json(&all)?;
                } else if all.is_empty() {
                    println!("no sandboxes");
                } else {
                    println!("{:<16} {:<11} {:<24} {:<6} {:>5} {:>8}", "ID", "STATE", "IMAGE", "ACCEL", "CPUS", "MEMORY");
                    for v in all {
                        let state = match v.state {
                            forkbox_engine::api::SandboxState::Running => "running",
                            forkbox_engine::api::SandboxState::DiskFull => "disk-full",
                            forkbox_engine::api::SandboxState::Hibernated => "hibernated",
                            forkbox_engine::api::SandboxState::Failed => "failed",
                        };
                        println!(
                            "{:<16} {:<11} {:<24} {:<6} {:>5} {:>5} MiB",
                            v.info.id, state, v.info.image, v.info.accel.accel, v.info.cpus, v.info.memory_mib
                        );
                    }
                }
                Ok(ExitCode::SUCCESS)
            }
            SandboxCmd::Snapshot { id, name, paused, json } => {
                let req = forkbox_engine::api::SnapshotRequest { name, stay_paused: paused };
                let m: SnapshotMeta = c
                    .call(c.http.post(c.url(&format!("/sandboxes/{id}/snapshot"))).json(&req))
                    .await?;
                if json {
                    crate::print_json(&m)?;
                } else {
                    println!("{}", m.name);
                    eprintln!(
                        "saved in {} ms; the sandbox was paused {:.1} ms; {} MiB of RAM",
                        m.took_ms,
                        m.pause_ms.unwrap_or(f64::NAN),
                        m.memory_bytes >> 20
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
            SandboxCmd::Fork { source, count, labels, ttl, net, json } => {
                let req = forkbox_engine::api::ForkRequest {
                    count,
                    labels: labels.into_iter().collect(),
                    ttl_seconds: ttl,
                    max_processes: None,
                    network: net.policy(),
                };
                let path = if source.starts_with("sb-") { "sandboxes" } else { "snapshots" };
                let r: forkbox_engine::api::ForkResult = c
                    .call(c.http.post(c.url(&format!("/{path}/{source}/fork"))).json(&req))
                    .await?;
                if json {
                    crate::print_json(&r)?;
                } else {
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
                }
                Ok(if r.failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
            }
            SandboxCmd::Rm { id, json } => {
                let v: serde_json::Value = c.call(c.http.delete(c.url(&format!("/sandboxes/{id}")))).await?;
                if json {
                    crate::print_json(&v)?;
                } else {
                    println!("removed {id}");
                }
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}
