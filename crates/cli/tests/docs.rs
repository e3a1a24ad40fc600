//! `docs/reference/cli.md` is what `forkbox man --markdown` prints now. No VM.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::PathBuf;
use std::process::Command;

const BLESS: &str = "FORKBOX_BLESS";

fn repo() -> PathBuf {
    forkbox_test_infra::repo_root()
}

/// Fails when `file` (under the repository) is not `made`, naming the first line that differs;
/// with FORKBOX_BLESS=1 writes it instead.
fn matches_or_bless(file: &str, made: &str, test: &str) {
    let path = repo().join(file);
    if std::env::var_os(BLESS).is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, made).unwrap();
        return;
    }
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    if old == made {
        return;
    }
    let line = old
        .lines()
        .zip(made.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(old.lines().count().min(made.lines().count()));
    panic!(
        "{file} is not what the code makes now (first difference at line {}); write it anew \
         with `{BLESS}=1 cargo nextest run -p forkbox-cli --test docs {test}` and commit it",
        line + 1
    );
}

#[test]
fn the_cli_reference_is_what_forkbox_prints() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_forkbox"))
        .args(["man", "--markdown"])
        .env("FORKBOX_HOME", home.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "forkbox man --markdown: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made = String::from_utf8(out.stdout).unwrap();
    assert!(made.contains("## `forkbox sandbox exec`"), "{made}");
    matches_or_bless(
        "docs/reference/cli.md",
        &made,
        "the_cli_reference_is_what_forkbox_prints",
    );
}
