//! forkbox as an MCP server: sandboxes as tools for coding agents. One more thin front end:
//! every tool is a call of the daemon's API through `forkbox-client`. `forkbox mcp` serves it
//! over stdio; the daemon serves it over Streamable HTTP at `/mcp` (see [`http_service`]).
//!
//! A session sees and touches only the sandboxes it created (unless started with `all`), and
//! deletes them when it ends unless they were created `persistent`. Host paths (upload,
//! download) are allowed only under the roots given at start.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use forkbox_api::NetworkPolicy;
use forkbox_api::{
    CommandEvent, CreateRequest, ExecRequest, ForkRequest, SnapshotRequest, TtlAction,
};
use forkbox_client::{Client, ClientError};
use forkbox_reports::{self as reports, Format, Outcome, Results};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};

mod args;
mod cell;
pub use args::*;

/// Output an `exec` returns per stream; the tail is kept.
pub const EXEC_TAIL: usize = 32 * 1024;

/// How a session is allowed to act.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Host directories `upload` may read from and `download` may write into.
    pub roots: Vec<PathBuf>,
    /// See every sandbox of the daemon, not only this session's.
    pub all: bool,
}

/// One MCP session's state: its sandboxes (id → persistent) and saved test reports.
struct Session {
    client: Client,
    options: Options,
    created: Mutex<HashMap<String, bool>>,
    reports: Mutex<HashMap<String, Results>>,
}

impl Session {
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sandboxes to delete when the session ends.
    fn disposable(&self) -> Vec<String> {
        Self::lock(&self.created)
            .iter()
            .filter(|(_, persistent)| !**persistent)
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn check_visible(&self, id: &str) -> Result<(), String> {
        if self.options.all || Self::lock(&self.created).contains_key(id) {
            Ok(())
        } else {
            Err(format!(
                "sandbox {id} was not created in this session; a session works only on its own sandboxes (start the server with --all to reach every one)"
            ))
        }
    }

    /// `p` resolved, when it lies under one of the allowed roots.
    fn host_path(&self, p: &str, must_exist: bool) -> Result<PathBuf, String> {
        let path = Path::new(p);
        if !path.is_absolute() {
            return Err(format!("{p} is not an absolute host path"));
        }
        let resolved = if must_exist {
            path.canonicalize()
                .map_err(|e| format!("{p} cannot be read: {e}"))?
        } else {
            let parent = path
                .parent()
                .ok_or_else(|| format!("{p} has no parent directory"))?
                .canonicalize()
                .map_err(|e| format!("the directory of {p} cannot be read: {e}"))?;
            parent.join(path.file_name().unwrap_or_default())
        };
        let roots: Vec<PathBuf> = self
            .options
            .roots
            .iter()
            .filter_map(|r| r.canonicalize().ok())
            .collect();
        if roots.iter().any(|r| resolved.starts_with(r)) {
            Ok(resolved)
        } else if roots.is_empty() {
            Err("no host directory is allowed: start the MCP server with --root DIR to allow upload and download under DIR".into())
        } else {
            Err(format!(
                "{} is outside the allowed host directories ({})",
                resolved.display(),
                roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    }
}

impl Drop for Session {
    /// A session that ends (its transport closed, its HTTP session expired) deletes what it
    /// created, unless persistent.
    fn drop(&mut self) {
        let ids = self.disposable();
        if ids.is_empty() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            rt.spawn(async move {
                for id in ids {
                    let _ = client.delete(&id).await;
                }
            });
        }
    }
}

/// The MCP server of one session.
#[derive(Clone)]
pub struct ForkboxMcp {
    session: Arc<Session>,
    #[allow(dead_code)] // read by the tool_handler macro
    tool_router: ToolRouter<ForkboxMcp>,
}

type ToolResult = Result<CallToolResult, rmcp::ErrorData>;

fn ok(v: impl serde::Serialize) -> ToolResult {
    Ok(CallToolResult::success(vec![ContentBlock::text(
        serde_json::to_string_pretty(&v).unwrap_or_default(),
    )]))
}

fn text(t: impl Into<String>) -> ToolResult {
    Ok(CallToolResult::success(vec![ContentBlock::text(t)]))
}

/// What a tool can fail with: its words, and the API's code when the daemon refused.
trait Failure: std::fmt::Display {
    fn code(&self) -> Option<&str> {
        None
    }
}

impl Failure for ClientError {
    fn code(&self) -> Option<&str> {
        Some(ClientError::code(self))
    }
}

impl Failure for forkbox_client::TransferFailed {
    fn code(&self) -> Option<&str> {
        match self {
            forkbox_client::TransferFailed::Client(c) => Some(c.code()),
            _ => None,
        }
    }
}

impl Failure for String {}
impl Failure for &str {}

/// A refusal or failure as a tool error with the daemon's words (the session goes on); a
/// refusal's code (the same as every front end's) is in its structured content,
/// `{"error": …, "code": …}`.
fn failed(e: impl Failure) -> ToolResult {
    let message = e.to_string();
    let mut r = CallToolResult::error(vec![ContentBlock::text(message.clone())]);
    if let Some(code) = e.code() {
        r.structured_content = Some(serde_json::json!({ "error": message, "code": code }));
    }
    Ok(r)
}

macro_rules! try_tool {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return failed(e),
        }
    };
}

#[derive(Debug, serde::Serialize)]
struct TestSummary {
    exit_code: i32,
    counts: BTreeMap<&'static str, usize>,
    failed: Vec<String>,
    errors: Vec<String>,
    /// Passed in the baseline, not now.
    #[serde(skip_serializing_if = "Option::is_none")]
    lost: Option<Vec<String>>,
    /// Did not pass in the baseline, pass now.
    #[serde(skip_serializing_if = "Option::is_none")]
    fixed: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// Where a tool call's progress goes: the client and the token it gave.
pub struct Progress {
    peer: rmcp::Peer<rmcp::RoleServer>,
    token: rmcp::model::ProgressToken,
}

impl Progress {
    fn of(
        meta: &rmcp::model::RequestMetaObject,
        peer: rmcp::Peer<rmcp::RoleServer>,
    ) -> Option<Progress> {
        meta.get_progress_token()
            .map(|token| Progress { peer, token })
    }

