//! `forkbox`: the command line. A thin adapter over `forkbox-engine`.
#![forbid(unsafe_code)]

mod announce;
mod bundled;
mod cluster;
mod copy;
mod daemon;
mod images;
mod local;
mod logfile;
mod migrate;
mod network;
mod run;
mod sandbox_args;
mod serve;
mod snapshots;
mod terminal;
mod units;
mod volumes;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use forkbox_engine::image::ImageStore;
use forkbox_engine::paths::Paths;
use forkbox_engine::setup;
use forkbox_engine::vm::AccelChoice;

/// Exit code when forkbox itself fails (as opposed to the command it ran).
pub const EXIT_FORKBOX: u8 = 125;

#[derive(Parser)]
#[command(
    name = "forkbox",
    version,
    about = "Disposable microVM sandboxes for running untrusted builds and tests"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// Where `forkbox setup` takes QEMU from.
#[derive(Clone, Copy, clap::ValueEnum)]
enum QemuFrom {
    Recent,
    System,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what forkbox needs on this host (QEMU, qemu-img, mmdebstrap, CA certificates, e2fsprogs, a guest kernel).
    Setup {
        /// Which QEMU: `recent` (9.0 or later: on Debian 12, QEMU 10.0 from bookworm-backports,
        /// added as an apt source of its own) or `system` (the distribution's or the one
        /// installed, with the weaknesses `forkbox doctor` lists).
        #[arg(long, value_enum, default_value_t = QemuFrom::Recent)]
        qemu: QemuFrom,
        /// Also build the images of E2B's templates `base` and `code-interpreter-v1` now, with
        /// their progress (else a daemon with E2B's API builds them when it starts).
        #[arg(long)]
        e2b: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Build, list and remove images.
    Image {
        #[command(subcommand)]
        command: images::ImageCmd,
    },
    /// Run one command in a fresh sandbox, stream its output, exit with its exit code. With
    /// the daemon running, the sandbox is a ready copy from its warm pool (FORKBOX_RUN_LOCAL=1:
    /// made in this process).
    Run(run::RunArgs),
    /// Run the daemon that keeps sandboxes between calls (the `sandbox` commands start it when
    /// none runs).
    Serve {
        /// Also listen on this TCP address (e.g. 127.0.0.1:7070); requests there need a token
        /// from `forkbox token create`.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Start the daemon in the background (unless one runs) and return once it listens:
        /// what the SDKs run when they find no daemon.
        #[arg(long, conflicts_with = "listen")]
        detach: bool,
        /// A host directory MCP sessions at /mcp may upload from and download into
        /// (repeatable; none by default).
        #[arg(long = "mcp-root", value_name = "DIR")]
        mcp_roots: Vec<PathBuf>,
        #[command(flatten)]
        e2b: serve::E2bArgs,
        #[command(flatten)]
        cluster: serve::ClusterArgs,
    },
    /// Serve forkbox to a coding agent as an MCP server over stdin/stdout (tools: sandbox_create,
    /// exec, read/write/edit_file, list_dir, upload, download, git_diff, snapshot, fork,
    /// hibernate, resume, destroy, list_sandboxes, run_tests). The session's sandboxes are
    /// deleted when it ends unless created persistent.
    Mcp {
        /// A host directory the session may upload from and download into (repeatable; none
        /// by default).
        #[arg(long = "root", value_name = "DIR")]
        roots: Vec<PathBuf>,
        /// See and act on every sandbox of the daemon, not only the session's own.
        #[arg(long)]
        all: bool,
    },
    /// A cluster of forkbox nodes on etcd: its nodes, their capacity and etcd's health.
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCmd,
    },
    /// One node of a cluster: drain it (no new placements).
    Node {
        #[command(subcommand)]
        command: cluster::NodeCmd,
    },
    /// Bearer tokens for the daemon's TCP listener.
    Token {
        #[command(subcommand)]
        command: TokenCmd,
    },
    /// Long-lived sandboxes, kept by the daemon.
    Sandbox {
        #[command(subcommand)]
        command: daemon::SandboxCmd,
    },
    /// Port code to a new toolchain: baseline on the old image, one fork per plan on the new
    /// one, accept only ports that lose no test. Exit 0 with a winner, 1 without, 2 on misuse.
    Migrate(migrate::MigrateArgs),
    /// Snapshots of sandboxes (make them with `forkbox sandbox snapshot`).
    Snapshot {
        #[command(subcommand)]
        command: snapshots::SnapshotCmd,
    },
    /// Volumes: disks that outlive sandboxes (`--volume NAME:/path[:ro]` mounts one).
    Volume {
        #[command(subcommand)]
        command: volumes::VolumeCmd,
    },
    /// Check how well this host confines sandboxes (KVM or TCG, cgroups, seccomp, the home's
    /// permissions, the jail's uids, QEMU's known issues) and say what to fix. Exit 1 when a
    /// check fails.
    Doctor {
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// Accelerator to check: auto, kvm or tcg.
        #[arg(long, default_value = "auto", env = "FORKBOX_ACCEL")]
        accel: AccelChoice,
    },
    /// The daemon of this forkbox home: is it running, and stop it.
    Daemon {
        #[command(subcommand)]
        command: serve::DaemonCmd,
    },
    /// The daemon's warm pool of ready sandboxes (`FORKBOX_POOL_SIZE` per image and size, up
    /// to `FORKBOX_POOL_MAX` after a burst of creates, `FORKBOX_POOL_MEMORY_MIB` in all, given
    /// back after `FORKBOX_POOL_IDLE_SECS` unused).
    Pool {
        #[command(subcommand)]
        command: serve::PoolCmd,
    },
    /// Print a completion script for a shell, e.g. `forkbox completions bash >
    /// /etc/bash_completion.d/forkbox`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print forkbox's man page (roff), or write one page per command into a directory.
    Man {
        /// Write forkbox.1, forkbox-run.1, forkbox-sandbox-exec.1, … into this directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Print every command's --help as one Markdown page instead (docs/reference/cli.md).
        #[arg(long, conflicts_with = "dir")]
        markdown: bool,
    },
    /// Show forkbox's paths, guest kernels, images and the accelerator this host gets.
    Info {
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// Accelerator to check: auto, kvm or tcg.
        #[arg(long, default_value = "auto", env = "FORKBOX_ACCEL")]
        accel: AccelChoice,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Create a token; it is printed once and only its hash is kept (in this host's state, or
    /// with --cluster in the cluster's etcd, where every node accepts it).
    Create {
        /// A name to tell the token by.
        #[arg(long, default_value = "default")]
        name: String,
        /// Store it in this cluster's etcd (client URLs, comma-separated; the cluster secret
        /// from --cluster-secret-file or FORKBOX_CLUSTER_SECRET).
        #[arg(long, value_name = "ETCD_URL[,…]", value_delimiter = ',')]
        cluster: Vec<String>,
        /// A file holding the cluster secret (or set FORKBOX_CLUSTER_SECRET).
        #[arg(long, value_name = "FILE", requires = "cluster")]
        cluster_secret_file: Option<PathBuf>,
        /// For an etcd on https: a directory with the CA and a certificate of it (as
        /// `serve --cluster-tls`).
        #[arg(
            long,
            env = "FORKBOX_CLUSTER_TLS",
            value_name = "DIR",
            requires = "cluster"
        )]
        cluster_tls: Option<PathBuf>,
        /// Take the token from standard input instead of making one (a token kept in a
        /// Kubernetes Secret, say; at least 32 characters).
        #[arg(long, requires = "cluster")]
        stdin: bool,
        /// Make it in the shape of an E2B API key (`e2b_` and hex), which E2B's SDKs before
        /// 2.32 insist on, for E2B_API_KEY.
        #[arg(long, conflicts_with = "stdin")]
        e2b: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke the cluster's tokens of this name: every node refuses them within a second.
    Revoke {
        /// The tokens' name (`token create --name`).
        name: String,
        #[command(flatten)]
        reach: cluster::Reach,
    },
}

fn main() -> ExitCode {
    // Nothing this process inherited reaches a child (a QEMU least of all); the daemon, which
    // lives long and starts every QEMU, drops it altogether.
    let inherited = forkbox_engine::fds::seal_inherited();
    #[cfg(forkbox_embedded_agent)]
    provide_embedded_agent();
    // `--json` anywhere: errors are JSON on stdout too, with a stable `error.code`.
    let json = std::env::args_os().any(|a| a == "--json");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if json && e.use_stderr() => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            json_error("usage", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    let serving = matches!(cli.command, Cmd::Serve { detach: false, .. });
    if serving {
        forkbox_engine::fds::close_inherited();
    }
    match start(cli, serving, inherited) {
        Ok(code) => code,
        Err(e) if json => {
            json_error(error_code(&e), &format!("{e:#}"));
            ExitCode::from(EXIT_FORKBOX)
        }
        Err(e) => {
            let mut msg = format!("forkbox: error: {e}");
            for cause in e.chain().skip(1) {
                // An error that quotes its cause already said it.
                let cause = cause.to_string();
                if !msg.contains(&cause) {
                    msg += &format!("\n  caused by: {cause}");
                }
            }
            eprintln!("{msg}");
            ExitCode::from(EXIT_FORKBOX)
        }
    }
}

/// The guest agent built into this binary (see build.rs), put in forkbox's home where the
/// engine (and a daemon this process starts) finds it, when no agent lies where it looks: an
/// installed `forkbox` needs nothing beside it. Runs before any thread starts.
#[cfg(forkbox_embedded_agent)]
fn provide_embedded_agent() {
    const AGENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/forkbox-agent"));
    // An agent named by the user is theirs to get right: the engine's error names it.
    if std::env::var_os("FORKBOX_AGENT").is_some_and(|p| !p.is_empty())
        || forkbox_engine::agent_bin::present()
    {
        return;
    }
    let paths = Paths::from_env();
    let path = paths.home().join("agent").join("forkbox-agent");
    let same = std::fs::metadata(&path).is_ok_and(|m| m.len() == AGENT.len() as u64)
        && std::fs::read(&path).is_ok_and(|b| b == AGENT);
    if !same {
        use std::os::unix::fs::PermissionsExt;
        let written = paths
            .secure_home()
            .and_then(|_| std::fs::create_dir_all(paths.home().join("agent")))
            .and_then(|()| forkbox_engine::paths::write_atomic(&path, AGENT))
            .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)));
        if let Err(e) = written {
            // The engine then says in its own words that it has no agent.
            eprintln!(
                "forkbox: cannot put the built-in guest agent in {}: {e}",
                path.display()
            );
            return;
        }
    }
    std::env::set_var("FORKBOX_AGENT", &path);
}

