//! Running commands: process groups, per-command cgroups, timeouts, and reaping as PID 1.
//!
//! As PID 1 the agent inherits every orphan, so one reaper thread waits for all children. It
//! peeks at an exited child with `WNOWAIT` and reaps it only while holding the table lock that
//! `spawn` also holds; so it never reaps a child that `std::process::Command::spawn` is itself
//! waiting for (std reaps a child whose `exec` failed, and would panic on `ECHILD`).

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use forkbox_protocol::{AgentMsg, ExecSpec, ExitStatus, Program, WinSize, CHUNK};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::serve::Outbox;

const CGROUP_ROOT: &str = crate::boot::COMMANDS_CGROUP;
/// How long output may still arrive after the command's main process exited (from processes
/// it left behind holding its stdout or stderr) before the exit is reported. What the command
/// itself wrote is always reported, however late its reader runs.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);
/// A bound on waiting for readers told to drain (each takes at most a pipe's worth): only a
/// guest starved far beyond a busy host's would reach it.
const READER_STUCK: Duration = Duration::from_secs(60);
const BASE_ENV: &[(&str, &str)] = &[
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("HOME", "/root"),
    ("USER", "root"),
    ("LANG", "C.UTF-8"),
];

struct Running {
    /// Which spawn this is (`Inner::seq`), so only its own end removes it.
    run_no: u64,
    /// Set once the command's process exists.
    pgid: Option<Pid>,
    stdin: Option<Sender<Option<Vec<u8>>>>,
    /// A signal that came before the process existed.
    pending_signal: Option<Signal>,
    /// The terminal's controlling side, when it runs on one.
    tty: Option<Arc<OwnedFd>>,
    /// A size that came before the terminal existed.
    pending_size: Option<WinSize>,
}

type StdinRx = Receiver<Option<Vec<u8>>>;

struct Inner {
    out: Outbox,
    /// pid → where to deliver its exit status.
    children: Mutex<HashMap<i32, SyncSender<WaitStatus>>>,
    spawned: Condvar,
    running: Mutex<HashMap<u32, Running>>,
    cgroups: bool,
    seq: AtomicU64,
}

#[derive(Clone)]
pub struct Execs(Arc<Inner>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Execs {
    pub fn start(out: Outbox) -> Execs {
        let cgroups = fs::metadata(format!("{CGROUP_ROOT}/cgroup.procs")).is_ok();
        let inner = Arc::new(Inner {
            out,
            children: Mutex::new(HashMap::new()),
            spawned: Condvar::new(),
            running: Mutex::new(HashMap::new()),
            cgroups,
            seq: AtomicU64::new(0),
        });
        let r = inner.clone();
        std::thread::spawn(move || reaper(&r));
        Execs(inner)
    }

    pub fn spawn(&self, id: u32, spec: ExecSpec) {
        // Registered before the command starts: stdin the host sends right behind the request
        // waits in the channel instead of finding no command.
        let (stdin_tx, stdin_rx) = if spec.stdin {
            let (tx, rx) = channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        // Ids come from the host's connection; one still running from an earlier connection
        // (a copy restored from a snapshot, a daemon restarted) keeps its id, and a new command
        // may not take it over: its input and signals would go to the wrong process, and the
        // old one's end would remove the new one's entry.
        let run_no = self.0.seq.fetch_add(1, Ordering::Relaxed);
        {
            let mut running = lock(&self.0.running);
            if running.contains_key(&id) {
                drop(running);
                return self.0.out.error(
                    id,
                    &std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        format!("request id {id} is taken by a command still running"),
                    ),
                );
            }
            running.insert(
                id,
                Running {
                    run_no,
                    pgid: None,
                    stdin: stdin_tx,
                    pending_signal: None,
                    tty: None,
                    pending_size: None,
                },
            );
        }
        let inner = self.0.clone();
        let started = spawn_small(move || {
            run(&inner, id, spec, stdin_rx);
            forget(&inner, id, run_no);
        });
        if let Err(e) = started {
            forget(&self.0, id, run_no);
            self.0.out.error(
                id,
                &std::io::Error::new(
                    e.kind(),
                    format!("cannot start a thread for the command: {e}"),
                ),
            );
        }
    }

    pub fn stdin(&self, id: u32, data: Option<Vec<u8>>) {
        if let Some(tx) = lock(&self.0.running).get(&id).and_then(|r| r.stdin.clone()) {
            let _ = tx.send(data);
        }
    }

    /// Gives a command's terminal a new size (the kernel tells its foreground processes).
    pub fn resize(&self, id: u32, size: WinSize) {
        let mut running = lock(&self.0.running);
        match running.get_mut(&id) {
            Some(Running { tty: Some(m), .. }) => {
                let _ = set_size(m, size);
            }
            // Not started yet: applied as soon as its terminal exists.
            Some(r) => r.pending_size = Some(size),
            None => {}
        }
    }

    pub fn signal(&self, id: u32, signal: i32) {
        let Ok(sig) = Signal::try_from(signal) else {
            return self.0.out.error(
                id,
                &std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{signal} is not a signal number"),
                ),
            );
        };
        let mut running = lock(&self.0.running);
        match running.get_mut(&id) {
            Some(Running {
                pgid: Some(pgid), ..
            }) => {
                let _ = killpg(*pgid, sig);
            }
            // Not started yet: delivered as soon as its process exists.
            Some(r) => r.pending_signal = Some(sig),
            None => {}
        }
    }
}

