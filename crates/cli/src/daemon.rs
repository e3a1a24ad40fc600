//! `forkbox sandbox ...`: the CLI as a client of the daemon's HTTP API (`serve` runs the daemon).

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use forkbox_client::{Client, Endpoint, Events};
use forkbox_engine::api::{
    CommandEvent, CreateRequest, ExecRequest, ForkRequest, SandboxState, SandboxView,
    SnapshotRequest, TtlAction,
};
use forkbox_engine::paths::Paths;

pub use crate::sandbox_args::*;

/// `forkbox sandbox port-forward`: starts, closes or lists forwards.
async fn port_forward(c: &Client, a: PortArgs) -> anyhow::Result<ExitCode> {
    let (id, json, address) = (a.id.as_str(), a.json, a.address);
    match (a.ports, a.close) {
        (None, true) => anyhow::bail!("--close needs the forward's HOST_PORT"),
        (Some((Some(_), _)), true) => {
            anyhow::bail!("--close takes the forward's HOST_PORT alone")
        }
        (Some((None, host_port)), true) => {
            let d = c.close_port(id, host_port).await?;
            show(json, &d, || println!("closed {}", d.deleted))
        }
        (Some((host_port, guest_port)), false) => {
            let req = forkbox_engine::api::PortRequest {
                guest_port,
                host_port,
                address,
            };
            let v = c.forward_port(id, &req).await?;
            show(json, &v, || {
                println!("{}", v.url);
                eprintln!(
                    "{}:{} -> guest port {} of {id} (until `forkbox sandbox port-forward {id} --close {}` or the sandbox goes)",
                    v.address, v.host_port, v.guest_port, v.host_port
                );
            })
        }
        (None, false) => {
            let all = c.list_ports(id).await?;
            show(json, &all, || {
                for v in &all {
                    println!("{}:{}\t{}\t{}", v.address, v.host_port, v.guest_port, v.url);
                }
            })
        }
    }
}

/// The runtime the CLI's commands run on: one thread (see `run::run` for why it matters there).
pub fn current_thread() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// This home's daemon, if it answers (never started here).
pub(crate) async fn running_daemon(paths: &Paths) -> anyhow::Result<Option<Client>> {
    let socket = forkbox_server::socket_path(paths);
    if !forkbox_server::is_running(&socket).await {
        return Ok(None);
    }
    Ok(Some(Client::new(Endpoint::Unix(socket))?))
}

/// The daemon of this forkbox home (started if none runs), or the API `FORKBOX_API` names:
/// `unix:/path/to.sock` (a private API such as the one `forkbox migrate` gives host porters),
/// or `http://host:port` with the bearer token in `FORKBOX_TOKEN`.
pub(crate) async fn connect(paths: &Paths) -> anyhow::Result<Client> {
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
                crate::serve::start_daemon(paths).await?;
            }
            Endpoint::Unix(socket)
        }
    };
    Ok(Client::new(endpoint)?)
}

/// Awaits `fut`, saying `what` on standard error once it has taken more than a second.
pub async fn said_after<T>(fut: impl std::future::Future<Output = T>, what: Option<&str>) -> T {
    let Some(what) = what else {
        return fut.await;
    };
    tokio::pin!(fut);
    tokio::select! {
        v = &mut fut => return v,
        _ = tokio::time::sleep(Duration::from_secs(1)) => eprintln!("forkbox: {what}…"),
    }
    fut.await
}

/// Writes a command's events (stdout, stderr) as they come; returns its exit code.
async fn follow(events: Events<CommandEvent>) -> anyhow::Result<ExitCode> {
    let ended = drain(events, |stream, data| match stream {
        forkbox_engine::api::Stream::Stdout => {
            let mut o = std::io::stdout().lock();
            o.write_all(data)?;
            o.flush()
        }
        forkbox_engine::api::Stream::Stderr => {
            let mut e = std::io::stderr().lock();
            e.write_all(data)?;
            e.flush()
        }
    })
    .await?;
    Ok(match ended {
        Ok(exit) => {
            if exit.timed_out {
                eprintln!(
                    "forkbox: the command timed out; it and every process it started were killed"
                );
            }
            ExitCode::from(exit.exit_code.clamp(0, 255) as u8)
        }
        Err(code) => ExitCode::from(code.clamp(0, 255) as u8),
    })
}

