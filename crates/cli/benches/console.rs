//! The web console with 100 sandboxes on a daemon of this build (`bench/run.sh console`):
//! - first paint and first draw of the sandboxes page (all 100 rows) in Debian's Chromium,
//!   the median of BENCH_LOADS (default 10) loads, against the goal of 300 ms;
//! - what the daemon's own CPU costs over BENCH_IDLE_SECS (default 30) with nothing changing:
//!   no page open, one console page open (its event stream), and ten event streams, as a share
//!   of one core, against the goal of 1 % for an open page.

#![allow(clippy::unwrap_used)] // benches fail loudly by design

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{forkbox, Daemon};
use headless_chrome::{Browser, LaunchOptions};

fn chromium() -> std::path::PathBuf {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|n| {
            std::env::split_paths(&paths)
                .map(|d| d.join(n))
                .find(|p| p.is_file())
        })
        .expect("chromium is not installed")
}

/// User + system CPU seconds of a process.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (field(11) + field(12)) / 100.0
}

/// The daemon's share of one core over `secs` seconds, in percent.
fn idle_share(pid: u32, secs: u64) -> f64 {
    let before = cpu_seconds(pid);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    (cpu_seconds(pid) - before) / t.elapsed().as_secs_f64() * 100.0
}

fn cli(d: &Daemon, args: &[&str]) -> String {
    let out = forkbox(&d.paths).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "forkbox {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// An event stream held open with the session `cookie` (read and dropped in a thread).
fn stream(addr: &str, cookie: &str) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /ui/events HTTP/1.1\r\nHost: {addr}\r\nCookie: forkbox_console={cookie}\r\n\r\n"
    )
    .unwrap();
    let mut r = s.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
    });
    s
}

fn main() {
    let loads = std::env::var("BENCH_LOADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10usize);
    let idle_secs = std::env::var("BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30u64);
    let d = Daemon::start("bench-console");
    let pid = forkbox_server::running_pid(&d.paths).unwrap();
    // 100 sandboxes: one, its snapshot, five forks of 20 (the last one replaces the first).
    let t = Instant::now();
    let first = cli(&d, &["sandbox", "create"]).trim().to_string();
    cli(
        &d,
        &["sandbox", "snapshot", &first, "--name", "bench-console"],
    );
    for _ in 0..5 {
        cli(&d, &["sandbox", "fork", "bench-console", "--count", "20"]);
    }
    cli(&d, &["sandbox", "rm", &first]);
    println!(
        "forkbox console bench: 100 sandboxes made in {:.0} s",
        t.elapsed().as_secs_f64()
    );

    let options = LaunchOptions::default_builder()
        .path(Some(chromium()))
        .headless(true)
        .sandbox(false)
        .window_size(Some((1280, 800)))
        .idle_browser_timeout(Duration::from_secs(900))
        .build()
        .unwrap();
    let browser = Browser::new(options).unwrap();
    let tab = browser.new_tab().unwrap();
    tab.navigate_to(&format!("{}/ui/login", d.tcp)).unwrap();
    tab.wait_for_element("#token").unwrap().click().unwrap();
    tab.type_str(&d.token).unwrap().press_key("Enter").unwrap();
    tab.wait_for_element("#rows").unwrap();

    let mut paint = Vec::new();
    let mut drawn = Vec::new();
    for _ in 0..loads {
        tab.navigate_to(&format!("{}/ui/", d.tcp)).unwrap();
        tab.wait_until_navigated().unwrap();
        tab.wait_for_element("#rows").unwrap();
        let v = tab
            .evaluate(
                "JSON.stringify([(performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime, \
                 (performance.getEntriesByName('forkbox-drawn')[0] || {}).startTime, \
                 document.querySelectorAll('#rows tr[data-id]').length])",
                false,
            )
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(v.value.unwrap().as_str().unwrap()).unwrap();
        assert_eq!(v[2], 100, "rows drawn: {v}");
        paint.push(v[0].as_f64().unwrap_or(f64::NAN));
        drawn.push(v[1].as_f64().unwrap());
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (p, dr) = (median(paint), median(drawn));
    println!(
        "first contentful paint, 100 sandboxes: {p:.0} ms median of {loads} (goal 300 ms: {:.2}x of it)",
        p / 300.0
    );
    println!(
        "all 100 rows drawn:                    {dr:.0} ms median (goal 300 ms: {:.2}x of it)",
        dr / 300.0
    );

    // Idle: nothing changes; the daemon samples its VMs every second whatever is open.
    tab.navigate_to("about:blank").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let none = idle_share(pid, idle_secs);
    tab.navigate_to(&format!("{}/ui/", d.tcp)).unwrap();
    tab.wait_for_element("#rows").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let one = idle_share(pid, idle_secs);
    let cookie = tab
        .get_cookies()
        .unwrap()
        .into_iter()
        .find(|c| c.name == "forkbox_console")
        .unwrap()
        .value;
    let addr = d.tcp.trim_start_matches("http://").to_string();
    let held: Vec<_> = (0..9).map(|_| stream(&addr, &cookie)).collect();
    std::thread::sleep(Duration::from_secs(2));
    let ten = idle_share(pid, idle_secs);
    drop(held);
    println!("daemon CPU, idle, 100 sandboxes, over {idle_secs} s each:");
    println!("  no console open:      {none:.2} % of a core");
    println!(
        "  one console page:     {one:.2} % ({:+.2} for the page; goal 1 %)",
        one - none
    );
    println!(
        "  ten event streams:    {ten:.2} % ({:+.2} per stream)",
        (ten - none) / 10.0
    );
    for id in cli(&d, &["sandbox", "ls", "--quiet"]).lines() {
        let _ = forkbox(&d.paths)
            .args(["sandbox", "rm", id.trim()])
            .output();
    }
    let _ = forkbox(&d.paths)
        .args(["snapshot", "rm", "bench-console"])
        .output();
}
