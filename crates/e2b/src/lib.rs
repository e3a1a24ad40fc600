//! E2B's API on forkbox: agents written against E2B's SDKs (`e2b` on PyPI and npm) point at a
//! forkbox daemon by environment variables alone.
//!
//! A front end like MCP, never a second engine: every E2B call becomes calls of forkbox's own
//! API through [`forkbox_client`]. The control plane (`/v2/sandboxes`, `/sandboxes/{id}/…`)
//! calls the daemon's TCP listener with the caller's `X-API-KEY` as its bearer token, so a key
//! is a forkbox token and the daemon's own gate checks it. The data plane (envd's Connect
//! services and `/files`, chosen by the `E2b-Sandbox-Id` header) is authorised by the
//! sandbox's access token, which this front end derived for that sandbox when it made it, and
//! then calls the daemon over its socket.
//!
//! Shapes: [`connect`] (the Connect protocol's envelopes), [`errors`] (E2B's error bodies).

mod builds;
pub mod connect;
mod control;
mod envd;
pub mod errors;
mod first;
mod guest;
mod interpreter;
mod keys;
mod metrics;
mod ports;
mod rules;
mod secrets;
mod shape;
mod started;
mod steps;
mod tags;
mod templates;
pub mod tls;
mod volumes;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use forkbox_client::{Client, Endpoint};

/// The envd version this front end says it speaks: what the SDKs then use (0.4.0: commands as
/// the default user unless one is named; 0.5.2: CloseStdin; 0.5.7: octet-stream and gzip
/// uploads; 0.6.2: file metadata; 0.6.3: watch events with their entries; 0.6.4: watches of
/// network mounts).
pub const ENVD_VERSION: &str = "0.6.4";

/// The header the SDKs put on every data-plane request.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
const API_KEY_HEADER: &str = "x-api-key";
const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// envd's port in every sandbox, as the SDKs have it.
pub const ENVD_PORT: u16 = 49983;

/// Where the front end reaches the daemon.
#[derive(Debug, Clone)]
pub struct Options {
    /// The daemon's Unix socket (the data plane's calls, once a sandbox's token is checked).
    pub socket: PathBuf,
    /// The daemon's TCP listener as this host reaches it (`http://127.0.0.1:7070`): the
    /// control plane's calls, each with its caller's key as the bearer token.
    pub api_url: String,
    /// A file holding this daemon's key for sandboxes' access tokens (made, mode 0600, if
    /// absent).
    pub key_file: PathBuf,
    /// E2B's domain mode: the daemon answers `api.DOMAIN` and `PORT-ID.DOMAIN` over TLS.
    pub domain: Option<String>,
    /// Where the domain mode's CA and certificate are kept (made on first use).
    pub tls_dir: PathBuf,
    /// Where the files of template builds' COPY steps are kept, by their hash.
    pub uploads_dir: PathBuf,
    /// E2B templates forkbox carries a recipe for (`base`, `code-interpreter-v1`) to build at
    /// the start when this home has none of them yet.
    pub prebuild: Vec<String>,
    /// How long a create waits for its template's first build before answering that it is not
    /// ready yet (the SDKs wait 60 s for an answer).
    pub create_wait: std::time::Duration,
}

/// Whether a request is E2B's, by its URI and headers.
pub type Claims = Arc<dyn Fn(&axum::http::Uri, &HeaderMap) -> bool + Send + Sync>;