/// Hands a command's output to `sink` as it comes, to its end: how it exited, or the exit
/// code a shell gives a command that could not start (127, 126), said on standard error.
pub(crate) async fn drain(
    mut events: Events<CommandEvent>,
    mut sink: impl FnMut(forkbox_engine::api::Stream, &[u8]) -> std::io::Result<()>,
) -> anyhow::Result<Result<forkbox_engine::api::ExitInfo, i32>> {
    use base64::Engine as _;
    use forkbox_engine::api::Stream;
    let b64 = base64::engine::general_purpose::STANDARD;
    while let Some(ev) = events.next().await? {
        match ev {
            CommandEvent::Stdout { data_b64 } => {
                sink(Stream::Stdout, &b64.decode(data_b64).unwrap_or_default())?
            }
            CommandEvent::Stderr { data_b64 } => {
                sink(Stream::Stderr, &b64.decode(data_b64).unwrap_or_default())?
            }
            CommandEvent::Exit(exit) => return Ok(Ok(exit)),
            CommandEvent::Error {
                message,
                exit_code: Some(code),
            } => {
                eprintln!("forkbox: {message}");
                return Ok(Err(code));
            }
            CommandEvent::Error { message, .. } => bail!("{message}"),
            CommandEvent::Command { .. } => {}
        }
    }
    bail!("the daemon's stream ended before the command did")
}

/// `forkbox sandbox hibernate [--disk-only] ID...`.
async fn hibernate(
    c: &Client,
    ids: &[String],
    disk_only: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    each(ids, json, "hibernated", async |id| match disk_only {
        true => c.hibernate_files_only(id).await,
        false => c.hibernate(id).await,
    })
    .await
}

pub fn sandbox(paths: &Paths, cmd: SandboxCmd) -> anyhow::Result<ExitCode> {
    let rt = current_thread()?;
    rt.block_on(async {
        let c = connect(paths).await?;
        match cmd {
            SandboxCmd::Create(args) => create(paths, &c, args).await,
            SandboxCmd::Hibernate {
                ids,
                disk_only,
                json,
            } => hibernate(&c, &ids, disk_only, json).await,
            SandboxCmd::PortForward(a) => port_forward(&c, a).await,
            SandboxCmd::Network { id, net, json } => crate::network::set(&c, &id, &net, json).await,
            SandboxCmd::Idle(a) => idle(&c, a).await,
            SandboxCmd::Logs { id, json } => logs(&c, &id, json).await,
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
                interactive,
                tty,
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
                if !interactive {
                    refuse_unread_stdin()?;
                }
                let how = How {
                    interactive,
                    tty,
                    detach,
                    json,
                };
                exec(&c, &id, req, how).await
            }
            SandboxCmd::Shell { id, cwd } => shell(&c, &id, cwd).await,
            SandboxCmd::Attach { id, command_id } => {
                follow(c.attach(&id, &command_id).await?).await
            }
            SandboxCmd::Kill {
                id,
                command_id,
                signal,
                json,
            } => {
                c.signal(&id, &command_id, signal).await?;
                show(
                    json,
                    &serde_json::json!({ "command_id": command_id, "signal": signal }),
                    || {},
                )
            }
            SandboxCmd::Ttl { id, seconds, json } => ttl(&c, &id, seconds, json).await,
            SandboxCmd::Upload {
                id,
                host_dir,
                guest_dir,
                json,
            } => crate::copy::upload(&c, &id, &host_dir, &guest_dir, json).await,
            SandboxCmd::Download {
                id,
                guest_path,
                host_dir,
                json,
            } => crate::copy::download(&c, &id, &guest_path, &host_dir, json).await,
            SandboxCmd::Ls(a) => ls(&c, a).await,
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
                snapshot_one(&c, &id, &req, json).await
            }
            SandboxCmd::Fork(args) => fork(&c, args).await,
            SandboxCmd::Rm { ids, json } => {
                each(&ids, json, "removed", async |id| c.delete(id).await).await
            }
        }
    })
}

