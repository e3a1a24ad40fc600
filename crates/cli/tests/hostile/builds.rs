//! Image builds killed at their worst moment: while mmdebstrap has the host's `/dev/shm`,
//! `/proc` and `/sys` bound into the root it builds (it unmounts nothing when killed), and while
//! a Dockerfile step runs in its sandbox. Promise: nothing of the killed build is ever mounted
//! where the host, or anything that later removes the home, can reach it; nothing of it runs
//! on; the host's shared memory is untouched; the next build of the same name succeeds and
//! removes what the killed one left, crossing no mount.
//!
//! Each test runs in a mount namespace of its own with a private tmpfs as `/dev/shm` holding a
//! file of "another program", so the host's own `/dev/shm` is never at stake. Costs (TCG, 2
//! cores): a minimal Debian root ~30 s, `python-bookworm` ~45 s, a Dockerfile step ~15 s.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use forkbox_engine::paths::Paths;
use forkbox_engine::tree::mounts_under;
use forkbox_test_infra as infra;

use crate::{text, Daemon};

const OTHER: &str = "/dev/shm/another-program";

/// This test's own mount namespace, with a private tmpfs as `/dev/shm` holding a file that
/// belongs to "another program".
fn private_shm() {
    infra::private_mounts();
    nix::mount::mount(
        Some("tmpfs"),
        "/dev/shm",
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=64m"),
    )
    .expect("a private /dev/shm");
    std::fs::write(OTHER, "another program's shared memory").unwrap();
}

/// Processes of `home`: their command line names it, or their root or working directory is
/// inside it (a build's chroot).
fn processes_of(home: &Path) -> Vec<String> {
    let needle = home.display().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if pid.parse::<u32>().is_err() || pid == std::process::id().to_string() {
            continue;
        }
        let cmd = text(&std::fs::read(e.path().join("cmdline")).unwrap_or_default());
        let inside =
            |link: &str| std::fs::read_link(e.path().join(link)).is_ok_and(|p| p.starts_with(home));
        if cmd.contains(&needle) || inside("root") || inside("cwd") {
            found.push(format!("{pid}: {}", cmd.replace('\0', " ")));
        }
    }
    found
}

/// Waits until a process of the build runs chrooted inside its root: mmdebstrap's package
/// step, with its mounts in place (failing if `builder` ends first: its output is in `log`).
/// Its PID.
fn wait_for_package_step(home: &Path, builder: &mut Child, log: &Path, what: &str) -> u32 {
    let mut found = None;
    let seen = infra::wait_until(Duration::from_secs(600), || {
        if let Ok(Some(status)) = builder.try_wait() {
            panic!(
                "{what}: the build ended ({status}) before its package step:\n{}",
                read(log)
            );
        }
        found = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| {
                std::fs::read_link(e.path().join("root"))
                    .is_ok_and(|r| r.starts_with(home) && r.to_string_lossy().contains("/.build-"))
            })
            .and_then(|e| e.file_name().to_str()?.parse().ok());
        found.is_some()
    });
    assert!(seen, "{what}: the build never reached its package step");
    found.unwrap_or_default()
}

/// The invariants once a build is killed: nothing of it runs (after a grace for the kernel to
/// deliver the parent-death signals), and [`check_no_mount_and_shm_intact`].
fn check_nothing_left(home: &Path, what: &str) {
    let mut left = Vec::new();
    let gone = infra::wait_until(Duration::from_secs(30), || {
        left = processes_of(home);
        left.is_empty()
    });
    assert!(
        gone,
        "{what}: processes of the killed build run on: {left:#?}"
    );
    check_no_mount_and_shm_intact(home, what);
}

/// Nothing under the home is mounted; the other program's shared memory is there.
fn check_no_mount_and_shm_intact(home: &Path, what: &str) {
    assert_eq!(
        mounts_under(home),
        Vec::<PathBuf>::new(),
        "{what}: the killed build left mounts"
    );
    assert_eq!(
        std::fs::read_to_string(OTHER).unwrap_or_default(),
        "another program's shared memory",
        "{what}: another program's shared memory was touched"
    );
}

/// Work directories of builds under the home's images.
fn build_dirs(paths: &Paths) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for name in std::fs::read_dir(paths.images())
        .into_iter()
        .flatten()
        .flatten()
    {
        for e in std::fs::read_dir(name.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with(".build-") {
                dirs.push(e.path());
            }
        }
    }
    dirs
}

/// A process in a group of its own, killed with its whole group when the test ends (a test
/// that fails half-way leaves no build running).
struct Group(Child);