/// E2B's front end, ready to serve: its routes, which requests are its own, and in domain mode
/// the TLS site it answers.
pub struct Front {
    pub router: axum::Router,
    pub claims: Claims,
    pub site: Option<tls::Site>,
    /// Builds the templates [`Options::prebuild`] names that this home lacks, once the daemon
    /// answers: to spawn on the daemon's runtime.
    pub prebuild: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

/// The front end's state: its clients and what it knows of the commands it started.
pub(crate) struct E2b {
    /// Itself, for the work it spawns.
    me: std::sync::Weak<E2b>,
    /// The daemon over its socket.
    daemon: Client,
    api_url: String,
    key: [u8; 32],
    /// A client per caller's key (by the key's hash), reused for their connections.
    keyed: Mutex<HashMap<String, Client>>,
    /// (sandbox, pid) → the daemon's command id, for the commands started here.
    procs: Mutex<HashMap<(String, u32), envd::Proc>>,
    /// Directory watchers (CreateWatcher): id → (sandbox, command id, events read so far).
    watchers: Mutex<HashMap<String, envd::Watcher>>,
    /// (sandbox, user asked for) → (user, home): where relative paths of `/files` go.
    homes: Mutex<HashMap<(String, String), (String, String)>>,
    /// One port forward made at a time (`get_host` in domain mode reuses them).
    forwarding: tokio::sync::Mutex<()>,
    /// E2B's domain, in domain mode.
    domain: Option<String>,
    /// One warm code interpreter sandbox made at a time.
    warming: tokio::sync::Mutex<()>,
    /// One first build of a carried template at a time.
    building: tokio::sync::Mutex<()>,
    /// Templates' first preparations under way.
    firsts: first::Firsts,
    /// How long a create waits for one ([`Options::create_wait`]).
    create_wait: std::time::Duration,
    /// Every sandbox's kept metrics.
    metrics: metrics::Series,
    /// Template builds.
    builds: builds::Builds,
    /// Template tags.
    tags: tags::Tags,
    /// One volume content helper made or released at a time.
    volume_helpers: tokio::sync::Mutex<()>,
    /// Every key's secrets, their values sealed.
    secrets: secrets::Secrets,
}

/// What a command may print before its `ready` line (and of its stderr, what is kept for the
/// error): a guest's output is never held without bound.
const MAX_BEFORE_READY: usize = 64 * 1024;

/// A command that said it is ready ([`E2b::start_until_ready`]).
pub(crate) struct Ready {
    pub cid: String,
    pub events: forkbox_client::Events<forkbox_api::CommandEvent>,
    /// What it printed after its `ready` line.
    pub rest: String,
}

/// Whether a request is E2B's: a data-plane call names its sandbox in `E2b-Sandbox-Id`, a
/// control-plane call carries `X-API-KEY` (forkbox's own API takes `Authorization: Bearer`),
/// a pre-signed file URL is `/files?…&signature=…` (in URL mode it names no sandbox: its
/// signature tells which), and in domain mode every name under the domain is E2B's.
fn claims(uri: &axum::http::Uri, headers: &HeaderMap, domain: Option<&str>) -> bool {
    if headers.contains_key(SANDBOX_ID_HEADER) || headers.contains_key(API_KEY_HEADER) {
        return true;
    }
    let signed = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("signature=")));
    if (uri.path() == "/files" || builds::is_upload(uri)) && signed {
        return true;
    }
    // A volume's content calls carry its token as their bearer; forkbox's API has no such path.
    if uri.path().starts_with("/volumecontent/") {
        return true;
    }
    let Some(d) = domain else {
        return false;
    };
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == d || name.strip_suffix(d).is_some_and(|r| r.ends_with('.'))
}

/// Whether forkbox carries a recipe for E2B template `name` (what [`Options::prebuild`] may
/// name): `base`, `code-interpreter-v1` and forkbox's own images.
pub fn carries(name: &str) -> bool {
    interpreter::wanted(name) || templates::seed(name).is_some()
}

