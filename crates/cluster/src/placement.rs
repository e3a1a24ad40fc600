//! Which node a new sandbox goes to: a pure decision over the live nodes' records.
//!
//! A pinned node must be live, not drained, and have room (it brings a snapshot it lacks from
//! the holders, by chunks). Otherwise the nodes with room are ranked: those holding the snapshot
//! a copy starts from come first when one of them has room (else any node with room, which
//! brings it), one holding the image comes next, then the most memory free per sandbox already
//! placed. No room anywhere is an error that names what is short on each node.

use crate::NodeRecord;

/// Memory a node keeps for itself beyond its guests, MiB.
pub const HOST_RESERVE_MIB: u64 = 256;
/// Disk a node must have free to take a sandbox, MiB.
pub const MIN_DISK_MIB: u64 = 512;

/// What is being placed.
#[derive(Debug, Clone, Default)]
pub struct Want<'a> {
    /// `--node`: this node or an error.
    pub pinned: Option<&'a str>,
    /// The image (`name` or `name@N`), when it is known.
    pub image: Option<&'a str>,
    /// The snapshot the copies start from.
    pub snapshot: Option<&'a str>,
    /// Memory of each copy, MiB.
    pub memory_mib: u64,
    /// How many copies.
    pub count: u32,
    /// The volumes it mounts: each lives on one node, which the sandbox must be on.
    pub volumes: &'a [String],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error("no node named {name:?} is live in the cluster (live: {live})")]
    UnknownNode { name: String, live: String },
    #[error("node {0} is drained: it takes no new sandboxes (undrain it, or pick another)")]
    Drained(String),
    #[error("no live node holds snapshot {0:?}")]
    NoHolder(String),
    #[error("no live node holds volume {0:?}")]
    NoVolume(String),
    #[error(
        "volume {volume} lives on node {holder}, and a sandbox that mounts it runs there: {why}"
    )]
    VolumeElsewhere {
        volume: String,
        holder: String,
        why: String,
    },
    #[error("no node has room for {count} × {memory_mib} MiB: {short}")]
    NoRoom {
        count: u32,
        memory_mib: u64,
        short: String,
    },
}

fn holds(list: &[String], name: &str) -> bool {
    list.iter().any(|h| {
        h == name || h.split_once('@').map(|(n, _)| n) == Some(name) // `py` matches `py@3`
    })
}

/// What `n` lacks for `want`, if anything.
fn shortfall(n: &NodeRecord, want: &Want) -> Option<String> {
    let need = want.memory_mib * u64::from(want.count.max(1)) + HOST_RESERVE_MIB;
    if n.mem_free_mib < need {
        return Some(format!(
            "{} has {} MiB free for guests (needs {need})",
            n.name, n.mem_free_mib
        ));
    }
    if n.disk_free_mib < MIN_DISK_MIB {
        return Some(format!(
            "{} has {} MiB of disk free (needs {MIN_DISK_MIB})",
            n.name, n.disk_free_mib
        ));
    }
    None
}

fn names<'a>(nodes: impl Iterator<Item = &'a NodeRecord>) -> String {
    let v: Vec<&str> = nodes.map(|n| n.name.as_str()).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// The one node holding every volume `want` mounts (none when it mounts none).
fn volume_home<'n>(
    nodes: &'n [NodeRecord],
    want: &Want,
) -> Result<Option<&'n NodeRecord>, PlaceError> {
    let mut home: Option<&NodeRecord> = None;
    for v in want.volumes {
        let Some(h) = nodes.iter().find(|n| n.volumes.contains(v)) else {
            return Err(PlaceError::NoVolume(v.clone()));
        };
        match home {
            Some(o) if o.name != h.name => {
                return Err(PlaceError::VolumeElsewhere {
                    volume: v.clone(),
                    holder: h.name.clone(),
                    why: format!("another volume it mounts lives on node {}", o.name),
                })
            }
            _ => home = Some(h),
        }
    }
    Ok(home)
}

/// The node for `want` among the live `nodes`.
pub fn place(nodes: &[NodeRecord], want: &Want) -> Result<String, PlaceError> {
    if let Some(home) = volume_home(nodes, want)? {
        let volume = want.volumes.first().cloned().unwrap_or_default();
        let elsewhere = |why: String| PlaceError::VolumeElsewhere {
            volume: volume.clone(),
            holder: home.name.clone(),
            why,
        };
        if let Some(p) = want.pinned.filter(|p| *p != home.name) {
            return Err(elsewhere(format!("it was asked for on node {p}")));
        }
        if home.drained {
            return Err(elsewhere("that node is drained".into()));
        }
        return match shortfall(home, want) {
            Some(short) => Err(elsewhere(short)),
            None => Ok(home.name.clone()),
        };
    }
    if let Some(p) = want.pinned {
        let Some(n) = nodes.iter().find(|n| n.name == p) else {
            return Err(PlaceError::UnknownNode {
                name: p.to_string(),
                live: names(nodes.iter()),
            });
        };
        if n.drained {
            return Err(PlaceError::Drained(p.to_string()));
        }
        return match shortfall(n, want) {
            Some(short) => Err(PlaceError::NoRoom {
                count: want.count.max(1),
                memory_mib: want.memory_mib,
                short,
            }),
            None => Ok(p.to_string()),
        };
    }
    let mut candidates: Vec<&NodeRecord> = nodes.iter().filter(|n| !n.drained).collect();
    if let Some(s) = want.snapshot {
        if !nodes.iter().any(|n| holds(&n.snapshots, s)) {
            return Err(PlaceError::NoHolder(s.to_string()));
        }
        // A holder with room restores at once; a node without the snapshot brings it first.
        if candidates
            .iter()
            .any(|n| holds(&n.snapshots, s) && shortfall(n, want).is_none())
        {
            candidates.retain(|n| holds(&n.snapshots, s));
        }
    }
    let (fit, short): (Vec<&NodeRecord>, Vec<&NodeRecord>) = candidates
        .into_iter()
        .partition(|n| shortfall(n, want).is_none());
    if fit.is_empty() {
        let mut why: Vec<String> = short.iter().filter_map(|n| shortfall(n, want)).collect();
        if why.is_empty() {
            why.push("no live, undrained node".into());
        }
        return Err(PlaceError::NoRoom {
            count: want.count.max(1),
            memory_mib: want.memory_mib,
            short: why.join("; "),
        });
    }
    let best = fit.into_iter().max_by(|a, b| {
        let key = |n: &NodeRecord| {
            let local = want.image.is_some_and(|i| holds(&n.images, i));
            let per = n.mem_free_mib / (u64::from(n.sandboxes) + 1);
            (local, per, std::cmp::Reverse(n.name.clone()))
        };
        key(a).cmp(&key(b))
    });
    Ok(best.map(|n| n.name.clone()).unwrap_or_default())
}

