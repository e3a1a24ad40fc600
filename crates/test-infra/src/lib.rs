//! Shared helpers for tests that boot real VMs.
//!
//! All such tests use one forkbox home (`FORKBOX_TEST_HOME`, default `/var/tmp/forkbox-test`),
//! so the guest kernel and the images are made once per machine and shared by every test and
//! every later run. Making them is serialised with a file lock, because the test runner may
//! start tests in parallel processes.
//!
//! Costs here (TCG, 2 cores): kernel download and unpack ~15 s once; the `python-bookworm`
//! image ~40 s once; every VM boot ~4-5 s.
#![forbid(unsafe_code)]

pub mod cluster_net;
pub mod etcd;
pub mod npm;
pub mod registry;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use forkbox_engine::image::{self, ImageRef, ImageStore, Recipe};
use forkbox_engine::paths::Paths;
use forkbox_protocol::{ExecSpec, Program};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// The test home, with a guest kernel installed.
pub fn home() -> Paths {
    let dir = std::env::var_os("FORKBOX_TEST_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/tmp/forkbox-test".into());
    let paths = Paths::new(dir);
    paths.secure_home().expect("make the test home private");
    with_lock(&paths, || {
        if forkbox_engine::kernel::Kernel::newest(&paths).is_err() {
            eprintln!(
                "test-infra: installing the guest kernel into {} (once per machine)",
                paths.home().display()
            );
            forkbox_engine::setup::setup(
                &paths,
                forkbox_engine::setup::QemuSource::Recent,
                &mut |l| eprintln!("test-infra: {l}"),
            )
            .expect("forkbox setup for the test home");
        }
    });
    paths
}

fn with_lock<T>(paths: &Paths, f: impl FnOnce() -> T) -> T {
    // In cache/, which an isolated home shares with the test home (a link, as its images and
    // templates): every home that shares the fixtures takes the same lock. (A lock in each
    // home's own directory let two isolated homes make one shared fixture at once, the second
    // truncating the file while the first read it.)
    let dir = paths.home().join("cache");
    std::fs::create_dir_all(&dir).expect("create the fixtures' cache");
    let file = std::fs::File::create(dir.join(".test-fixtures.lock")).expect("create fixture lock");
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("lock fixtures");
    f()
}

/// The image built from `images/<recipe>.toml`, built first if the test home lacks it.
pub fn image(paths: &Paths, recipe: &str) -> ImageRef {
    image_from(
        paths,
        &repo_root().join("images").join(format!("{recipe}.toml")),
    )
}

/// The image of the recipe file `file`, built once per machine and recipe (as [`image`]).
pub fn image_from(paths: &Paths, file: &Path) -> ImageRef {
    let (recipe, text) = Recipe::load(file).expect("load recipe");
    let store = ImageStore::new(paths);
    with_lock(paths, || {
        let wanted = ImageRef {
            name: recipe.name.clone(),
            version: None,
        };
        match store.resolve(&wanted) {
            Ok(img) if same_recipe(&store, &img.meta.recipe, &recipe) => {}
            _ => {
                eprintln!(
                    "test-infra: building image {} (once per machine and recipe)",
                    recipe.name
                );
                // A build with steps runs its own runtime: on a thread of its own, so that
                // async tests may call this too.
                std::thread::scope(|s| {
                    s.spawn(|| image::build(paths, &recipe, &text, &mut |_| {}))
                        .join()
                        .expect("the build thread")
                })
                .expect("build test image");
            }
        }
        ImageRef {
            name: recipe.name.clone(),
            version: None,
        }
    })
}

