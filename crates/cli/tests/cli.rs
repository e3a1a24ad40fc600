//! End-to-end tests of the `forkbox` command line. Tests that boot a VM say so and what it
//! costs (TCG here: ~4-5 s a boot); the others need no VM.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use forkbox_test_infra as infra;
use sha2::{Digest, Sha256};

fn forkbox(paths: &forkbox_engine::paths::Paths) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_forkbox"));
    c.env("FORKBOX_HOME", paths.home())
        .env_remove("FORKBOX_ACCEL")
        .env_remove("FORKBOX_IMAGE")
        // Daemons started here keep no warm pool (its background restores would race the
        // tests' counts of VMs and files); `the_warm_pool_...` turns it on.
        .env("FORKBOX_POOL_SIZE", "0")
        // `run` makes its sandbox in its own process, whether or not a daemon runs in the
        // shared test home (`run_goes_through_a_running_daemon...` tests the other way).
        .env("FORKBOX_RUN_LOCAL", "1")
        .stdin(Stdio::null());
    c
}

fn ready() -> forkbox_engine::paths::Paths {
    let paths = infra::home();
    infra::image(&paths, "python-bookworm");
    paths
}

/// A runner of `forkbox ARGS` in `paths`'s home with `env` set (a daemon it starts keeps the
/// warm pool those variables say), returning its output.
fn cli_with<'a>(
    paths: &'a forkbox_engine::paths::Paths,
    env: &'a [(&str, &str)],
) -> impl Fn(&[&str]) -> std::process::Output + 'a {
    move |args| {
        forkbox(paths)
            .envs(env.iter().copied())
            .args(args)
            .output()
            .unwrap()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(paths: &forkbox_engine::paths::Paths, args: &[&str]) -> Output {
    watched(paths, args, forkbox(paths).args(args), None)
}

/// How long one CLI call may take before its test says where it is stuck (a hang of the test
/// as a whole says nothing but the test's name).
const CALL_LIMIT: Duration = Duration::from_secs(200);

/// Runs `cmd` (`forkbox ARGS` in `paths`'s home) to its end, `input` on its standard input,
/// saying the call and its time; one that runs past [`CALL_LIMIT`] is killed and the test fails
/// with the end of the home's daemon log and the sandboxes' QEMUs.
fn watched(
    paths: &forkbox_engine::paths::Paths,
    args: &[&str],
    cmd: &mut Command,
    input: Option<&[u8]>,
) -> Output {
    use std::io::Write;
    let started = std::time::Instant::now();
    println!("$ forkbox {}", args.join(" "));
    let stdin = match input {
        Some(_) => Stdio::piped(),
        None => Stdio::null(),
    };
    let mut child = cmd
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run forkbox");
    let writer = child.stdin.take().map(|mut w| {
        let input = input.unwrap_or_default().to_vec();
        std::thread::spawn(move || {
            let _ = w.write_all(&input);
        })
    });
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(CALL_LIMIT).is_err() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            return true;
        }
        false
    });
    let out = child.wait_with_output().expect("wait for forkbox");
    let _ = done_tx.send(());
    let killed = watchdog.join().unwrap();
    if let Some(w) = writer {
        w.join().unwrap();
    }
    println!("  ({:.1} s)", started.elapsed().as_secs_f64());
    if killed {
        let log = std::fs::read_to_string(paths.home().join("daemon.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        let qemus = infra::processes_mentioning(&paths.home().display().to_string());
        panic!(
            "forkbox {} did not end in {CALL_LIMIT:?}; it printed {:?} and {:?}; processes of the \
             home: {qemus:?}; the daemon log ends:\n{}",
            args.join(" "),
            text(&out.stdout),
            text(&out.stderr),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    out
}

/// One boot. The first command of the README's five-minute tour.
#[test]
fn run_prints_the_guest_python_and_the_guest_kernel() {
    let paths = ready();
    let out = run(
        &paths,
        &[
            "run",
            "--",
            "python3",
            "-c",
            "import platform, sys; print(sys.version.split()[0], platform.release())",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut words = stdout.split_whitespace();
    let (py, kernel) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    assert!(py.starts_with("3.11."), "bookworm's python, got {stdout:?}");
    let host = nix::sys::utsname::uname()
        .unwrap()
        .release()
        .to_string_lossy()
        .into_owned();
    assert_ne!(kernel, host, "the command ran on the host's kernel");
    assert!(kernel.contains("cloud-amd64"), "{kernel}");
    // The accelerator is said plainly; on TCG with a one-line notice.
    let err = text(&out.stderr);
    if err.contains("TCG") {
        assert_eq!(
            err.lines().filter(|l| l.contains("TCG")).count(),
            1,
            "{err}"
        );
        assert!(err.contains("security boundary"), "{err}");
        // ... which --quiet and FORKBOX_NO_TCG_NOTICE hide.
        let out = run(&paths, &["run", "--quiet", "--", "true"]);
        assert!(out.status.success());
        assert_eq!(text(&out.stderr), "", "--quiet");
        let out = forkbox(&paths)
            .env("FORKBOX_NO_TCG_NOTICE", "1")
            .args(["run", "--", "true"])
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(!text(&out.stderr).contains("TCG"), "{}", text(&out.stderr));
    }
}

/// Two boots.
#[test]
fn exit_codes_and_signals_become_the_cli_exit_code() {
    let paths = ready();
    let out = run(&paths, &["run", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let out = run(
        &paths,
        &[
            "run",
            "--json",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; kill -KILL $$",
        ],
    );
    assert_eq!(out.status.code(), Some(128 + 9), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json result");
    assert_eq!(v["signal"], 9);
    assert_eq!(v["stdout"], "out\n");
    assert_eq!(v["stderr"], "err\n");
    assert!(v["sandbox"]["accel"]["accel"].is_string());
    assert!(v["sandbox"]["id"].as_str().unwrap().starts_with("sb-"));
}

/// One boot; 10 MB through the stream.
#[test]
fn ten_megabytes_of_output_arrive_whole_and_in_order() {
    let paths = ready();
    // Numbered lines, so a lost, repeated or reordered chunk changes the digest; written 100
    // lines (1 kB) at a time, so the stream carries thousands of separate writes.
    let script = "import sys\nw = sys.stdout.write\nfor j in range(10_000):\n    w(''.join('%09d\\n' % i for i in range(j * 100, j * 100 + 100)))\n";
    let out = run(&paths, &["run", "--", "python3", "-c", script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout.len(), 10_000_000);
    let mut want = Sha256::new();
    for i in 0..1_000_000 {
        want.update(format!("{i:09}\n").as_bytes());
    }
    assert_eq!(Sha256::digest(&out.stdout), want.finalize());
}

/// One boot. Standard input reaches the command with -i.
#[test]
fn interactive_stdin_reaches_the_command() {
    let paths = ready();
    let mut child = forkbox(&paths)
        .args(["run", "-i", "--", "sh", "-c", "tr a-z A-Z; echo done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello sandbox\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), "HELLO SANDBOX\ndone\n");
}

/// No VM.
#[test]
fn bad_input_gives_clear_errors() {
    let paths = infra::home();
    infra::image(&paths, "python-bookworm");
    let out = run(&paths, &["run", "--image", "no-such-image", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("no image no-such-image") && err.contains("python-bookworm@"),
        "{err}"
    );

    let out = run(
        &paths,
        &["run", "--image", "python-bookworm@999", "--", "true"],
    );
    assert!(
        text(&out.stderr).contains("no image python-bookworm@999"),
        "{}",
        text(&out.stderr)
    );

    let out = run(&paths, &["run", "--image", "bad/name", "--", "true"]);
    assert!(
        text(&out.stderr).contains("is not an image reference"),
        "{}",
        text(&out.stderr)
    );

    let out = run(
        &paths,
        &["image", "build", "-f", "/nonexistent/recipe.toml"],
    );
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("/nonexistent/recipe.toml") && err.contains("cannot be read"),
        "{err}"
    );

    let dir = std::env::temp_dir().join(format!("forkbox-bad-recipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (body, expect) in [
        (
            "name = \"x\"\nsuite = \"bookworm\"\napt = \"python3\"\n",
            "invalid type",
        ),
        ("name = \"x\"\nsuite = \"buster\"\n", "bullseye"),
        (
            "name = \"x\"\nsuite = \"bookworm\"\npackages = []\n",
            "packages",
        ),
        ("name = \"x\"\nsuite = [\n", "recipe"),
    ] {
        let f = dir.join("r.toml");
        std::fs::write(&f, body).unwrap();
        let out = run(&paths, &["image", "build", "-f", f.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(125));
        let err = text(&out.stderr);
        assert!(
            err.contains("is not valid") && err.contains(expect),
            "for {body:?}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);

    let out = run(&paths, &["image", "rm", "python-bookworm"]);
    let err = text(&out.stderr);
    assert!(
        err.contains("needs its version, python-bookworm@N") && err.contains("python-bookworm@1"),
        "{err}"
    );

    // A bad --allow is a usage error naming the flag, said once.
    let out = run(&paths, &["run", "--allow", "bad host!", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("--allow") && err.matches("use a host name").count() == 1,
        "{err}"
    );

    // A bad --secret: a usage error at once, naming what is wrong; nothing made.
    for (arg, says) in [
        (
            "FORKBOX_TEST_UNSET_VAR@api.example.com",
            "$FORKBOX_TEST_UNSET_VAR is not set",
        ),
        (
            "T=file:/nonexistent/token@api.example.com",
            "cannot read /nonexistent/token",
        ),
        ("T=env:HOME", "name the hosts"),
        ("T=env:HOME@*", "is not a host"),
        ("T=env:HOME@*.com", "top-level"),
        ("T=s3cr3t@api.example.com", "never the command line"),
    ] {
        let out = run(&paths, &["run", "--secret", arg, "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "{arg}");
        let err = text(&out.stderr);
        assert!(err.contains(says), "{arg}: {err}");
    }
}

/// No VM here (the KVM probe verdict is cached); one boot on a host where KVM works.
#[test]
fn asking_for_kvm_where_it_cannot_work_is_an_error() {
    let paths = ready();
    let info = run(&paths, &["info", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&info.stdout).expect("info json");
    let out = run(&paths, &["run", "--accel", "kvm", "--", "true"]);
    if v["accel"]["accel"] == "tcg" {
        assert_eq!(out.status.code(), Some(125));
        let err = text(&out.stderr);
        assert!(
            err.contains("KVM was requested") && err.contains("--accel tcg"),
            "{err}"
        );
    } else {
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

/// Spawns `cmd` with its stdout piped and waits until its first line is `first`.
fn started_saying(cmd: &mut Command, first: &str) -> Child {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, format!("{first}\n"));
    child
}

/// Spawns `forkbox run` that prints "ready" from inside the guest, and waits for it.
fn start_ready_sandbox(paths: &forkbox_engine::paths::Paths) -> (Child, Vec<u32>, Vec<String>) {
    let child = started_saying(
        forkbox(paths)
            .args(["run", "--", "sh", "-c", "echo ready; sleep 600"])
            .stderr(Stdio::piped()),
        "ready",
    );
    let cli = child.id();
    // This CLI's QEMU: the child of its jail's holder (or its own child, unjailed), whose
    // command line names the sandbox's run directory.
    let parent = |pid: u32| -> Option<u32> {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("PPid:\t")?.parse().ok())
    };
    let qemus: Vec<u32> = infra::qemus_of(paths)
        .into_iter()
        .filter(|q| {
            let p = parent(*q);
            p == Some(cli) || p.and_then(parent) == Some(cli)
        })
        .collect();
    assert_eq!(qemus.len(), 1, "one QEMU per run");
    let cmdline =
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{}/cmdline", qemus[0])).unwrap())
            .into_owned();
    let run_dirs: Vec<String> = infra::run_entries(paths)
        .into_iter()
        .filter(|e| cmdline.contains(e.as_str()))
        .collect();
    assert_eq!(run_dirs.len(), 1);
    (child, qemus, run_dirs)
}

fn gone(paths: &forkbox_engine::paths::Paths, qemus: &[u32], dirs: &[String]) -> bool {
    qemus
        .iter()
        .all(|q| !std::path::Path::new(&format!("/proc/{q}")).exists())
        && dirs.iter().all(|d| !paths.run().join(d).exists())
}

/// One boot. Ctrl-C (SIGINT) during a command removes the VM and its overlay. While the
/// sandbox runs, its image cannot be removed.
#[test]
fn ctrl_c_leaves_no_qemu_and_no_overlay() {
    let paths = ready();
    let (mut child, qemus, dirs) = start_ready_sandbox(&paths);
    let ls: serde_json::Value =
        serde_json::from_slice(&run(&paths, &["image", "ls", "--json"]).stdout).unwrap();
    let used = ls
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["reference"].as_str())
        .filter(|r| r.starts_with("python-bookworm@"))
        .max_by_key(|r| {
            r.trim_start_matches("python-bookworm@")
                .parse::<u32>()
                .unwrap_or(0)
        })
        .unwrap()
        .to_string();
    let out = run(&paths, &["image", "rm", &used]);
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(125),
        "removing an image in use: {err}"
    );
    assert!(err.contains("in use") && err.contains(&dirs[0]), "{err}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("interrupted"), "{err}");
    assert!(
        infra::wait_until(Duration::from_secs(10), || gone(&paths, &qemus, &dirs)),
        "left behind: {qemus:?} {dirs:?}"
    );
}

/// One boot. Even SIGKILL of the CLI takes its VM down; its files go at the next start.
#[test]
fn killed_cli_takes_its_vm_down_and_the_next_run_sweeps_its_files() {
    let paths = ready();
    let (mut child, qemus, dirs) = start_ready_sandbox(&paths);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        infra::wait_until(Duration::from_secs(10), || qemus
            .iter()
            .all(|q| !std::path::Path::new(&format!("/proc/{q}")).exists())),
        "QEMU outlived its killed owner"
    );
    // Any later sandbox start sweeps the records of owners that died; `image rm` does too.
    let _ = run(&paths, &["image", "rm", "python-bookworm@999"]);
    assert!(
        gone(&paths, &qemus, &dirs),
        "files of a dead run were not swept: {dirs:?}"
    );
}

/// One boot. A guest kernel that dies mid-command: forkbox says so and shows the console's tail.
#[test]
fn a_guest_that_dies_shows_the_tail_of_its_console() {
    let paths = ready();
    let out = run(
        &paths,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "echo c > /proc/sysrq-trigger; sleep 60",
        ],
    );
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("connection to the guest agent was lost"),
        "{err}"
    );
    assert!(
        err.contains("last console lines") && err.contains("Kernel panic"),
        "{err}"
    );
}

/// No VM. Without QEMU on the PATH, forkbox points at the set-up step.
#[test]
fn missing_qemu_points_at_setup() {
    let paths = ready();
    let empty = std::env::temp_dir().join(format!("forkbox-empty-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = forkbox(&paths)
        .env("PATH", &empty)
        .args(["run", "--", "true"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&empty);
    if std::path::Path::new("/usr/sbin/qemu-system-x86_64").exists()
        || std::path::Path::new("/sbin/qemu-system-x86_64").exists()
    {
        return; // found outside PATH; nothing to test on this host
    }
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("qemu-system-x86_64 was not found") && err.contains("forkbox setup"),
        "{err}"
    );
}

fn stop_daemon(paths: &forkbox_engine::paths::Paths) {
    // Only a PID file a live daemon holds: a stale one's number may be any process's now.
    if let Some(pid) = forkbox_server::running_pid(paths) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        infra::wait_until(Duration::from_secs(30), || {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
    }
}

/// Two boots. Long-lived sandboxes through the daemon, which the first call starts.
#[test]
fn sandboxes_live_across_calls_through_the_daemon() {
    let paths = infra::isolated_home("daemon-calls");
    stop_daemon(&paths); // a daemon left by an earlier run may be an older build
    let out = run(
        &paths,
        &["sandbox", "create", "--label", "plan=a", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let a: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let a = a["id"].as_str().unwrap().to_string();
    let b = text(&run(&paths, &["sandbox", "create", "--label", "plan=b"]).stdout)
        .trim()
        .to_string();
    assert!(b.starts_with("sb-") && b != a);

    // State persists between calls, per sandbox.
    let out = run(
        &paths,
        &[
            "sandbox",
            "exec",
            &a,
            "--",
            "sh",
            "-c",
            "echo kept > /root/state",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(&paths, &["sandbox", "exec", &a, "--", "cat", "/root/state"]);
    assert_eq!(text(&out.stdout), "kept\n");
    let out = run(
        &paths,
        &[
            "sandbox",
            "exec",
            &b,
            "--",
            "sh",
            "-c",
            "cat /root/state; exit 3",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "exit code of the command");
    assert!(
        text(&out.stderr).contains("No such file"),
        "{}",
        text(&out.stderr)
    );

    // Trees in and out through the daemon, as streams.
    let host = std::env::temp_dir().join(format!("forkbox-cli-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&host);
    std::fs::create_dir_all(host.join("src/pkg")).unwrap();
    std::fs::write(host.join("src/pkg/a.txt"), "alpha\n").unwrap();
    std::os::unix::fs::symlink("pkg/a.txt", host.join("src/link")).unwrap();
    let out = run(
        &paths,
        &[
            "sandbox",
            "upload",
            &a,
            host.join("src").to_str().unwrap(),
            "/work/in",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(
        &paths,
        &["sandbox", "exec", &a, "--", "cat", "/work/in/link"],
    );
    assert_eq!(text(&out.stdout), "alpha\n");
    let back = host.join("back");
    let out = run(
        &paths,
        &[
            "sandbox",
            "download",
            &a,
            "/work/in/pkg",
            back.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(back.join("a.txt")).unwrap(),
        "alpha\n"
    );
    // The whole tree: its link comes back as a link.
    let whole = host.join("whole");
    let out = run(
        &paths,
        &[
            "sandbox",
            "download",
            &a,
            "/work/in",
            whole.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_link(whole.join("link")).unwrap(),
        std::path::Path::new("pkg/a.txt")
    );
    // Single files, as `docker cp` takes them: into a directory there, or to a path.
    let one = host.join("one.txt");
    std::fs::write(&one, "single\n").unwrap();
    let up = |to: &str| {
        run(
            &paths,
            &["sandbox", "upload", &a, one.to_str().unwrap(), to],
        )
    };
    for to in ["/work/in", "/work/renamed.txt", "/work/fresh/"] {
        let out = up(to);
        assert!(
            out.status.success(),
            "upload to {to}: {}",
            text(&out.stderr)
        );
    }
    let out = run(
        &paths,
        &[
            "sandbox",
            "exec",
            &a,
            "--",
            "cat",
            "/work/in/one.txt",
            "/work/renamed.txt",
            "/work/fresh/one.txt",
        ],
    );
    assert_eq!(text(&out.stdout), "single\nsingle\nsingle\n");
    let down = |from: &str, to: &std::path::Path| {
        run(
            &paths,
            &["sandbox", "download", &a, from, to.to_str().unwrap()],
        )
    };
    let got = host.join("got");
    std::fs::create_dir_all(&got).unwrap();
    assert!(down("/work/renamed.txt", &got).status.success());
    assert_eq!(
        std::fs::read_to_string(got.join("renamed.txt")).unwrap(),
        "single\n"
    );
    assert!(down("/work/in/one.txt", &got.join("named.txt"))
        .status
        .success());
    assert_eq!(
        std::fs::read_to_string(got.join("named.txt")).unwrap(),
        "single\n"
    );
    // A file there already is not overwritten.
    std::fs::write(got.join("renamed.txt"), "mine\n").unwrap();
    let out = down("/work/renamed.txt", &got);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("exists already"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(got.join("renamed.txt")).unwrap(),
        "mine\n"
    );
    let out = run(
        &paths,
        &[
            "sandbox",
            "download",
            &a,
            "/no/such/path",
            host.join("none").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(!host.join("none").exists());
    let _ = std::fs::remove_dir_all(&host);

    // Streamed exec output (the default) is whole; plain (--json) output is capped and says so.
    let out = run(
        &paths,
        &[
            "sandbox",
            "exec",
            &a,
            "--",
            "head",
            "-c",
            "300000",
            "/dev/zero",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout.len(), 300_000);
    let out = run(
        &paths,
        &[
            "sandbox",
            "exec",
            &a,
            "--json",
            "--",
            "head",
            "-c",
            "100000",
            "/dev/zero",
        ],
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["stdout_truncated"], true);
    assert_eq!(r["stdout"].as_str().unwrap().len(), 65536);

    // Listing, with a label filter.
    let all: serde_json::Value =
        serde_json::from_slice(&run(&paths, &["sandbox", "ls", "--json"]).stdout).unwrap();
    let ids: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["id"].as_str())
        .collect();
    assert!(ids.contains(&a.as_str()) && ids.contains(&b.as_str()));
    let only_b: serde_json::Value = serde_json::from_slice(
        &run(&paths, &["sandbox", "ls", "--label", "plan=b", "--json"]).stdout,
    )
    .unwrap();
    assert_eq!(only_b.as_array().unwrap().len(), 1);
    assert_eq!(only_b[0]["id"], b.as_str());

    // A TTL deletes a sandbox when it passes; it can be set anew.
    let out = run(&paths, &["sandbox", "create", "--ttl", "600", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = t["id"].as_str().unwrap().to_string();
    let out = run(&paths, &["sandbox", "ttl", &t, "2", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = |id: &str| text(&run(&paths, &["sandbox", "ls"]).stdout).contains(id);
    assert!(
        infra::wait_until(Duration::from_secs(60), || !listed(&t)),
        "the TTL did not delete {t}"
    );
    assert!(infra::wait_until(Duration::from_secs(10), || !paths
        .run()
        .join(&t)
        .exists()));
    // The CLI names its flags (the API its fields), and bad usage exits 2.
    for bad in ["0", "31d"] {
        let out = run(&paths, &["sandbox", "create", "--ttl", bad]);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("--ttl"), "{}", text(&out.stderr));
    }

    // Commands outlive their clients: detach and attach (from the start), a client that goes
    // away mid-command, and signals.
    let cid = text(
        &run(
            &paths,
            &[
                "sandbox",
                "exec",
                &a,
                "--detach",
                "--",
                "sh",
                "-c",
                "echo one; sleep 2; echo two; exit 4",
            ],
        )
        .stdout,
    )
    .trim()
    .to_string();
    assert!(cid.starts_with("cmd-"), "{cid}");
    let out = run(&paths, &["sandbox", "attach", &a, &cid]);
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(4), "one\ntwo\n".to_string())
    );
    let out = run(&paths, &["sandbox", "attach", &a, &cid]);
    assert_eq!(
        text(&out.stdout),
        "one\ntwo\n",
        "reattaching replays the output"
    );
    let mut client = started_saying(
        forkbox(&paths).args([
            "sandbox",
            "exec",
            &a,
            "--",
            "sh",
            "-c",
            "echo started; sleep 3; echo done > /root/after",
        ]),
        "started",
    );
    client.kill().unwrap();
    client.wait().unwrap();
    assert!(
        infra::wait_until(Duration::from_secs(30), || text(
            &run(&paths, &["sandbox", "exec", &a, "--", "cat", "/root/after"]).stdout
        ) == "done\n"),
        "the command stopped when its client went away"
    );
    let sleeper = text(
        &run(
            &paths,
            &["sandbox", "exec", &a, "--detach", "--", "sleep", "1000"],
        )
        .stdout,
    )
    .trim()
    .to_string();
    assert!(
        run(&paths, &["sandbox", "kill", &a, &sleeper, "--signal", "9"])
            .status
            .success()
    );
    assert_eq!(
        run(&paths, &["sandbox", "attach", &a, &sleeper])
            .status
            .code(),
        Some(137)
    );
    let out = run(&paths, &["sandbox", "attach", &a, "cmd-999"]);
    assert!(
        text(&out.stderr).contains("has no command cmd-999"),
        "{}",
        text(&out.stderr)
    );

    // Metrics: sandboxes, bytes moved, and per-sandbox CPU and memory of their VMs (these two
    // once a sampling pass, each second, has seen both VMs).
    let metrics = || {
        use std::io::Write;
        let mut s =
            std::os::unix::net::UnixStream::connect(forkbox_server::socket_path(&paths)).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: forkbox\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        r
    };
    let cpu_of_a = format!("forkbox_sandbox_cpu_seconds{{sandbox=\"{a}\"}}");
    let memory_of_b = format!("forkbox_sandbox_memory_mib_seconds_total{{sandbox=\"{b}\"}}");
    assert!(
        infra::wait_until(Duration::from_secs(30), || {
            let m = metrics();
            m.contains(&cpu_of_a) && m.contains(&memory_of_b)
        }),
        "{}",
        metrics()
    );
    let metrics = metrics();
    assert!(metrics.contains("forkbox_sandboxes_running 2"), "{metrics}");
    assert!(
        !metrics.contains("forkbox_uploaded_bytes_total 0\n"),
        "{metrics}"
    );

    // Unknown ids are clear errors.
    let out = run(&paths, &["sandbox", "exec", "sb-nope", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("no sandbox sb-nope"),
        "{}",
        text(&out.stderr)
    );

    // Removing one stops its VM; stopping the daemon stops the rest.
    let qemu_of = |id: &str| {
        infra::processes_mentioning(
            &paths
                .run()
                .join(id)
                .join("agent.sock")
                .display()
                .to_string(),
        )
    };
    assert_eq!(qemu_of(&a).len(), 1);
    assert!(run(&paths, &["sandbox", "rm", &a]).status.success());
    assert!(infra::wait_until(Duration::from_secs(10), || qemu_of(&a)
        .is_empty()
        && !paths.run().join(&a).exists()));
    stop_daemon(&paths);
    assert!(qemu_of(&b).is_empty(), "the daemon left a VM running");
    assert!(!paths.run().join(&b).exists());
}

fn kill_daemon_hard(paths: &forkbox_engine::paths::Paths) {
    let pid = forkbox_server::running_pid(paths).expect("a daemon runs") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(infra::wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
    }));
}

/// Three boots. SIGKILL of the daemon loses no sandbox it reported created: the next daemon
/// re-adopts them with their processes, applies TTLs that passed meanwhile, and removes what a
/// killed create left half-made.
#[test]
fn a_killed_daemon_loses_no_sandbox_and_leaves_nothing_half_made() {
    let paths = infra::isolated_home("daemon-crash");
    stop_daemon(&paths);
    let keep = text(&run(&paths, &["sandbox", "create", "--label", "test=adopt"]).stdout)
        .trim()
        .to_string();
    let short = text(&run(&paths, &["sandbox", "create", "--ttl", "600"]).stdout)
        .trim()
        .to_string();
    assert!(keep.starts_with("sb-") && short.starts_with("sb-"));
    let out = run(&paths, &["sandbox", "exec", &keep, "--", "sh", "-c", "echo v1 > /root/state; setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo $! > /root/bg.pid"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(run(&paths, &["sandbox", "ttl", &short, "3"])
        .status
        .success());

    kill_daemon_hard(&paths);
    std::thread::sleep(Duration::from_secs(4)); // the TTL of `short` passes while no daemon runs

    // The next call starts a new daemon, which takes `keep` over.
    let out = run(
        &paths,
        &[
            "sandbox",
            "exec",
            &keep,
            "--",
            "sh",
            "-c",
            "cat /root/state; kill -0 $(cat /root/bg.pid) && echo bg-alive",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "v1\nbg-alive\n");
    let ls: serde_json::Value = serde_json::from_slice(
        &run(
            &paths,
            &["sandbox", "ls", "--label", "test=adopt", "--json"],
        )
        .stdout,
    )
    .unwrap();
    assert_eq!(ls.as_array().unwrap().len(), 1);
    assert!(
        infra::wait_until(Duration::from_secs(20), || !text(
            &run(&paths, &["sandbox", "ls"]).stdout
        )
        .contains(&short)),
        "a TTL that passed while the daemon was down was not applied"
    );
    assert!(infra::wait_until(Duration::from_secs(10), || !paths
        .run()
        .join(&short)
        .exists()));

    // A create killed half-way leaves no VM once a daemon runs again.
    let mut creating = forkbox(&paths)
        .args(["sandbox", "create"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let known: Vec<String> = vec![keep.clone()];
    let mut half = None;
    assert!(infra::wait_until(Duration::from_secs(30), || {
        half = infra::run_entries(&paths).into_iter().find(|e| {
            !known.contains(e)
                && e.starts_with("sb-")
                && !infra::processes_mentioning(
                    &paths.run().join(e).join("agent.sock").display().to_string(),
                )
                .is_empty()
        });
        half.is_some()
    }));
    let half = half.unwrap();
    kill_daemon_hard(&paths);
    let _ = creating.wait();
    let out = run(&paths, &["sandbox", "ls", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ids: Vec<String> = serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["id"].as_str().map(String::from))
        .collect();
    assert_eq!(
        ids,
        vec![keep.clone()],
        "only the sandbox reported created survives"
    );
    let qemu_half = infra::processes_mentioning(
        &paths
            .run()
            .join(&half)
            .join("agent.sock")
            .display()
            .to_string(),
    );
    assert!(
        qemu_half.is_empty(),
        "the half-made sandbox's VM still runs"
    );
    assert!(!paths.run().join(&half).exists());

    stop_daemon(&paths);
    assert!(infra::processes_mentioning(
        &paths
            .run()
            .join(&keep)
            .join("agent.sock")
            .display()
            .to_string()
    )
    .is_empty());
}

fn http_status(addr: &str, auth: Option<&str>) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let auth = auth
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET /v1/sandboxes HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp.lines().next().unwrap_or_default().to_string()
}

/// No VM. On TCP, requests need a bearer token from `forkbox token create`.
#[test]
fn tcp_requests_without_a_valid_token_are_refused() {
    let paths = infra::isolated_home("daemon-tcp");
    stop_daemon(&paths);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut daemon = forkbox(&paths)
        .args(["serve", "--listen", &addr])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(infra::wait_until(Duration::from_secs(20), || {
        std::net::TcpStream::connect(&addr).is_ok()
    }));
    let out = run(&paths, &["token", "create", "--name", "test", "--json"]);
    let token = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(http_status(&addr, None).contains("401"));
    assert!(http_status(&addr, Some("fbx_0000")).contains("401"));
    assert!(http_status(&addr, Some(&token[..token.len() - 1])).contains("401"));
    assert!(
        http_status(&addr, Some(&token)).contains("200"),
        "a valid token was refused"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    daemon.wait().unwrap();
}

fn ids(out: &Output) -> Vec<String> {
    text(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| l.starts_with("sb-"))
        .collect()
}

/// Restores only (the image's template is shared by the test home; ~0.3 s each) and two
/// snapshots of a running 1 GiB sandbox (~3 s each under TCG). Fork through the CLI and the
/// daemon: copies carry the running process, differ in randomness, and snapshots keep their
/// dependents safe.
#[test]
fn forks_through_the_cli() {
    let paths = infra::isolated_home("fork-cli");
    stop_daemon(&paths);
    forkbox_engine::tree::remove_tree(&paths.snapshots()).unwrap(); // left by an earlier, failed run
    let parent = text(&run(&paths, &["sandbox", "create"]).stdout)
        .trim()
        .to_string();
    assert!(parent.starts_with("sb-"), "{parent}");
    let out = run(&paths, &["sandbox", "exec", &parent, "--", "sh", "-c",
        "echo parent > /root/who; setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/tick; sleep 0.3; done' >/dev/null 2>&1 < /dev/null &"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Bad counts are refused before anything is saved.
    for n in ["0", "21"] {
        let out = run(&paths, &["sandbox", "fork", &parent, "--count", n]);
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("between 1 and 20"),
            "{}",
            text(&out.stderr)
        );
    }

    let out = run(
        &paths,
        &[
            "sandbox", "fork", &parent, "--count", "2", "--label", "plan=x",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let forks = ids(&out);
    assert_eq!(forks.len(), 2, "{}", text(&out.stdout));
    let mut randoms = Vec::new();
    for id in forks.iter().chain([&parent]) {
        let out = run(&paths, &["sandbox", "exec", id, "--", "sh", "-c",
            "cat /root/who; a=$(cat /tmp/tick); for i in $(seq 100); do sleep 0.1; b=$(cat /tmp/tick); [ \"$b\" != \"$a\" ] && echo ticking && break; done; head -c 1000 /dev/urandom | sha256sum"]);
        assert!(out.status.success(), "{id}: {}", text(&out.stderr));
        let o = text(&out.stdout);
        assert!(o.starts_with("parent\nticking\n"), "{id}: {o}");
        randoms.push(o.lines().nth(2).unwrap().to_string());
    }
    randoms.sort();
    randoms.dedup();
    assert_eq!(randoms.len(), 3, "random bytes repeated across copies");

    // A named snapshot; its forks keep it alive; it survives a daemon restart.
    let out = run(
        &paths,
        &[
            "sandbox", "snapshot", &parent, "--name", "cli-snap", "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(meta["pause_ms"].as_f64().unwrap() > 0.0, "{meta}");
    let out = run(
        &paths,
        &["sandbox", "snapshot", &parent, "--name", "cli-snap"],
    );
    assert!(
        text(&out.stderr).contains("exists already"),
        "{}",
        text(&out.stderr)
    );
    let out = run(
        &paths,
        &["sandbox", "create", "--snapshot", "cli-snap", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let child: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let child = child["id"].as_str().unwrap().to_string();
    let out = run(&paths, &["snapshot", "rm", "cli-snap"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(&child), "{}", text(&out.stderr));

    // A corrupt snapshot: every copy fails, is reported, and leaves nothing behind.
    let out = run(
        &paths,
        &["sandbox", "snapshot", &parent, "--name", "cli-bad"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::write(
        paths.snapshots().join("cli-bad/vmstate"),
        b"not a device state",
    )
    .unwrap();
    let before = infra::run_entries(&paths).len();
    let out = run(&paths, &["sandbox", "fork", "cli-bad", "--count", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("a copy failed"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        infra::run_entries(&paths).len(),
        before,
        "a failed copy left files"
    );
    let out = run(
        &paths,
        &["sandbox", "exec", &child, "--", "cat", "/root/who"],
    );
    assert_eq!(text(&out.stdout), "parent\n", "{}", text(&out.stderr));

    for id in forks.iter().chain([&parent, &child]) {
        assert!(run(&paths, &["sandbox", "rm", id]).status.success());
    }
    // Snapshots are files: they outlive the daemon.
    stop_daemon(&paths);
    let out = run(&paths, &["snapshot", "ls"]);
    assert!(
        text(&out.stdout).contains("cli-snap"),
        "{}",
        text(&out.stdout)
    );
    assert!(run(&paths, &["snapshot", "rm", "cli-snap"])
        .status
        .success());
    assert!(run(&paths, &["snapshot", "rm", "cli-bad"]).status.success());
    // The snapshot made for the first fork went with its last copy.
    let out = run(&paths, &["snapshot", "ls"]);
    assert_eq!(text(&out.stdout).trim(), "no snapshots");
    stop_daemon(&paths);
}

/// Three restores (~0.3 s each). With a warm pool the daemon hands out a sandbox restored
/// ahead of time: it works, has its own name and its own randomness.
#[test]
fn the_warm_pool_hands_out_fresh_sandboxes() {
    let paths = infra::isolated_home("warm-pool");
    stop_daemon(&paths);
    let cli = cli_with(&paths, &[("FORKBOX_POOL_SIZE", "1")]);
    let create = || {
        let out = cli(&["sandbox", "create", "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let a = create();
    assert_eq!(a["from_pool"], false);
    // The pool refills in the background: one more VM appears beside `a`.
    assert!(infra::wait_until(
        Duration::from_secs(60),
        || infra::run_entries(&paths).len() >= 2
    ));
    // ... and is handed out once restored and warmed up (~1-2 s under TCG, more on a busy host).
    let ready = || {
        let out = cli(&["pool", "ls", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["slots"][0]["ready"] == 1
    };
    assert!(infra::wait_until(Duration::from_secs(120), ready));
    let b = create();
    assert_eq!(b["from_pool"], true, "{b}");
    let mut seen = Vec::new();
    for v in [&a, &b] {
        let id = v["id"].as_str().unwrap();
        let out = run(
            &paths,
            &[
                "sandbox",
                "exec",
                id,
                "--",
                "sh",
                "-c",
                "hostname; head -c 64 /dev/urandom | sha256sum",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let o = text(&out.stdout);
        assert_eq!(o.lines().next(), Some(id));
        seen.push(o.lines().nth(1).unwrap().to_string());
    }
    assert_ne!(seen[0], seen[1]);
    stop_daemon(&paths);
    // The daemon's shutdown stopped the pooled VM too.
    assert!(
        infra::wait_until(Duration::from_secs(10), || infra::run_entries(&paths)
            .is_empty()),
        "{:?}",
        infra::run_entries(&paths)
    );
}

/// Creates that come together find the pool empty and wait for the restores it runs for them
/// (two at a time here) instead of each starting one of its own. Promise: every one of them
/// gets a sandbox of its own that answers, none waits forever, and afterwards the pool keeps
/// as many as the burst had, and no VM more. Twelve restores, ~20-30 s under TCG.
#[test]
fn creates_that_come_together_share_the_pools_restores() {
    let paths = infra::isolated_home("pool-burst");
    stop_daemon(&paths);
    let cli = cli_with(&paths, &[("FORKBOX_POOL_SIZE", "1")]);
    // The configuration's first create restores for itself (it may make the template).
    let out = cli(&["sandbox", "create"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let first = text(&out.stdout).trim().to_string();
    // Five at once, before the pool's first copy is ready.
    let ids: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..5)
            .map(|_| s.spawn(|| cli(&["sandbox", "create", "--json"])))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                let out = h.join().unwrap();
                assert!(out.status.success(), "{}", text(&out.stderr));
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                v["id"].as_str().unwrap().to_string()
            })
            .collect()
    });
    let mut all = ids.clone();
    all.push(first.clone());
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 6, "{all:?}");
    for id in &all {
        let out = cli(&["sandbox", "exec", id, "--", "hostname"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), id);
    }
    // Six creates within a minute: the configuration now keeps six ready (FORKBOX_POOL_MAX
    // allows sixteen), made one at a time since nobody waits.
    let slot = || -> serde_json::Value {
        let out = cli(&["pool", "ls", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["slots"][0].clone()
    };
    assert_eq!(slot()["target"], 6, "{}", slot());
    assert!(
        infra::wait_until(Duration::from_secs(120), || slot()["ready"] == 6),
        "{}",
        slot()
    );
    // Nothing more is being made: six sandboxes and the pool's six.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(slot()["ready"], 6);
    let entries = infra::run_entries(&paths);
    assert_eq!(entries.len(), 12, "{entries:?}");
    for id in &all {
        assert!(cli(&["sandbox", "rm", id]).status.success());
    }
    stop_daemon(&paths);
}

/// One restore, one save (~3 s under TCG) and one resume. Hibernate frees the VM and keeps
/// the sandbox (id, labels, processes) on disk, across a daemon restart; resume brings it back.
#[test]
fn hibernate_survives_a_daemon_restart_and_resume_keeps_processes() {
    let paths = infra::isolated_home("hibernate");
    stop_daemon(&paths);
    forkbox_engine::tree::remove_tree(&paths.snapshots()).unwrap();
    let created: serde_json::Value = serde_json::from_slice(
        &run(
            &paths,
            &["sandbox", "create", "--label", "keep=me", "--json"],
        )
        .stdout,
    )
    .unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("sb-"), "{id}");
    assert!(created["qemu_pid"].as_u64().is_some(), "{created}");
    let out = run(&paths, &["sandbox", "exec", &id, "--", "sh", "-c",
        "echo on-disk > /root/f; setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.3; done' >/dev/null 2>&1 < /dev/null &"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let qemus = infra::processes_mentioning(&paths.run().join(&id).display().to_string());
    assert!(!qemus.is_empty());

    let out = run(&paths, &["sandbox", "hibernate", &id, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let slept: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(slept[0]["state"], "hibernated", "{slept}");
    assert!(slept[0].get("qemu_pid").is_none(), "no VM, no pid: {slept}");
    assert!(
        infra::wait_until(Duration::from_secs(10), || infra::processes_mentioning(
            &paths.run().join(&id).display().to_string()
        )
        .is_empty()),
        "the VM of a hibernated sandbox is gone"
    );
    let out = run(&paths, &["sandbox", "exec", &id, "--", "true"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("hibernated"),
        "{}",
        text(&out.stderr)
    );

    // A daemon restart keeps it, hibernated, with its labels.
    stop_daemon(&paths);
    let out = run(&paths, &["sandbox", "ls", "--label", "keep=me"]);
    assert!(
        text(&out.stdout).contains(&id) && text(&out.stdout).contains("hibernated"),
        "{}",
        text(&out.stdout)
    );
    // Filtered by state.
    let out = run(&paths, &["sandbox", "ls", "--state", "hibernated"]);
    assert!(text(&out.stdout).contains(&id), "{}", text(&out.stdout));
    let out = run(&paths, &["sandbox", "ls", "--state", "running"]);
    assert!(!text(&out.stdout).contains(&id), "{}", text(&out.stdout));
    let out = run(&paths, &["sandbox", "ls", "--state", "asleep"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not one of running, disk_full, sleeping, hibernated"),
        "{}",
        text(&out.stderr)
    );

    let out = run(&paths, &["sandbox", "resume", &id, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let resumed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        resumed["created_unix"], created["created_unix"],
        "{resumed}"
    );
    assert!(resumed["qemu_pid"].as_u64().is_some(), "{resumed}");
    let out = run(&paths, &["sandbox", "exec", &id, "--", "sh", "-c",
        "cat /root/f; a=$(cat /tmp/n); for i in $(seq 100); do sleep 0.1; [ \"$(cat /tmp/n)\" != \"$a\" ] && echo counting && break; done"]);
    assert_eq!(
        text(&out.stdout),
        "on-disk\ncounting\n",
        "{}",
        text(&out.stderr)
    );
    let out = run(&paths, &["sandbox", "resume", &id]);
    assert!(
        text(&out.stderr).contains("not hibernated"),
        "{}",
        text(&out.stderr)
    );
    a_command_sleeps_with_its_sandbox(&paths, &id);
    the_time_asleep_passes_for_the_guest(&paths, &id);
    disk_only_hibernation_boots_from_the_disk(&paths, &id);

    // Deleting it removes its snapshot and disks too.
    assert!(run(&paths, &["sandbox", "rm", &id]).status.success());
    let out = run(&paths, &["snapshot", "ls"]);
    assert_eq!(text(&out.stdout).trim(), "no snapshots");
    assert!(!paths.disks().join(&id).exists(), "its disks are removed");
    stop_daemon(&paths);
}

/// Starts `sh -c script` detached in sandbox `id`; its command id.
fn detached_sh(paths: &forkbox_engine::paths::Paths, id: &str, script: &str) -> String {
    let out = run(
        paths,
        &["sandbox", "exec", "--detach", id, "--", "sh", "-c", script],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_string()
}

/// Part of the hibernate test (its sandbox, resumed): a guest woken from hibernation sees the
/// time it slept pass (under TCG, up to 10 s of it), as E2B's sandboxes do after a pause: its
/// monotonic clock counts the 4 s it slept (it stood still before), and a `sleep 2` begun
/// before the hibernation is over as it wakes.
fn the_time_asleep_passes_for_the_guest(paths: &forkbox_engine::paths::Paths, id: &str) {
    let uptime = || -> f64 {
        let out = run(paths, &["sandbox", "exec", id, "--", "cat", "/proc/uptime"]);
        let t = text(&out.stdout);
        t.split_whitespace()
            .next()
            .and_then(|u| u.parse().ok())
            .unwrap_or_else(|| panic!("{t}"))
    };
    detached_sh(paths, id, "rm -f /tmp/slept; sleep 2; touch /tmp/slept");
    let before = uptime();
    assert!(run(paths, &["sandbox", "hibernate", id]).status.success());
    std::thread::sleep(Duration::from_secs(4));
    let out = run(paths, &["sandbox", "resume", id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let after = uptime();
    println!("the guest's uptime went from {before:.2} s to {after:.2} s over a 4 s hibernation");
    assert!(
        after - before >= 4.0,
        "the guest's clock stood still: {before} -> {after}"
    );
    let out = run(paths, &["sandbox", "exec", id, "--", "sh", "-c",
        "for i in 1 2 3 4 5 6 7 8 9 10; do [ -e /tmp/slept ] && echo slept && break; sleep 0.1; done"]);
    assert_eq!(text(&out.stdout), "slept\n", "{}", text(&out.stderr));
}

/// Part of the hibernate test (its sandbox, resumed): a command started before a hibernation
/// (with the same daemon) goes on after the resume, and `attach` follows it from its start
/// across the pause to its end and exit code.
fn a_command_sleeps_with_its_sandbox(paths: &forkbox_engine::paths::Paths, id: &str) {
    let cmd = detached_sh(
        paths,
        id,
        "echo before; while [ ! -e /tmp/go ]; do sleep 0.2; done; echo after; exit 7",
    );
    assert!(run(paths, &["sandbox", "hibernate", id]).status.success());
    let out = run(paths, &["sandbox", "resume", id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        run(paths, &["sandbox", "exec", id, "--", "touch", "/tmp/go"])
            .status
            .success()
    );
    let out = run(paths, &["sandbox", "attach", id, &cmd]);
    assert_eq!(
        text(&out.stdout),
        "before\nafter\n",
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
}

/// Part of the hibernate test (its sandbox, resumed, its counter running): hibernated with
/// `--disk-only` and resumed across a daemon restart, the sandbox boots from its disk: a file
/// written just before is there, its hostname and machine id are its own, its boot id is new,
/// and its processes (the counter) are gone.
fn disk_only_hibernation_boots_from_the_disk(paths: &forkbox_engine::paths::Paths, id: &str) {
    let ids = "echo written-last > /root/last; hostname; cat /etc/machine-id; \
               cat /proc/sys/kernel/random/boot_id";
    let out = run(paths, &["sandbox", "exec", id, "--", "sh", "-c", ids]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let before: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    let out = run(paths, &["sandbox", "hibernate", "--disk-only", id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    stop_daemon(paths);
    let out = run(paths, &["sandbox", "resume", id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ids = "cat /root/last /root/f; hostname; cat /etc/machine-id; \
               cat /proc/sys/kernel/random/boot_id; a=$(cat /tmp/n 2>/dev/null); sleep 1.5; \
               [ \"$(cat /tmp/n 2>/dev/null)\" = \"$a\" ] && echo still";
    let out = run(paths, &["sandbox", "exec", id, "--", "sh", "-c", ids]);
    let after: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    assert_eq!(
        after.len(),
        6,
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        after[..2],
        ["written-last", "on-disk"],
        "its files: {after:?}"
    );
    assert_eq!(
        after[2..4],
        before[..2],
        "its hostname and machine id: {after:?}"
    );
    assert_ne!(after[4], before[2], "a new boot id");
    assert_eq!(after[5], "still", "its counter did not come back");
}

/// One restore. A full host disk, through the daemon and across its SIGKILL: the sandbox's disk
/// directory is a 96 MiB tmpfs and the guest copies 160 MB to its (much larger) disk. QEMU
/// pauses the guest on the host's ENOSPC; the sandbox is listed `disk_full` and a command is
/// refused at once with the reason; a new daemon (the old one killed) sees it the same; once
/// the tmpfs grows it resumes by itself and the copy finishes intact. ~40 s.
#[test]
fn a_full_host_disk_pauses_the_sandbox_and_loses_nothing() {
    let paths = infra::isolated_home("disk-full");
    stop_daemon(&paths);
    // The tmpfs is mounted in a mount namespace of this test's own (its daemons are started
    // from here, so they see it): never on the host, gone with the test's processes however
    // the test ends.
    infra::private_mounts();
    let disks = paths.disks();
    forkbox_engine::tree::remove_tree(&disks).unwrap();
    std::fs::create_dir_all(&disks).unwrap();
    let mount = |opts: &[&str]| {
        let s = std::process::Command::new("mount")
            .args(opts)
            .arg(&disks)
            .status()
            .unwrap();
        assert!(s.success(), "mount {opts:?}");
    };
    mount(&["-t", "tmpfs", "-o", "size=96m", "tmpfs"]);
    let created = run(&paths, &["sandbox", "create"]);
    let id = text(&created.stdout).trim().to_string();
    assert!(
        id.starts_with("sb-"),
        "{id}: {}\n-- the daemon's log:\n{}",
        text(&created.stderr),
        std::fs::read_to_string(paths.home().join("daemon.log")).unwrap_or_default()
    );
    let out = run(&paths, &["sandbox", "exec", &id, "--", "sh", "-c",
        "head -c 160000000 /dev/urandom > /dev/shm/src && setsid sh -c 'cp /dev/shm/src /root/big && sync && cmp /dev/shm/src /root/big && echo same > /root/done' >/dev/null 2>&1 </dev/null &"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed =
        |state: &str| text(&run(&paths, &["sandbox", "ls", "--state", state]).stdout).contains(&id);
    assert!(
        infra::wait_until(Duration::from_secs(120), || listed("disk_full")),
        "the sandbox was never listed disk_full"
    );
    let started = std::time::Instant::now();
    let out = run(&paths, &["sandbox", "exec", &id, "--", "true"]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once"
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("is full")
            && err.contains("nothing lost")
            && err.contains(&disks.display().to_string()),
        "{err}"
    );
    let dl = tempfile::tempdir().unwrap();
    let out = run(
        &paths,
        &[
            "sandbox",
            "download",
            &id,
            "/etc/hostname",
            &dl.path().display().to_string(),
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is full"),
        "{}",
        text(&out.stderr)
    );
    // A daemon killed and replaced meanwhile sees the sandbox held too.
    kill_daemon_hard(&paths);
    assert!(listed("disk_full"), "a new daemon lost the disk_full state");
    // Space comes back: the sandbox resumes by itself and the copy completes intact.
    mount(&["-o", "remount,size=600m"]);
    assert!(
        infra::wait_until(Duration::from_secs(15), || listed("running")),
        "the sandbox did not resume once space was freed"
    );
    let done = (0..120)
        .find_map(|_| {
            let out = run(&paths, &["sandbox", "exec", &id, "--", "cat", "/root/done"]);
            if out.status.success() {
                return Some(text(&out.stdout));
            }
            std::thread::sleep(Duration::from_secs(1));
            None
        })
        .unwrap_or_default();
    assert_eq!(done, "same\n", "the copy did not complete intact");
    assert!(run(&paths, &["sandbox", "rm", &id]).status.success());
    stop_daemon(&paths);
}

/// No VM. `forkbox doctor` names every check, fails on a home other users can read, and says
/// the command that fixes it; it does not change the home itself.
#[test]
fn doctor_reports_a_loose_home_and_how_to_fix_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    let paths = forkbox_engine::paths::Paths::new(&home);
    let out = run(&paths, &["doctor", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let checks: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    for want in [
        "accelerator",
        "home",
        "cgroups",
        "seccomp",
        "jail",
        "qemu",
        "daemon log",
    ] {
        assert!(names.contains(&want), "{names:?}");
    }
    let home_check = checks.iter().find(|c| c["name"] == "home").unwrap();
    assert_eq!(home_check["status"], "fail");
    assert!(home_check["fix"].as_str().unwrap().starts_with("chmod 700"));
    let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755, "doctor changed the home");

    // The QEMU `forkbox setup` installs (10.0 here) leaves no QEMU warning; an older one is
    // warned of, with what to run.
    let qemu = checks.iter().find(|c| c["name"] == "qemu").unwrap();
    let detail = qemu["found"].as_str().unwrap_or_default();
    match forkbox_engine::vm::program::version() {
        Some(v) if v >= (9, 0) => {
            assert_eq!(qemu["status"], "ok", "{qemu}");
            assert!(detail.contains("read-only"), "{qemu}");
        }
        _ => {
            assert_eq!(qemu["status"], "warn", "{qemu}");
            assert!(
                qemu["fix"].as_str().unwrap().contains("forkbox setup"),
                "{qemu}"
            );
        }
    }
}

/// `forkbox` as `run` gives it, fed `input` on standard input.
fn run_with_stdin(paths: &forkbox_engine::paths::Paths, args: &[&str], input: &[u8]) -> Output {
    watched(paths, args, forkbox(paths).args(args), Some(input))
}

/// Two restores and a fork. Habits people bring from docker: sizes and durations with units,
/// stdin passed with -i and refused (never dropped) without it, signals by name, several ids to
/// rm, `ls -q`; forkbox's own snapshots hidden from `snapshot ls` unless --all.
#[test]
fn docker_habits_work_through_the_daemon() {
    let paths = infra::isolated_home("habits");
    stop_daemon(&paths);
    let out = run(
        &paths,
        &[
            "sandbox", "create", "--memory", "1g", "--ttl", "10m", "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["memory_mib"], 1024, "{v}");
    let a = v["id"].as_str().unwrap().to_string();

    // One vocabulary: a program that is not there exits 127 with the same words from `run`
    // and `sandbox exec` (streamed or --json); errors under --json are JSON with a code.
    let out = run(&paths, &["run", "-q", "--", "no-such-program"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains("no-such-program"), "{said}");
    let out = run(&paths, &["sandbox", "exec", &a, "--", "no-such-program"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), said);
    let out = run(
        &paths,
        &["sandbox", "exec", &a, "--json", "--", "no-such-program"],
    );
    assert_eq!(out.status.code(), Some(127));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["exit_code"], 127);
    assert_eq!(r["stderr"].as_str().unwrap(), said);
    let out = run(
        &paths,
        &["sandbox", "exec", "sb-nosuch", "--json", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(125));
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["error"]["code"], "sandbox_not_found", "{e}");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("sb-nosuch"));
    let out = run(&paths, &["sandbox", "create", "--memory", "10", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["error"]["code"], "usage", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("--memory"));
    let out = run(&paths, &["image", "rm", "no-such-image@1", "--json"]);
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["error"]["code"], "image_not_found", "{e}");

    // Standard input: refused without -i, passed whole with it.
    let out = run_with_stdin(&paths, &["sandbox", "exec", &a, "--", "cat"], b"hi\n");
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("pass -i"),
        "{}",
        text(&out.stderr)
    );
    let out = run_with_stdin(&paths, &["sandbox", "exec", "-i", &a, "--", "cat"], b"hi\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let out = run_with_stdin(
        &paths,
        &["sandbox", "exec", "-i", &a, "--", "sha256sum"],
        &big,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let want = format!("{:x}", Sha256::digest(&big));
    assert!(
        text(&out.stdout).starts_with(&want),
        "{}",
        text(&out.stdout)
    );

    // A detached command, its id as JSON, a signal by name, its exit as the shell says it.
    let out = run(
        &paths,
        &[
            "sandbox", "exec", &a, "--detach", "--json", "--", "sleep", "600",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let started: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cid = started["command_id"].as_str().unwrap().to_string();
    let out = run(
        &paths,
        &["sandbox", "kill", &a, &cid, "--signal", "KILL", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sent: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sent["signal"], 9);
    let out = run(&paths, &["sandbox", "attach", &a, &cid]);
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));

    // Download: links stay links, sparse files sparse; a missing path is a 404 in words.
    let out = run(
        &paths,
        &[
            "sandbox",
            "exec",
            &a,
            "--",
            "sh",
            "-c",
            "mkdir -p /root/t/venv && ln -s /usr/bin/python3 /root/t/venv/python \
             && truncate -s 256M /root/t/sparse && echo end >> /root/t/sparse",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let host = tempfile::tempdir().unwrap();
    let dest = host.path().join("t");
    let out = run(
        &paths,
        &["sandbox", "download", &a, "/root/t", dest.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_link(dest.join("venv/python")).unwrap(),
        std::path::Path::new("/usr/bin/python3")
    );
    let sparse = std::fs::metadata(dest.join("sparse")).unwrap();
    assert_eq!(sparse.len(), (256 << 20) + 4);
    assert!(std::os::unix::fs::MetadataExt::blocks(&sparse) * 512 < 4 << 20);
    let out = run(
        &paths,
        &[
            "sandbox",
            "download",
            &a,
            "/root/nosuch",
            host.path().join("n").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("/root/nosuch") && !err.contains("decoding"),
        "{err}"
    );
    assert!(!host.path().join("n").exists());

    // A fork of the running sandbox leaves a snapshot of forkbox's own, hidden unless --all.
    let out = run(&paths, &["sandbox", "fork", &a]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let b = ids(&out).remove(0);
    let out = run(&paths, &["snapshot", "ls", "-q"]);
    assert_eq!(text(&out.stdout), "", "{}", text(&out.stderr));
    let out = run(&paths, &["snapshot", "ls", "--all", "-q"]);
    assert!(
        text(&out.stdout).contains("fork-of-"),
        "{}",
        text(&out.stdout)
    );

    // ls -q: the ids alone; rm takes several and says which it could not remove.
    let out = run(&paths, &["sandbox", "ls", "-q"]);
    let mut listed: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    listed.sort();
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(listed, both);
    let out = run(&paths, &["sandbox", "rm", &a, "sb-nosuch", &b]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("sb-nosuch"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout), format!("removed {a}\nremoved {b}\n"));
    assert_eq!(text(&run(&paths, &["sandbox", "ls", "-q"]).stdout), "");
    stop_daemon(&paths);
}

/// No VM. Shell completions and man pages come from the command line's own definition.
#[test]
fn completions_and_man_pages_are_generated() {
    let paths = infra::home();
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&paths, &["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("sandbox"), "{shell}");
    }
    let script = run(&paths, &["completions", "bash"]).stdout;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("forkbox.bash"), &script).unwrap();
    let st = Command::new("bash")
        .arg("-n")
        .arg(dir.path().join("forkbox.bash"))
        .status()
        .unwrap();
    assert!(st.success(), "bash rejects the completion script");
    let out = run(&paths, &["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(dir.path().join("forkbox-sandbox-exec.1")).unwrap();
    assert!(
        page.contains("\\-\\-interactive") || page.contains("interactive"),
        "{page}"
    );
    let out = run(&paths, &["man"]);
    assert!(
        text(&out.stdout).starts_with(".ie"),
        "{}",
        text(&out.stdout)
    );
}

/// One restore for the sandbox, one for the pool. The warm pool is visible (`pool ls`, `daemon
/// status`), bounded by the memory it may take, and gives its sandboxes back when unused;
/// `daemon stop` stops the daemon.
#[test]
fn the_pool_is_visible_bounded_and_shrinks_when_idle() {
    let paths = infra::isolated_home("pool-bounds");
    stop_daemon(&paths);
    let cli = cli_with(
        &paths,
        &[
            ("FORKBOX_POOL_SIZE", "2"),
            ("FORKBOX_POOL_MEMORY_MIB", "1024"),
            ("FORKBOX_POOL_IDLE_SECS", "15"),
        ],
    );
    let out = cli(&["daemon", "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("not running"));
    let out = cli(&["sandbox", "create"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let pool = || -> serde_json::Value {
        serde_json::from_slice(&cli(&["pool", "ls", "--json"]).stdout).unwrap()
    };
    assert!(
        infra::wait_until(Duration::from_secs(60), || pool()["slots"][0]["ready"] == 1),
        "{}",
        pool()
    );
    // Two per size were asked for, but 1024 MiB in all leaves room for one 1 GiB sandbox.
    std::thread::sleep(Duration::from_secs(3));
    let p = pool();
    assert_eq!(p["slots"][0]["ready"], 1, "{p}");
    assert_eq!(p["memory_mib"], 1024, "{p}");
    assert_eq!(
        p["slots"][0]["image"].as_str().unwrap().split('@').next(),
        Some("python-bookworm")
    );
    let status: serde_json::Value =
        serde_json::from_slice(&cli(&["daemon", "status", "--json"]).stdout).unwrap();
    assert_eq!(status["running"], true, "{status}");
    assert_eq!(status["sandboxes"], 1, "{status}");
    // Unused for 15 s, the pool gives its sandbox back.
    assert!(
        infra::wait_until(Duration::from_secs(60), || pool()["slots"]
            .as_array()
            .is_some_and(|s| s.is_empty())),
        "{}",
        pool()
    );
    assert!(cli(&["sandbox", "rm", &id]).status.success());
    let out = cli(&["daemon", "stop"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("stopped the daemon"));
    assert_eq!(cli(&["daemon", "status"]).status.code(), Some(1));
    assert!(text(&cli(&["daemon", "stop"]).stdout).contains("no daemon runs"));
}

/// A PID file left by a daemon that died (SIGKILL, a crash) names a number that may since
/// belong to any process. Promise: `daemon status` and `daemon stop` see no daemon there and
/// signal nothing; the process that has the number lives on. No VM.
#[test]
fn a_stale_pid_file_never_gets_a_stranger_signalled() {
    let dir = tempfile::tempdir().unwrap();
    let paths = forkbox_engine::paths::Paths::new(dir.path().join("home"));
    std::fs::create_dir_all(paths.home()).unwrap();
    let mut stranger = Command::new("sleep").arg("600").spawn().unwrap();
    std::fs::write(forkbox_server::pid_path(&paths), stranger.id().to_string()).unwrap();
    assert_eq!(forkbox_server::running_pid(&paths), None);
    let status = forkbox(&paths)
        .args(["daemon", "status", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["running"], false, "{v}");
    assert!(v["pid"].is_null(), "{v}");
    let stop = forkbox(&paths).args(["daemon", "stop"]).output().unwrap();
    assert!(stop.status.success(), "{}", text(&stop.stderr));
    assert!(
        text(&stop.stdout).contains("no daemon runs"),
        "{}",
        text(&stop.stdout)
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "the process named by a stale PID file was signalled"
    );
    let _ = stranger.kill();
    let _ = stranger.wait();
}

/// One restore. `info --json` is the API's `info` with what this host has besides.
#[test]
fn info_json_has_the_apis_shape() {
    let paths = infra::home();
    let out = run(&paths, &["info", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for field in [
        "version",
        "protocol_version",
        "home",
        "accel",
        "kernels",
        "images",
        "sandboxes",
        "pool",
        "daemon",
        "qemu",
        "agent",
    ] {
        assert!(v.get(field).is_some(), "no {field} in {v}");
    }
    assert!(
        v["agent"].is_string(),
        "the agent's path, not a Result: {v}"
    );
    assert!(
        v["kernels"][0].as_str().unwrap().contains("cloud-amd64"),
        "{v}"
    );
    // Logs to a pipe carry no colour codes (one restore).
    infra::image(&paths, "python-bookworm");
    let out = forkbox(&paths)
        .env("FORKBOX_LOG", "debug")
        .args(["run", "-q", "--", "true"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(err.contains("DEBUG") && !err.contains('\x1b'), "{err}");
}

/// A restore and two boots' worth of commands. Terminals: `run -t`, `sandbox exec -t` and
/// `-i -t`, `sandbox shell`; Ctrl-C typed into one interrupts the command; a resize reaches it.
#[test]
fn commands_run_on_a_terminal() {
    let paths = infra::isolated_home("terminals");
    stop_daemon(&paths);
    let out = run(
        &paths,
        &[
            "run",
            "-q",
            "-t",
            "--",
            "sh",
            "-c",
            "tty; stty size; echo $TERM",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o = text(&out.stdout);
    assert!(o.contains("/dev/pts/") && o.contains("24 80"), "{o:?}");

    let id = text(&run(&paths, &["sandbox", "create"]).stdout)
        .trim()
        .to_string();
    let out = run(
        &paths,
        &[
            "sandbox",
            "exec",
            "-t",
            &id,
            "--",
            "sh",
            "-c",
            "tty; stty size",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o = text(&out.stdout);
    assert!(o.contains("/dev/pts/") && o.contains("24 80\r\n"), "{o:?}");

    // Typed input reaches a shell on the terminal; its exit code comes back.
    let out = run_with_stdin(
        &paths,
        &["sandbox", "exec", "-i", "-t", &id, "--", "sh"],
        b"echo hi-$((1+1))\nexit 3\n",
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("hi-2"),
        "{:?}",
        text(&out.stdout)
    );

    // Ctrl-C typed into the terminal interrupts the command (SIGINT: 130), long before it ends
    // (however busy the host: its sleep is ten minutes).
    let started = std::time::Instant::now();
    let out = run_with_stdin(
        &paths,
        &[
            "sandbox",
            "exec",
            "-i",
            "-t",
            &id,
            "--",
            "sh",
            "-c",
            "sleep 600",
        ],
        b"\x03",
    );
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(300),
        "{:?}",
        started.elapsed()
    );

    // A login shell: bash, where the image has it.
    let out = run_with_stdin(&paths, &["sandbox", "shell", &id], b"echo shell=$0\nexit\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("shell=bash"),
        "{:?}",
        text(&out.stdout)
    );

    // A resize reaches the command (through the API, as `exec -t` sends it on SIGWINCH).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let printed = rt.block_on(async {
        use base64::Engine as _;
        let c = forkbox_client::Client::new(forkbox_client::Endpoint::Unix(
            forkbox_server::socket_path(&paths),
        ))
        .unwrap();
        let req = forkbox_engine::api::ExecRequest {
            shell: Some("sleep 3; stty size".into()),
            tty: Some(forkbox_engine::api::TerminalSize { rows: 24, cols: 80 }),
            ..Default::default()
        };
        let cid = c.start_command(&id, &req).await.unwrap().command_id;
        c.resize(
            &id,
            &cid,
            forkbox_engine::api::TerminalSize {
                rows: 50,
                cols: 132,
            },
        )
        .await
        .unwrap();
        let mut events = c.attach(&id, &cid).await.unwrap();
        let mut printed = Vec::new();
        while let Some(ev) = events.next().await.unwrap() {
            match ev {
                forkbox_engine::api::CommandEvent::Stdout { data_b64 } => printed.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(data_b64)
                        .unwrap(),
                ),
                forkbox_engine::api::CommandEvent::Exit(_) => break,
                forkbox_engine::api::CommandEvent::Command { .. } => {}
                other => panic!("{other:?}"),
            }
        }
        String::from_utf8(printed).unwrap()
    });
    assert_eq!(printed, "50 132\r\n");
    assert!(run(&paths, &["sandbox", "rm", &id]).status.success());
    stop_daemon(&paths);
}

/// Two restores. A forkbox installed as scripts/install.sh lays it out (PREFIX/bin/forkbox,
/// PREFIX/lib/forkbox/forkbox-agent) finds its agent there, away from any build tree; alone,
/// it uses the agent built into it.
#[test]
fn an_installed_forkbox_finds_its_agent_beside_it() {
    let paths = ready();
    let prefix = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(prefix.path().join("bin")).unwrap();
    std::fs::create_dir_all(prefix.path().join("lib/forkbox")).unwrap();
    let bin = prefix.path().join("bin/forkbox");
    std::fs::copy(env!("CARGO_BIN_EXE_forkbox"), &bin).unwrap();
    let agent = infra::repo_root().join("target/x86_64-unknown-linux-gnu/agent/forkbox-agent");
    std::fs::copy(&agent, prefix.path().join("lib/forkbox/forkbox-agent")).unwrap();
    let out = Command::new(&bin)
        .env("FORKBOX_HOME", paths.home())
        .env_remove("FORKBOX_AGENT")
        .env_remove("FORKBOX_IMAGE")
        .env("FORKBOX_NO_TCG_NOTICE", "1")
        .args(["run", "--", "echo", "installed"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "installed\n");
    // Without the agent there, the one built into the binary (the build embeds the agent it
    // finds, see crates/cli/build.rs) is put in a home of its own and used: a binary installed
    // alone (`cargo install`) runs sandboxes.
    std::fs::remove_file(prefix.path().join("lib/forkbox/forkbox-agent")).unwrap();
    let alone = tempfile::tempdir().unwrap();
    for sub in ["kernels", "images", "cache", "templates"] {
        std::os::unix::fs::symlink(paths.home().join(sub), alone.path().join(sub)).unwrap();
    }
    let out = Command::new(&bin)
        .env("FORKBOX_HOME", alone.path())
        .env_remove("FORKBOX_AGENT")
        .env_remove("FORKBOX_IMAGE")
        .env("FORKBOX_NO_TCG_NOTICE", "1")
        .args(["run", "--", "echo", "built in"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "built in\n");
    assert_eq!(
        std::fs::read(alone.path().join("agent/forkbox-agent")).unwrap(),
        std::fs::read(&agent).unwrap()
    );
    // An agent the user names is used or refused, never replaced: the error says how to
    // install one.
    let out = Command::new(&bin)
        .env("FORKBOX_HOME", paths.home())
        .env("FORKBOX_AGENT", prefix.path().join("no-such-agent"))
        .args(["run", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("scripts/install.sh"),
        "{}",
        text(&out.stderr)
    );
}

/// A home of its own with no images, sharing the test home's kernels and caches (the kernel
/// and the caches are made first); its directory.
fn imageless_home(name: &str) -> std::path::PathBuf {
    let shared = infra::home();
    infra::image(&shared, "python-bookworm");
    let dir = shared.home().join("homes").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for sub in ["kernels", "cache"] {
        std::os::unix::fs::symlink(shared.home().join(sub), dir.join(sub)).unwrap();
    }
    dir
}

/// One image build (~1-2 min) and one boot. In a home with no images, `run` builds the default
/// image from the recipe inside forkbox, saying so step by step, then makes its template,
/// saying that too, and runs the command.
#[test]
fn the_default_image_builds_itself_on_first_use() {
    let dir = imageless_home("first-use");
    let paths = forkbox_engine::paths::Paths::new(dir.clone());
    let out = run(&paths, &["run", "--", "python3", "-V"]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        text(&out.stdout).starts_with("Python 3.11."),
        "{}",
        text(&out.stdout)
    );
    assert!(
        err.contains(
            "image python-bookworm is not built yet; building it from forkbox's own recipe"
        ),
        "{err}"
    );
    assert!(err.contains("[1/"), "build steps are said: {err}");
    assert!(
        err.contains("boots once to make its template"),
        "a wait of seconds says what it waits for: {err}"
    );
    // The next run finds it built and says nothing of the kind.
    let out = run(&paths, &["run", "-q", "--", "true"]);
    assert!(out.status.success());
    assert_eq!(text(&out.stderr), "");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One image build (~20 s) and a small migration. In a home with no images, `migrate --from
/// node-bookworm` builds the bundled image as `run` does, saying so step by step (it stopped
/// with "no image node-bookworm"), and the migration runs on it.
#[test]
fn migrate_builds_the_bundled_images_on_first_use() {
    let dir = imageless_home("first-use-migrate");
    let paths = forkbox_engine::paths::Paths::new(dir.clone());
    let work = tempfile::tempdir().unwrap();
    let code = work.path().join("code");
    std::fs::create_dir_all(&code).unwrap();
    std::fs::write(
        code.join("suite.js"),
        "console.log('TAP version 13\\n# adds\\nok 1 should be equal\\n\\n1..1');\n",
    )
    .unwrap();
    let plans = work.path().join("plans.toml");
    std::fs::write(
        &plans,
        "[[plan]]\nname = \"keep\"\ninstructions = \"nothing\"\nporter = { command = \"true\" }\n",
    )
    .unwrap();
    let out = forkbox(&paths)
        .args([
            "migrate",
            "--from",
            "node-bookworm",
            "--to",
            "node-bookworm",
        ])
        .arg("--code")
        .arg(&code)
        .args(["--test", "node suite.js", "--runs", "1"])
        .arg("--plans")
        .arg(&plans)
        .arg("--out")
        .arg(work.path().join("out"))
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("image node-bookworm is not built yet; building it from forkbox's own recipe"),
        "{err}"
    );
    assert!(err.contains("[1/"), "build steps are said: {err}");
    assert!(text(&out.stdout).contains("keep"), "{}", text(&out.stdout));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An image build on another (~30 s), two restores. `image rm` of an image the warm pool holds
/// ready copies of succeeds: the daemon stops them first.
#[test]
fn image_rm_drains_the_pool_instead_of_refusing() {
    let paths = infra::isolated_home("pool-drain");
    stop_daemon(&paths);
    let recipe = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        recipe.path(),
        "name = \"pool-drain\"\nbase = \"python-bookworm\"\nrun = [\"echo drained > /etc/pool-drain\"]\n",
    )
    .unwrap();
    let out = run(
        &paths,
        &[
            "image",
            "build",
            "-f",
            recipe.path().to_str().unwrap(),
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let image: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let reference = image["reference"].as_str().unwrap().to_string();
    let cli = cli_with(&paths, &[("FORKBOX_POOL_SIZE", "1")]);
    let out = cli(&["sandbox", "create", "--image", &reference]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let ready = || -> u64 {
        let v: serde_json::Value =
            serde_json::from_slice(&cli(&["pool", "ls", "--json"]).stdout).unwrap();
        v["slots"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["image"] == reference.as_str())
            .map(|s| s["ready"].as_u64().unwrap())
            .sum()
    };
    assert!(infra::wait_until(Duration::from_secs(90), || ready() == 1));
    // In use by a sandbox: refused, and says by which.
    let out = cli(&["image", "rm", &reference]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(&id), "{}", text(&out.stderr));
    // Held only by the pool: removed, the pooled copy stopped.
    assert!(cli(&["sandbox", "rm", &id]).status.success());
    let out = cli(&["image", "rm", &reference]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(ready(), 0);
    stop_daemon(&paths);
}

/// `image build -f` tells a Dockerfile from a recipe by its name or its first instruction, and
/// a Dockerfile instruction forkbox does not build is refused by name and line before anything
/// runs.
#[test]
fn image_build_refuses_unsupported_dockerfile_instructions_by_name_and_line() {
    let paths = infra::isolated_home("dockerfile-refusals");
    let dir = tempfile::tempdir().unwrap();
    for (name, body, line, what) in [
        (
            "Dockerfile",
            "FROM python:3.8-slim\nHEALTHCHECK CMD true\n",
            2,
            "HEALTHCHECK is not supported",
        ),
        (
            "build-file",
            "# no name hint\nFROM debian\nRUN --mount=type=cache,target=/x true\n",
            3,
            "RUN --mount is not supported",
        ),
        (
            "Dockerfile.dev",
            "FROM a\nADD https://example.com/x /x\n",
            2,
            "ADD from a URL",
        ),
    ] {
        let f = dir.path().join(name);
        std::fs::write(&f, body).unwrap();
        let out = run(
            &paths,
            &[
                "image",
                "build",
                "-f",
                f.to_str().unwrap(),
                "--name",
                "refused",
            ],
        );
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{name}: {err}");
        assert!(
            err.contains(&format!("Dockerfile line {line}: {what}")),
            "{name}: {err}"
        );
    }
    assert!(!paths.images().join("refused").join("1").exists());
}

/// No VM: a `--tests` glob that does not parse is a usage error naming it, before anything
/// boots.
#[test]
fn a_bad_tests_glob_is_refused_by_name() {
    let paths = infra::home();
    let examples = infra::repo_root().join("examples");
    let out = tempfile::tempdir().unwrap();
    let o = forkbox(&paths)
        .args([
            "migrate",
            "--from",
            "python-bullseye",
            "--to",
            "python-trixie",
        ])
        .arg("--code")
        .arg(examples.join("legacykit"))
        .args(["--test", "python3 -m pytest -q"])
        .arg("--plans")
        .arg(examples.join("plans/plans.toml"))
        .arg("--out")
        .arg(out.path())
        .args(["--tests", "tests/**", "--tests", "checks/[a-"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--tests \"checks/[a-\""),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

/// Two restores (the pool's copy, then its refill). With a daemon running, `run` takes a ready
/// copy from its warm pool, runs the command and removes the sandbox; a sandbox whose `run` is
/// killed holds only a lease (a TTL the run renews), so the daemon removes it.
#[test]
fn run_goes_through_a_running_daemon_and_its_warm_pool() {
    let paths = infra::isolated_home("run-daemon");
    stop_daemon(&paths);
    let daemon = |args: &[&str]| {
        forkbox(&paths)
            .env_remove("FORKBOX_RUN_LOCAL")
            .env("FORKBOX_POOL_SIZE", "1")
            .args(args)
            .output()
            .unwrap()
    };
    // The first `sandbox` call starts the daemon.
    let out = daemon(&["sandbox", "ls"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Streamed output and the exit code, as without a daemon; the sandbox was restored for
    // this call, and the pool now keeps a copy of this image and size ready.
    let out = daemon(&[
        "run",
        "--quiet",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 5",
    ]);
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n");
    assert!(
        infra::wait_until(Duration::from_secs(60), || {
            let o = daemon(&["pool", "ls"]);
            text(&o.stdout).lines().any(|l| {
                l.starts_with("python-bookworm@") && l.split_whitespace().nth(4) == Some("1")
            })
        }),
        "{}",
        text(&daemon(&["pool", "ls"]).stdout)
    );
    // ... and is handed out once warmed up.
    std::thread::sleep(Duration::from_secs(3));
    let out = daemon(&[
        "run",
        "--json",
        "--",
        "sh",
        "-c",
        "echo from-the-pool; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["stdout"], "from-the-pool\n");
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["from_pool"], true, "{r}");
    // Removed when done.
    let id = r["sandbox"]["id"].as_str().unwrap().to_string();
    let out = daemon(&["sandbox", "ls", "-q"]);
    assert!(!text(&out.stdout).contains(&id), "{}", text(&out.stdout));

    // A killed `run` leaves a sandbox that expires: its lease is at most two minutes.
    let mut child = started_saying(
        forkbox(&paths)
            .env_remove("FORKBOX_RUN_LOCAL")
            .env("FORKBOX_POOL_SIZE", "1")
            .args(["run", "--quiet", "--", "sh", "-c", "echo ready; sleep 600"]),
        "ready",
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let out = daemon(&["sandbox", "ls", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let left: Vec<&serde_json::Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["labels"]["forkbox-run"].is_string())
        .collect();
    assert_eq!(left.len(), 1, "{list}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expires = left[0]["expires_unix"].as_u64().unwrap();
    assert!(expires <= now + 121, "expires in {} s", expires - now);
    stop_daemon(&paths);
    let id = left[0]["id"].as_str().unwrap();
    let _ = daemon(&["sandbox", "rm", id]);
    stop_daemon(&paths);
}

/// No VM. An id that is empty (a `$(...)` that printed nothing) or no id at all is refused by
/// the command line, in words, before the daemon is asked.
#[test]
fn empty_and_malformed_sandbox_ids_are_refused_in_words() {
    let paths = infra::isolated_home("bad-ids");
    for args in [
        &["sandbox", "rm", ""][..],
        &["sandbox", "exec", "", "--", "true"],
        &["sandbox", "exec", "../x", "--", "true"],
        &["sandbox", "fork", "a b"],
    ] {
        let out = run(&paths, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains("forkbox sandbox ls"), "{args:?}: {err}");
        assert!(!err.contains("404"), "{args:?}: {err}");
    }
    // Nothing was started to answer them.
    assert!(!forkbox_server::pid_path(&paths).exists());
}

/// `forkbox sandbox network` replaces a running sandbox's policy: the proxy appears in its
/// commands' environment with a network and goes with none; a hibernated sandbox is told to
/// resume first; a bad host is a usage error.
#[test]
fn a_running_sandboxs_network_is_replaced() {
    let paths = infra::isolated_home("network-cli");
    stop_daemon(&paths);
    let id = text(&run(&paths, &["sandbox", "create"]).stdout)
        .trim()
        .to_string();
    assert!(id.starts_with("sb-"), "{id}");
    let proxy = |id: &str| {
        let out = run(
            &paths,
            &[
                "sandbox",
                "exec",
                id,
                "--",
                "sh",
                "-c",
                "echo ${HTTPS_PROXY:-none}",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    };
    assert_eq!(proxy(&id), "none");
    let out = run(
        &paths,
        &["sandbox", "network", &id, "--allow", "pypi.org", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["network"]["allow"], serde_json::json!(["pypi.org"]));
    assert_ne!(proxy(&id), "none");
    // A host the policy does not allow is refused, and `sandbox logs` says so beside it.
    let out = run(&paths, &["sandbox", "logs", &id]);
    assert!(
        text(&out.stdout).contains("none of"),
        "{}",
        text(&out.stdout)
    );
    // (The proxy's answer may come in pieces: read to its first line's end.)
    let asked = "import socket; s = socket.create_connection(('127.0.0.1', 3128)); \
                 s.sendall(b'CONNECT example.com:443 HTTP/1.1\\r\\n\\r\\n'); a = b''\n\
                 while b'\\r\\n' not in a:\n    b = s.recv(200)\n    a += b\n    \
                 if not b: break\nprint(a)";
    let out = run(
        &paths,
        &["sandbox", "exec", &id, "--", "python3", "-c", asked],
    );
    assert!(text(&out.stdout).contains("403"), "{}", text(&out.stdout));
    let out = run(&paths, &["sandbox", "logs", &id]);
    let said = text(&out.stdout);
    assert!(
        said.contains("tunnel to \"example.com\":443 refused") && said.contains("s ago"),
        "{said}"
    );
    let out = run(&paths, &["sandbox", "network", &id]);
    assert!(
        text(&out.stdout).contains("no network"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(proxy(&id), "none");
    let out = run(
        &paths,
        &["sandbox", "network", &id, "--allow", "not a host"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(run(&paths, &["sandbox", "hibernate", &id]).status.success());
    let out = run(&paths, &["sandbox", "network", &id, "--internet"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("hibernated"),
        "{}",
        text(&out.stderr)
    );
    assert!(run(&paths, &["sandbox", "rm", &id]).status.success());
    stop_daemon(&paths);
}

/// A host without CA certificates still reaches its own daemon (nothing on the Unix socket or
/// an `http://` URL needs them), and an `https://` API says what is missing.
#[test]
fn a_host_without_ca_certificates_reaches_its_own_daemon() {
    let paths = infra::fresh_home("no-ca-certificates", false);
    let no_ca = [
        ("SSL_CERT_FILE", "/nonexistent"),
        ("SSL_CERT_DIR", "/nonexistent"),
    ];
    let cli = cli_with(&paths, &no_ca);
    let out = cli(&["sandbox", "ls"]);
    let stopped = cli(&["daemon", "stop"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "no sandboxes");
    assert!(stopped.status.success(), "{}", text(&stopped.stderr));
    let out = forkbox(&paths)
        .envs(no_ca)
        .env("FORKBOX_API", "https://127.0.0.1:9")
        .args(["sandbox", "ls"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("install ca-certificates"),
        "{}",
        text(&out.stderr)
    );
}

/// `image mirror`: recorded per registry in the order given (a mirror named with http:// is
/// plain HTTP), printed, kept by `image logout`, forgotten by `--clear`; bad input refused in
/// words, nothing recorded.
#[test]
fn image_mirrors_are_recorded_printed_and_forgotten() {
    let paths = infra::fresh_home("image-mirror", false);
    let file = paths.home().join("registries.json");
    let ok = |args: &[&str]| {
        let out = run(&paths, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let out = ok(&[
        "image",
        "mirror",
        "docker.io",
        "http://127.0.0.1:5000",
        "mirror.internal",
    ]);
    assert!(
        out.contains("127.0.0.1:5000, then mirror.internal"),
        "{out}"
    );
    let kept: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(
        kept["index.docker.io"]["mirrors"],
        serde_json::json!(["127.0.0.1:5000", "mirror.internal"])
    );
    assert_eq!(kept["127.0.0.1:5000"]["insecure"], true);
    assert!(kept.get("mirror.internal").is_none(), "{kept}");
    assert!(ok(&["image", "mirror", "docker.io"]).contains("127.0.0.1:5000 mirror.internal"));
    for bad in [
        vec!["image", "mirror", "docker.io", "docker.io"],
        vec!["image", "mirror", "docker.io", "a/b"],
        vec!["image", "mirror", "docker.io", "x", "--clear"],
    ] {
        let before = std::fs::read(&file).unwrap();
        let out = run(&paths, &bad);
        assert!(!out.status.success(), "{bad:?}");
        assert!(!text(&out.stderr).trim().is_empty(), "{bad:?}");
        assert_eq!(std::fs::read(&file).unwrap(), before, "{bad:?}");
    }
    ok(&["image", "logout", "docker.io"]);
    assert!(ok(&["image", "mirror", "docker.io"]).contains("mirror.internal"));
    ok(&["image", "mirror", "docker.io", "--clear"]);
    assert!(ok(&["image", "mirror", "docker.io"]).contains("no mirrors"));
}
