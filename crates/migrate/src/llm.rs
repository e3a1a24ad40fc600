//! forkbox's own LLM porter. It talks to any OpenAI-compatible chat-completions endpoint from
//! the host, gives the model tools that act on the fork (`exec`, `read_file`, `write_file`,
//! `diff`, `run_tests`), and iterates: when the model stops calling tools, the tests are run
//! and, while a test that passed on the old toolchain still does not pass, the model is told
//! which and goes on, until none is lost or the step budget is spent.
//!
//! The endpoint's key stays in this process: it is sent only in the `Authorization` header of
//! requests to the endpoint, never into the guest (tool results go to the model, not the other
//! way round).

use std::time::Duration;

use forkbox_engine::sandbox::Sandbox;
use serde_json::{json, Value};

use crate::decide::Baseline;
use crate::flow::{sh, MigrateConfig, WORKDIR};
use crate::plans::LlmPorter;
use crate::reports::Outcome;

/// Where the model is: an OpenAI-compatible base URL (`.../v1`), a default model and a key.
#[derive(Clone)]
pub struct LlmEndpoint {
    pub url: String,
    pub model: Option<String>,
    pub key: Option<String>,
}

impl std::fmt::Debug for LlmEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmEndpoint")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl LlmEndpoint {
    /// From `FORKBOX_LLM_URL`, `FORKBOX_LLM_MODEL`, `FORKBOX_LLM_API_KEY` (or the usual
    /// `OPENAI_BASE_URL`, `OPENAI_MODEL`, `OPENAI_API_KEY`); None without a URL.
    pub fn from_env() -> Option<LlmEndpoint> {
        let var = |a: &str, b: &str| {
            std::env::var(a)
                .or_else(|_| std::env::var(b))
                .ok()
                .filter(|v| !v.is_empty())
        };
        Some(LlmEndpoint {
            url: var("FORKBOX_LLM_URL", "OPENAI_BASE_URL")?,
            model: var("FORKBOX_LLM_MODEL", "OPENAI_MODEL"),
            key: var("FORKBOX_LLM_API_KEY", "OPENAI_API_KEY"),
        })
    }

    fn completions_url(&self) -> String {
        let u = self.url.trim_end_matches('/');
        if u.ends_with("/chat/completions") {
            u.to_string()
        } else {
            format!("{u}/chat/completions")
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("no model endpoint: set FORKBOX_LLM_URL to an OpenAI-compatible base URL (e.g. https://api.openai.com/v1), and FORKBOX_LLM_MODEL and FORKBOX_LLM_API_KEY")]
    NoEndpoint,
    #[error("no model named: set `model` in the plan's `llm` table or FORKBOX_LLM_MODEL")]
    NoModel,
    #[error("the model endpoint {url} could not be reached: {message}")]
    Unreachable { url: String, message: String },
    #[error("the model did not answer within {0} s (the plan's request_timeout_secs)")]
    Timeout(u64),
    #[error("the model endpoint answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the model's reply could not be read: {0}")]
    Malformed(String),
}

/// What an LLM porter did.
#[derive(Debug, Default)]
pub struct LlmRun {
    /// Model calls made.
    pub steps: u32,
    /// Tokens the endpoint reported used.
    pub tokens: u64,
    /// The conversation (system prompt, requests, replies, tool results).
    pub transcript: Vec<Value>,
    /// How it ended, in words.
    pub outcome: String,
    /// Why it stopped early, if it did.
    pub error: Option<LlmError>,
}

/// Everything one porter needs.
pub struct Task<'a> {
    pub sandbox: &'a Sandbox,
    pub instructions: &'a str,
    pub porter: &'a LlmPorter,
    pub endpoint: Option<&'a LlmEndpoint>,
    pub cfg: &'a MigrateConfig,
    pub baseline: &'a Baseline,
    /// Called with the number of tests seen so far while a test run goes on.
    pub on_tests: &'a (dyn Fn(usize) + Send + Sync),
}

/// Longest text of one tool result sent to the model.
const RESULT_CAP: usize = 16 * 1024;

fn cap(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut start = s.len() - n;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("[... {} bytes cut ...]\n{}", start, &s[start..])
}

fn tools() -> Value {
    let f = |name: &str, desc: &str, props: Value, required: &[&str]| {
        json!({"type": "function", "function": {
            "name": name, "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required}
        }})
    };
    json!([
        f("exec", "Run a shell command in /work (the code's git repository) and get its exit code and output.",
          json!({"command": {"type": "string"}, "timeout_secs": {"type": "integer", "description": "default 600"}}), &["command"]),
        f("read_file", "Read a text file (paths relative to /work).",
          json!({"path": {"type": "string"}}), &["path"]),
        f("write_file", "Replace a file's whole content (paths relative to /work).",
          json!({"path": {"type": "string"}, "content": {"type": "string"}}), &["path", "content"]),
        f("diff", "Show your changes so far as a git diff.", json!({}), &[]),
        f("run_tests", "Run the test suite and compare it with the old toolchain's results.", json!({}), &[]),
    ])
}