#[cfg(test)]
mod volume_tests {
    use super::*;

    fn node(name: &str, volumes: &[&str]) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            mem_free_mib: 8192,
            disk_free_mib: 8192,
            volumes: volumes.iter().map(|v| v.to_string()).collect(),
            ..NodeRecord::default()
        }
    }

    #[test]
    fn a_volume_pins_its_sandbox_to_the_node_it_lives_on() {
        let nodes = [node("a", &[]), node("b", &["cache"]), node("c", &["work"])];
        let vols = ["cache".to_string()];
        let want = |pinned, volumes| Want {
            pinned,
            memory_mib: 1024,
            count: 1,
            volumes,
            ..Want::default()
        };
        assert_eq!(place(&nodes, &want(None, &vols)), Ok("b".into()));
        let e = place(&nodes, &want(Some("a"), &vols))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("volume cache lives on node b") && e.contains("node a"),
            "{e}"
        );
        let none = ["gone".to_string()];
        assert_eq!(
            place(&nodes, &want(None, &none)),
            Err(PlaceError::NoVolume("gone".into()))
        );
        let two = ["cache".to_string(), "work".to_string()];
        assert!(place(&nodes, &want(None, &two)).is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, free: u64, sandboxes: u32) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            mem_free_mib: free,
            disk_free_mib: 10_000,
            sandboxes,
            images: vec!["python@1".into()],
            ..NodeRecord::default()
        }
    }

    fn want(memory_mib: u64) -> Want<'static> {
        Want {
            memory_mib,
            count: 1,
            ..Want::default()
        }
    }

    #[test]
    fn the_roomiest_node_wins_and_locality_comes_first() {
        let mut nodes = vec![node("a", 4000, 3), node("b", 4000, 0), node("c", 2000, 0)];
        assert_eq!(place(&nodes, &want(512)), Ok("b".into()));
        nodes[2].images.push("node@2".into());
        let w = Want {
            image: Some("node"),
            ..want(512)
        };
        assert_eq!(place(&nodes, &w), Ok("c".into()));
    }

    #[test]
    fn a_holder_with_room_comes_first_and_any_node_with_room_brings_it() {
        let mut nodes = vec![node("a", 8000, 0), node("b", 1000, 0)];
        nodes[1].snapshots.push("base".into());
        let w = Want {
            snapshot: Some("base"),
            ..want(512)
        };
        assert_eq!(place(&nodes, &w), Ok("b".into()));
        // A pin to a node without it is that node (it brings the snapshot).
        let pinned = Want {
            pinned: Some("a"),
            ..w.clone()
        };
        assert_eq!(place(&nodes, &pinned), Ok("a".into()));
        // The holder has no room for two: the roomiest other node.
        let two = Want {
            count: 2,
            ..w.clone()
        };
        assert_eq!(place(&nodes, &two), Ok("a".into()));
        let none = Want {
            snapshot: Some("other"),
            ..want(512)
        };
        assert_eq!(
            place(&nodes, &none),
            Err(PlaceError::NoHolder("other".into()))
        );
    }

    #[test]
    fn pins_drains_and_no_room_are_errors_naming_what_is_short() {
        let mut nodes = vec![node("a", 1000, 0), node("b", 600, 0)];
        nodes[0].drained = true;
        let pinned = |p: &'static str| Want {
            pinned: Some(p),
            ..want(512)
        };
        assert_eq!(
            place(&nodes, &pinned("a")),
            Err(PlaceError::Drained("a".into()))
        );
        assert!(
            matches!(place(&nodes, &pinned("zz")), Err(PlaceError::UnknownNode { live, .. }) if live == "a, b")
        );
        // b lacks room (600 < 512 + reserve), a is drained: nothing fits.
        let e = place(&nodes, &want(512)).unwrap_err().to_string();
        assert!(
            e.contains("b has 600 MiB free for guests (needs 768)"),
            "{e}"
        );
        // Ten copies need ten times the memory.
        nodes[0].drained = false;
        let ten = Want {
            count: 10,
            ..want(512)
        };
        let e = place(&nodes, &ten).unwrap_err().to_string();
        assert!(e.contains("no node has room for 10 × 512 MiB"), "{e}");
    }
}
