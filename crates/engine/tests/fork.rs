//! Templates, snapshots and forks with real VMs. The image's template is made once per test
//! home (one boot, ~5 s under TCG); each restore then costs ~0.25 s, each snapshot of a running
//! 1 GiB sandbox ~0.1-0.3 s (the pages it wrote are copied, not its RAM).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Instant;

use forkbox_engine::sandbox::{Sandbox, SandboxConfig};
use forkbox_engine::snapshot::SnapshotStore;
use forkbox_test_infra as infra;

fn config() -> (forkbox_engine::paths::Paths, SandboxConfig) {
    infra::sandbox_setup("python-bookworm")
}

async fn sh(sb: &Sandbox, script: &str) -> String {
    let out = sb.run(infra::sh(script, Some(60_000))).await.expect("run");
    assert_eq!(
        out.code(),
        0,
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout_text()
}

/// The number in `file` (a counter a guest loop keeps writing), read until it exceeds the first
/// reading; `Err` with both readings if it has not within 30 s. A stopped guest never counts on;
/// a running one on a busy host can take seconds per round of its loop, so a fixed wait would
/// measure the host, not the sandbox.
async fn counts_on(sb: &Sandbox, file: &str) -> Result<(u64, u64), (u64, u64)> {
    // The loop's `echo $i > file` empties the file before it writes it: an empty reading is
    // read again.
    let read = || async {
        let script = format!(
            "while :; do v=$(cat {file}); [ -n \"$v\" ] && break; sleep 0.05; done; echo $v"
        );
        let v = sh(sb, &script).await;
        v.trim()
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("{file}: {v:?}: {e}"))
    };
    let first = read().await;
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let now = read().await;
        if now > first {
            return Ok((first, now));
        }
        if Instant::now() > deadline {
            return Err((first, now));
        }
    }
}

/// A copy of `snap`, as the daemon's fork makes one.
async fn copy_of(
    paths: &forkbox_engine::paths::Paths,
    snap: &forkbox_engine::snapshot::Snapshot,
    cfg: &SandboxConfig,
) -> Result<Sandbox, forkbox_engine::error::SandboxError> {
    let origin = format!("snapshot:{}", snap.meta.name);
    Sandbox::restore(paths, snap, origin, cfg, Instant::now(), None).await
}

