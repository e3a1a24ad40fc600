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

#[path = "../common/mod.rs"]
mod common;
mod first_day;
mod transfer;

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
    volume_pins_its_sandboxes(&nodes);
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
/// A volume lives on the node it was made on (c, asked through a) and pins the sandboxes that
/// mount it there, whichever node the create goes through; one pinned elsewhere is refused in
/// words; its calls reach it from any node.
fn volume_pins_its_sandboxes(nodes: &[Node]) {
    let vol = format!("vol-{}", std::process::id());
    nodes[0].ok(&["volume", "create", &vol, "--size", "32m", "--node", "c"]);
    let listed = nodes[1].ok(&["volume", "ls"]);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&vol) && l.contains("[node c]")),
        "{listed}"
    );
    let (id, owner) = nodes[0].create(&["--ttl", "30m", "--volume", &format!("{vol}:/data")]);
    assert_eq!(owner, "c");
    nodes[1].ok(&[
        "sandbox",
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo on-c > /data/f && sync",
    ]);
    let o = nodes[0].run(&[
        "sandbox",
        "create",
        "--node",
        "a",
        "--volume",
        &format!("{vol}:/data:ro"),
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains(&format!("volume {vol} lives on node c")),
        "{}",
        stderr(&o)
    );
    let o = nodes[1].run(&["volume", "rm", &vol]);
    assert!(
        !o.status.success() && stderr(&o).contains("in use"),
        "{}",
        stderr(&o)
    );
    nodes[2].ok(&["sandbox", "rm", &id]);
    nodes[0].ok(&["volume", "rm", &vol]);
    assert!(!nodes[1].ok(&["volume", "ls", "-q"]).contains(&vol));
}

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
pub fn sums(n: &Node, id: &str, files: &str) -> String {
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
pub fn busy(n: &Node, id: &str) -> String {
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
pub fn write_and_save(n: &Node, id: &str, file: &str, bytes: u64, name: &str) -> String {
    let write = format!("head -c {bytes} /dev/urandom > {file}");
    n.ok(&["sandbox", "exec", id, "--", "sh", "-c", &write]);
    let sum = sums(n, id, file);
    n.ok(&["sandbox", "snapshot", id, "--name", name]);
    sum
}

/// A fork through `n` (`args` after `sandbox fork`), parsed.
pub fn fork_json(n: &Node, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["sandbox", "fork", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&n.ok(&all)).unwrap()
}

pub fn first_copy(f: &serde_json::Value) -> (String, String) {
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
pub fn same_bytes(a: &std::path::Path, b: &std::path::Path) -> bool {
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
pub fn leftovers(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect()
}
