//! `forkbox serve` and the daemon it runs: its cluster options, starting it in the background,
//! its status and stop, and its warm pool's listing.

use std::os::unix::fs::OpenOptionsExt;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use forkbox_engine::paths::Paths;

use crate::daemon::{connect, current_thread, running_daemon, show};

#[derive(clap::Subcommand)]
pub enum DaemonCmd {
    /// Say whether the daemon runs: its PID, socket, sandboxes and warm pool. Exit 1 when it
    /// does not run.
    Status {
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop the daemon (SIGTERM) and wait until it is gone; it stops its sandboxes and its warm
    /// pool first. (A daemon that was killed leaves its sandboxes running; the next adopts them.)
    Stop {
        /// Print what was stopped as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Subcommand)]
pub enum PoolCmd {
    /// List the warm pool's ready sandboxes per image and size (asks the daemon; none runs:
    /// no pool).
    Ls {
        /// Print the pool as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The running daemon's PID (from its PID file, held by a live daemon), if one runs.
fn daemon_pid(paths: &Paths) -> Option<i32> {
    forkbox_server::running_pid(paths).and_then(|p| i32::try_from(p).ok())
}

pub fn daemon_cmd(paths: &Paths, cmd: DaemonCmd) -> anyhow::Result<ExitCode> {
    current_thread()?.block_on(async {
        match cmd {
            DaemonCmd::Status { json } => {
                let socket = forkbox_server::socket_path(paths);
                let info = match running_daemon(paths).await? {
                    Some(c) => Some(c.info().await?),
                    None => None,
                };
                let pid = daemon_pid(paths);
                let status = serde_json::json!({
                    "running": info.is_some(),
                    "pid": pid,
                    "socket": socket,
                    "version": info.as_ref().map(|i| i.version.clone()),
                    "sandboxes": info.as_ref().map(|i| i.sandboxes),
                    "pool": info.as_ref().map(|i| i.pool.clone()),
                });
                if json {
                    crate::print_json(&status)?;
                } else if let Some(i) = &info {
                    println!(
                        "running: pid {}, socket {}, forkbox {}",
                        pid.map_or("?".into(), |p| p.to_string()),
                        socket.display(),
                        i.version
                    );
                    println!(
                        "{} sandbox(es); warm pool: {} ready, {} of {} MiB",
                        i.sandboxes,
                        i.pool.slots.iter().map(|s| s.ready).sum::<usize>(),
                        i.pool.memory_mib,
                        i.pool.memory_cap_mib
                    );
                } else {
                    println!("not running (socket {})", socket.display());
                }
                Ok(match info {
                    Some(_) => ExitCode::SUCCESS,
                    None => ExitCode::from(1),
                })
            }
            DaemonCmd::Stop { json } => {
                let Some(pid) = daemon_pid(paths) else {
                    show(json, &serde_json::json!({ "stopped": null }), || {
                        println!("no daemon runs")
                    })?;
                    return Ok(ExitCode::SUCCESS);
                };
                let target = nix::unistd::Pid::from_raw(pid);
                nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM)
                    .with_context(|| format!("signal the daemon (pid {pid})"))?;
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                // Gone when its PID file is no longer held (its number may be reused).
                while daemon_pid(paths) == Some(pid) {
                    if std::time::Instant::now() > deadline {
                        bail!("the daemon (pid {pid}) did not stop within 60 s; see daemon.log");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                show(json, &serde_json::json!({ "stopped": pid }), || {
                    println!("stopped the daemon (pid {pid}) and its sandboxes")
                })
            }
        }
    })
}

pub fn pool_cmd(paths: &Paths, cmd: PoolCmd) -> anyhow::Result<ExitCode> {
    current_thread()?.block_on(async {
        match cmd {
            PoolCmd::Ls { json } => {
                let pool = match running_daemon(paths).await? {
                    Some(c) => Some(c.info().await?.pool),
                    None => None,
                };
                show(json, &pool, || match &pool {
                    None => println!("no daemon runs, so no warm pool"),
                    Some(p) => {
                        println!(
                            "{} per image and size (up to {} after a burst of creates), {} of {} MiB, given back after {} s unused",
                            p.size, p.max, p.memory_mib, p.memory_cap_mib, p.idle_secs
                        );
                        println!(
                            "{:<28} {:>5} {:>8} {:>6} {:>6} {:>9}",
                            "IMAGE", "CPUS", "MEMORY", "READY", "KEEPS", "IDLE"
                        );
                        for s in &p.slots {
                            println!(
                                "{:<28} {:>5} {:>4} MiB {:>6} {:>6} {:>7} s",
                                s.image, s.cpus, s.memory_mib, s.ready, s.target, s.idle_secs
                            );
                        }
                    }
                })
            }
        }
    })
}

/// The running daemon's `info`; `None` when none runs.
pub fn info_if_running(paths: &Paths) -> anyhow::Result<Option<forkbox_engine::api::InfoView>> {
    current_thread()?.block_on(async {
        match running_daemon(paths).await? {
            Some(c) => Ok(Some(c.info().await?)),
            None => Ok(None),
        }
    })
}

/// Removes image `r` through this home's daemon when one runs (it stops its pooled copies of
/// the image first); `None` when none runs.
pub fn remove_image_if_running(
    paths: &Paths,
    r: &forkbox_engine::image::ImageRef,
) -> anyhow::Result<Option<String>> {
    current_thread()?.block_on(async {
        match running_daemon(paths).await? {
            Some(c) => Ok(Some(c.remove_image(&r.to_string()).await?.reference)),
            None => Ok(None),
        }
    })
}

/// `forkbox serve`'s options for joining a cluster.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// Join the cluster whose state is in this etcd (v3): its client URLs, comma-separated.
    /// Needs --node, --advertise, --listen and the cluster secret.
    #[arg(
        long,
        env = "FORKBOX_CLUSTER",
        value_name = "ETCD_URL[,…]",
        value_delimiter = ','
    )]
    cluster: Vec<String>,
    /// This node's name in the cluster (a-z, 0-9, '-').
    #[arg(long, env = "FORKBOX_NODE", requires = "cluster")]
    node: Option<String>,
    /// The URL other nodes reach this one's --listen at (http://ADDRESS:PORT).
    #[arg(long, env = "FORKBOX_ADVERTISE", requires = "cluster")]
    advertise: Option<String>,
    /// A file holding the secret every node of the cluster shares (not a user token); or set
    /// FORKBOX_CLUSTER_SECRET.
    #[arg(long, value_name = "FILE", requires = "cluster")]
    cluster_secret_file: Option<std::path::PathBuf>,
    /// Mutual TLS with the other nodes (and etcd, on https URLs): a directory holding ca.pem,
    /// node.pem and node.key (`forkbox cluster issue-cert`). Peers then call this node over
    /// TLS on --listen's port; users' clients keep plain HTTP and tokens.
    #[arg(
        long,
        env = "FORKBOX_CLUSTER_TLS",
        value_name = "DIR",
        requires = "cluster"
    )]
    cluster_tls: Option<std::path::PathBuf>,
    /// Seconds of the node's lease in etcd: a node that dies is seen gone within this.
    #[arg(long, default_value_t = forkbox_cluster::DEFAULT_LEASE_SECS, requires = "cluster")]
    lease: i64,
}

impl ClusterArgs {
    /// The options to join with, or none without --cluster; what is missing is said at once.
    pub fn options(
        self,
        listen: Option<std::net::SocketAddr>,
    ) -> anyhow::Result<Option<forkbox_server::cluster::ClusterOptions>> {
        if self.cluster.is_empty() {
            return Ok(None);
        }
        let Some(node) = self.node else {
            anyhow::bail!("--cluster needs --node NAME: this node's name in the cluster");
        };
        if listen.is_none() {
            anyhow::bail!("--cluster needs --listen ADDRESS:PORT: other nodes forward calls to it");
        }
        let Some(advertise) = self.advertise else {
            anyhow::bail!(
                "--cluster needs --advertise http://ADDRESS:PORT: where other nodes reach \
                 this one's --listen"
            );
        };
        let secret = cluster_secret(self.cluster_secret_file)?;
        Ok(Some(forkbox_server::cluster::ClusterOptions {
            endpoints: self.cluster,
            node,
            advertise,
            secret,
            lease_secs: self.lease,
            tls_dir: self.cluster_tls,
        }))
    }
}

/// The cluster secret: from `file`, or FORKBOX_CLUSTER_SECRET.
pub fn cluster_secret(file: Option<std::path::PathBuf>) -> anyhow::Result<String> {
    match (file, std::env::var("FORKBOX_CLUSTER_SECRET")) {
        (Some(f), _) => Ok(std::fs::read_to_string(&f)
            .with_context(|| format!("reading the cluster secret from {}", f.display()))?
            .trim()
            .to_string()),
        (None, Ok(s)) => Ok(s.trim().to_string()),
        (None, Err(_)) => anyhow::bail!(
            "the cluster needs its secret: --cluster-secret-file FILE or \
             FORKBOX_CLUSTER_SECRET (the same on every node; `openssl rand -hex 32`)"
        ),
    }
}

/// E2B's API, answered on the --listen address.
#[derive(clap::Args, Debug)]
pub struct E2bArgs {
    /// E2B's domain mode: answer `api.DOMAIN` and `PORT-ID.DOMAIN` over TLS on the --listen
    /// port (443 for E2B's SDKs, which then need only E2B_DOMAIN and E2B_API_KEY), with a
    /// certificate of a CA this home makes (its file is printed at start: trust it).
    #[arg(
        long,
        value_name = "DOMAIN",
        requires = "listen",
        env = "FORKBOX_E2B_DOMAIN"
    )]
    pub e2b_domain: Option<String>,
    /// E2B's templates to build at the start, in the background, when this home has none of
    /// them yet (a first create then finds its template built, or says how far its build is):
    /// a comma list, or `none`.
    #[arg(
        long,
        value_name = "TEMPLATES",
        value_delimiter = ',',
        default_value = "base,code-interpreter-v1",
        env = "FORKBOX_E2B_PREBUILD"
    )]
    pub e2b_prebuild: Vec<String>,
    /// How long a create waits for its template's first build before it answers, at once,
    /// that the template is not ready yet and how far its build is (E2B's SDKs wait 60 s).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub e2b_create_wait: u64,
}

