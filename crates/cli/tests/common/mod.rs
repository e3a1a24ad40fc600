//! A daemon of this build for the tests that drive it from outside (the SDKs, MCP, the error
//! codes of every front end): in a home of its own that shares the test home's images, on its
//! Unix socket and a TCP listener with a token.
#![allow(dead_code)] // each test crate uses what it needs

pub mod cluster;
pub mod domain;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use forkbox_engine::paths::Paths;
use forkbox_test_infra as infra;

pub struct Daemon {
    pub paths: Paths,
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`, its TCP listener.
    pub tcp: String,
    /// A bearer token for it.
    pub token: String,
}

/// `forkbox` of this build for the home `paths`, no other API, accelerator or pool named, and
/// no E2B template built ahead by a daemon (a test that wants it says `--e2b-prebuild`).
pub fn forkbox(paths: &Paths) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_forkbox"));
    c.env("FORKBOX_HOME", paths.home())
        .env_remove("FORKBOX_API")
        .env_remove("FORKBOX_TOKEN")
        .env_remove("FORKBOX_ACCEL")
        .env("FORKBOX_E2B_PREBUILD", "none")
        .env("FORKBOX_POOL_SIZE", "0");
    c
}

impl Daemon {
    pub fn start(name: &str) -> Daemon {
        Daemon::start_with(name, &[])
    }

    /// A daemon with these extra `forkbox serve` arguments.
    pub fn start_with(name: &str, extra: &[&str]) -> Daemon {
        Daemon::start_in(infra::isolated_home(name), extra)
    }

    /// A daemon of home `paths` (a fresh one, say) with these extra `forkbox serve` arguments.
    pub fn start_in(paths: Paths, extra: &[&str]) -> Daemon {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Daemon::start_on(paths, &format!("127.0.0.1:{port}"), extra)
    }

    /// A daemon of home `paths` whose TCP listener is on `tcp` (`ADDRESS:PORT`).
    pub fn start_on(paths: Paths, tcp: &str, extra: &[&str]) -> Daemon {
        // A daemon an earlier run left behind may be an older build.
        stop_daemon_of(&paths);
        let tcp = tcp.to_string();
        let out = forkbox(&paths)
            .args(["token", "create", "--name", "sdk-tests"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let child = forkbox(&paths)
            .args(["serve", "--listen", &tcp])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let socket = forkbox_server::socket_path(&paths);
        assert!(
            infra::wait_until(Duration::from_secs(60), || {
                std::os::unix::net::UnixStream::connect(&socket).is_ok()
                    && std::net::TcpStream::connect(&tcp).is_ok()
            }),
            "the daemon did not start listening"
        );
        Daemon {
            paths,
            child,
            tcp: format!("http://{tcp}"),
            token,
        }
    }

    /// `program` with the daemon's address, token and home in its environment.
    pub fn client(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        c.env("FORKBOX_API", self.api())
            .env("FORKBOX_TEST_TCP", &self.tcp)
            .env("FORKBOX_TEST_TOKEN", &self.token)
            .env_remove("FORKBOX_TOKEN")
            .current_dir(infra::repo_root())
            .stdin(Stdio::null());
        c
    }

    /// A new token of the daemon (`e2b`: in E2B's key format, `e2b_…`).
    pub fn new_token(&self, name: &str, e2b: bool) -> String {
        let mut c = forkbox(&self.paths);
        c.args(["token", "create", "--name", name]);
        if e2b {
            c.arg("--e2b");
        }
        let out = c.output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// `program` with E2B's URL variables aimed at the daemon's TCP listener (for the API and
    /// the sandboxes) and `key` as the API key; no domain, no debug mode.
    pub fn e2b_url_client(&self, program: &Path, key: &str) -> Command {
        let mut c = self.client(program);
        c.env("E2B_API_KEY", key)
            .env("E2B_API_URL", &self.tcp)
            .env("E2B_SANDBOX_URL", &self.tcp)
            .env_remove("E2B_DOMAIN")
            .env_remove("E2B_DEBUG");
        c
    }

    /// `FORKBOX_API` for its Unix socket.
    pub fn api(&self) -> String {
        format!(
            "unix:{}",
            forkbox_server::socket_path(&self.paths).display()
        )
    }

    /// Runs `cmd`, prints its output, fails the test when it fails.
    pub fn check(&self, cmd: &mut Command, what: &str) -> String {
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        println!("{stdout}");
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{what} failed: {}", out.status);
        stdout
    }

    /// No sandbox is left when a run ends well.
    pub fn assert_nothing_left(&self) {
        let left: Vec<String> = infra::run_entries(&self.paths)
            .into_iter()
            .filter(|e| e.starts_with("sb-"))
            .collect();
        assert!(left.is_empty(), "sandboxes left behind: {left:?}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// Stops the daemon of `paths`, if one runs, and waits for it to be gone.
pub fn stop_daemon_of(paths: &Paths) {
    // Only a PID file a live daemon holds: a stale one's number may be any process's now.
    if let Some(pid) = forkbox_server::running_pid(paths) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        infra::wait_until(Duration::from_secs(30), || {
            !Path::new(&format!("/proc/{pid}")).exists()
        });
    }
}

/// A directory holding a copy of examples/legacykit: the one host directory the MCP tests
/// allow (`--root`), and where downloads land.
pub fn mcp_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let out = Command::new("cp")
        .arg("-r")
        .arg(infra::repo_root().join("examples/legacykit"))
        .arg(infra::repo_root().join("examples/plans"))
        .arg(root.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    root
}

/// One HTTP/1.0 request to `addr` with `Host: host` and the extra header lines `extra`; the
/// whole answer, or what went wrong (a forward resets connections while the guest's server is
/// still starting).
pub fn http(addr: &str, host: &str, path: &str, extra: &str) -> String {
    use std::io::{Read, Write};
    let answer = || -> std::io::Result<Vec<u8>> {
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n{extra}\r\n")?;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        Ok(out)
    };
    match answer() {
        Ok(out) => String::from_utf8_lossy(&out).into_owned(),
        Err(e) => format!("(no answer from {addr}: {e})"),
    }
}

/// Bytes as text (lossy).
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `forkbox ARGS` against daemon `d` (its Unix socket).
pub fn cli(d: &Daemon, args: &[&str]) -> std::process::Output {
    d.client(Path::new(env!("CARGO_BIN_EXE_forkbox")))
        .env("FORKBOX_HOME", d.paths.home())
        .args(args)
        .output()
        .unwrap()
}

/// `forkbox ARGS` against daemon `d` that must succeed; its standard output.
pub fn ok(d: &Daemon, args: &[&str]) -> String {
    let out = cli(d, args);
    assert!(
        out.status.success(),
        "forkbox {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}
