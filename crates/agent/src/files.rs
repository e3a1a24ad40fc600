//! Single-file reads and writes.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use forkbox_protocol::{AgentMsg, CHUNK};

use crate::serve::Outbox;

pub fn write(path: &str, mode: u32, append: bool, data: &[u8]) -> io::Result<()> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {path:?} is not absolute"),
        ));
    }
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent)?;
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .mode(mode)
        .open(p)?;
    // The mode asked for, whatever the umask made of it or the file had (and no change, and
    // no event to a watch of the directory, when it has it already).
    if !append && f.metadata()?.permissions().mode() & 0o7777 != mode & 0o7777 {
        f.set_permissions(fs::Permissions::from_mode(mode))?;
    }
    if !append {
        // A file written whole is a new file to E2B's SDKs: the metadata of the one it
        // replaces goes (a file system without user attributes has none to lose).
        let _ = crate::xattrs::clear(p);
    }
    f.write_all(data)
}

pub fn read(id: u32, path: &str, out: &Outbox) {
    let result = (|| -> io::Result<()> {
        let mut f = fs::File::open(path)?;
        let meta = f.metadata()?;
        if meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{path} is a directory"),
            ));
        }
        // A device or a pipe may never end (`/dev/zero`): the agent would go on sending what
        // the host no longer reads, and a snapshot would carry that loop into every copy.
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{path} is not a regular file"),
            ));
        }
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            out.send(&AgentMsg::FileData {
                id,
                data: buf[..n].to_vec(),
            });
        }
    })();
    match result {
        Ok(()) => out.send(&AgentMsg::Done { id }),
        Err(e) => out.error(id, &e),
    }
}
