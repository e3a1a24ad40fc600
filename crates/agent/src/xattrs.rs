//! E2B's file metadata, kept as `user.e2b.KEY` extended attributes: what the agent binary does
//! when a root process of the guest runs it as a helper (`/proc/1/exe xattrs …`; PID 1 is the
//! agent, and its binary stays reachable there after the switch to the sandbox's root).
//!
//! - `xattrs get`: reads NUL-ended paths on stdin; for each that has metadata, writes the path,
//!   then each key and value, each NUL-ended, and an empty field after the last pair. Values
//!   that hold a NUL are left out (no metadata is binary).
//! - `xattrs set [KEY=VALUE…] -- PATH…`: each path's metadata becomes exactly the pairs given
//!   (keys lowercased).

use std::ffi::OsStr;
use std::io::{self, BufRead, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The namespace of E2B's metadata among a file's extended attributes.
pub const PREFIX: &str = "user.e2b.";

/// Runs the helper with `args` (after `xattrs`): its exit code.
pub fn main(args: &[std::ffi::OsString]) -> i32 {
    let result = match args.first().map(|a| a.as_bytes()) {
        Some(b"get") => get(io::stdin().lock(), &mut io::stdout().lock()),
        Some(b"set") => match args[1..].iter().position(|a| a == "--") {
            Some(n) => args[n + 2..]
                .iter()
                .try_for_each(|p| set(Path::new(p), &args[1..n + 1])),
            None => Err(usage()),
        },
        _ => Err(usage()),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("xattrs: {e}");
            1
        }
    }
}

fn usage() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "usage: xattrs get (paths on stdin, NUL-ended) | xattrs set [KEY=VALUE…] -- PATH…",
    )
}

/// The metadata of `path`: (key, value) of each `user.e2b.` attribute, sorted by key.
pub fn metadata(path: &Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for name in xattr::list(path)? {
        let Some(key) = name.as_bytes().strip_prefix(PREFIX.as_bytes()) else {
            continue;
        };
        if let Some(v) = xattr::get(path, &name)? {
            if !v.contains(&0) && !key.is_empty() {
                out.push((key.to_vec(), v));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn get(input: impl BufRead, out: &mut impl Write) -> io::Result<()> {
    for path in input.split(0) {
        let path = path?;
        if path.is_empty() {
            continue;
        }
        // A path gone or on a file system without user attributes has none.
        let pairs = metadata(Path::new(OsStr::from_bytes(&path))).unwrap_or_default();
        if pairs.is_empty() {
            continue;
        }
        out.write_all(&path)?;
        out.write_all(b"\0")?;
        for (k, v) in pairs {
            out.write_all(&k)?;
            out.write_all(b"\0")?;
            out.write_all(&v)?;
            out.write_all(b"\0")?;
        }
        out.write_all(b"\0")?;
    }
    out.flush()
}

/// Removes `path`'s metadata.
pub fn clear(path: &Path) -> io::Result<()> {
    for name in xattr::list(path)? {
        if name.as_bytes().starts_with(PREFIX.as_bytes()) {
            xattr::remove(path, &name)?;
        }
    }
    Ok(())
}

fn set(path: &Path, pairs: &[std::ffi::OsString]) -> io::Result<()> {
    clear(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    for pair in pairs {
        let pair = pair.as_bytes();
        let eq = pair
            .iter()
            .position(|b| *b == b'=')
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a pair is KEY=VALUE"))?;
        let mut name = PREFIX.as_bytes().to_vec();
        name.extend(pair[..eq].iter().map(u8::to_ascii_lowercase));
        xattr::set(path, OsStr::from_bytes(&name), &pair[eq + 1..])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_set_whole_and_read_back_in_fields() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let f = dir.path().join("a file");
        std::fs::write(&f, "x").unwrap();
        if xattr::set(&f, "user.probe", b"1").is_err() {
            eprintln!("skipped: this file system keeps no user attributes");
            return;
        }
        let args = ["set", "Author=mish", "purpose=a=b", "--"].map(std::ffi::OsString::from);
        let mut args = args.to_vec();
        args.push(f.clone().into_os_string());
        assert_eq!(main(&args), 0);
        xattr::set(&f, "user.other", b"kept").unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "y").unwrap();
        let mut input = Vec::new();
        for p in [&f, &plain] {
            input.extend_from_slice(p.as_os_str().as_bytes());
            input.push(0);
        }
        let mut out = Vec::new();
        get(&input[..], &mut out).unwrap();
        let mut want = f.as_os_str().as_bytes().to_vec();
        want.extend_from_slice(b"\0author\0mish\0purpose\0a=b\0\0");
        assert_eq!(out, want);
        set(&f, &[]).unwrap();
        assert!(metadata(&f).unwrap().is_empty());
        assert_eq!(xattr::get(&f, "user.other").unwrap().unwrap(), b"kept");
    }
}
