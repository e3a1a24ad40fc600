//! Three forkbox nodes as one cluster on a real 3-member etcd, each node in a network
//! namespace of its own with a home of its own (sharing the test home's images), the etcd
//! members on a bridge in a fourth namespace. Driven from outside through each node's CLI, as
//! a user would: one API on every node, placement, forwarding, a node killed and restarted,
//! etcd members stopped.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use forkbox_test_infra as infra;
use infra::cluster_net::ClusterNet;
use infra::etcd::EtcdCluster;

mod common;

use common::cluster::{stderr, Node, TestCluster, LEASE_SECS};

#[test]
fn three_nodes_on_etcd_one_api_placement_failure_and_quorum() {
    let TestCluster {
        mut nodes,
        mut etcd,
        endpoints,
        _net,
    } = TestCluster::start("cluster", &[]);

    // A name held by a live node is refused at once, saying by whom.
    let o = nodes[1]
        .forkbox()
        .env("FORKBOX_HOME", nodes[1].paths.home().join("other-home"))
        .args(["serve", "--listen", &format!("{}:7071", nodes[1].addr)])
        .args(["--cluster", &endpoints, "--node", "a"])
        .args(["--advertise", &format!("http://{}:7071", nodes[1].addr)])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("held by a live node"), "{}", stderr(&o));

    // Create through a (pinned to b: placed there and forwarded), exec through c; a streamed
    // exec, files and the listing from every node.
    let (id, owner) = nodes[0].create(&["--node", "b", "--ttl", "30m"]);
    assert_eq!(owner, "b");
    let out = nodes[2].ok(&[
        "sandbox",
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo hello from $(hostname) >&2; echo out",
    ]);
    assert_eq!(out.trim(), "out");
    nodes[2].ok(&[
        "sandbox",
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "printf 'written via c' > /tmp/f",
    ]);
    assert_eq!(
        nodes[0].ok(&["sandbox", "exec", &id, "--", "cat", "/tmp/f"]),
        "written via c"
    );
    // An archive streamed up through a non-owner, and down through another.
    let up = tempfile::tempdir().unwrap();
    std::fs::write(up.path().join("data.txt"), "x".repeat(300_000)).unwrap();
    nodes[2].ok(&[
        "sandbox",
        "upload",
        &id,
        up.path().to_str().unwrap(),
        "/srv/up",
    ]);
    let down = up.path().join("down");
    nodes[0].ok(&[
        "sandbox",
        "download",
        &id,
        "/srv/up",
        down.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read_to_string(down.join("data.txt"))
            .unwrap()
            .len(),
        300_000
    );
    for n in &nodes {
        let ls = n.ls();
        assert!(
            ls.contains(&(id.clone(), "running".into(), "b".into())),
            "{}: {ls:?}",
            n.name
        );
    }
    // The owner's log says the ownership; its metrics carry its node's name.
    assert!(
        nodes[1].log().contains(&format!("{id}: owned by b")),
        "{}",
        nodes[1].log()
    );
    let metrics = Command::new("curl")
        .args(["-s", "--unix-socket"])
        .arg(forkbox_server::socket_path(&nodes[1].paths))
        .arg("http://localhost/metrics")
        .output()
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        metrics.contains("forkbox_sandboxes_running{node=\"b\"}"),
        "{metrics}"
    );
    let only_a = nodes[1].ok(&["sandbox", "ls", "--node", "a", "-q"]);
    assert!(!only_a.contains(&id), "{only_a}");

    // Operators: the status names every node and member; a drained node takes no placement.
    let status: serde_json::Value = serde_json::from_str(&nodes[0].ok(&[
        "cluster",
        "status",
        "--cluster",
        &endpoints,
        "--json",
    ]))
    .unwrap();
    assert_eq!(status["nodes"].as_array().unwrap().len(), 3, "{status}");
    assert_eq!(
        status["etcd_members"].as_array().unwrap().len(),
        3,
        "{status}"
    );
    assert!(status["etcd_members"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["healthy"] == true));
    nodes[0].ok(&["node", "drain", "a", "--cluster", &endpoints]);
    let o = nodes[0].run(&["sandbox", "create", "--node", "a"]);
    assert!(stderr(&o).contains("node a is drained"), "{}", stderr(&o));
    nodes[0].ok(&["node", "drain", "a", "--undo", "--cluster", &endpoints]);

    // A cluster token made once works on every node's TCP listener; revoked, on none.
    let token = nodes[0].ok(&["token", "create", "--name", "t1", "--cluster", &endpoints]);
    let token = token.trim();
    let curl = |n: &Node, token: &str| {
        ClusterNet::command_in(&n.ns, "curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("http://{}:7070/v1/sandboxes", n.addr))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap()
    };
    for n in &nodes {
        assert_eq!(curl(n, token), "200", "node {}", n.name);
        assert_eq!(curl(n, "fbx_not_a_token"), "401", "node {}", n.name);
    }
    nodes[1].ok(&["token", "revoke", "t1", "--cluster", &endpoints]);
    let revoked = Instant::now();
    assert!(
        infra::wait_until(Duration::from_secs(1), || nodes
            .iter()
            .all(|n| curl(n, token) == "401")),
        "a revoked token still worked after {:?}",
        revoked.elapsed()
    );

    // Unpinned creates are placed by room; fork from c of the sandbox on b makes copies on b.
    let (other, other_node) = nodes[2].create(&["--node", "c"]);
    assert_eq!(other_node, "c");
    let fork: serde_json::Value =
        serde_json::from_str(&nodes[2].ok(&["sandbox", "fork", &id, "--count", "2", "--json"]))
            .unwrap();
    let copies: Vec<String> = fork["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            assert_eq!(v["node"], "b");
            v["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(copies.len(), 2);
    assert_eq!(
        nodes[0].ok(&["sandbox", "exec", &copies[0], "--", "cat", "/tmp/f"]),
        "written via c"
    );
    // Pinned to a node that is not in the cluster: said, nothing made.
    let o = nodes[0].run(&["sandbox", "fork", &id, "--node", "zz"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no node named \"zz\""),
        "{}",
        stderr(&o)
    );
    // An unknown node: said, with the live ones.
    // No room anywhere: said at once, naming what each node lacks; nothing is made.
    let o = nodes[0].run(&["sandbox", "create", "--memory", "64g", "--json"]);
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(said.contains("no_capacity"), "{said}");
    for n in ["a", "b", "c"] {
        assert!(said.contains(&format!("{n} has ")), "{said}");
    }
    let o = nodes[0].run(&["sandbox", "create", "--node", "zz"]);
    assert!(
        stderr(&o).contains("no node named \"zz\""),
        "{}",
        stderr(&o)
    );

    // kill -9 of b: its sandboxes are listed lost within the lease (+1 s), c's untouched.
    let b_qemus = nodes[1].qemus();
    assert_eq!(b_qemus, 3, "b runs the sandbox and its two copies");
    nodes[1].kill9();
    let killed = Instant::now();
    assert!(
        infra::wait_until(Duration::from_secs(LEASE_SECS + 5), || {
            nodes[0]
                .ls()
                .iter()
                .filter(|(_, s, n)| s == "lost" && n == "b")
                .count()
                == 3
        }),
        "b's sandboxes not listed lost: {:?}",
        nodes[0].ls()
    );
    let took = killed.elapsed();
    println!("kill -9 to lost: {took:?} (lease {LEASE_SECS} s)");
    assert!(took <= Duration::from_secs(LEASE_SECS + 2), "{took:?}");
    let o = nodes[0].run(&["sandbox", "exec", &id, "--", "true"]);
    assert!(stderr(&o).contains("lost"), "{}", stderr(&o));
    assert_eq!(
        nodes[0]
            .ok(&["sandbox", "exec", &other, "--", "echo", "still"])
            .trim(),
        "still"
    );

    // b comes back: it re-adopts its VMs (they outlived the daemon), no duplicate, no orphan.
    nodes[1].start();
    assert!(
        infra::wait_until(Duration::from_secs(20), || {
            nodes[2]
                .ls()
                .iter()
                .filter(|(_, s, n)| s == "running" && n == "b")
                .count()
                == 3
        }),
        "b's sandboxes not back: {:?}\n{}",
        nodes[2].ls(),
        nodes[1].log()
    );
    let ls = nodes[2].ls();
    let mut ids: Vec<&String> = ls.iter().map(|(i, _, _)| i).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), ls.len(), "a sandbox listed twice: {ls:?}");
    assert_eq!(nodes[1].qemus(), 3, "no orphan and no missing VM on b");
    assert_eq!(
        nodes[2].ok(&["sandbox", "exec", &copies[1], "--", "cat", "/tmp/f"]),
        "written via c"
    );

    // One etcd member of three down, the leader: the calls wait out the election, and
    // everything works.
    let leader = etcd.leader().expect("etcd has a leader");
    etcd.stop(leader);
    let (third, _) = nodes[0].create(&["--node", "a"]);
    nodes[1].ok(&["sandbox", "exec", &third, "--", "true"]);
    // Two down: running sandboxes answer, creates are refused with the error; then back.
    let second = (leader + 1) % 3;
    etcd.stop(second);
    nodes[0].answers(&third);
    let o = nodes[0].run(&["sandbox", "create", "--json"]);
    assert!(!o.status.success());
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(said.contains("\"cluster_unavailable\""), "{said}");
    assert!(said.contains("running sandboxes still answer"), "{said}");
    etcd.restart(leader);
    etcd.restart(second);
    assert!(
        infra::wait_until(Duration::from_secs(30), || {
            nodes[0].run(&["sandbox", "rm", &third]).status.success()
        }),
        "deletes did not work again after quorum came back"
    );

    // Everything deleted through one node; nothing left anywhere.
    for s in [&id, &other, &copies[0], &copies[1]] {
        nodes[0].ok(&["sandbox", "rm", s]);
    }
    // A record whose removal etcd could not take while quorum was back but a node was still
    // re-registering goes at that node's next reconciliation.
    assert!(
        infra::wait_until(Duration::from_secs(10), || nodes[1].ls().is_empty()),
        "{:?}",
        nodes[1].ls()
    );
    for n in &nodes {
        assert!(
            infra::wait_until(Duration::from_secs(10), || n.qemus() == 0),
            "{} left VMs",
            n.name
        );
    }
}

