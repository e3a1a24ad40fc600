//! Dockerfile builds through the daemon's API (`POST /v1/images/dockerfile`, the build context
//! as tar.zst in the body), sent with curl as any client would. A context is a client's
//! archive unpacked on the host: promise, an entry that names a place outside the context
//! (`..`, an absolute name), a hard link or a device is refused by name and nothing of it is
//! written outside the build's own directory; a context without its Dockerfile is refused
//! before anything starts; a good one builds in a sandbox, its files, links and build
//! arguments in the image. Cost (TCG, 2 cores): one Dockerfile build on `python-bookworm`
//! (~30 s) and one sandbox.

use std::path::Path;

use forkbox_test_infra as infra;

use crate::{text, Daemon};

/// A tar.zst of `entries` (name, kind, data or link target).
fn context(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
        // Raw names: the tar crate's own setters refuse `..`, which is the attack.
        let raw = &mut h.as_old_mut().name;
        raw[..name.len()].copy_from_slice(name.as_bytes());
        if kind.is_symlink() || kind.is_hard_link() {
            h.set_link_name(data).unwrap();
            h.set_size(0);
            h.set_cksum();
            b.append(&h, std::io::empty()).unwrap();
        } else {
            let body = if kind.is_file() {
                data.as_bytes()
            } else {
                &[][..]
            };
            h.set_size(body.len() as u64);
            h.set_cksum();
            b.append(&h, body).unwrap();
        }
    }
    zstd::encode_all(&b.into_inner().unwrap()[..], 3).unwrap()
}

/// `POST /v1/images/dockerfile?QUERY` with `body`, over the daemon's socket: the HTTP status
/// and the answer.
fn post(d: &Daemon, query: &str, body: &[u8]) -> (u16, String) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), body).unwrap();
    let out = std::process::Command::new("curl")
        .args(["--silent", "--show-error", "--unix-socket"])
        .arg(forkbox_server::socket_path(&d.paths))
        .args(["-w", "\n%{http_code}", "--data-binary"])
        .arg(format!("@{}", file.path().display()))
        .arg(format!("http://forkbox/v1/images/dockerfile?{query}"))
        .output()
        .expect("run curl");
    let all = text(&out.stdout);
    let (answer, code) = all.trim_end().rsplit_once('\n').unwrap_or(("", all.trim()));
    (code.parse().unwrap_or(0), answer.to_string())
}

/// The last event of a build's answer.
fn last_event(answer: &str) -> serde_json::Value {
    let line = answer
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or("{}");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

#[test]
fn dockerfile_builds_through_the_api_refuse_hostile_contexts_and_build_good_ones() {
    infra::image(&infra::home(), "python-bookworm");
    let d = Daemon::start("dockerfile-api");
    use tar::EntryType as T;
    const FILE: &str = "FROM python-bookworm\nARG GREETING\nCOPY app/ /srv/app/\n\
        RUN echo \"$GREETING\" > /srv/greeting\nENV APP_DIR=/srv/app\n";

    // No Dockerfile where the query says: refused before anything starts.
    let (code, answer) = post(
        &d,
        "name=ctx-none&dockerfile=build/Dockerfile",
        &context(&[("Dockerfile", T::Regular, FILE)]),
    );
    assert_eq!(code, 400, "{answer}");
    assert!(
        answer.contains("no file \\\"build/Dockerfile\\\""),
        "{answer}"
    );

    // Entries that reach outside the context, or are not files: each refused by name, and
    // nothing is written where it names.
    let outside = d.paths.home().join("written-by-a-context");
    let up = format!("app/../../../../../../..{}", outside.display());
    for (bad, kind, data, why) in [
        (up.as_str(), T::Regular, "x", "`..`"),
        ("app/hard", T::Link, "Dockerfile", "hard link"),
        ("app/dev", T::Char, "", "device files"),
    ] {
        let body = context(&[("Dockerfile", T::Regular, FILE), (bad, kind, data)]);
        let (code, answer) = post(&d, "name=ctx-hostile", &body);
        assert_eq!(code, 200, "{answer}");
        let ev = last_event(&answer);
        let message = ev["message"].as_str().unwrap_or_default();
        assert_eq!(ev["type"], "error", "{bad}: {answer}");
        assert!(message.contains(why), "{bad}: {message}");
    }
    assert!(!outside.exists() && !Path::new("/written-by-a-context").exists());
    assert!(!d.paths.images().join("ctx-hostile").join("1").exists());

    // A good context: its files, a link kept as a link, and the build argument in the image.
    let body = context(&[
        ("Dockerfile", T::Regular, FILE),
        ("app", T::Directory, ""),
        (
            "app/hello.py",
            T::Regular,
            "print('hello from the context')\n",
        ),
        ("app/link", T::Symlink, "hello.py"),
    ]);
    let (code, answer) = post(&d, "name=ctx-good&arg=GREETING=hey%20there", &body);
    assert_eq!(code, 200, "{answer}");
    let ev = last_event(&answer);
    assert_eq!(ev["type"], "done", "{answer}");
    assert_eq!(ev["image"]["reference"], "ctx-good@1", "{answer}");
    let id = d.create(&["--image", "ctx-good@1"]);
    let out = d.ok(
        &id,
        "cat /srv/greeting; python3 /srv/app/link; readlink /srv/app/link; echo \"$APP_DIR\"",
    );
    assert_eq!(
        out, "hey there\nhello from the context\nhello.py\n/srv/app\n",
        "the image's files"
    );
    // What the build unpacked went with it.
    let left: Vec<_> = std::fs::read_dir(d.paths.images().join("ctx-good"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".build-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let tmp: Vec<_> = std::fs::read_dir(d.paths.home().join("tmp"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(tmp.is_empty(), "contexts left in the home's tmp: {tmp:?}");
    assert!(d.cli(&["sandbox", "rm", &id]).status.success());
    assert!(d.cli(&["image", "rm", "ctx-good@1"]).status.success());
}