impl Group {
    fn kill(&self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
        let _ = self.0.wait();
    }
}

/// `forkbox ARGS` of `paths` in a process group of its own, its output in `log`.
fn spawn_cli(paths: &Paths, args: &[&str], log: &Path) -> Group {
    let out = std::fs::File::create(log).unwrap();
    let mut c = Daemon::cmd(paths);
    c.args(args)
        .process_group(0)
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    Group(c.spawn().expect("start forkbox"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The build `args` run again after the kill (the killed one's output in `log`): it succeeds,
/// makes `name`@1, and leaves no work directory and nothing else behind.
fn build_again(paths: &Paths, args: &[&str], log: &Path, name: &str) {
    let out = Daemon::cmd(paths).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "the build after the kill: {}\n-- the killed one's log:\n{}",
        text(&out.stderr),
        read(log)
    );
    assert!(paths.images().join(name).join("1/rootfs.ext4").exists());
    assert_eq!(build_dirs(paths), Vec::<PathBuf>::new());
    check_nothing_left(paths.home(), "the build after the kill");
}

/// A recipe build (mmdebstrap, in the CLI's own process) whose whole process group is killed
/// during its package step. Its mounts are never visible outside it, not even while it runs;
/// the next build of the name succeeds and removes the dead one's directory.
#[test]
fn a_recipe_build_killed_in_its_package_step_leaves_no_mount_and_the_hosts_shm_intact() {
    private_shm();
    let paths = infra::fresh_home("killed-recipe-build", false);
    let recipe = paths.home().join("killed.toml");
    std::fs::write(
        &recipe,
        "name = \"killed-build\"\nsuite = \"bookworm\"\napt = [\"procps\"]\n",
    )
    .unwrap();
    let log = paths.home().join("build.log");
    let args = ["image", "build", "--file", recipe.to_str().unwrap()];
    let mut child = spawn_cli(&paths, &args, &log);
    wait_for_package_step(paths.home(), &mut child.0, &log, "the first build");
    assert_eq!(
        mounts_under(paths.home()),
        Vec::<PathBuf>::new(),
        "a running build's mounts are visible outside it"
    );
    child.kill();
    let _ = child.0.wait();
    check_nothing_left(paths.home(), "a recipe build killed with its process group");
    assert_eq!(
        build_dirs(&paths).len(),
        1,
        "the killed build left its work directory"
    );
    build_again(&paths, &args, &log, "killed-build");
}

/// The daemon's build of a carried image, as E2B's front end asks for it on a first
/// `Sandbox.create` of a template it has not built yet (`POST /v1/images` with the carried
/// recipe), sent with curl; its answer (the build's progress lines) goes to `log`.
fn daemon_build(paths: &Paths, log: &Path) -> Child {
    let recipe = infra::repo_root().join("images/python-bookworm.toml");
    let (r, _) = forkbox_engine::image::Recipe::load(&recipe).unwrap();
    let body = serde_json::json!({
        "name": r.name,
        "recipe": { "base": r.suite, "apt": r.apt, "env": r.env },
    });
    let out = std::fs::File::create(log).unwrap();
    std::process::Command::new("curl")
        .args(["--silent", "--show-error", "--no-buffer", "--unix-socket"])
        .arg(forkbox_server::socket_path(paths))
        .args(["-H", "content-type: application/json", "--data"])
        .arg(body.to_string())
        .arg("http://forkbox/v1/images")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("run curl")
}

/// A fresh daemon builds the carried `python-bookworm` (what a first create of it through
/// E2B's front end does); the daemon alone is killed during mmdebstrap's package step. The
/// build dies with it (mmdebstrap, apt, dpkg and their mounts: the parent-death signal and the
/// build's PID namespace); the next daemon's start-up sweep removes its directory and says so;
/// the next build succeeds and a sandbox of it answers.
#[test]
fn a_daemon_killed_while_it_builds_a_carried_image_leaves_nothing() {
    private_shm();
    let paths = infra::fresh_home("killed-carried-build", false);
    let serve = |paths: &Paths| {
        let mut c = Daemon::cmd(paths);
        c.arg("serve").stdout(Stdio::null()).stderr(Stdio::null());
        Daemon::spawn(paths.clone(), c)
    };
    let mut d = serve(&paths);
    let log = paths.home().join("build.log");
    let mut build = daemon_build(&paths, &log);
    wait_for_package_step(paths.home(), &mut build, &log, "the daemon's build");
    assert_eq!(mounts_under(paths.home()), Vec::<PathBuf>::new());
    d.kill9();
    let _ = build.wait();
    check_nothing_left(paths.home(), "a daemon killed mid-build");
    assert_eq!(
        build_dirs(&paths).len(),
        1,
        "the killed build left its work directory:\n{}",
        read(&log)
    );
    let d = serve(&paths);
    assert_eq!(
        build_dirs(&paths),
        Vec::<PathBuf>::new(),
        "the start-up sweep removes it"
    );
    let said = d.log_text();
    assert!(
        said.contains("start-up sweep: removed") && said.contains("a killed build's"),
        "the daemon's log does not name what it removed:\n{said}"
    );
    let status = daemon_build(&paths, &log).wait().unwrap();
    assert!(
        status.success() && read(&log).contains("\"done\""),
        "{}",
        read(&log)
    );
    let id = d.create(&["--image", "python-bookworm"]);
    assert_eq!(d.ok(&id, "python3 -c 'print(6*7)'"), "42\n");
    check_no_mount_and_shm_intact(paths.home(), "the build after the kill");
}

/// A Dockerfile build (in the CLI's process: the daemon builds no Dockerfiles) killed, the CLI
/// alone, while its `RUN` step's sandbox runs: the sandbox's QEMU dies with it, nothing stays
/// mounted, and the next build of the name succeeds.
#[test]
fn a_dockerfile_build_killed_in_its_run_step_leaves_nothing() {
    private_shm();
    let shared = infra::home();
    infra::image(&shared, "python-bookworm");
    let paths = infra::fresh_home("killed-dockerfile-build", false);
    // The base comes from the test home; the image built is this home's own.
    std::fs::create_dir_all(paths.images()).unwrap();
    std::os::unix::fs::symlink(
        shared.images().join("python-bookworm"),
        paths.images().join("python-bookworm"),
    )
    .unwrap();
    let ctx = paths.home().join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    let dockerfile = ctx.join("Dockerfile");
    std::fs::write(
        &dockerfile,
        "FROM python-bookworm\nRUN sleep 5 && echo built > /built\n",
    )
    .unwrap();
    let args = [
        "image",
        "build",
        "--file",
        dockerfile.to_str().unwrap(),
        "--name",
        "killed-docker",
    ];
    let log = paths.home().join("build.log");
    let mut child = spawn_cli(&paths, &args, &log);
    let mut qemu = Vec::new();
    let up = infra::wait_until(Duration::from_secs(300), || {
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!(
                "the build ended ({status}) before its RUN step:\n{}",
                read(&log)
            );
        }
        qemu = infra::qemus_of(&paths);
        !qemu.is_empty()
    });
    assert!(up, "the RUN step's sandbox never started:\n{}", read(&log));
    // Into the step: the guest boots and runs `sleep`.
    std::thread::sleep(Duration::from_secs(3));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = child.0.wait();
    check_nothing_left(paths.home(), "a Dockerfile build killed in its RUN step");
    build_again(&paths, &args, &log, "killed-docker");
}

/// What a forkbox from before builds had namespaces of their own left on a host: a dead
/// build's root with the (test's private) `/dev/shm` bound into it. A daemon's start detaches
/// the mount, names it in its log, and removes the tree without touching `/dev/shm`.
#[test]
fn a_daemon_detaches_mounts_a_dead_build_left_and_removes_its_tree() {
    private_shm();
    let paths = infra::fresh_home("dead-build-mounts", false);
    let root = paths.images().join("old/.build-4242/root");
    let shm = root.join("dev/shm");
    std::fs::create_dir_all(&shm).unwrap();
    std::fs::write(root.join("etc-file"), "x").unwrap();
    let none: Option<&str> = None;
    nix::mount::mount(
        Some("/dev/shm"),
        &shm,
        none,
        nix::mount::MsFlags::MS_BIND,
        none,
    )
    .unwrap();
    assert_eq!(mounts_under(paths.home()), vec![shm.clone()]);
    let mut c = Daemon::cmd(&paths);
    c.arg("serve").stdout(Stdio::null()).stderr(Stdio::null());
    let d = Daemon::spawn(paths.clone(), c);
    assert_eq!(mounts_under(paths.home()), Vec::<PathBuf>::new());
    assert!(!paths.images().join("old/.build-4242").exists());
    let said = d.log_text();
    assert!(
        said.contains(&format!("detached {}", shm.display())),
        "the daemon's log does not name the mount it detached:\n{said}"
    );
    assert!(said.contains("left mounted by a killed build"), "{said}");
    check_no_mount_and_shm_intact(paths.home(), "a daemon's start-up sweep");
}
