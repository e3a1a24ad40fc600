//! Code cells (`run_code`): forkbox's code server in the guest ([`forkbox_api::code::SERVER`]),
//! started by the first call that finds nothing on its port, and each cell's events relayed as
//! they come. The server is reached as a preview is, over the sandbox's tunnels
//! ([`Engine::connect_port`]); nothing but the API's types crosses to the caller.

use std::time::Duration;

use forkbox_api::code::{SERVER, SERVER_PATH, SERVER_PORT};
use forkbox_api::{CodeContext, CodeContextRequest, CodeEvent, CodeResult, RunCodeRequest};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use tokio::sync::mpsc;

use super::{Deleted, Engine, EngineError, ExecRequest, GuestPath};

/// How long a new server may take to load its data stack and start its first kernel (TCG).
const START_SECS: u64 = 240;
/// The longest line of events the relay takes from the guest (a result's PNG, base64); a
/// longer one ends the cell with an error instead of costing the host.
const MAX_LINE: usize = 32 << 20;
/// A reply of the server's other than a cell's events.
const MAX_REPLY: usize = 1 << 20;

/// A request to the guest's server that found nobody there (the server is not started, or
/// died) or broke off.
#[derive(Debug)]
struct Unreached(String);

impl Engine {
    /// Runs one cell; its events as they come, `end` last (after an `error` named
    /// `ForkboxRelayError` if the guest broke off).
    pub(super) async fn run_code(
        &self,
        id: &str,
        request: RunCodeRequest,
    ) -> Result<mpsc::Receiver<CodeEvent>, EngineError> {
        request.check()?;
        let body = serde_json::json!({
            "code": request.code,
            "language": request.language,
            "context_id": request.context_id,
            "env_vars": request.env,
            "timeout": request.timeout_secs,
        });
        let answer = self.code_call(id, "POST", "/execute", Some(body)).await?;
        let answer = ok_or_error(id, answer).await?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(relay(answer.into_body(), tx));
        Ok(rx)
    }

    pub(super) async fn code_contexts(&self, id: &str) -> Result<Vec<CodeContext>, EngineError> {
        let answer = self.code_call(id, "GET", "/contexts", None).await?;
        json_of(id, answer).await
    }

    pub(super) async fn create_code_context(
        &self,
        id: &str,
        request: CodeContextRequest,
    ) -> Result<CodeContext, EngineError> {
        request.check()?;
        let body = serde_json::to_value(&request)
            .map_err(|e| EngineError::Internal(format!("a context request: {e}")))?;
        let answer = self.code_call(id, "POST", "/contexts", Some(body)).await?;
        json_of(id, answer).await
    }

    pub(super) async fn restart_code_context(
        &self,
        id: &str,
        context_id: &str,
    ) -> Result<CodeContext, EngineError> {
        let path = format!("/contexts/{}/restart", context_segment(context_id)?);
        let answer = self.code_call(id, "POST", &path, None).await?;
        json_of(id, answer).await
    }

    pub(super) async fn delete_code_context(
        &self,
        id: &str,
        context_id: &str,
    ) -> Result<Deleted, EngineError> {
        let path = format!("/contexts/{}", context_segment(context_id)?);
        let answer = self.code_call(id, "DELETE", &path, None).await?;
        ok_or_error(id, answer).await?;
        Ok(Deleted {
            deleted: context_id.to_string(),
        })
    }

