//! The arguments of `forkbox sandbox ...` (the commands themselves are in `daemon.rs`).

use forkbox_engine::vm::AccelChoice;

pub use crate::network::{secret_arg, NetArgs};
use forkbox_engine::api::SandboxState;

/// `forkbox sandbox port-forward`'s arguments.
#[derive(clap::Args)]
pub struct PortArgs {
    /// Sandbox id.
    #[arg(value_parser = sandbox_id)]
    pub id: String,
    /// [HOST_PORT:]GUEST_PORT (the host port free when left out); with --close, the host port
    /// of the forward to close.
    #[arg(value_parser = port_spec)]
    pub ports: Option<(Option<u16>, u16)>,
    /// The host address to listen on (default 127.0.0.1).
    #[arg(long)]
    pub address: Option<String>,
    /// Close the forward on HOST_PORT instead.
    #[arg(long)]
    pub close: bool,
    /// Print the forward(s) as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `forkbox sandbox create`'s arguments.
#[derive(clap::Args)]
pub struct CreateArgs {
    /// Image to start: NAME (newest version) or NAME@N (default python-bookworm, built on
    /// first use).
    #[arg(long)]
    pub image: Option<String>,
    /// Virtual CPUs (default 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cpus: Option<u32>,
    /// Guest memory: 512m, 2g, or a number of MiB (default 1g).
    #[arg(long, value_parser = crate::units::memory_mib)]
    pub memory: Option<u32>,
    /// Accelerator: auto (KVM where this host can run a standard guest, else TCG), kvm or tcg.
    #[arg(long, env = "FORKBOX_ACCEL")]
    pub accel: Option<AccelChoice>,
    /// A label K=V (repeatable).
    #[arg(long = "label", value_name = "K=V", value_parser = crate::run::parse_kv)]
    pub labels: Vec<(String, String)>,
    /// Delete the sandbox after this long: 600, 10m, 1h.
    #[arg(long, value_parser = crate::units::ttl)]
    pub ttl: Option<u64>,
    /// Start from this snapshot (its image, vCPUs and memory) instead of the image's template.
    #[arg(long, conflicts_with_all = ["image", "cpus", "memory"])]
    pub snapshot: Option<String>,
    /// What the TTL does when it passes: delete (default) or hibernate.
    #[arg(long, value_enum, requires = "ttl")]
    pub ttl_action: Option<TtlArg>,
    /// Root disk size: 20g or a number of GiB (at least the image's); the filesystem grows
    /// to fill it.
    #[arg(long, value_parser = crate::units::disk_gib)]
    pub disk_gib: Option<u32>,
    #[command(flatten)]
    pub net: NetArgs,
    /// In a cluster: the node to put it on (default: chosen by room and what each holds).
    #[arg(long)]
    pub node: Option<String>,
    #[command(flatten)]
    pub idle: IdleArgs,
    /// Mount a volume: NAME:/path (read-write: one sandbox at a time) or NAME:/path:ro
    /// (read-only: any number), repeatable (`forkbox volume create` makes one).
    #[arg(long = "volume", value_name = "NAME:/PATH[:ro]", value_parser = crate::units::volume_mount)]
    pub volumes: Vec<forkbox_engine::api::VolumeMount>,
    /// Print the new sandbox as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `forkbox sandbox idle`'s arguments.
#[derive(clap::Args)]
pub struct IdleCmdArgs {
    /// Sandbox id.
    #[arg(value_parser = sandbox_id)]
    pub id: String,
    /// How long unused before it sleeps, or `off`.
    #[arg(value_parser = crate::units::idle_or_off)]
    pub after: crate::units::IdleAfter,
    /// Stay asleep until `forkbox sandbox resume` (use does not wake it).
    #[arg(long)]
    pub no_wake: bool,
    /// Print the sandbox as JSON.
    #[arg(long)]
    pub json: bool,
}

/// When a sandbox sleeps by itself.
#[derive(clap::Args)]
pub struct IdleArgs {
    /// Sleep after this long unused (30s, 5m): hibernated with its memory and processes, and
    /// woken by the next exec, file call, attach or connection to a forwarded port. Used means
    /// a command running (a detached one too), a stream or port connection open, or a call.
    #[arg(long, value_parser = crate::units::idle, value_name = "DURATION")]
    pub idle: Option<u64>,
    /// With --idle: stay asleep until `forkbox sandbox resume` (use does not wake it).
    #[arg(long, requires = "idle")]
    pub no_wake: bool,
}

impl IdleArgs {
    /// The policy and waking the API takes.
    pub fn policy(&self) -> (Option<forkbox_engine::api::IdlePolicy>, Option<bool>) {
        let idle = self.idle.map(forkbox_engine::api::IdlePolicy::after);
        (idle, self.no_wake.then_some(false))
    }
}

/// `forkbox sandbox ls`'s arguments.
#[derive(clap::Args)]
pub struct LsArgs {
    /// Only sandboxes with this label K=V.
    #[arg(long)]
    pub label: Option<String>,
    /// Only sandboxes in this state: running, disk_full, hibernated, failed, lost.
    #[arg(long, value_parser = parse_state)]
    pub state: Option<SandboxState>,
    /// In a cluster: only the sandboxes of this node.
    #[arg(long)]
    pub node: Option<String>,
    /// Print only the ids, one a line.
    #[arg(short = 'q', long, conflicts_with = "json")]
    pub quiet: bool,
    /// Print the sandboxes as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `forkbox sandbox fork`'s arguments.
#[derive(clap::Args)]
pub struct ForkArgs {
    /// A sandbox id or a snapshot name.
    #[arg(value_parser = sandbox_id)]
    pub source: String,
    /// How many copies (1 to 20).
    #[arg(long, default_value_t = 1)]
    pub count: u32,
    /// A label K=V for every copy (repeatable).
    #[arg(long = "label", value_name = "K=V", value_parser = crate::run::parse_kv)]
    pub labels: Vec<(String, String)>,
    /// Delete each copy after this long: 600, 10m, 1h.
    #[arg(long, value_parser = crate::units::ttl)]
    pub ttl: Option<u64>,
    /// The copies' network (default: a sandbox's own; none for a snapshot).
    #[command(flatten)]
    pub net: NetArgs,
    /// In a cluster: the node the copies go to (one without the snapshot brings it by chunks).
    #[arg(long)]
    pub node: Option<String>,
    #[command(flatten)]
    pub idle: IdleArgs,
    /// A volume for the copies: NAME:/path:ro (read-only: any number of copies), or
    /// NAME:/path for one copy; repeatable. Copies of a sandbox have its read-only volumes
    /// anyway, never its read-write ones.
    #[arg(long = "volume", value_name = "NAME:/PATH[:ro]", value_parser = crate::units::volume_mount)]
    pub volumes: Vec<forkbox_engine::api::VolumeMount>,
    /// Print the copies (and any that failed) as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Subcommand)]
pub enum SandboxCmd {
    /// Create a sandbox; prints its id.
    Create(CreateArgs),
    /// Save sandboxes to disk and stop their VMs; they keep their ids.
    Hibernate {
        /// Sandbox ids.
        #[arg(required = true, value_parser = sandbox_id)]
        ids: Vec<String>,
        /// Keep only their files (synced to disk): a resume boots them from their disks, with
        /// their ids and machine ids but none of their processes.
        #[arg(long)]
        disk_only: bool,
        /// Print the hibernated sandboxes as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Reach a port a program in the guest listens on from this host: prints the URL. The
    /// forward lasts until closed (--close) or the sandbox goes (a hibernation ends it too).
    /// Without a port: lists the sandbox's forwards.
    PortForward(PortArgs),
    /// Replace a running sandbox's network policy: the connections it opens from now on
    /// follow it (without --internet or --allow: no network).
    Network {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        #[command(flatten)]
        net: crate::network::PolicyArgs,
        /// Print the sandbox as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set when a sandbox sleeps by itself: after DURATION unused (30s, 5m), or `off`.
    Idle(IdleCmdArgs),
    /// Bring a hibernated or sleeping sandbox back, with its processes.
    Resume {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        /// Print the resumed sandbox as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Save a running sandbox (memory, processes, disk) as a snapshot; it keeps running.
    Snapshot {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        /// The snapshot's name (default: made up from the sandbox's id).
        #[arg(long)]
        name: Option<String>,
        /// Leave the sandbox paused.
        #[arg(long)]
        paused: bool,
        /// Print the snapshot as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Fork a running sandbox or a snapshot into COUNT new sandboxes; prints their ids.
    Fork(ForkArgs),
    /// What the host decided about a sandbox's connections lately: tunnels its policy refused,
    /// connections ended and why (the last 64 lines; the daemon's log has them too).
    Logs {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set a sandbox's TTL anew, counted from now.
    Ttl {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        /// How long from now: 600, 10m, 1h.
        #[arg(value_parser = crate::units::ttl)]
        seconds: u64,
        /// Print the sandbox's new expiry as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a sandbox; prints its output and exits with its exit code.
    Exec {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        /// Working directory in the guest (default /root).
        #[arg(long)]
        cwd: Option<String>,
        /// Environment variable for the command (repeatable).
        #[arg(long = "env", value_name = "K=V", value_parser = crate::run::parse_kv)]
        env: Vec<(String, String)>,
        /// Kill the command and everything it started after this long: 90, 5s, 10m (at most 24 h).
        #[arg(long, value_parser = crate::units::timeout)]
        timeout: Option<u64>,
        /// Pass this process's standard input to the command (without it, a piped standard
        /// input is refused rather than dropped).
        #[arg(short = 'i', long, conflicts_with_all = ["detach", "json"])]
        interactive: bool,
        /// Run the command on a terminal (the size of this one, kept in step); with -i on a
        /// terminal, keys go through as typed (Ctrl-C interrupts the command, not forkbox).
        #[arg(short = 't', long, conflicts_with_all = ["detach", "json"])]
        tty: bool,
        /// Print one JSON result (output capped at 64 KiB per stream) instead of streaming.
        #[arg(long)]
        json: bool,
        /// Start the command and print its id instead of waiting; read it with `attach`.
        #[arg(long)]
        detach: bool,
        /// The command and its arguments (after `--`).
        #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// A login shell in a sandbox on a terminal (bash if it has one, else sh): `exec -i -t`.
    Shell {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        /// Working directory in the guest (default /root).
        #[arg(long)]
        cwd: Option<String>,
    },
    /// Follow a command started earlier (its output from the start, then live) and exit with its code.
    Attach {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        /// The id `exec --detach` printed.
        command_id: String,
    },
    /// Send a signal to a command started earlier.
    Kill {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        /// The id `exec --detach` printed.
        command_id: String,
        /// The signal: TERM (default), KILL, INT, HUP, … or a number.
        #[arg(long, short = 's', default_value = "TERM", value_parser = crate::units::signal)]
        signal: i32,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy a host directory (as one tar.zst stream) or a single file into the sandbox.
    Upload {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        /// The host directory or file to copy.
        host_dir: std::path::PathBuf,
        /// Where it goes in the guest: a directory (made if missing); a file goes into it
        /// when it is a directory there, else is written at that path.
        guest_dir: String,
        /// Print what was sent as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy a sandbox file or directory out: a directory into a new host directory (symbolic
    /// links stay links, never followed on the host; sparse files stay sparse; device files,
    /// absolute paths and `..` in what the sandbox sends are refused), a single file into an
    /// existing host directory or to a new file's path.
    Download {
        /// Sandbox id.
        #[arg(value_parser = sandbox_id)]
        id: String,
        /// The file or directory in the guest.
        guest_path: String,
        /// For a directory: a host directory that does not exist yet. For a file: an
        /// existing directory, or a path where no file is yet.
        host_dir: std::path::PathBuf,
        /// Print what was received as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List sandboxes.
    Ls(LsArgs),
    /// Stop and remove sandboxes.
    Rm {
        /// Sandbox ids.
        #[arg(required = true, value_parser = sandbox_id)]
        ids: Vec<String>,
        /// Print the removed sandboxes as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum TtlArg {
    /// Delete the sandbox.
    Delete,
    /// Hibernate it (to disk, without a VM).
    Hibernate,
    /// Hibernate its files only: the resume boots it from its disk, with no processes.
    HibernateDisk,
}

/// `[HOST_PORT:]GUEST_PORT`, each 1-65535.
pub(crate) fn port_spec(s: &str) -> Result<(Option<u16>, u16), String> {
    let port = |p: &str| -> Result<u16, String> {
        match p.parse::<u32>() {
            Ok(n @ 1..=65535) => Ok(n as u16),
            _ => Err(format!(
                "{p:?} is not a port: give a number from 1 to 65535"
            )),
        }
    };
    match s.split_once(':') {
        Some((h, g)) => Ok((Some(port(h)?), port(g)?)),
        None => Ok((None, port(s)?)),
    }
}

/// A `--state` value, parsed once.
/// A sandbox id (or snapshot name) as the command line takes it: not empty (a `$(...)` that
/// printed nothing), one path segment of visible characters.
pub(crate) fn sandbox_id(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("an empty id: give a sandbox's id (`forkbox sandbox ls` lists them)".into());
    }
    if s.contains('/') || s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "{s:?} is no sandbox id (ids are like sb-1a2b3c4d5e: `forkbox sandbox ls` lists them)"
        ));
    }
    Ok(s.to_string())
}

pub fn parse_state(s: &str) -> Result<SandboxState, String> {
    serde_json::from_value(serde_json::Value::String(s.replace('-', "_"))).map_err(|_| {
        format!("{s:?} is not one of running, disk_full, sleeping, hibernated, failed, lost")
    })
}