    async fn report(&self, seconds: f64, out: &Tail) {
        let last = String::from_utf8_lossy(&out.data)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.chars().take(200).collect::<String>())
            .unwrap_or_default();
        let _ = self
            .peer
            .notify_progress(
                rmcp::model::ProgressNotificationParam::new(self.token.clone(), seconds)
                    .with_message(format!("running for {seconds:.0} s; last output: {last}")),
            )
            .await;
    }
}

/// Keeps the last `cap` bytes of a stream.
#[derive(Default)]
struct Tail {
    data: Vec<u8>,
    dropped: usize,
}

impl Tail {
    fn push(&mut self, b: &[u8], cap: usize) {
        self.data.extend_from_slice(b);
        if self.data.len() > cap {
            let cut = self.data.len() - cap;
            self.dropped += cut;
            self.data.drain(..cut);
        }
    }

    fn text(&self, what: &str) -> String {
        let body = String::from_utf8_lossy(&self.data).into_owned();
        if self.dropped > 0 {
            format!(
                "[forkbox: the first {} bytes of {what} were cut; the last {} are kept]\n{body}",
                self.dropped,
                self.data.len()
            )
        } else {
            body
        }
    }
}

#[tool_router]
impl ForkboxMcp {
    pub fn new(client: Client, options: Options) -> ForkboxMcp {
        ForkboxMcp {
            session: Arc::new(Session {
                client,
                options,
                created: Mutex::new(HashMap::new()),
                reports: Mutex::new(HashMap::new()),
            }),
            tool_router: Self::tool_router(),
        }
    }

    /// Deletes this session's non-persistent sandboxes now (the stdio server calls it when its
    /// client goes away).
    /// All deletions are asked for at once: a client that kills the server soon after closing
    /// it (the Python client allows 2 s) finds them under way, and the daemon finishes each
    /// request it received even when its client is gone.
    pub async fn end(&self) {
        let ids = self.session.disposable();
        let client = &self.session.client;
        futures_util::future::join_all(ids.iter().map(|id| client.delete(id))).await;
        let mut created = Session::lock(&self.session.created);
        for id in ids {
            created.remove(&id);
        }
    }

