//! `forkbox cluster status`, `forkbox node drain` and cluster-wide tokens: an operator's view
//! of the cluster, straight from etcd (the same state every node reads).

use std::process::ExitCode;

use anyhow::Context;
use forkbox_cluster::{Cluster, TokenRecord};

use crate::daemon::show;

/// Where the cluster's etcd is and its secret: the same flags and variables `serve` takes.
#[derive(clap::Args, Debug)]
pub struct Reach {
    /// The cluster's etcd client URLs, comma-separated.
    #[arg(
        long,
        env = "FORKBOX_CLUSTER",
        value_name = "ETCD_URL[,…]",
        value_delimiter = ',',
        required = true
    )]
    pub cluster: Vec<String>,
    /// A file holding the cluster secret; or set FORKBOX_CLUSTER_SECRET.
    #[arg(long, value_name = "FILE")]
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// For an etcd on https: a directory of the CA (ca.pem, or etcd's as etcd-ca.pem) and a
    /// certificate of the cluster CA (node.pem, node.key; `cluster issue-cert --node operator`).
    #[arg(long, env = "FORKBOX_CLUSTER_TLS", value_name = "DIR")]
    pub cluster_tls: Option<std::path::PathBuf>,
}

impl Reach {
    pub async fn connect(self) -> anyhow::Result<Cluster> {
        let secret = crate::serve::cluster_secret(self.cluster_secret_file)?;
        let tls = self
            .cluster_tls
            .map(|d| forkbox_cluster::tls::Identity::load_any(&d))
            .transpose()
            .map_err(anyhow::Error::msg)?;
        Ok(Cluster::operator(self.cluster, secret, tls).await?)
    }
}