/// Whether an image built from `built` (as its build pinned it) is what `recipe` asks for: a
/// recipe on another image records that image as NAME@N, without a suite of its own, and is
/// built again when that image has a newer version.
fn same_recipe(store: &ImageStore, built: &Recipe, recipe: &Recipe) -> bool {
    let newest = |base: &str| {
        base.parse::<ImageRef>()
            .ok()
            .and_then(|r| store.resolve(&r).ok())
            .map(|img| img.reference())
    };
    match (&built.base, &recipe.base) {
        (Some(pinned), Some(base)) if newest(base).as_ref() == Some(pinned) => {
            let mut unpinned = built.clone();
            unpinned.base = recipe.base.clone();
            unpinned.suite = recipe.suite.clone();
            unpinned == *recipe
        }
        _ => built == recipe,
    }
}

/// Puts the calling thread (and every process it starts from now on: daemons, CLIs, builds)
/// in a mount namespace of its own, nothing propagating to or from the host: what a test
/// mounts there is never visible on the host and goes with the test's processes, however the
/// test ends. (Namespaces are per thread; a test's own thread is the one that calls this.)
pub fn private_mounts() {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .expect("a mount namespace of the test's own (tests run as root)");
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .expect("make the test's mounts private");
}

/// `mmdebstrap` in mount and PID namespaces of its own, as forkbox's own builds run it
/// ([`forkbox_engine::image::contained`]): as root it binds the host's `/dev/shm`, `/proc` and
/// `/sys` into the root it makes and, killed, unmounts nothing; here its mounts are never on the
/// host and every process of it dies with the first. Remove what a killed one left with
/// [`forkbox_engine::tree::remove_tree`].
pub fn mmdebstrap() -> std::process::Command {
    image::contained(Path::new("mmdebstrap")).expect("util-linux's unshare (forkbox setup)")
}

/// A home that holds nothing from an earlier run (made anew at each call), as a new node's:
/// only the guest kernel is shared (what `forkbox setup` installs once per host), and with
/// `with_images` the test home's images (a node that has built them). Stop any daemon of the
/// home before calling this.
pub fn fresh_home(name: &str, with_images: bool) -> Paths {
    let shared = home();
    if with_images {
        image(&shared, "python-bookworm");
    }
    let dir = shared.home().join("fresh").join(name);
    if dir.exists() {
        forkbox_engine::tree::remove_tree(&dir).expect("remove the fresh home of an earlier run");
    }
    std::fs::create_dir_all(&dir).expect("create a fresh home");
    let shared_dirs: &[&str] = if with_images {
        &["kernels", "images"]
    } else {
        &["kernels"]
    };
    for sub in shared_dirs {
        std::os::unix::fs::symlink(shared.home().join(sub), dir.join(sub))
            .expect("link the kernel (and images) into a fresh home");
    }
    Paths::new(dir)
}

/// A home of its own (own `run/`, daemon socket and state) that shares the test home's kernels,
/// images and caches: for tests that must not see each other's sandboxes or daemon.
pub fn isolated_home(name: &str) -> Paths {
    let shared = home();
    image(&shared, "python-bookworm");
    let dir = shared.home().join("homes").join(name);
    std::fs::create_dir_all(&dir).expect("create isolated home");
    for sub in ["kernels", "images", "cache", "templates"] {
        // The shared directory must exist before it is linked: a dangling link makes the
        // first write through it fail (EEXIST from create_dir_all).
        std::fs::create_dir_all(shared.home().join(sub)).expect("create shared fixtures");
        let link = dir.join(sub);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(shared.home().join(sub), &link)
                .expect("link shared fixtures");
        }
    }
    Paths::new(dir)
}

/// Gives isolated home `paths` images and templates of its own before its daemon starts: its
/// `images` a directory of links to each of the test home's images (what it builds stays its
/// own), its `templates` empty. For a suite whose tests build images nobody removes (E2B's
/// template tests): [`drop_own_images`] takes them away after it.
pub fn own_images(paths: &Paths) {
    let shared = home();
    for sub in ["images", "templates"] {
        let dir = paths.home().join(sub);
        if dir
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
        {
            std::fs::remove_file(&dir).expect("unlink the shared directory");
        }
        std::fs::create_dir_all(&dir).expect("make a directory of the home's own");
    }
    for e in std::fs::read_dir(shared.images())
        .into_iter()
        .flatten()
        .flatten()
    {
        let link = paths.images().join(e.file_name());
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(e.path(), &link).expect("link a shared image");
        }
    }
}