/// `{"error": {"code": …, "message": …}}` on stdout.
fn json_error(code: &str, message: &str) {
    let _ = print_json(&serde_json::json!({ "error": { "code": code, "message": message } }));
}

/// The stable name of what failed: the daemon's `code`, or the engine's for what the CLI did
/// itself, the same names the API answers with.
fn error_code(e: &anyhow::Error) -> &str {
    use forkbox_client::{ClientError, TransferFailed};
    use forkbox_engine::error::{ImageError, SandboxError, SetupError};
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<ClientError>() {
            return c.code();
        }
        if let Some(t) = cause.downcast_ref::<TransferFailed>() {
            return match t {
                TransferFailed::Client(c) => c.code(),
                _ => "transfer_failed",
            };
        }
        if let Some(e) = cause.downcast_ref::<forkbox_engine::api::EngineError>() {
            return e.code().as_str();
        }
        if let Some(e) = cause.downcast_ref::<ImageError>() {
            return forkbox_engine::api::image_code(e).as_str();
        }
        if cause.downcast_ref::<SetupError>().is_some() {
            return forkbox_engine::api::Code::SetupNeeded.as_str();
        }
        if let Some(e) = cause.downcast_ref::<SandboxError>() {
            return forkbox_engine::api::sandbox_code(e).as_str();
        }
    }
    "failed"
}