/// `forkbox sandbox ls`: the sandboxes (with a label, in a state), a table or their ids.
/// `forkbox sandbox idle`: a new idle policy, said back.
async fn idle(c: &Client, a: IdleCmdArgs) -> anyhow::Result<ExitCode> {
    let request = forkbox_engine::api::IdleRequest {
        idle: a.after.0.map(forkbox_engine::api::IdlePolicy::after),
        wake_on_use: a.no_wake.then_some(false),
    };
    let id = &a.id;
    let v = c.set_idle(id, &request).await?;
    show(a.json, &v, || match v.idle {
        Some(p) => println!(
            "{id} sleeps after {} s unused{}",
            p.after_secs,
            if v.wake_on_use {
                "; use wakes it"
            } else {
                "; `resume` wakes it"
            }
        ),
        None => println!("{id} does not sleep by itself"),
    })
}

async fn logs(c: &Client, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let v = c.get(id).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    show(json, &v.network_log, || {
        if v.network_log.is_empty() {
            println!("the host has refused or ended none of {id}'s connections");
        }
        for n in &v.network_log {
            println!("{:>6} s ago  {}", now.saturating_sub(n.at_unix), n.text);
        }
    })
}

async fn ls(c: &Client, a: LsArgs) -> anyhow::Result<ExitCode> {
    let filter = forkbox_client::ListFilter {
        label: a.label.as_deref(),
        state: a.state,
        node: a.node.as_deref(),
    };
    let (quiet, json) = (a.quiet, a.json);
    let all = c.list_where(filter).await?;
    show(json, &all, || match quiet {
        true => all.iter().for_each(|v| println!("{}", v.info.id)),
        false => print_sandboxes(&all),
    })
}

/// `forkbox sandbox ttl`: a new TTL, counted from now.
async fn ttl(c: &Client, id: &str, seconds: u64, json: bool) -> anyhow::Result<ExitCode> {
    let v = c.set_ttl(id, seconds).await?;
    show(json, &v, || {
        println!("{id} expires at unix time {}", v.expires_unix.unwrap_or(0))
    })
}

/// `forkbox sandbox shell`: a login shell (bash if the image has it) on a terminal.
async fn shell(c: &Client, id: &str, cwd: Option<String>) -> anyhow::Result<ExitCode> {
    let req = ExecRequest {
        shell: Some(
            "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi".into(),
        ),
        cwd,
        ..Default::default()
    };
    let how = How {
        interactive: true,
        tty: true,
        detach: false,
        json: false,
    };
    exec(c, id, req, how).await
}

