//! E2B's published SDKs, unchanged, against a forkbox daemon: `e2b` from PyPI and npm at their
//! newest version and at 2.50.0 (the last on E2B's v1 create and connect paths), each running
//! the scenario of `crates/e2b/tests/` with nothing but E2B's environment variables pointing
//! at the daemon's TCP listener and a forkbox token as the API key. The first create of a fresh
//! home builds the `base` template itself, as a user's first run does.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;

use forkbox_test_infra as infra;

mod common;
use common::domain::DomainMode;
use common::{forkbox, stop_daemon_of, Daemon};

fn scenario(file: &str) -> PathBuf {
    infra::repo_root().join("crates/e2b/tests").join(file)
}

/// `program` with E2B's variables aimed at daemon `d`: its TCP listener for the API and the
/// sandboxes, its token as the key, a second token of the same daemon as another user's key.
fn e2b_client(d: &Daemon, program: &Path) -> Command {
    let other = d.new_token("another-user", false);
    let mut c = d.e2b_url_client(program, &d.token);
    // Volumes' content API is E2B's own variable in URL mode (api.DOMAIN in domain mode).
    c.env("E2B_OTHER_KEY", other)
        .env("E2B_VOLUME_API_URL", &d.tcp);
    c
}

/// The Python SDK's synchronous scenario on a home that holds nothing but the guest kernel:
/// the daemon starts building E2B's `base` template (Debian, Python, Node, git, user `user`)
/// from forkbox's own recipe as it starts, `forkbox image ls` shows the build under way, the
/// first create answers within the SDK's own request timeout saying how far the build is, and
/// once it is built every call of the scenario runs on it.
#[test]
fn python_sdk_newest_on_a_fresh_home() {
    let python = infra::e2b_python("e2b-venv-newest", "e2b", "e2b");
    let paths = infra::fresh_home("e2b-first-day", false);
    stop_daemon_of(&paths);
    // A create waits a second for the build (30 s by default): the build under way is what
    // the first create meets, however fast this host builds.
    let d = Daemon::start_in(paths, &["--e2b-prebuild", "base", "--e2b-create-wait", "1"]);
    let mut shown = String::new();
    let building = infra::wait_until(std::time::Duration::from_secs(120), || {
        let o = forkbox(&d.paths).args(["image", "ls"]).output().unwrap();
        shown = String::from_utf8_lossy(&o.stdout).into_owned();
        shown
            .lines()
            .any(|l| l.starts_with("base ") && l.contains("building: "))
    });
    assert!(
        building,
        "`forkbox image ls` showed no build of base under way:\n{shown}"
    );
    let out = d.check(
        e2b_client(&d, &python)
            .env("E2B_FIRST_CREATE_WAIT", "1200")
            .arg(scenario("scenario.py"))
            .arg("sync"),
        "e2b (Python, newest) sync scenario on a fresh home",
    );
    // The first create came back with the build's progress, not past the SDK's 60 s.
    assert!(
        out.contains("not ready: ") && out.contains("template base is not ready yet"),
        "{out}"
    );
    assert!(out.contains("all sync steps passed"), "{out}");
    assert!(out.contains("another key neither sees"), "{out}");
    d.assert_nothing_left();
}

/// The Python SDK's asynchronous scenario, newest version, and the synchronous one on 2.50.0
/// (the v1 create and connect paths), against one daemon.
#[test]
fn python_sdk_async_and_the_v1_paths() {
    infra::image(&infra::home(), "base");
    let newest = infra::e2b_python("e2b-venv-newest", "e2b", "e2b");
    let v250 = infra::e2b_python("e2b-venv-2.50", "e2b==2.50.0", "e2b");
    // The example's template (an image and its saved sandbox) stays in this home alone.
    let paths = infra::isolated_home("e2b-python");
    infra::own_images(&paths);
    let d = Daemon::start_in(paths.clone(), &[]);
    let out = d.check(
        e2b_client(&d, &newest)
            .arg(scenario("scenario.py"))
            .arg("async"),
        "e2b (Python, newest) async scenario",
    );
    assert!(out.contains("all async steps passed"), "{out}");
    let out = d.check(
        e2b_client(&d, &v250)
            .arg(scenario("scenario.py"))
            .arg("sync"),
        "e2b (Python, 2.50.0) sync scenario",
    );
    assert!(out.contains("all sync steps passed"), "{out}");
    // docs/e2b.md's template example, as it is.
    let example = infra::repo_root().join("examples/e2b/template.py");
    let out = d.check(
        e2b_client(&d, &newest).arg(&example),
        "docs/e2b.md's E2B template example",
    );
    assert!(out.contains("hello from a template"), "{out}");
    d.assert_nothing_left();
    drop(d);
    infra::drop_own_images(&paths);
}

