//! One failure, one error code, whatever the front end: the same bad requests (an unknown
//! image, a recipe with a misspelt field, fork counts 0 and 21, a sandbox that is gone, an
//! image version that is not there) through raw HTTP on the daemon's socket, the Rust client,
//! the CLI (through the daemon, and `run` in its own process), the MCP server over stdio and
//! both SDKs, each answer's code compared with the one the API's vocabulary gives it. No VM
//! boots: every request is refused before one would.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use forkbox_test_infra as infra;

mod common;
use common::{forkbox, Daemon};

/// The failures, and the code each must have everywhere.
const EXPECTED: &[(&str, &str)] = &[
    ("unknown_image", "image_not_found"),
    ("bad_recipe", "bad_request"),
    ("fork_count_0", "bad_request"),
    ("fork_count_21", "bad_request"),
    ("sandbox_gone", "sandbox_not_found"),
    ("image_version_gone", "image_not_found"),
];

const BAD_RECIPE: &str = r#"{"name": "codes-test", "recipe": {"bsae": "bookworm"}}"#;

/// A request on the daemon's socket, by hand: the answer's `code`.
fn raw_http(d: &Daemon, method: &str, path: &str, body: &str) -> String {
    let mut s =
        std::os::unix::net::UnixStream::connect(forkbox_server::socket_path(&d.paths)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    // A streamed build answers 200 and says its error in the stream; the rest as JSON.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body.lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .unwrap_or_default()
            .to_string()
    } else {
        body.to_string()
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["code"].as_str().unwrap_or("<none>").to_string()
}

fn through_raw_http(d: &Daemon) -> BTreeMap<String, String> {
    [
        (
            "unknown_image",
            raw_http(d, "POST", "/v1/sandboxes", r#"{"image": "no-such-image"}"#),
        ),
        ("bad_recipe", raw_http(d, "POST", "/v1/images", BAD_RECIPE)),
        (
            "fork_count_0",
            raw_http(
                d,
                "POST",
                "/v1/snapshots/no-such-snapshot/fork",
                r#"{"count": 0}"#,
            ),
        ),
        (
            "fork_count_21",
            raw_http(d, "POST", "/v1/sandboxes/sb-gone/fork", r#"{"count": 21}"#),
        ),
        (
            "sandbox_gone",
            raw_http(
                d,
                "POST",
                "/v1/sandboxes/sb-gone/exec",
                r#"{"argv": ["true"]}"#,
            ),
        ),
        (
            "image_version_gone",
            raw_http(d, "DELETE", "/v1/images/python-bookworm@999", ""),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn through_rust_client(d: &Daemon) -> BTreeMap<String, String> {
    use forkbox_engine::api::{CreateRequest, ExecRequest, ForkRequest};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = forkbox_client::Client::new(forkbox_client::Endpoint::Unix(
            forkbox_server::socket_path(&d.paths),
        ))
        .unwrap();
        let code = |e: forkbox_client::ClientError| e.code().to_string();
        let fork = |count| ForkRequest {
            count,
            ..Default::default()
        };
        let mut out = BTreeMap::new();
        let create = CreateRequest {
            image: Some("no-such-image".into()),
            ..Default::default()
        };
        out.insert("unknown_image", c.create(&create).await.err().map(code));
        out.insert(
            "fork_count_0",
            c.fork("no-such-snapshot", &fork(0)).await.err().map(code),
        );
        out.insert(
            "fork_count_21",
            c.fork("sb-gone", &fork(21)).await.err().map(code),
        );
        let exec = ExecRequest {
            argv: Some(vec!["true".into()]),
            ..Default::default()
        };
        out.insert(
            "sandbox_gone",
            c.exec("sb-gone", &exec).await.err().map(code),
        );
        out.insert(
            "image_version_gone",
            c.remove_image("python-bookworm@999").await.err().map(code),
        );
        out.into_iter()
            .map(|(k, v)| (k.to_string(), v.unwrap_or_else(|| "<succeeded>".into())))
            .collect()
    })
}

/// The CLI's `--json` error: `{"error": {"code": …}}` on stdout.
fn cli_code(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // One JSON document (pretty-printed over several lines) after whatever came before it.
    let v: serde_json::Value = text
        .find('{')
        .and_then(|at| serde_json::from_str(text[at..].trim()).ok())
        .unwrap_or_default();
    v["error"]["code"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| {
            format!(
                "<none: {text} {}>",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
}

fn through_cli(d: &Daemon) -> BTreeMap<String, String> {
    let recipe = tempfile::tempdir().unwrap();
    let file = recipe.path().join("codes-test.toml");
    std::fs::write(&file, "name = \"codes-test\"\nbsae = \"bookworm\"\n").unwrap();
    let run = |args: &[&str]| cli_code(forkbox(&d.paths).env("FORKBOX_API", d.api()).args(args));
    [
        (
            "unknown_image",
            run(&["sandbox", "create", "--image", "no-such-image", "--json"]),
        ),
        (
            "bad_recipe",
            run(&["image", "build", "-f", file.to_str().unwrap(), "--json"]),
        ),
        (
            "fork_count_0",
            run(&[
                "sandbox",
                "fork",
                "no-such-snapshot",
                "--count",
                "0",
                "--json",
            ]),
        ),
        (
            "fork_count_21",
            run(&["sandbox", "fork", "sb-gone", "--count", "21", "--json"]),
        ),
        (
            "sandbox_gone",
            run(&["sandbox", "exec", "--json", "sb-gone", "true"]),
        ),
        (
            "image_version_gone",
            run(&["image", "rm", "python-bookworm@999", "--json"]),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// `forkbox run` creates in its own process, through the same engine and errors.
fn through_cli_run(d: &Daemon) -> BTreeMap<String, String> {
    let code = cli_code(forkbox(&d.paths).args([
        "run",
        "--image",
        "no-such-image",
        "--json",
        "--",
        "true",
    ]));
    BTreeMap::from([("unknown_image".to_string(), code)])
}

/// `forkbox mcp --all` over stdio, spoken by hand: each tool error's structured `code`.
fn through_mcp(d: &Daemon) -> BTreeMap<String, String> {
    let mut child = forkbox(&d.paths)
        .env("FORKBOX_API", d.api())
        .args(["mcp", "--all"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = |v: serde_json::Value| writeln!(stdin, "{v}").unwrap();
    let mut answer = |id: u64| -> serde_json::Value {
        loop {
            let line = lines.next().unwrap().unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    };
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "error-codes-test", "version": "0"}}}),
    );
    assert!(answer(0)["result"].is_object());
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let calls = [
        (
            "unknown_image",
            "sandbox_create",
            serde_json::json!({"image": "no-such-image"}),
        ),
        (
            "fork_count_0",
            "fork",
            serde_json::json!({"source": "no-such-snapshot", "count": 0}),
        ),
        (
            "fork_count_21",
            "fork",
            serde_json::json!({"source": "sb-gone", "count": 21}),
        ),
        (
            "sandbox_gone",
            "exec",
            serde_json::json!({"sandbox": "sb-gone", "command": "true"}),
        ),
    ];
    let mut out = BTreeMap::new();
    for (i, (case, tool, args)) in calls.into_iter().enumerate() {
        let id = i as u64 + 1;
        send(
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": args}}),
        );
        let r = answer(id);
        assert_eq!(r["result"]["isError"], true, "{case}: {r}");
        let code = r["result"]["structuredContent"]["code"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("<none: {r}>"));
        out.insert(case.to_string(), code);
    }
    let _ = child.kill();
    let _ = child.wait();
    out
}

fn sdk_codes(d: &Daemon, program: &Path, args: &[&str]) -> BTreeMap<String, String> {
    let out = Command::new(program)
        .args(args)
        .env("FORKBOX_API", d.api())
        .env("BAD_RECIPE", BAD_RECIPE)
        .current_dir(infra::repo_root())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

const PYTHON: &str = r#"
import json, os, forkbox
rt = forkbox.Runtime()
out = {}
def code(case, f):
    try:
        f()
        out[case] = "<succeeded>"
    except forkbox.ForkboxError as e:
        out[case] = e.code or "<none: %s>" % type(e).__name__
bad = json.loads(os.environ["BAD_RECIPE"])
code("unknown_image", lambda: rt.sandboxes.create(image="no-such-image"))
code("bad_recipe", lambda: rt.images.build(bad["name"], bad["recipe"]))
code("fork_count_0", lambda: forkbox.Snapshot(rt, {"name": "no-such-snapshot"}).fork_many(0))
code("fork_count_21", lambda: forkbox.Sandbox(rt, {"id": "sb-gone"}).fork(count=21))
code("sandbox_gone", lambda: forkbox.Sandbox(rt, {"id": "sb-gone"}).exec("true"))
code("image_version_gone", lambda: rt.images.remove("python-bookworm@999"))
print(json.dumps(out))
"#;

const NODE: &str = r#"
import { Runtime, Sandbox, Snapshot, ForkboxError } from "./sdk/typescript/dist/index.js";
const rt = new Runtime();
const out = {};
async function code(c, f) {
  try { await f(); out[c] = "<succeeded>"; }
  catch (e) { out[c] = e instanceof ForkboxError ? (e.code ?? `<none: ${e.name}>`) : `<not a ForkboxError: ${e}>`; }
}
const bad = JSON.parse(process.env.BAD_RECIPE);
await code("unknown_image", () => rt.sandboxes.create({ image: "no-such-image" }));
await code("bad_recipe", () => rt.images.build({ name: bad.name, recipe: bad.recipe }));
await code("fork_count_0", () => new Snapshot(rt, { name: "no-such-snapshot" }).fork({ count: 0 }));
await code("fork_count_21", () => new Sandbox(rt, { id: "sb-gone" }).fork({ count: 21 }));
await code("sandbox_gone", () => new Sandbox(rt, { id: "sb-gone" }).exec("true"));
await code("image_version_gone", () => rt.images.remove("python-bookworm@999"));
rt.close();
console.log(JSON.stringify(out));
"#;

#[test]
fn one_failure_has_one_code_through_every_front_end() {
    let python = infra::sdk_python();
    infra::npm_ready("sdk/typescript");
    let d = Daemon::start("error-codes");
    let expected: BTreeMap<String, String> = EXPECTED
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let fronts = [
        ("raw HTTP", through_raw_http(&d)),
        ("Rust client", through_rust_client(&d)),
        ("CLI", through_cli(&d)),
        ("CLI run", through_cli_run(&d)),
        ("MCP", through_mcp(&d)),
        ("Python SDK", sdk_codes(&d, &python, &["-c", PYTHON])),
        (
            "TypeScript SDK",
            sdk_codes(&d, Path::new("node"), &["--input-type=module", "-e", NODE]),
        ),
    ];
    let mut wrong = Vec::new();
    for (front, got) in &fronts {
        assert!(!got.is_empty(), "{front} answered nothing");
        for (case, code) in got {
            let want = &expected[case];
            if code != want {
                wrong.push(format!("{front}: {case} gave {code}, not {want}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every case went through raw HTTP and both SDKs.
    for front in ["raw HTTP", "Python SDK", "TypeScript SDK", "CLI"] {
        let got = &fronts.iter().find(|(f, _)| *f == front).unwrap().1;
        assert_eq!(got.len(), EXPECTED.len(), "{front}: {got:?}");
    }
}
