//! A real etcd cluster for tests: Debian's `etcd` members on loopback (or on an address the
//! test's own namespaces reach), each with a data directory of its own, stopped on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One member: its name, ports and process (none while stopped).
struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// Client TLS of the members: the certificate and key they serve with (its names must
/// include the members' host), and the CA a client's certificate must come from
/// (`--client-cert-auth`). etcdctl calls with the same certificate.
#[derive(Clone, Debug)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct EtcdCluster {
    dir: tempfile::TempDir,
    tls: Option<EtcdTls>,
    host: String,
    /// The network namespace the members run in (none: this one).
    netns: Option<String>,
    initial: String,
    members: Vec<Member>,
}

/// A port free now on `host` (the kernel's pick; the member binds it right after).
pub fn free_port(host: &str) -> u16 {
    std::net::TcpListener::bind((host, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl EtcdCluster {
    /// Starts `n` members on `host` and waits until the cluster has a leader.
    pub fn start(n: usize, host: &str) -> EtcdCluster {
        EtcdCluster::start_in(n, host, None)
    }

    /// The same inside network namespace `netns` (fresh, so its ports are fixed ones).
    pub fn start_in(n: usize, host: &str, netns: Option<&str>) -> EtcdCluster {
        EtcdCluster::start_with(n, host, netns, None)
    }

    /// The same, its clients on https with client certificates required when `tls` is given.
    pub fn start_with(
        n: usize,
        host: &str,
        netns: Option<&str>,
        tls: Option<EtcdTls>,
    ) -> EtcdCluster {
        // In memory when the host has a tmpfs: etcd syncs every write, and a disk busy with
        // the suite's VMs would stall it past the cluster's deadlines (what is under test
        // is forkbox's use of etcd, not etcd's durability).
        let builder = tempfile::Builder::new().prefix("forkbox-etcd-").clone();
        let dir = match std::path::Path::new("/dev/shm").is_dir() {
            true => builder.tempdir_in("/dev/shm"),
            false => builder.tempdir(),
        }
        .expect("a temporary directory");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("e{i}"),
                client: match netns {
                    Some(_) => 2379 + 10 * i as u16,
                    None => free_port(host),
                },
                peer: match netns {
                    Some(_) => 2380 + 10 * i as u16,
                    None => free_port(host),
                },
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://{host}:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = EtcdCluster {
            dir,
            tls,
            host: host.to_string(),
            netns: netns.map(str::to_string),
            initial,
            members,
        };
        for i in 0..n {
            c.spawn(i, "new");
        }
        assert!(
            crate::wait_until(Duration::from_secs(30), || c.healthy()),
            "etcd did not become healthy: {}",
            c.logs()
        );
        c
    }

    fn command(&self, program: &str) -> Command {
        match &self.netns {
            Some(ns) => crate::cluster_net::ClusterNet::command_in(ns, program),
            None => Command::new(program),
        }
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(&self.members[i].name)
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let host = self.host.clone();
        let data = self.data_dir(i);
        let log = std::fs::File::create(self.dir.path().join(format!("e{i}.log")))
            .expect("an etcd log file");
        let mut cmd = self.command("etcd");
        let scheme = self.scheme();
        let m = &mut self.members[i];
        let client = format!("{scheme}://{host}:{}", m.client);
        let peer = format!("http://{host}:{}", m.peer);
        if let Some(t) = &self.tls {
            cmd.arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--cert-file")
                .arg(&t.cert)
                .arg("--key-file")
                .arg(&t.key);
        }
        let child = cmd
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-token", "forkbox-test"])
            .args(["--initial-cluster-state", state])
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("a log handle"))
            .stderr(log)
            .spawn()
            .expect("etcd runs (Debian's etcd-server; the test command installs it)");
        m.child = Some(child);
    }

    /// Client URLs of every member, stopped ones included.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://{}:{}", self.scheme(), self.host, m.client))
            .collect()
    }

    fn scheme(&self) -> &'static str {
        self.tls.as_ref().map_or("http", |_| "https")
    }

    fn etcdctl(&self, endpoints: &[String]) -> Command {
        let mut c = self.command("etcdctl");
        c.env("ETCDCTL_API", "3").args([
            "--endpoints",
            &endpoints.join(","),
            "--command-timeout=2s",
        ]);
        if let Some(t) = &self.tls {
            c.arg("--cacert")
                .arg(&t.ca)
                .arg("--cert")
                .arg(&t.cert)
                .arg("--key")
                .arg(&t.key);
        }
        c
    }

    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    /// Kills member `i` (its data stays, so it can come back).
    pub fn stop(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data.
    pub fn restart(&mut self, i: usize) {
        if self.members[i].child.is_none() {
            self.spawn(i, "existing");
        }
    }

    /// Whether the running members answer as a cluster with a leader.
    pub fn healthy(&self) -> bool {
        let running: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| format!("{}://{}:{}", self.scheme(), self.host, m.client))
            .collect();
        self.etcdctl(&running)
            .args(["endpoint", "health"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The index of the member that leads now, as the running members say (None while they
    /// elect, or without a quorum).
    pub fn leader(&self) -> Option<usize> {
        let endpoints = self.endpoints();
        let out = self
            .etcdctl(&endpoints)
            .args(["endpoint", "status", "-w", "json"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        status.as_array()?.iter().find_map(|e| {
            let s = &e["Status"];
            let leads = s["leader"].as_u64()? == s["header"]["member_id"].as_u64()?;
            let at = e["Endpoint"].as_str()?;
            leads.then(|| endpoints.iter().position(|x| x == at))?
        })
    }

    /// Every member's log, for a failure message.
    pub fn logs(&self) -> String {
        (0..self.members.len())
            .map(|i| {
                let p = self.dir.path().join(format!("e{i}.log"));
                let text = std::fs::read_to_string(p).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                format!(
                    "-- e{i}:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i);
        }
    }
}