/// The JavaScript SDK's scenario, newest version and 2.50.0, against one daemon.
#[test]
fn javascript_sdk_newest_and_the_v1_paths() {
    infra::image(&infra::home(), "base");
    let d = Daemon::start("e2b-js");
    for version in ["latest", "2.50.0"] {
        let dir = infra::e2b_npm("e2b", version);
        std::fs::copy(scenario("scenario.mjs"), dir.join("scenario.mjs")).unwrap();
        let out = d.check(
            e2b_client(&d, Path::new("node"))
                .arg("scenario.mjs")
                .current_dir(&dir),
            &format!("e2b (JavaScript, {version}) scenario"),
        );
        assert!(out.contains("all js steps passed"), "{out}");
    }
    d.assert_nothing_left();
}

/// E2B's domain mode, as the newest Python SDK's docs point users to (its URL variables are
/// deprecated): only `E2B_DOMAIN` and `E2B_API_KEY`. The daemon listens on port 443 of the
/// host's end of a network namespace and answers `api.e2b.test` and `PORT-ID.e2b.test` over
/// TLS with its own CA's certificate; inside the namespace a `dnsmasq` the test runs resolves
/// `*.e2b.test` to it, and the SDK trusts the CA by `SSL_CERT_FILE`. The scenario then also
/// reaches a server in the guest through `get_host`.
#[test]
fn python_sdk_in_domain_mode_over_tls() {
    infra::image(&infra::home(), "base");
    let python = infra::e2b_python("e2b-venv-newest", "e2b", "e2b");
    let dm = DomainMode::start("e2b-domain", "e2b.test");
    let other = dm.daemon.new_token("another-user", false);
    let mut cmd = dm.client(&python, &dm.daemon.token);
    cmd.arg(scenario("scenario.py"))
        .arg("sync")
        .env("E2B_OTHER_KEY", other)
        .current_dir(infra::repo_root());
    let out = dm
        .daemon
        .check(&mut cmd, "e2b (Python, newest) in domain mode");
    assert!(out.contains("all sync steps passed"), "{out}");
    assert!(out.contains("get_host(8080) reaches"), "{out}");
    let queries = std::fs::read_to_string(&dm.dns_log).unwrap_or_default();
    assert!(
        queries.contains("api.e2b.test"),
        "the SDK did not ask the test's resolver:\n{queries}"
    );
    dm.daemon.assert_nothing_left();
}

/// An agent framework's E2B adapter, unchanged: the OpenAI Agents SDK's E2B sandbox client
/// (`openai-agents[e2b]` from PyPI, which brings its own, older `e2b`) drives a forkbox sandbox
/// through its session layer without a model. That `e2b` checks the key's shape, so the key is
/// a token made with `forkbox token create --e2b`.
#[test]
fn openai_agents_e2b_sandbox_client() {
    infra::image(&infra::home(), "base");
    let python = infra::e2b_python(
        "openai-agents-venv",
        "openai-agents[e2b]",
        "agents.extensions.sandbox.e2b",
    );
    let d = Daemon::start("e2b-openai-agents");
    let key = d.new_token("agents", true);
    assert!(key.starts_with("e2b_"), "{key}");
    let out = d.check(
        e2b_client(&d, &python)
            .env("E2B_API_KEY", &key)
            .arg(scenario("openai_agents.py")),
        "the OpenAI Agents SDK's E2B sandbox client",
    );
    assert!(out.contains("openai-agents e2b session passed"), "{out}");
    d.assert_nothing_left();
}