/// Removes command `id`'s entry if it is still run `run_no`'s.
fn forget(inner: &Inner, id: u32, run_no: u64) {
    let mut running = lock(&inner.running);
    if running.get(&id).is_some_and(|r| r.run_no == run_no) {
        running.remove(&id);
    }
}

/// Per-command threads need little stack; a small one is cheaper to create, which matters
/// under emulation where every new mapping costs.
fn spawn_small<F: FnOnce() + Send + 'static>(f: F) -> std::io::Result<()> {
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .map(drop)
}

const STACK: usize = 256 * 1024;

/// How often an idle agent looks for children to reap that no command of its own started.
const IDLE_REAP: Duration = Duration::from_secs(5);

fn reaper(inner: &Inner) {
    loop {
        match waitid(Id::All, WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Ok(status) => {
                let Some(pid) = status.pid() else { continue };
                let mut children = lock(&inner.children);
                // Reap under the lock: a concurrent spawn has finished (or not started).
                // An error means std reaped it after a failed exec.
                if let Ok(ws) = waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                    if let Some(tx) = children.remove(&pid.as_raw()) {
                        let _ = tx.send(ws);
                    }
                }
            }
            Err(nix::errno::Errno::ECHILD) => {
                // Nothing to reap: sleep until a command starts (spawns happen under this
                // lock, so one that started since `waitid` is in the map already). The long
                // timeout only reaps what other threads' children leave behind; an idle guest
                // should not wake for it (under emulation every wake-up costs host CPU).
                let children = lock(&inner.children);
                if children.is_empty() {
                    let _ = inner.spawned.wait_timeout(children, IDLE_REAP);
                }
            }
            Err(_) => {}
        }
    }
}

/// A per-command cgroup, so that a timeout can kill everything the command started.
struct Cgroup {
    path: PathBuf,
    procs: OwnedFd,
}

impl Cgroup {
    fn create(inner: &Inner, id: u32) -> Option<Cgroup> {
        if !inner.cgroups {
            return None;
        }
        let n = inner.seq.fetch_add(1, Ordering::Relaxed);
        let path = PathBuf::from(format!("{CGROUP_ROOT}/exec-{id}-{n}"));
        fs::create_dir(&path).ok()?;
        let procs = fs::OpenOptions::new()
            .write(true)
            .open(path.join("cgroup.procs"))
            .ok()?;
        Some(Cgroup {
            path,
            procs: procs.into(),
        })
    }