/// The Python and TypeScript SDKs' own suites and the MCP client over Streamable HTTP, pointed
/// at node b of a cluster (with a cluster token; the TCP checks against node c): their
/// sandboxes are placed on any node and reached through b.
#[test]
fn the_sdks_and_mcp_work_pointed_at_any_node() {
    let root = common::mcp_root();
    let extra = vec!["--mcp-root".to_string(), root.path().display().to_string()];
    let c = TestCluster::start("cluster-sdk", &extra);
    let token = c.nodes[0].ok(&[
        "token",
        "create",
        "--name",
        "sdk",
        "--cluster",
        &c.endpoints,
    ]);
    let token = token.trim();
    let (b, other) = (&c.nodes[1], &c.nodes[2]);
    let client = |program: &std::path::Path| {
        let mut cmd = ClusterNet::command_in(&b.ns, program);
        cmd.env("FORKBOX_API", format!("http://{}:7070", b.addr))
            .env("FORKBOX_TOKEN", token)
            .env("FORKBOX_TEST_TCP", format!("http://{}:7070", other.addr))
            .env("FORKBOX_TEST_TOKEN", token)
            .env("FORKBOX_TEST_NODES", "a,b,c")
            .current_dir(infra::repo_root())
            .stdin(Stdio::null());
        cmd
    };
    let check = |cmd: &mut Command, what: &str| {
        let o = cmd.output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        println!("{out}");
        assert!(
            o.status.success(),
            "{what} against the cluster failed:\n{out}{}\n-- node b:\n{}",
            String::from_utf8_lossy(&o.stderr),
            b.log()
        );
        out
    };
    let python = infra::sdk_python();
    let out = check(
        client(&python).args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "sdk/python/tests",
        ]),
        "the Python SDK's tests",
    );
    assert!(out.contains(" passed"), "{out}");
    let dir = infra::npm_ready("sdk/typescript");
    let out = check(
        client(std::path::Path::new("node"))
            .args(["--test", "--test-reporter=spec"])
            .arg(dir.join("test")),
        "the TypeScript SDK's tests",
    );
    assert!(out.contains("pass"), "{out}");
    let mcp = infra::mcp_python();
    let out = check(
        client(&mcp)
            .arg(infra::repo_root().join("crates/mcp/tests/mcp_client.py"))
            .arg("http")
            .arg(format!("http://{}:7070/mcp", b.addr))
            .arg(token)
            .arg(root.path()),
        "the MCP client over Streamable HTTP",
    );
    assert!(out.contains("5 concurrent sessions"), "{out}");
    // What the suites made went where placement put it; all of it is gone.
    assert!(
        infra::wait_until(Duration::from_secs(60), || b.ls().is_empty()),
        "left in the cluster: {:?}",
        b.ls()
    );
}

