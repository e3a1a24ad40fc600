//! A cluster on its first day: nodes whose homes hold nothing yet bring what they need by
//! chunks, build a carried image once for the cluster, and speak mutual TLS.

use std::process::{Command, Stdio};
use std::time::Duration;

use forkbox_test_infra as infra;
use infra::cluster_net::ClusterNet;

use crate::common::cluster::{stderr, Node, TestCluster, Tls, SECRET};
use crate::{busy, first_copy, fork_json, sums};

/// A cluster on its first day: the image built on node a only, b and c holding nothing (no
/// image, no template, no snapshot). A running sandbox of a forked to each of them brings all
/// it needs, verified, and its copies are exact and run on; a create on each brings the image;
/// a repeat moves nothing (a create) or only what changed (a fork).
#[test]
fn fresh_nodes_bring_everything_they_need() {
    let (
        TestCluster {
            nodes,
            etcd: _etcd,
            endpoints,
            _net,
        },
        tls,
    ) = TestCluster::start_fresh_tls("first-day", &["a"]);
    assert!(endpoints.starts_with("https://"), "{endpoints}");
    for n in &nodes[1..] {
        for d in ["images", "templates", "snapshots"] {
            let held = std::fs::read_dir(n.paths.home().join(d)).map_or(0, |r| r.count());
            assert_eq!(held, 0, "{} is not fresh: {d} holds {held}", n.name);
        }
    }
    let (src, on) = nodes[0].create(&["--node", "a", "--ttl", "30m"]);
    assert_eq!(on, "a");
    mutual_tls_refusals(&nodes, &tls, &endpoints);
    let want = busy(&nodes[0], &src);
    preview_through_a_non_owner(&nodes, &src);
    let tick = |n: &Node, id: &str| n.ok(&["sandbox", "exec", id, "--", "cat", "/tmp/tick"]);
    let (mut copies, mut first_moved) = (Vec::new(), 0);
    for (via, to) in [(2, "b"), (1, "c")] {
        let f = fork_json(&nodes[via], &[&src, "--count", "1", "--node", to]);
        let (copy, on) = first_copy(&f);
        assert_eq!(on, to, "{f}");
        let t = &f["transfer"];
        println!(
            "running fork of a to fresh {to}: {} ms; {t}",
            f["duration_ms"]
        );
        assert_eq!(t["layers_held"], 0, "{to} held no RAM of it: {t}");
        assert_eq!(
            t["image"], "python-bookworm@1",
            "the image comes first: {t}"
        );
        assert_eq!(t["chunks_refetched"], 0, "{t}");
        let moved = t["bytes_moved"].as_u64().unwrap();
        assert!(moved > 24_000_000, "{t}");
        first_moved = first_moved.max(moved);
        assert_eq!(sums(&nodes[via], &copy, "/dev/shm/m /root/d"), want);
        let t0 = tick(&nodes[via], &copy);
        assert!(
            infra::wait_until(Duration::from_secs(10), || tick(&nodes[via], &copy) != t0),
            "the counting process did not come along to {to}"
        );
        copies.push(copy);
    }
    // A create on each: the image came with the fork; the node makes a template of its own
    // and moves nothing.
    for to in ["b", "c"] {
        let o: serde_json::Value = serde_json::from_str(
            &nodes[0].ok(&["sandbox", "create", "--json", "--node", to, "--ttl", "10m"]),
        )
        .unwrap();
        assert_eq!(o["node"], to, "{o}");
        assert!(o["transfer"].is_null(), "a create moved something: {o}");
        let id = o["id"].as_str().unwrap();
        nodes[1].answers(id);
        nodes[2].ok(&["sandbox", "rm", id]);
    }
    // A repeat fork to b: b holds the last save while its copy lives; only what changed moves.
    let f = fork_json(&nodes[0], &[&src, "--node", "b"]);
    let t = &f["transfer"];
    println!("repeat fork to b: {} ms; {t}", f["duration_ms"]);
    assert!(t["bytes_moved"].as_u64().unwrap() * 4 < first_moved, "{t}");
    let (repeat, _) = first_copy(&f);
    assert_eq!(sums(&nodes[1], &repeat, "/dev/shm/m /root/d"), want);
    copies.push(repeat);
    for id in copies.iter().chain([&src]) {
        nodes[0].ok(&["sandbox", "rm", id]);
    }
    for n in &nodes {
        assert!(
            infra::wait_until(Duration::from_secs(10), || n.qemus() == 0),
            "{} left VMs",
            n.name
        );
    }
}

