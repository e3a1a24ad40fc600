//! Snapshots moved between nodes by chunks.

use std::time::Duration;

use forkbox_test_infra as infra;

use crate::common::cluster::TestCluster;
use crate::*;

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
    forkbox_engine::tree::remove_tree(&c_images).unwrap();
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
