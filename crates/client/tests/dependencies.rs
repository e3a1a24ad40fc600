//! What only talks to forkbox links none of the engine: the client, the MCP server and E2B's
//! front end depend on no forkbox-engine, SQLite, OCI client or nix, and the migration flow not on the server
//! (read from `cargo tree`, normal dependencies only).

use std::process::Command;

fn tree(package: &str) -> String {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
        ])
        .arg(package)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => panic!(
            "cargo tree -p {package}: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("cargo tree: {e}"),
    }
}

fn crates_in(tree: &str) -> Vec<&str> {
    tree.lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

#[test]
fn the_client_and_the_front_ends_link_no_engine() {
    for package in ["forkbox-client", "forkbox-mcp", "forkbox-e2b"] {
        let t = tree(package);
        let crates = crates_in(&t);
        assert!(crates.contains(&"forkbox-api"), "{package}: {t}");
        for heavy in [
            "forkbox-engine",
            "forkbox-server",
            "rusqlite",
            "oci-client",
            "nix",
        ] {
            assert!(!crates.contains(&heavy), "{package} links {heavy}:\n{t}");
        }
    }
}

#[test]
fn the_migration_flow_needs_no_server() {
    let t = tree("forkbox-migrate");
    let crates = crates_in(&t);
    assert!(crates.contains(&"forkbox-engine"), "{t}");
    assert!(!crates.contains(&"forkbox-server"), "{t}");
}
