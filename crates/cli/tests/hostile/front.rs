//! The daemon's front door: who may drive sandboxes, on the Unix socket and on TCP. None of
//! these boots a VM.

use std::io::{Read, Write};
use std::time::Duration;

use crate::{text, Daemon};

/// A raw `GET path` on TCP with `headers`; the whole reply.
pub fn tcp_get(addr: &str, path: &str, headers: &[(&str, &str)]) -> String {
    raw(addr, "GET", path, headers)
}

fn raw(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req += &format!("Host: {addr}\r\n");
    }
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return String::new();
    }
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply
}

/// A daemon that also listens on TCP, with a token for it.
pub struct Tcp {
    pub d: Daemon,
    pub addr: String,
    pub token: String,
}

pub fn tcp_daemon(name: &str) -> Tcp {
    let paths = Daemon::home(name);
    // A port per test process, below the ephemeral range (32768 up) that connections use.
    let port = 20000 + (std::process::id() % 12000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let mut c = Daemon::cmd(&paths);
    c.args(["serve", "--listen", &addr])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let d = Daemon::spawn(paths, c);
    assert!(forkbox_test_infra::wait_until(
        Duration::from_secs(10),
        || { std::net::TcpStream::connect(&addr).is_ok() }
    ));
    let token = text(&d.cli(&["token", "create", "--name", "hostile"]).stdout)
        .trim()
        .to_string();
    assert!(token.starts_with("fbx_"), "{token}");
    Tcp { d, addr, token }
}

/// No token, a wrong one, one cut short, another scheme, the token in the query. Promise:
/// 401 every time; the right token passes.
#[test]
fn requests_without_the_right_bearer_token_are_refused() {
    let t = tcp_daemon("auth-tokens");
    let cut = &t.token[..t.token.len() - 1];
    let cases: Vec<Vec<(&str, String)>> = vec![
        vec![],
        vec![("Authorization", "Bearer fbx_0000".into())],
        vec![("Authorization", format!("Bearer {cut}"))],
        vec![("Authorization", format!("Basic {}", t.token))],
        vec![("Authorization", format!("bearer{}", t.token))],
        vec![("Authorization", "Bearer ".into())],
        vec![("Cookie", format!("token={}", t.token))],
    ];
    for h in &cases {
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = tcp_get(&t.addr, "/v1/sandboxes", &h);
        assert!(r.starts_with("HTTP/1.1 401"), "{h:?}: {r}");
    }
    let r = tcp_get(&t.addr, &format!("/v1/sandboxes?token={}", t.token), &[]);
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
    let bearer = format!("Bearer {}", t.token);
    let r = tcp_get(&t.addr, "/v1/sandboxes", &[("Authorization", &bearer)]);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    drop(t.d);
}

/// A DNS-rebinding page: the browser sends the attacker's name as `Host`. Promise: refused
/// even with a valid token (421), while an address or localhost passes.
#[test]
fn dns_rebinding_hosts_are_refused() {
    let t = tcp_daemon("auth-rebinding");
    let bearer = format!("Bearer {}", t.token);
    for host in [
        "evil.example",
        "evil.example:7070",
        "127.0.0.1.evil.example",
        "localhost.evil.example",
    ] {
        let r = tcp_get(
            &t.addr,
            "/v1/health",
            &[("Host", host), ("Authorization", &bearer)],
        );
        assert!(r.starts_with("HTTP/1.1 421"), "{host}: {r}");
    }
    for host in ["localhost", &t.addr.clone()] {
        let r = tcp_get(
            &t.addr,
            "/v1/health",
            &[("Host", host), ("Authorization", &bearer)],
        );
        assert!(r.starts_with("HTTP/1.1 200"), "{host}: {r}");
    }
}

/// A web page calling the API (an `Origin`), and its CORS preflight. Promise: refused, and no
/// `Access-Control-Allow-*` is ever granted.
#[test]
fn web_pages_get_no_cors_grant_and_are_refused() {
    let t = tcp_daemon("auth-cors");
    let bearer = format!("Bearer {}", t.token);
    let r = tcp_get(
        &t.addr,
        "/v1/sandboxes",
        &[
            ("Origin", "https://evil.example"),
            ("Authorization", &bearer),
        ],
    );
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    let r = raw(
        &t.addr,
        "OPTIONS",
        "/v1/sandboxes",
        &[
            ("Origin", "https://evil.example"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization"),
        ],
    );
    assert!(!r.starts_with("HTTP/1.1 2"), "{r}");
    assert!(
        !r.to_ascii_lowercase().contains("access-control-allow"),
        "{r}"
    );
}

/// Another local user. Promise: the Unix socket is its owner's alone (0600 in a 0700 home).
#[test]
fn the_unix_socket_is_its_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start("auth-socket");
    let socket = forkbox_server::socket_path(&d.paths);
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "python3",
            "-c",
        ])
        .arg(format!(
            "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); print('connected')",
            socket.display().to_string()
        ))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "user nobody connected: {}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("Permission denied"),
        "{}",
        text(&out.stderr)
    );
}
