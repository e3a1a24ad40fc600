//! Three forkbox nodes of this build as one cluster on a real 3-member etcd, for the tests
//! that drive a cluster from outside: each node a daemon with a home of its own, in a network
//! namespace of its own (or on the host's loopback), driven through its CLI.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use forkbox_engine::paths::Paths;
use forkbox_test_infra as infra;
use infra::cluster_net::ClusterNet;
use infra::etcd::EtcdCluster;

pub const SECRET: &str = "the cluster secret of this test, long enough";
pub const LEASE_SECS: u64 = 3;

pub struct Node {
    pub name: String,
    pub ns: String,
    pub addr: String,
    pub paths: Paths,
    pub child: Option<Child>,
    pub endpoints: String,
    pub extra: Vec<String>,
}

impl Node {
    pub fn new(
        home: &str,
        name: &str,
        ns: &str,
        addr: &str,
        endpoints: &str,
        extra: &[String],
    ) -> Node {
        let paths = infra::isolated_home(&format!("{home}-{name}"));
        super::stop_daemon_of(&paths);
        // A new node: no ledger, no snapshots, and no log of an earlier run to be read as this
        // one's.
        for f in ["cluster-ledger.json", "daemon.log", "daemon-test.log"] {
            let _ = std::fs::remove_file(paths.home().join(f));
        }
        for d in ["snapshots", "objects"] {
            forkbox_engine::tree::remove_tree(&paths.home().join(d))
                .expect("remove what an earlier run left");
        }
        Node::in_home(paths, name, ns, addr, endpoints, extra)
    }

    /// A node on a home that holds nothing but the guest kernel (and, `with_images`, the
    /// test home's images): a node as it is on its first day.
    pub fn fresh(
        home: &str,
        name: &str,
        ns: &str,
        addr: &str,
        endpoints: &str,
        with_images: bool,
        extra: &[String],
    ) -> Node {
        let fresh = infra::home()
            .home()
            .join("fresh")
            .join(format!("{home}-{name}"));
        super::stop_daemon_of(&Paths::new(fresh));
        let paths = infra::fresh_home(&format!("{home}-{name}"), with_images);
        Node::in_home(paths, name, ns, addr, endpoints, extra)
    }

    pub fn in_home(
        paths: Paths,
        name: &str,
        ns: &str,
        addr: &str,
        endpoints: &str,
        extra: &[String],
    ) -> Node {
        let mut n = Node {
            name: name.into(),
            ns: ns.into(),
            addr: addr.into(),
            paths,
            child: None,
            endpoints: endpoints.into(),
            extra: extra.to_vec(),
        };
        n.start();
        n
    }

    /// `forkbox` of this build in the node's namespace and home.
    pub fn forkbox(&self) -> Command {
        let mut c = ClusterNet::command_in(&self.ns, env!("CARGO_BIN_EXE_forkbox"));
        c.env("FORKBOX_HOME", self.paths.home())
            .env_remove("FORKBOX_API")
            .env_remove("FORKBOX_TOKEN")
            .env_remove("FORKBOX_ACCEL")
            .env("FORKBOX_POOL_SIZE", "0")
            .env("FORKBOX_CLUSTER_SECRET", SECRET)
            .stdin(Stdio::null());
        c
    }

    pub fn start(&mut self) {
        // Its TCP listener (what other nodes forward to) opens after the socket: a restart is
        // done when the log says it listens once more than before.
        let tcp_up = |n: &Node| n.log().matches("(bearer tokens required)").count();
        let before = tcp_up(self);
        let log = std::fs::File::create(self.paths.home().join("daemon-test.log")).unwrap();
        let child = self
            .forkbox()
            .args(["serve", "--listen", &format!("{}:7070", self.addr)])
            .args(["--cluster", &self.endpoints, "--node", &self.name])
            .args(["--advertise", &format!("http://{}:7070", self.addr)])
            .args(["--lease", &LEASE_SECS.to_string()])
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let socket = forkbox_server::socket_path(&self.paths);
        assert!(
            infra::wait_until(Duration::from_secs(60), || {
                std::os::unix::net::UnixStream::connect(&socket).is_ok()
            }),
            "node {} did not start: {}",
            self.name,
            self.log()
        );
        assert!(
            infra::wait_until(Duration::from_secs(60), || tcp_up(self) > before),
            "node {} did not listen on TCP: {}",
            self.name,
            self.log()
        );
    }