/// Removes what [`own_images`] gave a home once its daemon has stopped: the images built in
/// it (not the links to the shared ones) and its templates.
pub fn drop_own_images(paths: &Paths) {
    for e in std::fs::read_dir(paths.images())
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            forkbox_engine::tree::remove_tree(&e.path()).expect("remove an image a suite built");
        }
    }
    for e in std::fs::read_dir(paths.templates())
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            forkbox_engine::fastram::remove_snapshot_dir(&e.path()).expect("remove a template");
        }
    }
}

/// The shared test home and the default sandbox configuration on the image built from
/// `images/<recipe>.toml`.
pub fn sandbox_setup(recipe: &str) -> (Paths, forkbox_engine::sandbox::SandboxConfig) {
    let paths = home();
    let image = image(&paths, recipe);
    (
        paths,
        forkbox_engine::sandbox::SandboxConfig {
            image,
            ..Default::default()
        },
    )
}

/// Polls `f` until it returns true or `limit` passes; returns whether it did.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// PIDs of processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

/// QEMU processes running a sandbox of this home.
pub fn qemus_of(paths: &Paths) -> Vec<u32> {
    processes_mentioning(&paths.run().display().to_string())
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("qemu"))
        })
        .collect()
}

/// Entries under the home's `run/` directory (live sandboxes' files).
pub fn run_entries(paths: &Paths) -> Vec<String> {
    std::fs::read_dir(paths.run())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// `sh -c SCRIPT` with an optional timeout.
pub fn sh(script: &str, timeout_ms: Option<u64>) -> ExecSpec {
    ExecSpec {
        program: Program::Shell(script.into()),
        cwd: None,
        env: vec![],
        timeout_ms,
        stdin: false,
        tty: None,
        user: None,
    }
}

/// `argv` run directly, with `env` over the image's and a timeout.
pub fn argv(argv: &[&str], env: &[(&str, &str)], timeout_ms: u64) -> ExecSpec {
    ExecSpec {
        program: Program::Argv(argv.iter().map(|a| a.to_string()).collect()),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        timeout_ms: Some(timeout_ms),
        ..sh("", None)
    }
}

/// A network namespace of the test's own, joined to the host by a veth pair: the host end has
/// `host_ip`, the namespace end has `peer_ips` (two addresses), listeners started with
/// [`TestNet::serve`] run inside it. Nothing here touches any other network; all of it is
/// removed on drop. Needs root and `ip` (iproute2).
pub struct TestNet {
    pub name: String,
    pub host_if: String,
    pub host_ip: String,
    pub peer_ips: [String; 2],
    servers: Vec<std::process::Child>,
}

pub(crate) fn ip(args: &[&str]) {
    let st = std::process::Command::new("ip")
        .args(args)
        .status()
        .expect("run `ip` (iproute2)");
    assert!(st.success(), "ip {args:?} failed");
}

/// `ip ARGS` whose failure is expected and not shown (removing what may not be there).
pub(crate) fn ip_quiet(args: &[&str]) {
    let _ = std::process::Command::new("ip")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status();
}

/// Removes namespace `ns` and host link `link` if a dead process left them.
fn clear_stale(ns: &str, link: &str) {
    ip_quiet(&["link", "del", link]);
    ip_quiet(&["netns", "del", ns]);
}

/// A `10.A.B` /24 that no address of the host's namespace is in, the first from `seed` on.
fn free_subnet(seed: u32) -> String {
    let out = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .expect("run `ip` (iproute2)");
    let used = String::from_utf8_lossy(&out.stdout).into_owned();
    (0..20_000u32)
        .map(|i| {
            let k = (seed + i) % 20_000;
            format!("10.{}.{}", 100 + k % 100, k / 100)
        })
        .find(|net| !used.contains(&format!(" {net}.")))
        .expect("a free 10.x.y.0/24 for a test network")
}

impl TestNet {
    pub fn new() -> TestNet {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let pid = std::process::id();
        // The whole pid (in hex, to fit an interface name's 15 bytes): no living process
        // shares it, so a namespace or link of this name is a leftover of a dead one (a test
        // killed before its drop) and is cleared.
        let name = format!("fbx{pid:x}n{n}");
        let (host_if, peer_if) = (format!("{name}h"), format!("{name}p"));
        clear_stale(&name, &host_if);
        let net = free_subnet(pid + n);
        let host_ip = format!("{net}.1");
        let peer_ips = [format!("{net}.2"), format!("{net}.3")];
        ip(&["netns", "add", &name]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if, "netns", &name,
        ]);
        ip(&["addr", "add", &format!("{host_ip}/24"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        for a in &peer_ips {
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{a}/24"),
                "dev",
                &peer_if,
            ]);
        }
        ip(&["-n", &name, "link", "set", &peer_if, "up"]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        TestNet {
            name,
            host_if,
            host_ip,
            peer_ips,
            servers: Vec::new(),
        }
    }

    /// Serves `dir` over HTTP on `addr`:`port` inside the namespace; its request log (one
    /// line per request) goes to the returned file.
    pub fn serve(&mut self, addr: &str, port: u16, dir: &std::path::Path) -> PathBuf {
        let log = dir.join(format!("{addr}-{port}.log"));
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &self.name, "python3", "-m", "http.server"])
            .args(["--bind", addr, &port.to_string(), "--directory"])
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create server log"))
            .spawn()
            .expect("start a test HTTP server");
        self.servers.push(child);
        // The readiness probe only connects: http.server logs nothing for it.
        self.wait_listening(addr, port, "test server");
        log
    }

    /// Runs `program` with `args` inside the namespace as a server that listens on
    /// `addr`:`port` (stopped with the namespace); its output goes to `log`.
    pub fn run_server(
        &mut self,
        program: &str,
        args: &[&str],
        addr: &str,
        port: u16,
        log: &std::path::Path,
    ) {
        let out = std::fs::File::create(log).expect("create server log");
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .stdout(out.try_clone().expect("a log handle"))
            .stderr(out)
            .spawn()
            .expect("start a test server");
        self.servers.push(child);
        self.wait_listening(addr, port, program);
    }

    /// Waits until something in the namespace accepts connections on `addr`:`port`.
    fn wait_listening(&self, addr: &str, port: u16, what: &str) {
        assert!(
            wait_until(Duration::from_secs(10), || {
                std::process::Command::new("ip")
                    .args(["netns", "exec", &self.name, "python3", "-c"])
                    .arg(format!(
                        "import socket; socket.create_connection(('{addr}', {port}), 1)"
                    ))
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            }),
            "the {what} on {addr}:{port} did not come up"
        );
    }

    /// A listener on `addr`:`port` inside the namespace that accepts connections and never
    /// reads from them: a remote that makes every sender buffer.
    pub fn tarpit(&mut self, addr: &str, port: u16) {
        let script = format!(
            "import socket, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)\ns.bind(('{addr}', {port}))\ns.listen(512)\nkept = []\nwhile True:\n    c, _ = s.accept()\n    kept.append(c)\n"
        );
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &self.name, "python3", "-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start a test tarpit");
        self.servers.push(child);
        self.wait_listening(addr, port, "tarpit");
    }
}

