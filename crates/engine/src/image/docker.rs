//! Building an image from a Dockerfile: each stage is a sandbox booted from its base (a
//! registry's image, a forkbox image or an earlier stage), every instruction runs in it (a
//! Dockerfile is a stranger's code: never on the host), and the last stage's disk, flattened,
//! is the image. `COPY` sends files from the build context (`.dockerignore` applies);
//! `COPY --from` streams them from an earlier stage's sandbox.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use forkbox_protocol::{ExecSpec, Program};

use super::build::{self as b, BuildEvent};
use super::context::{
    context_dir, expand, inside_context, pack_context, place_script, Context, Ignore, Placed,
};
use super::dockerfile::{self as df, RunForm, Step};
use super::oci::ImageDefaults;
use super::store::{ImageMeta, IMAGE_FORMAT};
use super::{Base, Image, ImageStore, Recipe};
use crate::error::ImageError;
use crate::kernel::Kernel;
use crate::paths::Paths;
use crate::sandbox::Sandbox;
use crate::setup::require;

/// A Dockerfile build.
pub struct DockerBuild<'a> {
    /// The image's name.
    pub name: &'a str,
    /// The Dockerfile's text.
    pub dockerfile: &'a str,
    /// The build context: `COPY` sources are relative to it and never leave it.
    pub context: Context<'a>,
    /// `--build-arg NAME=VALUE`s.
    pub args: BTreeMap<String, String>,
}

pub(super) fn failed(
    name: &str,
    step: impl Into<String>,
    message: impl Into<String>,
) -> ImageError {
    ImageError::BuildFailed {
        name: name.into(),
        step: step.into(),
        message: message.into(),
    }
}

/// The stages the last one needs (through `FROM stage` and `COPY --from`), in order.
fn needed(file: &df::Dockerfile) -> Vec<usize> {
    let n = file.stages.len();
    let mut need = vec![false; n];
    need[n - 1] = true;
    for i in (0..n).rev() {
        if !need[i] {
            continue;
        }
        let st = &file.stages[i];
        if let Some(j) = df::stage_index(&file.stages[..i], &st.from.to_ascii_lowercase()) {
            need[j] = true;
        }
        for step in &st.steps {
            if let Step::Copy { from: Some(f), .. } = step {
                if let Some(j) = df::stage_index(&file.stages[..i], f) {
                    need[j] = true;
                }
            }
        }
    }
    (0..n).filter(|i| need[*i]).collect()
}

/// What a stage has built up: its environment, working directory, user, labels, and the
/// registry image under it.
#[derive(Debug, Clone, Default)]
struct State {
    env: BTreeMap<String, String>,
    workdir: Option<String>,
    user: Option<String>,
    labels: BTreeMap<String, String>,
    pinned: Option<String>,
    pulled: Option<String>,
    suite: Option<String>,
}

/// The Dockerfile's stages as a stage's instructions see them: which one is building (`i`),
/// those built before it, and the sandboxes of those that `COPY --from` copies out of.
struct Stages<'a> {
    file: &'a df::Dockerfile,
    i: usize,
    done: &'a BTreeMap<usize, Done>,
    lenders: &'a mut BTreeMap<usize, Sandbox>,
}

/// A finished stage: its disk (an unlisted image) and what it built up.
struct Done {
    image: Image,
    state: State,
}

pub fn build_dockerfile(
    paths: &Paths,
    req: &DockerBuild<'_>,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<Image, ImageError> {
    build_dockerfile_of(paths, req, inputs_of(paths, req)?, log)
}

/// The digest of what the build `req` is made of ([`super::inputs`]): a build asked to run
/// only if something changed compares it with the newest version's
/// ([`super::inputs::same_as_newest`]).
pub fn inputs_of(paths: &Paths, req: &DockerBuild<'_>) -> Result<String, ImageError> {
    let file = df::parse(req.dockerfile)
        .map_err(|e| failed(req.name, "read the Dockerfile", e.to_string()))?;
    super::inputs::digest(paths, req.dockerfile, &file, &req.args, req.context)
}