/// A node whose etcd does not answer yet starts anyway, says so, refuses what needs the
/// cluster's state with the error, and joins by itself once etcd is there, without a restart.
#[test]
fn a_node_starts_before_its_etcd_and_joins_when_it_answers() {
    let net = ClusterNet::new(1);
    let (ns, addr) = net.nodes[0].clone();
    // etcd's address in the node's own namespace, where nothing listens yet.
    let endpoint = format!("http://{addr}:2379");
    let node = Node::new("cluster-late", "a", &ns, &addr, &endpoint, &[]);
    let o = node.run(&["sandbox", "create", "--json"]);
    assert!(!o.status.success());
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(said.contains("cluster_unavailable"), "{said}");
    assert!(node.log().contains("retrying"), "{}", node.log());
    let etcd = EtcdCluster::start_in(1, &addr, Some(&ns));
    assert_eq!(etcd.endpoints_arg(), endpoint);
    assert!(
        infra::wait_until(Duration::from_secs(30), || node
            .log()
            .contains("joined as node a")),
        "the node did not join once etcd answered: {}",
        node.log()
    );
    let (id, on) = node.create(&["--ttl", "10m"]);
    assert_eq!(on, "a");
    node.ok(&["sandbox", "rm", &id]);
}

/// The sandbox's `sha256sum` of `files`, run through `n`.
fn sums(n: &Node, id: &str, files: &str) -> String {
    n.ok(&[
        "sandbox",
        "exec",
        id,
        "--",
        "sh",
        "-c",
        &format!("sha256sum {files}"),
    ])
}