    fn c(&self) -> &Client {
        &self.session.client
    }

    /// Runs a shell command and waits: exit code and the tails of stdout and stderr. With
    /// `progress`, the client hears every 2 s how long it has run and its last line of output.
    async fn run(
        &self,
        sandbox: &str,
        command: String,
        cwd: Option<String>,
        timeout_seconds: Option<u64>,
        progress: Option<Progress>,
    ) -> Result<(i32, bool, Tail, Tail), ClientError> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let req = ExecRequest {
            shell: Some(command),
            cwd,
            timeout_secs: Some(timeout_seconds.unwrap_or(600)),
            ..Default::default()
        };
        let mut events = self.c().exec_events(sandbox, &req).await?;
        let (mut out, mut err) = (Tail::default(), Tail::default());
        let started = std::time::Instant::now();
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
        tick.tick().await;
        loop {
            let ev = tokio::select! {
                ev = events.next() => ev?,
                _ = tick.tick(), if progress.is_some() => {
                    if let Some(p) = &progress {
                        p.report(started.elapsed().as_secs_f64(), &out).await;
                    }
                    continue;
                }
            };
            let Some(ev) = ev else { break };
            match ev {
                CommandEvent::Stdout { data_b64 } => {
                    out.push(&b64.decode(data_b64).unwrap_or_default(), EXEC_TAIL)
                }
                CommandEvent::Stderr { data_b64 } => {
                    err.push(&b64.decode(data_b64).unwrap_or_default(), EXEC_TAIL)
                }
                CommandEvent::Exit(e) => return Ok((e.exit_code, e.timed_out, out, err)),
                CommandEvent::Error {
                    message,
                    exit_code: Some(code),
                } => {
                    err.push(format!("forkbox: {message}\n").as_bytes(), EXEC_TAIL);
                    return Ok((code, false, out, err));
                }
                CommandEvent::Error { message, .. } => {
                    return Err(ClientError::Api {
                        status: 500,
                        code: "command_failed".into(),
                        message,
                    })
                }
                CommandEvent::Command { .. } => {}
            }
        }
        Err(ClientError::Transport(
            "the command's stream ended before the command did".into(),
        ))
    }

