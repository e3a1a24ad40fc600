//! The migration run, on the engine directly (one process owns its sandboxes; they are gone
//! when it returns, whatever happened).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkbox_engine::api::{ops, CreateRequest, Engine, EngineError, ForkRequest, MAX_FORK};
use forkbox_engine::paths::Paths;
use forkbox_engine::sandbox::Sandbox;
use forkbox_protocol::{ExecSpec, Program};
use serde::Serialize;

use crate::decide::{self, Attempt, Baseline};
use crate::llm::LlmEndpoint;
use crate::plans::{Plan, PorterKind};
use crate::reports::{self, Format, Results};
pub(crate) use crate::suite::{run_tests, TestRun};

/// Where the code lives in every sandbox.
pub const WORKDIR: &str = "/work";
/// Where the plans directory is uploaded.
pub const PLANDIR: &str = "/plan";

#[derive(Debug, Clone)]
pub struct MigrateConfig {
    pub from: String,
    pub to: String,
    pub code: PathBuf,
    pub test: String,
    pub plans: Vec<Plan>,
    /// Uploaded to /plan in every fork (scripts the porters use).
    pub plans_dir: PathBuf,
    pub out: PathBuf,
    /// Baseline runs (flaky detection); at least 1.
    pub runs: u32,
    /// Commands run in the new image's sandbox before the snapshot (e.g. `pip install -e .`).
    pub setup: Vec<String>,
    /// The network the setup steps may use (e.g. an allow list with the package registry);
    /// baseline runs and forks have none.
    pub setup_network: forkbox_engine::net::NetworkPolicy,
    /// Secrets the setup steps' HTTPS requests carry (a private registry's token): the
    /// setup sandbox gets placeholders; the snapshot, baseline and forks never hold a value.
    pub setup_secrets: Vec<forkbox_engine::api::SecretSpec>,
    /// Directories (relative to the code) the setup steps make that the baseline runs get
    /// too, copied from the prepared sandbox: what `npm ci` installed, so that it runs once
    /// (and the baseline, which has no network, has it).
    pub share: Vec<String>,
    pub format: Format,
    pub test_timeout_secs: u64,
    /// Price of a vCPU-second and of a GiB-second of guest memory, for the cost estimate.
    pub rate_cpu_second: f64,
    pub rate_gib_second: f64,
    /// The model endpoint for `llm` porters.
    pub llm: Option<LlmEndpoint>,
    /// The `forkbox` command line, put on `host` porters' PATH (and in `$FORKBOX_CLI`).
    pub cli: Option<PathBuf>,
    /// Reject plans whose patch changes test files (they are listed either way).
    pub protect_tests: bool,
    /// Which files are test files (`--tests GLOB`; by default the runners' usual naming).
    pub tests: crate::integrity::TestFiles,
    /// Serves the run's private API to host porters (the CLI gives the server's
    /// `spawn_private`); a plan with a host porter cannot run without it.
    pub api_host: Option<ApiHost>,
}

/// Serves `engine`'s API on the Unix socket `socket` until the returned task is aborted. Given
/// by the front end, so the migration needs no HTTP server of its own.
pub type ApiHost =
    fn(Arc<forkbox_engine::api::Engine>, &Path) -> std::io::Result<tokio::task::JoinHandle<()>>;

impl MigrateConfig {
    /// A migration of `code` from image `from` to `to`, judged by the test command `test`,
    /// with `plans` (their directory, `plans_dir`, goes to /plan in every fork) and the report
    /// written to `out`; the rest as the CLI's defaults: two baseline runs, no setup, no
    /// network, results read by format detection, an hour per test run, no prices, no model.
    pub fn new(
        (from, to): (&str, &str),
        code: PathBuf,
        test: &str,
        (plans, plans_dir): (Vec<Plan>, PathBuf),
        out: PathBuf,
    ) -> MigrateConfig {
        MigrateConfig {
            from: from.into(),
            to: to.into(),
            code,
            test: test.into(),
            plans,
            plans_dir,
            out,
            runs: 2,
            setup: vec![],
            setup_network: Default::default(),
            setup_secrets: Vec::new(),
            share: vec![],
            format: Format::Auto,
            test_timeout_secs: 3600,
            rate_cpu_second: 0.0,
            rate_gib_second: 0.0,
            llm: None,
            cli: None,
            protect_tests: false,
            tests: Default::default(),
            api_host: None,
        }
    }