/// E2B's front end over the daemon `options` names.
pub fn front(options: Options) -> std::io::Result<Front> {
    let daemon =
        Client::new(Endpoint::Unix(options.socket.clone())).map_err(std::io::Error::other)?;
    let domain = options
        .domain
        .as_deref()
        .map(tls::check_domain)
        .transpose()
        .map_err(std::io::Error::other)?;
    let site = match &domain {
        Some(d) => Some(tls::site(&options.tls_dir, d)?),
        None => None,
    };
    let key = keys::load_or_make(&options.key_file)?;
    let state = Arc::new_cyclic(|me| E2b {
        me: me.clone(),
        daemon,
        api_url: options.api_url.trim_end_matches('/').to_string(),
        key,
        keyed: Mutex::default(),
        procs: Mutex::default(),
        watchers: Mutex::default(),
        homes: Mutex::default(),
        forwarding: tokio::sync::Mutex::new(()),
        domain: domain.clone(),
        warming: tokio::sync::Mutex::new(()),
        building: tokio::sync::Mutex::new(()),
        firsts: first::Firsts::default(),
        create_wait: options.create_wait,
        metrics: metrics::Series::default(),
        builds: builds::Builds::new(options.uploads_dir.clone()),
        tags: tags::Tags::load(options.uploads_dir.with_file_name("e2b-tags.json")),
        volume_helpers: tokio::sync::Mutex::new(()),
        secrets: secrets::Secrets::load(
            options.uploads_dir.with_file_name("e2b-secrets.json"),
            &key,
        ),
    });
    // The data plane's paths (Connect services, `/files`, `/health`) and the control plane's
    // do not meet; each data-plane handler checks its sandbox's header and token. In domain
    // mode a sandbox's own ports come first, by host name.
    let router = envd::router(state.clone())
        .merge(builds::router(state.clone()))
        .merge(tags::router(state.clone()))
        .merge(volumes::router(state.clone()))
        .merge(secrets::router(state.clone()))
        .merge(control::router(state.clone()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            sandbox_ports,
        ));
    let d = domain.clone();
    Ok(Front {
        router,
        claims: Arc::new(move |u: &axum::http::Uri, h: &HeaderMap| claims(u, h, d.as_deref())),
        site,
        prebuild: Box::pin(first::prebuild(state, options.prebuild)),
    })
}

/// A call for another port of a sandbox than envd's reaches that port, as E2B's proxy routes
/// it (the code interpreter's 49999, a user's server): named by `E2b-Sandbox-Port` and
/// `E2b-Sandbox-Id` (the URL variables' way), or in domain mode by the host `PORT-ID.DOMAIN`.
/// Through a port forward of the daemon; as open as E2B's (no token).
async fn sandbox_ports(
    axum::extract::State(e): axum::extract::State<Arc<E2b>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let target = {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|h| h.to_str().ok())
                .map(str::trim)
                .unwrap_or("")
                .to_string()
        };
        let by_host = e
            .domain
            .as_deref()
            .and_then(|d| ports::target(&header("host"), d));
        let by_header = header(SANDBOX_PORT_HEADER)
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .map(|p| (p, header(SANDBOX_ID_HEADER)))
            .filter(|(_, id)| !id.is_empty());
        by_host.or(by_header)
    };
    match target {
        Some((port, id)) if port != ENVD_PORT => ports::proxy(&e, &id, port, req).await,
        _ => next.run(req).await,
    }
}

impl E2b {
    /// The daemon as the caller with key `key` (their bearer token).
    fn as_caller(&self, key: &str) -> Result<Client, errors::Failure> {
        let id = keys::owner(key);
        let mut m = self.keyed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = m.get(&id) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::Http {
            url: self.api_url.clone(),
            token: Some(key.to_string()),
        };
        let c = Client::new(endpoint)
            .map_err(|e| errors::Failure::new(401, format!("the API key is not usable: {e}")))?;
        if m.len() > 1024 {
            m.clear();
        }
        m.insert(id, c.clone());
        Ok(c)
    }
}