    /// Sends one request to sandbox `id`'s server, starting it first when nobody answers.
    async fn code_call(
        &self,
        id: &str,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<hyper::Response<Incoming>, EngineError> {
        match self.code_request(id, method, path, body.as_ref()).await? {
            Ok(answer) => return Ok(answer),
            Err(Unreached(why)) => tracing::debug!("{id}: the code server: {why}"),
        }
        self.start_code_server(id).await?;
        self.code_request(id, method, path, body.as_ref())
            .await?
            .map_err(|Unreached(why)| {
                EngineError::Conflict(format!(
                    "sandbox {id}'s code server started but does not answer: {why}"
                ))
            })
    }

    /// One HTTP/1.1 request over a new connection to the guest's server.
    async fn code_request(
        &self,
        id: &str,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Result<hyper::Response<Incoming>, Unreached>, EngineError> {
        let stream = self.connect_port(id, SERVER_PORT).await?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = match hyper::client::conn::http1::handshake(io).await {
            Ok(h) => h,
            Err(e) => return Ok(Err(Unreached(e.to_string()))),
        };
        tokio::spawn(conn);
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(hyper::body::Bytes::from(bytes)))
            .map_err(|e| EngineError::Internal(format!("a code server request: {e}")))?;
        Ok(sender
            .send_request(req)
            .await
            .map_err(|e| Unreached(e.to_string())))
    }

    /// Writes the server into sandbox `id` and starts it (once, however many calls find it
    /// missing); returns when it answers, or says why it cannot run.
    async fn start_code_server(&self, id: &str) -> Result<(), EngineError> {
        self.awake(id).await?;
        let gate = {
            let map = self.sandboxes.read().await;
            let entry = map
                .get(id)
                .ok_or_else(|| EngineError::NoSuchSandbox(id.to_string()))?;
            entry.code_start.clone()
        };
        let _one = gate.lock().await;
        if let Ok(Ok(_)) = self.code_request(id, "GET", "/health", None).await {
            return Ok(());
        }
        let path = GuestPath::parse(SERVER_PATH)?;
        self.write_file(id, &path, SERVER.as_bytes(), 0o644).await?;
        // It waits for cells: a sandbox whose idle time passes sleeps with it, and the next
        // cell wakes both.
        let cid = self
            .start_service(
                id,
                ExecRequest {
                    argv: Some(vec!["python3".into(), SERVER_PATH.into()]),
                    ..Default::default()
                },
            )
            .await?;
        tracing::info!("{id}: code server started ({cid})");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(START_SECS);
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if let Ok(Ok(_)) = self.code_request(id, "GET", "/health", None).await {
                return Ok(());
            }
            let log = self.command(id, &cid).await?;
            let snap = log.snapshot(0);
            if let Some(exit) = snap.exit {
                let said: Vec<u8> = snap.chunks.iter().flat_map(|c| c.data.clone()).collect();
                return Err(cannot_run(id, exit.exit_code, &said));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(EngineError::Conflict(format!(
                    "sandbox {id}'s code server did not answer within {START_SECS} s"
                )));
            }
        }
    }
}

/// Why a server that exited cannot run: most often an image without a Jupyter kernel.
fn cannot_run(id: &str, code: i32, said: &[u8]) -> EngineError {
    let said = String::from_utf8_lossy(said);
    let last = said.trim().lines().last().unwrap_or("it said nothing");
    let hint = if said.contains("No module named 'jupyter_client'")
        || said.contains("No module named")
        || code == 127
    {
        " (the image needs python3 with ipykernel and jupyter_client: the bundled \
         `code-interpreter` image has them, with numpy, pandas and matplotlib)"
    } else {
        ""
    };
    EngineError::Conflict(format!(
        "sandbox {id} cannot run code: its code server exited with {code}{hint}: {last}"
    ))
}

/// A context id as one path segment (the server names them in hex).
fn context_segment(context_id: &str) -> Result<&str, EngineError> {
    let ok = !context_id.is_empty()
        && context_id.len() <= 64
        && context_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(context_id)
    } else {
        Err(EngineError::BadRequest(format!(
            "{context_id:?} is not a context id"
        )))
    }
}

/// The answer when it is a success; otherwise the server's words as the error they are.
async fn ok_or_error(
    id: &str,
    answer: hyper::Response<Incoming>,
) -> Result<hyper::Response<Incoming>, EngineError> {
    let status = answer.status();
    if status.is_success() {
        return Ok(answer);
    }
    let body = read_limited(answer.into_body(), MAX_REPLY).await?;
    let said = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
    Err(match status.as_u16() {
        404 => EngineError::NotFound(format!("sandbox {id}: {said}")),
        400 => EngineError::BadRequest(said),
        _ => EngineError::Conflict(format!("sandbox {id}'s code server: {said}")),
    })
}

async fn json_of<T: serde::de::DeserializeOwned>(
    id: &str,
    answer: hyper::Response<Incoming>,
) -> Result<T, EngineError> {
    let answer = ok_or_error(id, answer).await?;
    let body = read_limited(answer.into_body(), MAX_REPLY).await?;
    serde_json::from_slice(&body).map_err(|e| {
        EngineError::Conflict(format!("sandbox {id}'s code server answered oddly: {e}"))
    })
}

async fn read_limited(body: Incoming, limit: usize) -> Result<Vec<u8>, EngineError> {
    let limited = http_body_util::Limited::new(body, limit);
    limited
        .collect()
        .await
        .map(|c| c.to_bytes().to_vec())
        .map_err(|e| EngineError::Conflict(format!("the code server's answer: {e}")))
}

