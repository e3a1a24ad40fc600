//! An async client of forkbox's HTTP API: every operation of the daemon as a typed call, over
//! its Unix socket or over TCP with a bearer token. `FORKBOX_API` (`unix:/path` or
//! `http://host:port`) and `FORKBOX_TOKEN` name them the way every forkbox front end reads them.
//! The request and reply types are the API's own (`forkbox-api`), the ones the daemon answers
//! with; it links no engine.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use forkbox_api::routes::{op, reply, Method, Route};
use forkbox_api::{
    ArchiveFormat, BuildProgress, BuildRequest, CommandEvent, CreateRequest, ExecRequest,
    ForkRequest, ForkResult, MigrationEvent, MigrationStart, SandboxState, SnapshotRequest,
    TerminalSize, Unpacked,
};
use forkbox_archive::ArchiveError;
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon refused the request; `message` is its own words, `code` its stable name.
    #[error("{message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("no forkbox API answers {at}: {cause}")]
    NotAnswering { at: String, cause: String },
    #[error("FORKBOX_API={0:?}: give unix:/path/to/socket or http://host:port")]
    BadEndpoint(String),
    #[error("FORKBOX_TOKEN is not a valid header value")]
    BadToken,
    #[error("the connection to the forkbox daemon broke: {0}")]
    Transport(String),
    #[error("unreadable answer from the forkbox daemon: {0}")]
    Decode(String),
}

impl ClientError {
    /// A stable name for what went wrong: the daemon's `code`, or what failed on the way.
    pub fn code(&self) -> &str {
        match self {
            ClientError::Api { code, .. } => code,
            ClientError::NotAnswering { .. } => "daemon_not_answering",
            ClientError::BadEndpoint(_) | ClientError::BadToken => "bad_configuration",
            ClientError::Transport(_) => "connection_broken",
            ClientError::Decode(_) => "bad_answer",
        }
    }

    /// The HTTP status of a refusal.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Why a tree could not be copied in or out.
#[derive(Debug, thiserror::Error)]
pub enum TransferFailed {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Host(#[from] ArchiveError),
    #[error("could not pack {}: {why}", dir.display())]
    Pack { dir: PathBuf, why: String },
}

/// Where the API is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Http { url: String, token: Option<String> },
}

impl Endpoint {
    /// The API `FORKBOX_API` names (with `FORKBOX_TOKEN` for TCP); `None` when it is unset,
    /// which means this host's own daemon.
    pub fn from_env() -> Result<Option<Endpoint>, ClientError> {
        let api = std::env::var("FORKBOX_API").unwrap_or_default();
        Endpoint::parse(&api, std::env::var("FORKBOX_TOKEN").ok())
    }

    pub fn parse(api: &str, token: Option<String>) -> Result<Option<Endpoint>, ClientError> {
        if api.is_empty() {
            return Ok(None);
        }
        if api.starts_with("http://") || api.starts_with("https://") {
            return Ok(Some(Endpoint::Http {
                url: api.trim_end_matches('/').to_string(),
                token,
            }));
        }
        match api
            .strip_prefix("unix:")
            .or(Some(api).filter(|a| a.starts_with('/')))
        {
            Some(path) => Ok(Some(Endpoint::Unix(path.into()))),
            None => Err(ClientError::BadEndpoint(api.to_string())),
        }
    }

    fn describe(&self) -> String {
        match self {
            Endpoint::Unix(p) => format!("on {}", p.display()),
            Endpoint::Http { url, .. } => format!("at {url}"),
        }
    }
}

/// A connection to one forkbox API.
/// Which sandboxes a listing keeps.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListFilter<'a> {
    /// `K=V`.
    pub label: Option<&'a str>,
    pub state: Option<SandboxState>,
    /// In a cluster: one node's.
    pub node: Option<&'a str>,
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    endpoint: Endpoint,
}

fn transport(e: reqwest::Error) -> ClientError {
    ClientError::Transport(e.to_string())
}