    /// Moves into the cgroup what the command `pid` started before it joined: a process that
    /// forked at once, in a busy guest, left its children in the agent's own cgroup, outside
    /// the command's, where a timeout's kill missed them (a `setsid` child outlived its
    /// command). Each such process descends from `pid` and was made after it; a process it
    /// forked before being moved is found on the next pass, until a pass finds none: a fork
    /// bomb's processes left outside would fork on with no cap, in the agent's cgroup (there
    /// were four passes, whatever they found). One whose parent already exited (reparented to
    /// the agent) is not told apart from the agent's own and stays.
    fn gather(&self, pid: u32) {
        let me = std::process::id();
        for _ in 0..GATHER_PASSES {
            let Ok(list) = fs::read_to_string(AGENT_CGROUP_PROCS) else {
                return;
            };
            let strays: Vec<u32> = list
                .lines()
                .filter_map(|l| l.parse::<u32>().ok())
                .filter(|p| *p > pid && *p != me && descends_from(*p, pid))
                .collect();
            if strays.is_empty() {
                return;
            }
            for p in strays {
                let _ = nix::unistd::write(&self.procs, p.to_string().as_bytes());
            }
        }
    }

    fn kill(&self) {
        let _ = fs::write(self.path.join("cgroup.kill"), b"1");
    }

    /// Waits, at most `limit`, until no process is left in the cgroup, so that a command
    /// reported as killed has nothing left running (killed processes die as they are
    /// scheduled, which in a busy guest takes a while).
    fn wait_empty(&self, limit: Duration) {
        let until = Instant::now() + limit;
        let events = self.path.join("cgroup.events");
        while Instant::now() < until {
            match fs::read_to_string(&events) {
                Ok(s) if s.lines().any(|l| l == "populated 0") => return,
                Ok(_) => std::thread::sleep(Duration::from_millis(10)),
                Err(_) => return,
            }
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Fails while processes the command left behind still live; they keep the cgroup.
        let _ = fs::remove_dir(&self.path);
    }
}

/// At most this many passes of [`Cgroup::gather`] (each moves every stray it sees, and what a
/// moved process forks is born in the command's cgroup, so the strays only shrink).
const GATHER_PASSES: usize = 64;

/// The processes of the agent's own cgroup (the root: the agent never leaves it), where a
/// command's child starts before it joins the command's.
const AGENT_CGROUP_PROCS: &str = "/sys/fs/cgroup/cgroup.procs";

/// The parent of process `p`, from `/proc/P/stat` (its fourth field, after the name in
/// parentheses, which may hold anything).
fn parent_of(p: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Whether process `p` descends from `pid`: its chain of parents reaches `pid` through
/// processes made after it (pids grow until they wrap, which is far off in a sandbox).
fn descends_from(p: u32, pid: u32) -> bool {
    let mut at = p;
    for _ in 0..64 {
        match parent_of(at) {
            Some(pp) if pp == pid => return true,
            Some(pp) if pp > pid => at = pp,
            _ => return false,
        }
    }
    false
}

fn build_command(spec: &ExecSpec) -> Result<Command, std::io::Error> {
    let mut cmd = match &spec.program {
        Program::Argv(argv) => {
            let Some((first, rest)) = argv.split_first() else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "empty command",
                ));
            };
            let mut c = Command::new(first);
            c.args(rest);
            c
        }
        Program::Shell(s) => {
            let mut c = Command::new("/bin/sh");
            c.arg("-c").arg(s);
            c
        }
    };
    let user = spec.user.as_deref().map(resolve_user).transpose()?;
    let cwd = spec.cwd.clone().unwrap_or_else(|| match &user {
        Some(u) if u.uid != 0 => u
            .home
            .clone()
            .filter(|h| Path::new(h).is_dir())
            .unwrap_or_else(|| "/".into()),
        _ => "/root".into(),
    });
    if !fs::metadata(&cwd).map(|m| m.is_dir()).unwrap_or(false) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("working directory {cwd} does not exist in the guest"),
        ));
    }
    cmd.current_dir(cwd).env_clear();
    cmd.envs(BASE_ENV.iter().copied());
    if let Some(u) = &user {
        // As root, std drops the supplementary groups before it changes the ids.
        cmd.uid(u.uid).gid(u.gid);
        if let Some(name) = &u.name {
            cmd.env("USER", name).env("LOGNAME", name);
        }
        cmd.env("HOME", u.home.as_deref().unwrap_or("/"));
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd.stdin(if spec.stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    // On a terminal the command leads a session of its own instead (see `on_terminal`).
    if spec.tty.is_none() {
        cmd.process_group(0);
    }
    Ok(cmd)
}

/// A user to run a command as.
#[derive(Debug, PartialEq, Eq)]
struct User {
    uid: u32,
    gid: u32,
    name: Option<String>,
    home: Option<String>,
}

/// `NAME`, `UID`, `NAME:GROUP` or `UID:GID` (an OCI image's `User`), from `/etc/passwd` and
/// `/etc/group`; a bare number need not be in them (its group is then 0, as docker has it).
fn resolve_user(spec: &str) -> std::io::Result<User> {
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = fs::read_to_string("/etc/group").unwrap_or_default();
    parse_user(spec, &passwd, &group)
}

fn parse_user(spec: &str, passwd: &str, group: &str) -> std::io::Result<User> {
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::NotFound, what);
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    // name:password:uid:gid:gecos:home:shell
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 6 && (f[0] == u || (u.parse::<u32>().is_ok() && f[2] == u)));
    let mut user = match (&entry, u.parse::<u32>()) {
        (Some(f), _) => User {
            uid: f[2]
                .parse()
                .map_err(|_| bad(format!("user {u}: bad uid in /etc/passwd")))?,
            gid: f[3]
                .parse()
                .map_err(|_| bad(format!("user {u}: bad gid in /etc/passwd")))?,
            name: Some(f[0].to_string()),
            home: Some(f[5].to_string()).filter(|h| !h.is_empty()),
        },
        (None, Ok(uid)) => User {
            uid,
            gid: 0,
            name: None,
            home: None,
        },
        (None, Err(_)) => return Err(bad(format!("user {u:?} is not in the guest's /etc/passwd"))),
    };
    if let Some(g) = g {
        user.gid = match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| bad(format!("group {g:?} is not in the guest's /etc/group")))?,
        };
    }
    Ok(user)
}

