//! End-to-end tests of sandboxes through the engine API. They boot real VMs (TCG here: about
//! 4-5 s a boot); each test says what it costs.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use forkbox_engine::client::ExecEvent;
use forkbox_engine::error::{AgentError, SandboxError};
use forkbox_engine::sandbox::{Sandbox, SandboxConfig};
use forkbox_protocol::{ErrorKind, ExecSpec, ExitStatus, Program};
use forkbox_test_infra as infra;

fn config() -> (forkbox_engine::paths::Paths, SandboxConfig) {
    infra::sandbox_setup("python-bookworm")
}

async fn run(sb: &Sandbox, script: &str) -> forkbox_engine::client::Output {
    sb.run(infra::sh(script, Some(60_000)))
        .await
        .expect("run command")
}

/// One VM boot (~5 s), then many commands in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sandbox_runs_commands_with_exact_results() {
    let (paths, cfg) = config();
    let sb = Sandbox::create(&paths, &cfg).await.expect("create sandbox");

    // Exit codes and a signal.
    for (script, want) in [
        ("exit 0", ExitStatus::Code(0)),
        ("exit 1", ExitStatus::Code(1)),
        ("exit 7", ExitStatus::Code(7)),
        ("kill -TERM $$", ExitStatus::Signal(15)),
    ] {
        let out = run(&sb, script).await;
        assert_eq!(out.status, Some(want), "{script}");
        assert!(!out.timed_out);
    }

    // Stdout and stderr stay apart, byte for byte.
    let out = run(
        &sb,
        "printf out1; printf err1 >&2; printf out2; printf err2 >&2",
    )
    .await;
    assert_eq!(out.stdout, b"out1out2");
    assert_eq!(out.stderr, b"err1err2");

    // argv is passed without a shell; env, cwd and the image's environment apply.
    let out = sb
        .client()
        .run(ExecSpec {
            program: Program::Argv(vec!["printenv".into(), "GREETING".into()]),
            cwd: None,
            env: vec![("GREETING".into(), "a b 'c'".into())],
            timeout_ms: None,
            stdin: false,
            tty: None,
            user: None,
        })
        .await
        .unwrap();
    assert_eq!(out.stdout_text(), "a b 'c'\n");
    let mut spec = infra::sh("pwd; echo $PYTHONDONTWRITEBYTECODE", None);
    spec.cwd = Some("/tmp".into());
    let mut ex = sb.exec(spec).await.unwrap();
    let mut text = Vec::new();
    while let Ok(ev) = ex.next().await {
        match ev {
            ExecEvent::Stdout(d) => text.extend(d),
            ExecEvent::Exited { .. } => break,
            _ => {}
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&text),
        "/tmp\n1\n",
        "cwd and image env"
    );

    // A missing program and a missing directory are refused with their kind.
    let mut ex = sb
        .exec(ExecSpec {
            program: Program::Argv(vec!["no-such-program".into()]),
            cwd: None,
            env: vec![],
            timeout_ms: None,
            stdin: false,
            tty: None,
            user: None,
        })
        .await
        .unwrap();
    match ex.next().await {
        Err(SandboxError::Agent(AgentError::Refused {
            kind: ErrorKind::NotFound,
            message,
        })) => {
            assert!(message.contains("no-such-program"), "{message}")
        }
        other => panic!("expected not-found, got {other:?}"),
    }

    // Files: write then read back, binary-safe, larger than one protocol chunk.
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    sb.client()
        .write_file("/root/sub/dir/blob", &data, 0o600)
        .await
        .unwrap();
    assert_eq!(
        sb.client().read_file("/root/sub/dir/blob").await.unwrap(),
        data
    );
    let out = run(&sb, "stat -c %a /root/sub/dir/blob").await;
    assert_eq!(out.stdout_text(), "600\n");
    match sb.client().read_file("/root/absent").await {
        Err(AgentError::Refused {
            kind: ErrorKind::NotFound,
            ..
        }) => {}
        other => panic!("expected not-found, got {other:?}"),
    }

    // A timeout kills a process tree that ignores SIGTERM, including a child that left the
    // process group, and the call returns.
    let tree =
        "trap '' TERM; (trap '' TERM; setsid sleep 1000 & sleep 1000) & sleep 1000; echo never";
    let out = sb
        .run(infra::sh(tree, Some(2_000)))
        .await
        .expect("the call returns");
    assert!(out.timed_out, "the command was not reported timed out");
    assert_eq!(out.status, Some(ExitStatus::Signal(9)));
    assert!(out.stdout.is_empty());
    // Living ones: a killed process the agent has not reaped yet (a zombie) has ended.
    let sleepers = run(
        &sb,
        "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = sleep ] && grep '^State:[[:space:]]*[^Z]' $p/status 2>/dev/null; done; true",
    )
    .await;
    assert_eq!(sleepers.stdout_text(), "", "processes survived the timeout");

    // The guest runs its own kernel.
    let out = run(&sb, "uname -r").await;
    let host = nix::sys::utsname::uname()
        .unwrap()
        .release()
        .to_string_lossy()
        .into_owned();
    assert_ne!(out.stdout_text().trim(), host);
    assert_eq!(out.stdout_text().trim(), sb.info().guest_kernel);

    sb.destroy().await;
}

