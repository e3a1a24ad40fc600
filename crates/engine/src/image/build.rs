//! Building an image from a recipe: mmdebstrap into a directory, the recipe's pip/npm/run steps
//! inside it (with network: the build is the only time an image has any), then an ext4 disk.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::recipe::{Base, Recipe};
use super::store::{Image, ImageMeta, ImageStore, IMAGE_FORMAT};
pub(super) use super::workspace::Workspace;
use crate::error::ImageError;
use crate::kernel::Kernel;
use crate::paths::Paths;
use crate::setup::require;

/// Progress of a build.
#[derive(Debug, Clone)]
pub enum BuildEvent {
    /// A new step starts: `n` of `total`.
    Step { n: u32, total: u32, what: String },
    /// A line of output from the step that runs.
    Log(String),
}

impl BuildEvent {
    /// The line a person reads for it: `[n/total] what (at S s)`, `secs` since the build
    /// started, or the step's output indented under it. (The CLI prints a build this way, and a
    /// cluster's node keeps a first build's progress so.)
    pub fn line(&self, secs: f64) -> String {
        match self {
            BuildEvent::Step { n, total, what } => format!("[{n}/{total}] {what} (at {secs:.0} s)"),
            BuildEvent::Log(line) => format!("      {line}"),
        }
    }
}

pub(super) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The script a build's sandbox runs: the recipe's environment, then (with `apt`) its Debian
/// packages, its pip and npm packages and its run steps, in that order, stopping at the first
/// that fails. It runs with the network on, so the host's CA bundle is trusted already.
pub(crate) fn customize_script(r: &Recipe, apt: bool) -> String {
    let mut s = String::from("set -eu\nexport DEBIAN_FRONTEND=noninteractive\n");
    for (k, v) in &r.env {
        s += &format!("export {k}={}\n", sh_quote(v));
    }
    if apt {
        s += &apt_lines(&r.apt);
    }
    if !r.pip.is_empty() {
        let pkgs: Vec<String> = r.pip.iter().map(|p| sh_quote(p)).collect();
        s += &format!(
            "echo 'forkbox: pip install {}'\nPIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install --progress-bar off {}\n",
            r.pip.join(" "),
            pkgs.join(" ")
        );
    }
    if !r.npm.is_empty() {
        let pkgs: Vec<String> = r.npm.iter().map(|p| sh_quote(p)).collect();
        s += &format!(
            "echo 'forkbox: npm install -g {}'\nnpm install -g --no-fund --no-audit {}\nnpm cache clean --force\n",
            r.npm.join(" "),
            pkgs.join(" ")
        );
    }
    for step in &r.run {
        s += &format!(
            "echo {}\n( {step}\n)\n",
            sh_quote(&format!("forkbox: run: {step}"))
        );
    }
    // `python` as well as `python3`, so `python -m pytest` runs as written.
    s += "if [ -x /usr/bin/python3 ] && [ ! -e /usr/bin/python ]; then ln -s python3 /usr/bin/python; fi\n";
    s += "echo forkbox > /etc/hostname\nprintf '127.0.0.1 localhost\\n127.0.1.1 forkbox\\n::1 localhost\\n' > /etc/hosts\n";
    s += "rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /root/.cache\n";
    s
}

/// Runs a command, sending each output line to `log`; fails with the last lines.
fn run_logged(
    cmd: &mut Command,
    step: &str,
    name: &str,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<(), ImageError> {
    let failed = |message: String| ImageError::BuildFailed {
        name: name.into(),
        step: step.into(),
        message,
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| failed(format!("cannot start {:?}: {e}", cmd.get_program())))?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let mut readers = Vec::new();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        }));
    }
    drop(tx);
    let mut tail: std::collections::VecDeque<String> = Default::default();
    for line in rx {
        if tail.len() == 12 {
            tail.pop_front();
        }
        tail.push_back(line.clone());
        log(BuildEvent::Log(line));
    }
    let status = child.wait().map_err(|e| failed(e.to_string()))?;
    if !status.success() {
        return Err(failed(format!(
            "{status}; last output:\n  {}",
            Vec::from(tail).join("\n  ")
        )));
    }
    Ok(())
}

fn dir_bytes(p: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            if let Ok(m) = e.path().symlink_metadata() {
                if m.is_dir() {
                    stack.push(e.path());
                }
                total += m.len();
            }
        }
    }
    total
}