/// E2B's Template SDK, unchanged (`e2b` from PyPI): a template built again with the same steps,
/// files and base is the first build's image (the build's log says `CACHED`, no step runs),
/// `skip_cache=True` builds it anew, and a sandbox of it has what its steps made.
#[test]
fn a_template_built_again_unchanged_is_cached() {
    infra::image(&infra::home(), "base");
    let python = infra::e2b_python("e2b-venv-newest", "e2b", "e2b");
    let d = Daemon::start("e2b-template-cache");
    let folder = tempfile::tempdir().unwrap();
    let name = format!("cache-{}", std::process::id());
    let out = d.check(
        e2b_client(&d, &python)
            .arg(scenario("template_cache.py"))
            .arg(&name)
            .arg(folder.path()),
        "a template built again",
    );
    assert!(out.contains("template cache passed"), "{out}");
    d.assert_nothing_left();
}

/// Builds the `code-interpreter` image ahead for daemon `d`, as docs/e2b.md says (E2B's SDK does
/// not wait minutes for a create), through the daemon rather than under the fixtures' lock,
/// which other tests wait on meanwhile (the tests that need it are one group: one builds it).
fn code_interpreter_built(d: &Daemon) {
    let built = forkbox(&d.paths)
        .args(["image", "build", "--if-changed", "-f"])
        .arg(infra::repo_root().join("images/code-interpreter.toml"))
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
}

/// Code cells from every client, on one daemon: E2B's code interpreter SDKs
/// (`e2b-code-interpreter` from PyPI, `@e2b/code-interpreter` from npm), unchanged, whose
/// default template `code-interpreter-v1` is forkbox's `code-interpreter` image with forkbox's
/// server on port 49999 (reached through the sandbox URL with `E2b-Sandbox-Port`): cells keep
/// state, stream, plot, fail with tracebacks, run in contexts and in bash, a fork between
/// cells gives copies with the kernel's state, 10 sandboxes run cells at once. Then forkbox's
/// own Python and TypeScript SDKs (`run_code`, where the first cell starts the server) with
/// hostile cells (endless output, a memory hog, a fork bomb), and the MCP tool `run_code`
/// through the official client. The image is built once per machine (minutes).
#[test]
fn code_interpreter_from_every_client() {
    let python = infra::e2b_python(
        "e2b-code-interpreter-venv",
        "e2b-code-interpreter",
        "e2b_code_interpreter",
    );
    let sdk_python = infra::sdk_python();
    let mcp_python = infra::mcp_python();
    let sdk_ts = infra::npm_ready("sdk/typescript");
    let d = Daemon::start("e2b-interpreter");
    code_interpreter_built(&d);
    let out = d.check(
        e2b_client(&d, &python).arg(scenario("interpreter.py")),
        "e2b-code-interpreter (Python, newest)",
    );
    assert!(out.contains("code interpreter passed"), "{out}");
    let dir = infra::e2b_npm("@e2b/code-interpreter", "latest");
    std::fs::copy(scenario("interpreter.mjs"), dir.join("interpreter.mjs")).unwrap();
    let out = d.check(
        e2b_client(&d, Path::new("node"))
            .arg("interpreter.mjs")
            .current_dir(&dir),
        "@e2b/code-interpreter (JavaScript, latest)",
    );
    assert!(out.contains("js code interpreter passed"), "{out}");
    let cells = infra::repo_root().join("crates/cli/tests/cells");
    let out = d.check(
        d.client(&sdk_python)
            .arg(cells.join("cells.py"))
            .arg("--hostile"),
        "forkbox's Python SDK: run_code",
    );
    assert!(out.contains("forkbox python cells passed"), "{out}");
    let out = d.check(
        d.client(Path::new("node"))
            .arg(cells.join("cells.mjs"))
            .env("FORKBOX_TS_SDK", sdk_ts.join("dist/index.js")),
        "forkbox's TypeScript SDK: runCode",
    );
    assert!(out.contains("forkbox typescript cells passed"), "{out}");
    let out = d.check(
        d.client(&mcp_python)
            .arg(infra::repo_root().join("crates/mcp/tests/mcp_client.py"))
            .arg("code")
            .arg(format!("{}/mcp", d.tcp))
            .arg(&d.token),
        "the MCP tool run_code",
    );
    assert!(out.contains("mcp run_code passed"), "{out}");
    d.assert_nothing_left();
}