impl Client {
    pub fn new(endpoint: Endpoint) -> Result<Client, ClientError> {
        // reqwest is built without a crypto provider of its own: forkbox's one TLS stack is
        // rustls on `ring`, made the process's default here (idempotent).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (http, base) = match &endpoint {
            // No TLS on a Unix socket or to an `http://` URL: such a client needs no CA roots
            // (a host without a CA bundle still reaches its own daemon).
            Endpoint::Unix(socket) => (
                reqwest::Client::builder()
                    .unix_socket(socket.clone())
                    .tls_certs_only([])
                    .build()
                    .map_err(transport)?,
                "http://forkbox".to_string(),
            ),
            Endpoint::Http { url, token } => {
                let mut headers = reqwest::header::HeaderMap::new();
                if let Some(token) = token {
                    let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                        .map_err(|_| ClientError::BadToken)?;
                    v.set_sensitive(true);
                    headers.insert(reqwest::header::AUTHORIZATION, v);
                }
                let builder = reqwest::Client::builder().default_headers(headers);
                let builder = if url.starts_with("https://") {
                    builder
                } else {
                    builder.tls_certs_only([])
                };
                let http = builder.build().map_err(|e| {
                    ClientError::Transport(format!(
                        "{e}: an https:// API needs this host's CA certificates (install ca-certificates, or set SSL_CERT_FILE)"
                    ))
                })?;
                (http, url.trim_end_matches('/').to_string())
            }
        };
        Ok(Client {
            http,
            base,
            endpoint,
        })
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// A request of the API's route `r` with its parameters `args` (each one path segment).
    fn at(&self, r: Route, args: &[&str]) -> reqwest::RequestBuilder {
        let url = format!("{}{}", self.base, r.fill(args));
        match r.method {
            Method::Get => self.http.get(url),
            Method::Post => self.http.post(url),
            Method::Put => self.http.put(url),
            Method::Delete => self.http.delete(url),
        }
    }