fn winsize(size: WinSize) -> nix::pty::Winsize {
    nix::pty::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

fn set_size(master: &OwnedFd, size: WinSize) -> std::io::Result<()> {
    let ws = winsize(size);
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which lives across the call;
    // the descriptor is a terminal's controlling side this process owns.
    let r = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Puts `cmd` on a new pseudo-terminal of `size`: its standard streams are the terminal and it
/// leads a session whose controlling terminal it is (so Ctrl-C typed into it is a SIGINT to
/// its foreground processes). Returns the controlling side.
fn on_terminal(cmd: &mut Command, size: WinSize) -> std::io::Result<OwnedFd> {
    let pty = nix::pty::openpty(Some(&winsize(size)), None).map_err(std::io::Error::from)?;
    cmd.stdin(Stdio::from(pty.slave.try_clone()?));
    cmd.stdout(Stdio::from(pty.slave.try_clone()?));
    cmd.stderr(Stdio::from(pty.slave));
    // SAFETY: between fork and exec the hook makes only async-signal-safe system calls
    // (setsid, ioctl) and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(pty.master)
}

fn describe(spec: &ExecSpec) -> String {
    match &spec.program {
        Program::Argv(a) => a.first().cloned().unwrap_or_default(),
        Program::Shell(_) => "/bin/sh".into(),
    }
}

fn run(inner: &Arc<Inner>, id: u32, spec: ExecSpec, stdin_rx: Option<StdinRx>) {
    let start = Instant::now();
    let out = &inner.out;
    let mut cmd = match build_command(&spec) {
        Ok(c) => c,
        Err(e) => return out.error(id, &e),
    };
    let master = match spec.tty.map(|size| on_terminal(&mut cmd, size)).transpose() {
        Ok(m) => m.map(Arc::new),
        Err(e) => return out.error(id, &e),
    };
    let cgroup = Cgroup::create(inner, id);
    let (status_tx, status_rx) = sync_channel::<WaitStatus>(1);
    let child = {
        let mut children = lock(&inner.children);
        let child = cmd.spawn();
        if let Ok(c) = &child {
            children.insert(c.id() as i32, status_tx);
            inner.spawned.notify_all();
        }
        child
    };
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let e = std::io::Error::new(e.kind(), format!("cannot run {}: {e}", describe(&spec)));
            return out.error(id, &e);
        }
    };
    // The terminal's other side lives on only in the child (its end of file is the child's).
    drop(cmd);
    let pid = child.id();
    // Joined from here rather than in the child before exec: without a pre-exec hook std
    // spawns with posix_spawn (vfork), which under emulation is far cheaper than fork (a hook
    // doubled an exec's round trip here). What the child started before it joined is gathered
    // after it.
    if let Some(cg) = &cgroup {
        let _ = nix::unistd::write(&cg.procs, pid.to_string().as_bytes());
        cg.gather(pid);
    }
    out.send(&AgentMsg::Started { id, pid });

    let finished = Arc::new(Mutex::new(false));
    let (eof_tx, eof_rx) = channel::<()>();
    // Closed once the command has exited and the grace for processes it left behind is over:
    // each reader then takes what is still in its pipe and stops. Output is lost to a slow
    // reader only if it was written after that (never what the command wrote before exiting:
    // under emulation on a busy host a reader may not run for seconds).
    let (drain_rx, drain_tx) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok((r, w)) => (Some(Arc::new(r)), Some(w)),
        Err(e) => {
            eprintln!("forkbox-agent: no drain signal for command {id}: {e}");
            (None, None)
        }
    };
    let streams = match &master {
        // A terminal's output, both streams in one, comes as stdout.
        Some(m) => [(true, m.try_clone().ok()), (false, None)],
        None => [
            (true, child.stdout.take().map(OwnedFd::from)),
            (false, child.stderr.take().map(OwnedFd::from)),
        ],
    };
    let readers = streams.iter().filter(|(_, s)| s.is_some()).count();
    for (is_out, stream) in streams {
        let Some(fd) = stream else { continue };
        let (out, finished, eof_tx) = (out.clone(), finished.clone(), eof_tx.clone());
        let drain = drain_rx.clone();
        if let Err(e) = spawn_small(move || {
            pump(fs::File::from(fd), drain.as_deref(), |data| {
                let done = lock(&finished);
                if *done {
                    return false;
                }
                out.send(&if is_out {
                    AgentMsg::Stdout { id, data }
                } else {
                    AgentMsg::Stderr { id, data }
                });
                true
            });
            let _ = eof_tx.send(());
        }) {
            eprintln!("forkbox-agent: cannot start a thread for command {id}: {e}");
        }
    }
    drop(drain_rx);
    drop(eof_tx);
    let writer: Option<fs::File> = match &master {
        Some(m) => m.try_clone().ok().map(fs::File::from),
        None => child.stdin.take().map(|w| fs::File::from(OwnedFd::from(w))),
    };
    let on_tty = master.is_some();
    if let (Some(mut w), Some(rx)) = (writer, stdin_rx) {
        if let Err(e) = spawn_small(move || {
            while let Ok(Some(data)) = rx.recv() {
                if w.write_all(&data).is_err() {
                    return;
                }
            }
            // Closing a terminal's input is typing its end-of-file character.
            if on_tty {
                let _ = w.write_all(b"\x04");
            }
        }) {
            eprintln!("forkbox-agent: cannot start a thread for command {id}: {e}");
        }
    }
    if let Some(r) = lock(&inner.running).get_mut(&id) {
        r.pgid = Some(Pid::from_raw(pid as i32));
        r.tty = master.clone();
        if let (Some(m), Some(size)) = (&r.tty, r.pending_size.take()) {
            let _ = set_size(m, size);
        }
        if let Some(sig) = r.pending_signal.take() {
            let _ = killpg(Pid::from_raw(pid as i32), sig);
        }
    }

    let (status, timed_out) = wait_for_exit(&status_rx, spec.timeout_ms, start, || {
        if let Some(cg) = &cgroup {
            cg.kill();
        }
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
    });
    if let (true, Some(cg)) = (timed_out, &cgroup) {
        cg.wait_empty(KILLED_GONE);
    }
    // Let the output readers reach the end of their streams; processes the command left
    // running may hold its pipes open for as long as they live, so after a grace the readers
    // are told to take what is in their pipes and stop (which they do however late they run).
    let mut open = readers;
    let grace_until = Instant::now() + DRAIN_AFTER_EXIT;
    while open > 0 {
        match eof_rx.recv_timeout(grace_until.saturating_duration_since(Instant::now())) {
            Ok(()) => open -= 1,
            Err(_) => break,
        }
    }
    drop(drain_tx);
    let stuck_until = Instant::now() + READER_STUCK;
    while open > 0 {
        match eof_rx.recv_timeout(stuck_until.saturating_duration_since(Instant::now())) {
            Ok(()) => open -= 1,
            Err(_) => break,
        }
    }
    let mut done = lock(&finished);
    *done = true;
    out.send(&AgentMsg::Exited {
        id,
        status,
        timed_out,
        duration_ms: start.elapsed().as_millis() as u64,
    });
    drop(done);
    drop(cgroup);
}