#[derive(clap::Subcommand)]
pub enum ClusterCmd {
    /// The nodes (address, lease, capacity, what they hold, drained), the sandboxes per node,
    /// and etcd's members with their health.
    Status {
        #[command(flatten)]
        reach: Reach,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make the cluster's CA for mutual TLS between nodes: DIR/ca.pem (give it to every node)
    /// and DIR/ca.key (mode 0600; keep it off the nodes). Nothing is overwritten.
    InitCa {
        /// Where to write them.
        #[arg(long, value_name = "DIR")]
        dir: std::path::PathBuf,
    },
    /// Issue node NAME's certificate, signed by the CA in --ca: OUT/node.pem, OUT/node.key and
    /// a copy of OUT/ca.pem, what `forkbox serve --cluster-tls OUT` takes. Nothing is
    /// overwritten.
    IssueCert {
        /// The CA's directory (from `cluster init-ca`).
        #[arg(long, value_name = "DIR")]
        ca: std::path::PathBuf,
        /// The node's name, as its --node (the certificate is bound to it).
        #[arg(long)]
        node: String,
        /// More names it may serve under: an IP address or DNS name (an etcd member's, for a
        /// certificate etcd serves with); repeatable.
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
        /// Days it stays valid.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Where to write it.
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
    },
}

#[derive(clap::Subcommand)]
pub enum NodeCmd {
    /// Stop placing new sandboxes on NAME (running ones stay, and are listed).
    Drain {
        /// The node's name.
        name: String,
        /// Undo: place on it again.
        #[arg(long)]
        undo: bool,
        #[command(flatten)]
        reach: Reach,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

pub fn cluster(cmd: ClusterCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        ClusterCmd::Status { reach, json } => status(reach, json),
        ClusterCmd::InitCa { dir } => {
            let (cert, key) = forkbox_cluster::tls::init_ca(&dir).map_err(anyhow::Error::msg)?;
            println!(
                "cluster CA: {} (every node's), key {} (keep it off the nodes)",
                cert.display(),
                key.display()
            );
            println!(
                "next, per node: forkbox cluster issue-cert --ca {} --node NAME --out DIR",
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        ClusterCmd::IssueCert {
            ca,
            node,
            hosts,
            days,
            out,
        } => {
            if days == 0 {
                anyhow::bail!("--days must be 1 or more");
            }
            let req = forkbox_cluster::tls::Request {
                node: node.clone(),
                hosts,
                not_after_unix: (forkbox_cluster::now_ms() / 1000) as i64
                    + i64::from(days) * 86_400,
            };
            let files = forkbox_cluster::tls::issue(&ca, &req, &out).map_err(anyhow::Error::msg)?;
            for f in &files {
                println!("{}", f.display());
            }
            println!(
                "node {node}'s certificate ({}), valid {days} days: forkbox serve --cluster-tls {} …",
                forkbox_cluster::tls::dns_name(&node),
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn status(reach: Reach, json: bool) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let c = reach.connect().await?;
        let nodes = c.nodes().await?;
        let owned = c.owned().await?;
        let members = c.members().await?;
        let now = forkbox_cluster::now_ms();
        let count = |n: &str| owned.iter().filter(|o| o.node == n).count();
        let gone: Vec<&str> = owned
            .iter()
            .filter(|o| !nodes.iter().any(|n| n.name == o.node))
            .map(|o| o.view.info.id.as_str())
            .collect();
        let status = serde_json::json!({
            "nodes": nodes.iter().map(|n| serde_json::json!({
                "record": n,
                "record_age_ms": now.saturating_sub(n.updated_unix_ms),
                "sandboxes_recorded": count(&n.name),
            })).collect::<Vec<_>>(),
            "lost_sandboxes": gone,
            "etcd_members": members,
        });
        show(json, &status, || {
            println!(
                "{:<12} {:<26} {:<5} {:>5} {:>10} {:>10} {:>9} {:<8}",
                "NODE", "ADVERTISE", "ACCEL", "CPUS", "MEM FREE", "DISK FREE", "SANDBOXES", "STATE"
            );
            for n in &nodes {
                println!(
                    "{:<12} {:<26} {:<5} {:>5} {:>6} MiB {:>6} MiB {:>9} {:<8}",
                    n.name,
                    n.advertise,
                    n.accel,
                    n.cpus,
                    n.mem_free_mib,
                    n.disk_free_mib,
                    count(&n.name),
                    if n.drained { "drained" } else { "ready" }
                );
            }
            if !gone.is_empty() {
                println!("lost (their node is gone): {}", gone.join(" "));
            }
            println!(
                "\n{:<8} {:<28} {:<8} {:<6}",
                "MEMBER", "CLIENT URL", "HEALTH", "LEADER"
            );
            for m in &members {
                println!(
                    "{:<8} {:<28} {:<8} {:<6}{}",
                    m.name,
                    m.client_urls.first().map_or("-", String::as_str),
                    if m.healthy { "healthy" } else { "DOWN" },
                    if m.is_leader { "yes" } else { "" },
                    m.error
                        .as_deref()
                        .map(|e| format!("  ({e})"))
                        .unwrap_or_default()
                );
            }
        })
    })
}

pub fn node(cmd: NodeCmd) -> anyhow::Result<ExitCode> {
    let NodeCmd::Drain {
        name,
        undo,
        reach,
        json,
    } = cmd;
    runtime()?.block_on(async {
        let c = reach.connect().await?;
        let nodes = c.nodes().await?;
        if !undo && !nodes.iter().any(|n| n.name == name) {
            let live: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
            anyhow::bail!("no node named {name:?} is live (live: {})", live.join(", "));
        }
        c.drain(&name, !undo).await?;
        let running: Vec<String> = c
            .owned()
            .await?
            .into_iter()
            .filter(|o| o.node == name)
            .map(|o| o.view.info.id)
            .collect();
        let out = serde_json::json!({ "node": name, "drained": !undo, "sandboxes": running });
        show(json, &out, || {
            match undo {
                true => println!("{name}: takes new sandboxes again"),
                false => println!("{name}: drained (no new placements)"),
            }
            if !running.is_empty() {
                println!("still running there: {}", running.join(" "));
            }
        })
    })
}

/// Stores `token`'s hash in the cluster: it works on every node.
pub fn add_token(reach: Reach, name: &str, token: &str) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let c = reach.connect().await?;
        let created_unix = forkbox_cluster::now_ms() / 1000;
        let record = TokenRecord {
            name: name.to_string(),
            sha256: forkbox_server::auth::hash_hex(token),
            created_unix,
        };
        c.add_token(&record)
            .await
            .context("storing the token's hash in the cluster")
    })
}

/// Revokes every token named `name` cluster-wide; how many.
pub fn revoke_tokens(reach: Reach, name: &str) -> anyhow::Result<usize> {
    runtime()?.block_on(async { Ok(reach.connect().await?.revoke_tokens(name).await?) })
}