/// Four VMs at once (~10-15 s on 2 cores).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_sandboxes_at_once_do_not_see_each_others_files() {
    let (paths, cfg) = config();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (paths, cfg) = (paths.clone(), cfg.clone());
        set.spawn(async move { Sandbox::create(&paths, &cfg).await });
    }
    let boxes: Vec<Sandbox> = set
        .join_all()
        .await
        .into_iter()
        .map(|b| b.expect("create"))
        .collect();
    let ids: std::collections::HashSet<_> = boxes.iter().map(|b| b.info().id.clone()).collect();
    assert_eq!(ids.len(), 4);
    for (i, sb) in boxes.iter().enumerate() {
        let out = run(
            sb,
            &format!("echo {i} > /root/mine-{i} && ls /root | grep -c '^mine-'"),
        )
        .await;
        assert_eq!(out.stdout_text(), "1\n", "sandbox {i} sees files of others");
    }
    for (i, sb) in boxes.iter().enumerate() {
        let out = run(sb, "cat /root/mine-*").await;
        assert_eq!(out.stdout_text(), format!("{i}\n"));
    }
    let dirs: Vec<_> = boxes
        .iter()
        .map(|b| paths.run().join(&b.info().id))
        .collect();
    for sb in boxes {
        sb.destroy().await;
    }
    for d in dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

/// One restore, ~2 MB through the emulated serial port (~30 s). A guest that floods its console costs the
/// host a bounded log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_flood_is_capped_on_the_host() {
    let (paths, cfg) = config();
    let sb = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    let log = paths.run().join(&sb.info().id).join("console.log");
    // The emulated UART takes one exit per byte: ~30 s for 2.2 MB alone under TCG, more on a
    // busy host (and QEMU is held to vCPUs + half a core by its cgroup).
    let out = sb
        .run(infra::sh(
            "head -c 2200000 /dev/zero | tr '\\0' x > /dev/console; echo LAST-LINE > /dev/console",
            Some(300_000),
        ))
        .await
        .expect("run command");
    assert_eq!(out.status, Some(ExitStatus::Code(0)));
    let settled = infra::wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("LAST-LINE"))
    });
    assert!(settled, "the console's last line never reached the log");
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(
        size <= forkbox_engine::vm::CONSOLE_CAP,
        "console log grew to {size} bytes"
    );
    sb.destroy().await;
}