    /// Whether a plan's porter runs on the host (and drives its fork through an API).
    fn needs_api(&self) -> bool {
        self.plans
            .iter()
            .any(|p| matches!(p.porter.kind(), Some(PorterKind::Host(_))))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Sandbox(#[from] forkbox_engine::error::SandboxError),
    #[error(transparent)]
    Engine(#[from] forkbox_engine::api::EngineError),
    #[error("uploading {what}: {message}")]
    Upload { what: String, message: String },
    #[error("the baseline on {image} could not be read: {message}")]
    Baseline { image: String, message: String },
    #[error("preparing the new image's sandbox: {0}")]
    Prepare(String),
    #[error("writing the report: {0}")]
    Report(std::io::Error),
}

/// Live progress, for the CLI to show.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A step of the run as a whole.
    Note(&'a str),
    /// A plan's fork entered a phase, or counted more tests in a test run.
    Fork {
        plan: &'a str,
        phase: &'a str,
        tests: usize,
    },
}

pub type Progress = dyn Fn(Event<'_>) + Send + Sync;

/// Files no patch carries: bytecode and tool caches, installed packages.
const IGNORED: &str = "'__pycache__/' '*.py[cod]' '.pytest_cache/' '.mypy_cache/' '.ruff_cache/' '*.egg-info/' '.tox/' '.nox/' 'node_modules/' '.eggs/'";
const COMMIT: &str = "git -c user.name=forkbox -c user.email=forkbox@localhost commit -q";

#[derive(Debug, Clone, Serialize)]
pub struct PlanRun {
    pub plan: String,
    pub instructions: String,
    pub porter: String,
    pub sandbox: Option<String>,
    pub porter_exit: Option<i32>,
    pub porter_ms: u64,
    pub porter_output_tail: String,
    /// Model calls an `llm` porter made, and the tokens they used.
    pub porter_steps: Option<u32>,
    pub llm_tokens: Option<u64>,
    /// An `llm` porter's conversation, relative to the output directory.
    pub transcript_file: Option<String>,
    pub test_exit: Option<i32>,
    pub test_ms: u64,
    pub results: Results,
    pub diff_stat: String,
    pub diff_lines: u64,
    /// The plan's patch, relative to the output directory.
    pub patch_file: Option<String>,
    pub failure: Option<String>,
    /// Whether the test command ran after the port (see [`decide::Attempt::tests_ran`]).
    pub tests_ran: bool,
    /// Where its results were read from.
    pub results_source: String,
    /// What the patch does to test files.
    pub test_changes: crate::integrity::TestChanges,
    pub cpu_seconds: f64,
    pub memory_gib_seconds: f64,
    /// `cpu_seconds` and `memory_gib_seconds` at the run's rates, in US dollars.
    pub cost: f64,
    /// What each test that failed or errored after the port said (from pytest's JUnit report;
    /// 4 KiB each at most).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub failures: reports::Failures,
    /// The last lines the test command printed after the port.
    pub test_output_tail: String,
    /// Its lost tests run once more before the verdict, when it lost any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerun: Option<Rerun>,
    /// The verdict on this plan (also in `verdicts`).
    pub verdict: Option<decide::Verdict>,
}

/// A plan's lost tests run once more (see [`decide`]): alone where the runner selects tests by
/// id (pytest), else with the whole suite.
#[derive(Debug, Clone, Serialize)]
pub struct Rerun {
    /// The tests run again.
    pub tests: Vec<String>,
    /// Whether they ran alone (by id) rather than with the whole suite.
    pub alone: bool,
    /// Their outcomes when run again.
    pub results: Results,
    pub ms: u64,
    /// Why the re-run gave no results, if so (the tests then stay lost).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A plan losing more tests than this is not re-run: its failure is no flake.
const RERUN_MAX: usize = 50;

#[derive(Debug, Clone, Serialize)]
pub struct Phases {
    pub baseline_ms: u64,
    pub prepare_ms: u64,
    pub fork_ms: u64,
    pub port_ms: u64,
    pub verify_ms: u64,
    pub total_ms: u64,
    /// Time spent inside test-suite runs (baseline runs + every fork's), summed: runs side
    /// by side overlap, so this can exceed `total_ms`, the wall time.
    pub test_suite_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MigrateReport {
    /// The shape of this report: 2 added `schema_version`, `forkbox_version`, `created_unix`,
    /// images as `NAME@N`, each plan's `verdict`, `failures` and `test_output_tail`, and each
    /// verdict's `rank_reason`; 3 added `baseline_order`, each plan's `rerun` and each
    /// verdict's `flaky_lost` (a lost test that passes when run again is no longer `lost`).
    pub schema_version: u32,
    pub forkbox_version: String,
    pub created_unix: u64,
    /// The old and the new image, as `NAME@N`.
    pub from: String,
    pub to: String,
    pub test: String,
    pub baseline: Baseline,
    pub baseline_runs: u32,
    /// Where the baseline's results were read from (pytest's JUnit report, or the text the
    /// command printed, in which format).
    pub results_source: String,
    /// The order the baseline's tests ran in: shuffled in each run (pytest-randomly), so that
    /// a test depending on another's leftovers shows as flaky, or the runner's own.
    pub baseline_order: String,
    pub plans: Vec<PlanRun>,
    pub verdicts: Vec<decide::Verdict>,
    pub winner: Option<String>,
    pub winner_patch: Option<String>,
    pub phases: Phases,
    pub accelerator: String,
}

/// `sh -c SCRIPT` in the code's directory, with a timeout.
pub(crate) fn sh(script: &str, timeout_secs: u64) -> ExecSpec {
    ExecSpec {
        program: Program::Shell(script.into()),
        cwd: Some(WORKDIR.into()),
        env: vec![],
        timeout_ms: Some(timeout_secs * 1000),
        stdin: false,
        tty: None,
        user: None,
    }
}

pub(crate) fn ms(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}

/// What a tail of a command's output may hold: the guest wrote it, and it goes into messages
/// and the report.
const TAIL_BYTES: usize = 8 << 10;

/// The last `n` lines of `b`, within its last [`TAIL_BYTES`] (a longer line keeps its end).
pub(crate) fn tail(b: &[u8], n: usize) -> String {
    let s = String::from_utf8_lossy(&b[b.len().saturating_sub(TAIL_BYTES)..]);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

async fn upload(sb: &Sandbox, src: &Path, dest: &str) -> Result<(), MigrateError> {
    forkbox_engine::files::upload(sb.client(), src, dest)
        .await
        .map(drop)
        .map_err(|e| MigrateError::Upload {
            what: src.display().to_string(),
            message: e.to_string(),
        })
}

/// The version of `report.json`'s shape (see [`MigrateReport::schema_version`]).
pub const REPORT_SCHEMA: u32 = 3;

/// Lines of a test run's output a report keeps.
pub(crate) const OUTPUT_TAIL_LINES: usize = 40;
/// What a report keeps of one lost test's failure.
const FAILURE_CAP: usize = 4096;

/// CPU-seconds and GiB-seconds of memory a sandbox's QEMU used so far.
fn usage(sb: &Sandbox, alive: Duration) -> (f64, f64) {
    let pid = sb.info().qemu_pid;
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s[s.rfind(')')? + 2..].to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .unwrap_or(0.0);
    // /proc counts CPU time in USER_HZ ticks, 100 per second on Linux.
    let hz = 100.0;
    let gib = sb.info().memory_mib as f64 / 1024.0;
    (ticks / hz, gib * alive.as_secs_f64())
}

/// `s` quoted for `/bin/sh`.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// What the prepared sandbox hands the baseline runs: each shared directory as a tar.zst file
/// on the host (an empty list when nothing is shared), or why it could not.
type Handed = Result<Arc<Vec<(String, PathBuf)>>, String>;
type HandOver = tokio::sync::watch::Sender<Option<Handed>>;
type HandedOver = tokio::sync::watch::Receiver<Option<Handed>>;

/// What one side of a migration tells the other once it knows it: the value or why not,
/// through a watch channel that holds `None` until then.
async fn told<T: Clone>(
    mut rx: tokio::sync::watch::Receiver<Option<Result<T, String>>>,
    gone: &str,
) -> Result<T, String> {
    match rx.wait_for(Option::is_some).await.map(|v| v.clone()) {
        Ok(Some(told)) => told,
        _ => Err(gone.into()),
    }
}

/// Waits for the prepared sandbox's shared directories.
async fn handed(rx: HandedOver) -> Result<Arc<Vec<(String, PathBuf)>>, MigrateError> {
    told(rx, "the preparation ended before it shared its directories")
        .await
        .map_err(MigrateError::Prepare)
}

/// The baseline's outcome, with what the report says about it.
struct BaselineRun {
    baseline: Baseline,
    accelerator: String,
    /// Time inside the test suite, summed over the runs.
    suite_ms: u64,
    /// Where the results were read from.
    source: String,
    /// The order the tests ran in (see [`MigrateReport::baseline_order`]).
    order: String,
    ms: u64,
}

/// Whether pytest-randomly is installed for the image's `python3` (pytest then loads it and
/// runs the tests in a new random order each run, which is what baseline runs are for).
async fn pytest_shuffles(sb: &Sandbox, cfg: &MigrateConfig) -> bool {
    if !cfg.test.contains("pytest") {
        return false;
    }
    sb.run(sh("python3 -c 'import pytest_randomly' 2>/dev/null", 120))
        .await
        .is_ok_and(|o| o.code() == 0)
}

/// Runs the test suite `runs` times on the old toolchain, each run in a sandbox of its own and
/// all at once (the guest is single-threaded Python: side by side they use the cores a single
/// run leaves idle), and marks the tests whose outcome differed as flaky.
async fn run_baseline(
    engine: &Engine,
    cfg: &MigrateConfig,
    progress: &Progress,
    shared: HandedOver,
) -> Result<BaselineRun, MigrateError> {
    let t = Instant::now();
    let n = cfg.runs.max(1);
    progress(Event::Note(&format!(
        "baseline: {n} run(s) side by side on {}",
        cfg.from
    )));
    let note = |s: &str| progress(Event::Note(s));
    let one = |i: u32| {
        let shared = shared.clone();
        async move {
            let row = format!("baseline {i}/{n}");
            let phase = |phase: &str, tests: usize| {
                progress(Event::Fork {
                    plan: &row,
                    phase,
                    tests,
                })
            };
            phase("starting", 0);
            let sb = create(engine, &cfg.from, None, Vec::new()).await?;
            let accelerator = format!("{} ({})", sb.info().accel.accel, sb.info().accel.reason);
            let run = async {
                phase("uploading", 0);
                upload(&sb, &cfg.code, WORKDIR).await?;
                if !cfg.share.is_empty() {
                    phase("waiting for setup", 0);
                    for (dir, file) in handed(shared).await?.iter() {
                        forkbox_engine::files::upload_archive(
                            sb.client(),
                            file,
                            &format!("{WORKDIR}/{dir}"),
                        )
                        .await
                        .map_err(|e| MigrateError::Upload {
                            what: format!("{dir} from the prepared sandbox"),
                            message: e.to_string(),
                        })?;
                    }
                }
                let shuffled = i == 1 && pytest_shuffles(&sb, cfg).await;
                phase("tests", 0);
                let run = run_tests(&sb, cfg, &|n| phase("tests", n), &[]).await;
                phase("done", run.results.as_ref().map_or(0, |r| r.len()));
                Ok::<_, MigrateError>((run, shuffled))
            }
            .await;
            delete(engine, &sb).await;
            let (run, shuffled) = run?;
            let r = run.results.map_err(|message| MigrateError::Baseline {
                image: cfg.from.clone(),
                message,
            })?;
            note(&format!(
                "baseline: run {i}/{n}: {} (exit {}, {} ms; read from {})",
                reports::Counts::of(&r),
                run.exit.unwrap_or(-1),
                run.ms,
                run.source
            ));
            Ok::<_, MigrateError>((r, run.ms, run.source, accelerator, shuffled))
        }
    };
    let runs = futures_util::future::join_all((1..=n).map(one)).await;
    let mut results = Vec::new();
    let (mut suite_ms, mut source, mut accelerator) = (0, String::new(), String::new());
    let mut shuffled = false;
    for run in runs {
        let (r, ms, src, accel, s) = run?;
        results.push(r);
        suite_ms += ms;
        source = src;
        accelerator = accel;
        shuffled |= s;
    }
    let order = if shuffled {
        format!("shuffled by pytest-randomly, a new order in each of the {n} run(s)")
    } else {
        "the runner's own order (pytest-randomly in the old image would shuffle each run)".into()
    };
    Ok(BaselineRun {
        baseline: Baseline::from_runs(&results),
        accelerator,
        suite_ms,
        source,
        order,
        ms: ms(t),
    })
}

/// Prepares the code on the new toolchain (upload, a baseline commit, the setup steps, a
/// "prepared" commit): the prepared sandbox, for the plans to fork, and how long it took.
async fn prepare(
    engine: &Engine,
    cfg: &MigrateConfig,
    progress: &Progress,
    (hand, hand_dir): (HandOver, &Path),
) -> Result<(Arc<Sandbox>, u64), MigrateError> {
    let t = Instant::now();
    if cfg.share.is_empty() {
        let _ = hand.send(Some(Ok(Arc::new(Vec::new()))));
    }
    let phase = |phase: &str| {
        progress(Event::Fork {
            plan: "prepare",
            phase,
            tests: 0,
        })
    };
    phase("starting");
    let new = create(
        engine,
        &cfg.to,
        Some(cfg.setup_network.clone()),
        cfg.setup_secrets.clone(),
    )
    .await?;
    let prepared = async {
        phase("uploading");
        upload(&new, &cfg.code, WORKDIR).await?;
        upload(&new, &cfg.plans_dir, PLANDIR).await?;
        phase("setup");
        // Caches and build output never belong to a plan's patch; what the setup steps
        // write is committed with the code, so a patch holds the porter's change alone.
        let mut steps = vec![format!(
            "git init -q && printf '%s\\n' {IGNORED} >> .git/info/exclude && git add -A && {COMMIT} -m baseline"
        )];
        steps.extend(cfg.setup.iter().cloned());
        steps.push(format!("git add -A && {COMMIT} --allow-empty -m prepared"));
        for d in &cfg.share {
            steps.push(format!(
                "test -d {0} || {{ echo '--share {0}: the setup made no such directory' >&2; exit 1; }}",
                shell_quote(d)
            ));
        }
        for step in &steps {
            let out = new.run(sh(step, 3600)).await?;
            if out.code() != 0 {
                return Err(MigrateError::Prepare(format!(
                    "`{step}` exited with {}:\n{}",
                    out.code(),
                    tail(&[out.stdout.as_slice(), out.stderr.as_slice()].concat(), 10)
                )));
            }
        }
        if !cfg.share.is_empty() {
            phase("sharing");
            let mut list = Vec::new();
            for (i, d) in cfg.share.iter().enumerate() {
                let file = hand_dir.join(format!("share-{i}.tar.zst"));
                forkbox_engine::files::save_archive(new.client(), &format!("{WORKDIR}/{d}"), &file)
                    .await
                    .map_err(|e| MigrateError::Prepare(format!("share {d}: {e}")))?;
                list.push((d.clone(), file));
            }
            let _ = hand.send(Some(Ok(Arc::new(list))));
        }
        phase("done");
        Ok::<_, MigrateError>(())
    }
    .await;
    if let Err(e) = prepared {
        delete(engine, &new).await;
        let _ = hand.send(Some(Err(format!("the preparation failed: {e}"))));
        return Err(e);
    }
    Ok((new, ms(t)))
}

/// The baseline as the plans' tasks see it: none until it is done, then it or why it failed.
type BaselineWatch = tokio::sync::watch::Receiver<Option<Result<Arc<Baseline>, String>>>;

/// What every plan's task shares.
struct Shared {
    cfg: MigrateConfig,
    baseline: BaselineWatch,
    progress: Arc<Progress>,
    /// The run's own engine: every sandbox of the migration is made, forked and deleted
    /// through it.
    engine: Arc<Engine>,
    /// The address of its API, served to host porters to drive their forks through.
    api: Option<PathBuf>,
}

impl Shared {
    /// The baseline, once its runs are done.
    async fn baseline(&self) -> Result<Arc<Baseline>, String> {
        told(self.baseline.clone(), "the baseline ended without a result").await
    }

    /// Why the baseline failed, if it did already (then no plan's work can be judged).
    fn baseline_failed(&self) -> Option<String> {
        match &*self.baseline.borrow() {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        }
    }
}

/// What the plans' side of a migration did.
struct PlansRun {
    plans: Vec<PlanRun>,
    prepare_ms: u64,
    fork_ms: u64,
    port_ms: u64,
    verify_ms: u64,
    /// Time in test-suite runs, summed over the forks (re-runs included).
    suite_ms: u64,
}

/// Runs a migration: the baseline on the old toolchain, and side by side with it the new
/// toolchain's preparation, one fork of it per plan, each plan's port and test run (a plan
/// needs the baseline only to be judged: its lost tests are re-run once it is known); then
/// the verdicts and the report.
pub async fn migrate(
    paths: &Paths,
    cfg: &MigrateConfig,
    progress: Arc<Progress>,
) -> Result<MigrateReport, MigrateError> {
    let started = Instant::now();
    if cfg.needs_api() && cfg.api_host.is_none() {
        return Err(MigrateError::Report(std::io::Error::other(
            "a plan has a host porter, and this front end serves no API for it to drive its fork through",
        )));
    }
    std::fs::create_dir_all(&cfg.out).map_err(MigrateError::Report)?;
    // Directories the setup makes for the baseline too (`--share`) go over as files here.
    let hand_dir = tempfile::Builder::new()
        .prefix("forkbox-share-")
        .tempdir()
        .map_err(MigrateError::Report)?;
    let (hand, handed) = tokio::sync::watch::channel(None);
    let (told, baseline_rx) = tokio::sync::watch::channel(None);
    // The run's sandboxes die with this process, as the run's own.
    let engine = Arc::new(Engine::one_shot(paths.clone()));
    let baseline = async {
        let b = run_baseline(&engine, cfg, &*progress, handed).await;
        let _ = told.send(Some(
            b.as_ref()
                .map(|b| Arc::new(b.baseline.clone()))
                .map_err(|e| e.to_string()),
        ));
        b
    };
    let plans = run_plans(
        &engine,
        cfg,
        &progress,
        (hand, hand_dir.path()),
        baseline_rx,
    );
    let (baseline, plans) = tokio::join!(baseline, plans);
    drop(hand_dir);
    // Whatever is left (a host porter's own sandboxes) goes with the run, and with the last
    // copies the snapshot they were forked from.
    engine.shutdown().await;
    let baseline = baseline?;
    let plans = plans?;
    finish(paths, cfg, started, &progress, baseline, plans)
}

/// Prepares the new toolchain, forks it once per plan and runs every plan's port and tests.
async fn run_plans(
    engine: &Arc<Engine>,
    cfg: &MigrateConfig,
    progress: &Arc<Progress>,
    hand: (HandOver, &Path),
    baseline: BaselineWatch,
) -> Result<PlansRun, MigrateError> {
    let note = |s: &str| progress(Event::Note(s));
    let (prepared, prepare_ms) = prepare(engine, cfg, &**progress, hand).await?;

    // Host porters reach their forks through the run's engine, on a private socket.
    let (api, server, api_dir) = if let Some(serve) = cfg.api_host.filter(|_| cfg.needs_api()) {
        let dir = tempfile::Builder::new()
            .prefix("forkbox-migrate-")
            .tempdir()
            .map_err(MigrateError::Report)?;
        let socket = dir.path().join("api.sock");
        let server = serve(engine.clone(), &socket).map_err(MigrateError::Report)?;
        (Some(socket), Some(server), Some(dir))
    } else {
        (None, None, None)
    };

    let t = Instant::now();
    for p in &cfg.plans {
        progress(Event::Fork {
            plan: &p.name,
            phase: "forking",
            tests: 0,
        });
    }
    let forks = fork_plans(engine, &prepared, cfg.plans.len(), &note).await;
    let fork_ms = ms(t);
    delete(engine, &prepared).await;
    note(&format!(
        "fork: {} copies in {fork_ms} ms",
        forks.iter().filter(|f| f.is_ok()).count()
    ));

    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        baseline,
        progress: progress.clone(),
        engine: engine.clone(),
        api,
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (i, fork) in forks.into_iter().enumerate() {
        let plan = cfg.plans[i].clone();
        let shared = shared.clone();
        tasks.spawn(async move { (i, port_and_verify(plan, fork, &shared).await) });
    }
    let mut runs: Vec<Option<PlanRun>> = (0..cfg.plans.len()).map(|_| None).collect();
    let (mut port_ms, mut verify_ms, mut suite_ms) = (0, 0, 0);
    while let Some(done) = tasks.join_next().await {
        if let Ok((i, (run, pm, vm))) = done {
            port_ms = port_ms.max(pm);
            verify_ms = verify_ms.max(vm);
            suite_ms += run.test_ms + run.rerun.as_ref().map_or(0, |r| r.ms);
            runs[i] = Some(run);
        }
    }
    if let Some(server) = server {
        server.abort();
    }
    drop(api_dir);
    Ok(PlansRun {
        plans: runs.into_iter().flatten().collect(),
        prepare_ms,
        fork_ms,
        port_ms,
        verify_ms,
        suite_ms,
    })
}

/// The verdicts on the plans' runs against the baseline, the winner's patch and the report.
fn finish(
    paths: &Paths,
    cfg: &MigrateConfig,
    started: Instant,
    progress: &Arc<Progress>,
    baseline: BaselineRun,
    plans: PlansRun,
) -> Result<MigrateReport, MigrateError> {
    let BaselineRun {
        baseline,
        accelerator,
        suite_ms: baseline_suite_ms,
        source: results_source,
        order: baseline_order,
        ms: baseline_ms,
    } = baseline;
    let PlansRun {
        plans,
        prepare_ms,
        fork_ms,
        port_ms,
        verify_ms,
        suite_ms,
    } = plans;
    let attempts: Vec<Attempt> = plans
        .iter()
        .map(|p| Attempt {
            plan: p.plan.clone(),
            failure: p.failure.clone(),
            tests_ran: p.tests_ran,
            test_changes: p.test_changes.clone(),
            results: p.results.clone(),
            diff_lines: p.diff_lines,
            test_ms: p.test_ms,
            rerun: p
                .rerun
                .as_ref()
                .filter(|r| r.error.is_none())
                .map(|r| r.results.clone()),
        })
        .collect();
    let verdicts = decide::decide(&baseline, &attempts, cfg.protect_tests);
    for v in &verdicts {
        progress(Event::Fork {
            plan: &v.plan,
            phase: if v.accepted { "accepted" } else { "rejected" },
            tests: plans
                .iter()
                .find(|p| p.plan == v.plan)
                .map_or(0, |p| p.results.len()),
        });
    }
    let winner = verdicts
        .iter()
        .find(|v| v.rank == Some(1))
        .map(|v| v.plan.clone());
    let mut plans = plans;
    for p in &mut plans {
        p.verdict = verdicts.iter().find(|v| v.plan == p.plan).cloned();
    }
    // The winner's patch, when it changed anything (a plan that changed nothing has none).
    let winner_file = winner
        .as_ref()
        .and_then(|w| plans.iter().find(|p| &p.plan == w))
        .and_then(|p| p.patch_file.clone());
    let winner_patch = match winner_file {
        Some(file) => {
            let to = cfg.out.join("winner.patch");
            std::fs::copy(cfg.out.join(file), &to).map_err(MigrateError::Report)?;
            Some("winner.patch".to_string())
        }
        None => {
            let _ = std::fs::remove_file(cfg.out.join("winner.patch"));
            None
        }
    };
    let reference = |image: &str| {
        image
            .parse()
            .ok()
            .and_then(|r| {
                forkbox_engine::image::ImageStore::new(paths)
                    .resolve(&r)
                    .ok()
            })
            .map_or_else(|| image.to_string(), |i| i.reference())
    };
    let report = MigrateReport {
        schema_version: REPORT_SCHEMA,
        forkbox_version: env!("CARGO_PKG_VERSION").into(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        from: reference(&cfg.from),
        to: reference(&cfg.to),
        test: cfg.test.clone(),
        baseline,
        baseline_runs: cfg.runs.max(1),
        results_source,
        baseline_order,
        plans,
        verdicts,
        winner,
        winner_patch,
        phases: Phases {
            baseline_ms,
            prepare_ms,
            fork_ms,
            port_ms,
            verify_ms,
            total_ms: ms(started),
            test_suite_ms: baseline_suite_ms + suite_ms,
        },
        accelerator,
    };
    crate::report::write(&cfg.out, &report).map_err(MigrateError::Report)?;
    Ok(report)
}

/// A sandbox of `image` on the run's engine (with `network` open and `secrets`, else none),
/// and the handle the run works in it through.
async fn create(
    engine: &Engine,
    image: &str,
    network: Option<forkbox_engine::net::NetworkPolicy>,
    secrets: Vec<forkbox_engine::api::SecretSpec>,
) -> Result<Arc<Sandbox>, MigrateError> {
    let request = CreateRequest {
        image: Some(image.into()),
        network,
        secrets,
        ..Default::default()
    };
    let view = engine.call(ops::Create { request }).await?;
    Ok(engine.sandbox(&view.info.id).await?)
}

/// Deletes a sandbox of the run (one already gone, a host porter's doing, is no error).
async fn delete(engine: &Engine, sb: &Sandbox) {
    let id = sb.info().id.clone();
    if let Err(e) = engine.call(ops::Delete { id: id.clone() }).await {
        if !matches!(e, EngineError::NoSuchSandbox(_)) {
            tracing::warn!("{id}: could not be deleted: {e}");
        }
    }
}

/// `n` copies of the prepared sandbox, one per plan, through the engine's fork (at most
/// [`MAX_FORK`] a call), with no network; a copy that could not be made is its plan's failure.
async fn fork_plans(
    engine: &Engine,
    prepared: &Sandbox,
    n: usize,
    note: &dyn Fn(&str),
) -> Vec<Result<Arc<Sandbox>, String>> {
    let mut forks = Vec::with_capacity(n);
    let source = prepared.info().id.clone();
    while forks.len() < n {
        let count = (n - forks.len()).min(MAX_FORK as usize);
        let request = ForkRequest {
            count: count as u32,
            labels: Default::default(),
            ttl_seconds: None,
            max_processes: None,
            network: Some(Default::default()),
            node: None,
            secrets: Vec::new(),
            idle: None,
            wake_on_use: None,
            volumes: Vec::new(),
        };
        let source = source.clone();
        let got = match engine.call(ops::Fork { source, request }).await {
            Ok(f) => f,
            Err(e) => {
                forks.extend((0..count).map(|_| Err(e.to_string())));
                continue;
            }
        };
        note(&format!(
            "fork: snapshot {} ({} ms pause)",
            got.snapshot,
            got.pause_ms.unwrap_or(0.0) as u64
        ));
        let short = count.saturating_sub(got.sandboxes.len());
        for v in &got.sandboxes {
            forks.push(engine.sandbox(&v.info.id).await.map_err(|e| e.to_string()));
        }
        let mut failed = got.failed.into_iter();
        for _ in 0..short {
            forks.push(Err(failed.next().unwrap_or_else(|| {
                "the engine made fewer copies than asked".into()
            })));
        }
    }
    forks
}

/// How a porter ended: its exit code (None if it never ran), whether it timed out, the tail
/// of its output.
struct Ported {
    exit: Option<i32>,
    timed_out: bool,
    tail: String,
}

/// A `host` porter: `sh -c` on the host, in the plans directory, with the fork's id and the
/// private API's address in its environment; the whole process group dies on timeout.
async fn host_porter(command: &str, plan: &Plan, id: &str, shared: &Shared) -> Ported {
    let Some(socket) = &shared.api else {
        return Ported {
            exit: None,
            timed_out: false,
            tail: "no API was started for host porters".into(),
        };
    };
    let cfg = &shared.cfg;
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(&cfg.plans_dir)
        .env("FORKBOX_SANDBOX", id)
        .env("FORKBOX_API", format!("unix:{}", socket.display()))
        .env("FORKBOX_PLAN", &plan.instructions)
        .env("FORKBOX_PLAN_NAME", &plan.name)
        .env("FORKBOX_WORKDIR", WORKDIR)
        .env("FORKBOX_TEST", &cfg.test)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cli) = &cfg.cli {
        cmd.env("FORKBOX_CLI", cli);
        if let Some(dir) = cli.parent() {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut dirs = vec![dir.to_path_buf()];
            dirs.extend(std::env::split_paths(&path));
            if let Ok(joined) = std::env::join_paths(dirs) {
                cmd.env("PATH", joined);
            }
        }
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Ported {
                exit: None,
                timed_out: false,
                tail: format!("could not start `sh`: {e}"),
            }
        }
    };
    let pgid = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
    let limit = Duration::from_secs(plan.porter.timeout_secs);
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(out)) => Ported {
            exit: Some(out.status.code().unwrap_or(-1)),
            timed_out: false,
            tail: tail(&[out.stdout.as_slice(), out.stderr.as_slice()].concat(), 20),
        },
        Ok(Err(e)) => Ported {
            exit: None,
            timed_out: false,
            tail: format!("waiting for the host porter failed: {e}"),
        },
        Err(_) => {
            if let Some(pg) = pgid {
                let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGKILL);
            }
            Ported {
                exit: None,
                timed_out: true,
                tail: String::new(),
            }
        }
    }
}

/// One plan in its fork: the porter, the patch, the tests and, when it lost tests, their
/// re-run; its run and the time its port and its verification took.
async fn port_and_verify(
    plan: Plan,
    fork: Result<Arc<Sandbox>, String>,
    shared: &Shared,
) -> (PlanRun, u64, u64) {
    let cfg = &shared.cfg;
    let phase = |phase: &str, tests: usize| {
        (shared.progress)(Event::Fork {
            plan: &plan.name,
            phase,
            tests,
        })
    };
    let mut run = PlanRun {
        plan: plan.name.clone(),
        instructions: plan.instructions.clone(),
        porter: plan.porter.describe(),
        sandbox: None,
        porter_exit: None,
        porter_ms: 0,
        porter_output_tail: String::new(),
        porter_steps: None,
        llm_tokens: None,
        transcript_file: None,
        test_exit: None,
        test_ms: 0,
        results: Results::new(),
        diff_stat: String::new(),
        diff_lines: 0,
        tests_ran: false,
        results_source: String::new(),
        test_changes: Default::default(),
        patch_file: None,
        failure: None,
        cpu_seconds: 0.0,
        memory_gib_seconds: 0.0,
        cost: 0.0,
        failures: Default::default(),
        test_output_tail: String::new(),
        rerun: None,
        verdict: None,
    };
    let sb = match fork {
        Ok(sb) => sb,
        Err(e) => {
            run.failure = Some(format!("its fork could not be made: {e}"));
            phase("failed", 0);
            return (run, 0, 0);
        }
    };
    let alive = Instant::now();
    run.sandbox = Some(sb.info().id.clone());
    let t = Instant::now();
    if let Some(why) = shared.baseline_failed() {
        run.failure = Some(format!("not ported: the baseline failed ({why})"));
    } else {
        phase("porting", 0);
        port(&plan, &sb, shared, &mut run).await;
    }
    let port_ms = ms(t);
    run.porter_ms = port_ms;
    let t = Instant::now();
    if run.failure.is_none() {
        phase("diff", 0);
        take_patch(&plan, &sb, cfg, &mut run).await;
    }
    let mut waited = Duration::ZERO;
    if run.failure.is_none() {
        waited = verify(&sb, shared, &mut run, &phase).await;
    }
    phase(
        if run.failure.is_some() {
            "failed"
        } else {
            "tested"
        },
        run.results.len(),
    );
    let verify_ms = ms(t).saturating_sub(waited.as_millis() as u64);
    let (cpu, mem) = usage(&sb, alive.elapsed());
    run.cpu_seconds = cpu;
    run.memory_gib_seconds = mem;
    run.cost = cpu * cfg.rate_cpu_second + mem * cfg.rate_gib_second;
    delete(&shared.engine, &sb).await;
    (run, port_ms, verify_ms)
}

/// Runs the plan's porter in (or, for a host porter, against) its fork; a porter that fails
/// leaves `run.failure` set.
async fn port(plan: &Plan, sb: &Arc<Sandbox>, shared: &Shared, run: &mut PlanRun) {
    let cfg = &shared.cfg;
    let id = sb.info().id.clone();
    let timeout_secs = plan.porter.timeout_secs;
    let ported = match plan.porter.kind() {
        Some(PorterKind::Guest(command)) => {
            let mut spec = sh(command, timeout_secs);
            spec.env
                .push(("FORKBOX_PLAN".into(), plan.instructions.clone()));
            match sb.run(spec).await {
                Ok(out) => Ported {
                    exit: Some(out.code()),
                    timed_out: out.timed_out,
                    tail: tail(&[out.stdout.as_slice(), out.stderr.as_slice()].concat(), 20),
                },
                Err(e) => Ported {
                    exit: None,
                    timed_out: false,
                    tail: format!("the porter could not run: {e}"),
                },
            }
        }
        Some(PorterKind::Host(command)) => {
            let p = host_porter(command, plan, &id, shared).await;
            let op = ops::Get { id: id.clone() };
            if let Err(EngineError::NoSuchSandbox(_)) = shared.engine.call(op).await {
                run.failure = Some("the host porter deleted its fork".into());
            }
            p
        }
        Some(PorterKind::Llm(porter)) => {
            // The model is told which tests passed before: it waits for the baseline.
            let baseline = match shared.baseline().await {
                Ok(b) => b,
                Err(why) => {
                    run.failure = Some(format!("not ported: the baseline failed ({why})"));
                    return;
                }
            };
            let on_tests = |n: usize| {
                (shared.progress)(Event::Fork {
                    plan: &plan.name,
                    phase: "porting: tests",
                    tests: n,
                })
            };
            let task = crate::llm::Task {
                sandbox: sb,
                instructions: &plan.instructions,
                porter,
                endpoint: cfg.llm.as_ref(),
                cfg,
                baseline: &baseline,
                on_tests: &on_tests,
            };
            let limit = Duration::from_secs(timeout_secs);
            match tokio::time::timeout(limit, crate::llm::port(&task)).await {
                Ok(l) => {
                    run.porter_steps = Some(l.steps);
                    run.llm_tokens = Some(l.tokens);
                    let file = format!("{}.llm.json", plan.name);
                    if let Ok(text) = serde_json::to_vec_pretty(&l.transcript) {
                        if std::fs::write(cfg.out.join(&file), text).is_ok() {
                            run.transcript_file = Some(file);
                        }
                    }
                    Ported {
                        exit: Some(i32::from(l.error.is_some())),
                        timed_out: false,
                        tail: l.outcome,
                    }
                }
                Err(_) => Ported {
                    exit: None,
                    timed_out: true,
                    tail: String::new(),
                },
            }
        }
        None => Ported {
            exit: None,
            timed_out: false,
            tail: "the plan has no porter".into(),
        },
    };
    run.porter_exit = ported.exit;
    run.porter_output_tail = ported.tail;
    if run.failure.is_none() {
        run.failure = if ported.timed_out {
            Some(format!("the porter timed out after {timeout_secs} s"))
        } else {
            match ported.exit {
                Some(0) => None,
                Some(code) => Some(format!(
                    "the porter exited with {code}: {}",
                    run.porter_output_tail.lines().last().unwrap_or("")
                )),
                None => Some(format!(
                    "the porter could not run: {}",
                    run.porter_output_tail.lines().last().unwrap_or("")
                )),
            }
        };
    }
}

/// The patch is the porter's change, taken before the tests run: whatever the suite writes
/// into the tree never enters it. Binary files the porter made come in a form `git apply`
/// takes.
async fn take_patch(plan: &Plan, sb: &Sandbox, cfg: &MigrateConfig, run: &mut PlanRun) {
    let diff_cmd = "git add -A && git diff --cached --stat > /tmp/forkbox.stat && git diff --cached --binary > /tmp/forkbox.diff";
    match sb.run(sh(diff_cmd, 600)).await {
        Ok(o) if o.code() == 0 => {
            let stat = sb
                .client()
                .read_file("/tmp/forkbox.stat")
                .await
                .unwrap_or_default();
            let diff = sb
                .client()
                .read_file("/tmp/forkbox.diff")
                .await
                .unwrap_or_default();
            run.diff_stat = String::from_utf8_lossy(&stat).into_owned();
            let text = String::from_utf8_lossy(&diff).into_owned();
            run.diff_lines = decide::diff_lines(&text);
            run.test_changes = crate::integrity::of_diff(&text, &cfg.tests);
            // A plan that changed nothing has no patch to write.
            let file = format!("{}.patch", plan.name);
            if !diff.is_empty() && std::fs::write(cfg.out.join(&file), diff).is_ok() {
                run.patch_file = Some(file);
            }
        }
        Ok(o) => run.failure = Some(format!("`git diff` failed with {}", o.code())),
        Err(e) => run.failure = Some(format!("`git diff` could not run: {e}")),
    }
}

/// Runs the tests after the port, then, once the baseline is known, the tests it lost once
/// more (see [`decide`]); how long it waited for the baseline.
async fn verify(
    sb: &Sandbox,
    shared: &Shared,
    run: &mut PlanRun,
    phase: &(dyn Fn(&str, usize) + Send + Sync),
) -> Duration {
    let cfg = &shared.cfg;
    phase("testing", 0);
    let tested = run_tests(sb, cfg, &|n| phase("testing", n), &[]).await;
    run.tests_ran = true;
    run.test_exit = tested.exit;
    run.test_ms = tested.ms;
    run.results_source = tested.source;
    run.test_output_tail = tested.output_tail;
    run.failures = tested
        .failures
        .into_iter()
        .take(100)
        .map(|(id, mut detail)| {
            if detail.len() > FAILURE_CAP {
                let mut cut = FAILURE_CAP;
                while !detail.is_char_boundary(cut) {
                    cut -= 1;
                }
                detail.truncate(cut);
                detail.push_str("\n…");
            }
            (id, detail)
        })
        .collect();
    match tested.results {
        Ok(r) => run.results = r,
        Err(e) => {
            run.failure = Some(e);
            return Duration::ZERO;
        }
    }
    let t = Instant::now();
    phase("waiting for the baseline", run.results.len());
    let Ok(baseline) = shared.baseline().await else {
        return t.elapsed();
    };
    let waited = t.elapsed();
    let lost = baseline.lost(&baseline.attribute_file_errors(&run.results));
    if lost.is_empty() || lost.len() > RERUN_MAX {
        return waited;
    }
    let alone = tested.selectable;
    phase("re-running lost tests", 0);
    let again = run_tests(
        sb,
        cfg,
        &|n| phase("re-running lost tests", n),
        if alone { &lost } else { &[] },
    )
    .await;
    let (results, error) = match again.results {
        Ok(r) => (
            r.into_iter().filter(|(id, _)| lost.contains(id)).collect(),
            None,
        ),
        Err(e) => (Results::new(), Some(e)),
    };
    run.rerun = Some(Rerun {
        tests: lost,
        alone,
        results,
        ms: again.ms,
        error,
    });
    waited
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_is_bounded_whatever_the_guest_prints() {
        assert_eq!(tail(b"a\nb\nc\n", 2), "b\nc");
        let flood = vec![b'x'; 10 << 20];
        assert_eq!(tail(&flood, 40).len(), TAIL_BYTES);
        let many = "line\n".repeat(1 << 20);
        assert_eq!(tail(many.as_bytes(), 40), vec!["line"; 40].join("\n"));
    }
}