    #[tool(
        description = "Create a sandbox: a disposable microVM with its own kernel, no network unless asked. Returns its id (sb-...) and what it runs on. It is deleted when this session ends unless persistent."
    )]
    async fn sandbox_create(&self, Parameters(a): Parameters<CreateArgs>) -> ToolResult {
        let network = (a.internet.unwrap_or(false)
            || a.allow.as_ref().is_some_and(|l| !l.is_empty()))
        .then(|| NetworkPolicy {
            internet: a.internet.unwrap_or(false),
            allow: a.allow.unwrap_or_default(),
            deny: Vec::new(),
        });
        let persistent = a.persistent.unwrap_or(false);
        let secrets = match secret_specs(a.secrets) {
            Ok(s) => s,
            Err(why) => return failed(why),
        };
        let volumes = match a
            .volumes
            .unwrap_or_default()
            .iter()
            .map(|v| v.parse::<forkbox_api::VolumeMount>())
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(v) => v,
            Err(e) => return failed(e.0),
        };
        let req = CreateRequest {
            image: a.image,
            volumes,
            ttl_seconds: Some(a.ttl_seconds.unwrap_or(3600)),
            network,
            ttl_action: persistent.then_some(TtlAction::Hibernate),
            secrets,
            idle: a.idle_seconds.map(forkbox_api::IdlePolicy::after),
            ..Default::default()
        };
        let v = try_tool!(self.c().create(&req).await);
        Session::lock(&self.session.created).insert(v.info.id.clone(), persistent);
        ok(serde_json::json!({
            "sandbox": v.info.id,
            "image": v.info.image,
            "accel": v.info.accel,
            "network": v.network,
            "secrets": v.secrets,
            "expires_unix": v.expires_unix,
            "persistent": persistent,
            "idle": v.idle,
            "volumes": v.info.volumes,
        }))
    }

    #[tool(
        description = "Make a volume: a disk of its own that outlives sandboxes (a workspace to come back to, a package cache). Mount it with sandbox_create's volumes: read-write in one sandbox at a time, or read-only in any number."
    )]
    async fn volume_create(&self, Parameters(a): Parameters<VolumeArgs>) -> ToolResult {
        let req = forkbox_api::VolumeCreateRequest {
            name: a.name,
            size: a.size,
            node: None,
        };
        ok(try_tool!(self.c().create_volume(&req).await))
    }

    #[tool(description = "List volumes, with the sandboxes that have each mounted.")]
    async fn list_volumes(&self) -> ToolResult {
        ok(try_tool!(self.c().list_volumes().await))
    }

    #[tool(
        description = "Remove a volume and everything on it (refused while a sandbox has it mounted)."
    )]
    async fn volume_remove(&self, Parameters(a): Parameters<VolumeNameArgs>) -> ToolResult {
        try_tool!(self.c().remove_volume(&a.name).await);
        text(format!("removed volume {}", a.name))
    }

    #[tool(
        description = "Run a shell command in a sandbox and wait for it. Returns exit_code, stdout and stderr (each cut to its last 32 KiB, with a note when cut). Reports progress every 2 s when the call asks for it."
    )]
    async fn exec(
        &self,
        meta: rmcp::model::RequestMetaObject,
        peer: rmcp::Peer<rmcp::RoleServer>,
        Parameters(a): Parameters<ExecArgs>,
    ) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let progress = Progress::of(&meta, peer);
        let (code, timed_out, out, err) = try_tool!(
            self.run(&a.sandbox, a.command, a.cwd, a.timeout_seconds, progress)
                .await
        );
        ok(serde_json::json!({
            "exit_code": code,
            "timed_out": timed_out,
            "stdout": out.text("stdout"),
            "stderr": err.text("stderr"),
        }))
    }

    #[tool(
        description = "Run a code cell in a sandbox, keeping state between calls (variables, imports, definitions) as a notebook does: python (a Jupyter kernel), javascript (Node) or bash. Returns stdout and stderr (each cut to its last 32 KiB), results (the last expression's value and anything displayed, as text, plus each plot as an image), and an error's name, value and traceback. The first call in a sandbox starts its code server; use the image code-interpreter (numpy, pandas, matplotlib) or one with ipykernel."
    )]
    async fn run_code(&self, Parameters(a): Parameters<RunCodeArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let req = forkbox_api::RunCodeRequest {
            code: a.code,
            language: a.language,
            context_id: a.context,
            timeout_secs: a.timeout_seconds,
            ..Default::default()
        };
        let events = try_tool!(self.c().run_code(&a.sandbox, &req).await);
        let cell = try_tool!(cell::collect(events).await);
        Ok(cell.into_result())
    }

    #[tool(
        description = "Make a new code context in a sandbox: a language and working directory with state of its own, for run_code's `context`."
    )]
    async fn code_context(&self, Parameters(a): Parameters<CodeContextArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let req = forkbox_api::CodeContextRequest {
            language: a.language,
            cwd: a.cwd,
        };
        let c = try_tool!(self.c().create_code_context(&a.sandbox, &req).await);
        ok(serde_json::json!({ "context": c.id, "language": c.language, "cwd": c.cwd }))
    }

    #[tool(description = "Read a text file in a sandbox (at most 64 MiB).")]
    async fn read_file(&self, Parameters(a): Parameters<PathArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let bytes = try_tool!(self.c().read_file(&a.sandbox, &a.path).await);
        text(String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tool(
        description = "Write a text file in a sandbox, replacing it (parent directories are made)."
    )]
    async fn write_file(&self, Parameters(a): Parameters<WriteArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let w = try_tool!(
            self.c()
                .write_file(&a.sandbox, &a.path, a.content.into_bytes(), 0o644)
                .await
        );
        ok(w)
    }

    #[tool(
        description = "Edit a file in a sandbox: replace the exact text `old` with `new`. Refused when `old` does not occur exactly once."
    )]
    async fn edit_file(&self, Parameters(a): Parameters<EditArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let bytes = try_tool!(self.c().read_file(&a.sandbox, &a.path).await);
        let body = String::from_utf8_lossy(&bytes).into_owned();
        match body.matches(&a.old).count() {
            1 => {}
            0 => return failed(format!("the text to replace does not occur in {}", a.path)),
            n => {
                return failed(format!(
                "the text to replace occurs {n} times in {}; give more context so it occurs once",
                a.path
            ))
            }
        }
        let edited = body.replacen(&a.old, &a.new, 1);
        try_tool!(
            self.c()
                .write_file(&a.sandbox, &a.path, edited.into_bytes(), 0o644)
                .await
        );
        text(format!("edited {}", a.path))
    }

    #[tool(description = "List a directory in a sandbox (one level): names, kinds and sizes.")]
    async fn list_dir(&self, Parameters(a): Parameters<PathArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        ok(try_tool!(self.c().list_dir(&a.sandbox, &a.path).await))
    }

    #[tool(
        description = "Copy a host directory (under a root the user allowed) into a sandbox as one compressed archive."
    )]
    async fn upload(&self, Parameters(a): Parameters<UploadArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let dir = try_tool!(self.session.host_path(&a.host_dir, true));
        let sent = try_tool!(self.c().upload_dir(&a.sandbox, &dir, &a.guest_dir).await);
        text(format!(
            "uploaded {} to {}:{} ({} bytes compressed)",
            dir.display(),
            a.sandbox,
            a.guest_dir,
            sent.bytes
        ))
    }

    #[tool(
        description = "Copy a file or directory out of a sandbox into a new host directory (under a root the user allowed). Links and special files are refused."
    )]
    async fn download(&self, Parameters(a): Parameters<DownloadArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let dest = try_tool!(self.session.host_path(&a.host_dir, false));
        let files = try_tool!(
            self.c()
                .download_into(&a.sandbox, &a.guest_path, &dest)
                .await
        );
        text(format!("downloaded {files} file(s) to {}", dest.display()))
    }

    #[tool(
        description = "The git diff of a work tree in a sandbox (default /work), untracked files listed."
    )]
    async fn git_diff(&self, Parameters(a): Parameters<DiffArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let cwd = a.cwd.unwrap_or_else(|| "/work".into());
        let (code, _, out, err) = try_tool!(
            self.run(
                &a.sandbox,
                "git diff && git ls-files --others --exclude-standard | sed 's/^/untracked: /'"
                    .into(),
                Some(cwd),
                Some(120),
                None
            )
            .await
        );
        if code != 0 {
            return failed(format!("git diff failed ({code}): {}", err.text("stderr")));
        }
        text(out.text("the diff"))
    }

    #[tool(
        description = "Save a sandbox (files, memory, running processes) as a snapshot; it keeps running."
    )]
    async fn snapshot(&self, Parameters(a): Parameters<SnapshotArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let m = try_tool!(
            self.c()
                .snapshot(
                    &a.sandbox,
                    &SnapshotRequest {
                        name: a.name,
                        stay_paused: false
                    }
                )
                .await
        );
        ok(serde_json::json!({ "snapshot": m.name, "pause_ms": m.pause_ms }))
    }

    #[tool(
        description = "Fork a sandbox of this session (saved first) or a snapshot into 1-20 running copies, copy-on-write: files, memory and processes. The copies belong to this session."
    )]
    async fn fork(&self, Parameters(a): Parameters<ForkArgs>) -> ToolResult {
        // A sandbox must be the session's own; a snapshot may be any (a prepared baseline).
        if is_sandbox_id(&a.source) {
            try_tool!(self.session.check_visible(&a.source));
        }
        let req = ForkRequest {
            count: a.count,
            ttl_seconds: Some(a.ttl_seconds.unwrap_or(3600)),
            ..Default::default()
        };
        let r = try_tool!(self.c().fork(&a.source, &req).await);
        let ids: Vec<String> = r.sandboxes.iter().map(|v| v.info.id.clone()).collect();
        {
            let mut created = Session::lock(&self.session.created);
            for id in &ids {
                created.insert(id.clone(), false);
            }
        }
        ok(serde_json::json!({
            "sandboxes": ids,
            "snapshot": r.snapshot,
            "failed": r.failed,
            "duration_ms": r.duration_ms,
        }))
    }

    #[tool(
        description = "Hibernate a sandbox: save it to disk and stop its VM. resume brings it back with its processes."
    )]
    async fn hibernate(&self, Parameters(a): Parameters<SandboxArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let v = try_tool!(self.c().hibernate(&a.sandbox).await);
        ok(serde_json::json!({ "sandbox": v.info.id, "state": v.state }))
    }

    #[tool(description = "Resume a hibernated sandbox.")]
    async fn resume(&self, Parameters(a): Parameters<SandboxArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let v = try_tool!(self.c().resume(&a.sandbox).await);
        ok(serde_json::json!({ "sandbox": v.info.id, "state": v.state }))
    }

    #[tool(
        description = "Make a port a server in the sandbox listens on reachable from the host: returns a URL (http://127.0.0.1:PORT/) whose connections reach the sandbox's 127.0.0.1:guest_port (HTTP, WebSocket or TCP), until the sandbox goes."
    )]
    async fn port_forward(&self, Parameters(a): Parameters<PortArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let req = forkbox_api::PortRequest {
            guest_port: a.guest_port,
            host_port: None,
            address: None,
        };
        let v = try_tool!(self.c().forward_port(&a.sandbox, &req).await);
        ok(
            serde_json::json!({ "url": v.url, "host_port": v.host_port, "guest_port": v.guest_port }),
        )
    }

    #[tool(description = "Delete a sandbox and its VM.")]
    async fn destroy(&self, Parameters(a): Parameters<SandboxArgs>) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        try_tool!(self.c().delete(&a.sandbox).await);
        Session::lock(&self.session.created).remove(&a.sandbox);
        text(format!("destroyed {}", a.sandbox))
    }

    #[tool(
        description = "List the sandboxes of this session (or all, if the server was started with --all)."
    )]
    async fn list_sandboxes(&self) -> ToolResult {
        let all = try_tool!(self.c().list(None, None).await);
        let created = Session::lock(&self.session.created).clone();
        let rows: Vec<serde_json::Value> = all
            .into_iter()
            .filter(|v| self.session.options.all || created.contains_key(&v.info.id))
            .map(|v| {
                serde_json::json!({
                    "sandbox": v.info.id,
                    "image": v.info.image,
                    "state": v.state,
                    "expires_unix": v.expires_unix,
                    "persistent": created.get(&v.info.id).copied().unwrap_or(false),
                })
            })
            .collect();
        ok(rows)
    }

    #[tool(
        description = "Run a test suite in a sandbox and read its results by test name (pytest -rA, JUnit XML, go test -json, cargo, TAP). With `baseline` (a name given to an earlier run's save_as), also says which tests were lost (passed there, not now) and fixed."
    )]
    async fn run_tests(
        &self,
        meta: rmcp::model::RequestMetaObject,
        peer: rmcp::Peer<rmcp::RoleServer>,
        Parameters(a): Parameters<RunTestsArgs>,
    ) -> ToolResult {
        try_tool!(self.session.check_visible(&a.sandbox));
        let progress = Progress::of(&meta, peer);
        let command = a
            .command
            .unwrap_or_else(|| "python3 -m pytest -q -rA -p no:cacheprovider".into());
        let (code, _, out, err) = try_tool!(
            self.run(
                &a.sandbox,
                command,
                Some(a.cwd.unwrap_or_else(|| "/work".into())),
                Some(a.timeout_seconds.unwrap_or(1800)),
                progress
            )
            .await
        );
        let output = format!("{}\n{}", out.text("stdout"), err.text("stderr"));
        let results = match reports::parse(Format::Auto, &output) {
            Ok(r) => r.results,
            Err(e) => {
                return failed(format!(
                    "{e}; exit code {code}; the output ends with:\n{}",
                    output
                        .lines()
                        .rev()
                        .take(20)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n")
                ))
            }
        };
        let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
        for o in results.values() {
            *counts.entry(outcome_name(*o)).or_default() += 1;
        }
        let named = |want: Outcome| -> Vec<String> {
            results
                .iter()
                .filter(|(_, o)| **o == want)
                .map(|(t, _)| t.clone())
                .take(200)
                .collect()
        };
        let mut summary = TestSummary {
            exit_code: code,
            counts,
            failed: named(Outcome::Failed),
            errors: named(Outcome::Error),
            lost: None,
            fixed: None,
            note: None,
        };
        if let Some(name) = &a.baseline {
            let reports = Session::lock(&self.session.reports);
            let Some(before) = reports.get(name) else {
                return failed(format!(
                    "no saved report {name:?}; run run_tests with save_as first"
                ));
            };
            let passes = |r: &Results, t: &str| r.get(t) == Some(&Outcome::Passed);
            summary.lost = Some(
                before
                    .keys()
                    .filter(|t| passes(before, t) && !passes(&results, t))
                    .cloned()
                    .collect(),
            );
            summary.fixed = Some(
                results
                    .keys()
                    .filter(|t| passes(&results, t) && !passes(before, t))
                    .cloned()
                    .collect(),
            );
        }
        if let Some(name) = a.save_as {
            Session::lock(&self.session.reports).insert(name.clone(), results);
            summary.note = Some(format!("saved as {name:?}"));
        }
        ok(summary)
    }
}