    /// Sends a request; an answer other than success becomes [`ClientError::Api`].
    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let resp = req.send().await.map_err(|e| {
            if e.is_connect() {
                ClientError::NotAnswering {
                    at: self.endpoint.describe(),
                    cause: e.to_string(),
                }
            } else {
                transport(e)
            }
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.bytes().await.map_err(transport)?;
        let v = serde_json::from_slice::<serde_json::Value>(&body).ok();
        let field = |name: &str| {
            v.as_ref()
                .and_then(|v| v[name].as_str().map(str::to_string))
        };
        Err(ClientError::Api {
            status: status.as_u16(),
            code: field("code").unwrap_or_else(|| format!("http_{}", status.as_u16())),
            message: field("error").unwrap_or_else(|| {
                let text = String::from_utf8_lossy(&body);
                match text.trim() {
                    "" => format!("{status} (this forkbox daemon has no such operation)"),
                    t => format!("{status}: {t}"),
                }
            }),
        })
    }

    async fn json<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let body = self.send(req).await?.bytes().await.map_err(transport)?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// True when the API answers.
    pub async fn health(&self) -> bool {
        self.send(self.at(op::health, &[])).await.is_ok()
    }

    pub async fn info(&self) -> Result<reply::info, ClientError> {
        self.json(self.at(op::info, &[])).await
    }

    /// In a cluster: the progress of a carried image's first build from line `from` on,
    /// through any node (`None` when no node builds it now or has built it).
    pub async fn build_log(
        &self,
        image: &str,
        from: usize,
    ) -> Result<Option<reply::build_log>, ClientError> {
        let req = self
            .at(op::build_log, &[image])
            .query(&[("from", from.to_string())]);
        match self.json(req).await {
            Ok(v) => Ok(Some(v)),
            Err(ClientError::Api { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn metrics(&self) -> Result<String, ClientError> {
        let req = self.at(op::metrics, &[]);
        self.send(req).await?.text().await.map_err(transport)
    }

    // -- sandboxes ---------------------------------------------------------------------------

    pub async fn create(&self, req: &CreateRequest) -> Result<reply::create, ClientError> {
        self.json(self.at(op::create, &[]).json(req)).await
    }

    pub async fn get(&self, id: &str) -> Result<reply::get_one, ClientError> {
        self.json(self.at(op::get_one, &[id])).await
    }

    /// Sandboxes with the label `K=V` and in the state given, or all.
    pub async fn list(
        &self,
        label: Option<&str>,
        state: Option<SandboxState>,
    ) -> Result<reply::list, ClientError> {
        self.list_where(ListFilter {
            label,
            state,
            node: None,
        })
        .await
    }

    /// The sandboxes that pass every filter given (in a cluster: of every node).
    pub async fn list_where(&self, f: ListFilter<'_>) -> Result<reply::list, ClientError> {
        let mut req = self.at(op::list, &[]);
        if let Some(l) = f.label {
            req = req.query(&[("label", l)]);
        }
        if let Some(s) = f.state {
            let s = serde_json::to_value(s).map_err(|e| ClientError::Decode(e.to_string()))?;
            req = req.query(&[("state", s.as_str().unwrap_or_default())]);
        }
        if let Some(n) = f.node {
            req = req.query(&[("node", n)]);
        }
        self.json(req).await
    }

    pub async fn delete(&self, id: &str) -> Result<reply::delete, ClientError> {
        self.json(self.at(op::delete, &[id])).await
    }

    /// Runs a command and waits; output capped at 64 KiB per stream.
    pub async fn exec(&self, id: &str, req: &ExecRequest) -> Result<reply::exec, ClientError> {
        self.json(self.at(op::exec, &[id]).json(req)).await
    }

    /// Runs a command; its events as they happen (command, output chunks, then exit or error).
    pub async fn exec_events(
        &self,
        id: &str,
        req: &ExecRequest,
    ) -> Result<Events<CommandEvent>, ClientError> {
        let req = self
            .at(op::exec, &[id])
            .query(&[("stream", "true")])
            .json(req);
        Ok(Events::new(self.send(req).await?))
    }

    /// Starts a command that outlives this call.
    pub async fn start_command(
        &self,
        id: &str,
        req: &ExecRequest,
    ) -> Result<reply::start_command, ClientError> {
        self.json(self.at(op::start_command, &[id]).json(req)).await
    }

    /// A started command's events from its start, following it to its end.
    pub async fn attach(
        &self,
        id: &str,
        command_id: &str,
    ) -> Result<Events<CommandEvent>, ClientError> {
        let req = self.at(op::command_events, &[id, command_id]);
        Ok(Events::new(self.send(req).await?))
    }

    pub async fn poll(
        &self,
        id: &str,
        command_id: &str,
        from: usize,
    ) -> Result<reply::command_poll, ClientError> {
        let req = self
            .at(op::command_poll, &[id, command_id])
            .query(&[("from", from)]);
        self.json(req).await
    }

    pub async fn signal(&self, id: &str, command_id: &str, signal: i32) -> Result<(), ClientError> {
        let req = self
            .at(op::command_signal, &[id, command_id])
            .json(&serde_json::json!({ "signal": signal }));
        self.send(req).await.map(drop)
    }

    /// A new size for the terminal of a command started with `tty`.
    pub async fn resize(
        &self,
        id: &str,
        command_id: &str,
        size: TerminalSize,
    ) -> Result<(), ClientError> {
        let req = self.at(op::command_resize, &[id, command_id]).json(&size);
        self.send(req).await.map(drop)
    }

    /// Feeds the chunks `rx` gives, as they come, to the standard input of a command started
    /// with `stdin: true`; closes it after them when `close`.
    pub async fn write_stdin(
        &self,
        id: &str,
        command_id: &str,
        rx: tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
        close: bool,
    ) -> Result<reply::command_stdin, ClientError> {
        let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        self.json(
            self.at(op::command_stdin, &[id, command_id])
                .query(&[("close", close)])
                .body(body),
        )
        .await
    }

    pub async fn set_ttl(&self, id: &str, ttl_seconds: u64) -> Result<reply::set_ttl, ClientError> {
        let req = self
            .at(op::set_ttl, &[id])
            .json(&serde_json::json!({ "ttl_seconds": ttl_seconds }));
        self.json(req).await
    }

    /// Replaces a running sandbox's network policy.
    pub async fn set_network(
        &self,
        id: &str,
        policy: &forkbox_api::NetworkPolicy,
    ) -> Result<reply::set_network, ClientError> {
        self.json(self.at(op::set_network, &[id]).json(policy))
            .await
    }

    /// A new idle policy for sandbox `id` (`idle: None` turns sleeping off).
    pub async fn set_idle(
        &self,
        id: &str,
        request: &forkbox_api::IdleRequest,
    ) -> Result<reply::set_idle, ClientError> {
        self.json(self.at(op::set_idle, &[id]).json(request)).await
    }

    pub async fn snapshot(
        &self,
        id: &str,
        req: &SnapshotRequest,
    ) -> Result<reply::snapshot, ClientError> {
        self.json(self.at(op::snapshot, &[id]).json(req)).await
    }

    /// Copies of a sandbox (saved first; ids start with `sb-`) or of a snapshot.
    pub async fn fork(&self, source: &str, req: &ForkRequest) -> Result<ForkResult, ClientError> {
        let route = if source.starts_with("sb-") {
            op::fork
        } else {
            op::fork_snapshot
        };
        self.json(self.at(route, &[source]).json(req)).await
    }

    pub async fn hibernate(&self, id: &str) -> Result<reply::hibernate, ClientError> {
        self.json(self.at(op::hibernate, &[id])).await
    }

    /// Hibernates keeping only the sandbox's files: its resume boots it from its disk.
    pub async fn hibernate_files_only(&self, id: &str) -> Result<reply::hibernate, ClientError> {
        let req = self.at(op::hibernate, &[id]).query(&[("memory", "false")]);
        self.json(req).await
    }

    pub async fn resume(&self, id: &str) -> Result<reply::resume, ClientError> {
        self.json(self.at(op::resume, &[id])).await
    }

    // -- ports -------------------------------------------------------------------------------

    /// A host port whose connections reach `req.guest_port` in the guest.
    pub async fn forward_port(
        &self,
        id: &str,
        req: &forkbox_api::PortRequest,
    ) -> Result<reply::forward_port, ClientError> {
        self.json(self.at(op::forward_port, &[id]).json(req)).await
    }

    pub async fn list_ports(&self, id: &str) -> Result<reply::list_ports, ClientError> {
        self.json(self.at(op::list_ports, &[id])).await
    }

    pub async fn close_port(
        &self,
        id: &str,
        host_port: u16,
    ) -> Result<reply::close_port, ClientError> {
        let port = host_port.to_string();
        self.json(self.at(op::close_port, &[id, &port])).await
    }

    // -- code cells --------------------------------------------------------------------------

    /// Runs one code cell (the sandbox's code server started first if it is not running); its
    /// events as they come, `end` last.
    pub async fn run_code(
        &self,
        id: &str,
        req: &forkbox_api::RunCodeRequest,
    ) -> Result<Events<forkbox_api::CodeEvent>, ClientError> {
        let req = self.at(op::run_code, &[id]).json(req);
        Ok(Events::new(self.send(req).await?))
    }

    pub async fn list_code_contexts(
        &self,
        id: &str,
    ) -> Result<reply::list_code_contexts, ClientError> {
        self.json(self.at(op::list_code_contexts, &[id])).await
    }

    pub async fn create_code_context(
        &self,
        id: &str,
        req: &forkbox_api::CodeContextRequest,
    ) -> Result<reply::create_code_context, ClientError> {
        self.json(self.at(op::create_code_context, &[id]).json(req))
            .await
    }

    pub async fn restart_code_context(
        &self,
        id: &str,
        context_id: &str,
    ) -> Result<reply::restart_code_context, ClientError> {
        self.json(self.at(op::restart_code_context, &[id, context_id]))
            .await
    }

    pub async fn delete_code_context(
        &self,
        id: &str,
        context_id: &str,
    ) -> Result<reply::delete_code_context, ClientError> {
        self.json(self.at(op::delete_code_context, &[id, context_id]))
            .await
    }

    // -- files -------------------------------------------------------------------------------

    pub async fn read_file(&self, id: &str, path: &str) -> Result<bytes::Bytes, ClientError> {
        let req = self.at(op::read_file, &[id]).query(&[("path", path)]);
        self.send(req).await?.bytes().await.map_err(transport)
    }

    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: Vec<u8>,
        mode: u32,
    ) -> Result<reply::write_file, ClientError> {
        let req = self
            .at(op::write_file, &[id])
            .query(&[("path", path), ("mode", &format!("{mode:o}"))])
            .body(data);
        self.json(req).await
    }

    pub async fn list_dir(&self, id: &str, path: &str) -> Result<reply::list_dir, ClientError> {
        let req = self.at(op::list_dir, &[id]).query(&[("path", path)]);
        self.json(req).await
    }

    /// Unpacks an archive streamed from `body` into `path` in the sandbox.
    pub async fn put_archive(
        &self,
        id: &str,
        path: &str,
        format: ArchiveFormat,
        body: reqwest::Body,
    ) -> Result<reply::put_archive, ClientError> {
        let req = self
            .at(op::put_archive, &[id])
            .query(&[("path", path), ("format", format_name(format))])
            .body(body);
        self.json(req).await
    }

    /// `path` in the sandbox as an archive, chunk by chunk; an error the guest meets ends the
    /// stream with an error.
    pub async fn get_archive(
        &self,
        id: &str,
        path: &str,
        format: ArchiveFormat,
    ) -> Result<impl Stream<Item = Result<bytes::Bytes, ClientError>>, ClientError> {
        let req = self
            .at(op::get_archive, &[id])
            .query(&[("path", path), ("format", format_name(format))]);
        Ok(self
            .send(req)
            .await?
            .bytes_stream()
            .map(|r| r.map_err(transport)))
    }

    /// Copies the host directory `host_dir` into `guest_dir` in the sandbox as one tar.zst
    /// stream (symlinks stay links); the compressed bytes sent.
    pub async fn upload_dir(
        &self,
        id: &str,
        host_dir: &std::path::Path,
        guest_dir: &str,
    ) -> Result<Unpacked, TransferFailed> {
        let (rx, packer) = forkbox_archive::pack(host_dir)?;
        let body = reqwest::Body::wrap_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>),
        );
        let sent = self
            .put_archive(id, guest_dir, ArchiveFormat::TarZst, body)
            .await?;
        packer
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|why| TransferFailed::Pack {
                dir: host_dir.to_path_buf(),
                why,
            })?;
        Ok(sent)
    }

    /// Copies `guest_path` out of the sandbox into the new host directory `host_dir`, with the
    /// engine's checked unpacking (plain files and directories only); the files written.
    pub async fn download_into(
        &self,
        id: &str,
        guest_path: &str,
        host_dir: &std::path::Path,
    ) -> Result<u64, TransferFailed> {
        let mut body = Box::pin(
            self.get_archive(id, guest_path, ArchiveFormat::TarZst)
                .await?,
        );
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let feed = async move {
            while let Some(item) = body.next().await {
                let item = item.map(|b| b.to_vec()).map_err(|e| ArchiveError::Io {
                    what: "download from the daemon (the sandbox may have refused the path)".into(),
                    source: std::io::Error::other(e),
                });
                if tx.send(item).await.is_err() {
                    break;
                }
            }
        };
        let (files, ()) = tokio::join!(forkbox_archive::unpack_into(rx, host_dir), feed);
        Ok(files?)
    }

    // -- migrations --------------------------------------------------------------------------

    /// Registers a run of `forkbox migrate` with the daemon.
    pub async fn start_migration(
        &self,
        start: &MigrationStart,
    ) -> Result<reply::start_migration, ClientError> {
        self.json(self.at(op::start_migration, &[]).json(start))
            .await
    }

    /// A registered run's progress, or its end.
    pub async fn migration_event(
        &self,
        id: &str,
        event: &MigrationEvent,
    ) -> Result<reply::migration_event, ClientError> {
        self.json(self.at(op::migration_event, &[id]).json(event))
            .await
    }

    pub async fn list_migrations(&self) -> Result<reply::list_migrations, ClientError> {
        self.json(self.at(op::list_migrations, &[])).await
    }

    // -- snapshots and images ---------------------------------------------------------------

    pub async fn list_snapshots(&self) -> Result<reply::list_snapshots, ClientError> {
        self.json(self.at(op::list_snapshots, &[])).await
    }

    pub async fn get_snapshot(&self, name: &str) -> Result<reply::get_snapshot, ClientError> {
        self.json(self.at(op::get_snapshot, &[name])).await
    }

    pub async fn delete_snapshot(&self, name: &str) -> Result<reply::delete_snapshot, ClientError> {
        self.json(self.at(op::delete_snapshot, &[name])).await
    }

    pub async fn create_volume(
        &self,
        req: &forkbox_api::VolumeCreateRequest,
    ) -> Result<reply::create_volume, ClientError> {
        self.json(self.at(op::create_volume, &[]).json(req)).await
    }

    pub async fn list_volumes(&self) -> Result<reply::list_volumes, ClientError> {
        self.json(self.at(op::list_volumes, &[])).await
    }

    pub async fn get_volume(&self, name: &str) -> Result<reply::get_volume, ClientError> {
        self.json(self.at(op::get_volume, &[name])).await
    }

    pub async fn remove_volume(&self, name: &str) -> Result<reply::remove_volume, ClientError> {
        self.json(self.at(op::remove_volume, &[name])).await
    }

    pub async fn list_images(&self) -> Result<reply::list_images, ClientError> {
        self.json(self.at(op::list_images, &[])).await
    }

    /// The builds under way in the daemon's home.
    pub async fn list_builds(&self) -> Result<reply::list_builds, ClientError> {
        self.json(self.at(op::list_builds, &[])).await
    }

    pub async fn get_image(&self, reference: &str) -> Result<reply::get_image, ClientError> {
        self.json(self.at(op::get_image, &[reference])).await
    }

    pub async fn remove_image(&self, reference: &str) -> Result<reply::remove_image, ClientError> {
        self.json(self.at(op::remove_image, &[reference])).await
    }

    /// Builds an image; its progress, ending with `done`, `up_to_date` or `error`.
    pub async fn build_image(
        &self,
        req: &BuildRequest,
    ) -> Result<Events<BuildProgress>, ClientError> {
        let req = self.at(op::build_image, &[]).json(req);
        Ok(Events::new(self.send(req).await?))
    }

    /// Builds the next version of `name` from the Dockerfile at `dockerfile` (default
    /// `Dockerfile`) in `context`, a tar.zst of the build context; its progress, ending with
    /// `done` or `error`. With `if_changed`, ends with `up_to_date` and builds nothing when the
    /// newest version of `name` was made of the same inputs.
    pub async fn build_dockerfile(
        &self,
        name: &str,
        dockerfile: Option<&str>,
        args: &[(String, String)],
        if_changed: bool,
        context: reqwest::Body,
    ) -> Result<Events<BuildProgress>, ClientError> {
        let mut query = vec![("name", name.to_string())];
        if if_changed {
            query.push(("if_changed", "true".to_string()));
        }
        if let Some(f) = dockerfile {
            query.push(("dockerfile", f.to_string()));
        }
        for (k, v) in args {
            query.push(("arg", format!("{k}={v}")));
        }
        let req = self
            .at(op::build_dockerfile, &[])
            .query(&query)
            .body(context);
        Ok(Events::new(self.send(req).await?))
    }
}

fn format_name(f: ArchiveFormat) -> &'static str {
    match f {
        ArchiveFormat::TarZst => "tar.zst",
        ArchiveFormat::TarGz => "tar.gz",
    }
}