const PIPE_SIZE: i32 = 1 << 20;
/// How long a timed-out command's report waits for the processes it started to be gone.
const KILLED_GONE: Duration = Duration::from_secs(5);
/// How long a reader waits for more output after the first bytes, so that a command printing
/// many short lines produces one message per burst instead of one per line.
/// Under emulation a pipe wake-up costs ~300 µs, so one message per line would make a command
/// that prints many short lines several times slower than it is. The first read of a burst goes
/// out at once (a short output is not delayed); reads that follow within `BURST` wait.
const COALESCE: Duration = Duration::from_millis(5);
const BURST: Duration = Duration::from_millis(20);

/// Passes what `stream` gives to `emit` (until it returns false) up to the stream's end, or,
/// once `drain` is signalled, up to what is left in it (at most a full pipe and a chunk more).
fn pump(mut stream: fs::File, drain: Option<&OwnedFd>, mut emit: impl FnMut(Vec<u8>) -> bool) {
    // A larger pipe lets a fast writer run ahead while a chunk is on its way (a terminal
    // refuses, harmlessly).
    let _ = nix::fcntl::fcntl(
        stream.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE),
    );
    let mut buf = vec![0u8; CHUNK];
    let mut last = None;
    // Once draining: how much more to take, so that a process left behind writing without
    // end cannot hold the exit back.
    let mut left: Option<usize> = None;
    loop {
        match wait_readable(&stream, drain, left.is_some()) {
            Readable::Data => {}
            Readable::Drain => {
                left = Some(PIPE_SIZE as usize + CHUNK);
                continue;
            }
            Readable::Empty => return,
        }
        let n = match read_coalesced(&mut stream, &mut buf, &mut last) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !emit(buf[..n].to_vec()) {
            return;
        }
        if let Some(l) = &mut left {
            *l = l.saturating_sub(n);
            if *l == 0 {
                return;
            }
        }
    }
}

