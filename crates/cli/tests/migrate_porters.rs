//! `forkbox migrate` with the two porters that drive a fork from outside: a host command going
//! through the run's private API with `forkbox sandbox exec`, and the built-in LLM porter
//! against a local server that speaks the chat-completions protocol with scripted replies
//! (tool calls, arguments that are not JSON, a premature "done", a reply that is not JSON, a
//! model that never answers), and a setup step that may reach only an allow-listed host. Real VMs: the python-bookworm image on both sides, a baseline
//! (2 runs), a snapshot and four forks at once; about a minute under TCG on a warm test home.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use forkbox_test_infra as infra;
use serde_json::{json, Value};

const KEY: &str = "sk-forkbox-test-key";

const ORIGINAL: &str =
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b  # sub\n";
const BROKEN: &str =
    "def add(a, b):\n    return a * b\n\n\ndef sub(a, b):\n    return a - b  # sub\n";
const FIXED: &str =
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b  # sub\n";
const TESTS: &str = "from calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n";

/// What the scripted model server saw: (authorization header, request body) per call.
#[derive(Default)]
struct Seen {
    /// The registry-like server in the test's network namespace.
    registry: String,
    calls: Vec<(String, Value)>,
    per_model: HashMap<String, usize>,
}

type Shared = Arc<Mutex<Seen>>;

fn tool_call(id: &str, name: &str, args: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
}

fn reply(message: Value) -> Value {
    json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": {"total_tokens": 100}})
}

fn tools(calls: Vec<Value>) -> Value {
    reply(json!({"role": "assistant", "content": null, "tool_calls": calls}))
}

fn done() -> Value {
    reply(json!({"role": "assistant", "content": "done"}))
}

async fn completions(
    State(seen): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let model = body["model"].as_str().unwrap_or_default().to_string();
    let (n, registry) = {
        let mut s = seen.lock().unwrap();
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        s.calls.push((auth, body.clone()));
        let n = s.per_model.entry(model.clone()).or_default();
        *n += 1;
        (*n, s.registry.clone())
    };
    let write = |content: &str| {
        serde_json::to_string(&json!({"path": "calc.py", "content": content})).unwrap()
    };
    match (model.as_str(), n) {
        ("fixer", 1) => Json(tools(vec![
            tool_call("c1", "read_file", r#"{"path": "calc.py"}"#),
            tool_call("c2", "write_file", "{not json"),
        ]))
        .into_response(),
        // A change that loses test_add: the porter must not stop at the model's "done".
        ("fixer", 2) => {
            Json(tools(vec![tool_call("c3", "write_file", &write(BROKEN))])).into_response()
        }
        ("fixer", 3) => Json(done()).into_response(),
        ("fixer", 4) => {
            // The key must be nowhere in the guest: not in any process's environment or
            // command line, not in the files. (`ke[y]` matches the key, not this pattern.)
            let keycheck = r#"p='sk-forkbox-test-ke[y]'; n=$(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n' | grep -c "$p"); f=$(grep -rls "$p" /work /tmp /plan /root /etc /run 2>/dev/null | wc -l); echo "KEYCHECK $n $f""#;
            // What the setup step fetched is in the fork; the fork itself has no network.
            let netcheck = format!(
                "cat /tmp/fetched.txt; echo; python3 -c \"import urllib.request; urllib.request.urlopen('http://{registry}/ok.txt', timeout=5)\" 2>/dev/null && echo FORK-REACHED || echo FORK-OFFLINE"
            );
            let check = format!("{keycheck}; {netcheck}");
            Json(tools(vec![
                tool_call("c4", "write_file", &write(FIXED)),
                tool_call(
                    "c5",
                    "exec",
                    &serde_json::to_string(&json!({"command": check})).unwrap(),
                ),
            ]))
            .into_response()
        }
        ("fixer", _) => Json(done()).into_response(),
        ("garbage", _) => (axum::http::StatusCode::OK, "this is not json").into_response(),
        ("slow", _) => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Json(done()).into_response()
        }
        _ => (axum::http::StatusCode::NOT_FOUND, "no such model").into_response(),
    }
}

fn tool_result<'a>(body: &'a Value, id: &str) -> Option<&'a str> {
    body["messages"]
        .as_array()?
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)?["content"]
        .as_str()
}

