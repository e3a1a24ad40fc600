//! Helpers shared by the benches (`mod common;` in each).
#![allow(dead_code)] // each bench uses its own subset

use std::time::{Duration, Instant};

/// The runtime every bench runs on: two workers, as the machines it is measured on have two
/// cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A count from the environment (`BENCH_*`), or `default`.
pub fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// (median, p99, min) of some figures.
pub fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (pct(0.5), pct(0.99), v[0])
}

/// QEMU start-up doing nothing, to its QMP greeting: the floor every VM pays.
pub async fn qemu_floor(dir: &std::path::Path) -> Duration {
    let sock = dir.join("floor.qmp");
    let _ = std::fs::remove_file(&sock);
    let start = Instant::now();
    use forkbox_engine::vm::program;
    let mut child = tokio::process::Command::new(program::program().expect("a QEMU"))
        .args(program::firmware_args())
        .envs(program::module_env())
        .args([
            "-M",
            "microvm",
            "-accel",
            "tcg",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-S",
            "-qmp",
        ])
        .arg(format!("unix:{},server=on,wait=off", sock.display()))
        .kill_on_drop(true)
        .spawn()
        .expect("start qemu");
    loop {
        if let Ok(s) = tokio::net::UnixStream::connect(&sock).await {
            let mut buf = [0u8; 64];
            s.readable().await.ok();
            let _ = s.try_read(&mut buf);
            break;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let d = start.elapsed();
    let _ = child.kill().await;
    d
}

/// Host memory a process accounts for: its proportional set size, in KiB.
pub fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Pss:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Runs a shell script in the sandbox and requires it to succeed.
pub async fn ok(sb: &forkbox_engine::sandbox::Sandbox, script: &str) {
    let out = sb
        .run(forkbox_test_infra::sh(script, Some(600_000)))
        .await
        .expect("exec");
    assert_eq!(
        out.code(),
        0,
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
