//! The four holes found by trying forkbox as an attacker, reproduced from inside real guests,
//! and the protocol violations around them.

use std::time::{Duration, Instant};

use forkbox_protocol::{encode_frame, AgentMsg};
use forkbox_test_infra as infra;

use crate::{put, text, Daemon};

/// Guest root takes the agent's own descriptor of its host port (from PID 1, the agent, with
/// `pidfd_getfd`) and writes the frames in FILE into it, one `write` per frame (each frame
/// under 32 KiB, so the port carries it whole between the agent's own frames). Prints how many
/// frames it wrote.
const INJECT: &str = r#"
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = next(int(n) for n in os.listdir('/proc/1/fd')
          if os.readlink('/proc/1/fd/' + n).startswith('/dev/vport'))
pidfd = os.pidfd_open(1)
port = libc.syscall(438, pidfd, fd, 0)
if port < 0:
    raise OSError(ctypes.get_errno(), 'pidfd_getfd')
data = open(sys.argv[1], 'rb').read()
i = n = 0
while i < len(data):
    size = struct.unpack('<I', data[i:i + 4])[0]
    frame = data[i:i + 4 + size]
    assert os.write(port, frame) == len(frame)
    i += 4 + size
    n += 1
print(n)
"#;

/// Frames of `msgs`, each as the agent would send it.
fn frames(msgs: impl IntoIterator<Item = AgentMsg>) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        let f = encode_frame(&m).unwrap();
        assert!(f.len() <= 32 * 1024, "a frame of {} bytes", f.len());
        out.extend_from_slice(&f);
    }
    out
}