/// Sandbox `id` (on node `n`) given 24 MB of random data in memory (`/dev/shm/m`) and 8 MB on
/// disk (`/root/d`), and a process that counts in `/tmp/tick`: the files' `sha256sum` lines.
fn busy(n: &Node, id: &str) -> String {
    n.ok(&[
        "sandbox",
        "exec",
        id,
        "--",
        "sh",
        "-c",
        "head -c 24000000 /dev/urandom > /dev/shm/m && head -c 8000000 /dev/urandom > /root/d \
         && sync; setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/tick; \
         sleep 0.2; done' >/dev/null 2>&1 </dev/null &",
    ]);
    sums(n, id, "/dev/shm/m /root/d")
}

/// `bytes` of fresh random data written to `file` in sandbox `id` (on node `n`), then the
/// sandbox saved as snapshot `name`: the file's `sha256sum` line.
fn write_and_save(n: &Node, id: &str, file: &str, bytes: u64, name: &str) -> String {
    let write = format!("head -c {bytes} /dev/urandom > {file}");
    n.ok(&["sandbox", "exec", id, "--", "sh", "-c", &write]);
    let sum = sums(n, id, file);
    n.ok(&["sandbox", "snapshot", id, "--name", name]);
    sum
}

/// A fork through `n` (`args` after `sandbox fork`), parsed.
fn fork_json(n: &Node, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["sandbox", "fork", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&n.ok(&all)).unwrap()
}

