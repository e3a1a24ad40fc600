//! `forkbox setup` on a host that carries a newer `qemu-utils` than its QEMU: a fresh bookworm
//! root (mmdebstrap) gets a `qemu-utils` 1:99 from a local apt repository the test makes, which
//! breaks bookworm's QEMU the way a backported one does. Installing `qemu-system-x86` alone
//! would make apt remove it; set-up must end with every program running.
//!
//! Needs a Debian mirror (mmdebstrap, apt); ~2 minutes, no VM.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::process::{Command, Output};

use forkbox_test_infra as infra;
use sha2::{Digest, Sha256};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `script` with `sh` inside `root`, with /proc and /dev mounted in a mount namespace of
/// its own (gone when it ends).
fn inside(root: &Path, script: &str) -> Output {
    let r = root.display();
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t proc proc {r}/proc && mount --rbind /dev {r}/dev && \
             exec chroot {r} env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin FORKBOX_HOME=/fbhome sh -c \"$0\"",
        ))
        .arg(script)
        .output()
        .unwrap()
}

/// A package `qemu-utils` 1:99 whose `qemu-img` prints a version, and which breaks every
/// older QEMU, in an apt repository (flat, trusted) at `repo`.
fn conflicting_repo(repo: &Path) {
    let pkg = repo.join("pkg");
    std::fs::create_dir_all(pkg.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(pkg.join("usr/bin")).unwrap();
    std::fs::write(
        pkg.join("DEBIAN/control"),
        "Package: qemu-utils\nVersion: 1:99.0\nArchitecture: amd64\n\
         Maintainer: forkbox tests <tests@forkbox.invalid>\n\
         Breaks: qemu-system-common (<< 1:99)\n\
         Description: a newer qemu-utils than the host's QEMU\n",
    )
    .unwrap();
    let img = pkg.join("usr/bin/qemu-img");
    std::fs::write(&img, "#!/bin/sh\necho 'qemu-img version 99.0'\n").unwrap();
    std::fs::set_permissions(&img, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let deb = repo.join("qemu-utils_99.0_amd64.deb");
    let st = Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&pkg)
        .arg(&deb)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::remove_dir_all(&pkg).unwrap();
    let control = Command::new("dpkg-deb")
        .arg("-f")
        .arg(&deb)
        .output()
        .unwrap();
    let bytes = std::fs::read(&deb).unwrap();
    let entry = format!(
        "{}Filename: ./qemu-utils_99.0_amd64.deb\nSize: {}\nSHA256: {:x}\n\n",
        text(&control.stdout),
        bytes.len(),
        Sha256::digest(&bytes),
    );
    std::fs::write(repo.join("Packages"), entry).unwrap();
}

/// The line of set-up's table about `item`.
fn line_of<'a>(table: &'a str, item: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(item))
        .unwrap_or_else(|| panic!("no line about {item} in:\n{table}"))
}

fn version(root: &Path, pkg: &str) -> String {
    let out = inside(root, &format!("dpkg-query -W -f '${{Version}}' {pkg}"));
    text(&out.stdout)
}

#[test]
fn setup_ends_working_on_a_host_with_a_newer_conflicting_qemu_utils() {
    let home = infra::home();
    let dir = tempfile::tempdir_in(home.home()).unwrap();
    let root = dir.path().join("host");
    let st = Command::new("mmdebstrap")
        .args(["--variant=minbase", "--quiet", "bookworm"])
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success(), "mmdebstrap failed");

    conflicting_repo(&root.join("localrepo"));
    std::fs::write(
        root.join("etc/apt/sources.list.d/newer.list"),
        "deb [trusted=yes] file:/localrepo ./\n",
    )
    .unwrap();
    let out = inside(
        &root,
        "apt-get update -q >/dev/null && apt-get install -y -q qemu-utils=1:99.0 >/dev/null && qemu-img --version",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("99.0"));

    std::fs::copy(
        env!("CARGO_BIN_EXE_forkbox"),
        root.join("usr/local/bin/forkbox"),
    )
    .unwrap();
    let out = inside(&root, "forkbox setup");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!("{stderr}{stdout}");
    assert!(out.status.success(), "setup failed:\n{stdout}\n{stderr}");
    let line = line_of(&stdout, "qemu-utils (qemu-img)");
    assert!(
        line.contains("changed 1:99.0 -> 1:7.2"),
        "setup should say qemu-utils changed to bookworm's QEMU version, never that it was \
         present:\n{stdout}\n{stderr}"
    );

    // Every program runs, and the QEMU packages share one version.
    let out = inside(
        &root,
        "qemu-system-x86_64 --version && qemu-img --version && mmdebstrap --version && mkfs.ext4 -V && test -s /etc/ssl/certs/ca-certificates.crt",
    );
    assert!(
        out.status.success(),
        "a program does not run after setup: {}",
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("qemu-img version 7.2"));
    let (sys, utils) = (
        version(&root, "qemu-system-x86"),
        version(&root, "qemu-utils"),
    );
    assert!(sys.starts_with("1:7.2"), "{sys}");
    assert_eq!(sys, utils);

    // Set-up again changes nothing and says what is there.
    let out = inside(&root, "forkbox setup");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = line_of(&stdout, "qemu-utils (qemu-img)");
    assert!(
        line.contains(&format!("already present ({utils})")),
        "{stdout}"
    );
    assert!(
        !text(&out.stderr).contains("installing"),
        "{}",
        text(&out.stderr)
    );
}