/// `sb-` and ten hex digits: a sandbox's id (a snapshot of one adds `-suffix`).
fn is_sandbox_id(s: &str) -> bool {
    s.strip_prefix("sb-")
        .is_some_and(|h| h.len() == 10 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Passed => "passed",
        Outcome::Failed => "failed",
        Outcome::Error => "error",
        Outcome::Skipped => "skipped",
        Outcome::Xfailed => "xfailed",
        Outcome::Xpassed => "xpassed",
    }
}

/// The prompt for a migration by comparison.
pub const PORT_PROMPT: &str = "port";

fn port_prompt_text(from: &str, to: &str, code: &str, test: &str) -> String {
    format!(
        "Port the project in {code} from image {from} to image {to}, with forkbox's tools, \
         accepting a port only if no test that passed before fails now.\n\
         1. sandbox_create with image {from}; upload {code} to /work; run_tests (command: {test}) \
         with save_as \"before\". These are the tests that must keep passing.\n\
         2. sandbox_create with image {to}; upload {code} to /work; exec `git init -q && git add -A \
         && git -c user.name=agent -c user.email=agent@localhost commit -qm before` in /work; \
         snapshot it.\n\
         3. fork the snapshot into up to 3 copies and try a different port in each (edit_file, \
         write_file, exec).\n\
         4. In each copy, run_tests (command: {test}) with baseline \"before\". Reject a copy \
         whose `lost` list is not empty.\n\
         5. Of the copies that lost nothing, prefer the smallest git_diff; report it and destroy \
         the others."
    )
}

