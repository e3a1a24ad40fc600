//! The file API: what a guest sends back is unpacked on the host, so everything in it is
//! hostile: names with `..`, absolute names, links, devices, names with newlines.

use std::path::Path;

use forkbox_engine::files::unpack_checked;

use crate::{text, Daemon};

fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    zstd::encode_all(&b.into_inner().unwrap()[..], 1).unwrap()
}

/// An entry with a raw name, as a hostile guest writes it (no checks of the tar crate's own).
fn entry(b: &mut tar::Builder<Vec<u8>>, name: &str, kind: tar::EntryType, link: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_entry_type(kind);
    let bytes = name.as_bytes();
    h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
    let l = link.as_bytes();
    h.as_old_mut().linkname[..l.len()].copy_from_slice(l);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// Archives a taken-over agent could send for a download. Promise: each is refused in words
/// and nothing lands outside the destination (or inside it, from the refused entry on).
#[test]
fn hostile_archives_from_a_guest_cannot_escape_the_destination() {
    use tar::EntryType as T;
    let outer = tempfile::tempdir().unwrap();
    let canary = outer.path().join("canary");
    type Build = Box<dyn Fn(&mut tar::Builder<Vec<u8>>)>;
    let cases: Vec<(&str, Build)> = vec![
        (
            "`..`",
            Box::new(|b| entry(b, "../canary", T::Regular, "", b"x")),
        ),
        (
            "`..`",
            Box::new(|b| entry(b, "a/../../canary", T::Regular, "", b"x")),
        ),
        (
            "absolute",
            Box::new(|b| entry(b, "/tmp/forkbox-hostile-abs", T::Regular, "", b"x")),
        ),
        (
            "goes through a link",
            Box::new(|b| {
                entry(b, "link", T::Symlink, "..", b"");
                entry(b, "link/canary", T::Regular, "", b"x");
            }),
        ),
        (
            "goes through a link",
            Box::new(|b| {
                entry(b, "d", T::Symlink, "/etc", b"");
                entry(b, "d/passwd", T::Regular, "", b"x");
            }),
        ),
        (
            "goes through a link",
            Box::new(|b| {
                entry(b, "d", T::Symlink, "/tmp", b"");
                entry(b, "d/forkbox-hostile-dir", T::Directory, "", b"");
            }),
        ),
        (
            "a second entry of that name",
            Box::new(|b| {
                entry(b, "l", T::Symlink, "../canary", b"");
                entry(b, "l", T::Regular, "", b"x");
            }),
        ),
        (
            "hard links",
            Box::new(|b| entry(b, "h", T::Link, "/etc/passwd", b"")),
        ),
        (
            "device files",
            Box::new(|b| entry(b, "null", T::Char, "", b"")),
        ),
        (
            "device files",
            Box::new(|b| entry(b, "sda", T::Block, "", b"")),
        ),
        (
            "special files",
            Box::new(|b| entry(b, "fifo", T::Fifo, "", b"")),
        ),
    ];
    for (i, (why, build)) in cases.iter().enumerate() {
        let root = outer.path().join(format!("dest{i}"));
        std::fs::create_dir_all(&root).unwrap();
        let data = archive(|b| build(b));
        let e = unpack_checked(&data[..], &root)
            .map(|n| format!("accepted {n} entries"))
            .unwrap_or_else(|e| e.to_string());
        assert!(
            e.contains(why) || e.contains("refused"),
            "case {i}: expected a refusal for {why}, got {e}"
        );
        assert!(!canary.exists(), "case {i} wrote outside its destination");
    }
    assert!(!Path::new("/tmp/forkbox-hostile-abs").exists());
    assert!(!Path::new("/tmp/forkbox-hostile-dir").exists());
    assert!(std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .contains("root:"));
}

/// A guest directory holding a link to the host-looking `/etc`, a FIFO and a device node.
/// Promise: the link arrives as a link, never followed; the others are refused in words naming
/// the entry, and nothing is left behind.
#[test]
fn downloads_keep_links_and_refuse_devices_and_fifos() {
    let d = Daemon::start("files-special");
    let id = d.create(&[]);
    d.ok(
        &id,
        "rm -rf /root/x; mkdir /root/x; echo data > /root/x/plain; ln -s /etc /root/x/evil",
    );
    let dest = tempfile::tempdir().unwrap();
    let target = dest.path().join("out");
    let out = d.cli(&[
        "sandbox",
        "download",
        &id,
        "/root/x",
        target.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_link(target.join("evil")).unwrap(),
        Path::new("/etc")
    );
    assert_eq!(std::fs::read(target.join("plain")).unwrap(), b"data\n");
    for (what, name, make) in [
        ("special", "fifo", "mkfifo /root/x/fifo"),
        ("device", "null", "mknod /root/x/null c 1 3"),
    ] {
        d.ok(
            &id,
            &format!("rm -rf /root/x; mkdir /root/x; echo data > /root/x/plain; {make}"),
        );
        let dest = tempfile::tempdir().unwrap();
        let target = dest.path().join("out");
        let out = d.cli(&[
            "sandbox",
            "download",
            &id,
            "/root/x",
            target.to_str().unwrap(),
        ]);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{what}: the download succeeded");
        assert!(err.contains(what) || err.contains(name), "{what}: {err}");
        assert!(
            !target.exists(),
            "{what}: a partial download was left behind"
        );
    }
}

/// Names with newlines, leading dashes, spaces and non-ASCII. Promise: they arrive exactly as
/// they were, inside the destination.
#[test]
fn odd_names_arrive_exactly_and_inside_the_destination() {
    let d = Daemon::start("files-names");
    let id = d.create(&[]);
    d.py(
        &id,
        "import os\nos.makedirs('/root/n', exist_ok=True)\nfor n in ['a\\nb', '-rf', ' lead', 'tr\\u00e4il ', 'x\\ty', '..dots']:\n    open('/root/n/' + n, 'w').write(n)\n",
    );
    let dest = tempfile::tempdir().unwrap();
    let target = dest.path().join("out");
    let out = d.cli(&[
        "sandbox",
        "download",
        &id,
        "/root/n",
        target.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut names: Vec<String> = std::fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = ["a\nb", "-rf", " lead", "träil ", "x\ty", "..dots"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    want.sort();
    assert_eq!(names, want);
    for n in &want {
        assert_eq!(&std::fs::read_to_string(target.join(n)).unwrap(), n);
    }
    assert_eq!(
        std::fs::read_dir(dest.path()).unwrap().count(),
        1,
        "only the destination"
    );
}