/// Logging, forkbox's home, then the command. The daemon logs what it does by default, into
/// `daemon.log` (size-capped, see [`logfile`]); the other commands only when asked, to stderr.
fn start(cli: Cli, serving: bool, inherited: usize) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    let filter = std::env::var("FORKBOX_LOG").ok();
    if serving {
        let note = paths.secure_home()?;
        let log = logfile::LogFile::open(&paths.home().join("daemon.log"), logfile::DEFAULT_CAP)
            .with_context(|| format!("open the daemon's log in {}", paths.home().display()))?;
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                filter.as_deref().unwrap_or("info"),
            ))
            .with_writer(log)
            .with_ansi(false)
            .init();
        if let Some(note) = note {
            tracing::warn!("{note}");
        }
        if inherited > 0 {
            tracing::info!(
                "closed {inherited} descriptor(s) inherited from whoever started the daemon"
            );
        }
    } else {
        if let Some(filter) = filter {
            use std::io::IsTerminal;
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .init();
        }
        // `info` and `doctor` only read; every other command may write sandboxes' data into
        // the home.
        if !matches!(
            cli.command,
            Cmd::Info { .. } | Cmd::Doctor { .. } | Cmd::Completions { .. } | Cmd::Man { .. }
        ) {
            if let Some(note) = paths.secure_home()? {
                eprintln!("forkbox: {note}");
            }
        }
    }
    dispatch(cli, paths)
}

