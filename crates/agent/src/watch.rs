//! Directory watches for E2B's SDKs from inotify: what the agent binary does when a guest
//! process runs it as `HELPER watch DIR RECURSIVE ENTRY` (a copy of PID 1's binary that any user
//! may run, made by the front end's scripts; it runs as the watch's user).
//!
//! It says `ready` once its watches are in place, then a line per change, as envd's fsnotify
//! reports them: `KIND\tNAME` (NAME relative to DIR), KIND one of CREATE (made, or moved in),
//! WRITE, CHMOD (mode, owner, times or attributes), REMOVE, RENAME (moved away). With ENTRY 1, a
//! line for a path that still exists carries its entry after another tab, in the fields of the
//! front end's `find -printf` listing. It ends when DIR goes. A recursive watch follows the
//! directories made under DIR, up to [`MAX_WATCHES`].

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// Directories one recursive watch follows at most (each is an inotify watch of the user's).
pub const MAX_WATCHES: usize = 4096;

/// Runs the helper with `args` (after `watch`): its exit code.
pub fn main(args: &[OsString]) -> i32 {
    let [dir, recursive, entry] = args else {
        eprintln!("watch: usage: watch DIR RECURSIVE(0|1) ENTRY(0|1)");
        return 1;
    };
    let mut w = match Watch::new(Path::new(dir), recursive == "1", entry == "1") {
        Ok(w) => w,
        Err(e) => {
            eprintln!("watch: {}: {e}", Path::new(dir).display());
            return 1;
        }
    };
    let mut out = io::stdout().lock();
    if writeln!(out, "ready").and_then(|()| out.flush()).is_err() {
        return 0;
    }
    match w.run(&mut out) {
        Ok(()) => 0,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("watch: {e}");
            1
        }
    }
}

struct Watch {
    fd: Inotify,
    root: PathBuf,
    recursive: bool,
    entry: bool,
    /// Each watch's directory, relative to the root ("" for the root).
    dirs: HashMap<WatchDescriptor, PathBuf>,
    root_wd: WatchDescriptor,
    names: Names,
}

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

impl Watch {
    fn new(root: &Path, recursive: bool, entry: bool) -> io::Result<Watch> {
        let fd = Inotify::init(InitFlags::IN_CLOEXEC)?;
        let root_wd = fd.add_watch(root, mask())?;
        let mut w = Watch {
            fd,
            root: root.to_path_buf(),
            recursive,
            entry,
            dirs: HashMap::from([(root_wd, PathBuf::new())]),
            root_wd,
            names: Names::read(),
        };
        if recursive {
            w.follow(Path::new(""));
        }
        Ok(w)
    }

    /// Watches the directories under `rel` (relative to the root), depth first.
    fn follow(&mut self, rel: &Path) {
        let Ok(read) = std::fs::read_dir(self.root.join(rel)) else {
            return;
        };
        for e in read.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if self.dirs.len() >= MAX_WATCHES {
                eprintln!("watch: {MAX_WATCHES} directories followed; no more are");
                return;
            }
            let sub = rel.join(e.file_name());
            if let Ok(wd) = self.fd.add_watch(&self.root.join(&sub), mask()) {
                self.dirs.insert(wd, sub.clone());
                self.follow(&sub);
            }
        }
    }

    fn run(&mut self, out: &mut impl Write) -> io::Result<()> {
        loop {
            let events = match self.fd.read_events() {
                Ok(ev) => ev,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    eprintln!("watch: the kernel's event queue overflowed; events were lost");
                    continue;
                }
                let gone = ev.mask.intersects(
                    AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF
                        | AddWatchFlags::IN_IGNORED,
                );
                if gone {
                    if ev.wd == self.root_wd {
                        return Ok(());
                    }
                    self.dirs.remove(&ev.wd);
                    continue;
                }
                let (Some(dir), Some(name)) = (self.dirs.get(&ev.wd), ev.name.as_ref()) else {
                    continue;
                };
                let rel = dir.join(name);
                let Some(kind) = kind(ev.mask) else {
                    continue;
                };
                self.say(out, kind, &rel)?;
                let made = ev
                    .mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
                if made && self.recursive && ev.mask.contains(AddWatchFlags::IN_ISDIR) {
                    if let Ok(wd) = self.fd.add_watch(&self.root.join(&rel), mask()) {
                        self.dirs.insert(wd, rel.clone());
                        self.follow(&rel);
                    }
                }
            }
            out.flush()?;
        }
    }

    fn say(&self, out: &mut impl Write, kind: &str, rel: &Path) -> io::Result<()> {
        write!(out, "{kind}\t")?;
        out.write_all(rel.as_os_str().as_bytes())?;
        if self.entry {
            if let Some(fields) = entry(&self.root.join(rel), &self.names) {
                out.write_all(b"\t")?;
                out.write_all(&fields)?;
            }
        }
        out.write_all(b"\n")
    }
}

/// An event's kind as fsnotify names it (a move in is a creation).
fn kind(mask: AddWatchFlags) -> Option<&'static str> {
    if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
        Some("CREATE")
    } else if mask.contains(AddWatchFlags::IN_MODIFY) {
        Some("WRITE")
    } else if mask.contains(AddWatchFlags::IN_ATTRIB) {
        Some("CHMOD")
    } else if mask.contains(AddWatchFlags::IN_DELETE) {
        Some("REMOVE")
    } else if mask.contains(AddWatchFlags::IN_MOVED_FROM) {
        Some("RENAME")
    } else {
        None
    }
}

