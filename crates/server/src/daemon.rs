//! Running the daemon: its Unix socket and PID file, the TCP listener with its gates (tokens,
//! the console, previews, and front ends that claim their own requests, such as E2B's API),
//! the sweep that enforces TTLs, and shutdown.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use forkbox_engine::api::Engine;
use forkbox_engine::paths::Paths;

use crate::{auth, cluster, console, listen, log_panics, preview, router};

/// Where the daemon listens.
pub fn socket_path(paths: &Paths) -> PathBuf {
    paths.home().join("forkbox.sock")
}

/// The daemon's PID file.
pub fn pid_path(paths: &Paths) -> PathBuf {
    paths.home().join("daemon.pid")
}

/// The PID of the daemon serving `paths`, if one runs: the number in its PID file, and only
/// while a daemon holds that file locked. A daemon that died (SIGKILL, a crash) leaves a file
/// nobody holds, and its number may since have gone to any other process: signalling that
/// number would hit a stranger.
pub fn running_pid(paths: &Paths) -> Option<u32> {
    use std::io::Read;
    let file = std::fs::File::open(pid_path(paths)).ok()?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock) {
        // Nobody holds it: no daemon wrote it that still runs.
        Ok(_stale) => None,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            file.read_to_string(&mut text).ok()?;
            text.trim().parse().ok()
        }
        Err(_) => None,
    }
}

/// Writes this process's PID file and holds it locked for as long as the returned guard
/// lives (see [`running_pid`]).
fn hold_pid_file(paths: &Paths) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    let path = pid_path(paths);
    forkbox_engine::paths::write_atomic(&path, std::process::id().to_string().as_bytes())?;
    let file = std::fs::File::open(&path)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| std::io::Error::from(e))
}

/// Serves `engine` on a Unix socket of its own (mode 0600) until the returned task is aborted:
/// the private API of a run in this process (`forkbox run` without a daemon drives its sandbox
/// through it; `forkbox migrate` hands it to host porters).
pub fn spawn_private(
    engine: Arc<Engine>,
    socket: &Path,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    let app = router(engine);
    Ok(tokio::spawn(listen::serve(
        listener,
        app,
        std::future::pending(),
    )))
}

/// Whether a request is a front end's, by its URI and headers.
pub type Claims = Arc<dyn Fn(&axum::http::Uri, &axum::http::HeaderMap) -> bool + Send + Sync>;

/// A front end that speaks another API on the TCP listener and authenticates its callers
/// itself (E2B's, whose SDKs send `X-API-KEY`): it takes the requests `claims` says are its
/// own, ahead of the token gate, and reaches the engine only through the daemon's own API.
#[derive(Clone)]
pub struct Front {
    pub router: Router,
    pub claims: Claims,
    /// A TLS site it answers on the listener: its domain (and every name under it), its
    /// certificate chain and key (PEM).
    pub site: Option<Site>,
}

#[derive(Clone)]
pub struct Site {
    pub domain: String,
    pub chain_pem: String,
    pub key_pem: String,
}

impl Site {
    /// The TLS configuration that answers with this site's certificate (HTTP/1.1).
    fn config(&self) -> std::io::Result<Arc<rustls::ServerConfig>> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        forkbox_cluster::tls::install_provider();
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            std::io::Error::other(format!("the TLS {what} of {}: {e}", self.domain))
        };
        let chain = CertificateDer::pem_slice_iter(self.chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("certificate", &e))?;
        let key =
            PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| bad("key", &e))?;
        let mut c = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| bad("certificate", &e))?;
        // HTTP/2 as E2B's edge speaks it (the SDKs ask for it), else HTTP/1.1: a Connect stream
        // cut short then reaches the SDK as a reset stream, the way it tells a sandbox that died.
        c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(c))
    }
}

/// Hands a request a [`Front`] claims to it; the rest go on.
async fn claimed(
    axum::extract::State(front): axum::extract::State<Front>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use tower::ServiceExt as _;
    if (front.claims)(req.uri(), req.headers()) {
        return match front.router.oneshot(req).await {
            Ok(r) => r,
            Err(e) => match e {},
        };
    }
    next.run(req).await
}

/// What dead owners left, removed before any request is served and named in the log: their
/// sandboxes' files, unfinished snapshots, cgroups, and image builds a killed process left
/// (with their mounts, where a forkbox from before builds had namespaces of their own left
/// them on the host).
async fn sweep_at_start(paths: &Paths) {
    let mut lines = forkbox_engine::runstate::sweep(paths).lines();
    lines.extend(crate::images::sweep_contexts(paths));
    let paths = paths.clone();
    lines.extend(
        tokio::task::spawn_blocking(move || forkbox_engine::image::sweep_builds(&paths))
            .await
            .unwrap_or_default(),
    );
    for line in lines {
        tracing::info!("start-up sweep: {line}");
    }
}

