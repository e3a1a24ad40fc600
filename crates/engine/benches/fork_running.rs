//! Forking a *running* sandbox, and what idle sandboxes cost. Run with `bench/run.sh forkrun`
//! (or `cargo bench -p forkbox-engine --bench fork_running`). One run prints:
//!
//! - fork of a running sandbox that has written ~100 MB since its template, into 1/3/10/20
//!   copies, at 1 GiB and 4 GiB: the call (save + copies ready), until every copy has answered
//!   an exec, and the parent's pause; the 4 GiB figures against the 1 GiB ones
//! - three generations: a copy forked, writes its own 100 MB, is forked, and so on
//! - host memory (PSS) per idle copy with 10 copies alive
//! - idle sandboxes: host CPU (ticks of QEMU over BENCH_IDLE_SECS) and PSS per sandbox with 10
//!   and BENCH_IDLE (default 100) alive, and exec round trips among them
//!
//! It goes through the engine as the daemon's `fork` does (save, then copies in parallel).

#![allow(clippy::unwrap_used)] // benches fail loudly by design

use std::time::{Duration, Instant};

use forkbox_engine::sandbox::{Sandbox, SandboxConfig};
use forkbox_engine::snapshot::SnapshotStore;
use forkbox_test_infra as infra;

mod common;
use common::{env_count, ms, ok, pss_kib, runtime, stats};

/// User + system ticks (1/100 s) a process has used.
fn ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) are space-separated.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    field(11) + field(12)
}

/// Writes ~100 MB of fresh data into the guest's memory (tmpfs) and leaves a process running.
const WRITE_100MB: &str = "head -c 100000000 /dev/urandom > /dev/shm/written-$$; \
    nohup sleep 100000 >/dev/null 2>&1 &";

struct Forked {
    call: f64,
    answered: f64,
    pause: f64,
    copies: Vec<Sandbox>,
}

/// The daemon's fork: save `sb` (a fork's snapshot: not synced), then `count` copies at once.
async fn fork(
    paths: &forkbox_engine::paths::Paths,
    cfg: &SandboxConfig,
    sb: &Sandbox,
    count: usize,
    tag: &str,
) -> Forked {
    let name = format!("bench-run-{}-{tag}", std::process::id());
    let t = Instant::now();
    let snap = sb
        .snapshot(paths, &name, false, false)
        .await
        .expect("snapshot");
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (paths, snap, cfg) = (paths.clone(), snap.clone(), cfg.clone());
        set.spawn(async move {
            let origin = format!("snapshot:{}", snap.meta.name);
            let sb = Sandbox::restore(&paths, &snap, origin, &cfg, Instant::now(), None)
                .await
                .expect("restore");
            let ready = Instant::now();
            ok(&sb, "true").await;
            (sb, ready)
        });
    }
    let mut copies = Vec::new();
    let mut last_ready = t;
    while let Some(r) = set.join_next().await {
        let (sb, ready) = r.unwrap();
        last_ready = last_ready.max(ready);
        copies.push(sb);
    }
    Forked {
        call: ms(last_ready - t),
        answered: ms(t.elapsed()),
        pause: snap.meta.pause_ms.unwrap_or(f64::NAN),
        copies,
    }
}

async fn destroy(copies: Vec<Sandbox>) {
    for c in copies {
        c.destroy().await;
    }
}