fn first_copy(f: &serde_json::Value) -> (String, String) {
    let v = &f["sandboxes"][0];
    (
        v["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no copy: {f}"))
            .to_string(),
        v["node"].as_str().unwrap().to_string(),
    )
}

/// Whether two files hold the same bytes (read a MiB at a time).
fn same_bytes(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::io::Read;
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = fa.read(&mut ba).unwrap();
        let mut nb = 0;
        while nb < na {
            match fb.read(&mut bb[nb..na]).unwrap() {
                0 => break,
                n => nb += n,
            }
        }
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return fb.read(&mut bb).unwrap() == 0;
        }
    }
}

/// Entries of `dir` whose names start with `.tmp-` (what an interrupted assembly leaves).
fn leftovers(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect()
}

/// A cluster on its first day: the image built on node a only, b and c holding nothing (no
/// image, no template, no snapshot). A running sandbox of a forked to each of them brings all
/// it needs, verified, and its copies are exact and run on; a create on each brings the image;
/// a repeat moves nothing (a create) or only what changed (a fork).
#[test]
fn fresh_nodes_bring_everything_they_need() {
    let TestCluster {
        nodes,
        etcd: _etcd,
        endpoints: _,
        _net,
    } = TestCluster::start_fresh("first-day", &["a"]);
    for n in &nodes[1..] {
        for d in ["images", "templates", "snapshots"] {
            let held = std::fs::read_dir(n.paths.home().join(d)).map_or(0, |r| r.count());
            assert_eq!(held, 0, "{} is not fresh: {d} holds {held}", n.name);
        }
    }
    let (src, on) = nodes[0].create(&["--node", "a", "--ttl", "30m"]);
    assert_eq!(on, "a");
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
/// cluster: it is built once, on one of them, and the other brings it by chunks; a create on
/// the third brings it too.
#[test]
fn a_missing_carried_image_is_built_once_for_the_cluster() {
    let TestCluster {
        nodes,
        etcd: _etcd,
        endpoints: _,
        _net,
    } = TestCluster::start_on(ClusterNet::loopback(3), |name, ns, addr, endpoints| {
        // On the host's loopback: the build reaches Debian's mirror as the host does.
        Node::fresh("first-build", name, ns, addr, endpoints, false)
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
        assert!(
            stderr(&o).contains("the cluster builds it"),
            "{}",
            stderr(&o)
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

/// Snapshots move between nodes by chunks: a fork pinned to a node that lacks the snapshot
/// brings it (only what the node does not hold, every chunk verified), the copies are exact, a
/// corrupt chunk is fetched again elsewhere and never restored, a holder killed mid-transfer
/// is replaced by another, a full disk and a corrupt only holder fail cleanly, and nothing is
/// left once the snapshots and copies are gone.
#[test]
fn snapshots_move_between_nodes_by_chunks() {
    use forkbox_engine::snapshot::chunks::Written;
    // Node c keeps images of its own (none at first); a and b share the test's.
    let c_images = infra::home().home().join("homes/xfer-c/images");
    let _ = std::fs::remove_file(&c_images);
    let _ = std::fs::remove_dir_all(&c_images);
    std::fs::create_dir_all(&c_images).unwrap();
    let TestCluster {
        mut nodes,
        etcd: _etcd,
        endpoints: _,
        _net,
    } = TestCluster::start("xfer", &[]);
    let homes: Vec<std::path::PathBuf> =
        nodes.iter().map(|n| n.paths.home().to_path_buf()).collect();
    let home = |i: usize| homes[i].clone();

    // A create on c of an image only a and b hold: c brings it (its data, once), then boots.
    let o: serde_json::Value = serde_json::from_str(&nodes[0].ok(&[
        "sandbox",
        "create",
        "--json",
        "--node",
        "c",
        "--image",
        "python-bookworm",
        "--ttl",
        "10m",
    ]))
    .unwrap();
    let t = &o["transfer"];
    assert_eq!(t["image"], "python-bookworm@1", "{o}");
    let a_rootfs = infra::home()
        .home()
        .join("images/python-bookworm/1/rootfs.ext4");
    let data = forkbox_engine::snapshot::allocated_bytes(&a_rootfs);
    let moved = t["bytes_moved"].as_u64().unwrap();
    println!("image to c: {moved} bytes moved of {data} allocated; {t}");
    assert!(moved > 0 && moved <= data, "{moved} vs {data}");
    assert!(same_bytes(
        &a_rootfs,
        &c_images.join("python-bookworm/1/rootfs.ext4")
    ));
    let id = o["id"].as_str().unwrap();
    nodes[2].answers(id);
    nodes[2].ok(&["sandbox", "rm", id]);
    let again: serde_json::Value = serde_json::from_str(&nodes[0].ok(&[
        "sandbox",
        "create",
        "--json",
        "--node",
        "c",
        "--image",
        "python-bookworm",
        "--ttl",
        "10m",
    ]))
    .unwrap();
    assert!(again["transfer"].is_null(), "{again}");
    nodes[2].ok(&["sandbox", "rm", again["id"].as_str().unwrap()]);

    // A sandbox on a with data in memory (tmpfs) and on disk, and a process that counts.
    let (src, _) = nodes[0].create(&["--node", "a", "--ttl", "30m"]);
    let want = busy(&nodes[0], &src);
    nodes[0].ok(&["sandbox", "snapshot", &src, "--name", "snap1"]);

    // Forked through c onto b, which lacks it: b brings what it does not hold.
    let f = fork_json(&nodes[2], &["snap1", "--node", "b"]);
    let (copy_b, on) = first_copy(&f);
    assert_eq!(on, "b", "{f}");
    let t = &f["transfer"];
    let moved = t["bytes_moved"]
        .as_u64()
        .unwrap_or_else(|| panic!("no transfer: {f}"));
    let a_snap = home(0).join("snapshots/snap1");
    let written = Written::load(&a_snap).unwrap().bytes();
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a_snap.join("snapshot.json")).unwrap()).unwrap();
    let frozen = std::path::PathBuf::from(meta["disk"].as_str().unwrap());
    let delta = forkbox_engine::snapshot::allocated_bytes(&frozen);
    println!("snap1 to b: {moved} bytes moved; written pages {written}, disk delta {delta}; {t}");
    assert!(
        moved <= written + delta + (1 << 20),
        "{moved} > {written} + {delta} + 1 MiB: {t}"
    );
    assert_eq!(t["layers_held"], 1, "b holds the template's RAM: {t}");
    // The snapshot b assembled is a's, byte for byte; the copy runs on with the same data.
    let b_snap = home(1).join("snapshots/snap1");
    assert!(
        same_bytes(&a_snap.join("mem"), &b_snap.join("mem")),
        "RAM differs"
    );
    assert!(same_bytes(&a_snap.join("vmstate"), &b_snap.join("vmstate")));
    let b_meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b_snap.join("snapshot.json")).unwrap()).unwrap();
    assert!(same_bytes(
        &frozen,
        std::path::Path::new(b_meta["disk"].as_str().unwrap())
    ));
    assert_eq!(sums(&nodes[2], &copy_b, "/dev/shm/m /root/d"), want);
    let t0 = nodes[2].ok(&["sandbox", "exec", &copy_b, "--", "cat", "/tmp/tick"]);
    assert!(
        infra::wait_until(Duration::from_secs(10), || nodes[2].ok(&[
            "sandbox",
            "exec",
            &copy_b,
            "--",
            "cat",
            "/tmp/tick"
        ]) != t0),
        "the counting process did not come along"
    );
    // b's listing says what snap1 holds alone there: its RAM file at least.
    let ls: serde_json::Value =
        serde_json::from_str(&nodes[1].ok(&["snapshot", "ls", "--json"])).unwrap();
    let alone: Vec<u64> = ls
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"] == "snap1")
        .filter_map(|m| m["held_alone_bytes"].as_u64())
        .collect();
    let ram = forkbox_engine::snapshot::allocated_bytes(&b_snap.join("mem"));
    assert_eq!(alone.len(), 2, "a's and b's: {ls}");
    assert!(
        alone.iter().all(|a| *a >= ram) && ram > 0,
        "{alone:?} < {ram}: {ls}"
    );
    // A snapshot no node holds: said plainly, nothing made.
    let o = nodes[1].run(&["sandbox", "fork", "no-such-snap", "--node", "c"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no-such-snap"), "{}", stderr(&o));
    // A second fork of it to b moves nothing.
    let again = fork_json(&nodes[0], &["snap1", "--node", "b"]);
    assert!(again["transfer"].is_null(), "{again}");
    assert_eq!(first_copy(&again).1, "b");

    // A running sandbox of a forked onto c through b: saved on a, brought to c; a keeps no save.
    let f = fork_json(&nodes[1], &[&src, "--node", "c"]);
    let (copy_c, on) = first_copy(&f);
    assert_eq!(on, "c", "{f}");
    let first_moved = f["transfer"]["bytes_moved"].as_u64().unwrap();
    assert!(f["pause_ms"].as_f64().is_some(), "{f}");
    assert_eq!(sums(&nodes[0], &copy_c, "/dev/shm/m /root/d"), want);
    let a_snaps: Vec<String> = std::fs::read_dir(home(0).join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        a_snaps,
        vec!["snap1".to_string()],
        "a keeps only its own snapshot"
    );
    // Again: c holds the last save while its copy lives, so only what changed since moves.
    let f = fork_json(&nodes[1], &[&src, "--node", "c"]);
    let (repeat_copy, _) = first_copy(&f);
    let repeat = f["transfer"]["bytes_moved"].as_u64().unwrap();
    println!("running fork to c: {first_moved} bytes moved, a repeat {repeat}");
    assert!(repeat * 4 < first_moved, "{repeat} vs {first_moved}: {f}");

    // A corrupt chunk at one holder is fetched again from another and never restored.
    let want2 = write_and_save(&nodes[0], &src, "/dev/shm/m2", 8000000, "snap2");
    let (on_c, _) = first_copy(&fork_json(&nodes[2], &["snap2", "--node", "c"]));
    let a_snap2 = home(0).join("snapshots/snap2");
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(a_snap2.join("mem"))
        .unwrap();
    let flip = |undo: bool| {
        use std::os::unix::fs::FileExt;
        for (start, _) in Written::load(&a_snap2).unwrap().runs {
            let mut b = [0u8; 1];
            mem.read_exact_at(&mut b, start).unwrap();
            b[0] ^= 0x5a;
            mem.write_all_at(&b, start).unwrap();
        }
        let _ = undo;
    };
    flip(false);
    let f = fork_json(&nodes[0], &["snap2", "--node", "b"]);
    let t = &f["transfer"];
    assert!(t["chunks_refetched"].as_u64().unwrap() >= 1, "{f}");
    assert!(t["from"].as_array().unwrap().contains(&"c".into()), "{f}");
    let (copy2, _) = first_copy(&f);
    assert_eq!(sums(&nodes[1], &copy2, "/dev/shm/m2"), want2);
    assert!(
        nodes[1].log().contains("does not match its name"),
        "{}",
        nodes[1].log()
    );
    // With the corrupt holder alone, the fork fails, saying so, and leaves nothing on b.
    nodes[1].ok(&["sandbox", "rm", &copy2, &on_c]);
    nodes[1].ok(&["snapshot", "rm", "snap2"]);
    nodes[2].ok(&["snapshot", "rm", "snap2"]);
    let o = nodes[1].run(&["sandbox", "fork", "snap2", "--node", "b"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("corrupt"), "{}", stderr(&o));
    assert!(!home(1).join("snapshots/snap2").exists());
    assert!(leftovers(&home(1).join("snapshots")).is_empty());
    assert!(leftovers(&home(1).join("objects")).is_empty());
    flip(true);

    // A full disk on the target: refused at once, saying how much it lacks; nothing left.
    nodes[2].ok(&["sandbox", "rm", &copy_c]);
    // (In the daemon's own mount namespace: `ip netns exec` gave it one.)
    let snaps_c = home(2).join("snapshots");
    let in_c = |args: &[&str]| {
        let pid = nodes[2].child.as_ref().unwrap().id().to_string();
        Command::new("nsenter")
            .args(["-t", &pid, "-m", "--"])
            .args(args)
            .arg(&snaps_c)
            .status()
            .unwrap()
            .success()
    };
    assert!(in_c(&["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs"]));
    let o = nodes[2].run(&["sandbox", "fork", "snap1", "--node", "c", "--json"]);
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(in_c(&["umount"]));
    assert!(!o.status.success());
    assert!(
        said.contains("no_capacity") && said.contains("MiB free"),
        "{said}"
    );

    // A holder killed mid-transfer: the rest comes from the other holder.
    let want3 = write_and_save(&nodes[0], &src, "/dev/shm/m3", 48000000, "snap3");
    let (on_c3, _) = first_copy(&fork_json(&nodes[2], &["snap3", "--node", "c"]));
    nodes[2].ok(&["sandbox", "rm", &on_c3]);
    let slow = ClusterNet::command_in(&nodes[0].ns, "tc")
        .args([
            "qdisc", "add", "dev", "v0n", "root", "tbf", "rate", "40mbit",
        ])
        .args(["burst", "64kb", "latency", "2s"])
        .status()
        .unwrap();
    assert!(slow.success());
    let pending = nodes[1]
        .forkbox()
        .args(["sandbox", "fork", "snap3", "--node", "b", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        infra::wait_until(Duration::from_secs(30), || nodes[1]
            .log()
            .contains("snapshot snap3: bringing it from a, c")),
        "{}",
        nodes[1].log()
    );
    std::thread::sleep(Duration::from_millis(1500));
    nodes[0].kill9();
    let o = pending.wait_with_output().unwrap();
    assert!(o.status.success(), "{}{}", stderr(&o), nodes[1].log());
    let f: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    println!("holder killed mid-transfer: {}", f["transfer"]);
    let from = f["transfer"]["from"].as_array().unwrap();
    assert!(from.contains(&"c".into()), "{f}");
    let (copy3, _) = first_copy(&f);
    assert_eq!(sums(&nodes[1], &copy3, "/dev/shm/m3"), want3);
    let _ = ClusterNet::command_in(&nodes[0].ns, "tc")
        .args(["qdisc", "del", "dev", "v0n", "root"])
        .status();
    nodes[0].start();

    // Everything deleted: no disk file made from chunks is left that nothing uses.
    for id in [&src, &copy_b, &copy3, &repeat_copy] {
        nodes[1].ok(&["sandbox", "rm", id]);
    }
    for c in f["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(again["sandboxes"].as_array().into_iter().flatten())
    {
        let _ = nodes[1].run(&["sandbox", "rm", c["id"].as_str().unwrap()]);
    }
    for n in &nodes {
        for s in ["snap1", "snap3"] {
            let _ = n.run(&["snapshot", "rm", s]);
        }
    }
    for (i, n) in nodes.iter().enumerate() {
        let left: Vec<String> = std::fs::read_dir(home(i).join("objects"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            left.is_empty(),
            "{}: objects left: {left:?}\n{}",
            n.name,
            n.log()
        );
        assert!(
            leftovers(&home(i).join("snapshots")).is_empty(),
            "{}",
            n.name
        );
    }
}