impl E2b {
    /// Resumes sandbox `id` when it is paused and was made with `autoResume` (E2B resumes such
    /// a sandbox on the next call that needs it); a sandbox that is gone is E2B's 502. Says
    /// whether it resumed it.
    async fn awake(&self, id: &str) -> Result<bool, errors::Failure> {
        let v = match self.daemon.get(id).await {
            Ok(v) => v,
            Err(e) if e.status() == Some(404) => {
                return Err(errors::Failure::new(
                    502,
                    format!("The sandbox {id} was not found"),
                ))
            }
            Err(e) => return Err(e.into()),
        };
        if crate::shape::state(&v) == "paused" && crate::shape::auto_resumes(&v) {
            tracing::info!("e2b: {id} is paused and asked for autoResume: resuming it");
            self.daemon.resume(id).await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether sandbox `id` is there and running.
    async fn running(&self, id: &str) -> bool {
        matches!(
            self.daemon.get(id).await,
            Ok(v) if v.state == forkbox_api::SandboxState::Running
        )
    }

    /// Runs `argv` as root in sandbox `id` through the daemon; its stdout when it exits 0.
    async fn run_root(&self, id: &str, argv: Vec<String>) -> Result<String, errors::Failure> {
        let r = self.exec(id, argv).await?;
        match r.exit_code {
            0 => Ok(r.stdout),
            n => Err(errors::Failure::new(
                500,
                format!(
                    "a command in sandbox {id} failed ({n}): {}",
                    r.stderr.trim()
                ),
            )),
        }
    }

    /// Starts `exec` in sandbox `id` and follows it until it prints a line `ready`: its command
    /// id, its events from there on, and what it printed after that line. A command that ends
    /// first is `ended(exit code, its stderr)`.
    async fn start_until_ready(
        &self,
        id: &str,
        exec: &forkbox_api::ExecRequest,
        ended: impl FnOnce(i32, &str) -> errors::Failure,
    ) -> Result<Ready, errors::Failure> {
        use forkbox_api::CommandEvent;
        let started = self.daemon.start_command(id, exec).await?;
        let mut events = self.daemon.attach(id, &started.command_id).await?;
        let (mut out, mut err) = (String::new(), String::new());
        loop {
            match events.next().await? {
                Some(CommandEvent::Stdout { data_b64 }) => {
                    out.push_str(&String::from_utf8_lossy(&envd::bytes_field(&data_b64)?));
                    if out.len() > MAX_BEFORE_READY {
                        return Err(errors::Failure::new(
                            500,
                            format!("a command in sandbox {id} printed over {MAX_BEFORE_READY} bytes before it was ready"),
                        ));
                    }
                    if let Some(at) = out.find("ready\n") {
                        return Ok(Ready {
                            cid: started.command_id,
                            events,
                            rest: out[at + "ready\n".len()..].to_string(),
                        });
                    }
                }
                Some(CommandEvent::Stderr { data_b64 }) if err.len() < MAX_BEFORE_READY => {
                    err.push_str(&String::from_utf8_lossy(&envd::bytes_field(&data_b64)?))
                }
                Some(CommandEvent::Stderr { .. }) => {}
                Some(CommandEvent::Exit(x)) => return Err(ended(x.exit_code, &err)),
                Some(CommandEvent::Error { message, .. }) => {
                    return Err(errors::Failure::new(500, message))
                }
                Some(CommandEvent::Command { .. }) => {}
                None => return Err(errors::Failure::new(503, format!("sandbox {id} stopped"))),
            }
        }
    }

    /// Runs `argv` in sandbox `id` through the daemon and waits.
    async fn exec(
        &self,
        id: &str,
        argv: Vec<String>,
    ) -> Result<forkbox_api::ExecResult, errors::Failure> {
        let req = forkbox_api::ExecRequest {
            argv: Some(argv),
            timeout_secs: Some(60),
            ..Default::default()
        };
        Ok(self.daemon.exec(id, &req).await?)
    }

    /// Forgets what the front end kept about sandbox `id`'s commands (it is gone, or its
    /// commands' streams are).
    fn forget(&self, id: &str) {
        self.procs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(sb, _), _| sb != id);
        self.forget_all_but_processes(id);
    }

    /// [`Self::forget`] but for its processes (it sleeps with its memory: they run on).
    fn forget_all_but_processes(&self, id: &str) {
        self.watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, w| w.sandbox != id);
        self.homes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(sb, _), _| sb != id);
    }
}
