//! The Python and TypeScript SDKs and their examples, against a real daemon of this build and
//! real VMs. Each test starts a daemon in a home of its own (sharing the test home's images)
//! with a TCP listener and a token, then runs the SDK's own test suite or an example with
//! `FORKBOX_API` pointing at it. Costs (TCG): a few boots and restores each; the Python suite
//! builds one small image on the default one (~10 s).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use forkbox_test_infra as infra;

mod common;
use common::{http, mcp_root, stop_daemon_of, Daemon};

/// The Python SDK's suite (sdk/python/tests): every call and its errors, cleanup by context
/// manager, 10 concurrent async execs, an image built from a seed.
#[test]
fn python_sdk_against_a_real_daemon() {
    let python = infra::sdk_python();
    let d = Daemon::start("sdk-python");
    let out = d.check(
        d.client(&python).args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "sdk/python/tests",
        ]),
        "the Python SDK's tests",
    );
    assert!(out.contains(" passed"), "{out}");
    d.assert_nothing_left();
}

/// The TypeScript SDK's suite (sdk/typescript/test), on its build from `npm ci`.
#[test]
fn typescript_sdk_against_a_real_daemon() {
    let dir = infra::npm_ready("sdk/typescript");
    let d = Daemon::start("sdk-typescript");
    let out = d.check(
        d.client(Path::new("node"))
            .args(["--test", "--test-reporter=spec"])
            .arg(dir.join("test")),
        "the TypeScript SDK's tests",
    );
    assert!(out.contains("pass"), "{out}");
    d.assert_nothing_left();
}