impl Default for TestNet {
    fn default() -> Self {
        TestNet::new()
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for c in &mut self.servers {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs `cmd` and panics with its output when it fails.
fn must(cmd: &mut std::process::Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fingerprint of the files under `dir` (names, sizes, modification times), skipping
/// `skip` names: whether a prepared toolchain still matches its sources.
fn fingerprint(dir: &Path, skip: &[&str]) -> String {
    let mut rows = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if skip.contains(&name.as_str()) {
                continue;
            }
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                let mtime = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                rows.push(format!("{} {} {mtime}", e.path().display(), m.len()));
            }
        }
    }
    rows.sort();
    rows.join("\n")
}

/// Runs `prepare` unless `marker` records the same fingerprint of `sources`; records it after.
/// Tests running at once share what is prepared, and none rebuilds it under another's feet.
fn prepared(marker: &Path, sources: &Path, skip: &[&str], prepare: impl FnOnce()) {
    let now = fingerprint(sources, skip);
    if std::fs::read_to_string(marker).is_ok_and(|m| m == now) {
        return;
    }
    prepare();
    std::fs::write(marker, now).expect("record the prepared toolchain");
}

/// The Python of a virtual environment (in the test home) with the Python SDK installed from
/// `sdk/python` and pytest, both from PyPI; made once per machine and reinstalled when the
/// SDK's files change.
pub fn sdk_python() -> PathBuf {
    let paths = home();
    let venv = paths.home().join("sdk-venv");
    let python = venv.join("bin/python");
    let sdk = repo_root().join("sdk/python");
    with_lock(&paths, || {
        if !python.exists() {
            let _ = std::fs::remove_file(venv.join(".forkbox-sdk"));
            must(
                std::process::Command::new("python3")
                    .args(["-m", "venv"])
                    .arg(&venv),
                "python3 -m venv",
            );
        }
        prepared(
            &venv.join(".forkbox-sdk"),
            &sdk,
            &["__pycache__", "build", "forkbox.egg-info"],
            || {
                must(
                    std::process::Command::new(&python)
                        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
                        .arg(format!("{}[test]", sdk.display())),
                    "pip install ./sdk/python[test]",
                )
            },
        );
    });
    python
}

/// `npm ci` (which builds the SDK through its `prepare` script) in `dir` of the repository,
/// again only when its files change; the directory.
pub fn npm_ready(dir: &str) -> PathBuf {
    let paths = home();
    let dir = repo_root().join(dir);
    with_lock(&paths, || {
        let marker = paths.home().join(format!(
            ".npm-{}",
            dir.display().to_string().replace('/', "_")
        ));
        // What `npm ci` makes must still be there (a clean checkout has neither).
        let built = dir.join("node_modules").exists()
            && (!dir.join("src").exists() || dir.join("dist/index.js").exists());
        if !built {
            let _ = std::fs::remove_file(&marker);
        }
        prepared(&marker, &dir, &["node_modules", "dist"], || {
            must(
                std::process::Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                    .current_dir(&dir),
                &format!("npm ci in {}", dir.display()),
            )
        });
    });
    dir
}

/// The Python of a virtual environment (in the test home) with the official MCP client
/// (`mcp` from PyPI); made once per machine.
pub fn mcp_python() -> PathBuf {
    python_venv("mcp-venv", "import mcp, httpx2", &["mcp"])
}

/// The Python of a virtual environment (in the test home) with `kubernetes-validate` from PyPI
/// (Kubernetes' schemas, offline) and PyYAML; made once per machine.
pub fn kube_python() -> PathBuf {
    python_venv(
        "kube-venv",
        "import kubernetes_validate, yaml",
        &["kubernetes-validate", "PyYAML"],
    )
}

/// The Python of a virtual environment (in the test home) with E2B's published SDK from PyPI:
/// `spec` is a pip requirement (`e2b`, the newest; `e2b==2.50.0`, the last on the v1 paths;
/// `openai-agents[e2b]`, a framework that brings its own), `module` one it must import.
/// `name` tells the environments apart; made once per machine.
pub fn e2b_python(name: &str, spec: &str, module: &str) -> PathBuf {
    python_venv(name, &format!("import {module}"), &[spec])
}

/// E2B's own test suites, unchanged (`FORKBOX_E2B_SUITES`, else `../shared/e2b-suites` beside
/// the repository), when this machine has them.
pub fn e2b_suites() -> Option<PathBuf> {
    let dir = match std::env::var_os("FORKBOX_E2B_SUITES") {
        Some(d) => PathBuf::from(d),
        None => repo_root().join("../shared/e2b-suites"),
    };
    dir.join("python-sdk/pytest.ini").exists().then_some(dir)
}

/// The Python that runs E2B's Python SDK suite: `e2b` at the suite's release and the suite's
/// test dependencies (its `pyproject.toml`'s dev group), from PyPI; made once per machine.
pub fn e2b_suite_python() -> PathBuf {
    python_venv(
        "e2b-suite-venv-2.45.1",
        "import e2b, pytest, xdist, pytest_asyncio, pytest_timeout, dotenv\n\
         from importlib.metadata import version\n\
         assert version('e2b') == '2.45.1'",
        &[
            "e2b==2.45.1",
            "pytest>=9.0.3,<10",
            "pytest-xdist>=3.3.1,<4",
            "python-dotenv>=1.0.0,<2",
            "pytest-dotenv>=0.5.2,<0.6",
            "pytest-asyncio>=1.3.0,<2",
            "pytest-timeout>=2.4.0,<3",
        ],
    )
}

/// The Python that runs E2B's code-interpreter suite: `e2b-code-interpreter` 2.9.1 with the
/// `e2b` of its lock file (2.39.1) and its test dependencies (its `pyproject.toml`'s dev
/// group), from PyPI; made once per machine.
pub fn e2b_code_interpreter_suite_python() -> PathBuf {
    python_venv(
        "e2b-code-interpreter-suite-venv-2.9.1",
        "import e2b_code_interpreter, pytest, xdist, pytest_asyncio, dotenv, matplotlib\n\
         from importlib.metadata import version\n\
         assert version('e2b-code-interpreter') == '2.9.1' and version('e2b') == '2.39.1'",
        &[
            "e2b-code-interpreter==2.9.1",
            "e2b==2.39.1",
            "pytest>=9.0.3,<10",
            "pytest-xdist>=3.6.1,<4",
            "python-dotenv>=1.0.0,<2",
            "pytest-dotenv>=0.5.2,<0.6",
            "pytest-asyncio>=1.3.0,<2",
            "matplotlib>=3.8.0,<4",
        ],
    )
}

/// The dev dependencies of E2B's JavaScript SDK its node test projects import (beside its
/// own dependencies): the rest serve its browser, Cloudflare and build tooling.
const E2B_JS_TEST_DEPS: &[&str] = &["vitest", "msw", "dotenv", "error-stack-parser-es"];

/// A directory (in the test home) whose `node_modules` holds what E2B's JavaScript SDK suite
/// in `sdk` (its `packages/js-sdk`) needs to run its node projects: the SDK's dependencies and
/// the test dependencies above, at the ranges its `package.json` gives, and its own release of
/// that version (whose `dist` is that source built), from the npm registry; made once per
/// machine and suite version.
pub fn e2b_suite_js(sdk: &Path) -> PathBuf {
    let paths = home();
    let theirs: serde_json::Value = serde_json::from_slice(
        &std::fs::read(sdk.join("package.json")).expect("the suite's package.json"),
    )
    .expect("the suite's package.json is JSON");
    let mut deps = theirs["dependencies"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for d in E2B_JS_TEST_DEPS {
        let range = theirs["devDependencies"][*d].clone();
        assert!(range.is_string(), "the suite's package.json names no {d}");
        deps.insert((*d).to_string(), range);
    }
    let version = theirs["version"].as_str().unwrap_or("unknown");
    // Its published build (`dist`, which its bundle test reads): that source, built.
    deps.insert("e2b".into(), serde_json::json!(version));
    let ours = serde_json::json!({"name": "e2b-suite-js", "private": true, "dependencies": deps});
    let ours = serde_json::to_string_pretty(&ours).unwrap_or_default();
    let dir = paths.home().join(format!("e2b-suite-js-{version}"));
    with_lock(&paths, || {
        let made = std::fs::read_to_string(dir.join("package.json")).ok() == Some(ours.clone());
        if made && dir.join("node_modules/vitest/package.json").exists() {
            return;
        }
        std::fs::create_dir_all(&dir).expect("create the suite's npm directory");
        std::fs::write(dir.join("package.json"), &ours).expect("write package.json");
        must(
            std::process::Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(&dir),
            "npm install (E2B's JavaScript suite's dependencies)",
        );
    });
    dir
}

/// A directory (in the test home) whose `node_modules` holds npm package `package` (E2B's
/// published `e2b`, `@e2b/code-interpreter`) at `version` (`latest`, `2.50.0`), from the npm
/// registry; made once per machine.
pub fn e2b_npm(package: &str, version: &str) -> PathBuf {
    let paths = home();
    let name = package.replace(['@', '/'], "_");
    let dir = paths.home().join(format!("npm-{name}-{version}"));
    with_lock(&paths, || {
        if dir
            .join("node_modules")
            .join(package)
            .join("package.json")
            .exists()
        {
            return;
        }
        std::fs::create_dir_all(&dir).expect("create the npm directory");
        std::fs::write(
            dir.join("package.json"),
            "{\"name\": \"e2b-scenario\", \"private\": true}\n",
        )
        .expect("write package.json");
        must(
            std::process::Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .arg(format!("{package}@{version}"))
                .current_dir(&dir),
            &format!("npm install {package}@{version}"),
        );
    });
    dir
}

/// The Python of virtual environment `name` in the test home, with `packages` from PyPI
/// installed unless `check` (Python code) already runs there; made once per machine.
fn python_venv(name: &str, check: &str, packages: &[&str]) -> PathBuf {
    let paths = home();
    let venv = paths.home().join(name);
    let python = venv.join("bin/python");
    with_lock(&paths, || {
        let has = std::process::Command::new(&python)
            .args(["-c", check])
            .output()
            .is_ok_and(|o| o.status.success());
        if !has {
            must(
                std::process::Command::new("python3")
                    .args(["-m", "venv"])
                    .arg(&venv),
                "python3 -m venv",
            );
            must(
                std::process::Command::new(&python)
                    .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
                    .args(packages),
                &format!("pip install {}", packages.join(" ")),
            );
        }
    });
    python
}

/// A CA of a test's own and a certificate for `ips` it issued: (CA PEM, certificate PEM, key
/// PEM), for HTTPS servers the test runs in its network namespaces.
pub fn test_pki(ips: &[String]) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "forkbox test CA");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).expect("a CA certificate");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut leaf = rcgen::CertificateParams::new(ips.to_vec()).expect("certificate parameters");
    leaf.use_authority_key_identifier_extension = true;
    let cert = leaf.signed_by(&key, &issuer).expect("a certificate");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

/// A test binary (`NAME-<hash>`) built beside the calling one in `target/*/deps` (`cargo nextest
/// run --workspace` builds them all; `cargo test -p PKG --test NAME --no-run` one), the newest.
pub fn test_binary(name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let deps = std::env::current_exe()
        .expect("this test's path")
        .parent()
        .expect("its directory")
        .to_path_buf();
    std::fs::read_dir(&deps)
        .expect("list the test binaries")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let file = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            file.strip_prefix(&format!("{name}-"))
                .is_some_and(|h| h.len() == 16 && h.chars().all(|c| c.is_ascii_hexdigit()))
                && p.metadata()
                    .is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| {
            panic!("the {name} tests are not built: cargo test --test {name} --no-run")
        })
}