/// Writes `bytes` into the agent's port of sandbox `id` as guest root; how many frames.
fn inject(d: &Daemon, id: &str, bytes: &[u8]) -> u64 {
    let file = put(d, id, "frames.bin", bytes);
    let script = put(d, id, "inject.py", INJECT.as_bytes());
    // Silent while it writes: nothing of its own (stdout) competes for the port.
    let out = d.sh(
        id,
        &format!(
            "python3 {} {} > /root/attack/out 2>&1; cat /root/attack/out",
            script.display(),
            file.display()
        ),
    );
    let n = text(&out.stdout).trim().parse().unwrap_or(0);
    assert!(
        n > 0,
        "injection failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    n
}

fn exec_answers(d: &Daemon, id: &str) -> bool {
    let out = d.sh(id, "echo alive");
    text(&out.stdout) == "alive\n"
}

/// Hole 1, by guest root: `TunnelOpen` frames with 30 kB host names, written into the agent's
/// port with the network off. Promise: a guest-caused log line is cut, escaped and
/// rate-limited, so the log grows by kilobytes, not by what the guest sent.
#[test]
fn guest_root_flooding_tunnel_opens_with_huge_names_cannot_fill_the_log() {
    let d = Daemon::start("log-flood-root");
    let id = d.create(&[]);
    let before = d.log_bytes();
    let name = "a".repeat(30_000);
    let n = 600;
    let bytes = frames((0..n).map(|i| AgentMsg::TunnelOpen {
        tunnel: 1_000_000 + i,
        host: name.clone(),
        port: 443,
    }));
    let t = Instant::now();
    assert_eq!(inject(&d, &id, &bytes), n as u64);
    let grown = d.log_bytes() - before;
    println!(
        "FIGURE log flood by guest root: {} frames, {} MB sent in {:.1} s, daemon.log grew {grown} bytes",
        n,
        bytes.len() >> 20,
        t.elapsed().as_secs_f64()
    );
    assert!(grown < 64 * 1024, "the log grew {grown} bytes");
    assert!(
        !d.log_text().contains(&"a".repeat(200)),
        "a whole name reached the log"
    );
    // Refusals are not violations: the sandbox still works.
    assert!(exec_answers(&d, &id));
    assert_eq!(d.view(&id)["state"], "running");
}

/// Hole 1, by an unprivileged guest user: `CONNECT <16,000 chars>:443` to the guest's proxy,
/// over and over, in a sandbox with an allow list. Promise: as above.
#[test]
fn an_unprivileged_user_flooding_the_proxy_cannot_fill_the_log() {
    let d = Daemon::start("log-flood-user");
    let id = d.create(&["--allow", "pypi.org"]);
    let before = d.log_bytes();
    let code = r#"
import os, socket
os.setgid(65534); os.setuid(65534)
req = b'CONNECT ' + b'x' * 16000 + b':443 HTTP/1.1\r\n\r\n'
n = 0
for i in range(1000):
    s = socket.create_connection(('127.0.0.1', 3128))
    s.sendall(req)
    s.recv(1024)
    s.close()
    n += 1
print(n, os.getuid())
"#;
    let t = Instant::now();
    let out = d.py(&id, code);
    assert_eq!(out.trim(), "1000 65534", "{out}");
    let grown = d.log_bytes() - before;
    println!(
        "FIGURE log flood by an unprivileged guest user: 1000 CONNECTs of 16 kB in {:.1} s, daemon.log grew {grown} bytes",
        t.elapsed().as_secs_f64()
    );
    assert!(grown < 64 * 1024, "the log grew {grown} bytes");
}

/// Hole 1: a host name carrying newlines and a fake log line. Promise: guest text is escaped;
/// no line of the log starts where the guest wanted.
#[test]
fn guest_newlines_cannot_forge_daemon_log_lines() {
    let d = Daemon::start("log-forge");
    let id = d.create(&[]);
    let forged = "x\n2026-01-01T00:00:00Z  INFO forkbox: FORGED sandbox approved\n";
    inject(
        &d,
        &id,
        &frames([AgentMsg::TunnelOpen {
            tunnel: 77,
            host: forged.into(),
            port: 443,
        }]),
    );
    assert!(infra::wait_until(Duration::from_secs(10), || d
        .log_text()
        .contains("FORGED")));
    let log = d.log_text();
    assert!(
        !log.lines().any(|l| l.starts_with("2026-01-01")),
        "a forged line:\n{log}"
    );
    assert!(
        log.contains("\\n2026-01-01"),
        "escaped newline expected:\n{log}"
    );
}

/// Hole 2: forged `TunnelData` frames for a real tunnel whose remote never reads, far past
/// the flow-control window. Promise: the host buffers at most the window per tunnel; a guest
/// past it loses the tunnel, and the daemon's memory stays flat.
#[test]
fn forged_tunnel_data_to_a_remote_that_never_reads_cannot_grow_the_daemon() {
    let mut net = infra::TestNet::new();
    let remote = net.peer_ips[0].clone();
    net.tarpit(&remote, 9000);
    let d = Daemon::start("tunnel-memory");
    let id = d.create(&["--allow", &format!("{remote}:9000")]);
    // A real tunnel through the proxy, kept open by a process in the guest.
    d.ok(
        &id,
        &format!(
            "setsid python3 -c \"
import socket, time
s = socket.create_connection(('127.0.0.1', 3128))
s.sendall(b'CONNECT {remote}:9000 HTTP/1.1\\r\\n\\r\\n')
print(s.recv(100), flush=True)
time.sleep(600)
\" > /root/tunnel.out 2>&1 < /dev/null & sleep 3; cat /root/tunnel.out"
        ),
    );
    let before = d.rss_kib();
    // 80 MB of data on the real tunnel (the agent numbers its tunnels from 1), in 30 kB frames.
    let chunk = vec![0x5au8; 30_000];
    let n = 2700;
    let bytes = frames((0..n).map(|_| AgentMsg::TunnelData {
        tunnel: 1,
        data: chunk.clone(),
    }));
    let t = Instant::now();
    inject(&d, &id, &bytes);
    std::thread::sleep(Duration::from_secs(2));
    let after = d.rss_kib();
    println!(
        "FIGURE forged tunnel data: {} MB in {:.1} s, daemon RSS {} -> {} MiB",
        bytes.len() >> 20,
        t.elapsed().as_secs_f64(),
        before >> 10,
        after >> 10
    );
    assert!(
        after < before + 48 * 1024,
        "the daemon grew from {before} to {after} KiB"
    );
    assert!(d.answers());
}

/// A server that sends every connection as much as it takes.
const FLOOD: &str = r#"
import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((REMOTE_ADDR, 9003))
s.listen(64)
def pour(c):
    b = b'x' * 65536
    try:
        while True:
            c.sendall(b)
    except OSError:
        pass
while True:
    c, _ = s.accept()
    threading.Thread(target=pour, args=(c,), daemon=True).start()
"#;

/// A flooding remote and a guest that opens eight tunnels to it and reads nothing, beside
/// one that reads 32 KiB a second (the guest's agent acknowledges what the program's socket
/// took, in steps of up to ~192 KiB: every few seconds here). Promise: the host reads from the remote only what the
/// guest's window has room for, so the daemon's memory stays flat; after
/// `FORKBOX_TUNNEL_READ_NOTHING_SECS` (20 here) it closes the eight and says why in the
/// sandbox's network log (`forkbox sandbox logs`); the slow reader keeps its connection.
#[test]
fn tunnels_whose_guest_reads_nothing_are_closed_in_words_and_a_slow_reader_is_not() {
    let mut net = infra::TestNet::new();
    let remote = net.peer_ips[0].clone();
    let flood = FLOOD.replace("REMOTE_ADDR", &format!("'{remote}'"));
    let log = std::env::temp_dir().join(format!("flood-{}.log", std::process::id()));
    net.run_server("python3", &["-c", &flood], &remote, 9003, &log);
    let paths = Daemon::home("read-nothing");
    let mut c = Daemon::cmd(&paths);
    c.env("FORKBOX_TUNNEL_READ_NOTHING_SECS", "20")
        .arg("serve")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let d = Daemon::spawn(paths, c);
    let id = d.create(&["--allow", &format!("{remote}:9003")]);
    let before = d.rss_kib();
    // Eight tunnels that read nothing, and one that reads 32 KiB a second, for 25 s. (A new
    // connection to a remote that speaks first and is never answered holds its turn for 10 s:
    // six open at once, then one per 10 s.)
    let out = d.ok(
        &id,
        &format!(
            "python3 -c \"
import socket, time
def tunnel():
    s = socket.create_connection(('127.0.0.1', 3128))
    s.sendall(b'CONNECT {remote}:9003 HTTP/1.1\\r\\n\\r\\n')
    head = b''
    while not head.endswith(b'\\r\\n\\r\\n'):
        head += s.recv(1)
    return s
idle = [tunnel() for i in range(8)]
slow = tunnel()
got = 0
for i in range(25):
    got += len(slow.recv(32768))
    time.sleep(1)
print('slow reader got', got, flush=True)
\""
        ),
    );
    let after = d.rss_kib();
    println!(
        "FIGURE eight tunnels reading nothing from a flood: daemon RSS {} -> {} MiB",
        before >> 10,
        after >> 10
    );
    assert!(out.contains("slow reader got"), "{out}");
    let got: u64 = out
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(got >= 20 * 32768, "{out}");
    assert!(
        after < before + 48 * 1024,
        "the daemon grew from {before} to {after} KiB"
    );
    let said = text(&d.cli(&["sandbox", "logs", &id]).stdout);
    let closed = said
        .matches("the guest read nothing of it for 20 s")
        .count();
    assert_eq!(closed, 8, "{closed} closed:\n{said}");
    assert!(d.answers());
}

/// Protocol violations past the limit: data past the window on many tunnels. Promise: the
/// host stops talking to that guest, the sandbox is listed `failed` with the reason, a
/// command is refused at once in words, and `rm` still removes it with its cgroups.
#[test]
fn a_guest_that_keeps_breaking_the_window_is_cut_off_and_marked_failed() {
    let mut net = infra::TestNet::new();
    let remote = net.peer_ips[0].clone();
    net.tarpit(&remote, 9001);
    let d = Daemon::start("violations");
    let id = d.create(&["--allow", &format!("{remote}:9001")]);
    // Twelve real tunnels, each then sent more than its window.
    let opened = d.ok(
        &id,
        &format!(
            "setsid python3 -c \"
import socket, time
keep = []
for i in range(12):
    s = socket.create_connection(('127.0.0.1', 3128))
    s.sendall(b'CONNECT {remote}:9001 HTTP/1.1\\r\\n\\r\\n')
    s.recv(100)
    keep.append(s)
print('open', flush=True)
time.sleep(600)
\" > /root/tunnels.out 2>&1 < /dev/null &
for i in $(seq 60); do grep -q open /root/tunnels.out && break; sleep 1; done; cat /root/tunnels.out"
        ),
    );
    // (New connections take turns, six at a time, each until its first round trip or 10 s:
    // to a remote that never speaks, the last six open about 10 s after the first.)
    assert!(
        opened.contains("open"),
        "the twelve tunnels did not open: {opened}"
    );
    let chunk = vec![1u8; 30_000];
    let bytes = frames((1..=12u32).flat_map(|t| {
        let c = chunk.clone();
        (0..60).map(move |_| AgentMsg::TunnelData {
            tunnel: t,
            data: c.clone(),
        })
    }));
    // The injecting command's own exit may not reach the host any more: do not insist on it.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inject(&d, &id, &bytes)));
    assert!(
        infra::wait_until(Duration::from_secs(30), || d.view(&id)["state"] == "failed"),
        "{}",
        d.view(&id)
    );
    let v = d.view(&id);
    assert!(
        v["failure"].as_str().unwrap().contains("tunnel protocol"),
        "{v}"
    );
    let t = Instant::now();
    let out = d.sh(&id, "true");
    assert!(!out.status.success());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the refusal took {:?}",
        t.elapsed()
    );
    assert!(
        text(&out.stderr).contains("failed"),
        "{}",
        text(&out.stderr)
    );
    let qemu = d.qemu_of(&id);
    let cgroups = forkbox_engine::limits::of_process(qemu);
    let out = d.cli(&["sandbox", "rm", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(infra::wait_until(Duration::from_secs(10), || {
        !std::path::Path::new(&format!("/proc/{qemu}")).exists()
    }));
    for line in cgroups.lines().filter(|l| l.contains("forkbox/")) {
        let (ctrl, path) = line.split_once(':').unwrap().1.split_once(':').unwrap();
        let dir = format!("/sys/fs/cgroup/{}{path}", ctrl.split(',').next().unwrap());
        let dir = if ctrl.is_empty() {
            format!("/sys/fs/cgroup{path}")
        } else {
            dir
        };
        assert!(
            infra::wait_until(Duration::from_secs(5), || !std::path::Path::new(&dir)
                .exists()),
            "{dir} outlived the sandbox"
        );
    }
}

/// One malformed frame (a length past the limit). Promise: the sandbox is marked failed with
/// the reason and later calls fail at once, instead of hanging until the daemon restarts.
#[test]
fn a_malformed_frame_fails_the_sandbox_and_calls_do_not_hang() {
    let d = Daemon::start("bad-frame");
    let id = d.create(&[]);
    let other = d.create(&[]);
    let mut garbage = u32::MAX.to_le_bytes().to_vec();
    garbage.extend_from_slice(b"garbage");
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        inject(&d, &id, &garbage);
    }));
    assert!(infra::wait_until(Duration::from_secs(20), || d.view(&id)
        ["state"]
        == "failed"));
    assert!(
        d.view(&id)["failure"]
            .as_str()
            .unwrap()
            .contains("bad frame"),
        "{}",
        d.view(&id)
    );
    let t = Instant::now();
    let out = d.sh(&id, "true");
    assert!(!out.status.success() && t.elapsed() < Duration::from_secs(5));
    // Its neighbour is untouched.
    assert!(exec_answers(&d, &other));
}

