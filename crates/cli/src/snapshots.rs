//! `forkbox snapshot ls` and `forkbox snapshot rm`, through the daemon.

use std::process::ExitCode;

use forkbox_engine::paths::Paths;
use forkbox_engine::snapshot::SnapshotMeta;

use crate::daemon::{connect, current_thread, each};

#[derive(clap::Subcommand)]
pub enum SnapshotCmd {
    /// List snapshots (those forkbox made for its own forks and hibernations with --all).
    Ls {
        /// Also the snapshots forkbox made itself (`fork-of-…`, `hibernated-…`).
        #[arg(long)]
        all: bool,
        /// Print only the names, one a line.
        #[arg(short = 'q', long, conflicts_with = "json")]
        quiet: bool,
        /// Print the snapshots as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete snapshots (refused while sandboxes or snapshots depend on one).
    Rm {
        /// Snapshot names.
        #[arg(required = true)]
        names: Vec<String>,
        /// Print the deleted snapshots as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn snapshot(paths: &Paths, cmd: SnapshotCmd) -> anyhow::Result<ExitCode> {
    let rt = current_thread()?;
    rt.block_on(async {
        let c = connect(paths).await?;
        match cmd {
            SnapshotCmd::Ls {
                all: every,
                quiet,
                json,
            } => {
                let mut all: Vec<SnapshotMeta> = c.list_snapshots().await?;
                if !every {
                    all.retain(|m| !m.internal());
                }
                if json {
                    crate::print_json(&all)?;
                } else if quiet {
                    all.iter().for_each(|m| println!("{}", m.name));
                } else if all.is_empty() {
                    println!("no snapshots");
                } else {
                    println!(
                        "{:<32} {:<24} {:<16} {:<24} {:>8} {:>9}",
                        "NAME", "IMAGE", "FROM", "PARENT", "RAM", "ALONE"
                    );
                    for m in all {
                        println!(
                            "{:<32} {:<24} {:<16} {:<24} {:>4} MiB {:>5} MiB",
                            m.name,
                            m.image,
                            m.from_sandbox.as_deref().unwrap_or("-"),
                            m.parent.as_deref().unwrap_or("-"),
                            m.memory_bytes >> 20,
                            m.held_alone_bytes.unwrap_or(0) >> 20
                        );
                    }
                }
                Ok(ExitCode::SUCCESS)
            }
            SnapshotCmd::Rm { names, json } => {
                each(&names, json, "removed", async |n| {
                    c.delete_snapshot(n).await
                })
                .await
            }
        }
    })
}