fn unique(prefix: &str) -> String {
    let mut b = [0u8; 4];
    getrandom::getrandom(&mut b).unwrap();
    format!(
        "{prefix}-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

/// Template restore, a snapshot of a running sandbox with a background process, two forks of
/// it and a fork of a fork: processes carry on, files diverge, randomness differs, the clock is
/// the host's, names differ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_carry_processes_and_diverge() {
    let (paths, cfg) = config();
    let parent = Sandbox::create(&paths, &cfg)
        .await
        .expect("create from template");
    assert!(
        parent
            .info()
            .origin
            .as_deref()
            .unwrap_or("")
            .starts_with("template:"),
        "{:?}",
        parent.info().origin
    );
    // A background counter that keeps state in memory, and a file on disk.
    sh(
        &parent,
        "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done' >/dev/null 2>&1 &
         echo base > /root/file; date -s '@1000000000' >/dev/null",
    )
    .await;
    // Snapshotted once it has counted (a fixed wait would not do on a busy host).
    sh(&parent, "while ! test -s /tmp/count; do sleep 0.1; done").await;
    let name = unique("t-fork");
    let snap = parent
        .snapshot(&paths, &name, false, true)
        .await
        .expect("snapshot");
    eprintln!(
        "snapshot {} took {} ms, pause {:?} ms, {} MB of RAM",
        name,
        snap.meta.took_ms,
        snap.meta.pause_ms,
        snap.meta.memory_bytes >> 20
    );
    let started = Instant::now();
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let host_before_fork = unix_now();
    let (a, b) = tokio::join!(copy_of(&paths, &snap, &cfg), copy_of(&paths, &snap, &cfg),);
    let (a, b) = (a.expect("fork a"), b.expect("fork b"));
    eprintln!("two forks ready in {} ms", started.elapsed().as_millis());

    for sb in [&parent, &a, &b] {
        // The counter is still counting in every copy.
        let (c1, c2) = counts_on(sb, "/tmp/count").await.unwrap_or_else(|(a, b)| {
            panic!("{}: the counter stopped: {a} -> {b} in 30 s", sb.info().id)
        });
        assert!(c2 > c1 && c1 > 0, "counter {c1} -> {c2}");
        assert_eq!(sh(sb, "cat /root/file").await, "base\n");
    }
    // Clock: the parent's was set to 2001 before the snapshot; the forks were given the host's
    // when they were handed out. (On a busy host an emulated guest's clock then falls behind
    // by seconds, so it is checked against the time of the fork, not to the second.)
    for sb in [&a, &b] {
        let guest: i64 = sh(sb, "date +%s").await.trim().parse().unwrap();
        let host = unix_now();
        assert!(
            guest >= host_before_fork - 1 && guest <= host + 1,
            "guest {guest}, host {host_before_fork} (fork) .. {host} (now)"
        );
        assert_eq!(sh(sb, "hostname").await.trim(), sb.info().id);
    }
    // Randomness differs between every pair, parent included.
    let mut seen = Vec::new();
    for sb in [&parent, &a, &b] {
        seen.push(sh(sb, "head -c 1000 /dev/urandom | od -An -tx1 | tr -d ' \\n'").await);
    }
    assert!(seen[0] != seen[1] && seen[0] != seen[2] && seen[1] != seen[2]);
    assert_eq!(seen[0].len(), 2000);
    // Files diverge.
    sh(&a, "echo from-a > /root/only-a; sync").await;
    for sb in [&parent, &b] {
        assert_eq!(
            sh(sb, "ls /root/only-a 2>/dev/null || echo absent").await,
            "absent\n"
        );
    }
    // A fork of a fork.
    let name2 = unique("t-fork2");
    let snap2 = a
        .snapshot(&paths, &name2, false, true)
        .await
        .expect("snapshot of a fork");
    assert_eq!(snap2.meta.parent.as_deref(), Some(name.as_str()));
    let c = copy_of(&paths, &snap2, &cfg).await.expect("fork of a fork");
    assert_eq!(sh(&c, "cat /root/only-a").await, "from-a\n");
    sh(&c, "test -s /tmp/count").await;
    // ... and a fork of that fork: three levels of disks and memory.
    sh(&c, "echo from-c > /root/only-c").await;
    let name3 = unique("t-fork3");
    let snap3 = c
        .snapshot(&paths, &name3, false, true)
        .await
        .expect("snapshot of a fork of a fork");
    let d = copy_of(&paths, &snap3, &cfg)
        .await
        .expect("fork of a fork of a fork");
    assert_eq!(
        sh(&d, "cat /root/only-a /root/only-c").await,
        "from-a\nfrom-c\n"
    );
    sh(&d, "test -s /tmp/count").await;
    // The first snapshot is unchanged by anything its copies wrote.
    let fresh = copy_of(&paths, &snap, &cfg)
        .await
        .expect("another copy of the first snapshot");
    assert_eq!(
        sh(&fresh, "ls /root/only-a 2>/dev/null || echo absent").await,
        "absent\n"
    );

    // The first snapshot has a child snapshot: it cannot be deleted.
    let store = SnapshotStore::new(&paths);
    let err = store.remove(&name, &[]).unwrap_err().to_string();
    assert!(err.contains(&name2), "{err}");
    for sb in [parent, a, b, c, d, fresh] {
        sb.destroy().await;
    }
    store.remove(&name3, &[]).unwrap();
    store.remove(&name2, &[]).unwrap();
    store.remove(&name, &[]).unwrap();
}

/// A live snapshot of a sandbox that keeps writing memory holds exactly the RAM of the paused
/// source, page for page: the source stays paused after the save (`stay_paused`), QEMU dumps
/// its guest memory, and the two are compared. Three generations: a sandbox from the template,
/// a copy of its snapshot, a copy of that copy's snapshot (each generation's RAM is the last
/// one's file plus its own written pages), three saves each, all exact. ~60 s under TCG.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_snapshot_of_a_busy_sandbox_is_exact() {
    use std::io::Read;
    let (paths, cfg) = config();
    let first = Sandbox::create(&paths, &cfg).await.expect("create");
    // 10 MB/s of fresh random data into tmpfs, and a counter; every copy carries them on.
    sh(
        &first,
        "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/tick; \
         head -c 1000000 /dev/urandom > /tmp/junk; sleep 0.1; done' >/dev/null 2>&1 </dev/null &",
    )
    .await;
    sh(&first, "while ! test -s /tmp/tick; do sleep 0.1; done").await;
    let store = SnapshotStore::new(&paths);
    let mut report = Vec::new();
    let mut kept = Vec::new();
    let mut generations = vec![first];
    for generation in 0..3 {
        let sb = generations.last().unwrap();
        let run = paths.run().join(&sb.info().id);
        let mut last = None;
        for round in 0..3 {
            let name = unique("t-exact");
            let snap = sb
                .snapshot(&paths, &name, true, round == 2)
                .await
                .expect("snapshot");
            let size = std::fs::metadata(snap.mem()).unwrap().len();
            let dump = run.join("guest-ram.dump");
            let mut q = forkbox_engine::vm::qmp::Qmp::connect(
                &run.join(forkbox_engine::vm::QMP_SOCKET),
                std::time::Duration::from_secs(10),
            )
            .unwrap();
            let status = q.status().unwrap();
            assert_eq!(status, "paused");
            q.execute(
                "pmemsave",
                serde_json::json!({"val": 0, "size": size, "filename": dump.display().to_string()}),
            )
            .unwrap();
            let (mut a, mut b) = (
                std::io::BufReader::new(std::fs::File::open(&dump).unwrap()),
                std::io::BufReader::new(std::fs::File::open(snap.mem()).unwrap()),
            );
            let (mut pa, mut pb) = (vec![0u8; 4096], vec![0u8; 4096]);
            let mut differing = Vec::new();
            for page in 0..size / 4096 {
                a.read_exact(&mut pa).unwrap();
                b.read_exact(&mut pb).unwrap();
                // The BIOS ROM overlays RAM there: the dump reads the ROM.
                let addr = page * 4096;
                if pa != pb && !(0xa0000..0x100000).contains(&addr) {
                    differing.push(format!("{addr:#x}"));
                }
            }
            std::fs::remove_file(&dump).unwrap();
            q.execute("cont", serde_json::json!({})).unwrap();
            drop(q);
            eprintln!(
                "generation {generation}, save {round}: {} MB of RAM, {} pages differ",
                snap.meta.memory_bytes >> 20,
                differing.len()
            );
            if !differing.is_empty() {
                report.push(format!(
                    "generation {generation}, save {round}: {differing:?}"
                ));
            }
            if round == 2 {
                last = Some(snap);
            } else {
                store.remove(&name, &[]).unwrap();
            }
        }
        // The source still runs after being resumed.
        if let Err((t1, t2)) = counts_on(sb, "/tmp/tick").await {
            panic!("generation {generation}: the source did not resume: {t1} -> {t2} in 30 s");
        }
        // The next generation: a copy of the last save, still writing.
        let snap = last.unwrap();
        let copy = copy_of(&paths, &snap, &cfg).await.expect("copy");
        kept.push(snap.meta.name.clone());
        generations.push(copy);
    }
    for sb in generations {
        sb.destroy().await;
    }
    for name in kept.iter().rev() {
        store.remove(name, &[]).unwrap();
    }
    assert!(
        report.is_empty(),
        "pages of the snapshot differ from the paused source: {report:?}"
    );
}

