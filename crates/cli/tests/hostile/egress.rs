//! Egress: every way a guest might reach the host, its loopback, link-local and metadata
//! services, or a host its allow list does not name. Listeners run on the host's loopback or
//! in network namespaces the tests make, never on the internet; each must see nothing.

use std::io::Read;
use std::net::TcpListener;

use forkbox_test_infra as infra;

use crate::Daemon;

/// Asks the guest's proxy for each `host:port` with CONNECT; prints `TARGET STATUS-LINE`.
const CONNECT: &str = r#"
import socket, sys
for t in sys.argv[1:]:
    s = socket.create_connection(('127.0.0.1', 3128), timeout=60)
    s.sendall(('CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n' % (t, t)).encode())
    got = b''
    while b'\r\n' not in got:
        more = s.recv(4096)
        if not more:
            break
        got += more
    if b' 200 ' not in got.split(b'\r\n')[0]:
        s.settimeout(10)
        try:
            while True:
                more = s.recv(4096)
                if not more:
                    break
                got += more
        except OSError:
            pass
    text = got.decode(errors='replace')
    line = text.split('\r\n')[0] + ' | ' + text.split('\r\n\r\n', 1)[-1].strip().replace('\n', ' ')
    print(t, '=>', line, flush=True)
    s.close()
"#;