/// `forkbox sandbox snapshot`: the snapshot's name on stdout, what the save took on stderr.
async fn snapshot_one(
    c: &Client,
    id: &str,
    req: &SnapshotRequest,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let m = c.snapshot(id, req).await?;
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

/// `forkbox sandbox create`: builds the bundled image on first use (when the daemon is this
/// host's), then creates through the daemon.
async fn create(paths: &Paths, c: &Client, a: CreateArgs) -> anyhow::Result<ExitCode> {
    let mut cluster_builds = None;
    if a.snapshot.is_none() && Endpoint::from_env()?.is_none() {
        let reference: forkbox_engine::image::ImageRef = match &a.image {
            Some(i) => i.parse()?,
            None => forkbox_engine::sandbox::SandboxConfig::default().image,
        };
        if crate::bundled::ensure_for(paths, c, &reference).await? {
            cluster_builds = Some(reference.name.clone());
        }
    }
    let (idle, wake_on_use) = a.idle.policy();
    let req = CreateRequest {
        network: a.net.policy(),
        image: a.image,
        cpus: a.cpus,
        memory_mib: a.memory,
        accel: a.accel,
        labels: a.labels.into_iter().collect(),
        ttl_seconds: a.ttl,
        max_processes: None,
        snapshot: a.snapshot,
        disk_gib: a.disk_gib,
        node: a.node,
        secrets: a.net.secrets.clone(),
        ttl_action: a.ttl_action.map(|t| match t {
            TtlArg::Delete => TtlAction::Delete,
            TtlArg::Hibernate => TtlAction::Hibernate,
            TtlArg::HibernateDisk => TtlAction::HibernateDisk,
        }),
        idle,
        wake_on_use,
        volumes: a.volumes,
    };
    let creating = said_after(
        c.create(&req),
        Some(
            "creating the sandbox (the first of an image and size boots once to make its \
             template: a few seconds)",
        ),
    );
    let v = match &cluster_builds {
        Some(image) => crate::bundled::with_cluster_build(c, image, creating).await?,
        None => creating.await?,
    };
    show(a.json, &v, || println!("{}", v.info.id))
}

/// `forkbox sandbox fork`: prints the copies' ids, says any that failed (exit 1 then).
/// What a snapshot's move to another node cost, in words.
fn transfer_line(t: &forkbox_engine::api::Transfer) -> String {
    let what = match (&t.snapshot, &t.image) {
        (Some(s), Some(i)) => format!("snapshot {s} (and image {i})"),
        (Some(s), None) => format!("snapshot {s}"),
        (None, Some(i)) => format!("image {i}"),
        (None, None) => "nothing".into(),
    };
    format!(
        "{what} brought to node {} from {}: {:.1} MiB moved in {} chunks ({} read from \
         files node {} held, {} of {} RAM layers held), manifest {} KiB, {} ms",
        t.node,
        t.from.join(", "),
        t.bytes_moved as f64 / 1048576.0,
        t.chunks_fetched,
        t.chunks_local,
        t.node,
        t.layers_held,
        t.layers,
        t.manifest_bytes >> 10,
        t.duration_ms
    )
}

async fn fork(c: &Client, a: ForkArgs) -> anyhow::Result<ExitCode> {
    let (idle, wake_on_use) = a.idle.policy();
    let req = ForkRequest {
        count: a.count,
        labels: a.labels.into_iter().collect(),
        ttl_seconds: a.ttl,
        max_processes: None,
        network: a.net.policy(),
        node: a.node,
        secrets: a.net.secrets.clone(),
        idle,
        wake_on_use,
        volumes: a.volumes,
    };
    let r = c.fork(&a.source, &req).await?;
    show(a.json, &r, || {
        for v in &r.sandboxes {
            println!("{}", v.info.id);
        }
        for f in &r.failed {
            eprintln!("forkbox: a copy failed: {f}");
        }
        eprintln!(
            "{} of {} copies from snapshot {} in {} ms",
            r.sandboxes.len(),
            a.count,
            r.snapshot,
            r.duration_ms
        );
        if let Some(t) = &r.transfer {
            eprintln!("{}", transfer_line(t));
        }
        for n in &r.notes {
            eprintln!("forkbox: {n}");
        }
    })?;
    Ok(if r.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Does `op` to each of `ids` in turn, going on past failures (each said on stderr); prints
/// what was done (`--json`: an array); exit 1 when any failed.
pub(crate) async fn each<T: serde::Serialize>(
    ids: &[String],
    json: bool,
    verb: &str,
    op: impl AsyncFn(&str) -> Result<T, forkbox_client::ClientError>,
) -> anyhow::Result<ExitCode> {
    let mut done = Vec::new();
    let mut failed = 0;
    for id in ids {
        match op(id).await {
            Ok(v) => {
                if !json {
                    println!("{verb} {id}");
                }
                done.push(v);
            }
            Err(e) => {
                failed += 1;
                eprintln!("forkbox: error: {id}: {e}");
            }
        }
    }
    if json {
        crate::print_json(&done)?;
    }
    Ok(match failed {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}

/// `v` as JSON, or as `text` prints it for people.
pub(crate) fn show(
    json: bool,
    v: &impl serde::Serialize,
    text: impl FnOnce(),
) -> anyhow::Result<ExitCode> {
    if json {
        crate::print_json(v)?;
    } else {
        text();
    }
    Ok(ExitCode::SUCCESS)
}

/// How `sandbox exec` runs its command.
pub(crate) struct How {
    pub interactive: bool,
    pub tty: bool,
    pub detach: bool,
    pub json: bool,
}

/// Runs a command: detached (prints its id), plain (`--json`: one result), streamed, or
/// started and followed with this process's standard input passed to it and/or on a terminal.
pub(crate) async fn exec(
    c: &Client,
    id: &str,
    mut req: ExecRequest,
    how: How,
) -> anyhow::Result<ExitCode> {
    if how.detach {
        let started = c.start_command(id, &req).await?;
        return show(how.json, &started, || println!("{}", started.command_id));
    }
    if how.json {
        let r = c.exec(id, &req).await?;
        crate::print_json(&r)?;
        return Ok(ExitCode::from(r.exit_code.clamp(0, 255) as u8));
    }
    if !how.interactive && !how.tty {
        return follow(c.exec_events(id, &req).await?).await;
    }
    req.stdin = how.interactive;
    if how.tty {
        req.tty = Some(crate::terminal::size().into());
        if !req.env.contains_key("TERM") {
            let term = std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into());
            req.env.insert("TERM".into(), term);
        }
    }
    let cid = c.start_command(id, &req).await?.command_id;
    let events = c.attach(id, &cid).await?;
    // Keys go through as typed while the command runs on a terminal; restored when this ends.
    let _raw = match how.tty && how.interactive {
        true => crate::terminal::RawMode::enter(),
        false => None,
    };
    // Beside the command's output: its input fed, its terminal kept the size of this one. Each
    // goes on until the command ends, unless feeding the input fails.
    let feeding = async {
        if how.interactive {
            c.write_stdin(id, &cid, crate::terminal::stdin_chunks(), true)
                .await
                .context("passing standard input to the command")?;
        }
        std::future::pending::<anyhow::Result<()>>().await
    };
    let resizing = async {
        let winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change());
        if let (true, Ok(mut winch)) = (how.tty, winch) {
            while winch.recv().await.is_some() {
                let _ = c.resize(id, &cid, crate::terminal::size().into()).await;
            }
        }
        std::future::pending::<anyhow::Result<()>>().await
    };
    tokio::select! {
        code = follow(events) => code,
        Err(e) = async { tokio::try_join!(feeding, resizing) } => Err(e),
    }
}

/// A command run without `-i` reads nothing; standard input that holds something (a pipe, a
/// socket, a non-empty file) is refused rather than silently dropped.
fn refuse_unread_stdin() -> anyhow::Result<()> {
    use nix::sys::stat::{fstat, SFlag};
    let Ok(st) = fstat(0) else {
        return Ok(());
    };
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let unread = kind == SFlag::S_IFIFO
        || kind == SFlag::S_IFSOCK
        || (kind == SFlag::S_IFREG && st.st_size > 0);
    if unread {
        bail!(
            "standard input is a pipe or a file, but the command would not read it: pass -i to \
             send it to the command, or </dev/null to run without it"
        );
    }
    Ok(())
}

fn print_sandboxes(all: &[SandboxView]) {
    if all.is_empty() {
        println!("no sandboxes");
        return;
    }
    // A cluster's listing says each sandbox's node; one daemon's has no such column.
    let nodes = all.iter().any(|v| v.node.is_some());
    let node_col = |n: &str| match nodes {
        true => format!(" {n:<12}"),
        false => String::new(),
    };
    println!(
        "{:<16} {:<11}{} {:<24} {:<6} {:>5} {:>8}",
        "ID",
        "STATE",
        node_col("NODE"),
        "IMAGE",
        "ACCEL",
        "CPUS",
        "MEMORY"
    );
    for v in all {
        let state = match v.state {
            SandboxState::Running => "running",
            SandboxState::DiskFull => "disk-full",
            SandboxState::Hibernated => "hibernated",
            SandboxState::Sleeping => "sleeping",
            SandboxState::Failed => "failed",
            SandboxState::Lost => "lost",
        };
        println!(
            "{:<16} {:<11}{} {:<24} {:<6} {:>5} {:>5} MiB",
            v.info.id,
            state,
            node_col(v.node.as_deref().unwrap_or("-")),
            v.info.image,
            v.info.accel.accel,
            v.info.cpus,
            v.info.memory_mib
        );
    }
}
