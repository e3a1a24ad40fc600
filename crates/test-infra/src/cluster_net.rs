//! Network namespaces for a cluster test: a hub namespace with a bridge (and etcd on it), and
//! one namespace per node, each joined to the bridge by a veth pair. Only addresses inside
//! these namespaces are used; all of it is removed on drop. Needs root and `ip` (iproute2).

use std::process::Command;

use crate::{ip, ip_quiet};

pub struct ClusterNet {
    /// The hub's namespace: the bridge and `hub_ip` live there.
    pub hub: String,
    pub hub_ip: String,
    /// Per node: its namespace and address.
    pub nodes: Vec<(String, String)>,
}

impl ClusterNet {
    /// A hub and `n` node namespaces on a /24 of their own.
    pub fn new(n: usize) -> ClusterNet {
        let pid = std::process::id();
        // The whole pid: a namespace of this name is a dead process's leftover, cleared.
        let tag = format!("fbc{pid:x}");
        let net = format!("10.{}.{}", 200 + pid % 50, pid / 50 % 250);
        let hub = format!("{tag}hub");
        let hub_ip = format!("{net}.1");
        for i in 0..n {
            ip_quiet(&["netns", "del", &format!("{tag}n{i}")]);
        }
        ip_quiet(&["netns", "del", &hub]);
        ip(&["netns", "add", &hub]);
        ip(&["-n", &hub, "link", "set", "lo", "up"]);
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&[
            "-n",
            &hub,
            "addr",
            "add",
            &format!("{hub_ip}/24"),
            "dev",
            "br0",
        ]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        let mut nodes = Vec::new();
        for i in 0..n {
            let ns = format!("{tag}n{i}");
            let addr = format!("{net}.{}", 10 + i);
            ip(&["netns", "add", &ns]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            let (outer, inner) = (format!("v{i}h"), format!("v{i}n"));
            ip(&[
                "-n", &hub, "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns",
                &ns,
            ]);
            ip(&["-n", &hub, "link", "set", &outer, "master", "br0"]);
            ip(&["-n", &hub, "link", "set", &outer, "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &inner,
            ]);
            ip(&["-n", &ns, "link", "set", &inner, "up"]);
            nodes.push((ns, addr));
        }
        ClusterNet { hub, hub_ip, nodes }
    }

    /// A hub and `n` nodes on addresses of the host's own loopback (127.0.0.0/8), in the
    /// host's network namespace: for nodes that must reach what the host reaches (a
    /// distribution's mirror for an image build). Names no namespace (`hub` and each node's
    /// are empty).
    pub fn loopback(n: usize) -> ClusterNet {
        let pid = std::process::id();
        let net = format!("127.{}.{}", 100 + pid % 100, pid / 100 % 250);
        ClusterNet {
            hub: String::new(),
            hub_ip: format!("{net}.1"),
            nodes: (0..n)
                .map(|i| (String::new(), format!("{net}.{}", 10 + i)))
                .collect(),
        }
    }

    /// `program` run inside namespace `ns` (the host's own when `ns` is empty).
    pub fn command_in(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        if ns.is_empty() {
            return Command::new(program);
        }
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }
}

impl Drop for ClusterNet {
    fn drop(&mut self) {
        if self.hub.is_empty() {
            return;
        }
        for (ns, _) in &self.nodes {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.hub])
            .status();
    }
}