/// A flood of tunnel requests to a remote that accepts and never reads. Promise: at most
/// `MAX_TUNNELS` are open or waiting, `MAX_PENDING_OPENS` of them being opened at once; the
/// rest are refused, and the daemon's descriptors stay bounded.
#[test]
fn a_flood_of_tunnel_opens_is_capped_in_tunnels_and_descriptors() {
    let mut net = infra::TestNet::new();
    let remote = net.peer_ips[0].clone();
    net.tarpit(&remote, 9002);
    let d = Daemon::start("open-flood");
    let id = d.create(&["--allow", &format!("{remote}:9002")]);
    let fds_before = forkbox_engine::fds::of_process(d.pid()).len();
    let bytes = frames((0..2000u32).map(|i| AgentMsg::TunnelOpen {
        tunnel: 500_000 + i,
        host: remote.clone(),
        port: 9002,
    }));
    inject(&d, &id, &bytes);
    std::thread::sleep(Duration::from_secs(3));
    let fds = forkbox_engine::fds::of_process(d.pid()).len();
    println!("FIGURE tunnel-open flood: 2000 requests, daemon descriptors {fds_before} -> {fds}");
    assert!(
        fds <= fds_before + forkbox_engine::net::MAX_TUNNELS + 16,
        "{fds_before} -> {fds} descriptors"
    );
    assert!(d.answers());
}