/// Serves the API on the Unix socket (and, with `tcp`, on that address for bearer tokens)
/// until SIGINT or SIGTERM, then stops every sandbox. `extra` routes (the MCP endpoint, which
/// lives in a crate of its own) are served beside the API, behind the same authentication;
/// `fronts` on TCP ahead of it, each authenticating its own callers.
pub async fn serve(
    paths: Paths,
    tcp: Option<std::net::SocketAddr>,
    extra: Option<Router>,
    fronts: Vec<Front>,
    cluster: Option<cluster::ClusterOptions>,
) -> std::io::Result<()> {
    log_panics();
    let socket = socket_path(&paths);
    std::fs::create_dir_all(paths.home())?;
    free_socket(&socket).await?;
    // Sandboxes of a daemon that died are taken over before any request is served (their TTLs
    // apply at the first sweep); what other owners left half-made is removed.
    let engine = Arc::new(Engine::durable(paths.clone()).map_err(std::io::Error::other)?);
    engine.bind();
    for id in engine.adopt_all().await {
        tracing::info!("{id}: re-adopted");
    }
    sweep_at_start(&paths).await;
    let listener = tokio::net::UnixListener::bind(&socket)?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    let pid_file = hold_pid_file(&paths)?;
    // In a cluster, every call first passes the node's routing (here, or on the node that
    // owns what it is about).
    let node = match cluster {
        Some(o) => Some(cluster::start(engine.clone(), paths.clone(), o).await?),
        None => None,
    };

    tracing::info!("forkbox daemon listening on {}", socket.display());
    let with_extra = |r: Router| {
        let r = match &extra {
            Some(x) => r.merge(x.clone()),
            None => r,
        };
        match &node {
            Some(n) => r.layer(axum::middleware::from_fn_with_state(
                n.clone(),
                cluster::route,
            )),
            None => r,
        }
    };
    let console = console::Console::new(
        engine.clone(),
        with_extra(router(engine.clone())),
        node.is_some(),
    );
    let app = with_extra(router(engine.clone())).layer(axum::middleware::from_fn_with_state(
        console.on_socket(),
        console::intercept,
    ));
    let sweep = spawn_sweep(engine.clone(), node.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let tcp_task = match tcp {
        Some(addr) => {
            let gate = auth::Gate {
                paths: paths.clone(),
                node: node.clone(),
            };
            let api = with_extra(router(engine.clone()));
            let previews = preview::Previews {
                engine: engine.clone(),
                node: node.clone(),
            };
            let tcp = serve_tcp(
                addr,
                api,
                previews,
                gate,
                &console,
                &fronts,
                stop_rx.clone(),
            );
            Some(tcp.await?)
        }
        None => None,
    };
    listen::serve(listener, app, shutdown_signal()).await;
    let _ = stop_tx.send(true);
    if let Some(t) = tcp_task {
        let _ = t.await;
    }
    drop(stop_rx);
    sweep.abort();
    if let Some(n) = &node {
        n.leave().await;
    }
    engine.shutdown().await;
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(pid_path(&paths));
    drop(pid_file);
    Ok(())
}

/// Clears the way for the daemon's socket: a socket no daemon answers on is removed; one that
/// answers is an error.
async fn free_socket(socket: &Path) -> std::io::Result<()> {
    if !socket.exists() {
        return Ok(());
    }
    if tokio::net::UnixStream::connect(socket).await.is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("a forkbox daemon already listens on {}", socket.display()),
        ));
    }
    std::fs::remove_file(socket)
}

/// Serves `api` on TCP at `addr` until `stop`: a bearer token for every call, nothing for a
/// web page, the console at `/ui` and previews ahead of both.
async fn serve_tcp(
    addr: std::net::SocketAddr,
    api: Router,
    previews: preview::Previews,
    gate: auth::Gate,
    console: &Arc<console::Console>,
    fronts: &[Front],
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let l = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(
        "forkbox daemon listening on {} (bearer tokens required)",
        l.local_addr()?
    );
    let app = api
        .layer(axum::middleware::from_fn_with_state(
            gate.clone(),
            auth::require_token,
        ))
        .layer(axum::middleware::from_fn(auth::refuse_browsers))
        .layer(axum::middleware::from_fn_with_state(
            console.on_tcp(gate),
            console::intercept,
        ));
    let secret = previews.node.as_ref().map(|n| n.secret().to_string());
    let node = previews.node.clone();
    let app = app.layer(axum::middleware::from_fn_with_state(
        previews,
        preview::intercept,
    ));
    let app = fronts.iter().fold(app, |app, f| {
        app.layer(axum::middleware::from_fn_with_state(f.clone(), claimed))
    });
    preview::enable(l.local_addr()?.port(), secret.as_deref())?;
    // A cluster's peers call over mutual TLS on the same port when the node has certificates.
    let mut tls = listen::Tls {
        peers: node.as_ref().and_then(|n| n.tls_config()),
        sites: Vec::new(),
    };
    for site in fronts.iter().filter_map(|f| f.site.as_ref()) {
        tls.sites.push((site.domain.clone(), site.config()?));
    }
    Ok(tokio::spawn(listen::serve_tls(
        l,
        app,
        async move {
            let _ = stop.wait_for(|s| *s).await;
        },
        tls,
    )))
}

/// TTLs are absolute deadlines; a sweep enforces them each second (in a cluster, the expired
/// sandboxes' records go too), puts to sleep the sandboxes idle for their policy's time,
/// shrinks the warm pool, and samples every VM's CPU and memory for the metrics.
fn spawn_sweep(
    engine: Arc<Engine>,
    node: Option<Arc<cluster::Node>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let expired = engine.expire().await;
            for id in &expired {
                tracing::info!("{id}: TTL passed; deleted");
            }
            if let Some(n) = &node {
                n.forget(&expired).await;
            }
            engine.sleep_idle().await;
            let shrunk = engine.shrink_pool().await;
            if shrunk > 0 {
                tracing::info!("warm pool: {shrunk} sandbox(es) unused for a while stopped");
            }
            engine.sample(1.0).await;
        }
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// True when a daemon answers on the socket.
pub async fn is_running(socket: &Path) -> bool {
    tokio::net::UnixStream::connect(socket).await.is_ok()
}