/// Builds `recipe` as the next version of its name. `recipe_text` is stored beside the image.
pub fn build(
    paths: &Paths,
    recipe: &Recipe,
    recipe_text: &str,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<Image, ImageError> {
    let started = Instant::now();
    if !nix::unistd::geteuid().is_root() {
        return Err(ImageError::BuildFailed {
            name: recipe.name.clone(),
            step: "start".into(),
            message: "building an image needs root (mmdebstrap creates device files and owners)"
                .into(),
        });
    }
    let mkfs = require("mkfs.ext4")?;
    let kernel = Kernel::newest(paths)?;
    let mut progress = super::progress::Progress::start(paths, &recipe.name);
    let log = &mut |ev: BuildEvent| {
        progress.see(&ev);
        log(ev)
    };
    let store = ImageStore::new(paths);
    let failed_at = |step: &str, message: String| ImageError::BuildFailed {
        name: recipe.name.clone(),
        step: step.into(),
        message,
    };
    // A recipe on another image is pinned to the version it was built on, takes that image's
    // suite and environment (its own entries win) and starts from its files. One on a
    // registry's image is pinned to the manifest's digest.
    let mut pinned = recipe.clone();
    let source = match recipe.base().map_err(|m| failed_at("start", m))? {
        Base::Image(r) => {
            let img = store.resolve(&r)?;
            pinned.base = Some(img.reference());
            pinned.suite = String::new();
            Source::Image(Box::new(img))
        }
        Base::Registry(reference) => {
            log(BuildEvent::Step {
                n: 1,
                total: REGISTRY_STEPS,
                what: format!("pulling {}", reference.whole()),
            });
            let pulled = runtime(&recipe.name)?.block_on(super::oci::pull(
                paths,
                &reference,
                &mut |ev| log(BuildEvent::Log(pull_line(&ev))),
            ))?;
            pinned.base = Some(pulled.pinned.clone());
            pinned.suite = String::new();
            Source::Registry(Box::new(pulled), reference)
        }
        Base::Debian(_) => Source::Debian(require("mmdebstrap")?),
    };
    let recipe = &pinned;
    let recipe_text = match &source {
        Source::Debian(_) => recipe_text.to_string(),
        _ => recipe.to_toml(),
    };
    let ws = Workspace::open(paths, &recipe.name)?;
    let work = ws.work.clone();
    let built = build_in(paths, &work, &source, &mkfs, recipe, &kernel, log)?;
    crate::tree::discard_tree(&work.join("root"));
    let _ = fs::remove_file(work.join("customize.sh"));
    let meta = image_meta(recipe, &source, &kernel, built, started);
    ws.commit(meta, &[("recipe.toml", recipe_text.as_bytes())])
}

/// What is recorded of an image built from `source` by `recipe` (its version set at commit).
fn image_meta(
    recipe: &Recipe,
    source: &Source,
    kernel: &Kernel,
    built: Built,
    started: Instant,
) -> ImageMeta {
    ImageMeta {
        format: IMAGE_FORMAT,
        name: recipe.name.clone(),
        version: 0,
        suite: match source {
            Source::Image(img) => img.meta.suite.clone(),
            Source::Registry(..) => built.suite.unwrap_or_else(|| "unknown".into()),
            Source::Debian(_) => recipe.suite.clone(),
        },
        kernel: kernel.release.clone(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        content_bytes: built.content,
        disk_bytes: built.disk,
        env: {
            let mut env = source.env();
            env.extend(recipe.env.clone());
            env
        },
        recipe: recipe.clone(),
        build_seconds: started.elapsed().as_secs_f64(),
        workdir: source.defaults().and_then(|d| d.workdir.clone()),
        user: source.defaults().and_then(|d| d.user.clone()),
        pulled: match source {
            Source::Registry(p, _) => Some(p.pinned.clone()),
            Source::Image(img) => img.meta.pulled.clone(),
            Source::Debian(_) => None,
        },
        inputs: None,
    }
}

/// Where a build's root comes from.
enum Source {
    /// A fresh Debian root from mmdebstrap (the program's path).
    Debian(PathBuf),
    /// Another forkbox image.
    Image(Box<super::Image>),
    /// An image pulled from a registry, and the reference it was asked for by.
    Registry(Box<super::oci::Pulled>, oci_client::Reference),
}

impl Source {
    /// The environment the base gives (the recipe's own entries go on top).
    fn env(&self) -> BTreeMap<String, String> {
        match self {
            Source::Image(img) => img.meta.env.clone(),
            Source::Registry(p, _) => p.defaults.env.clone(),
            Source::Debian(_) => BTreeMap::new(),
        }
    }

    /// A registry image's working directory and user (kept by images built on it).
    fn defaults(&self) -> Option<super::oci::ImageDefaults> {
        match self {
            Source::Registry(p, _) => Some(p.defaults.clone()),
            Source::Image(img) => Some(super::oci::ImageDefaults {
                env: img.meta.env.clone(),
                workdir: img.meta.workdir.clone(),
                user: img.meta.user.clone(),
            }),
            Source::Debian(_) => None,
        }
    }
}

/// Steps of a build on a registry's image: pull, unpack, the recipe's steps in a VM, the disk,
/// the record.
const REGISTRY_STEPS: u32 = 5;

/// Room a build on a registry's image has for its steps, beyond the recipe's free space
/// (the disk file is sparse: only what is written costs).
pub(super) const STEP_ROOM_MIB: u64 = 4096;

pub(super) fn runtime(name: &str) -> Result<tokio::runtime::Runtime, ImageError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ImageError::BuildFailed {
            name: name.into(),
            step: "start".into(),
            message: format!("cannot start an async runtime: {e}"),
        })
}