/// Hole 3: a daemon started with extra descriptors open (`exec 7</`). Promise: neither the
/// daemon nor any QEMU holds what whoever started it left open.
#[test]
fn no_qemu_holds_a_descriptor_inherited_by_the_daemon() {
    let paths = Daemon::home("inherited-fds");
    let mut c = std::process::Command::new("bash");
    c.arg("-c")
        .arg(format!(
            "exec 7</ 8</etc 9</tmp; exec {} serve",
            env!("CARGO_BIN_EXE_forkbox")
        ))
        .env("FORKBOX_HOME", paths.home())
        .env("FORKBOX_POOL_SIZE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let d = Daemon::spawn(paths, c);
    let id = d.create(&[]);
    let qemu = d.qemu_of(&id);
    let leaked = |pid: u32| {
        forkbox_engine::fds::of_process(pid)
            .into_iter()
            .filter(|(_, t)| ["/", "/etc", "/tmp"].contains(&t.to_str().unwrap_or("")))
            .collect::<Vec<_>>()
    };
    let held = forkbox_engine::fds::of_process(qemu);
    println!(
        "FIGURE descriptors: QEMU holds {} above stderr: {:?}",
        held.len(),
        held.iter()
            .map(|(_, t)| t.display().to_string())
            .collect::<Vec<_>>()
    );
    assert_eq!(leaked(qemu), vec![], "QEMU holds the host's directories");
    assert_eq!(leaked(d.pid()), vec![], "the daemon kept what it inherited");
}

/// Hole 4: modes of what holds guest data. Promise: forkbox's home is its owner's alone, so
/// no other local user reads a disk, a RAM file, the state database or the logs.
#[test]
fn guest_data_is_unreadable_to_other_local_users() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start("file-modes");
    let id = d.create(&[]);
    d.ok(&id, "echo topsecret-4711 > /root/secret; sync");
    let out = d.cli(&["sandbox", "snapshot", &id, "--name", "modes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let home = d.paths.home();
    println!("FIGURE modes: home {:o}", mode(home));
    assert_eq!(mode(home) & 0o077, 0, "home is {:o}", mode(home));
    for f in ["state.db", "daemon.log"] {
        assert_eq!(
            mode(&home.join(f)) & 0o077,
            0,
            "{f} is {:o}",
            mode(&home.join(f))
        );
    }
    // What another local user meets: nothing under the home, whatever the files' own modes.
    let disk = d.paths.disks().join(&id);
    let snap = d.paths.snapshots().join("modes").join("mem");
    for target in [disk.as_path(), snap.as_path(), &home.join("state.db")] {
        let out = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "ls",
                "-la",
            ])
            .arg(target)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "user nobody listed {}: {}",
            target.display(),
            text(&out.stdout)
        );
    }
    // A home made loose is tightened by the next command, which says so.
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = d.cli(&["sandbox", "ls"]);
    assert!(
        text(&out.stderr).contains("was mode 0755"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(mode(home), 0o700);
    let _ = d.cli(&["snapshot", "rm", "modes"]);
}