/// Writes `bytes` to stdout; a reader that went away early (`| head`) is no error.
fn print_bytes(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// The command line's reference as Markdown: each command's `--help`, the root's first, then
/// its subcommands depth first. Environment variables' values are left out, so the page is the
/// same wherever it is made (the docs test compares it with `docs/reference/cli.md`).
fn markdown_reference() -> String {
    fn without_env_values(cmd: clap::Command) -> clap::Command {
        cmd.mut_args(|a| a.hide_env_values(true))
            .mut_subcommands(without_env_values)
    }
    fn commands(cmd: &mut clap::Command, out: &mut Vec<(String, String)>) {
        let name = cmd.get_bin_name().unwrap_or(cmd.get_name()).to_owned();
        let help = cmd.render_long_help().to_string();
        let lines: Vec<&str> = help.trim_end().lines().map(str::trim_end).collect();
        out.push((name, lines.join("\n")));
        for sub in cmd.get_subcommands_mut() {
            if sub.get_name() != "help" && !sub.is_hide_set() {
                commands(sub, out);
            }
        }
    }
    let mut root = without_env_values(<Cli as clap::CommandFactory>::command());
    root.build();
    let mut all = Vec::new();
    commands(&mut root, &mut all);
    let mut page = String::from(
        "# The `forkbox` command line\n\n\
         Every command's `--help`, generated by `forkbox man --markdown` (a test checks that this \
         page is what the code prints).\n\n",
    );
    for (name, _) in &all {
        let anchor = name.replace(' ', "-");
        page += &format!("- [`{name}`](#{anchor})\n");
    }
    for (name, help) in &all {
        page += &format!("\n## `{name}`\n\n```text\n{help}\n```\n");
    }
    page
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

fn dispatch(cli: Cli, paths: Paths) -> anyhow::Result<ExitCode> {
    match cli.command {
        Cmd::Setup { qemu, e2b, json } => setup_cmd(&paths, qemu, e2b, json),
        Cmd::Image { command } => images::image_cmd(&paths, command),
        Cmd::Daemon { command } => serve::daemon_cmd(&paths, command),
        Cmd::Pool { command } => serve::pool_cmd(&paths, command),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "forkbox", &mut script);
            print_bytes(&script)
        }
        Cmd::Man { markdown: true, .. } => print_bytes(markdown_reference().as_bytes()),
        Cmd::Man { dir: None, .. } => {
            let cmd = <Cli as clap::CommandFactory>::command();
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut page)?;
            print_bytes(&page)
        }
        Cmd::Man { dir: Some(dir), .. } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            let cmd = <Cli as clap::CommandFactory>::command();
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("write the man pages into {}", dir.display()))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run(args) => run::run(&paths, args),
        Cmd::Serve { detach: true, .. } => serve::serve_detached(&paths),
        Cmd::Serve {
            listen,
            mcp_roots,
            e2b,
            cluster,
            ..
        } => serve::serve(paths, listen, mcp_roots, e2b, cluster.options(listen)?),
        Cmd::Mcp { roots, all } => serve::mcp(&paths, roots, all),
        Cmd::Cluster { command } => cluster::cluster(command),
        Cmd::Node { command } => cluster::node(command),
        Cmd::Token { command } => token(&paths, command),
        Cmd::Sandbox { command } => daemon::sandbox(&paths, command),
        Cmd::Snapshot { command } => snapshots::snapshot(&paths, command),
        Cmd::Volume { command } => volumes::volume(&paths, command),
        Cmd::Migrate(args) => migrate::migrate(&paths, args),
        Cmd::Info { json, accel } => info(&paths, json, accel),
        Cmd::Doctor { json, accel } => doctor(&paths, json, accel),
    }
}

