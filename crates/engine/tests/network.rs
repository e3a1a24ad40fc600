//! Network policy end to end: the guest's proxy, the host's decisions, real listeners in a
//! network namespace each test makes (never the internet). Needs root and `ip`. Costs: one
//! restore per test (~0.3 s) plus the Python programs in the guest (~1-3 s each under TCG);
//! the fork test adds a snapshot (~3 s).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use forkbox_engine::api::{ops, CreateRequest, Engine, ForkRequest};
use forkbox_engine::net::NetworkPolicy;
use forkbox_engine::sandbox::Sandbox;
use forkbox_test_infra as infra;

async fn py(sb: &Sandbox, code: &str) -> String {
    let out = sb
        .run(infra::argv(&["python3", "-c", code], &[], 120_000))
        .await
        .unwrap();
    assert_eq!(out.code(), 0, "{}", String::from_utf8_lossy(&out.stderr));
    out.stdout_text()
}

/// Fetches each URL through the environment's proxy; prints `ok URL BODY` or `no URL CODE BODY`.
const FETCH: &str = r#"
import sys, urllib.request
for u in sys.argv[1:]:
    try:
        print('ok', u, urllib.request.urlopen(u, timeout=30).read().decode().strip())
    except urllib.error.HTTPError as e:
        print('no', u, e.code, e.read().decode().strip())
    except Exception as e:
        print('no', u, 'error', e)
"#;

async fn fetch(sb: &Sandbox, urls: &[String]) -> String {
    let code = format!("import sys; sys.argv = [''] + {urls:?}\n{FETCH}",);
    py(sb, &code).await
}