/// A preview URL of sandbox `id` (on node a) opened on node c: carried to a, which checks
/// its token and serves it from the guest; without the token, refused on c.
fn preview_through_a_non_owner(nodes: &[Node], id: &str) {
    nodes[0].ok(&[
        "sandbox",
        "exec",
        id,
        "--",
        "sh",
        "-c",
        "mkdir -p /tmp/w && echo served-by-a > /tmp/w/i.txt",
    ]);
    nodes[0].ok(&[
        "sandbox",
        "exec",
        id,
        "--detach",
        "--",
        "python3",
        "-m",
        "http.server",
        "3000",
        "--bind",
        "127.0.0.1",
        "--directory",
        "/tmp/w",
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&nodes[0].ok(&["sandbox", "port-forward", id, "3000", "--json"]))
            .unwrap();
    let preview = v["preview_url"].as_str().unwrap();
    let (host, query) = preview
        .trim_start_matches("http://")
        .split_once("/?")
        .unwrap();
    let c = &nodes[2];
    let get = |path: &str| {
        let o = ClusterNet::command_in(&c.ns, "curl")
            .args([
                "-s",
                "-i",
                "--max-time",
                "20",
                "-H",
                &format!("Host: {host}"),
            ])
            .arg(format!("http://{}:7070{path}", c.addr))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(
        infra::wait_until(Duration::from_secs(120), || get(&format!("/i.txt?{query}"))
            .contains("served-by-a")),
        "the preview of a's sandbox through c: {}\n-- c:\n{}",
        get(&format!("/i.txt?{query}")),
        c.log()
    );
    let none = get("/i.txt");
    assert!(
        none.contains(" 401 ") && none.contains("needs its token"),
        "{none}"
    );
}

/// Two first creates of a carried image that no node holds, at once on two nodes of a fresh
/// cluster: it is built once, on one of them, and the other brings it by chunks; both CLIs
/// print the build's progress; a create on the third brings it too.
#[test]
fn a_missing_carried_image_is_built_once_for_the_cluster() {
    let TestCluster {
        nodes,
        etcd: _etcd,
        endpoints: _,
        _net,
    } = TestCluster::start_on(ClusterNet::loopback(3), |name, ns, addr, endpoints| {
        // On the host's loopback: the build reaches Debian's mirror as the host does.
        Node::fresh("first-build", name, ns, addr, endpoints, false, &[])
    });
    let create = |n: &Node| {
        n.forkbox()
            .args([
                "sandbox", "create", "--json", "--node", &n.name, "--ttl", "10m",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let racing = [create(&nodes[0]), create(&nodes[1])];
    let mut made = Vec::new();
    for (i, p) in racing.into_iter().enumerate() {
        let o = p.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "the create on {} failed: {}\n-- a:\n{}\n-- b:\n{}",
            nodes[i].name,
            stderr(&o),
            nodes[0].log(),
            nodes[1].log()
        );
        // Both CLIs follow the one build, wherever it runs, as a single daemon's CLI prints
        // its own.
        let err = stderr(&o);
        assert!(err.contains("the cluster builds it"), "{err}");
        assert!(
            err.contains("builds image python-bookworm:") && err.contains("[1/"),
            "no build progress: {err}"
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["node"], nodes[i].name.as_str(), "{v}");
        made.push(v);
    }
    let builders: Vec<&str> = nodes
        .iter()
        .filter(|n| {
            n.log()
                .contains("building it here from forkbox's own recipe")
        })
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(builders.len(), 1, "built on {builders:?}");
    let brought: Vec<&serde_json::Value> = made
        .iter()
        .filter(|v| v["transfer"]["image"] == "python-bookworm@1")
        .collect();
    assert_eq!(brought.len(), 1, "one create brings the image: {made:?}");
    assert_ne!(brought[0]["node"], builders[0]);
    let third: serde_json::Value =
        serde_json::from_str(&nodes[0].ok(&["sandbox", "create", "--json", "--node", "c"]))
            .unwrap();
    assert_eq!(third["transfer"]["image"], "python-bookworm@1", "{third}");
    made.push(third);
    for v in &made {
        let id = v["id"].as_str().unwrap();
        nodes[2].answers(id);
        nodes[2].ok(&["sandbox", "rm", id]);
    }
}

/// Node a, called as its peers call it, from node c's namespace: a call signed with the
/// cluster secret but sent without TLS, a certificate of another cluster, an expired one, none
/// at all, and one of node b for a call signed as node a are all refused, with words, and
/// nothing is made; b's own certificate with b's signature is let in. A node given an expired
/// certificate does not start.
fn mutual_tls_refusals(nodes: &[Node], tls: &Tls, endpoints: &str) {
    let (a, c) = (&nodes[0], &nodes[2]);
    let before = a.ls().len();
    let sign = |node: &str, method: &str, pq: &str| {
        forkbox_cluster::auth::sign(SECRET, node, forkbox_cluster::now_ms(), method, pq)
    };
    // curl from c's namespace to a's listener: its exit code, what it printed, what came back.
    let curl = |args: &[&str], url: &str, signed_as: &str| {
        let o = ClusterNet::command_in(&c.ns, "curl")
            .args([
                "-sS",
                "--max-time",
                "20",
                "-w",
                "\n%{http_code}",
                "-X",
                "POST",
            ])
            .args(["-H", "content-type: application/json", "-d", "{}"])
            .args([
                "-H",
                &format!(
                    "x-forkbox-node: {}",
                    sign(signed_as, "POST", "/v1/sandboxes")
                ),
            ])
            .args(["--resolve", &format!("a.node.forkbox:7070:{}", a.addr)])
            // The name the certificate is checked for; the daemon's Host check wants its address.
            .args(["-H", &format!("Host: {}:7070", a.addr)])
            .args(args)
            .arg(url)
            .output()
            .unwrap();
        (
            o.status.code(),
            format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o)),
        )
    };
    let https = "https://a.node.forkbox:7070/v1/sandboxes";
    let cert = |dir: &std::path::Path| {
        let p = |f: &str| dir.join(f).display().to_string();
        vec![
            "--cacert".to_string(),
            tls.dir("ca").join("ca.pem").display().to_string(),
            "--cert".into(),
            p("node.pem"),
            "--key".into(),
            p("node.key"),
        ]
    };
    let with = |dir: &std::path::Path, signed_as: &str| {
        let args = cert(dir);
        curl(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            https,
            signed_as,
        )
    };

    let (_, out) = curl(&[], &format!("http://{}:7070/v1/sandboxes", a.addr), "b");
    assert!(
        out.contains("came without TLS") && out.ends_with("401"),
        "plain: {out}"
    );
    let (_, out) = with(&tls.dir("b"), "a");
    assert!(
        out.contains("came with node b's certificate") && out.ends_with("401"),
        "b as a: {out}"
    );

    let (other_b, expired) = foreign_and_expired(tls);
    let (code, out) = with(&other_b, "b");
    assert!(
        code != Some(0) && out.contains("unknown ca"),
        "another cluster's: {out}"
    );
    let (code, out) = with(&expired, "b");
    assert!(code != Some(0) && out.contains("expired"), "expired: {out}");
    let ca = [
        "--cacert".to_string(),
        tls.dir("ca").join("ca.pem").display().to_string(),
    ];
    let (code, out) = curl(
        &ca.iter().map(String::as_str).collect::<Vec<_>>(),
        https,
        "b",
    );
    assert!(
        code != Some(0) && out.contains("certificate required"),
        "no certificate: {out}"
    );
    assert_eq!(a.ls().len(), before, "a refused call made something");

    // b's own certificate with b's own signature is let in: a listing, as a peer asks it.
    let mut get = ClusterNet::command_in(&c.ns, "curl");
    get.args(["-sS", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(cert(&tls.dir("b")))
        .args([
            "-H",
            &format!("x-forkbox-node: {}", sign("b", "GET", "/v1/sandboxes")),
        ])
        .args(["--resolve", &format!("a.node.forkbox:7070:{}", a.addr)])
        // The name the certificate is checked for; the daemon's Host check wants its address.
        .args(["-H", &format!("Host: {}:7070", a.addr)])
        .arg(https);
    let o = get.output().unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(out.ends_with("200"), "b's own: {out}");

    an_expired_node_does_not_start(c, &expired, endpoints);
}

/// A node given an expired certificate stops at start, saying so.
fn an_expired_node_does_not_start(c: &Node, expired: &std::path::Path, endpoints: &str) {
    let home = tempfile::tempdir().unwrap();
    let o = ClusterNet::command_in(&c.ns, env!("CARGO_BIN_EXE_forkbox"))
        .env("FORKBOX_HOME", home.path())
        .env("FORKBOX_CLUSTER_SECRET", SECRET)
        .args([
            "serve",
            "--listen",
            &format!("{}:7071", c.addr),
            "--cluster",
            endpoints,
            "--node",
            "b",
        ])
        .args([
            "--advertise",
            &format!("http://{}:7071", c.addr),
            "--cluster-tls",
            expired.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        !o.status.success() && stderr(&o).contains("is not valid now"),
        "{}",
        stderr(&o)
    );
}

/// Node b's certificate of another cluster's CA (made with the CLI), and an expired one of this
/// cluster's CA: their directories.
fn foreign_and_expired(tls: &Tls) -> (std::path::PathBuf, std::path::PathBuf) {
    let cli = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_forkbox"))
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "forkbox {args:?}: {}", stderr(&o));
    };
    let (other_ca, other_b) = (tls.dir("other-ca"), tls.dir("other-b"));
    cli(&["cluster", "init-ca", "--dir", other_ca.to_str().unwrap()]);
    cli(&[
        "cluster",
        "issue-cert",
        "--ca",
        other_ca.to_str().unwrap(),
        "--node",
        "b",
        "--out",
        other_b.to_str().unwrap(),
    ]);
    let expired = tls.dir("expired-b");
    let now = forkbox_cluster::now_ms() as i64 / 1000;
    let req = forkbox_cluster::tls::Request {
        node: "b".into(),
        hosts: vec![],
        not_after_unix: now - 86_400,
    };
    forkbox_cluster::tls::issue_valid_from(&tls.dir("ca"), &req, now - 10 * 86_400, &expired)
        .unwrap();
    (other_b, expired)
}