fn abs(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{WORKDIR}/{path}")
    }
}

/// Tests that passed before and not now, or why the run could not be read; and a summary.
async fn check(t: &Task<'_>) -> (Option<Vec<String>>, String) {
    let crate::flow::TestRun {
        results,
        exit: code,
        ms: took,
        ..
    } = crate::flow::run_tests(t.sandbox, t.cfg, t.on_tests, &[]).await;
    match results {
        Ok(r) => {
            let lost = t.baseline.lost(&r);
            let passed = r.values().filter(|o| **o == Outcome::Passed).count();
            let summary = format!(
                "{passed} of {} tests passed (exit {}, {took} ms). Tests that passed on the old toolchain and do not pass now: {}",
                r.len(),
                code.unwrap_or(-1),
                if lost.is_empty() { "none".to_string() } else { lost.join(", ") }
            );
            (Some(lost), summary)
        }
        Err(e) => (None, format!("the test results could not be read: {e}")),
    }
}

async fn tool(t: &Task<'_>, name: &str, args: &Value) -> String {
    let s = |k: &str| args.get(k).and_then(Value::as_str);
    match name {
        "exec" => {
            let Some(cmd) = s("command") else {
                return "error: exec needs a `command` string".into();
            };
            let secs = args
                .get("timeout_secs")
                .and_then(Value::as_u64)
                .unwrap_or(600)
                .clamp(1, 3600);
            match t.sandbox.run(sh(cmd, secs)).await {
                Ok(o) => format!(
                    "exit code: {}{}\n[stdout]\n{}\n[stderr]\n{}",
                    o.code(),
                    if o.timed_out { " (timed out)" } else { "" },
                    cap(&String::from_utf8_lossy(&o.stdout), RESULT_CAP / 2),
                    cap(&String::from_utf8_lossy(&o.stderr), RESULT_CAP / 2)
                ),
                Err(e) => format!("error: {e}"),
            }
        }
        "read_file" => {
            let Some(p) = s("path") else {
                return "error: read_file needs a `path` string".into();
            };
            match t.sandbox.client().read_file(&abs(p)).await {
                Ok(b) => cap(&String::from_utf8_lossy(&b), 4 * RESULT_CAP),
                Err(e) => format!("error: {e}"),
            }
        }
        "write_file" => {
            let (Some(p), Some(content)) = (s("path"), s("content")) else {
                return "error: write_file needs `path` and `content` strings".into();
            };
            match t
                .sandbox
                .client()
                .write_file(&abs(p), content.as_bytes(), 0o644)
                .await
            {
                Ok(()) => format!("wrote {} bytes to {}", content.len(), abs(p)),
                Err(e) => format!("error: {e}"),
            }
        }
        "diff" => match t
            .sandbox
            .run(sh("git add -A >/dev/null && git diff --cached", 120))
            .await
        {
            Ok(o) => cap(&String::from_utf8_lossy(&o.stdout), 2 * RESULT_CAP),
            Err(e) => format!("error: {e}"),
        },
        "run_tests" => check(t).await.1,
        other => format!(
            "error: there is no tool {other:?}; use exec, read_file, write_file, diff or run_tests"
        ),
    }
}