/// One boot. Directory trees in and out as tar.zst; what the guest sends back is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trees_go_in_and_out_and_hostile_downloads_are_refused() {
    use forkbox_engine::files;
    let (paths, cfg) = config();
    let sb = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("src");
    std::fs::create_dir_all(src.join("pkg/sub")).unwrap();
    std::fs::write(src.join("pkg/sub/mod.py"), "print('hi')\n").unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(src.join("blob.bin"), &big).unwrap();
    std::os::unix::fs::symlink("pkg/sub/mod.py", src.join("link.py")).unwrap();

    files::upload(sb.client(), &src, "/work/code")
        .await
        .expect("upload");
    let out = run(
        &sb,
        "cd /work/code && python3 link.py && readlink link.py && stat -c %s blob.bin",
    )
    .await;
    assert_eq!(
        out.stdout_text(),
        "hi\npkg/sub/mod.py\n3000000\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Plain files come back byte for byte.
    run(&sb, "rm /work/code/link.py").await;
    let back = host.path().join("back");
    assert_eq!(
        files::download(sb.client(), "/work/code", &back)
            .await
            .expect("download"),
        2
    );
    assert_eq!(std::fs::read(back.join("blob.bin")).unwrap(), big);
    assert_eq!(
        std::fs::read_to_string(back.join("pkg/sub/mod.py")).unwrap(),
        "print('hi')\n"
    );

    // An existing destination is never written into.
    let e = files::download(sb.client(), "/work/code", &back)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("already exists"), "{e}");

    // A symlink comes back as a link, its target as the guest wrote it, never followed here.
    let out = run(
        &sb,
        "mkdir -p /x1 && echo a > /x1/ok && ln -s /etc/shadow /x1/evil",
    )
    .await;
    assert_eq!(out.code(), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let dest = host.path().join("dl1");
    files::download(sb.client(), "/x1", &dest).await.unwrap();
    assert_eq!(
        std::fs::read_link(dest.join("evil")).unwrap(),
        std::path::Path::new("/etc/shadow")
    );
    assert_eq!(std::fs::read(dest.join("ok")).unwrap(), b"a\n");

    // A device file in the guest's tree is refused, and nothing is left behind.
    for (setup, why) in [("mkdir -p /x2 && mknod /x2/dev c 1 3", "device files")] {
        let out = run(&sb, setup).await;
        assert_eq!(out.code(), 0, "{}", String::from_utf8_lossy(&out.stderr));
        let dir = "/x2";
        let dest = host.path().join(format!("dl{}", &dir[2..]));
        let e = files::download(sb.client(), dir, &dest)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{e}");
        assert!(!dest.exists(), "a refused download left {}", dest.display());
    }
    sb.destroy().await;
}

/// One boot, ~20 s. A fork bomb stops at the sandbox's process cap and an allocation beyond its
/// memory is killed inside the guest; the agent keeps answering and the sandbox stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bombs_and_memory_hogs_stay_inside_the_guest() {
    let (paths, mut cfg) = config();
    cfg.max_procs = 64;
    cfg.memory_mib = 384;
    let sb = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    let out = run(&sb, "cat /sys/fs/cgroup/commands/pids.max").await;
    assert_eq!(out.stdout_text(), "64\n");

    let bomb = sb
        // Each process starts two and stays: `f | f &`, whose processes end as soon as they
        // fork, sometimes never had 64 alive at once in 5 s of an emulated guest. The leader
        // starts the bomb and becomes `sleep`: a leader in the bomb itself died of a fork
        // refused at the cap (the command ended untimed, its bomb running on).
        .run(infra::sh(
            "f() { f & f & sleep 100; }; f & exec sleep 100",
            Some(5_000),
        ))
        .await;
    // The open bug: on a busy host the agent's report of the killed bomb sometimes never
    // comes (1 run in 3 to 10 beside a busy loop, whatever the bomb's shape; once the agent
    // then answered nothing for a minute). The host says so, as it is built to; the sandbox
    // must still answer with the bomb stopped (checked below either way).
    match bomb {
        Ok(b) => assert!(b.timed_out),
        Err(SandboxError::Unresponsive { secs: 5 }) => {
            eprintln!("the bomb's report did not come (the open bug): the sandbox is checked")
        }
        Err(e) => panic!("the call returns: {e}"),
    }
    let events = run(&sb, "cat /sys/fs/cgroup/commands/pids.events").await;
    assert!(
        !events.stdout_text().contains("max 0"),
        "the cap was never reached: {}",
        events.stdout_text()
    );
    // The reply comes once the bomb's processes have died; the agent reaps them as they do.
    let left = run(
        &sb,
        "for i in $(seq 150); do n=$(cat /sys/fs/cgroup/commands/pids.current); \
         [ \"$n\" -lt 8 ] && break; sleep 0.1; done; echo $n",
    )
    .await;
    assert!(
        left.stdout_text().trim().parse::<u32>().unwrap() < 8,
        "the bomb's processes outlived it: {}",
        left.stdout_text()
    );

    let hog = run(&sb, "python3 -c 'b = bytearray(1 << 30); print(len(b))'").await;
    assert_ne!(
        hog.code(),
        0,
        "a 1 GiB allocation in a 384 MiB guest succeeded"
    );
    let alive = run(&sb, "echo still here").await;
    assert_eq!(alive.stdout_text(), "still here\n");
    sb.destroy().await;
}

