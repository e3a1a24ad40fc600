//! Template, snapshot and fork figures, with ratios measured in the same run. Run with
//! `bench/run.sh` (or `cargo bench -p forkbox-engine --bench fork`).
//!
//! - create from the image's template: median and p99 over BENCH_CREATES (default 50), against
//!   a cold boot of the same image and against bare QEMU start-up (the floor)
//! - fork of a running 1 GiB sandbox with count 1, 3, 10: wall time of the call (snapshot +
//!   copies) and until every copy has answered an exec
//! - snapshot of a running sandbox with 100 MB and 1 GB of dirty memory: the pause it saw
//! - host memory (PSS) per idle fork with 10 forks alive, against one un-forked sandbox

#![allow(clippy::unwrap_used)] // benches fail loudly by design

use std::time::{Duration, Instant};

use forkbox_engine::sandbox::{Sandbox, SandboxConfig};
use forkbox_engine::snapshot::SnapshotStore;
use forkbox_test_infra as infra;

mod common;
use common::{env_count, ms, ok, pss_kib, qemu_floor, runtime, stats};

fn row(name: &str, v: Vec<f64>) -> f64 {
    let n = v.len();
    let (p50, p99, min) = stats(v);
    println!("{name:<52} n={n:<3} median {p50:>8.1} ms  p99 {p99:>8.1} ms  min {min:>8.1} ms");
    p50
}

/// Snapshot of `sb` then `count` copies at once: (wall of snapshot + copies, until all answered).
async fn fork(
    paths: &forkbox_engine::paths::Paths,
    cfg: &SandboxConfig,
    sb: &Sandbox,
    count: usize,
) -> (f64, f64, f64, Vec<Sandbox>) {
    let name = format!("bench-{}-{count}", std::process::id());
    let t = Instant::now();
    let snap = sb
        .snapshot(paths, &name, false, false)
        .await
        .expect("snapshot");
    let origin = format!("snapshot:{name}");
    let copies = futures_join(paths, &snap, &origin, cfg, count).await;
    let call = ms(t.elapsed());
    for c in &copies {
        ok(c, "true").await;
    }
    let answered = ms(t.elapsed());
    (
        call,
        answered,
        snap.meta.pause_ms.unwrap_or(f64::NAN),
        copies,
    )
}

async fn futures_join(
    paths: &forkbox_engine::paths::Paths,
    snap: &forkbox_engine::snapshot::Snapshot,
    origin: &str,
    cfg: &SandboxConfig,
    count: usize,
) -> Vec<Sandbox> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (paths, snap, origin, cfg) =
            (paths.clone(), snap.clone(), origin.to_string(), cfg.clone());
        set.spawn(async move {
            Sandbox::restore(&paths, &snap, origin, &cfg, Instant::now(), None).await
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.push(r.unwrap().expect("restore"));
    }
    out
}