/// One chat-completions call; the reply's message and the tokens used.
async fn call(
    http: &reqwest::Client,
    endpoint: &LlmEndpoint,
    porter: &LlmPorter,
    model: &str,
    messages: &[Value],
) -> Result<(Value, u64), LlmError> {
    let url = endpoint.completions_url();
    let body =
        json!({"model": model, "messages": messages, "tools": tools(), "tool_choice": "auto"});
    let mut attempt = 0;
    let (status, text) = loop {
        attempt += 1;
        let mut req = http.post(&url).json(&body);
        if let Some(k) = &endpoint.key {
            req = req.bearer_auth(k);
        }
        let answer = match req.send().await {
            Ok(resp) => {
                let status = resp.status();
                resp.text().await.map(|t| (status, t))
            }
            Err(e) => Err(e),
        };
        match answer {
            Err(e) if e.is_timeout() => return Err(LlmError::Timeout(porter.request_timeout_secs)),
            Err(e) if attempt >= 3 => {
                return Err(LlmError::Unreachable {
                    url,
                    message: e.to_string(),
                })
            }
            // Busy or briefly down: try again, a little later each time.
            Ok((st, _)) if (st.as_u16() == 429 || st.is_server_error()) && attempt < 3 => {}
            Err(_) => {}
            Ok(ok) => break ok,
        }
        tokio::time::sleep(Duration::from_millis(500 * attempt)).await;
    };
    if !status.is_success() {
        return Err(LlmError::Status {
            status: status.as_u16(),
            body: cap(&text, 400),
        });
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| {
        LlmError::Malformed(format!(
            "not JSON ({e}); it began: {:?}",
            text.chars().take(120).collect::<String>()
        ))
    })?;
    let msg = v
        .pointer("/choices/0/message")
        .filter(|m| m.is_object())
        .cloned()
        .ok_or_else(|| {
            LlmError::Malformed(format!(
                "no choices[0].message in {:?}",
                cap(&v.to_string(), 200)
            ))
        })?;
    let tokens = v
        .pointer("/usage/total_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Ok((msg, tokens))
}

fn system_prompt(t: &Task<'_>) -> String {
    let passed: Vec<&String> = t.baseline.passed().collect();
    let mut list: Vec<&str> = passed.iter().take(60).map(|s| s.as_str()).collect();
    if passed.len() > 60 {
        list.push("...");
    }
    format!(
        "You port a code base to a new toolchain inside a disposable Linux sandbox with no network. \
         The code is in {WORKDIR}, a git repository whose last commit is the original code. \
         The test command, run in {WORKDIR}, is: {}\n\
         On the old toolchain {} tests passed: {}.\n\
         Make them pass on this toolchain with the smallest correct change; do not delete or weaken tests. \
         Use the tools (paths are relative to {WORKDIR}). When you are done, answer without calling a tool: \
         the tests are then run and you are told if a test that passed before still does not pass.",
        t.cfg.test,
        passed.len(),
        list.join(", ")
    )
}

/// Runs the porter to its end; never panics on what the endpoint sends.
pub async fn port(t: &Task<'_>) -> LlmRun {
    let mut run = LlmRun::default();
    let Some(endpoint) = t.endpoint else {
        run.error = Some(LlmError::NoEndpoint);
        return run;
    };
    let Some(model) = t.porter.model.clone().or_else(|| endpoint.model.clone()) else {
        run.error = Some(LlmError::NoModel);
        return run;
    };
    forkbox_engine::sandbox::ca::install_provider();
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(t.porter.request_timeout_secs))
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            run.error = Some(LlmError::Unreachable {
                url: endpoint.url.clone(),
                message: e.to_string(),
            });
            return run;
        }
    };
    let mut messages = vec![
        json!({"role": "system", "content": system_prompt(t)}),
        json!({"role": "user", "content": t.instructions}),
    ];
    loop {
        if run.steps >= t.porter.max_steps {
            run.outcome = format!("the step budget ({}) ran out", t.porter.max_steps);
            break;
        }
        run.steps += 1;
        let (msg, tokens) = match call(&http, endpoint, t.porter, &model, &messages).await {
            Ok(r) => r,
            Err(e) => {
                run.outcome = format!("stopped at step {}: {e}", run.steps);
                run.error = Some(e);
                break;
            }
        };
        run.tokens += tokens;
        let calls: Vec<Value> = msg
            .get("tool_calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        messages.push(msg);
        if calls.is_empty() {
            // The model says it is done: hold it to the tests.
            let (lost, summary) = check(t).await;
            if lost.as_ref().is_some_and(Vec::is_empty) {
                run.outcome = format!("done after {} steps: {summary}", run.steps);
                break;
            }
            messages.push(
                json!({"role": "user", "content": format!("Not done yet: {summary}. Keep going.")}),
            );
            continue;
        }
        for c in calls {
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let name = c
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let args = c
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}");
            let result = match serde_json::from_str::<Value>(args) {
                Ok(a) if a.is_object() => tool(t, name, &a).await,
                Ok(_) | Err(_) => format!(
                    "error: the arguments of {name:?} are not a JSON object; call it again with valid JSON"
                ),
            };
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
        }
    }
    run.transcript = messages;
    run
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_not_printed() {
        let e = LlmEndpoint {
            url: "http://x/v1".into(),
            model: None,
            key: Some("sk-secret".into()),
        };
        assert!(!format!("{e:?}").contains("sk-secret"));
        assert_eq!(e.completions_url(), "http://x/v1/chat/completions");
    }

    #[test]
    fn long_results_keep_their_end() {
        let s = "é".repeat(10_000);
        let c = cap(&s, 101);
        assert!(c.starts_with("[... "), "{}", &c[..20]);
        assert!(c.ends_with('é'));
    }
}