fn main() {
    let rt = runtime();
    let idle_n = env_count("BENCH_IDLE", 100);
    let idle_secs = env_count("BENCH_IDLE_SECS", 20) as u64;
    let (paths, cfg) = infra::sandbox_setup("python-bookworm");
    let store = SnapshotStore::new(&paths);
    rt.block_on(async {
        let mut one_gib = Vec::new();
        for memory_mib in [1024u32, 4096] {
            let cfg = SandboxConfig { memory_mib, ..cfg.clone() };
            let t = Instant::now();
            let parent = Sandbox::create(&paths, &cfg).await.expect("create");
            if memory_mib == 1024 {
                println!(
                    "forkbox fork-running bench: accelerator {} ({}), image {}, {} vCPU",
                    parent.info().accel.accel,
                    parent.info().accel.reason,
                    cfg.image,
                    cfg.cpus
                );
            }
            println!("{memory_mib} MiB guest: first create {:.0} ms (makes the template if missing)", ms(t.elapsed()));
            ok(&parent, WRITE_100MB).await;
            for (i, count) in [1usize, 3, 10, 20].into_iter().enumerate() {
                // Small counts are quick and noisy on a shared host: the median of three.
                let reps = if count <= 3 { 3 } else { 1 };
                let mut runs = Vec::new();
                for rep in 0..reps {
                    let f = fork(&paths, &cfg, &parent, count, &format!("{memory_mib}-{count}-{rep}")).await;
                    if memory_mib == 1024 && count == 10 {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        let pss: Vec<u64> = f.copies.iter().map(|c| pss_kib(c.info().qemu_pid)).collect();
                        let avg = pss.iter().sum::<u64>() as f64 / pss.len() as f64 / 1024.0;
                        println!(
                            "  host memory (PSS) per idle copy with 10 copies alive: {avg:.1} MiB; the parent: {:.1} MiB",
                            pss_kib(parent.info().qemu_pid) as f64 / 1024.0
                        );
                    }
                    runs.push((f.call, f.answered, f.pause));
                    destroy(f.copies).await;
                    let _ = store.remove(&format!("bench-run-{}-{memory_mib}-{count}-{rep}", std::process::id()), &[]);
                }
                let med = |k: fn(&(f64, f64, f64)) -> f64| stats(runs.iter().map(k).collect()).0;
                let (call, answered, pause) = (med(|r| r.0), med(|r| r.1), med(|r| r.2));
                println!(
                    "  fork of a running {memory_mib} MiB sandbox, count {count:<2} (median of {reps}): copies ready {call:>6.0} ms, all answered an exec {answered:>6.0} ms, parent paused {pause:>5.1} ms"
                );
                if memory_mib == 1024 {
                    one_gib.push((call, answered, pause));
                } else if let Some((c, a, p)) = one_gib.get(i) {
                    println!(
                        "    4 GiB / 1 GiB: copies ready {:.2}x, all answered {:.2}x, pause {:.2}x",
                        call / c, answered / a, pause / p
                    );
                }
            }
            if memory_mib == 1024 {
                // Three generations: each forks the last one's copy after it wrote 100 MB more.
                let mut current = parent;
                let mut snaps = Vec::new();
                let mut older = Vec::new();
                for generation in 1..=3 {
                    let tag = format!("gen{generation}");
                    let mut f = fork(&paths, &cfg, &current, 3, &tag).await;
                    println!(
                        "  generation {generation}: fork of a copy into 3, copies ready {:>6.0} ms, all answered {:>6.0} ms, paused {:>5.1} ms",
                        f.call, f.answered, f.pause
                    );
                    snaps.push(format!("bench-run-{}-{tag}", std::process::id()));
                    let next = f.copies.remove(0);
                    ok(&next, WRITE_100MB).await;
                    older.push(current);
                    destroy(f.copies).await;
                    current = next;
                }
                older.push(current);
                destroy(older).await;
                for s in snaps.iter().rev() {
                    let _ = store.remove(s, &[]);
                }
            } else {
                parent.destroy().await;
            }
            println!();
        }

        // Idle sandboxes: CPU and memory each, and exec round trips among them.
        let mut alive: Vec<Sandbox> = Vec::new();
        for n in [10usize, idle_n] {
            while alive.len() < n {
                alive.push(Sandbox::create(&paths, &cfg).await.expect("create"));
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            let before: Vec<u64> = alive.iter().map(|s| ticks(s.info().qemu_pid)).collect();
            tokio::time::sleep(Duration::from_secs(idle_secs)).await;
            let used: u64 = alive
                .iter()
                .zip(&before)
                .map(|(s, b)| ticks(s.info().qemu_pid).saturating_sub(*b))
                .sum();
            let per_core = used as f64 / (idle_secs as f64 * 100.0) / n as f64 * 100.0;
            let pss = alive.iter().map(|s| pss_kib(s.info().qemu_pid)).sum::<u64>() as f64
                / n as f64
                / 1024.0;
            // Round trips to sandboxes that have run a command before (a copy's first command
            // also translates the guest code it runs, under TCG).
            for i in 0..20 {
                ok(&alive[(i * 7) % n], "true").await;
            }
            let mut rtt = Vec::new();
            for i in 0..20 {
                let t = Instant::now();
                ok(&alive[(i * 7) % n], "true").await;
                rtt.push(ms(t.elapsed()));
            }
            let (p50, p99, _) = stats(rtt);
            println!(
                "{n:>3} idle sandboxes: {per_core:.2}% of a core and {pss:.1} MiB (PSS) each; exec `true` round trip p50 {p50:.0} ms, p99 {p99:.0} ms"
            );
        }
        destroy(alive).await;
    });
}