/// Reads the server's NDJSON lines and sends each as an event; a line past [`MAX_LINE`] or
/// a guest that breaks off ends the cell with an error event.
async fn relay<B>(mut body: B, tx: mpsc::Sender<CodeEvent>)
where
    B: hyper::body::Body<Data = hyper::body::Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut pending: Vec<u8> = Vec::new();
    let mut count = None;
    // A cell the relay cannot finish ends all the same: its error, then `end`.
    let fail = |why: String| {
        let tx = tx.clone();
        async move {
            let error = CodeEvent::Error {
                name: "ForkboxRelayError".into(),
                value: why,
                traceback: String::new(),
            };
            if tx.send(error).await.is_ok() {
                let _ = tx
                    .send(CodeEvent::End {
                        execution_count: None,
                    })
                    .await;
            }
        }
    };
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Err(e)) => {
                fail(format!("the code server broke off: {e}")).await;
                return;
            }
            Some(Ok(f)) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        // Only what this frame brought can end a line (a large result comes in many frames:
        // each byte is looked at once), and the lines read are dropped from the front once.
        let mut from = pending.len();
        pending.extend_from_slice(&data);
        let mut start = 0;
        while let Some(at) = pending[from..].iter().position(|b| *b == b'\n') {
            let end = from + at;
            let event = event_of(&pending[start..end], &mut count);
            (start, from) = (end + 1, end + 1);
            let Some(event) = event else {
                continue;
            };
            let last = matches!(event, CodeEvent::End { .. });
            if tx.send(event).await.is_err() || last {
                return;
            }
        }
        pending.drain(..start);
        if pending.len() > MAX_LINE {
            let why = format!("a result of over {MAX_LINE} bytes was not relayed");
            fail(why).await;
            return;
        }
    }
    let why =
        "the code server ended the cell without finishing it (it stopped, or the sandbox did)";
    fail(why.into()).await;
}

/// One line of the server's (E2B's code interpreter's wire format) as forkbox's event, if it
/// is one (the cell's count is kept in `count` for its `end`).
fn event_of(line: &[u8], count: &mut Option<u64>) -> Option<CodeEvent> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
        return None;
    };
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    match v["type"].as_str().unwrap_or_default() {
        "stdout" => Some(CodeEvent::Stdout { text: text("text") }),
        "stderr" => Some(CodeEvent::Stderr { text: text("text") }),
        "error" => Some(CodeEvent::Error {
            name: text("name"),
            value: text("value"),
            traceback: text("traceback"),
        }),
        "result" => Some(CodeEvent::Result(
            serde_json::from_value::<CodeResult>(v).unwrap_or_default(),
        )),
        "number_of_executions" => {
            *count = v["execution_count"].as_u64();
            None
        }
        "end_of_execution" => Some(CodeEvent::End {
            execution_count: *count,
        }),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_lines_become_events() {
        let mut count = None;
        let lines: [&[u8]; 4] = [
            br#"{"type":"stdout","text":"hi\n","timestamp":"t"}"#,
            br#"{"type":"number_of_executions","execution_count":4}"#,
            br#"{"type":"result","is_main_result":true,"text":"2","type":"result"}"#,
            br#"{"type":"end_of_execution"}"#,
        ];
        let got: Vec<_> = lines.iter().map(|l| event_of(l, &mut count)).collect();
        assert!(matches!(&got[0], Some(CodeEvent::Stdout { text }) if text == "hi\n"));
        assert!(got[1].is_none());
        assert!(
            matches!(&got[2], Some(CodeEvent::Result(r)) if r.is_main_result && r.text.as_deref() == Some("2"))
        );
        assert_eq!(
            got[3],
            Some(CodeEvent::End {
                execution_count: Some(4)
            })
        );
    }

    /// Lines split across frames and several in one frame all arrive, each once, in order;
    /// what follows `end` is not read.
    #[tokio::test]
    async fn the_relay_reads_lines_however_they_are_framed() {
        use hyper::body::Bytes;
        let (mut guest, body) = http_body_util::channel::Channel::<Bytes>::new(8);
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(relay(body, tx));
        for piece in [
            &br#"{"type":"stdout","te"#[..],
            br#"xt":"a\n"}"#,
            b"\n",
            br#"{"type":"stderr","text":"b"}"#,
            b"\n{\"type\":\"number_of_executions\",\"execution_count\":2}\n{\"type\":\"end_of_execution\"}\n{\"type\":\"stdout\",\"text\":\"late\"}\n",
        ] {
            guest.send_data(Bytes::from(piece.to_vec())).await.unwrap();
        }
        let mut got = Vec::new();
        while let Some(e) = rx.recv().await {
            got.push(e);
        }
        task.await.unwrap();
        assert_eq!(
            got,
            vec![
                CodeEvent::Stdout { text: "a\n".into() },
                CodeEvent::Stderr { text: "b".into() },
                CodeEvent::End {
                    execution_count: Some(2)
                },
            ]
        );
    }

    #[test]
    fn a_context_id_is_one_segment() {
        assert!(context_segment("0a1b").is_ok());
        assert!(context_segment("../x").is_err());
        assert!(context_segment("").is_err());
    }
}