pub fn serve(
    paths: Paths,
    listen: Option<std::net::SocketAddr>,
    mcp_roots: Vec<std::path::PathBuf>,
    e2b: E2bArgs,
    cluster: Option<forkbox_server::cluster::ClusterOptions>,
) -> anyhow::Result<ExitCode> {
    forkbox_engine::limits::raise_open_files();
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
    // E2B's API on the TCP listener: its control plane calls this daemon back on that
    // listener with the caller's key as their token, its data plane through the socket.
    // A cluster builds a carried image once, on the node a create is placed on: no node builds
    // E2B's templates ahead on its own.
    let mut e2b = e2b;
    if cluster.is_some() {
        e2b.e2b_prebuild.clear();
    }
    let fronts = match listen {
        Some(addr) => vec![e2b_front(&paths, addr, e2b, &rt)?],
        None => Vec::new(),
    };
    rt.block_on(forkbox_server::serve(
        paths,
        listen,
        Some(extra),
        fronts,
        cluster,
    ))
    .context("the forkbox daemon failed")?;
    Ok(ExitCode::SUCCESS)
}

/// E2B's API on the TCP listener `addr`, and in domain mode its TLS site (said on stderr with
/// the CA to trust).
fn e2b_front(
    paths: &Paths,
    addr: std::net::SocketAddr,
    e2b: E2bArgs,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<forkbox_server::Front> {
    let domain = e2b.e2b_domain;
    let create_wait = std::time::Duration::from_secs(e2b.e2b_create_wait);
    let prebuild = e2b
        .e2b_prebuild
        .into_iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty() && t != "none")
        .collect::<Vec<_>>();
    if let Some(t) = prebuild.iter().find(|t| !forkbox_e2b::carries(t)) {
        anyhow::bail!(
            "--e2b-prebuild: forkbox carries no recipe for template {t}; name base, \
             code-interpreter-v1 or one of images/*.toml's names, or none"
        );
    }
    let f = forkbox_e2b::front(forkbox_e2b::Options {
        socket: forkbox_server::socket_path(paths),
        api_url: format!("http://{}", loopback(addr)),
        key_file: paths.home().join("e2b.key"),
        domain,
        tls_dir: paths.home().join("e2b-tls"),
        uploads_dir: paths.home().join("e2b-uploads"),
        prebuild,
        create_wait,
    })
    .context("E2B's API could not start")?;
    rt.spawn(f.prebuild);
    let site = f.site.map(|s| {
        let port = match addr.port() {
            443 => String::new(),
            p => format!(":{p}"),
        };
        eprintln!(
            "forkbox: E2B's domain mode: https://api.{d}{port} and https://PORT-ID.{d}{port} \
             answer with a certificate of the CA in {ca}; trust it (Debian: cp {ca} \
             /usr/local/share/ca-certificates/forkbox-e2b.crt && update-ca-certificates; Node: \
             NODE_EXTRA_CA_CERTS={ca}) and resolve *.{d} to this host",
            d = s.domain,
            ca = s.ca_file.display()
        );
        forkbox_server::Site {
            domain: s.domain,
            chain_pem: s.chain_pem,
            key_pem: s.key_pem,
        }
    });
    Ok(forkbox_server::Front {
        router: f.router,
        claims: f.claims,
        site,
    })
}

/// The address this host reaches a listener on `addr` at: an unspecified address
/// (`0.0.0.0`, `[::]`) is reached on loopback.
fn loopback(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, addr.port()))
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port()))
        }
        _ => addr,
    }
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
    let rt = current_thread()?;
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

/// Starts `forkbox serve` in the background and waits for it to answer.
pub(crate) async fn start_daemon(paths: &Paths) -> anyhow::Result<()> {
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
