//! The web console in Debian's Chromium against a real daemon on TCP: log in with a token, see a
//! sandbox another process creates appear, run a command and read its output, fork ×3 and see
//! the tree, delete and see it go; no element wider than the viewport at 1280×800 or 390×844;
//! nothing without the session, and no action a page of another origin starts.

#![allow(clippy::unwrap_used)] // a failed step fails the test

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{forkbox, Daemon};
use forkbox_test_infra as infra;
use headless_chrome::protocol::cdp::Emulation;
use headless_chrome::{Browser, LaunchOptions, Tab};

fn chromium() -> std::path::PathBuf {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|n| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(n))
                    .find(|p| p.is_file())
            })
        })
        .expect("chromium is not installed (scripts/test.sh installs Debian's)")
}

fn browser() -> Browser {
    let options = LaunchOptions::default_builder()
        .path(Some(chromium()))
        .headless(true)
        .sandbox(false)
        .window_size(Some((1280, 800)))
        .idle_browser_timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    Browser::new(options).unwrap()
}

/// `expr` (a JavaScript expression) in the page, as JSON.
fn js(tab: &Tab, expr: &str) -> serde_json::Value {
    let v = tab
        .evaluate(&format!("JSON.stringify({expr})"), true)
        .unwrap_or_else(|e| panic!("{expr}: {e}"));
    v.value
        .and_then(|s| s.as_str().map(str::to_string))
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Waits until `expr` is true in the page; how long it took.
fn until(tab: &Tab, expr: &str, limit: Duration) -> Duration {
    let t = Instant::now();
    while t.elapsed() < limit {
        if js(tab, expr) == serde_json::Value::Bool(true) {
            return t.elapsed();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "not within {limit:?}: {expr}\npage: {}",
        js(
            tab,
            "document.getElementById('main') && document.getElementById('main').innerText"
        )
    );
}

/// A raw HTTP/1.1 request to the daemon; the status and the body.
fn http(addr: &str, request: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, out)
}

/// The status of a request's answer, its first line alone (an event stream never ends).
fn status(addr: &str, request: &str) -> u16 {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\r\n") && s.read(&mut b).unwrap_or(0) == 1 {
        line.push(b[0]);
    }
    String::from_utf8_lossy(&line)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn post(addr: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    http(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n{body}",
            body.len()
        ),
    )
}

/// Elements that reach past the viewport's right edge, or the page scrolling sideways.
const OVERFLOW: &str = "(() => { const w = document.documentElement.clientWidth; \
    const wide = [...document.querySelectorAll('body *')].filter(e => { const r = e.getBoundingClientRect(); \
    return r.width > 0 && r.right > w + 1; }).map(e => e.tagName + (e.id ? '#' + e.id : '') + '.' + e.className); \
    if (document.documentElement.scrollWidth > w + 1) wide.push('page scrolls sideways: ' + document.documentElement.scrollWidth + ' > ' + w); \
    return wide.slice(0, 10); })()";

fn viewport(tab: &Tab, width: u32, height: u32, mobile: bool) {
    tab.call_method(Emulation::SetDeviceMetricsOverride {
        width,
        height,
        device_scale_factor: 1.0,
        mobile,
        scale: None,
        screen_width: None,
        screen_height: None,
        position_x: None,
        position_y: None,
        dont_set_visible_size: None,
        screen_orientation: None,
        viewport: None,
        display_feature: None,
        device_posture: None,
    })
    .unwrap();
}

/// Every page at both sizes: nothing wider than the viewport; a screenshot of each kept.
fn no_overflow(tab: &Tab, shots: &std::path::Path) {
    for (w, h, mobile) in [(1280, 800, false), (390, 844, true)] {
        viewport(tab, w, h, mobile);
        for page in ["sandboxes", "tree", "images", "migrations", "host"] {
            tab.evaluate(&format!("location.hash = '#/{page}'"), false)
                .unwrap();
            until(
                tab,
                &format!(
                    "document.querySelector('nav a[aria-current=page]').dataset.page === '{page}'"
                ),
                Duration::from_secs(5),
            );
            let wide = js(tab, OVERFLOW);
            let png = tab
                .capture_screenshot(
                    headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption::Png,
                    None,
                    None,
                    true,
                )
                .unwrap();
            let file = shots.join(format!("console-{page}-{w}x{h}.png"));
            std::fs::write(&file, png).unwrap();
            assert_eq!(
                wide,
                serde_json::json!([]),
                "{page} at {w}×{h} overflows ({})",
                file.display()
            );
        }
    }
    viewport(tab, 1280, 800, false);
    tab.evaluate("location.hash = '#/sandboxes'", false)
        .unwrap();
}