/// Users' and groups' names by id, from the guest's files.
#[derive(Default)]
struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    fn read() -> Names {
        let table = |file: &str| -> HashMap<u32, String> {
            std::fs::read_to_string(file)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    Some((f.get(2)?.parse().ok()?, f.first()?.to_string()))
                })
                .collect()
        };
        Names {
            users: table("/etc/passwd"),
            groups: table("/etc/group"),
        }
    }
}

/// `path`'s entry in the fields `find -printf '%y\t%Y\t%s\t%m\t%M\t%u\t%g\t%T@\t%l\t%p'`
/// gives (type, target's type, size, mode in octal, mode as `ls` shows it, owner, group, mtime,
/// link target, path); none when it is gone.
fn entry(path: &Path, names: &Names) -> Option<Vec<u8>> {
    let m = std::fs::symlink_metadata(path).ok()?;
    let t = type_char(&m);
    let target = match t {
        'l' => std::fs::metadata(path).map_or('N', |m| type_char(&m)),
        _ => t,
    };
    let link = std::fs::read_link(path).unwrap_or_default();
    let mode = m.permissions().mode();
    let name = |table: &HashMap<u32, String>, id: u32| {
        table.get(&id).cloned().unwrap_or_else(|| id.to_string())
    };
    let mut out = format!(
        "{t}\t{target}\t{}\t{:o}\t{}\t{}\t{}\t{}.{:09}\t",
        m.size(),
        mode & 0o7777,
        ls_mode(t, mode),
        name(&names.users, m.uid()),
        name(&names.groups, m.gid()),
        m.mtime(),
        m.mtime_nsec()
    )
    .into_bytes();
    out.extend_from_slice(link.as_os_str().as_bytes());
    out.push(b'\t');
    out.extend_from_slice(OsStr::new(path).as_bytes());
    Some(out)
}

fn type_char(m: &std::fs::Metadata) -> char {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    match () {
        _ if t.is_dir() => 'd',
        _ if t.is_symlink() => 'l',
        _ if t.is_fifo() => 'p',
        _ if t.is_socket() => 's',
        _ if t.is_block_device() => 'b',
        _ if t.is_char_device() => 'c',
        _ => 'f',
    }
}

/// A mode as `ls -l` shows it: `-rw-r--r--`.
fn ls_mode(t: char, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(if t == 'f' { '-' } else { t });
    let special = [(0o4000, 's', 'S'), (0o2000, 's', 'S'), (0o1000, 't', 'T')];
    for (i, shift) in [6u32, 3, 0].into_iter().enumerate() {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let (flag, on, off) = special[i];
        s.push(match (bits & 1 != 0, mode & flag != 0) {
            (true, true) => on,
            (false, true) => off,
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(out: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(out)
            .lines()
            .map(|l| l.split('\t').take(2).collect::<Vec<_>>().join(" "))
            .collect()
    }

    /// A watch of a real directory: a file made, written, chmodded, renamed, removed, and a
    /// file in a directory made under a recursive watch.
    #[test]
    fn changes_become_lines_at_once() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let mut w = Watch::new(dir.path(), true, true).unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, "1").unwrap();
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::rename(&a, dir.path().join("b")).unwrap();
        std::fs::remove_file(dir.path().join("b")).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        // Until the directory's CREATE is read, the watch is not on it: read, then write.
        let mut out = Vec::new();
        let read_once = |w: &mut Watch, out: &mut Vec<u8>| {
            for ev in w.fd.read_events().unwrap() {
                let rel = w.dirs[&ev.wd].join(ev.name.clone().unwrap_or_default());
                if let Some(k) = kind(ev.mask) {
                    w.say(out, k, &rel).unwrap();
                }
                if ev.mask.contains(AddWatchFlags::IN_ISDIR) {
                    let wd = w.fd.add_watch(&dir.path().join(&rel), mask()).unwrap();
                    w.dirs.insert(wd, rel);
                }
            }
        };
        read_once(&mut w, &mut out);
        std::fs::write(dir.path().join("d/e"), "22").unwrap();
        read_once(&mut w, &mut out);
        assert_eq!(
            lines(&out),
            [
                "CREATE a",
                "WRITE a",
                "CHMOD a",
                "RENAME a",
                "CREATE b",
                "REMOVE b",
                "CREATE d",
                "CREATE d/e",
                "WRITE d/e"
            ]
        );
        // The entry of what still exists: d/e, 2 bytes, a file.
        let last = String::from_utf8_lossy(&out)
            .lines()
            .last()
            .unwrap()
            .to_string();
        let f: Vec<&str> = last.split('\t').collect();
        assert_eq!(&f[2..4], ["f", "f"]);
        assert_eq!(f[4], "2");
        assert!(f[11].ends_with("/d/e"), "{last}");
        assert_eq!(ls_mode('f', 0o4755), "-rwsr-xr-x");
        assert_eq!(ls_mode('d', 0o1777), "drwxrwxrwt");
    }
}