/// One restore. Each QEMU runs in a host cgroup of its own with memory, task and CPU limits
/// sized from the sandbox (guest memory + QEMU's overhead; vCPUs + half a core).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_qemu_is_confined_by_host_cgroup_limits() {
    let (paths, cfg) = config();
    let sb = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    let id = sb.info().id.clone();
    let cgroups = forkbox_engine::limits::of_process(sb.info().qemu_pid);
    assert!(cgroups.contains(&format!("forkbox/{id}")), "{cgroups}");
    let want = forkbox_engine::limits::Limits::for_vm(cfg.cpus, cfg.memory_mib);
    let v2 = std::path::Path::new("/sys/fs/cgroup/forkbox").join(&id);
    let (mem, pids) = if v2.exists() {
        (v2.join("memory.max"), v2.join("pids.max"))
    } else {
        (
            format!("/sys/fs/cgroup/memory/forkbox/{id}/memory.limit_in_bytes").into(),
            format!("/sys/fs/cgroup/pids/forkbox/{id}/pids.max").into(),
        )
    };
    let read = |p: &std::path::PathBuf| std::fs::read_to_string(p).unwrap().trim().to_string();
    assert_eq!(read(&mem), want.memory_bytes.to_string());
    assert_eq!(read(&pids), want.tasks.to_string());
    sb.destroy().await;
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup/memory/forkbox/{id}")).exists());
    assert!(!v2.exists());
}

/// Two restores. Each QEMU runs jailed: no_new_privs, seccomp, a uid of its own without
/// capabilities (unless FORKBOX_JAIL_UID=off), PID 1 of its own PID namespace, its own mount/network/IPC/UTS namespaces, and a root holding only its files, all
/// read-only but its run and disk directories (and its RAM file's directory, for QEMU 7.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_qemu_runs_jailed() {
    use forkbox_engine::vm::jail;
    let (paths, cfg) = config();
    let a = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    let b = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    let status = |pid: u32, key: &str| -> String {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find(|l| l.starts_with(&format!("{key}:")))
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string()
    };
    let (pa, pb) = (a.info().qemu_pid, b.info().qemu_pid);
    let (ua, ub): (u32, u32) = (
        status(pa, "Uid").parse().unwrap(),
        status(pb, "Uid").parse().unwrap(),
    );
    if jail::own_uid() {
        assert!(ua >= jail::UID_BASE && ub >= jail::UID_BASE, "{ua} {ub}");
        assert_ne!(ua, ub, "each QEMU has a uid of its own");
    } else {
        // FORKBOX_JAIL_UID=off (debugging): QEMU keeps uid 0 inside its jail.
        assert_eq!((ua, ub), (0, 0));
    }
    for pid in [pa, pb] {
        if jail::own_uid() {
            for caps in ["CapEff", "CapPrm", "CapInh", "CapAmb"] {
                assert_eq!(status(pid, caps), "0000000000000000", "{caps}");
            }
        }
        assert_eq!(status(pid, "NoNewPrivs"), "1");
        assert_eq!(status(pid, "Seccomp"), "2");
        // PID 1 of its own PID namespace, under a holder that waits for it.
        let nspid = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find(|l| l.starts_with("NSpid:"))
            .unwrap()
            .split_whitespace()
            .skip(1)
            .map(String::from)
            .collect::<Vec<_>>();
        assert_eq!(nspid, [pid.to_string(), "1".to_string()]);
        let holder = status(pid, "PPid");
        let comm = std::fs::read_to_string(format!("/proc/{holder}/comm")).unwrap();
        assert_eq!(comm.trim(), "forkbox-holder");

        for ns in ["mnt", "net", "ipc", "uts", "pid_for_children"] {
            let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
            let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
            assert_ne!(theirs, ours, "{ns} namespace");
        }
        // What it sees: no /proc, /sys, /etc beyond ld.so.cache, no other sandbox.
        let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
        for absent in ["proc", "sys", "etc/shadow", "etc/passwd", "root", "home"] {
            assert!(
                !root.join(absent).exists(),
                "{absent} is visible in the jail"
            );
        }
        let other = if pid == pa { b.info() } else { a.info() };
        let other_run = paths.run().join(&other.id);
        assert!(!root.join(other_run.strip_prefix("/").unwrap()).exists());
        let images = paths.home().join("images");
        let image_entries: Vec<_> = std::fs::read_dir(root.join(images.strip_prefix("/").unwrap()))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            image_entries.len(),
            1,
            "only its own image: {image_entries:?}"
        );
        // Every mount is read-only but the ones it writes.
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
        let me = if pid == pa { a.info() } else { b.info() };
        let writable: Vec<String> = mounts
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let opts = f.get(5)?;
                (!opts.split(',').any(|o| o == "ro")).then(|| f.get(4).unwrap().to_string())
            })
            .collect();
        for w in &writable {
            let ok = w == "/dev/null"
                || w == "/dev/urandom"
                || w.contains(&me.id)
                || w.contains("/templates/")
                || w.contains("/snapshots/");
            assert!(ok, "{w} is writable in the jail: {writable:?}");
        }
    }
    a.destroy().await;
    b.destroy().await;
}