/// Serves one page that posts a form to the console (a page of another origin: another port).
fn hostile_page(target: &str) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let html = format!(
        "<!doctype html><form id=f method=post action=\"{target}\" enctype=\"text/plain\">\
         <input name='{{\"count\":1,\"x' value='\"}}'></form><script>document.getElementById('f').submit()</script>"
    );
    std::thread::spawn(move || {
        for s in l.incoming().flatten().take(4) {
            let mut s = s;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                html.len()
            );
        }
    });
    format!("http://{addr}/")
}

fn login(tab: &Tab, base: &str, token: &str) {
    tab.navigate_to(&format!("{base}/ui/")).unwrap();
    tab.wait_until_navigated().unwrap();
    assert!(tab.get_url().ends_with("/ui/login"), "{}", tab.get_url());
    // A wrong token: the page says so, and no session.
    tab.wait_for_element("#token").unwrap().click().unwrap();
    tab.type_str("fbx_not-a-token")
        .unwrap()
        .press_key("Enter")
        .unwrap();
    until(
        tab,
        "!!document.querySelector('.error')",
        Duration::from_secs(10),
    );
    tab.wait_for_element("#token").unwrap().click().unwrap();
    tab.type_str(token).unwrap().press_key("Enter").unwrap();
    until(
        tab,
        "!!document.getElementById('rows')",
        Duration::from_secs(10),
    );
    until(
        tab,
        "document.getElementById('live').textContent === 'live'",
        Duration::from_secs(10),
    );
}