fn main() {
    let rt = runtime();
    let n = env_count("BENCH_CREATES", 50);
    let boots = env_count("BENCH_BOOTS", 3);
    let (paths, cfg) = infra::sandbox_setup("python-bookworm");
    let tmp = std::env::temp_dir().join(format!("forkbox-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    rt.block_on(async {
        // Warm-up: the template is made on first use.
        let t = Instant::now();
        let sb = Sandbox::create(&paths, &cfg).await.expect("create");
        println!("forkbox fork bench: accelerator {} ({}), image {}, {} MiB, {} vCPU",
            sb.info().accel.accel, sb.info().accel.reason, cfg.image, cfg.memory_mib, cfg.cpus);
        println!("first create (makes the template if missing): {:.0} ms", ms(t.elapsed()));
        sb.destroy().await;
        println!();

        let floor = row("QEMU start-up, doing nothing (floor)", {
            let mut v = Vec::new();
            for _ in 0..5 { v.push(ms(qemu_floor(&tmp).await)); }
            v
        });
        let mut cold = Vec::new();
        for _ in 0..boots {
            let t = Instant::now();
            let sb = Sandbox::create(&paths, &SandboxConfig { cold: true, ..cfg.clone() }).await.expect("cold");
            cold.push(ms(t.elapsed()));
            sb.destroy().await;
        }
        let cold = row("cold boot to agent-ready", cold);
        let mut warm = Vec::new();
        let mut first_exec = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            let sb = Sandbox::create(&paths, &cfg).await.expect("create");
            warm.push(ms(t.elapsed()));
            ok(&sb, "true").await;
            first_exec.push(ms(t.elapsed()));
            sb.destroy().await;
        }
        let warm = row("create from template, to ready (reseeded)", warm);
        row("create from template + first exec `true`", first_exec);
        println!("  ratios: cold boot / template create {:.1}x;  template create / floor {:.2}x", cold / warm, warm / floor);

        // What the jail costs: the same creates with QEMU unconfined (nothing else runs now,
        // so flipping the variable races with no reader).
        std::env::set_var("FORKBOX_JAIL", "off");
        let mut bare = Vec::new();
        for _ in 0..(n / 2).max(5) {
            let t = Instant::now();
            let sb = Sandbox::create(&paths, &cfg).await.expect("create unjailed");
            bare.push(ms(t.elapsed()));
            sb.destroy().await;
        }
        std::env::remove_var("FORKBOX_JAIL");
        let bare = row("create from template, QEMU unjailed (comparison)", bare);
        println!("  jail overhead: jailed / unjailed create {:.2}x ({:+.1} ms)", warm / bare, warm - bare);

        // The daemon's path: the engine API with its warm pool (2 ready sandboxes per
        // configuration, refilled in the background). Each round: create, exec, delete, then a
        // pause as an agent would take between sandboxes, which is when the pool refills.
        let engine = forkbox_engine::api::Engine::new(paths.clone());
        let mut pooled = Vec::new();
        let mut deletes = Vec::new();
        let mut hits = 0;
        let pause_ms = env_count("BENCH_POOL_PAUSE_MS", 500) as u64;
        for i in 0..n + 1 {
            let t = Instant::now();
            let request = forkbox_engine::api::CreateRequest {
                image: Some(cfg.image.to_string()),
                ..Default::default()
            };
            let v = engine.call(forkbox_engine::api::ops::Create { request }).await.expect("create through the API");
            let took = ms(t.elapsed());
            if i > 0 {
                // The first create finds the pool empty and starts filling it.
                pooled.push(took);
                hits += v.from_pool as usize;
            }
            let id = v.info.id.clone();
            let out = engine.call(forkbox_engine::api::ops::Exec { id: id.clone(), request: forkbox_engine::api::ExecRequest { argv: Some(vec!["true".into()]), ..Default::default() } }).await.expect("exec");
            drop(out);
            let t = Instant::now();
            engine.call(forkbox_engine::api::ops::Delete { id }).await.expect("delete");
            deletes.push(ms(t.elapsed()));
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        }
        let pooled_p50 = row("create through the API with the warm pool", pooled);
        row("delete through the API", deletes);
        println!("  pool hits {hits}/{n} (pause between rounds {pause_ms} ms);  pooled create / floor {:.2}x;  cold boot / pooled create {:.0}x",
            pooled_p50 / floor, cold / pooled_p50);
        engine.shutdown().await;
        println!();

        // Fork of a running 1 GiB sandbox.
        let parent = Sandbox::create(&paths, &cfg).await.expect("create");
        ok(&parent, "nohup sleep 100000 >/dev/null 2>&1 &").await;
        let solo_pss = pss_kib(parent.info().qemu_pid);
        let store = SnapshotStore::new(&paths);
        let mut ten = Vec::new();
        for count in [1usize, 3, 10] {
            let (call, answered, pause, copies) = fork(&paths, &cfg, &parent, count).await;
            println!("fork of a running sandbox, count {count:<2}: call {call:>7.0} ms, all answered {answered:>7.0} ms, parent paused {pause:.1} ms");
            if count == 10 { ten = copies; } else { for c in copies { c.destroy().await; } }
        }
        // Copies of a snapshot that already exists: the restore alone.
        let name = format!("bench-{}-existing", std::process::id());
        let snap = parent.snapshot(&paths, &name, false, false).await.expect("snapshot");
        for count in [1usize, 3, 10] {
            let t = Instant::now();
            let copies = futures_join(&paths, &snap, &format!("snapshot:{name}"), &cfg, count).await;
            let call = ms(t.elapsed());
            for c in &copies { ok(c, "true").await; }
            println!("fork of an existing snapshot,   count {count:<2}: call {call:>7.0} ms, all answered {:>7.0} ms", ms(t.elapsed()));
            for c in copies { c.destroy().await; }
        }
        let _ = store.remove(&name, &[]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let pss: Vec<u64> = ten.iter().map(|c| pss_kib(c.info().qemu_pid)).collect();
        let avg = pss.iter().sum::<u64>() as f64 / pss.len() as f64 / 1024.0;
        println!("host memory (PSS) per idle fork with 10 alive: {avg:.1} MiB; one un-forked sandbox: {:.1} MiB; ratio {:.2}",
            solo_pss as f64 / 1024.0, avg * 1024.0 / solo_pss as f64);
        for c in ten { c.destroy().await; }
        for count in [1, 3, 10] { let _ = store.remove(&format!("bench-{}-{count}", std::process::id()), &[]); }
        println!();

        for (mb, label) in [(100u64, "100 MB"), (1000, "1 GB")] {
            let big = SandboxConfig { memory_mib: 2048, ..cfg.clone() };
            let sb = Sandbox::create(&paths, &big).await.expect("create 2 GiB");
            ok(&sb, &format!("nohup python3 -c \"import time; b=bytearray(b'x')*({mb}*1000*1000); open('/tmp/filled','w').close(); time.sleep(1e6)\" >/dev/null 2>&1 & while [ ! -e /tmp/filled ]; do sleep 0.2; done")).await;
            let name = format!("bench-dirty-{}-{mb}", std::process::id());
            let t = Instant::now();
            let snap = sb.snapshot(&paths, &name, false, false).await.expect("snapshot");
            println!("snapshot of a running 2 GiB sandbox with {label:<6} dirty: pause {:>6.1} ms, whole save {:>6.0} ms, RAM file {} MiB",
                snap.meta.pause_ms.unwrap_or(f64::NAN), ms(t.elapsed()), snap.meta.memory_bytes >> 20);
            sb.destroy().await;
            let _ = store.remove(&name, &[]);
        }
    });
    let _ = std::fs::remove_dir_all(&tmp);
}