/// [`build_dockerfile`] of a build whose inputs' digest ([`inputs_of`]) is `inputs`.
pub fn build_dockerfile_of(
    paths: &Paths,
    req: &DockerBuild<'_>,
    inputs: String,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<Image, ImageError> {
    let started = std::time::Instant::now();
    let name = req.name;
    may_build(name)?;
    let file = df::parse(req.dockerfile)
        .map_err(|e| failed(name, "read the Dockerfile", e.to_string()))?;
    let mkfs = require("mkfs.ext4")?;
    let kernel = Kernel::newest(paths)?;
    let mut progress = super::progress::Progress::start(paths, name);
    let log = &mut |ev: BuildEvent| {
        progress.see(&ev);
        log(ev)
    };
    let ws = b::Workspace::open(paths, name)?;
    let context = context_dir(name, req.context, &ws.work)?;
    let ignore = Ignore::load(&context);
    let order = needed(&file);
    let instructions: usize = order.iter().map(|i| file.stages[*i].steps.len() + 1).sum();
    let total = u32::try_from(instructions + 1).unwrap_or(u32::MAX);
    let globals = file.globals(&req.args);
    let mut ctx = Ctx {
        paths,
        name,
        work: ws.work.clone(),
        mkfs,
        kernel,
        context,
        ignore,
        args: &req.args,
        globals,
        n: 0,
        total,
        copies: 0,
        log,
    };
    let rt = b::runtime(name)?;
    let mut done: BTreeMap<usize, Done> = BTreeMap::new();
    let last = *order.last().unwrap_or(&0);
    let result = rt.block_on(async {
        let mut lenders: BTreeMap<usize, Sandbox> = BTreeMap::new();
        let mut outcome = Ok(());
        for &i in &order {
            let r = ctx
                .stage(&file, i, i == last, &mut done, &mut lenders)
                .await;
            if let Err(e) = r {
                outcome = Err(e);
                break;
            }
        }
        for (_, sb) in lenders {
            sb.destroy().await;
        }
        outcome
    });
    result?;
    let fin = done
        .remove(&last)
        .ok_or_else(|| failed(name, "finish", "the last stage left no disk"))?;
    let rootfs = ws.work.join("rootfs.ext4");
    std::fs::rename(fin.image.rootfs(), &rootfs)
        .map_err(|e| ImageError::io("keep the last stage's disk", e))?;
    for d in done.values() {
        crate::tree::discard_tree(&d.image.dir);
    }
    crate::tree::discard_tree(&fin.image.dir);
    ctx.step("recording the image".into());
    let meta = meta_of(name, &fin, (&ctx.kernel.release, inputs), &rootfs, started);
    let labels = serde_json::to_vec_pretty(&fin.state.labels).unwrap_or_default();
    ws.commit(
        meta,
        &[
            ("Dockerfile", req.dockerfile.as_bytes()),
            ("labels.json", &labels),
        ],
    )
}

/// An image may be built under `name` here: a valid name, and root.
fn may_build(name: &str) -> Result<(), ImageError> {
    if !super::recipe::valid_name(name) {
        return Err(failed(
            name,
            "start",
            "an image name is 1-64 letters, digits, '-', '_' or '.' (give it with --name)",
        ));
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(failed(name, "start", "building an image needs root"));
    }
    Ok(())
}

/// What is recorded of the image whose last stage is `fin`, its disk at `rootfs`: the
/// registry image it stands on (pinned), its suite, kernel, environment, working directory and
/// user.
fn meta_of(
    name: &str,
    fin: &Done,
    (kernel, inputs): (&str, String),
    rootfs: &Path,
    started: std::time::Instant,
) -> ImageMeta {
    let st = &fin.state;
    let base = st
        .pinned
        .clone()
        .unwrap_or_else(|| fin.image.meta.recipe.base.clone().unwrap_or_default());
    let recipe = Recipe {
        base: Some(base),
        ..blank_recipe(name)
    };
    ImageMeta {
        format: IMAGE_FORMAT,
        name: name.into(),
        version: 0,
        suite: st.suite.clone().unwrap_or_else(|| "unknown".into()),
        kernel: kernel.into(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        content_bytes: b::used_bytes(rootfs).unwrap_or(0),
        disk_bytes: std::fs::metadata(rootfs).map(|m| m.len()).unwrap_or(0),
        env: st.env.clone(),
        recipe,
        build_seconds: started.elapsed().as_secs_f64(),
        workdir: st.workdir.clone(),
        user: st.user.clone(),
        pulled: st.pulled.clone(),
        inputs: Some(inputs),
    }
}

struct Ctx<'a, 'l> {
    paths: &'a Paths,
    name: &'a str,
    work: PathBuf,
    mkfs: PathBuf,
    kernel: Kernel,
    context: PathBuf,
    ignore: Ignore,
    args: &'a BTreeMap<String, String>,
    globals: BTreeMap<String, String>,
    n: u32,
    total: u32,
    copies: u32,
    log: &'l mut dyn FnMut(BuildEvent),
}

impl Ctx<'_, '_> {
    fn step(&mut self, what: String) {
        self.n += 1;
        (self.log)(BuildEvent::Step {
            n: self.n,
            total: self.total,
            what,
        });
    }

    fn fail(&self, line: usize, what: &str, message: impl Into<String>) -> ImageError {
        failed(self.name, format!("line {line}: {what}"), message)
    }

    /// An unlisted image of a disk in `dir`, for booting.
    fn stage_image(&self, dir: PathBuf, env: BTreeMap<String, String>, base: String) -> Image {
        let r = Recipe {
            base: Some(base),
            ..blank_recipe(self.name)
        };
        b::stage_image(dir, &r, &self.kernel, env, (0, 0))
    }

    /// The disk and state stage `i` starts from.
    async fn base(
        &mut self,
        file: &df::Dockerfile,
        i: usize,
        done: &BTreeMap<usize, Done>,
    ) -> Result<(Image, State), ImageError> {
        let st = &file.stages[i];
        let from = df::substitute(&st.from, &self.globals);
        if let Some(j) = df::stage_index(&file.stages[..i], &from.to_ascii_lowercase()) {
            let d = done
                .get(&j)
                .ok_or_else(|| self.fail(st.line, "FROM", format!("stage {from} was not built")))?;
            return Ok((d.image.clone(), d.state.clone()));
        }
        let base = Base::parse(&from).map_err(|m| self.fail(st.line, "FROM", m))?;
        match base {
            Base::Image(r) => {
                let img = ImageStore::new(self.paths).resolve(&r)?;
                let state = State {
                    env: img.meta.env.clone(),
                    workdir: img.meta.workdir.clone(),
                    user: img.meta.user.clone(),
                    pinned: Some(img.reference()),
                    pulled: img.meta.pulled.clone(),
                    suite: Some(img.meta.suite.clone()),
                    labels: BTreeMap::new(),
                };
                Ok((img, state))
            }
            Base::Registry(reference) => {
                let mut log_line =
                    |ev: super::oci::PullEvent| (self.log)(BuildEvent::Log(b::pull_line(&ev)));
                let pulled = super::oci::pull(self.paths, &reference, &mut log_line).await?;
                let dir = self.work.join(format!("stage-{i}"));
                std::fs::create_dir_all(&dir)
                    .map_err(|e| ImageError::io("create the stage's directory", e))?;
                // Its steps are lines here: the instructions are this build's steps.
                let log = &mut *self.log;
                let mut as_lines = |ev: BuildEvent| match ev {
                    BuildEvent::Step { what, .. } => {
                        log(BuildEvent::Log(format!("forkbox: {what}")))
                    }
                    line => log(line),
                };
                let (root, suite) =
                    b::unpack_registry(&dir, &pulled, &reference, 0, &mut as_lines)?;
                let ImageDefaults { env, workdir, user } = pulled.defaults.clone();
                let r = Recipe {
                    base: Some(pulled.pinned.clone()),
                    ..blank_recipe(self.name)
                };
                let image = b::stage_from_root(
                    &root,
                    dir,
                    (&self.mkfs, &self.kernel),
                    &r,
                    env.clone(),
                    (0, 0),
                    &mut as_lines,
                )?;
                Ok((
                    image,
                    State {
                        env,
                        workdir,
                        user,
                        pinned: Some(pulled.pinned.clone()),
                        pulled: Some(pulled.pinned),
                        suite,
                        labels: BTreeMap::new(),
                    },
                ))
            }
            Base::Debian(_) => Err(self.fail(st.line, "FROM", "a Debian suite is no image")),
        }
    }

    async fn stage(
        &mut self,
        file: &df::Dockerfile,
        i: usize,
        last: bool,
        done: &mut BTreeMap<usize, Done>,
        lenders: &mut BTreeMap<usize, Sandbox>,
    ) -> Result<(), ImageError> {
        let st = &file.stages[i];
        self.step(format!(
            "line {}: FROM {}{}",
            st.line,
            st.from,
            st.name
                .as_ref()
                .map(|n| format!(" AS {n}"))
                .unwrap_or_default()
        ));
        let (image, mut state) = self.base(file, i, done).await?;
        let sb = Sandbox::boot_unlisted(self.paths, &b::build_sandbox(self.name), image)
            .await
            .map_err(|e| self.fail(st.line, "boot a sandbox of the base", e.to_string()))?;
        // Build arguments this stage declared (docker: only those are visible to it).
        let mut args: BTreeMap<String, String> = BTreeMap::new();
        let mut stages = Stages {
            file,
            i,
            done,
            lenders,
        };
        let result = async {
            for step in &st.steps {
                self.instruction(&mut stages, step, &sb, &mut state, &mut args)
                    .await?;
            }
            Ok::<(), ImageError>(())
        }
        .await;
        if let Err(e) = result {
            sb.destroy().await;
            return Err(e);
        }
        let dir = self.work.join(format!("done-{i}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| ImageError::io("create the stage's directory", e))?;
        sb.export_root(&dir.join("rootfs.ext4"))
            .await
            .map_err(|e| self.fail(st.line, "write the stage's disk", e.to_string()))?;
        crate::tree::discard_tree(&self.work.join(format!("stage-{i}")));
        b::check_built_disk(self.paths, &dir.join("rootfs.ext4"), self.name)?;
        let base = state.pinned.clone().unwrap_or_default();
        let image = self.stage_image(dir, state.env.clone(), base);
        if last {
            use std::os::unix::fs::PermissionsExt;
            let _ =
                std::fs::set_permissions(image.rootfs(), std::fs::Permissions::from_mode(0o444));
        }
        done.insert(i, Done { image, state });
        Ok(())
    }

    /// The environment a command of the stage gets: its ENV, then its ARGs (ENV wins).
    fn vars(state: &State, args: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut v = args.clone();
        v.extend(state.env.clone());
        v
    }

    /// Carries out one instruction of stage `stages.i` in its sandbox `sb`.
    async fn instruction(
        &mut self,
        stages: &mut Stages<'_>,
        step: &Step,
        sb: &Sandbox,
        state: &mut State,
        args: &mut BTreeMap<String, String>,
    ) -> Result<(), ImageError> {
        let vars = Self::vars(state, args);
        let sub = |s: &str| df::substitute(s, &vars);
        match step {
            Step::Run { line, run } => {
                let spec = self.run_spec(*line, run, state, vars);
                b::run_in(sb, spec, &mut *self.log)
                    .await
                    .map_err(|m| self.fail(*line, "RUN", m))
            }
            Step::Env { line, vars: pairs } => {
                self.step(format!("line {line}: ENV"));
                for (k, v) in pairs {
                    let v = df::substitute(v, &Self::vars(state, args));
                    state.env.insert(k.clone(), v);
                }
                Ok(())
            }
            Step::Arg {
                line,
                name,
                default,
            } => {
                self.step(format!("line {line}: ARG {name}"));
                let v = self
                    .args
                    .get(name)
                    .cloned()
                    .or_else(|| default.as_deref().map(&sub))
                    .or_else(|| self.globals.get(name).cloned());
                if let Some(v) = v {
                    args.insert(name.clone(), v);
                }
                Ok(())
            }
            Step::Workdir { line, path } => {
                let p = sub(path);
                let abs = absolute(state.workdir.as_deref(), &p);
                self.step(format!("line {line}: WORKDIR {abs}"));
                root_sh(
                    sb,
                    &format!("mkdir -p {}", b::sh_quote(&abs)),
                    &mut *self.log,
                )
                .await
                .map_err(|m| self.fail(*line, "WORKDIR", m))?;
                state.workdir = Some(abs);
                Ok(())
            }
            Step::User { line, user } => {
                let u = sub(user);
                self.step(format!("line {line}: USER {u}"));
                state.user = Some(u);
                Ok(())
            }
            Step::Label { line, pairs } => {
                self.step(format!("line {line}: LABEL"));
                for (k, v) in pairs {
                    state.labels.insert(sub(k), sub(v));
                }
                Ok(())
            }
            Step::Unused { line, instruction } => {
                self.step(format!(
                    "line {line}: {instruction} is recorded in the Dockerfile kept with the image, not used: a sandbox runs the commands it is given"
                ));
                Ok(())
            }
            Step::Copy { .. } => self.copy(stages, step, sb, state, &vars).await,
        }
    }

    /// COPY or ADD: the sources (from the context, or from a built stage's sandbox) staged in
    /// the guest, then placed at the destination with their owner and mode.
    async fn copy(
        &mut self,
        stages: &mut Stages<'_>,
        step: &Step,
        sb: &Sandbox,
        state: &State,
        vars: &BTreeMap<String, String>,
    ) -> Result<(), ImageError> {
        let Step::Copy {
            line,
            add,
            from,
            chown,
            chmod,
            srcs,
            dest,
        } = step
        else {
            return Ok(());
        };
        let sub = |s: &str| df::substitute(s, vars);
        let what = if *add { "ADD" } else { "COPY" };
        let srcs: Vec<String> = srcs.iter().map(|s| sub(s)).collect();
        let dest = absolute(state.workdir.as_deref(), &sub(dest));
        self.step(format!("line {line}: {what} {} {dest}", srcs.join(" ")));
        self.copies += 1;
        let staging = format!("/.forkbox-copy-{}", self.copies);
        let placed = match from {
            None => self.send_context(*line, what, &srcs, sb, &staging).await?,
            Some(f) => {
                let j = df::stage_index(&stages.file.stages[..stages.i], f)
                    .ok_or_else(|| self.fail(*line, what, format!("no stage {f}")))?;
                let at = format!("line {line}: {what}");
                let lender: &Sandbox = self.lender(&at, j, f, stages.done, stages.lenders).await?;
                self.send_from_stage(*line, what, &srcs, lender, sb, &staging)
                    .await?
            }
        };
        let script = place_script(
            &staging,
            &placed,
            &dest,
            *add,
            chown.as_deref(),
            chmod.as_deref(),
            dest.ends_with('/') || srcs.len() > 1,
        );
        root_sh(sb, &script, &mut *self.log)
            .await
            .map_err(|m| self.fail(*line, what, m))
    }

    /// A RUN instruction as a command in the build's sandbox: as the stage's user (root by
    /// default), in its working directory, with its environment.
    fn run_spec(
        &mut self,
        line: usize,
        run: &RunForm,
        state: &State,
        vars: BTreeMap<String, String>,
    ) -> ExecSpec {
        let program = match run {
            RunForm::Shell(c) => {
                self.step(format!("line {line}: RUN {c}"));
                Program::Argv(vec!["/bin/sh".into(), "-c".into(), c.clone()])
            }
            RunForm::Exec(a) => {
                self.step(format!("line {line}: RUN {a:?}"));
                Program::Argv(a.clone())
            }
        };
        ExecSpec {
            program,
            cwd: Some(state.workdir.clone().unwrap_or_else(|| "/".into())),
            env: vars.into_iter().collect(),
            timeout_ms: Some(b::BUILD_STEP_MS),
            stdin: false,
            tty: None,
            user: Some(state.user.clone().unwrap_or_else(|| "0:0".into())),
        }
    }

    /// The sandbox of built stage `j` (named `f` in the Dockerfile) that `COPY --from` copies
    /// from, booted on its first use and kept in `lenders` for the rest of the build.
    async fn lender<'l>(
        &self,
        at: &str,
        j: usize,
        f: &str,
        done: &BTreeMap<usize, Done>,
        lenders: &'l mut BTreeMap<usize, Sandbox>,
    ) -> Result<&'l Sandbox, ImageError> {
        match lenders.entry(j) {
            std::collections::btree_map::Entry::Occupied(o) => Ok(o.into_mut()),
            std::collections::btree_map::Entry::Vacant(v) => {
                let d = done
                    .get(&j)
                    .ok_or_else(|| failed(self.name, at, format!("stage {f} was not built")))?;
                let lender = Sandbox::boot_unlisted(
                    self.paths,
                    &b::build_sandbox(self.name),
                    d.image.clone(),
                )
                .await
                .map_err(|e| {
                    failed(
                        self.name,
                        format!("{at}: boot the stage to copy from"),
                        e.to_string(),
                    )
                })?;
                Ok(v.insert(lender))
            }
        }
    }

    /// Sends the context's sources into `staging/K/` in the guest; what each one is.
    async fn send_context(
        &mut self,
        line: usize,
        what: &str,
        srcs: &[String],
        sb: &Sandbox,
        staging: &str,
    ) -> Result<Vec<Placed>, ImageError> {
        let mut picked: Vec<PathBuf> = Vec::new();
        for s in srcs {
            let rel = inside_context(s).ok_or_else(|| {
                self.fail(line, what, format!("{s} is outside the build context"))
            })?;
            let found = expand(&self.context, &rel, &self.ignore);
            if found.is_empty() {
                return Err(self.fail(
                    line,
                    what,
                    format!(
                        "{s} matches nothing in the build context {}",
                        self.context.display()
                    ),
                ));
            }
            picked.extend(found);
        }
        let tar = self.work.join(format!("context-{}.tar.zst", self.copies));
        let placed = pack_context(&self.context, &picked, &self.ignore, &tar)
            .map_err(|e| self.fail(line, what, format!("pack the build context: {e}")))?;
        let sent = crate::files::upload_archive(sb.client(), &tar, staging).await;
        let _ = std::fs::remove_file(&tar);
        sent.map_err(|e| self.fail(line, what, e.to_string()))?;
        Ok(placed)
    }

    /// Whether `src` is a directory (true) or another kind of file in the stage's sandbox
    /// `lender`; refused, with what its directory holds, when it is not there.
    async fn kind_in_stage(
        &self,
        line: usize,
        what: &str,
        lender: &Sandbox,
        src: &str,
    ) -> Result<bool, ImageError> {
        let probe = lender
            .run(ExecSpec {
                program: Program::Argv(vec!["/bin/sh".into(), "-c".into(), "if [ -d \"$1\" ]; then echo dir; elif [ -e \"$1\" ] || [ -L \"$1\" ]; then echo file; else echo none; ls -A \"$(dirname \"$1\")\" 2>&1 | head -20; fi".into(), "sh".into(), src.to_string()]),
                cwd: Some("/".into()),
                env: vec![],
                timeout_ms: Some(60_000),
                stdin: false,
                tty: None,
                user: Some("0:0".into()),
            })
            .await
            .map_err(|e| self.fail(line, what, e.to_string()))?;
        if probe.code() != 0 {
            return Err(self.fail(
                line,
                what,
                format!(
                    "could not look for {src} in that stage: {}",
                    String::from_utf8_lossy(&probe.stderr).trim()
                ),
            ));
        }
        let kind = probe.stdout_text();
        let mut said = kind.lines();
        match said.next().unwrap_or("") {
            "dir" => Ok(true),
            "file" => Ok(false),
            "none" => {
                let beside: Vec<&str> = said.collect();
                Err(self.fail(
                    line,
                    what,
                    format!(
                        "{src} does not exist in that stage (its directory holds: {})",
                        if beside.is_empty() {
                            "nothing".to_string()
                        } else {
                            beside.join(" ")
                        }
                    ),
                ))
            }
            other => Err(self.fail(
                line,
                what,
                format!("could not look for {src} in that stage: it answered {other:?}"),
            )),
        }
    }

    /// Streams each source from the lending stage's sandbox into `staging/K/` here.
    async fn send_from_stage(
        &mut self,
        line: usize,
        what: &str,
        srcs: &[String],
        lender: &Sandbox,
        sb: &Sandbox,
        staging: &str,
    ) -> Result<Vec<Placed>, ImageError> {
        let mut placed = Vec::new();
        for (k, s) in srcs.iter().enumerate() {
            if s.contains(['*', '?', '[']) {
                return Err(self.fail(
                    line,
                    what,
                    format!("COPY --from with a wildcard ({s}) is not supported"),
                ));
            }
            let src = absolute(None, s);
            let is_dir = self.kind_in_stage(line, what, lender, &src).await?;
            let mut from = crate::files::get_archive(lender.client(), &src)
                .await
                .map_err(|e| self.fail(line, what, e.to_string()))?;
            let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
            let pump = tokio::spawn(async move {
                while let Some(chunk) = from.recv().await {
                    match chunk {
                        Ok(c) => {
                            if tx.send(c).await.is_err() {
                                return Ok(());
                            }
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                }
                Ok(())
            });
            let dest = format!("{staging}/{k}");
            let sent = crate::files::put_archive(sb.client(), &dest, rx).await;
            let pumped = pump.await.map_err(|e| e.to_string()).and_then(|r| r);
            pumped.map_err(|m| self.fail(line, what, m))?;
            sent.map_err(|e| self.fail(line, what, e.to_string()))?;
            let name = Path::new(&src)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            placed.push(Placed {
                k,
                name,
                is_dir,
                whole_dir: is_dir,
            });
        }
        Ok(placed)
    }
}

/// A recipe of nothing but a name (a Dockerfile's image records its base in it).
fn blank_recipe(name: &str) -> Recipe {
    Recipe {
        name: name.into(),
        suite: String::new(),
        base: None,
        mirror: super::recipe::DEFAULT_MIRROR.into(),
        apt: vec![],
        pip: vec![],
        npm: vec![],
        run: vec![],
        env: BTreeMap::new(),
        disk_free_mib: 2048,
    }
}

/// Runs a shell line as root in `sb`.
async fn root_sh(
    sb: &Sandbox,
    script: &str,
    log: &mut dyn FnMut(BuildEvent),
) -> Result<(), String> {
    b::run_in(
        sb,
        ExecSpec {
            program: Program::Argv(vec!["/bin/sh".into(), "-c".into(), script.into()]),
            cwd: Some("/".into()),
            env: vec![],
            timeout_ms: Some(b::BUILD_STEP_MS),
            stdin: false,
            tty: None,
            user: Some("0:0".into()),
        },
        log,
    )
    .await
}

/// `p` made absolute against the working directory (docker's rule for WORKDIR and COPY).
fn absolute(workdir: Option<&str>, p: &str) -> String {
    if p.starts_with('/') {
        return p.to_string();
    }
    let base = workdir.unwrap_or("/");
    let joined = format!("{}/{}", base.trim_end_matches('/'), p);
    // `./` and `.` collapse; a trailing `/` is kept (it says "a directory").
    let trailing = p.ends_with('/') || p == "." || p.ends_with("/.");
    let mut out = String::new();
    for c in Path::new(&joined).components() {
        if let Component::Normal(n) = c {
            out.push('/');
            out.push_str(&n.to_string_lossy());
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    if trailing && !out.ends_with('/') {
        out.push('/');
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_as_docker_resolves_them() {
        assert_eq!(absolute(Some("/src"), "./"), "/src/");
        assert_eq!(absolute(Some("/src"), "."), "/src/");
        assert_eq!(absolute(Some("/src/"), "lib/x.js"), "/src/lib/x.js");
        assert_eq!(absolute(None, "app"), "/app");
        assert_eq!(absolute(Some("/a"), "/b/"), "/b/");
    }
}