/// The TypeScript SDK as its users install it: `npm pack`ed, installed into a project `npm
/// init` made, once CommonJS (`require("forkbox")`) and once ESM (`import`), each running a
/// create, exec, fork and stop against a real daemon and type-checked with the types that
/// project's resolution picks (the CommonJS build's for `require`, the ESM build's for `import`).
#[test]
fn typescript_sdk_installs_as_commonjs_and_as_esm() {
    let sdk = infra::npm_ready("sdk/typescript");
    let packed = tempfile::tempdir().unwrap();
    let npm = |args: &[&str], dir: &Path| {
        let out = Command::new("npm")
            .args(args)
            .args(["--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "npm {args:?} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let name = npm(
        &[
            "pack",
            "--pack-destination",
            packed.path().to_str().unwrap(),
        ],
        &sdk,
    );
    let tarball = packed.path().join(name.lines().last().unwrap().trim());
    let body = r#"
  const rt = new Runtime();
  const sbx = await rt.sandboxes.create({ ttlSeconds: 600 });
  const r = await sbx.exec(`echo hello from ${process.env.KIND}`);
  const [copy] = await sbx.fork({ count: 1 });
  const c = await copy.exec("echo copy");
  await copy.stop();
  await sbx.stop();
  rt.close();
  console.log(`${r.stdout.trim()} ${c.stdout.trim()} ${r.exitCode}`);
"#;
    let d = Daemon::start("sdk-packaging");
    for kind in ["commonjs", "module"] {
        // npm names the package after its directory, which must be a valid name.
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join(format!("app-{kind}"));
        std::fs::create_dir(&project).unwrap();
        npm(&["init", "-y"], &project);
        npm(&["pkg", "set", &format!("type={kind}")], &project);
        npm(&["install", tarball.to_str().unwrap()], &project);
        let script = if kind == "commonjs" {
            format!("const {{ Runtime }} = require(\"forkbox\");\n(async () => {{{body}}})();\n")
        } else {
            format!("import {{ Runtime }} from \"forkbox\";\n{body}")
        };
        std::fs::write(project.join("index.js"), script).unwrap();
        let out = d.check(
            d.client(Path::new("node"))
                .arg("index.js")
                .env("KIND", kind)
                .current_dir(&project),
            &format!("a {kind} project's script"),
        );
        assert_eq!(out.trim(), format!("hello from {kind} copy 0"), "{kind}");
        // The types resolve for the project's kind, and say what the calls return.
        std::fs::write(
            project.join("check.ts"),
            "import { Runtime, NotFoundError } from \"forkbox\";\nconst n: number = new NotFoundError(\"x\", 404, \"image_not_found\").status ?? 0;\nexport async function f(): Promise<string> { const s = await new Runtime().sandboxes.create(); return (await s.exec(\"true\")).stdout + n; }\n",
        )
        .unwrap();
        let tsc = Command::new("node")
            .arg(sdk.join("node_modules/typescript/bin/tsc"))
            .args([
                "--noEmit",
                "--strict",
                "--module",
                "nodenext",
                "--moduleResolution",
                "nodenext",
            ])
            .args([
                "--target",
                "es2022",
                "--lib",
                "es2022,esnext.disposable",
                "--types",
                "node",
            ])
            .arg("--typeRoots")
            .arg(sdk.join("node_modules/@types"))
            .arg("check.ts")
            .current_dir(&project)
            .output()
            .unwrap();
        assert!(
            tsc.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&tsc.stdout)
        );
    }
    d.assert_nothing_left();
}

/// examples/sdk/baseline_fork.py: a prepared baseline, snapshot, hibernate, three variants in
/// forks that are gone with their `with` blocks, the passing diffs kept, the snapshot forks
/// again.
#[test]
fn python_example_baseline_fork() {
    let python = infra::sdk_python();
    let shared = infra::home();
    infra::image(&shared, "python-trixie");
    let d = Daemon::start("sdk-example-fork");
    let out = d.check(
        d.client(&python).arg("examples/sdk/baseline_fork.py"),
        "examples/sdk/baseline_fork.py",
    );
    assert!(out.contains("forks left: 0"), "{out}");
    assert!(
        out.contains("kept minimal") && out.contains("kept modernize"),
        "{out}"
    );
    assert!(!out.contains("kept wrong"), "{out}");
    d.assert_nothing_left();
}

/// examples/sdk/accept.py and accept.ts: the accept-by-comparison recipe on legacykit, from
/// both SDKs against one daemon (the second reuses the images the first built).
#[test]
fn accept_by_comparison_examples_in_python_and_typescript() {
    let python = infra::sdk_python();
    infra::npm_ready("sdk/typescript");
    let examples = infra::npm_ready("examples/sdk");
    let d = Daemon::start("sdk-example-accept");
    let expect = "accepted, smallest diff first: minimal, modernize";
    let out = d.check(
        d.client(&python).arg("examples/sdk/accept.py"),
        "examples/sdk/accept.py",
    );
    assert!(out.contains(expect), "{out}");
    d.check(
        Command::new("npm")
            .args(["run", "--silent", "build"])
            .current_dir(&examples),
        "tsc in examples/sdk",
    );
    let out = d.check(
        d.client(Path::new("node"))
            .arg(examples.join("dist/accept.js")),
        "examples/sdk/accept.ts",
    );
    assert!(out.contains(expect), "{out}");
    d.assert_nothing_left();
}

/// With no address given and no daemon running, both SDKs start this host's daemon with
/// `forkbox serve --detach` (found on PATH), as the CLI's sandbox commands do. No VM.
#[test]
fn sdks_start_the_local_daemon_when_none_runs() {
    let python = infra::sdk_python();
    let ts = infra::npm_ready("sdk/typescript");
    let paths = infra::isolated_home("sdk-autostart");
    let bin = Path::new(env!("CARGO_BIN_EXE_forkbox")).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let socket = forkbox_server::socket_path(&paths);
    let run = |cmd: &mut Command| {
        let out = cmd
            .env("FORKBOX_HOME", paths.home())
            .env("PATH", &path)
            .env("FORKBOX_POOL_SIZE", "0")
            .env_remove("FORKBOX_API")
            .env_remove("FORKBOX_TOKEN")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    for client in ["python", "node"] {
        stop_daemon_of(&paths);
        assert!(std::os::unix::net::UnixStream::connect(&socket).is_err());
        let out = match client {
            "python" => run(Command::new(&python).args([
                "-c",
                "import forkbox; print(forkbox.Runtime().info()['home'])",
            ])),
            _ => run(Command::new("node").args([
                "--input-type=module",
                "-e",
                &format!(
                    "import {{ Runtime }} from '{}/dist/index.js'; const r = new Runtime(); console.log((await r.info()).home); r.close();",
                    ts.display()
                ),
            ])),
        };
        assert_eq!(out.trim(), paths.home().display().to_string(), "{client}");
        assert!(
            std::os::unix::net::UnixStream::connect(&socket).is_ok(),
            "{client}: no daemon left running"
        );
    }
    stop_daemon_of(&paths);
}

/// Waits for the daemon to hold no sandbox (an MCP session's end deletes its own).
fn wait_nothing_left(d: &Daemon) {
    infra::wait_until(Duration::from_secs(60), || {
        !infra::run_entries(&d.paths)
            .iter()
            .any(|e| e.starts_with("sb-"))
    });
    d.assert_nothing_left();
}

/// `forkbox mcp` over stdio, driven by the official Python MCP client: the tools and their
/// schemas; create, exec (output tail kept), upload, write/read/edit a file (a non-unique edit
/// refused), git_diff, run_tests naming the lost test against a saved baseline, snapshot,
/// fork 3, destroy, download; an upload outside the allowed root and another session's
/// sandbox refused; resources and the port prompt; then examples/legacykit ported from
/// Python 3.9 to 3.13 through the tools alone (baseline on the old image, three forks of the
/// new one, run_tests against the baseline: minimal and modernize accepted, wrong rejected);
/// the session's end deletes what it made, except the sandbox created persistent.
#[test]
fn mcp_over_stdio_with_the_official_python_client() {
    let python = infra::mcp_python();
    let shared = infra::home();
    infra::image(&shared, "python-bullseye");
    infra::image(&shared, "python-trixie");
    let d = Daemon::start("mcp-stdio");
    let root = mcp_root();
    let out = d.check(
        d.client(&python)
            .arg(infra::repo_root().join("crates/mcp/tests/mcp_client.py"))
            .arg("stdio")
            .arg(env!("CARGO_BIN_EXE_forkbox"))
            .arg(root.path()),
        "the MCP client over stdio",
    );
    assert!(out.contains("stdio session made"), "{out}");
    // The session's end deleted all it made but the one created persistent.
    let kept = out
        .lines()
        .find_map(|l| l.strip_prefix("persistent: "))
        .unwrap()
        .to_string();
    let left = || -> Vec<String> {
        infra::run_entries(&d.paths)
            .into_iter()
            .filter(|e| e.starts_with("sb-"))
            .collect()
    };
    infra::wait_until(Duration::from_secs(60), || left() == vec![kept.clone()]);
    assert_eq!(left(), vec![kept.clone()], "after the session");
    let rm = Command::new(env!("CARGO_BIN_EXE_forkbox"))
        .env("FORKBOX_HOME", d.paths.home())
        .args(["sandbox", "rm", &kept])
        .output()
        .unwrap();
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    wait_nothing_left(&d);
}

/// The daemon's /mcp over Streamable HTTP on its TCP listener: a bad token refused, the same
/// scenario with the right one, and 5 concurrent sessions that each see only their own
/// sandbox; ended sessions delete what they made.
#[test]
fn mcp_over_streamable_http_on_the_daemon() {
    let python = infra::mcp_python();
    let root = mcp_root();
    let d = Daemon::start_with(
        "mcp-http",
        &["--mcp-root", &root.path().display().to_string()],
    );
    let out = d.check(
        d.client(&python)
            .arg(infra::repo_root().join("crates/mcp/tests/mcp_client.py"))
            .arg("http")
            .arg(format!("{}/mcp", d.tcp))
            .arg(&d.token)
            .arg(root.path()),
        "the MCP client over Streamable HTTP",
    );
    assert!(out.contains("bad token refused"), "{out}");
    assert!(out.contains("5 concurrent sessions"), "{out}");
    wait_nothing_left(&d);
}

/// `forkbox sandbox port-forward` through the daemon, and its preview URL on the daemon's TCP
/// listener: the right token opens it (then a cookie of that host name), the token of another
/// port or none is refused, a deleted sandbox's preview says so; bad ports are usage errors.
#[test]
fn port_forwards_and_preview_urls_through_the_daemon() {
    let d = Daemon::start("ports-preview");
    let cli = |args: &[&str]| {
        d.client(Path::new(env!("CARGO_BIN_EXE_forkbox")))
            .env("FORKBOX_HOME", d.paths.home())
            .args(args)
            .output()
            .unwrap()
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let out = cli(&["sandbox", "create", "--ttl", "900"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let out = cli(&[
        "sandbox",
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "mkdir -p /tmp/w && echo served-by-the-guest > /tmp/w/i.txt",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = cli(&[
        "sandbox",
        "exec",
        &id,
        "--detach",
        "--",
        "python3",
        "-m",
        "http.server",
        "3000",
        "--bind",
        "127.0.0.1",
        "--directory",
        "/tmp/w",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = cli(&["sandbox", "port-forward", &id, "3000", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let url = v["url"].as_str().unwrap().to_string();
    let preview = v["preview_url"].as_str().unwrap().to_string();
    let direct = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    assert!(
        infra::wait_until(Duration::from_secs(120), || {
            http(&direct, "x", "/i.txt", "").contains("served-by-the-guest")
        }),
        "the guest's server never answered through {url}"
    );

    // The preview: Host PORT-ID.localhost:P, the token in the query once, then the cookie.
    let tcp = d.tcp.trim_start_matches("http://").to_string();
    let (host, query) = preview
        .trim_start_matches("http://")
        .split_once("/?")
        .unwrap();
    assert_eq!(
        host,
        format!("3000-{id}.localhost:{}", tcp.rsplit(':').next().unwrap())
    );
    let first = http(&tcp, host, &format!("/i.txt?{query}"), "");
    assert!(
        first.starts_with("HTTP/1.0 200") || first.starts_with("HTTP/1.1 200"),
        "{first}"
    );
    assert!(first.contains("served-by-the-guest"), "{first}");
    let cookie = first
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or(l.strip_prefix("Set-Cookie: "))
        })
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(
        cookie.contains("HttpOnly") || first.contains("HttpOnly"),
        "{first}"
    );
    let again = http(&tcp, host, "/i.txt", &format!("Cookie: {cookie}\r\n"));
    assert!(again.contains("served-by-the-guest"), "{again}");
    // No token; the token of port 3000 on port 5432's name; the API's own bearer token.
    let none = http(&tcp, host, "/i.txt", "");
    assert!(
        none.contains(" 401 ") && none.contains("needs its token"),
        "{none}"
    );
    let other = format!("5432-{id}.localhost:{}", tcp.rsplit(':').next().unwrap());
    let wrong = http(&tcp, &other, &format!("/i.txt?{query}"), "");
    assert!(wrong.contains(" 401 "), "{wrong}");
    let bearer = http(
        &tcp,
        host,
        "/v1/sandboxes",
        &format!("Authorization: Bearer {}\r\n", d.token),
    );
    assert!(bearer.contains(" 401 "), "{bearer}");

    // Bad ports: usage errors at once; a host port in use, said by the daemon.
    let out = cli(&["sandbox", "port-forward", &id, "70000"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not a port"),
        "{}",
        text(&out.stderr)
    );
    let taken = direct.rsplit(':').next().unwrap().to_string();
    let out = cli(&["sandbox", "port-forward", &id, &format!("{taken}:3000")]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is in use"),
        "{}",
        text(&out.stderr)
    );
    let out = cli(&["sandbox", "port-forward", &id]);
    assert_eq!(
        text(&out.stdout).lines().count(),
        1,
        "{}",
        text(&out.stdout)
    );

    // Gone: the preview says so, the forward's listener is closed.
    let out = cli(&["sandbox", "rm", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let gone = http(&tcp, host, &format!("/i.txt?{query}"), "");
    assert!(gone.contains(" 404 ") && gone.contains("is gone"), "{gone}");
    assert!(std::net::TcpStream::connect(&direct).is_err());
    d.assert_nothing_left();
}
