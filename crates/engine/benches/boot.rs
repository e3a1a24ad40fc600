//! Boot and exec figures, medians over repeated runs in one run. Run with `bench/run.sh`.
//!
//! - QEMU start-up doing nothing (the floor: process start to QMP greeting)
//! - cold boot to agent-ready through the engine (overlay + QEMU + kernel + agent handshake),
//!   and create from the image's template (what `create` and `run` do)
//! - `forkbox run -- true` wall time (set FORKBOX_BIN to the CLI)
//! - exec round trip of `true` inside a running guest, and a protocol ping

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Instant;

use forkbox_engine::sandbox::{Sandbox, SandboxConfig};
use forkbox_protocol::{ExecSpec, Program};
use forkbox_test_infra as infra;

mod common;
use common::{env_count, ms, qemu_floor, runtime, stats};

fn row(name: &str, n: usize, v: Vec<f64>) -> f64 {
    let (p50, p99, min) = stats(v);
    println!("{name:<44} n={n:<3} median {p50:>9.1} ms   p99 {p99:>9.1} ms   min {min:>9.1} ms");
    p50
}

fn main() {
    let rt = runtime();
    let boots = env_count("BENCH_BOOTS", 5);
    let execs = env_count("BENCH_EXECS", 100);
    let (paths, cfg) = infra::sandbox_setup("python-bookworm");
    let tmp = std::env::temp_dir().join(format!("forkbox-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("tmp dir");

    rt.block_on(async {
        // Warm-up: the initramfs and the accelerator verdict are cached on first use.
        let sb = Sandbox::create(&paths, &cfg).await.expect("create");
        let accel = sb.info().accel.clone();
        sb.destroy().await;
        println!("forkbox boot bench: accelerator {} ({}), image {}", accel.accel, accel.reason, cfg.image);
        println!();

        let mut floor = Vec::new();
        for _ in 0..boots {
            floor.push(ms(qemu_floor(&tmp).await));
        }
        let floor_p50 = row("QEMU start-up, doing nothing (floor)", boots, floor);

        let mut cold = Vec::new();
        for _ in 0..boots {
            let t = Instant::now();
            let sb = Sandbox::create(&paths, &SandboxConfig { cold: true, ..cfg.clone() })
                .await
                .expect("create");
            cold.push(ms(t.elapsed()));
            sb.destroy().await;
        }
        let cold_p50 = row("cold boot to agent-ready (engine)", boots, cold);
        let mut warm = Vec::new();
        for _ in 0..boots {
            let t = Instant::now();
            let sb = Sandbox::create(&paths, &cfg).await.expect("create");
            warm.push(ms(t.elapsed()));
            sb.destroy().await;
        }
        let warm_p50 = row("create from the template (engine)", boots, warm);

        let mut run_true = Vec::new();
        let bin = std::env::var("FORKBOX_BIN").ok();
        if let Some(bin) = &bin {
            for _ in 0..boots {
                let t = Instant::now();
                let st = std::process::Command::new(bin)
                    .args(["run", "--", "true"])
                    .env("FORKBOX_HOME", paths.home())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .expect("run forkbox");
                assert!(st.success());
                run_true.push(ms(t.elapsed()));
            }
        }
        let run_p50 = if run_true.is_empty() {
            println!("{:<44} skipped: set FORKBOX_BIN to the forkbox binary", "`forkbox run -- true` wall time");
            None
        } else {
            Some(row("`forkbox run -- true` wall time", boots, run_true))
        };

        let sb = Sandbox::create(&paths, &cfg).await.expect("create");
        let mut ping = Vec::new();
        for _ in 0..execs {
            let t = Instant::now();
            sb.client().ping().await.expect("ping");
            ping.push(ms(t.elapsed()));
        }
        row("protocol ping round trip (running guest)", execs, ping);
        let mut rtt = Vec::new();
        for _ in 0..execs {
            let t = Instant::now();
            let out = sb
                .client()
                .run(ExecSpec { program: Program::Argv(vec!["true".into()]), cwd: None, env: vec![], timeout_ms: None, stdin: false, tty: None, user: None })
                .await
                .expect("exec");
            assert_eq!(out.code(), 0);
            rtt.push(ms(t.elapsed()));
        }
        let rtt_p50 = row("exec `true` round trip (running guest)", execs, rtt);

        // Upload throughput: a 200 MB folder of incompressible data, packed as tar.zst on the
        // host and unpacked by the agent in the guest.
        let dir = tmp.join("upload");
        std::fs::create_dir_all(&dir).unwrap();
        let mut data = vec![0u8; 200_000_000];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for b in data.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        std::fs::write(dir.join("blob"), &data).unwrap();
        drop(data);
        let t = Instant::now();
        let sent = forkbox_engine::files::upload(sb.client(), &dir, "/upload").await.expect("upload");
        let secs = t.elapsed().as_secs_f64();
        println!("upload of a 200 MB folder (incompressible)   {:>8.1} s   {:>6.1} MB/s ({} bytes on the wire)", secs, 200.0 / secs, sent);
        sb.destroy().await;

        // Download through the network proxy: 50 MB over HTTP from a server in a network
        // namespace this bench makes (never the internet), by a guest program (Python's urllib,
        // as pip does, through HTTP_PROXY), against the same download by the host.
        let (net_secs, host_secs) = {
            let mut net = infra::TestNet::new();
            let ip = net.peer_ips[0].clone();
            let web = tmp.join("web");
            std::fs::create_dir_all(&web).unwrap();
            let blob = std::fs::read(dir.join("blob")).unwrap();
            std::fs::write(web.join("blob"), &blob[..50_000_000]).unwrap();
            net.serve(&ip, 8080, &web);
            let fetch = format!(
                "import time, urllib.request\nt = time.time()\nd = urllib.request.urlopen('http://{ip}:8080/blob', timeout=600).read()\nassert len(d) == 50_000_000\nprint(time.time() - t)"
            );
            let host = std::process::Command::new("python3").args(["-c", &fetch]).output().expect("host python3");
            let host_secs: f64 = String::from_utf8_lossy(&host.stdout).trim().parse().expect("host download");
            let ncfg = SandboxConfig {
                network: forkbox_engine::net::NetworkPolicy { internet: false, allow: vec![format!("{ip}:8080")], deny: Vec::new() },
                ..cfg.clone()
            };
            let sb = Sandbox::create(&paths, &ncfg).await.expect("create with network");
            let out = sb
                .run(ExecSpec { program: Program::Argv(vec!["python3".into(), "-c".into(), fetch]), cwd: None, env: vec![], timeout_ms: Some(900_000), stdin: false, tty: None, user: None })
                .await
                .expect("download in the guest");
            assert_eq!(out.code(), 0, "{}", String::from_utf8_lossy(&out.stderr));
            sb.destroy().await;
            (out.stdout_text().trim().parse::<f64>().expect("guest download"), host_secs)
        };
        println!("download of 50 MB through the proxy (guest)  {:>8.1} s   {:>6.1} MB/s; the host from the same server: {:.2} s, {:.0} MB/s", net_secs, 50.0 / net_secs, host_secs, 50.0 / host_secs);

        println!();
        println!("ratios (same run):");
        println!("  cold boot / QEMU floor            {:>7.1}x", cold_p50 / floor_p50);
        println!("  cold boot / template create       {:>7.1}x", cold_p50 / warm_p50);
        if let Some(r) = run_p50 {
            println!("  `run -- true` / template create   {:>7.2}x  (CLI start, first exec and teardown on top of the restore)", r / warm_p50);
        }
        println!("  cold boot / exec round trip       {:>7.0}x  (why a warm sandbox or a template matters)", cold_p50 / rtt_p50);
        println!("  proxy download / host download    {:>7.1}x  (guest Python under the accelerator above, proxy, tunnel)", net_secs / host_secs);
    });
    let _ = std::fs::remove_dir_all(&tmp);
}
