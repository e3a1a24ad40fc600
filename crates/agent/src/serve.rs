//! The protocol loop: reads host frames from the port and dispatches them.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::Duration;

use forkbox_protocol::{
    decode, encode_frame, AgentMsg, ErrorKind, FrameDecoder, Hello, HelloInfo, HostMsg, MAGIC,
};

use crate::exec::Execs;
use crate::files;

/// Queued frames for the port. Bounded, so a host that stops reading slows the commands that
/// write, instead of growing the agent's memory.
#[derive(Clone)]
pub struct Outbox(SyncSender<Vec<u8>>);

impl Outbox {
    /// Frames go to `tx` (the port's writer; a test's receiver).
    pub fn new(tx: SyncSender<Vec<u8>>) -> Outbox {
        Outbox(tx)
    }

    pub fn send(&self, msg: &AgentMsg) {
        match encode_frame(msg) {
            Ok(f) => {
                let _ = self.0.send(f);
            }
            Err(e) => eprintln!("forkbox-agent: cannot encode a reply: {e}"),
        }
    }

    fn send_raw(&self, frame: Vec<u8>) {
        let _ = self.0.send(frame);
    }

    pub fn error(&self, id: u32, err: &io::Error) {
        let kind = match err.kind() {
            io::ErrorKind::NotFound => ErrorKind::NotFound,
            io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            io::ErrorKind::InvalidInput => ErrorKind::InvalidRequest,
            _ => ErrorKind::Io,
        };
        self.send(&AgentMsg::Error {
            id,
            kind,
            message: err.to_string(),
        });
    }
}

/// Writes queued frames to the port. Every write to a virtio port costs a trip through the
/// VMM, so frames that queued up while the last write was under way go out together: a command
/// printing many short lines costs one write per batch, not one per line.
fn writer(mut port: File, rx: Receiver<Vec<u8>>) {
    const BATCH: usize = 256 * 1024;
    let mut batch = Vec::with_capacity(2 * BATCH);
    while let Ok(first) = rx.recv() {
        batch.clear();
        batch.extend_from_slice(&first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(f) => batch.extend_from_slice(&f),
                Err(_) => break,
            }
        }
        let mut rest: &[u8] = &batch;
        while !rest.is_empty() {
            match port.write(rest) {
                Ok(n) => rest = &rest[n..],
                // The host end is not connected (it is restarting): wait for it to come back.
                Err(e)
                    if e.raw_os_error() == Some(libc::EPIPE)
                        || e.kind() == io::ErrorKind::Interrupted =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => {
                    eprintln!("forkbox-agent: write to host failed: {e}");
                    std::thread::sleep(Duration::from_millis(20))
                }
            }
        }
    }
}