enum Readable {
    /// There is something to read (or the end of the stream).
    Data,
    /// The command has exited: drain what is in the pipe.
    Drain,
    /// Draining, and the pipe is empty.
    Empty,
}

/// Waits until `stream` has something to read or the drain signal comes (its write end is
/// closed); when already draining, does not wait at all.
fn wait_readable(stream: &fs::File, drain: Option<&OwnedFd>, draining: bool) -> Readable {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ready = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
    loop {
        let mut fds = vec![PollFd::new(stream.as_fd(), PollFlags::POLLIN)];
        if let (Some(d), false) = (drain, draining) {
            fds.push(PollFd::new(d.as_fd(), PollFlags::POLLIN));
        }
        let timeout = if draining {
            PollTimeout::ZERO
        } else {
            PollTimeout::NONE
        };
        match poll(&mut fds, timeout) {
            Err(nix::errno::Errno::EINTR) => continue,
            // Polling failed: a read finds out what is wrong.
            Err(_) => return Readable::Data,
            Ok(_) => {}
        }
        // The drain signal first: a stream that never runs dry (a process left behind that
        // writes without end) would otherwise hide it for ever.
        if !draining
            && fds
                .get(1)
                .and_then(|f| f.revents())
                .is_some_and(|r| r.intersects(ready))
        {
            return Readable::Drain;
        }
        if fds[0].revents().is_some_and(|r| r.intersects(ready)) {
            return Readable::Data;
        }
        if draining {
            return Readable::Empty;
        }
    }
}