#[test]
fn host_and_llm_porters_drive_their_forks_from_outside() {
    let paths = infra::home();
    let image = infra::image(&paths, "python-bookworm").to_string();

    // The scripted model server, on loopback.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let web = tempfile::tempdir().unwrap();
    std::fs::write(web.path().join("ok.txt"), "package index").unwrap();
    let mut net = infra::TestNet::new();
    let registry = format!("{}:8080", net.peer_ips[0]);
    net.serve(&net.peer_ips[0].clone(), 8080, web.path());
    let seen: Shared = Arc::new(Mutex::new(Seen {
        registry: registry.clone(),
        ..Default::default()
    }));
    let app = Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(seen.clone());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().unwrap();
    let code = dir.path().join("code");
    std::fs::create_dir_all(&code).unwrap();
    std::fs::write(code.join("calc.py"), ORIGINAL).unwrap();
    std::fs::write(code.join("test_calc.py"), TESTS).unwrap();
    let plans = dir.path().join("plans");
    std::fs::create_dir_all(&plans).unwrap();
    std::fs::write(
        plans.join("host-port.sh"),
        "set -e\n\
         test -n \"$FORKBOX_SANDBOX\"\n\
         case \"$FORKBOX_API\" in unix:/*) ;; *) echo \"FORKBOX_API=$FORKBOX_API\"; exit 3;; esac\n\
         forkbox sandbox exec --cwd /work \"$FORKBOX_SANDBOX\" -- sed -i 's/return a + b  # sub/return a - b  # sub/' calc.py\n\
         forkbox sandbox exec --cwd /work \"$FORKBOX_SANDBOX\" -- sh -c \"echo \\\"\\$1\\\" > plan.txt\" - \"$FORKBOX_PLAN\"\n",
    )
    .unwrap();
    std::fs::write(
        plans.join("plans.toml"),
        r#"
[[plan]]
name = "host"
instructions = "fix sub from the host"
porter = { host = "sh host-port.sh", timeout_secs = 300 }

[[plan]]
name = "llm-fix"
instructions = "Fix sub."
porter = { llm = { model = "fixer", max_steps = 8 }, timeout_secs = 600 }

[[plan]]
name = "llm-garbage"
instructions = "Fix sub."
porter = { llm = { model = "garbage" } }

[[plan]]
name = "llm-slow"
instructions = "Fix sub."
porter = { llm = { model = "slow", request_timeout_secs = 2 } }

[[plan]]
name = "weaken"
instructions = "Fix sub, and make its test pass whatever happens."
porter = { command = "sed -i 's/return a + b  # sub/return a - b  # sub/' calc.py && sed -i 's/assert sub(5, 3) == 2/pass/' test_calc.py" }
"#,
    )
    .unwrap();
    let out = dir.path().join("out");

    let o = Command::new(env!("CARGO_BIN_EXE_forkbox"))
        .env("FORKBOX_HOME", paths.home())
        .env_remove("FORKBOX_API")
        .env("FORKBOX_LLM_URL", format!("http://{addr}/v1"))
        .env("FORKBOX_LLM_API_KEY", KEY)
        .stdin(Stdio::null())
        .args(["migrate", "--from", &image, "--to", &image])
        .arg("--code")
        .arg(&code)
        // The suite also writes into the tree (a file, bytecode): no patch may carry that.
        .args([
            "--test",
            "python3 -m pytest -q -rA -p no:cacheprovider; echo suite > written-by-the-suite.txt; python3 -m compileall -q .",
        ])
        .arg("--plans")
        .arg(plans.join("plans.toml"))
        .arg("--out")
        .arg(&out)
        // A setup step with an allow-listed "registry"; baseline and forks stay offline.
        .args(["--setup-allow", &registry, "--setup"])
        .arg(format!(
            "python3 -c \"import urllib.request; open('/tmp/fetched.txt', 'w').write(urllib.request.urlopen('http://{registry}/ok.txt').read().decode())\""
        ))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    // Not a terminal: each fork's phases are lines of their own.
    assert!(
        stderr.contains("llm-fix") && stderr.contains("porting"),
        "{stderr}"
    );

    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    // The entry of `list` ("verdicts" or "plans") for plan `p`.
    let entry = |list: &str, p: &str| {
        report[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["plan"] == p)
            .unwrap()
            .clone()
    };
    let verdict = |p: &str| entry("verdicts", p);
    let plan = |p: &str| entry("plans", p);
    for accepted in ["host", "llm-fix"] {
        let v = verdict(accepted);
        assert_eq!(v["accepted"], true, "{v}\n{}", plan(accepted));
        assert_eq!(v["fixed"], json!(["test_calc.py::test_sub"]), "{v}");
    }
    // The host porter's text reached the fork through the API.
    let host_patch = std::fs::read_to_string(out.join("host.patch")).unwrap();
    assert!(
        host_patch.contains("+fix sub from the host"),
        "{host_patch}"
    );
    assert!(
        host_patch.contains("+    return a - b  # sub"),
        "{host_patch}"
    );
    // The LLM porter's change is exactly the fix.
    let llm_patch = std::fs::read_to_string(out.join("llm-fix.patch")).unwrap();
    assert!(
        llm_patch.contains("+    return a - b  # sub"),
        "{llm_patch}"
    );
    assert!(!llm_patch.contains("a * b"), "{llm_patch}");
    for e in std::fs::read_dir(&out).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "patch") {
            let p = std::fs::read_to_string(e.path()).unwrap();
            for written in ["written-by-the-suite", "__pycache__", ".pyc"] {
                assert!(
                    !p.contains(written),
                    "{}: {written}\n{p}",
                    e.path().display()
                );
            }
        }
    }
    assert_eq!(report["winner"], "llm-fix", "the smallest diff wins");
    // A plan that edits the tests loses nothing, and is said to have edited them.
    let weaken = verdict("weaken");
    assert_eq!(weaken["accepted"], true, "{weaken}");
    assert_eq!(
        weaken["test_changes"]["changed"],
        json!(["test_calc.py"]),
        "{weaken}"
    );
    assert_eq!(weaken["test_changes"]["assertions_removed"], 1, "{weaken}");
    assert!(
        weaken["reason"]
            .as_str()
            .unwrap()
            .contains("changes test files"),
        "{weaken}"
    );
    assert_eq!(verdict("llm-fix")["test_changes"]["changed"], json!([]));
    assert_eq!(plan("llm-fix")["porter_steps"], 5);
    assert!(out.join("llm-fix.llm.json").is_file());

    let garbage = verdict("llm-garbage");
    assert_eq!(garbage["accepted"], false);
    assert!(
        garbage["reason"]
            .as_str()
            .unwrap()
            .contains("reply could not be read"),
        "{garbage}"
    );
    let slow = verdict("llm-slow");
    assert_eq!(slow["accepted"], false);
    assert!(
        slow["reason"].as_str().unwrap().contains("within 2 s"),
        "{slow}"
    );

    // What the model was shown, and with which key.
    let seen = seen.lock().unwrap();
    let fixer: Vec<&Value> = seen
        .calls
        .iter()
        .filter(|(_, b)| b["model"] == "fixer")
        .map(|(_, b)| b)
        .collect();
    assert_eq!(fixer.len(), 5);
    assert!(seen
        .calls
        .iter()
        .all(|(auth, _)| auth == &format!("Bearer {KEY}")));
    assert!(tool_result(fixer[1], "c1")
        .unwrap()
        .contains("def sub(a, b)"));
    assert!(tool_result(fixer[1], "c2")
        .unwrap()
        .contains("not a JSON object"));
    let nudge = fixer[3]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap()["content"]
        .as_str()
        .unwrap();
    assert!(
        nudge.contains("Not done yet") && nudge.contains("test_calc.py::test_add"),
        "{nudge}"
    );
    let keycheck = tool_result(fixer[4], "c5").unwrap();
    assert!(keycheck.contains("KEYCHECK 0 0"), "{keycheck}");
    assert!(keycheck.contains("package index"), "{keycheck}");
    assert!(keycheck.contains("FORK-OFFLINE"), "{keycheck}");
    let tools: Vec<&str> = fixer[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["exec", "read_file", "write_file", "diff", "run_tests"]
    );
    // Nothing of the run is left running.
    for p in report["plans"].as_array().unwrap() {
        let id = p["sandbox"].as_str().unwrap();
        assert!(
            infra::wait_until(Duration::from_secs(10), || infra::processes_mentioning(id)
                .is_empty()),
            "{id} is still running"
        );
    }
}