/// `forkbox token`: a token in this host's state, or in the cluster's etcd.
fn token(paths: &Paths, cmd: TokenCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        TokenCmd::Revoke { name, reach } => {
            let n = cluster::revoke_tokens(reach, &name)?;
            println!("revoked {n} token(s) named {name}");
            Ok(if n == 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        TokenCmd::Create {
            name,
            cluster: urls,
            cluster_secret_file,
            cluster_tls,
            stdin,
            e2b,
            json,
        } if !urls.is_empty() => {
            let token = match stdin {
                true => given_token()?,
                false => forkbox_server::auth::new_token(e2b)?,
            };
            let reach = cluster::Reach {
                cluster: urls,
                cluster_secret_file,
                cluster_tls,
            };
            cluster::add_token(reach, &name, &token)?;
            // A token given on stdin is never echoed (a Job's log would keep it).
            match (json, stdin) {
                (true, false) => print_json(&serde_json::json!({ "name": name, "token": token }))?,
                (true, true) => print_json(&serde_json::json!({ "name": name, "stored": true }))?,
                (false, false) => println!("{token}"),
                (false, true) => eprintln!("stored the hash of token {name} in the cluster"),
            }
            Ok(ExitCode::SUCCESS)
        }
        TokenCmd::Create {
            name, json, e2b, ..
        } => {
            let token = forkbox_server::auth::create(paths, &name, e2b)?;
            if json {
                print_json(&serde_json::json!({ "name": name, "token": token }))?;
            } else {
                println!("{token}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A token read from standard input (one line), checked for length and characters.
fn given_token() -> anyhow::Result<String> {
    let mut s = String::new();
    std::io::stdin().read_line(&mut s)?;
    let t = s.trim();
    if t.len() < 32 || !t.bytes().all(|b| b.is_ascii_graphic()) {
        anyhow::bail!(
            "the token on standard input must be at least 32 visible ASCII characters \
             (got {} characters)",
            t.len()
        );
    }
    Ok(t.to_string())
}

/// The accelerator this host gets, once a guest kernel and the agent are there to probe with.
fn accel_decision(
    paths: &Paths,
    accel: AccelChoice,
) -> anyhow::Result<Option<forkbox_engine::vm::AccelDecision>> {
    let rt = crate::daemon::current_thread()?;
    rt.block_on(forkbox_engine::vm::host_decision(paths, accel))
        .context("choose accelerator")
}

fn doctor(paths: &Paths, json: bool, accel: AccelChoice) -> anyhow::Result<ExitCode> {
    use forkbox_engine::doctor::Status;
    let decision = accel_decision(paths, accel)?;
    let checks = forkbox_engine::doctor::checks(paths, decision.as_ref());
    if json {
        print_json(&checks)?;
    } else {
        for c in &checks {
            let mark = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            println!("{mark} {:<12} {}", c.name, c.found);
            if let Some(fix) = &c.fix {
                println!("     {:<12} fix: {fix}", "");
            }
        }
    }
    Ok(if checks.iter().any(|c| c.status == Status::Fail) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn info(paths: &Paths, json: bool, accel: AccelChoice) -> anyhow::Result<ExitCode> {
    let kernels: Vec<String> = forkbox_engine::kernel::Kernel::installed(paths)
        .into_iter()
        .map(|k| k.release)
        .collect();
    let qemu = forkbox_engine::vm::program::program().map(|p| p.display().to_string());
    let agent = forkbox_engine::agent_bin::locate()
        .map(|(p, _)| p.display().to_string())
        .map_err(|e| e.to_string());
    let decision = accel_decision(paths, accel)?;
    let images: Vec<String> = ImageStore::new(paths)
        .list()
        .iter()
        .map(|i| i.reference())
        .collect();
    // The API's `info`, from the daemon when one runs, with what this host has besides.
    let daemon = serve::info_if_running(paths)?;
    let v = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "protocol_version": forkbox_protocol::PROTOCOL_VERSION,
        "home": paths.home(),
        "accel": decision,
        "kernels": kernels,
        "images": images,
        "sandboxes": daemon.as_ref().map(|i| i.sandboxes),
        "pool": daemon.as_ref().map(|i| i.pool.clone()),
        "daemon": daemon.is_some(),
        "qemu": qemu,
        "agent": agent.as_ref().ok(),
        "agent_error": agent.as_ref().err(),
    });
    if json {
        print_json(&v)?;
    } else {
        println!("home:     {}", paths.home().display());
        println!(
            "qemu:     {}",
            qemu.as_deref()
                .unwrap_or("not installed (run `forkbox setup`)")
        );
        println!(
            "kernels:  {}",
            if kernels.is_empty() {
                "none (run `forkbox setup`)".into()
            } else {
                kernels.join(", ")
            }
        );
        println!("agent:    {}", agent.unwrap_or_else(|e| e));
        match &daemon {
            Some(i) => println!(
                "daemon:   running, {} sandbox(es), {} ready in the warm pool",
                i.sandboxes,
                i.pool.slots.iter().map(|s| s.ready).sum::<usize>()
            ),
            None => println!("daemon:   not running"),
        }
        match decision {
            Some(d) => println!("accel:    {} ({})", d.accel, d.reason),
            None => println!("accel:    unknown until a kernel and the agent are installed"),
        }
        println!(
            "images:   {}",
            if images.is_empty() {
                "none".into()
            } else {
                images.join(", ")
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `forkbox setup`: host packages and files, then with `e2b` the images of E2B's templates.
fn setup_cmd(paths: &Paths, qemu: QemuFrom, e2b: bool, json: bool) -> anyhow::Result<ExitCode> {
    let source = match qemu {
        QemuFrom::Recent => setup::QemuSource::Recent,
        QemuFrom::System => setup::QemuSource::System,
    };
    let steps = setup::setup(paths, source, &mut |line| {
        eprintln!("forkbox setup: {line}")
    })?;
    if json {
        print_json(&steps)?;
    } else {
        for s in &steps {
            println!("{:<40} {:<28} {}", s.item, s.action, s.why);
        }
        println!("forkbox home: {}", paths.home().display());
    }
    if e2b {
        // E2B's templates are forkbox's carried images of these names.
        for name in ["base", "code-interpreter"] {
            bundled::ensure_blocking(paths, &name.parse()?, json)?;
            if !json {
                println!("E2B template image {name}: built");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::Cli;

    /// Every argument of every command says what it is for in `--help` and the man page.
    #[test]
    fn every_flag_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {} (the command itself)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(
            &<Cli as clap::CommandFactory>::command(),
            "forkbox",
            &mut missing,
        );
        assert!(missing.is_empty(), "no help text:\n{}", missing.join("\n"));
    }
}