/// One restore. With the network off (the default) the guest has no network device at all
/// and no proxy: a listener on the host's loopback cannot be reached by any address the guest
/// could try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_network_off_the_guest_reaches_nothing_on_the_host() {
    let (paths, cfg) = config();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let sb = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    let out = run(&sb, "ls /sys/class/net").await;
    assert_eq!(
        out.stdout_text().split_whitespace().collect::<Vec<_>>(),
        ["lo"]
    );
    let script = format!(
        "for h in 10.0.2.2 127.0.0.1 169.254.169.254 192.168.0.1; do \
           python3 -c \"import socket,sys; s=socket.socket(); s.settimeout(2); \
           sys.exit(0 if s.connect_ex(('$h', {port})) == 0 else 1)\" && echo reached $h; done; \
           python3 -c \"import socket,sys; s=socket.socket(); \
           sys.exit(0 if s.connect_ex(('127.0.0.1', 3128)) == 0 else 1)\" && echo a proxy listens; echo done"
    );
    let out = run(&sb, &script).await;
    assert_eq!(
        out.stdout_text(),
        "done\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        listener.accept().is_err(),
        "nothing connected to the host's listener"
    );
    sb.destroy().await;
}

/// One restore. A guest that fills its disk gets "No space left on device" inside the guest;
/// its agent keeps answering and the host file behind the disk stays within the disk's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_an_error_inside_the_guest_only() {
    let (paths, cfg) = config();
    let sb = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    // Fill the root filesystem (fallocate: no data written, so this is quick), then write.
    let out = run(
        &sb,
        "fallocate -l 100G /root/too-big 2>&1; \
         fallocate -l $(( $(df --output=avail -B1 /root | tail -1) - 4096 )) /root/fill; \
         for i in $(seq 200); do head -c 65536 /dev/zero > /root/more-$i || break; done 2>&1; \
         df --output=avail -B1 /root | tail -1",
    )
    .await;
    let text = out.stdout_text();
    assert!(text.contains("No space left on device"), "{text}");
    let avail: u64 = text.lines().last().unwrap().trim().parse().unwrap();
    assert!(
        avail < 1 << 20,
        "the guest's disk is full: {avail} bytes left"
    );
    // The guest is still fine, and so is the host.
    assert_eq!(
        run(&sb, "rm -f /root/fill /root/more-*; echo ok")
            .await
            .stdout_text(),
        "ok\n"
    );
    let disks = paths.disks().join(&sb.info().id);
    let used: u64 = std::fs::read_dir(&disks)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(
        used < 3 << 30,
        "the overlay is bounded by the disk's size: {used} bytes"
    );
    sb.destroy().await;
}

