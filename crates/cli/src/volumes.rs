//! `forkbox volume create|ls|rm`, through the daemon.

use std::process::ExitCode;

use forkbox_engine::api::{VolumeCreateRequest, VolumeView};
use forkbox_engine::paths::Paths;

use crate::daemon::{connect, current_thread, each};

#[derive(clap::Subcommand)]
pub enum VolumeCmd {
    /// Make a volume: a disk of its own (ext4) that outlives the sandboxes that mount it
    /// (`--volume NAME:/path[:ro]` on `sandbox create`, `sandbox fork`). Its whole size is
    /// taken on the host's disk now.
    Create {
        /// 1 to 63 of a-z, 0-9, '-', '_' and '.'.
        name: String,
        /// Its size: 512m, 10g, 1t (default 1g).
        #[arg(long, value_parser = crate::units::volume_size)]
        size: Option<String>,
        /// In a cluster: the node it lives on (sandboxes that mount it are placed there).
        #[arg(long)]
        node: Option<String>,
        /// Print the volume as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List volumes, with the sandboxes that have each mounted.
    Ls {
        /// Print only the names, one a line.
        #[arg(short = 'q', long, conflicts_with = "json")]
        quiet: bool,
        /// Print the volumes as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove volumes and what is on them (refused while a sandbox has one mounted).
    Rm {
        /// Volume names.
        #[arg(required = true)]
        names: Vec<String>,
        /// Print the removed volumes as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn volume(paths: &Paths, cmd: VolumeCmd) -> anyhow::Result<ExitCode> {
    let rt = current_thread()?;
    rt.block_on(async {
        let c = connect(paths).await?;
        match cmd {
            VolumeCmd::Create {
                name,
                size,
                node,
                json,
            } => {
                let v = c
                    .create_volume(&VolumeCreateRequest { name, size, node })
                    .await?;
                if json {
                    crate::print_json(&v)?;
                } else {
                    println!("{}", v.name);
                }
                Ok(ExitCode::SUCCESS)
            }
            VolumeCmd::Ls { quiet, json } => {
                let all = c.list_volumes().await?;
                if json {
                    crate::print_json(&all)?;
                } else if quiet {
                    all.iter().for_each(|v| println!("{}", v.name));
                } else if all.is_empty() {
                    println!("no volumes");
                } else {
                    println!("{:<24} {:>10}  MOUNTED BY", "NAME", "SIZE");
                    all.iter().for_each(|v| println!("{}", line(v)));
                }
                Ok(ExitCode::SUCCESS)
            }
            VolumeCmd::Rm { names, json } => {
                each(&names, json, "removed", async |n| c.remove_volume(n).await).await
            }
        }
    })
}

fn line(v: &VolumeView) -> String {
    let holders: Vec<String> = v
        .holders
        .iter()
        .map(|h| match h.read_only {
            true => format!("{} (ro)", h.sandbox),
            false => h.sandbox.clone(),
        })
        .collect();
    let size = match v.size_bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b => format!("{} MiB", b >> 20),
    };
    let node = v
        .node
        .as_deref()
        .map(|n| format!("  [node {n}]"))
        .unwrap_or_default();
    format!(
        "{:<24} {:>10}  {}{node}",
        v.name,
        size,
        if holders.is_empty() {
            "-".to_string()
        } else {
            holders.join(", ")
        }
    )
}