fn policy(allow: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        internet: false,
        allow: allow.iter().map(|s| s.to_string()).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_allow_list_only_the_allowed_host_answers() {
    let (paths, mut cfg) = infra::sandbox_setup("python-bookworm");
    let web = tempfile::tempdir().unwrap();
    std::fs::write(web.path().join("ok.txt"), "hello from the allowed host").unwrap();
    let mut net = infra::TestNet::new();
    let [allowed, other] = net.peer_ips.clone();
    let allowed_log = net.serve(&allowed, 8080, web.path());
    let other_log = net.serve(&other, 8080, web.path());
    // A listener on the host's loopback, named in the allow list: still never reachable.
    let local = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    local.set_nonblocking(true).unwrap();
    let local_port = local.local_addr().unwrap().port();

    cfg.network = policy(&[
        &format!("{allowed}:8080"),
        &format!("127.0.0.1:{local_port}"),
        &format!("localhost:{local_port}"),
    ]);
    let sb = Sandbox::create(&paths, &cfg).await.unwrap();
    let out = fetch(
        &sb,
        &[
            format!("http://{allowed}:8080/ok.txt"),
            format!("http://{other}:8080/ok.txt"),
            format!("http://{allowed}:8081/ok.txt"),
        ],
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        format!("ok http://{allowed}:8080/ok.txt hello from the allowed host"),
        "{out}"
    );
    assert!(
        lines[1].contains(" 403 forkbox: ")
            && lines[1].contains("not in this sandbox's allow list"),
        "{out}"
    );
    assert!(lines[2].contains(" 403 "), "{out}");
    // CONNECT (what HTTPS uses) to the host's loopback by address and by name: refused.
    let connect = py(
        &sb,
        &format!(
            "import http.client\n\
             for h in ['127.0.0.1', 'localhost']:\n\
             \x20   c = http.client.HTTPConnection('127.0.0.1', 3128, timeout=30)\n\
             \x20   c.set_tunnel(h, {local_port})\n\
             \x20   try:\n\
             \x20       c.request('GET', '/'); print('REACHED', h)\n\
             \x20   except OSError as e:\n\
             \x20       print('refused', h, e)\n"
        ),
    )
    .await;
    assert!(!connect.contains("REACHED"), "{connect}");
    assert_eq!(connect.matches("refused").count(), 2, "{connect}");
    assert!(
        local.accept().is_err(),
        "nothing reached the host's loopback"
    );
    // The host counted what it refused: the other host, the other port, loopback twice.
    assert_eq!(sb.client().net.counts().refused, 4);
    let seen = std::fs::read_to_string(&allowed_log).unwrap();
    assert_eq!(seen.matches("GET /ok.txt").count(), 1, "{seen}");
    assert_eq!(
        std::fs::read_to_string(&other_log).unwrap(),
        "",
        "the other host saw nothing"
    );
    sb.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internet_reaches_other_hosts_but_never_the_host_or_metadata() {
    let (paths, mut cfg) = infra::sandbox_setup("python-bookworm");
    let web = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..20_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(web.path().join("big.bin"), &big).unwrap();
    std::fs::write(web.path().join("ok.txt"), "outside").unwrap();
    let mut net = infra::TestNet::new();
    let outside = net.peer_ips[0].clone();
    net.serve(&outside, 8080, web.path());
    // The host's own address on the test network, with a listener.
    let host_listener = std::net::TcpListener::bind(format!("{}:0", net.host_ip)).unwrap();
    host_listener.set_nonblocking(true).unwrap();
    let host_port = host_listener.local_addr().unwrap().port();

    cfg.network = NetworkPolicy {
        internet: true,
        allow: vec![],
    };
    let sb = Sandbox::create(&paths, &cfg).await.unwrap();
    let out = fetch(
        &sb,
        &[
            format!("http://{outside}:8080/ok.txt"),
            format!("http://{}:{host_port}/", net.host_ip),
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "http://[fe80::1]:80/".to_string(),
        ],
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        format!("ok http://{outside}:8080/ok.txt outside"),
        "{out}"
    );
    for l in &lines[1..] {
        assert!(
            l.contains(" 403 forkbox: ") && l.contains("may never reach"),
            "{out}"
        );
    }
    assert!(
        host_listener.accept().is_err(),
        "nothing reached the host's address"
    );
    // 20 MB through a CONNECT tunnel arrives whole (flow control both ways).
    let got = py(
        &sb,
        &format!(
            "import http.client, hashlib\n\
             c = http.client.HTTPConnection('127.0.0.1', 3128, timeout=60)\n\
             c.set_tunnel('{outside}', 8080)\n\
             c.request('GET', '/big.bin'); d = c.getresponse().read()\n\
             print(len(d), hashlib.sha256(d).hexdigest())"
        ),
    )
    .await;
    use sha2::Digest;
    let want = format!("{} {:x}\n", big.len(), sha2::Sha256::digest(&big));
    assert_eq!(got, want);
    sb.destroy().await;
}

/// A restore, a snapshot and a fork through the daemon's engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_keep_the_network_of_their_sandbox_and_bad_policies_are_refused() {
    let (paths, cfg) = infra::sandbox_setup("python-bookworm");
    let engine = Engine::private(paths.clone());
    let bad = engine
        .call(ops::Create {
            request: CreateRequest {
                image: Some(cfg.image.to_string()),
                network: Some(policy(&["pypi.org/simple"])),
                ..Default::default()
            },
        })
        .await;
    let e = bad.err().unwrap().to_string();
    assert!(e.contains("pypi.org/simple"), "{e}");

    let web = tempfile::tempdir().unwrap();
    std::fs::write(web.path().join("ok.txt"), "for forks").unwrap();
    let mut net = infra::TestNet::new();
    let host = net.peer_ips[1].clone();
    net.serve(&host, 8080, web.path());
    let allow = policy(&[&format!("{host}:8080")]);
    let v = engine
        .call(ops::Create {
            request: CreateRequest {
                image: Some(cfg.image.to_string()),
                network: Some(allow.clone()),
                ..Default::default()
            },
        })
        .await
        .expect("create");
    assert_eq!(v.network, allow);
    let f = engine
        .call(ops::Fork {
            source: v.info.id.clone(),
            request: ForkRequest {
                count: 2,
                labels: Default::default(),
                ttl_seconds: None,
                max_processes: None,
                network: None,
                node: None,
                secrets: Vec::new(),
                ..Default::default()
            },
        })
        .await
        .expect("fork");
    assert_eq!(f.sandboxes.len(), 2, "{:?}", f.failed);
    for copy in &f.sandboxes {
        assert_eq!(copy.network, allow);
        let sb = engine.sandbox(&copy.info.id).await.unwrap();
        let out = fetch(&sb, &[format!("http://{host}:8080/ok.txt")]).await;
        assert_eq!(
            out.trim(),
            format!("ok http://{host}:8080/ok.txt for forks")
        );
    }
    // The metrics carry each copy's traffic.
    engine.sample(1.0).await;
    let text = engine.metrics().encode();
    for copy in &f.sandboxes {
        let line = format!(
            "forkbox_sandbox_network_bytes{{sandbox=\"{}\",direction=\"in\"}} ",
            copy.info.id
        );
        let bytes: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("{line} in {text}"))
            .parse()
            .unwrap();
        assert!(bytes > 0, "{text}");
    }
    engine.shutdown().await;
}