/// Two restores. A sandbox can have a bigger disk than its image: the disk and the root
/// filesystem grow before it is handed out; asking for less than the image is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_gets_the_disk_size_it_asks_for() {
    let (paths, mut cfg) = config();
    cfg.disk_mib = Some(6 * 1024);
    let sb = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    let out = run(
        &sb,
        "df --output=size -B1M / | tail -1; cat /sys/block/vda/size",
    )
    .await;
    let mut lines = out
        .stdout_text()
        .lines()
        .map(|l| l.trim().parse::<u64>().unwrap())
        .collect::<Vec<_>>();
    let sectors = lines.pop().unwrap();
    let fs_mib = lines.pop().unwrap();
    assert_eq!(sectors * 512, 6 << 30);
    assert!(
        fs_mib > 5 * 1024,
        "the root filesystem grew to {fs_mib} MiB"
    );
    sb.destroy().await;
    cfg.disk_mib = Some(100);
    let err = Sandbox::create(&paths, &cfg)
        .await
        .err()
        .expect("too small a disk is refused");
    assert!(err.to_string().contains("smaller than the image"), "{err}");
}

/// One restore. An uploaded folder with links that point out of it and a 1 GB file: links
/// travel as links (the host never reads what they point to), the big file arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_keep_links_as_links_and_carry_a_gigabyte_file() {
    let (paths, cfg) = config();
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/plain.txt"), "plain\n").unwrap();
    std::os::unix::fs::symlink("/etc/shadow", src.join("leak")).unwrap();
    std::os::unix::fs::symlink("../../..", src.join("sub/up")).unwrap();
    let big = std::fs::File::create(src.join("big")).unwrap();
    big.set_len(1 << 30).unwrap();
    drop(big);
    let sb = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    forkbox_engine::files::upload(sb.client(), &src, "/work")
        .await
        .expect("upload");
    let out = run(
        &sb,
        "cd /work && readlink leak && readlink sub/up && cat sub/plain.txt && stat -c %s big && \
         cmp -n 1048576 big /dev/zero && echo zeros",
    )
    .await;
    let text = out.stdout_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        &lines[..5],
        ["/etc/shadow", "../../..", "plain", "1073741824", "zeros"],
        "{text}"
    );
    assert!(!text.contains("root:"), "no host file content crossed");
    sb.destroy().await;
}

/// Three restores, a minute. Under load (two other sandboxes each spinning a vCPU on this
/// host's two cores) a guest's wall clock stays within a second of the host's for a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guest_clock_keeps_time_under_load() {
    let (paths, cfg) = config();
    let mut load = Vec::new();
    for _ in 0..2 {
        let sb = Sandbox::create(&paths, &cfg).await.expect("create load");
        let out = run(
            &sb,
            "setsid sh -c 'while :; do :; done' >/dev/null 2>&1 < /dev/null & echo started",
        )
        .await;
        assert_eq!(out.stdout_text(), "started\n");
        load.push(sb);
    }
    let sb = Sandbox::create(&paths, &cfg).await.expect("create sandbox");
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let started = std::time::Instant::now();
    let mut worst: f64 = 0.0;
    while started.elapsed() < Duration::from_secs(60) {
        let before = unix();
        let guest: f64 = run(&sb, "date +%s.%N")
            .await
            .stdout_text()
            .trim()
            .parse()
            .unwrap();
        let after = unix();
        // The guest read its clock somewhere between `before` and `after`.
        let off = if guest < before {
            guest - before
        } else if guest > after {
            guest - after
        } else {
            0.0
        };
        worst = if off.abs() > worst.abs() { off } else { worst };
        assert!(
            off.abs() <= 1.0,
            "after {:?} the guest's clock is {off:+.2} s off the host's",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    eprintln!("worst offset over a minute under load: {worst:+.3} s");
    sb.destroy().await;
    for l in load {
        l.destroy().await;
    }
}