#[test]
fn the_console_shows_sandboxes_live_and_acts_on_them() {
    let d = Daemon::start("console");
    let addr = d.tcp.trim_start_matches("http://").to_string();
    // Nothing of the console without a session, not even with the API's token.
    let (s, out) = http(
        &addr,
        &format!("GET /ui/ HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(s, 303, "{out}");
    assert!(out.contains("location: /ui/login"), "{out}");
    for path in ["/ui/events", "/ui/api/v1/sandboxes"] {
        let s = status(
            &addr,
            &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n", d.token),
        );
        assert_eq!(s, 401, "{path}");
    }

    let b = browser();
    let tab = b.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(30));
    login(&tab, &d.tcp, &d.token);

    // A sandbox created by another process shows up without the page asking.
    let out = forkbox(&d.paths)
        .args(["sandbox", "create", "--label", "who=console-test"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let seen = until(
        &tab,
        &format!("!!document.querySelector('tr[data-id=\"{id}\"]')"),
        Duration::from_secs(10),
    );
    println!(
        "FIGURE console: {id} shown {} ms after `sandbox create` returned",
        seen.as_millis()
    );
    assert!(seen < Duration::from_secs(1), "shown after {seen:?}");

    println!("step: a command");
    // A command from the console, its output streamed into the page.
    tab.wait_for_element(&format!("tr[data-id=\"{id}\"]"))
        .unwrap()
        .click()
        .unwrap();
    tab.wait_for_element("#command").unwrap().click().unwrap();
    tab.type_str("echo hello-from-the-console; python3 -c 'print(6*7)'")
        .unwrap()
        .press_key("Enter")
        .unwrap();
    until(
        &tab,
        "document.getElementById('output').textContent === 'hello-from-the-console\\n42\\n'",
        Duration::from_secs(60),
    );
    until(
        &tab,
        "document.getElementById('message').textContent.startsWith('exit 0')",
        Duration::from_secs(10),
    );

    println!("step: fork x3");
    // Fork ×3: three copies in the table and under one snapshot in the tree.
    tab.evaluate("document.getElementById('fork-count').value = '3'", false)
        .unwrap();
    tab.wait_for_element("#fork").unwrap().click().unwrap();
    until(
        &tab,
        "document.getElementById('message').textContent.startsWith('3 copies of ')",
        Duration::from_secs(180),
    );
    let snapshot = js(
        &tab,
        "document.getElementById('message').textContent.split(' ')[3]",
    );
    let snapshot = snapshot.as_str().unwrap().to_string();
    until(
        &tab,
        "document.querySelectorAll('#rows tr[data-id]').length === 4",
        Duration::from_secs(10),
    );
    tab.evaluate("location.hash = '#/tree'", false).unwrap();
    until(
        &tab,
        &format!("document.querySelectorAll('li[data-key=\"b:{id}\"] li[data-key=\"s:{snapshot}\"] > ul > li[data-key^=\"b:\"]').length === 3"),
        Duration::from_secs(10),
    );

    println!("step: delete");
    // Delete one copy from the console; it goes from the table and the tree.
    tab.evaluate("location.hash = '#/sandboxes'", false)
        .unwrap();
    let copy = js(&tab, &format!("[...document.querySelectorAll('#rows tr[data-id]')].map(r => r.dataset.id).find(i => i !== '{id}')"));
    let copy = copy.as_str().unwrap().to_string();
    tab.wait_for_element(&format!("tr[data-id=\"{copy}\"]"))
        .unwrap()
        .click()
        .unwrap();
    tab.evaluate("window.confirm = () => true", false).unwrap();
    tab.wait_for_element("#delete").unwrap().click().unwrap();
    until(
        &tab,
        &format!("!document.querySelector('tr[data-id=\"{copy}\"]')"),
        Duration::from_secs(60),
    );

    println!("step: overflow");
    no_overflow(&tab, &std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")));

    println!("step: csrf");
    // The session's cookie alone does not act: the CSRF token is needed, and an Origin of
    // this daemon when one is sent.
    let cookie = tab
        .get_cookies()
        .unwrap()
        .into_iter()
        .find(|c| c.name == "forkbox_console")
        .expect("the session cookie");
    assert!(cookie.http_only);
    let csrf = js(
        &tab,
        "document.querySelector('meta[name=\"forkbox-csrf\"]').content",
    );
    let csrf = csrf.as_str().unwrap();
    let hib = format!("/ui/api/v1/sandboxes/{copy}/hibernate");
    let c = format!("Cookie: forkbox_console={}\r\n", cookie.value);
    println!("step: no csrf token");
    let (s, out) = post(&addr, &hib, &c, "");
    assert_eq!(s, 403, "{out}");
    println!("step: foreign origin");
    let (s, out) = post(
        &addr,
        &hib,
        &format!("{c}X-Forkbox-CSRF: {csrf}\r\nOrigin: http://evil.example\r\n"),
        "",
    );
    assert_eq!(s, 403, "{out}");
    let (s, out) = post(&addr, &hib, &format!("{c}X-Forkbox-CSRF: wrong\r\n"), "");
    assert_eq!(s, 403, "{out}");

    // A page of another origin posting a form, in the same browser (its cookie would go: the
    // same site): refused, nothing made.
    println!("step: another origin's form");
    let before = js(
        &tab,
        "document.querySelectorAll('#rows tr[data-id]').length",
    );
    let evil = b.new_tab().unwrap();
    evil.navigate_to(&hostile_page(&format!(
        "{}/ui/api/v1/sandboxes/{id}/fork",
        d.tcp
    )))
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let body = evil.get_content().unwrap_or_default();
    assert!(
        body.contains("permission_denied") || body.contains("CSRF"),
        "{body}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        js(
            &tab,
            "document.querySelectorAll('#rows tr[data-id]').length"
        ),
        before
    );
    evil.close(false).unwrap();
    tab.activate().unwrap();

    println!("step: log out");
    // Logging out ends the session.
    tab.evaluate("document.getElementById('logout').click()", false)
        .unwrap();
    until(
        &tab,
        "location.pathname === '/ui/login'",
        Duration::from_secs(10),
    );
    println!("step: the session is gone");
    let events = format!("GET /ui/events HTTP/1.1\r\nHost: {addr}\r\n{c}Connection: close\r\n\r\n");
    assert_eq!(status(&addr, &events), 401);

    for v in infra::run_entries(&d.paths)
        .into_iter()
        .filter(|e| e.starts_with("sb-"))
    {
        let _ = forkbox(&d.paths).args(["sandbox", "rm", &v]).output();
    }
}

/// `forkbox migrate` of examples/legacykit (Python 3.9 → 3.13, three plans) beside a daemon:
/// its console shows the run while it goes, then its verdicts and its report.
#[test]
fn a_migration_shows_live_to_its_verdicts() {
    let d = Daemon::start("console-migrate");
    let b = browser();
    let tab = b.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(30));
    login(&tab, &d.tcp, &d.token);
    tab.evaluate("location.hash = '#/migrations'", false)
        .unwrap();
    until(
        &tab,
        "document.querySelector('nav a[aria-current=page]').dataset.page === 'migrations'",
        Duration::from_secs(5),
    );

    // Runs of earlier test runs on this home may be listed.
    let before = js(
        &tab,
        "[...document.querySelectorAll('[data-run]')].map(e => e.dataset.run)",
    );
    let out = tempfile::tempdir().unwrap();
    let log = out.path().join("migrate.log");
    let mut run = forkbox(&d.paths)
        .current_dir(infra::repo_root())
        .args(["migrate", "--config", "examples/migration.toml", "--out"])
        .arg(out.path().join("out"))
        .stdout(std::fs::File::create(out.path().join("migrate.out")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    println!("step: migrate started");
    // Live: the run appears while it runs (above those of earlier test runs),
    // and a plan's phase moves on before the end.
    let known = format!("{before}");
    until(
        &tab,
        &format!("(() => {{ const r = document.querySelector('[data-run]'); return !!r && !{known}.includes(r.dataset.run) && r.querySelector('.run-state').textContent === 'running'; }})()"),
        Duration::from_secs(300),
    );
    let id = js(&tab, "document.querySelector('[data-run]').dataset.run");
    let run_sel = format!("[data-run=\"{}\"]", id.as_str().unwrap());
    let q = |rest: &str| format!("document.querySelector('{run_sel}{rest}')");
    until(
        &tab,
        &format!(
            "[...document.querySelectorAll('{run_sel} tr[data-plan] td:nth-child(2)')].some(td => td.textContent !== 'waiting') && {}.textContent === 'running'",
            q(" .run-state")
        ),
        Duration::from_secs(600),
    );
    println!("step: a plan moved on, live");
    let status = run.wait().unwrap();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "migrate: {status}\n{said}");
    println!("step: migrate ended");
    // Its verdicts as the run decided them.
    until(
        &tab,
        &format!("{}.textContent === 'done'", q(" .run-state")),
        Duration::from_secs(30),
    );
    let verdicts = js(&tab, &format!("Object.fromEntries([...document.querySelectorAll('{run_sel} tr[data-plan]')].map(r => [r.dataset.plan, r.querySelector('.verdict') && r.querySelector('.verdict').textContent]))"));
    assert_eq!(
        verdicts,
        serde_json::json!({"minimal": "accepted", "modernize": "accepted", "wrong": "rejected"})
    );
    let lost = js(
        &tab,
        &format!(
            "{}.textContent",
            q(" tr[data-plan=\"wrong\"] td:nth-child(7)")
        ),
    );
    assert!(lost.as_str().unwrap().contains("test_compare"), "{lost}");
    assert_eq!(
        js(&tab, &format!("{}.textContent", q(" .winner"))),
        "Winner: minimal"
    );
    assert!(js(&tab, &format!("{}.textContent", q(" .steps")))
        .as_str()
        .unwrap()
        .contains("baseline 1/2: done"));
    let href = js(
        &tab,
        &format!("{}.getAttribute('href')", q(" a[href$=\"/report\"]")),
    );
    let report = b.new_tab().unwrap();
    // Its report, served by the daemon in a document of its own.
    // (Tabs share the browser's cookies: the session goes with it.)
    report
        .navigate_to(&format!("{}{}", d.tcp, href.as_str().unwrap()))
        .unwrap();
    report.wait_until_navigated().unwrap();
    let html = report.get_content().unwrap();
    assert!(html.contains("Winner: minimal"), "{html}");
    report.close(false).unwrap();
    tab.activate().unwrap();
    no_overflow(&tab, &std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
}

/// The console of any node of a cluster lists every node's sandboxes (each with its node),
/// snapshots and migrations, and its actions go to the owner: a sandbox of node a, seen and
/// forked from the console of node c, and a run registered with a on c's migrations page. (On the host's loopback, where Chromium reaches the nodes.)
#[test]
fn the_console_of_any_node_shows_the_cluster_and_acts_on_the_owner() {
    use common::cluster::{Node, TestCluster};
    use forkbox_test_infra::cluster_net::ClusterNet;
    let c = TestCluster::start_on(ClusterNet::loopback(3), |name, ns, addr, endpoints| {
        Node::new("console-cluster", name, ns, addr, endpoints, &[])
    });
    let (a, node_c) = (&c.nodes[0], &c.nodes[2]);
    let (id, on) = a.create(&["--node", "a", "--ttl", "20m"]);
    assert_eq!(on, "a");
    let token = a.ok(&["token", "create", "--name", "ui", "--cluster", &c.endpoints]);
    let base = format!("http://{}:7070", node_c.addr);

    let b = browser();
    let tab = b.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(30));
    login(&tab, &base, token.trim());
    let node_of = |id: &str| {
        format!(
            "(document.querySelector('tr[data-id=\"{id}\"] td[data-label=\"Node\"]') || {{}}).textContent"
        )
    };
    until(
        &tab,
        &format!("{} === 'a'", node_of(&id)),
        Duration::from_secs(20),
    );

    println!("step: fork from c's console");
    tab.wait_for_element(&format!("tr[data-id=\"{id}\"]"))
        .unwrap()
        .click()
        .unwrap();
    tab.evaluate("document.getElementById('fork-count').value = '1'", false)
        .unwrap();
    tab.wait_for_element("#fork").unwrap().click().unwrap();
    until(
        &tab,
        "document.getElementById('message').textContent.startsWith('1 copies of ')",
        Duration::from_secs(180),
    );
    let snapshot = js(
        &tab,
        "document.getElementById('message').textContent.split(' ')[3]",
    );
    let snapshot = snapshot.as_str().unwrap().to_string();
    // The copy is a's (a fork of a sandbox is made on its owner), listed on c with its node,
    // and the snapshot it came from is in c's fork tree as a's.
    let listed = node_c.ls();
    let copy = listed
        .iter()
        .find(|(i, _, _)| *i != id)
        .unwrap_or_else(|| panic!("no copy listed: {listed:?}"))
        .clone();
    assert_eq!(copy.2, "a", "{listed:?}");
    until(
        &tab,
        &format!("{} === 'a'", node_of(&copy.0)),
        Duration::from_secs(20),
    );
    tab.evaluate("location.hash = '#/tree'", false).unwrap();
    until(
        &tab,
        &format!(
            "(document.querySelector('li[data-key=\"s:{snapshot}\"] > .node') || {{}}).textContent.includes('on a')"
        ),
        Duration::from_secs(20),
    );

    // A run of `forkbox migrate` registered with node a is on c's migrations page, as a's.
    let body = serde_json::json!({
        "code": "/srv/app", "from": "python-bookworm@1", "to": "python-trixie@1",
        "test": "pytest", "plans": ["bump"], "pid": std::process::id(),
    });
    let o = std::process::Command::new("curl")
        .args([
            "-sS",
            "--fail-with-body",
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
        ])
        .args(["-H", &format!("authorization: Bearer {}", token.trim())])
        .args(["-d", &body.to_string()])
        .arg(format!("http://{}:7070/v1/migrations", a.addr))
        .output()
        .unwrap();
    let run: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| {
        panic!(
            "register a run on a: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let run = run["id"].as_str().unwrap().to_string();
    tab.evaluate("location.hash = '#/migrations'", false)
        .unwrap();
    until(
        &tab,
        &format!(
            "(document.querySelector('section[data-run=\"{run}\"] .run-node') || {{}}).textContent === ' on a'"
        ),
        Duration::from_secs(20),
    );
    for s in [&id, &copy.0] {
        node_c.ok(&["sandbox", "rm", s]);
    }
}