/// Forks of a sandbox that writes 10 MB/s, again and again: every copy answers and carries the
/// writer on, every round. FORKBOX_FORK_ROUNDS rounds of 3 copies (default 10; the closing
/// runs use 40).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_forks_of_a_busy_sandbox_all_answer() {
    let (paths, cfg) = config();
    let rounds: usize = std::env::var("FORKBOX_FORK_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let sb = Sandbox::create(&paths, &cfg).await.expect("create");
    sh(
        &sb,
        "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/tick; \
         head -c 1000000 /dev/urandom > /tmp/junk-$((i % 20)); sleep 0.1; done' >/dev/null 2>&1 </dev/null &",
    )
    .await;
    sh(&sb, "while ! test -s /tmp/tick; do sleep 0.1; done").await;
    let store = SnapshotStore::new(&paths);
    let mut pauses = Vec::new();
    for round in 0..rounds {
        let name = unique("t-stress");
        let snap = sb
            .snapshot(&paths, &name, false, false)
            .await
            .expect("snapshot");
        pauses.push(snap.meta.pause_ms.unwrap_or(f64::NAN));
        let copy = || copy_of(&paths, &snap, &cfg);
        let (a, b, c) = tokio::join!(copy(), copy(), copy());
        let copies = [a, b, c];
        for c in copies {
            let c = c.unwrap_or_else(|e| panic!("round {round}: a copy failed: {e}"));
            // The writer goes on in the copy.
            if let Err((t1, t2)) = counts_on(&c, "/tmp/tick").await {
                panic!("round {round}: the writer stopped in a copy: {t1} -> {t2} in 30 s");
            }
            c.destroy().await;
        }
        store.remove(&name, &[]).unwrap();
    }
    counts_on(&sb, "/tmp/tick")
        .await
        .unwrap_or_else(|(a, b)| panic!("the writer stopped in the source: {a} -> {b} in 30 s"));
    sb.destroy().await;
    eprintln!("{rounds} rounds; pauses (ms): {pauses:.1?}");
}
