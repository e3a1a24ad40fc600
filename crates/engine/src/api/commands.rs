//! Commands that outlive their request (started, polled, attached to, signalled) and the
//! plain exec that waits: a sandbox keeps the output of its most recent ones.

use std::sync::Arc;

use forkbox_protocol::ExitStatus;

use super::*;

impl Engine {
    /// Runs a command and waits for it; output cut at [`OUTPUT_CAP`] per stream.
    pub(super) async fn exec(
        &self,
        id: &str,
        request: ExecRequest,
    ) -> Result<ExecResult, EngineError> {
        if request.stdin {
            return Err(EngineError::BadRequest(
                "`stdin` needs a started command (POST …/commands, or exec with stream=true), \
                 whose standard input POST …/commands/{cid}/stdin then feeds"
                    .into(),
            ));
        }
        let (sb, _) = self.get(id).await?;
        let spec = exec_spec(request)?;
        let started = std::time::Instant::now();
        let out = match sb.run(spec).await {
            Ok(out) => out,
            Err(e) => match crate::commands::cannot_start(&e) {
                Some((exit_code, message)) => {
                    return Ok(ExecResult {
                        exit_code,
                        signal: None,
                        timed_out: false,
                        stdout: String::new(),
                        stderr: format!("forkbox: {message}\n"),
                        stdout_truncated: false,
                        stderr_truncated: false,
                        duration_ms: 0,
                    })
                }
                None => return Err(e.into()),
            },
        };
        self.metrics
            .exec_seconds
            .observe(started.elapsed().as_secs_f64());
        let (stdout, stdout_truncated) = cut(out.stdout);
        let (stderr, stderr_truncated) = cut(out.stderr);
        let status = out.status.unwrap_or(ExitStatus::Code(-1));
        Ok(ExecResult {
            exit_code: status.as_shell_code(),
            signal: status.signal(),
            timed_out: out.timed_out,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            duration_ms: out.duration_ms,
        })
    }

    /// Starts a command that outlives this call; read it with [`Engine::command`].
    pub(super) async fn start_command(
        &self,
        id: &str,
        request: ExecRequest,
    ) -> Result<String, EngineError> {
        self.start_command_as(id, request, Keeps::Awake).await
    }

    /// [`Engine::start_command`] for a command that serves the sandbox's callers (the code
    /// server): while it runs, waiting for them, the sandbox may sleep when nothing uses it.
    pub(super) async fn start_service(
        &self,
        id: &str,
        request: ExecRequest,
    ) -> Result<String, EngineError> {
        self.start_command_as(id, request, Keeps::Asleep).await
    }

    async fn start_command_as(
        &self,
        id: &str,
        request: ExecRequest,
        keeps: Keeps,
    ) -> Result<String, EngineError> {
        let spec = exec_spec(request)?;
        self.awake(id).await?;
        let map = self.sandboxes.read().await;
        let e = match map.get(id) {
            Some(e) => e,
            None if self.sleepers.read().await.contains_key(id) => {
                return Err(EngineError::Hibernated(id.to_string()))
            }
            None => return Err(EngineError::NoSuchSandbox(id.to_string())),
        };
        let reads_stdin = spec.stdin;
        let ex = e.sandbox.exec(spec).await?;
        if keeps == Keeps::Asleep {
            e.sandbox.client().quiet(ex.id());
        }
        let log = crate::commands::CommandLog::start(ex, reads_stdin);
        if keeps == Keeps::Asleep {
            log.set_quiet();
        }
        let mut cmds = e.commands.lock().unwrap_or_else(|p| p.into_inner());
        let n = e
            .next_command
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let cid = format!("cmd-{n}");
        cmds.insert(cid.clone(), log);
        // Keep the output of the most recent finished commands only, so a long-lived sandbox
        // does not grow the daemon without bound.
        if cmds.len() > KEEP_COMMANDS {
            let mut finished: Vec<(u64, String)> = cmds
                .iter()
                .filter(|(_, l)| l.finished())
                .filter_map(|(k, _)| {
                    k.strip_prefix("cmd-")
                        .and_then(|n| n.parse().ok())
                        .map(|n| (n, k.clone()))
                })
                .collect();
            finished.sort();
            let excess = cmds.len() - KEEP_COMMANDS;
            for (_, k) in finished.into_iter().take(excess) {
                cmds.remove(&k);
            }
        }
        Ok(cid)
    }

    /// A command started with [`Engine::start_command`].
    pub(super) async fn command(
        &self,
        id: &str,
        command_id: &str,
    ) -> Result<Arc<crate::commands::CommandLog>, EngineError> {
        self.awake(id).await?;
        let map = self.sandboxes.read().await;
        let e = map
            .get(id)
            .ok_or_else(|| EngineError::NoSuchSandbox(id.to_string()))?;
        let cmds = e.commands.lock().unwrap_or_else(|p| p.into_inner());
        cmds.get(command_id)
            .cloned()
            .ok_or_else(|| EngineError::NoSuchCommand(id.to_string(), command_id.to_string()))
    }

    /// Passes `chunks` to a started command's standard input as they come, then closes it
    /// when `close`.
    pub(super) async fn write_stdin(
        &self,
        id: &str,
        command_id: &str,
        mut chunks: tokio::sync::mpsc::Receiver<Vec<u8>>,
        close: bool,
    ) -> Result<StdinWritten, EngineError> {
        let log = self.command(id, command_id).await?;
        if !log.reads_stdin() {
            return Err(EngineError::BadRequest(format!(
                "command {command_id} was started without `stdin: true`; its standard input is \
                 /dev/null"
            )));
        }
        let mut bytes = 0u64;
        while let Some(c) = chunks.recv().await {
            bytes += c.len() as u64;
            log.stdin(Some(c)).await;
        }
        if close {
            log.stdin(None).await;
        }
        Ok(StdinWritten {
            bytes,
            closed: close,
        })
    }

    /// A started command's output past chunk `from`, and its exit once it ended.
    pub(super) async fn poll(
        &self,
        id: &str,
        command_id: String,
        from: usize,
    ) -> Result<CommandPoll, EngineError> {
        use base64::Engine as _;
        let snap = self.command(id, &command_id).await?.snapshot(from);
        let b64 = base64::engine::general_purpose::STANDARD;
        Ok(CommandPoll {
            command_id,
            chunks: snap
                .chunks
                .iter()
                .map(|c| PolledChunk {
                    stream: c.stream,
                    data_b64: b64.encode(&c.data),
                })
                .collect(),
            next: snap.next,
            dropped_bytes: snap.dropped_bytes,
            exit: snap.exit,
        })
    }
}

/// Output as text, cut at [`OUTPUT_CAP`]; whether it was cut.
pub(super) fn cut(mut v: Vec<u8>) -> (String, bool) {
    let truncated = v.len() > OUTPUT_CAP;
    v.truncate(OUTPUT_CAP);
    (String::from_utf8_lossy(&v).into_owned(), truncated)
}

/// Whether a running command keeps its sandbox awake (a sandbox with an idle policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keeps {
    Awake,
    Asleep,
}