/// Reads what is there; inside a burst, waits `COALESCE` and takes what arrived meanwhile
/// (without blocking).
fn read_coalesced(
    f: &mut fs::File,
    buf: &mut [u8],
    last: &mut Option<Instant>,
) -> std::io::Result<usize> {
    let mut filled = f.read(buf)?;
    let in_burst = last.is_some_and(|t| t.elapsed() < BURST);
    *last = Some(Instant::now());
    if filled == 0 || filled == buf.len() || !in_burst {
        return Ok(filled);
    }
    std::thread::sleep(COALESCE);
    while filled < buf.len() {
        let mut fds = [nix::poll::PollFd::new(
            f.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO) {
            Ok(1)
                if fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(nix::poll::PollFlags::POLLIN)) => {}
            _ => break,
        }
        match f.read(&mut buf[filled..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => filled += n,
        }
    }
    Ok(filled)
}

fn wait_for_exit(
    rx: &Receiver<WaitStatus>,
    timeout_ms: Option<u64>,
    start: Instant,
    kill: impl FnOnce(),
) -> (ExitStatus, bool) {
    let mut timed_out = false;
    let ws = match timeout_ms {
        None => rx.recv().ok(),
        Some(ms) => {
            let deadline = start + Duration::from_millis(ms);
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(ws) => Some(ws),
                Err(RecvTimeoutError::Timeout) => {
                    timed_out = true;
                    kill();
                    rx.recv().ok()
                }
                Err(RecvTimeoutError::Disconnected) => None,
            }
        }
    };
    let status = match ws {
        Some(WaitStatus::Exited(_, code)) => ExitStatus::Code(code),
        Some(WaitStatus::Signaled(_, sig, _)) => ExitStatus::Signal(sig as i32),
        _ => ExitStatus::Code(-1),
    };
    (status, timed_out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod pump_tests {
    use super::*;

    fn pipe() -> (fs::File, fs::File) {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        (fs::File::from(r), fs::File::from(w))
    }

    /// A reader that runs only after the command exited and the grace is over (a starved guest)
    /// still passes on everything the command wrote, though a process left behind keeps the
    /// pipe open.
    #[test]
    fn a_late_reader_keeps_what_was_written_before_the_exit() {
        let (r, mut w) = pipe();
        w.write_all(b"file\n").unwrap();
        let (drain_r, drain_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        drop(drain_w);
        let mut got = Vec::new();
        pump(r, Some(&drain_r), |d| {
            got.extend(d);
            true
        });
        assert_eq!(got, b"file\n");
        drop(w);
    }

    /// A process left behind that writes without end cannot keep a drained reader going.
    #[test]
    fn a_drained_reader_stops_though_a_writer_goes_on() {
        let (r, mut w) = pipe();
        let (started_tx, started_rx) = channel();
        let writer = std::thread::spawn(move || {
            let chunk = vec![b'y'; 4096];
            let _ = w.write_all(&chunk);
            let _ = started_tx.send(());
            while w.write_all(&chunk).is_ok() {}
        });
        started_rx.recv().unwrap();
        let (drain_r, drain_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        drop(drain_w);
        let mut got = 0usize;
        pump(r, Some(&drain_r), |d| {
            got += d.len();
            true
        });
        assert!(got > 0 && got <= 2 * (PIPE_SIZE as usize + CHUNK), "{got}");
        writer.join().unwrap();
    }

    /// Until the drain signal, a reader waits for more, and it reads to the end of the stream.
    #[test]
    fn a_reader_takes_everything_up_to_the_end() {
        let (r, mut w) = pipe();
        let writer = std::thread::spawn(move || {
            for i in 0..50 {
                writeln!(w, "line {i}").unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let (drain_r, _drain_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let mut got = Vec::new();
        pump(r, Some(&drain_r), |d| {
            got.extend(d);
            true
        });
        writer.join().unwrap();
        let want: String = (0..50).map(|i| format!("line {i}\n")).collect();
        assert_eq!(String::from_utf8(got).unwrap(), want);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod id_tests {
    use forkbox_protocol::{decode, FrameDecoder};

    use super::*;

    fn spec(argv: &[&str]) -> ExecSpec {
        ExecSpec {
            program: Program::Argv(argv.iter().map(|a| a.to_string()).collect()),
            cwd: Some("/".into()),
            env: vec![],
            timeout_ms: Some(20_000),
            stdin: true,
            tty: None,
            user: None,
        }
    }

    /// The next message for request `id`, others skipped.
    fn next_for(rx: &Receiver<Vec<u8>>, id: u32) -> AgentMsg {
        loop {
            let frame = rx.recv_timeout(Duration::from_secs(20)).unwrap();
            let mut dec = FrameDecoder::new();
            dec.push(&frame);
            while let Some(payload) = dec.next_frame().unwrap() {
                let msg: AgentMsg = decode(&payload).unwrap();
                if msg.id() == id {
                    return msg;
                }
            }
        }
    }

    /// A request id still running (a command from an earlier connection, in a guest restored
    /// from a snapshot) is refused to a new command, which would otherwise take its input and
    /// signals; and once it ends, the id is free again.
    #[test]
    fn a_running_request_id_is_not_taken_over() {
        let (tx, rx) = sync_channel(64);
        let execs = Execs::start(crate::serve::Outbox::new(tx));
        execs.spawn(7, spec(&["cat"]));
        assert!(matches!(next_for(&rx, 7), AgentMsg::Started { .. }));
        execs.spawn(7, spec(&["true"]));
        match next_for(&rx, 7) {
            AgentMsg::Error { message, .. } => assert!(message.contains("taken"), "{message}"),
            other => panic!("a second command took id 7: {other:?}"),
        }
        // The first still has its input: what it is sent comes back, and closing it ends it.
        execs.stdin(7, Some(b"still mine\n".to_vec()));
        match next_for(&rx, 7) {
            AgentMsg::Stdout { data, .. } => assert_eq!(data, b"still mine\n"),
            other => panic!("{other:?}"),
        }
        execs.stdin(7, None);
        assert!(matches!(next_for(&rx, 7), AgentMsg::Exited { .. }));
        // Its entry goes with it (a moment after its end is sent), and the id is free.
        let freed = Instant::now();
        while lock(&execs.0.running).contains_key(&7) {
            assert!(freed.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(10));
        }
        execs.spawn(7, spec(&["true"]));
        assert!(matches!(next_for(&rx, 7), AgentMsg::Started { .. }));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod user_tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nnode:x:1000:1000::/home/node:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:\n";

    #[test]
    fn users_resolve_as_an_image_config_names_them() {
        let u = parse_user("node", PASSWD, GROUP).unwrap();
        assert_eq!(
            (u.uid, u.gid, u.home.as_deref()),
            (1000, 1000, Some("/home/node"))
        );
        let u = parse_user("1000:staff", PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid, u.name.as_deref()), (1000, 50, Some("node")));
        let u = parse_user("4242:7", PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid, u.name), (4242, 7, None));
        assert!(parse_user("nobody-here", PASSWD, GROUP).is_err());
        assert!(parse_user("node:wheel", PASSWD, GROUP).is_err());
    }
}