fn mib(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// A line for a pull's progress.
pub(super) fn pull_line(ev: &super::oci::PullEvent) -> String {
    use super::oci::PullEvent as P;
    match ev {
        P::Manifest {
            pinned,
            layers,
            bytes,
        } => format!("forkbox: {pinned}: {layers} layer(s), {}", mib(*bytes)),
        P::Layer {
            n,
            of,
            digest,
            done,
            size,
            cached,
        } => {
            let short = digest.get(7..19).unwrap_or(digest);
            if *cached {
                format!(
                    "forkbox: layer {n}/{of} {short}: {} (kept from an earlier pull)",
                    mib(*size)
                )
            } else {
                format!(
                    "forkbox: layer {n}/{of} {short}: {} of {}",
                    mib(*done),
                    mib(*size)
                )
            }
        }
    }
}

/// What a build made: the bytes of its files, of its disk, and (for a registry's image) the
/// Debian suite its `/etc/os-release` names.
struct Built {
    content: u64,
    disk: u64,
    suite: Option<String>,
}

impl From<(u64, u64)> for Built {
    fn from((content, disk): (u64, u64)) -> Built {
        Built {
            content,
            disk,
            suite: None,
        }
    }
}

/// The `VERSION_CODENAME` of a root's `/etc/os-release`, read beneath the root.
fn suite_of(root: &super::layers::Root) -> Option<String> {
    let text = root.read_file(Path::new("etc/os-release")).ok()?;
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
}

fn build_in(
    paths: &Paths,
    work: &Path,
    source: &Source,
    mkfs: &Path,
    r: &Recipe,
    kernel: &Kernel,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<Built, ImageError> {
    match source {
        Source::Debian(mmdebstrap) => on_debian(paths, work, mmdebstrap, mkfs, r, kernel, log),
        Source::Image(img) => on_image(paths, work, img, r, kernel, log),
        Source::Registry(pulled, reference) => {
            on_registry_image(paths, work, pulled, reference, mkfs, r, kernel, log)
        }
    }
}

/// Whether a recipe has steps that run code: pip, npm and run steps (and apt on a base that is
/// not a fresh Debian root, where apt-get runs in the image).
fn has_steps(r: &Recipe, apt_too: bool) -> bool {
    !(r.pip.is_empty() && r.npm.is_empty() && r.run.is_empty() && (!apt_too || r.apt.is_empty()))
}

/// A fresh Debian root: mmdebstrap installs the Debian packages (Debian's own, from its
/// mirror, as apt does on any host), then the recipe's pip, npm and run steps, which are
/// anyone's code, run in a sandbox of it.
fn on_debian(
    paths: &Paths,
    work: &Path,
    mmdebstrap: &Path,
    mkfs: &Path,
    r: &Recipe,
    kernel: &Kernel,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<Built, ImageError> {
    let steps = has_steps(r, false);
    let total = if steps { 4 } else { 3 };
    let root: PathBuf = work.join("root");
    let mut include: Vec<String> = r.apt.clone();
    if !r.pip.is_empty() {
        include.extend(["python3-pip".into(), "ca-certificates".into()]);
    }
    if !r.npm.is_empty() {
        include.extend(["npm".into(), "ca-certificates".into()]);
    }
    include.sort();
    include.dedup();
    log(BuildEvent::Step {
        n: 1,
        total,
        what: format!("Debian {} root with {} package(s)", r.suite, include.len()),
    });
    let mut cmd = contained(mmdebstrap)?;
    cmd.arg("--variant=minbase")
        .arg("--mode=root")
        .arg("--format=directory");
    if !include.is_empty() {
        cmd.arg(format!("--include={}", include.join(",")));
    }
    cmd.arg(&r.suite).arg(&root).arg(&r.mirror);
    run_logged(&mut cmd, "install packages", &r.name, log)?;
    debian_files(&root)?;
    if !steps {
        return finish(work, &root, mkfs, r, total, log).map(Built::from);
    }
    let image = stage_from_root(
        &root,
        work.join("stage"),
        (mkfs, kernel),
        r,
        r.env.clone(),
        (2, total),
        log,
    )?;
    let what = format!(
        "the recipe's steps in a sandbox of the Debian {} root",
        r.suite
    );
    in_sandbox(
        paths,
        work,
        image,
        customize_script(r, false),
        r,
        (3, total),
        what,
        log,
    )
}

/// A command for `program` in mount and PID namespaces of its own (util-linux's `unshare`):
/// what it mounts (mmdebstrap binds the host's `/dev/shm` and `/proc`, `/sys` and a devpts into
/// the root it builds, and unmounts nothing when killed) is never visible on the host and goes
/// with its namespace; every process of it dies with its first (`--kill-child`), and that one
/// with the thread that starts it (a daemon killed mid-build takes the build down, mounts and
/// all, instead of leaving it running into a directory the next build removes). The tests'
/// own mmdebstraps run the same way.
pub fn contained(program: &Path) -> Result<Command, ImageError> {
    let mut cmd = Command::new(require("unshare")?);
    cmd.args([
        "--mount",
        "--propagation=private",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--",
    ])
    .arg(program);
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the parent;
    // it runs in the child between fork and exec. The signal fires when the thread that forked
    // exits: builds wait for their steps on that thread.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}

/// What every Debian root gets from forkbox: `python` beside `python3` (so `python -m pytest`
/// runs as written) and no package lists; written beneath the root.
fn debian_files(root: &Path) -> Result<(), ImageError> {
    let beneath =
        super::layers::Root::open(root).map_err(|e| ImageError::io("open the build root", e))?;
    if root.join("usr/bin/python3").exists()
        && root.join("usr/bin/python").symlink_metadata().is_err()
    {
        beneath
            .symlink(Path::new("usr/bin/python"), Path::new("python3"))
            .map_err(writing_own_files)?;
    }
    let lists = root.join("var/lib/apt/lists");
    for e in fs::read_dir(&lists).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_file()) {
            let _ = fs::remove_file(e.path());
        }
    }
    Ok(())
}

/// Writes `root` into `stage/rootfs.ext4` with room for the recipe's free space and its
/// steps (step `n` of `total`), removes `root`, and returns the disk as an unlisted image with
/// `env`, to boot the steps in.
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_from_root(
    root: &Path,
    stage: PathBuf,
    (mkfs, kernel): (&Path, &Kernel),
    r: &Recipe,
    env: BTreeMap<String, String>,
    step: (u32, u32),
    log: &mut dyn FnMut(BuildEvent),
) -> Result<super::Image, ImageError> {
    fs::create_dir_all(&stage).map_err(|e| ImageError::io("create the build's stage", e))?;
    let sizes = write_disk(
        root,
        &stage.join("rootfs.ext4"),
        mkfs,
        r,
        r.disk_free_mib + STEP_ROOM_MIB,
        step,
        log,
    )?;
    crate::tree::discard_tree(root);
    Ok(stage_image(stage, r, kernel, env, sizes))
}

/// An unlisted image of the disk in `dir` (a build's stage), to boot.
pub(super) fn stage_image(
    dir: PathBuf,
    r: &Recipe,
    kernel: &Kernel,
    env: BTreeMap<String, String>,
    (content, disk): (u64, u64),
) -> super::Image {
    super::Image {
        dir,
        meta: ImageMeta {
            format: IMAGE_FORMAT,
            name: r.name.clone(),
            version: 0,
            suite: "unknown".into(),
            kernel: kernel.release.clone(),
            created_unix: 0,
            content_bytes: content,
            disk_bytes: disk,
            env,
            recipe: r.clone(),
            build_seconds: 0.0,
            workdir: None,
            user: None,
            pulled: None,
            inputs: None,
        },
    }
}

/// Runs `script` in a sandbox of `image` (step `n` of `total`), writes its disk to
/// `work/rootfs.ext4`, checks it and records it (the last step).
#[allow(clippy::too_many_arguments)]
fn in_sandbox(
    paths: &Paths,
    work: &Path,
    image: super::Image,
    script: String,
    r: &Recipe,
    (n, total): (u32, u32),
    what: String,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<Built, ImageError> {
    log(BuildEvent::Step {
        n,
        total,
        what: format!("{what} (network on for the build only)"),
    });
    let stage = image.dir.clone();
    let (content, disk) = (image.meta.content_bytes, image.meta.disk_bytes);
    let rootfs = work.join("rootfs.ext4");
    let script = format!("{script}sync\n");
    runtime(&r.name)?.block_on(steps_in_sandbox(
        paths, image, script, &rootfs, &r.name, log,
    ))?;
    if stage.starts_with(work) {
        crate::tree::discard_tree(&stage);
    }
    check_built_disk(paths, &rootfs, &r.name)?;
    fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o444))
        .map_err(|e| ImageError::io("make rootfs read-only", e))?;
    log(BuildEvent::Step {
        n: total,
        total,
        what: "recording the image".into(),
    });
    Ok(Built {
        content: used_bytes(&rootfs).unwrap_or(content),
        disk,
        suite: None,
    })
}

/// e2fsck of a disk a guest wrote: it exits 1 when it corrected something (the guest's disk
/// is never unmounted, so its clean flag at least), 2 and up when the disk is beyond that. A
/// guest wrote it, so the check runs confined ([`crate::vm::confined`]), the disk writable by
/// the QEMUs' group alone.
pub(super) fn check_built_disk(paths: &Paths, rootfs: &Path, name: &str) -> Result<(), ImageError> {
    let e2fsck = require("e2fsck")?;
    if crate::vm::jail::enabled() {
        crate::vm::jail::share_file(rootfs, true).map_err(|e| {
            ImageError::io(
                "give the built disk to its check",
                std::io::Error::other(e.to_string()),
            )
        })?;
    }
    let arg = rootfs.to_string_lossy();
    let checked =
        crate::vm::confined::run(paths, &e2fsck, &["-f", "-p", &arg], &[rootfs.to_path_buf()])
            .map_err(|e| ImageError::io("run e2fsck", std::io::Error::other(e.to_string())))?;
    if !matches!(checked.status.code(), Some(0 | 1)) {
        return Err(ImageError::BuildFailed {
            name: name.into(),
            step: "check the built disk".into(),
            message: format!(
                "e2fsck: {}; {}",
                checked.status,
                String::from_utf8_lossy(&checked.stdout).trim()
            ),
        });
    }
    Ok(())
}

/// A recipe on another forkbox image: a copy of its disk, grown by the recipe's free space
/// and room for the steps, and the steps (apt first) in a sandbox of it.
fn on_image(
    paths: &Paths,
    work: &Path,
    img: &super::Image,
    r: &Recipe,
    kernel: &Kernel,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<Built, ImageError> {
    let total = 3;
    log(BuildEvent::Step {
        n: 1,
        total,
        what: format!("a copy of {}'s disk", img.reference()),
    });
    let stage = work.join("stage");
    fs::create_dir_all(&stage).map_err(|e| ImageError::io("create the build's stage", e))?;
    let disk_file = stage.join("rootfs.ext4");
    let mut cmd = Command::new("cp");
    cmd.arg("--sparse=always").arg(img.rootfs()).arg(&disk_file);
    run_logged(&mut cmd, "copy the base image's disk", &r.name, log)?;
    fs::set_permissions(&disk_file, fs::Permissions::from_mode(0o644))
        .map_err(|e| ImageError::io("make the copy writable", e))?;
    let disk =
        (img.meta.disk_bytes + ((r.disk_free_mib + STEP_ROOM_MIB) << 20)).div_ceil(1 << 20) << 20;
    fs::OpenOptions::new()
        .write(true)
        .open(&disk_file)
        .and_then(|f| f.set_len(disk))
        .map_err(|e| ImageError::io("grow the copy", e))?;
    check_built_disk(paths, &disk_file, &r.name)?;
    let mut cmd = Command::new(require("resize2fs")?);
    cmd.arg(&disk_file);
    run_logged(&mut cmd, "grow the copy's filesystem", &r.name, log)?;
    let mut env = img.meta.env.clone();
    env.extend(r.env.clone());
    let image = stage_image(stage, r, kernel, env, (img.meta.content_bytes, disk));
    let script = customize_script(r, true);
    let what = format!("the recipe's steps in a sandbox of {}", img.reference());
    in_sandbox(paths, work, image, script, r, (2, total), what, log)
}

/// The shell lines that install a recipe's Debian packages with apt-get (in a root that has it).
fn apt_lines(include: &[String]) -> String {
    if include.is_empty() {
        return String::new();
    }
    format!(
        "if ! command -v apt-get >/dev/null; then echo 'forkbox: this image has no apt-get, so the recipe cannot install {0} with apt' >&2; exit 1; fi\necho 'forkbox: apt-get install {0}'\napt-get update -q\napt-get install -y -q --no-install-recommends {0}\n",
        include.join(" ")
    )
}

/// Room a pull's layers may unpack into: the free space of the filesystem `dir` is on, less
/// what forkbox leaves free for everything else (2 GiB).
fn unpack_budget(dir: &Path) -> u64 {
    const KEEP_FREE: u64 = 2 << 30;
    nix::sys::statvfs::statvfs(dir)
        .map(|v| v.blocks_available().saturating_mul(v.fragment_size()))
        .map_or(0, |free| free.saturating_sub(KEEP_FREE))
}

/// Unpacks a pulled image's layers beneath `work/root` and puts in what every forkbox root
/// has (the directories the agent mounts over, its name); step 2 of `total`. Returns the root
/// and the Debian suite its `/etc/os-release` names.
pub(super) fn unpack_registry(
    work: &Path,
    pulled: &super::oci::Pulled,
    reference: &oci_client::Reference,
    total: u32,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<(PathBuf, Option<String>), ImageError> {
    let root = work.join("root");
    fs::create_dir_all(&root).map_err(|e| ImageError::io("create the build root", e))?;
    log(BuildEvent::Step {
        n: 2,
        total,
        what: format!("unpacking {} layer(s)", pulled.layers.len()),
    });
    let beneath = super::layers::Root::open(&root)
        .map_err(|e| ImageError::io("open the build root", e))?
        .with_budget(unpack_budget(work));
    let of = pulled.layers.len();
    for (i, layer) in pulled.layers.iter().enumerate() {
        let digest = format!(
            "sha256:{}",
            layer.file_name().unwrap_or_default().to_string_lossy()
        );
        let st = beneath.apply(layer).map_err(|source| ImageError::Layer {
            reference: reference.whole(),
            layer: digest,
            source,
        })?;
        log(BuildEvent::Log(format!(
            "forkbox: layer {}/{of}: {} file(s), {} dir(s), {} link(s), {} whiteout(s), {}",
            i + 1,
            st.files,
            st.dirs,
            st.links,
            st.whiteouts,
            mib(st.bytes)
        )));
    }
    // What the agent mounts over (the name every sandbox has comes with forkbox's own files).
    for (dir, mode) in [
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("tmp", 0o1777),
        ("run", 0o755),
        ("root", 0o700),
        ("etc", 0o755),
    ] {
        beneath
            .ensure_dir(Path::new(dir), mode)
            .map_err(writing_own_files)?;
    }
    let suite = suite_of(&beneath);
    Ok((root, suite))
}

/// Builds on a registry's image: its layers unpacked beneath the root, the ext4 disk written
/// from them, then the recipe's steps (apt, pip, npm, run) in a sandbox of that disk with the
/// network on, never on the host: a recipe is a stranger's code too. The sandbox's disk,
/// flattened, is the image.
#[allow(clippy::too_many_arguments)]
fn on_registry_image(
    paths: &Paths,
    work: &Path,
    pulled: &super::oci::Pulled,
    reference: &oci_client::Reference,
    mkfs: &Path,
    r: &Recipe,
    kernel: &Kernel,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<Built, ImageError> {
    let total = REGISTRY_STEPS;
    let (root, suite) = unpack_registry(work, pulled, reference, total, log)?;
    let has_steps = !(r.apt.is_empty() && r.pip.is_empty() && r.npm.is_empty() && r.run.is_empty());
    let rootfs = work.join("rootfs.ext4");
    if !has_steps {
        let sizes = write_disk(&root, &rootfs, mkfs, r, r.disk_free_mib, (3, total), log)?;
        log(BuildEvent::Step {
            n: 5,
            total,
            what: "recording the image (the recipe has no steps to run)".into(),
        });
        return Ok(Built {
            suite,
            ..sizes.into()
        });
    }
    let mut env = pulled.defaults.env.clone();
    env.extend(r.env.clone());
    let image = stage_from_root(
        &root,
        work.join("stage"),
        (mkfs, kernel),
        r,
        env,
        (3, total),
        log,
    )?;
    let what = format!("the recipe's steps in a sandbox of {}", reference.whole());
    let built = in_sandbox(
        paths,
        work,
        image,
        customize_script(r, true),
        r,
        (4, total),
        what,
        log,
    )?;
    Ok(Built { suite, ..built })
}

/// Bytes in use on an ext4 disk, from its superblock.
pub(super) fn used_bytes(rootfs: &Path) -> Option<u64> {
    let out = Command::new("dumpe2fs")
        .arg("-h")
        .arg(rootfs)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some((field("Block count:")? - field("Free blocks:")?) * field("Block size:")?)
}

/// A build's sandbox: booted cold from the stage's disk, two vCPUs, the network on.
pub(super) fn build_sandbox(name: &str) -> crate::sandbox::SandboxConfig {
    crate::sandbox::SandboxConfig {
        image: super::ImageRef {
            name: name.into(),
            version: None,
        },
        cpus: 2,
        memory_mib: 2048,
        die_with_parent: true,
        boot_timeout: std::time::Duration::from_secs(300),
        cold: true,
        network: crate::net::NetworkPolicy {
            internet: true,
            allow: vec![],
            deny: Vec::new(),
        },
        ..Default::default()
    }
}

/// Boots `image` with the network on, runs `script` in it as root, and writes its disk to
/// `dest`.
async fn steps_in_sandbox(
    paths: &Paths,
    image: super::Image,
    script: String,
    dest: &Path,
    name: &str,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<(), ImageError> {
    use crate::sandbox::Sandbox;
    let failed = |step: &str, message: String| ImageError::BuildFailed {
        name: name.into(),
        step: step.into(),
        message,
    };
    let sb = Sandbox::boot_unlisted(paths, &build_sandbox(name), image)
        .await
        .map_err(|e| failed("boot a sandbox of the base image", e.to_string()))?;
    match run_script(&sb, script, log).await {
        Ok(()) => sb
            .export_root(dest)
            .await
            .map_err(|e| failed("write the sandbox's disk", e.to_string())),
        Err(message) => {
            sb.destroy().await;
            Err(failed("the recipe's steps", message))
        }
    }
}

/// Runs `script` with `/bin/sh` in `sb`, a line of its output at a time to `log`; the error
/// names how it ended and its last lines.
async fn run_script(
    sb: &crate::sandbox::Sandbox,
    script: String,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<(), String> {
    let spec = forkbox_protocol::ExecSpec {
        program: forkbox_protocol::Program::Argv(vec!["/bin/sh".into(), "-c".into(), script]),
        cwd: Some("/".into()),
        env: vec![],
        timeout_ms: Some(BUILD_STEP_MS),
        stdin: false,
        tty: None,
        user: Some("0:0".into()),
    };
    run_in(sb, spec, log).await
}

/// The longest a build step may run.
pub(super) const BUILD_STEP_MS: u64 = 2 * 3600 * 1000;

/// Runs `spec` in `sb`, a line of its output at a time to `log`; the error names how it ended
/// and its last lines.
pub(super) async fn run_in(
    sb: &crate::sandbox::Sandbox,
    spec: forkbox_protocol::ExecSpec,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<(), String> {
    use crate::client::ExecEvent;
    let mut ex = sb.exec(spec).await.map_err(|e| e.to_string())?;
    let mut tail: std::collections::VecDeque<String> = Default::default();
    let mut pending = [Vec::new(), Vec::new()];
    let mut line = |l: &[u8], tail: &mut std::collections::VecDeque<String>| {
        let l = String::from_utf8_lossy(l).trim_end().to_string();
        if tail.len() == 12 {
            tail.pop_front();
        }
        tail.push_back(l.clone());
        log(BuildEvent::Log(l));
    };
    loop {
        let (i, bytes) = match ex.next().await.map_err(|e| e.to_string())? {
            ExecEvent::Started { .. } => continue,
            ExecEvent::Stdout(b) => (0, b),
            ExecEvent::Stderr(b) => (1, b),
            ExecEvent::Exited {
                status, timed_out, ..
            } => {
                for p in &pending {
                    if !p.is_empty() {
                        line(p, &mut tail);
                    }
                }
                let code = status.as_shell_code();
                if code == 0 {
                    return Ok(());
                }
                let how = if timed_out {
                    format!("timed out after {} h", BUILD_STEP_MS / 3_600_000)
                } else {
                    format!("exit status {code}")
                };
                return Err(format!(
                    "{how}; last output:\n  {}",
                    Vec::from(tail).join("\n  ")
                ));
            }
        };
        pending[i].extend_from_slice(&bytes);
        while let Some(nl) = pending[i].iter().position(|&b| b == b'\n') {
            let rest = pending[i].split_off(nl + 1);
            let l = std::mem::replace(&mut pending[i], rest);
            line(&l, &mut tail);
        }
    }
}

/// Writes the root into the image's ext4 disk; the sizes of its files and of the disk.
fn finish(
    work: &Path,
    root: &Path,
    mkfs: &Path,
    r: &Recipe,
    total: u32,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<(u64, u64), ImageError> {
    let sizes = write_disk(
        root,
        &work.join("rootfs.ext4"),
        mkfs,
        r,
        r.disk_free_mib,
        (total - 1, total),
        log,
    )?;
    log(BuildEvent::Step {
        n: total,
        total,
        what: "recording the image".into(),
    });
    Ok(sizes)
}

fn writing_own_files(e: super::layers::LayerError) -> ImageError {
    ImageError::io(
        "write forkbox's files into the root",
        std::io::Error::other(e.to_string()),
    )
}

/// The files forkbox puts into every image's root: the name every sandbox has, and no
/// resolver (a sandbox has none: the host resolves the names its proxy asks for); written
/// beneath the root, as a layer is.
fn own_files(root: &Path) -> Result<(), ImageError> {
    let r =
        super::layers::Root::open(root).map_err(|e| ImageError::io("open the build root", e))?;
    for (file, text) in [
        ("etc/hostname", &b"forkbox\n"[..]),
        (
            "etc/hosts",
            b"127.0.0.1 localhost\n127.0.1.1 forkbox\n::1 localhost\n",
        ),
        (
            "etc/resolv.conf",
            b"# forkbox: a sandbox has no resolver; the host resolves the names its proxy asks for.\n",
        ),
    ] {
        r.write_file(Path::new(file), text)
            .map_err(writing_own_files)?;
    }
    Ok(())
}

/// Writes `root` into an ext4 disk at `rootfs` with `free_mib` to spare; step `n` of `total`.
pub(super) fn write_disk(
    root: &Path,
    rootfs: &Path,
    mkfs: &Path,
    r: &Recipe,
    free_mib: u64,
    (n, total): (u32, u32),
    log: &mut dyn FnMut(BuildEvent),
) -> Result<(u64, u64), ImageError> {
    own_files(root)?;
    log(BuildEvent::Step {
        n,
        total,
        what: "writing the ext4 root disk".into(),
    });
    let content = dir_bytes(root);
    // Room for ext4's own metadata on top of the files, then the free space asked for.
    let disk = (content + content / 4 + (64 << 20) + (free_mib << 20)).div_ceil(1 << 20) << 20;
    let rootfs = rootfs.to_path_buf();
    let f = fs::File::create(&rootfs).map_err(|e| ImageError::io("create rootfs.ext4", e))?;
    f.set_len(disk)
        .map_err(|e| ImageError::io("size rootfs.ext4", e))?;
    drop(f);
    let mut cmd = Command::new(mkfs);
    cmd.args([
        "-q",
        "-F",
        "-L",
        "forkbox-root",
        "-O",
        "^has_journal",
        "-E",
        "root_owner=0:0",
        "-d",
    ])
    .arg(root)
    .arg(&rootfs);
    run_logged(&mut cmd, "write ext4 root disk", &r.name, log)?;
    fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o444))
        .map_err(|e| ImageError::io("make rootfs read-only", e))?;
    Ok((content, disk))
}

/// Environment of an image as ordered pairs (for the protocol).
pub fn env_pairs(env: &BTreeMap<String, String>) -> Vec<(String, String)> {
    env.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn script_quotes_values_and_runs_steps_in_order() {
        let r = Recipe::parse(
            "name = \"x\"\nsuite = \"bookworm\"\npip = [\"attrs==23.1\"]\nrun = [\"echo one\", \"echo two\"]\n[env]\nA = \"it's\"\n",
        )
        .unwrap();
        let s = customize_script(&r, true);
        assert!(s.contains("export A='it'\\''s'"), "{s}");
        assert!(
            s.contains("pip install --progress-bar off 'attrs==23.1'"),
            "{s}"
        );
        let one = s.find("( echo one").unwrap();
        let two = s.find("( echo two").unwrap();
        assert!(one < two);
        assert!(s.starts_with("set -eu"));
    }
}