pub fn serve(port_path: &Path) -> ! {
    let port = loop {
        match OpenOptions::new().read(true).write(true).open(port_path) {
            Ok(f) => break f,
            Err(e) => {
                eprintln!("forkbox-agent: open {}: {e}", port_path.display());
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    let (tx, rx) = sync_channel::<Vec<u8>>(64);
    let wport = port.try_clone().unwrap_or_else(|e| {
        eprintln!("forkbox-agent: dup port: {e}");
        crate::boot::power_off()
    });
    std::thread::spawn(move || writer(wport, rx));
    let out = Outbox::new(tx);
    let execs = Execs::start(out.clone());
    let uploads = crate::archive::Uploads::default();
    let mut port = port;
    let mut dec = FrameDecoder::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut greeted = false;
    loop {
        let n = match port.read(&mut buf) {
            Ok(0) => {
                // The host side closed; it may reconnect, and a host always greets first. The
                // guest can learn of the close late, after the next host's hello was read (seen
                // under TCG when a daemon killed with SIGKILL was replaced at once): so the
                // greeting stands, and only a frame the old host left half-sent is dropped.
                if !dec.is_empty() {
                    dec = FrameDecoder::new();
                    greeted = false;
                }
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("forkbox-agent: read from host failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        dec.push(&buf[..n]);
        loop {
            let payload = match dec.next_frame() {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => {
                    eprintln!("forkbox-agent: bad frame from host: {e}; resetting the stream");
                    dec = FrameDecoder::new();
                    greeted = false;
                    break;
                }
            };
            if payload.starts_with(&MAGIC) {
                // A (re)connecting host greets first; the reply carries our version either way,
                // so the host can say precisely what does not match.
                let peer = Hello::parse(&payload);
                let reply = Hello::ours(HelloInfo {
                    software: env!("CARGO_PKG_VERSION").into(),
                    kernel: nix::sys::utsname::uname()
                        .map(|u| u.release().to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    uptime_ms: crate::boot::uptime_ms(),
                });
                if let Ok(f) = reply.to_frame() {
                    out.send_raw(f);
                }
                match peer {
                    Ok(_) => greeted = true,
                    Err(e) => {
                        eprintln!("forkbox-agent: host hello refused: {e}");
                        greeted = false;
                    }
                }
                continue;
            }
            if !greeted {
                eprintln!("forkbox-agent: ignoring a frame that came before a valid hello");
                continue;
            }
            match decode::<HostMsg>(&payload) {
                Ok(msg) => dispatch(msg, &out, &execs, &uploads),
                Err(e) => eprintln!("forkbox-agent: undecodable message from host: {e}"),
            }
        }
    }
}

fn dispatch(msg: HostMsg, out: &Outbox, execs: &Execs, uploads: &crate::archive::Uploads) {
    match msg {
        HostMsg::Ping { id } => out.send(&AgentMsg::Pong { id }),
        HostMsg::Exec { id, spec } => execs.spawn(id, spec),
        HostMsg::Stdin { id, data } => execs.stdin(id, Some(data)),
        HostMsg::StdinClose { id } => execs.stdin(id, None),
        HostMsg::Signal { id, signal } => execs.signal(id, signal),
        HostMsg::Resize { id, size } => execs.resize(id, size),
        HostMsg::WriteFile {
            id,
            path,
            mode,
            append,
            data,
            last,
        } => match files::write(&path, mode, append, &data) {
            Ok(()) if last => out.send(&AgentMsg::Done { id }),
            Ok(()) => {}
            Err(e) => out.error(id, &e),
        },
        HostMsg::PutArchive {
            id,
            dest,
            data,
            last,
        } => uploads.chunk(id, dest, data, last, out),
        HostMsg::GetArchive { id, path } => {
            let out = out.clone();
            std::thread::spawn(move || crate::archive::send(id, &path, &out));
        }
        HostMsg::ReadFile { id, path } => {
            let out = out.clone();
            std::thread::spawn(move || files::read(id, &path, &out));
        }
        HostMsg::Refresh { id, refresh } => match crate::refresh::apply(&refresh) {
            Ok(()) => out.send(&AgentMsg::Done { id }),
            Err(e) => out.error(id, &e),
        },
        HostMsg::NetUp { id, port } => match crate::net::up(port, out) {
            Ok(()) => out.send(&AgentMsg::Done { id }),
            Err(e) => out.error(id, &e),
        },
        HostMsg::TunnelReady { tunnel, error } => crate::net::ready(tunnel, error),
        HostMsg::TunnelData { tunnel, data } => crate::net::data(tunnel, data, out),
        HostMsg::TunnelEof { tunnel } => crate::net::eof(tunnel),
        HostMsg::TunnelAck { tunnel, bytes } => crate::net::ack(tunnel, bytes),
        HostMsg::TunnelClose { tunnel } => crate::net::close(tunnel),
        HostMsg::ForwardOpen { tunnel, port } => crate::net::forward(tunnel, port, out),
        // Off the loop: an unmount writes back what the volume's cache holds.
        HostMsg::Mount { id, mounts } => {
            let out = out.clone();
            std::thread::spawn(move || match crate::volumes::mount_all(&mounts) {
                Ok(()) => out.send(&AgentMsg::Done { id }),
                Err(e) => out.error(id, &e),
            });
        }
        HostMsg::Unmount { id, paths } => {
            let out = out.clone();
            std::thread::spawn(move || match crate::volumes::unmount_all(&paths) {
                Ok(()) => out.send(&AgentMsg::Done { id }),
                Err(e) => out.error(id, &e),
            });
        }
    }
}