#[tool_handler]
impl ServerHandler for ForkboxMcp {
    async fn list_resources(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, rmcp::ErrorData> {
        let mut items = vec![
            rmcp::model::Resource::new("forkbox://sandboxes", "sandboxes")
                .with_description("The sandboxes this session can use, as JSON")
                .with_mime_type("application/json"),
        ];
        let created = Session::lock(&self.session.created).clone();
        for id in created.keys() {
            items.push(
                rmcp::model::Resource::new(format!("forkbox://sandboxes/{id}"), id.clone())
                    .with_description("One sandbox: image, accelerator, state, network, TTL")
                    .with_mime_type("application/json"),
            );
        }
        Ok(rmcp::model::ListResourcesResult::with_all_items(items))
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, rmcp::ErrorData> {
        let uri = request.uri.clone();
        let not_found = |why: String| rmcp::ErrorData::resource_not_found(why, None);
        let body = if uri == "forkbox://sandboxes" {
            let all = self
                .c()
                .list(None, None)
                .await
                .map_err(|e| not_found(e.to_string()))?;
            let created = Session::lock(&self.session.created).clone();
            let mine: Vec<_> = all
                .into_iter()
                .filter(|v| self.session.options.all || created.contains_key(&v.info.id))
                .collect();
            serde_json::to_string_pretty(&mine).unwrap_or_default()
        } else if let Some(id) = uri.strip_prefix("forkbox://sandboxes/") {
            self.session.check_visible(id).map_err(not_found)?;
            let v = self
                .c()
                .get(id)
                .await
                .map_err(|e| not_found(e.to_string()))?;
            serde_json::to_string_pretty(&v).unwrap_or_default()
        } else {
            return Err(not_found(format!("no resource {uri}")));
        };
        Ok(
            rmcp::model::ReadResourceResult::new(vec![rmcp::model::ResourceContents::text(
                body, uri,
            )])
            .into(),
        )
    }

    async fn list_prompts(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, rmcp::ErrorData> {
        let arg = |n: &str, d: &str, required: bool| {
            let mut a = rmcp::model::PromptArgument::new(n).with_description(d);
            a.required = Some(required);
            a
        };
        Ok(rmcp::model::ListPromptsResult::with_all_items(vec![
            rmcp::model::Prompt::new(
                PORT_PROMPT,
                Some("Port a project from one image to another, accepting only ports that lose no test"),
                Some(vec![
                    arg("from", "the old toolchain's image (e.g. python-bullseye)", true),
                    arg("to", "the new toolchain's image (e.g. python-trixie)", true),
                    arg("code", "the project's host directory (under an allowed root)", true),
                    arg("test", "the test command (default: python3 -m pytest -q -rA)", false),
                ]),
            ),
        ]))
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, rmcp::ErrorData> {
        if request.name != PORT_PROMPT {
            return Err(rmcp::ErrorData::invalid_params(
                format!("no prompt {:?}; there is {PORT_PROMPT:?}", request.name),
                None,
            ));
        }
        let args = request.arguments.clone().unwrap_or_default();
        let get = |k: &str| args.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let (Some(from), Some(to), Some(code)) = (get("from"), get("to"), get("code")) else {
            return Err(rmcp::ErrorData::invalid_params(
                "the port prompt needs from, to and code",
                None,
            ));
        };
        let test = get("test").unwrap_or_else(|| "python3 -m pytest -q -rA".into());
        Ok(
            rmcp::model::GetPromptResult::new(vec![rmcp::model::PromptMessage::new_text(
                rmcp::model::Role::User,
                port_prompt_text(&from, &to, &code, &test),
            )])
            .with_description("Port by comparison with forkbox")
            .into(),
        )
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_prompts()
                .build(),
        )
        .with_server_info(Implementation::new("forkbox", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "forkbox runs untrusted installs, builds and tests in disposable microVM sandboxes. \
                 Create a sandbox, upload or write the code, exec commands, run_tests; snapshot \
                 and fork to try several changes side by side; accept a change only if run_tests \
                 against the baseline reports no lost test. Sandboxes have no network unless \
                 created with internet or allow.",
        )
    }
}

/// Serves one session over stdin/stdout until the client closes it, then deletes the
/// session's non-persistent sandboxes.
pub async fn serve_stdio(client: Client, options: Options) -> Result<(), String> {
    use rmcp::ServiceExt;
    let server = ForkboxMcp::new(client, options);
    let running = server
        .clone()
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("the MCP session did not start: {e}"))?;
    let ended = running.waiting().await;
    server.end().await;
    ended
        .map(drop)
        .map_err(|e| format!("the MCP session failed: {e}"))
}

/// The Streamable HTTP service for the daemon's `/mcp`: one [`ForkboxMcp`] per MCP session,
/// each talking to the daemon on `socket`.
pub fn http_service(
    socket: PathBuf,
    options: Options,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    ForkboxMcp,
    rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    use rmcp::transport::streamable_http_server::{
        session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
    };
    StreamableHttpService::new(
        move || {
            let client = Client::new(forkbox_client::Endpoint::Unix(socket.clone()))
                .map_err(std::io::Error::other)?;
            Ok(ForkboxMcp::new(client, options.clone()))
        },
        Arc::new(LocalSessionManager::default()),
        // The daemon's own gate checks `Host` on its TCP listener before /mcp is reached (IP
        // literals, localhost, FORKBOX_ALLOWED_HOSTS: the same rule as every route), so a node
        // reached at its address, as in a cluster, is not refused here by a narrower list.
        StreamableHttpServerConfig::default().disable_allowed_hosts(),
    )
}