/// CONNECT results for `targets` from inside sandbox `id`, one line each.
fn connect(d: &Daemon, id: &str, targets: &[String]) -> Vec<String> {
    let script = crate::put(d, id, "connect.py", CONNECT.as_bytes());
    let mut args = vec!["sandbox", "exec", id, "--", "python3"];
    let script = script.display().to_string();
    args.push(&script);
    args.extend(targets.iter().map(String::as_str));
    let out = d.cli(&args);
    assert!(out.status.success(), "{}", crate::text(&out.stderr));
    crate::text(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// A listener on the host that records whether anything connected.
struct Witness {
    l: TcpListener,
}

impl Witness {
    fn on(addr: &str) -> Witness {
        let l = TcpListener::bind(addr).unwrap();
        l.set_nonblocking(true).unwrap();
        Witness { l }
    }
    fn port(&self) -> u16 {
        self.l.local_addr().unwrap().port()
    }
    /// Whether anyone connected (and sent anything).
    fn saw_anyone(&self) -> bool {
        match self.l.accept() {
            Ok((mut s, _)) => {
                let mut b = [0u8; 16];
                let _ = s.read(&mut b);
                true
            }
            Err(_) => false,
        }
    }
}

/// Every answer is the host's refusal (the proxy's 403 carries the host's reason).
fn refused(lines: &[String]) {
    for l in lines {
        println!("{l}");
        assert!(
            l.contains("=> HTTP/1.1 403 "),
            "not refused by the host: {l}"
        );
    }
}

/// The host's loopback in every spelling an URL parser or resolver accepts. Promise: all
/// refused, the listener sees nothing.
#[test]
fn the_hosts_loopback_is_unreachable_in_every_encoding() {
    let d = Daemon::start("egress-loopback");
    let id = d.create(&["--internet"]);
    let w = Witness::on("127.0.0.1:0");
    let p = w.port();
    let targets: Vec<String> = [
        "127.0.0.1",
        "127.1",
        "127.000.000.001",
        "0177.0.0.1",
        "0x7f000001",
        "2130706433",
        "0x7f.0.0.1",
        "127.255.255.254",
        "localhost",
        "LOCALHOST.",
        "localhost.localdomain",
        "0.0.0.0",
        "0",
    ]
    .iter()
    .map(|h| format!("{h}:{p}"))
    .collect();
    let lines = connect(&d, &id, &targets);
    assert_eq!(lines.len(), targets.len(), "{lines:?}");
    refused(&lines);
    assert!(!w.saw_anyone(), "the host's loopback was reached");
}

/// IPv6 forms of the host: loopback, IPv4-mapped and NAT64 loopback, unspecified. Promise:
/// refused.
#[test]
fn ipv6_forms_of_the_host_are_refused() {
    let d = Daemon::start("egress-ipv6");
    let id = d.create(&["--internet"]);
    let w = Witness::on("127.0.0.1:0");
    let p = w.port();
    let targets: Vec<String> = [
        "[::1]",
        "[0:0:0:0:0:0:0:1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[64:ff9b::7f00:1]",
        "[::]",
        "[::ffff:0.0.0.0]",
        "ip6-localhost",
    ]
    .iter()
    .map(|h| format!("{h}:{p}"))
    .collect();
    refused(&connect(&d, &id, &targets));
    assert!(!w.saw_anyone());
}

/// The host's own addresses on its other interfaces (here, a veth the test makes). Promise:
/// refused, the listener there sees nothing.
#[test]
fn the_hosts_own_addresses_are_refused() {
    let net = infra::TestNet::new();
    let d = Daemon::start("egress-own");
    let id = d.create(&["--internet"]);
    let w = Witness::on(&format!("{}:0", net.host_ip));
    let targets = vec![format!("{}:{}", net.host_ip, w.port())];
    let lines = connect(&d, &id, &targets);
    refused(&lines);
    assert!(lines[0].contains("never reach"), "{lines:?}");
    assert!(!w.saw_anyone());
}

/// Metadata services of the major clouds (AWS, GCP, Azure, DigitalOcean, OpenStack at
/// 169.254.169.254; Alibaba 100.100.100.200; Azure's wire server; Oracle; AWS's IPv6
/// endpoint), and link-local in general. Promise: refused for what they are, before any
/// connection is tried.
#[test]
fn cloud_metadata_addresses_are_refused() {
    let d = Daemon::start("egress-metadata");
    let id = d.create(&["--internet"]);
    let targets: Vec<String> = [
        "169.254.169.254:80",
        "169.254.170.2:80",
        "100.100.100.200:80",
        "168.63.129.16:80",
        "192.0.0.192:80",
        "[fd00:ec2::254]:80",
        "[fe80::a9fe:a9fe]:80",
        "[::ffff:169.254.169.254]:80",
        "metadata.google.internal:80",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let lines = connect(&d, &id, &targets);
    refused(&lines);
    for l in &lines {
        // Refused by the address rule or (for the name) because it does not resolve here;
        // never a connection attempt that timed out.
        assert!(l.contains("never reach") || l.contains("resolve"), "{l}");
    }
}

/// Names and ports around an allow list: suffix and prefix tricks, another port of the
/// allowed host, its address in another spelling. Promise: only the exact entry passes.
#[test]
fn allow_list_tricks_are_refused() {
    let mut net = infra::TestNet::new();
    let ok = net.peer_ips[0].clone();
    let web = tempfile::tempdir().unwrap();
    net.serve(&ok, 8080, web.path());
    let d = Daemon::start("egress-allow");
    let id = d.create(&[
        "--allow",
        &format!("{ok}:8080"),
        "--allow",
        "*.allowed.test",
    ]);
    let octets: Vec<u32> = ok.split('.').map(|o| o.parse().unwrap()).collect();
    let as_int = octets.iter().fold(0u32, |a, o| a * 256 + o);
    let targets = vec![
        format!("{ok}:8081"),
        format!("{ok}:22"),
        format!("{as_int}:8080"),
        format!(
            "0{}.{}.{}.{}:8080",
            octets[0], octets[1], octets[2], octets[3]
        ),
        format!("{ok}.nip.io:8080"),
        "allowed.test:443".into(),
        "evilallowed.test:443".into(),
        "allowed.test.evil.example:443".into(),
        "x.allowed.test:22".into(),
    ];
    let lines = connect(&d, &id, &targets);
    refused(&lines);
    // The exact entry does pass, so the refusals above are the rules', not a broken proxy.
    let pass = connect(&d, &id, &[format!("{ok}:8080")]);
    assert!(pass[0].contains(" 200 "), "{pass:?}");
}

/// A sandbox with the network off. Promise: no device but loopback, no proxy, no resolver
/// (nor the build host's in `/etc/resolv.conf`), UDP and TCP to anywhere unreachable, and a
/// host listener sees nothing.
#[test]
fn with_the_network_off_nothing_leaves_the_guest() {
    let net = infra::TestNet::new();
    let d = Daemon::start("egress-off");
    let id = d.create(&[]);
    let w = Witness::on(&format!("{}:0", net.host_ip));
    let code = format!(
        r#"
import os, socket
print(sorted(os.listdir('/sys/class/net')))
for fam, addr in [(socket.AF_INET, ('{ip}', {port})), (socket.AF_INET, ('127.0.0.1', 3128)), (socket.AF_INET6, ('::1', 3128))]:
    try:
        socket.create_connection(addr[:2], timeout=5); print('tcp open', addr)
    except OSError as e:
        print('tcp refused', addr[0], e.errno)
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.sendto(b'x', ('{ip}', 53)); print('udp sent')
except OSError as e:
    print('udp refused', e.errno)
try:
    socket.getaddrinfo('example.org', 80); print('resolved')
except OSError as e:
    print('no resolver')
print('nameservers', [l for l in open('/etc/resolv.conf') if l.startswith('nameserver')])
"#,
        ip = net.host_ip,
        port = w.port()
    );
    let out = d.py(&id, &code);
    assert!(out.starts_with("['lo']"), "{out}");
    // The image names no resolver of the host that built it.
    assert!(out.contains("nameservers []"), "{out}");
    assert!(
        !out.contains("tcp open") && !out.contains("udp sent") && !out.contains("resolved"),
        "{out}"
    );
    assert!(!w.saw_anyone());
}