    /// The daemon's log (its home's daemon.log) and what it printed.
    pub fn log(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.paths.home().join(f)).unwrap_or_default();
        format!("{}{}", read("daemon.log"), read("daemon-test.log"))
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `forkbox ARGS` here; its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.forkbox().args(args).output().unwrap()
    }

    /// Runs `forkbox ARGS` here and fails the test when it fails; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "forkbox {args:?} on {} failed: {}{}\n-- its log:\n{}",
            self.name,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            self.log()
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// The cluster's sandboxes as this node lists them: (id, state, node).
    pub fn ls(&self) -> Vec<(String, String, String)> {
        let v: serde_json::Value =
            serde_json::from_str(&self.ok(&["sandbox", "ls", "--json"])).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["id"].as_str().unwrap().to_string(),
                    s["state"].as_str().unwrap().to_string(),
                    s["node"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    pub fn create(&self, extra: &[&str]) -> (String, String) {
        let mut args = vec!["sandbox", "create", "--json"];
        args.extend_from_slice(extra);
        let v: serde_json::Value = serde_json::from_str(&self.ok(&args)).unwrap();
        (
            v["id"].as_str().unwrap().to_string(),
            v["node"].as_str().unwrap().to_string(),
        )
    }

    /// Fails the test unless sandbox `id` runs a command through this node.
    pub fn answers(&self, id: &str) {
        assert_eq!(
            self.ok(&["sandbox", "exec", id, "--", "echo", "up"]).trim(),
            "up",
            "sandbox {id} through {}",
            self.name
        );
    }

    pub fn qemus(&self) -> usize {
        infra::qemus_of(&self.paths).len()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A 3-member etcd in the hub's namespace and nodes a, b and c, each in its own; dropped in
/// the order that stops the nodes before etcd and the namespaces.
pub struct TestCluster {
    pub nodes: Vec<Node>,
    pub etcd: EtcdCluster,
    pub endpoints: String,
    pub _net: ClusterNet,
}

/// Mutual TLS as an operator sets it up, with this build's CLI: a cluster CA
/// (`cluster init-ca`), a certificate per node and one etcd serves with (`cluster
/// issue-cert`), in `root/ca`, `root/NAME` and `root/etcd`.
pub struct Tls {
    pub root: tempfile::TempDir,
}

impl Tls {
    pub fn new(etcd_host: &str) -> Tls {
        let root = tempfile::tempdir().unwrap();
        let ca = root.path().join("ca");
        let cli = |args: &[&str]| {
            let o = Command::new(env!("CARGO_BIN_EXE_forkbox"))
                .env("FORKBOX_HOME", root.path().join("home"))
                .args(args)
                .output()
                .unwrap();
            assert!(o.status.success(), "forkbox {args:?}: {}", stderr(&o));
        };
        cli(&["cluster", "init-ca", "--dir", ca.to_str().unwrap()]);
        for (name, hosts) in [("a", ""), ("b", ""), ("c", ""), ("etcd", etcd_host)] {
            let out = root.path().join(name);
            let mut args = vec!["cluster", "issue-cert", "--ca", ca.to_str().unwrap()];
            args.extend(["--node", name, "--out", out.to_str().unwrap()]);
            if !hosts.is_empty() {
                args.extend(["--host", hosts]);
            }
            cli(&args);
        }
        Tls { root }
    }

    pub fn dir(&self, name: &str) -> std::path::PathBuf {
        self.root.path().join(name)
    }

    /// What etcd serves with and checks clients against.
    pub fn etcd(&self) -> infra::etcd::EtcdTls {
        let d = self.dir("etcd");
        infra::etcd::EtcdTls {
            ca: d.join("ca.pem"),
            cert: d.join("node.pem"),
            key: d.join("node.key"),
        }
    }
}

impl TestCluster {
    pub fn start(home: &str, extra: &[String]) -> TestCluster {
        TestCluster::start_with(|name, ns, addr, endpoints| {
            Node::new(home, name, ns, addr, endpoints, extra)
        })
    }

    /// Nodes on fresh homes (see [`Node::fresh`]); those named in `built` hold the images.
    pub fn start_fresh(home: &str, built: &[&str]) -> TestCluster {
        TestCluster::start_with(|name, ns, addr, endpoints| {
            Node::fresh(home, name, ns, addr, endpoints, built.contains(&name), &[])
        })
    }

    /// [`TestCluster::start_fresh`] with mutual TLS between the nodes and etcd on https with
    /// client certificates.
    pub fn start_fresh_tls(home: &str, built: &[&str]) -> (TestCluster, Tls) {
        let net = ClusterNet::new(3);
        let tls = Tls::new(&net.hub_ip);
        let c = TestCluster::start_on_etcd(net, Some(tls.etcd()), |name, ns, addr, endpoints| {
            let extra = [
                "--cluster-tls".to_string(),
                tls.dir(name).display().to_string(),
            ];
            Node::fresh(
                home,
                name,
                ns,
                addr,
                endpoints,
                built.contains(&name),
                &extra,
            )
        });
        (c, tls)
    }

    pub fn start_with(node: impl Fn(&str, &str, &str, &str) -> Node) -> TestCluster {
        TestCluster::start_on(ClusterNet::new(3), node)
    }

    pub fn start_on(net: ClusterNet, node: impl Fn(&str, &str, &str, &str) -> Node) -> TestCluster {
        TestCluster::start_on_etcd(net, None, node)
    }

    pub fn start_on_etcd(
        net: ClusterNet,
        etcd_tls: Option<infra::etcd::EtcdTls>,
        node: impl Fn(&str, &str, &str, &str) -> Node,
    ) -> TestCluster {
        let hub = Some(net.hub.as_str()).filter(|h| !h.is_empty());
        let etcd = EtcdCluster::start_with(3, &net.hub_ip, hub, etcd_tls);
        let endpoints = etcd.endpoints_arg();
        let nodes = ["a", "b", "c"]
            .iter()
            .zip(&net.nodes)
            .map(|(name, (ns, addr))| node(name, ns, addr, &endpoints))
            .collect::<Vec<Node>>();
        // A node serves before it joins when etcd is slow to answer at its start: wait until
        // every one has joined, so a pin to any of them is placed.
        for n in &nodes {
            assert!(
                infra::wait_until(Duration::from_secs(30), || n
                    .log()
                    .contains(&format!("joined as node {}", n.name))),
                "node {} did not join: {}",
                n.name,
                n.log()
            );
        }
        TestCluster {
            nodes,
            etcd,
            endpoints,
            _net: net,
        }
    }
}