/// Agent frameworks that build on E2B, unchanged, each driven without a model by calling its
/// sandbox layer: smolagents' E2B executor (PyPI `smolagents[e2b]`; two cells sharing a
/// variable on the code interpreter) and langchain-e2b's Deep Agents sandbox (a command and
/// files on the `base` template). (The OpenAI Agents SDK's client has a test of its own.)
#[test]
fn agent_frameworks_on_e2b() {
    infra::image(&infra::home(), "base");
    let smol = infra::e2b_python(
        "smolagents-venv",
        "smolagents[e2b]",
        "smolagents.remote_executors",
    );
    let lc = infra::e2b_python("langchain-e2b-venv", "langchain-e2b", "langchain_e2b");
    let d = Daemon::start("e2b-frameworks");
    code_interpreter_built(&d);
    let out = d.check(
        e2b_client(&d, &smol)
            .arg(scenario("frameworks.py"))
            .arg("smolagents"),
        "smolagents' E2B executor",
    );
    assert!(out.contains("smolagents e2b executor passed"), "{out}");
    let out = d.check(
        e2b_client(&d, &lc)
            .arg(scenario("frameworks.py"))
            .arg("langchain"),
        "langchain-e2b's sandbox",
    );
    assert!(out.contains("langchain-e2b sandbox passed"), "{out}");
    d.assert_nothing_left();
}

/// A volume's file system is the guest's to write: one made corrupt (its superblock, then its
/// inode tables, overwritten on the host as a hostile guest could have left them) and read
/// through E2B's content API fails in words, harming nothing: the host mounts nothing, the
/// daemon serves on, and the volume is destroyed as any other.
#[test]
fn a_corrupt_volume_read_through_the_content_api_harms_nothing() {
    const STEP: &str = r#"
import sys, e2b
step, name = sys.argv[1], sys.argv[2]
if step == "make":
    vol = e2b.Volume.create(name)
    vol.write_file("/a.txt", "before")
    # A sandbox that mounts it makes the helper leave; once it is gone nothing holds it.
    s = e2b.Sandbox.create(template="base", timeout=120, volume_mounts={"/v": vol})
    assert s.files.read("/v/a.txt") == "before"
    s.kill()
    print("volume", vol.volume_id)
elif step == "read":
    vol = e2b.Volume.connect(sys.argv[3])
    try:
        print("read", vol.read_file("/a.txt"))
    except (e2b.VolumeException, e2b.NotFoundException) as e:
        print("refused", type(e).__name__, e)
else:
    print("destroyed", e2b.Volume.destroy(sys.argv[3]))
"#;
    let python = infra::e2b_python("e2b-venv-newest", "e2b", "e2b");
    let d = Daemon::start("e2b-corrupt-volume");
    let run = |args: &[&str]| {
        d.check(
            e2b_client(&d, &python).args(["-c", STEP]).args(args),
            "a corrupt volume's step",
        )
    };
    // The inode tables and bitmaps of one volume (its superblock still says ext4), the
    // superblock of another; each read by a helper that mounts it then.
    // (A 1 GiB ext4 keeps its bitmaps and inode tables well within its first 64 MiB.)
    for (what, at, len, byte) in [
        ("inode tables", 1u64 << 20, 63usize << 20, None),
        ("superblock", 1024, 1024, Some(0xffu8)),
    ] {
        let name = format!("corrupt-{}-{}", std::process::id(), at);
        let out = run(&["make", &name]);
        let id = out
            .lines()
            .find_map(|l| l.strip_prefix("volume "))
            .unwrap()
            .trim()
            .to_string();
        let disk = d.paths.home().join("volumes").join(&id).join("disk.ext4");
        {
            use std::io::{Seek, Write};
            let mut f = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
            f.seek(std::io::SeekFrom::Start(at)).unwrap();
            let junk: Vec<u8> = match byte {
                Some(b) => vec![b; len],
                None => (0..len).map(|i| (i * 7919 % 251) as u8).collect(),
            };
            f.write_all(&junk).unwrap();
        }
        let out = run(&["read", &name, &id]);
        assert!(out.contains("refused"), "{what}: {out}");
        println!("{what} spoilt: {}", out.trim());
        // Nothing on the host mounts it or puts a loop device on it.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(&id), "{mounts}");
        let loops = Command::new("losetup")
            .arg("-j")
            .arg(&disk)
            .output()
            .unwrap();
        assert!(
            loops.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&loops.stdout)
        );
        let out = run(&["destroy", &name, &id]);
        assert!(out.contains("destroyed True"), "{out}");
        assert!(!disk.exists());
    }
    d.assert_nothing_left();
}