/// The events of a newline-delimited JSON answer, one at a time.
pub struct Events<T> {
    body: std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    pending: Vec<u8>,
    _t: std::marker::PhantomData<T>,
}

impl<T: DeserializeOwned> Events<T> {
    fn new(resp: reqwest::Response) -> Events<T> {
        Events {
            body: Box::pin(resp.bytes_stream()),
            pending: Vec::new(),
            _t: std::marker::PhantomData,
        }
    }

    /// The next event; `None` when the answer ends.
    pub async fn next(&mut self) -> Result<Option<T>, ClientError> {
        loop {
            if let Some(nl) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=nl).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line)
                    .map(Some)
                    .map_err(|e| ClientError::Decode(e.to_string()));
            }
            match self.body.next().await {
                Some(chunk) => self.pending.extend_from_slice(&chunk.map_err(transport)?),
                None if self.pending.iter().all(u8::is_ascii_whitespace) => return Ok(None),
                None => {
                    let rest = std::mem::take(&mut self.pending);
                    return serde_json::from_slice(&rest)
                        .map(Some)
                        .map_err(|e| ClientError::Decode(e.to_string()));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_as_every_front_end_reads_them() {
        assert_eq!(Endpoint::parse("", None).unwrap(), None);
        assert_eq!(
            Endpoint::parse("unix:/run/f.sock", None).unwrap(),
            Some(Endpoint::Unix("/run/f.sock".into()))
        );
        assert_eq!(
            Endpoint::parse("/run/f.sock", None).unwrap(),
            Some(Endpoint::Unix("/run/f.sock".into()))
        );
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:7070/", Some("t".into())).unwrap(),
            Some(Endpoint::Http {
                url: "http://127.0.0.1:7070".into(),
                token: Some("t".into())
            })
        );
        assert!(matches!(
            Endpoint::parse("localhost:7070", None),
            Err(ClientError::BadEndpoint(_))
        ));
    }
}
