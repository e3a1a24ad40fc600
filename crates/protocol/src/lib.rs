//! The host ↔ guest-agent protocol of forkbox.
//!
//! One byte stream carries length-prefixed frames. The first frame in each direction is a
//! [`Hello`] with a fixed layout (magic, version); every later frame is a postcard-encoded
//! [`HostMsg`] (host → agent) or [`AgentMsg`] (agent → host). Requests carry an `id` chosen by
//! the host, and every reply names the id it belongs to, so many commands share one stream.
//!
//! ```
//! use forkbox_protocol::{encode_frame, FrameDecoder, HostMsg};
//! let frame = encode_frame(&HostMsg::Ping { id: 7 }).unwrap();
//! let mut dec = FrameDecoder::new();
//! dec.push(&frame);
//! let payload = dec.next_frame().unwrap().unwrap();
//! assert_eq!(forkbox_protocol::decode::<HostMsg>(&payload).unwrap(), HostMsg::Ping { id: 7 });
//! ```
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

/// Bumped on every change to the encoding of any message (see VERSIONING.md).
pub const PROTOCOL_VERSION: u32 = 7;
/// The first four bytes of every hello.
pub const MAGIC: [u8; 4] = *b"FKBX";
/// Largest payload a frame may carry.
pub const MAX_FRAME: usize = 4 * 1024 * 1024;
/// Largest data chunk (stdout, stderr, file data) a single message carries.
pub const CHUNK: usize = 256 * 1024;
/// Name of the virtio-serial port the agent serves on.
pub const PORT_NAME: &str = "org.forkbox.agent.0";

/// Errors of framing and decoding.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME} bytes")]
    FrameTooLarge(usize),
    #[error("malformed message: {0}")]
    Malformed(#[from] postcard::Error),
    #[error("the peer's first frame is not a forkbox hello (bad magic)")]
    BadMagic,
    #[error(
        "protocol version mismatch: this side speaks version {ours}, the peer speaks {theirs}; \
         rebuild the guest agent and forkbox from the same source (scripts/build.sh)"
    )]
    VersionMismatch { ours: u32, theirs: u32 },
}

/// Informational part of a hello.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct HelloInfo {
    /// Version of the program that sent it (crate version).
    pub software: String,
    /// For the agent: the guest kernel release (`uname -r`).
    pub kernel: String,
    /// For the agent: milliseconds since the guest kernel started, when the hello was sent.
    pub uptime_ms: u64,
}

/// The first frame each side sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u32,
    pub info: HelloInfo,
}

impl Hello {
    pub fn ours(info: HelloInfo) -> Self {
        Hello {
            version: PROTOCOL_VERSION,
            info,
        }
    }

    /// Encodes the hello as a complete frame (length prefix included).
    pub fn to_frame(&self) -> Result<Vec<u8>, ProtocolError> {
        let mut payload = Vec::with_capacity(64);
        payload.extend_from_slice(&MAGIC);
        payload.extend_from_slice(&self.version.to_le_bytes());
        payload.extend_from_slice(&postcard::to_stdvec(&self.info)?);
        Ok(with_prefix(payload))
    }

    /// Parses a hello payload and checks the version. The informational part of a hello of
    /// another version is not decoded (its layout may differ).
    pub fn parse(payload: &[u8]) -> Result<Hello, ProtocolError> {
        if payload.len() < 8 || payload[..4] != MAGIC {
            return Err(ProtocolError::BadMagic);
        }
        let mut v = [0u8; 4];
        v.copy_from_slice(&payload[4..8]);
        let version = u32::from_le_bytes(v);
        if version != PROTOCOL_VERSION {
            return Err(ProtocolError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: version,
            });
        }
        let info = postcard::from_bytes(&payload[8..])?;
        Ok(Hello { version, info })
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Program {
    /// Executed directly, looked up in `PATH`.
    Argv(Vec<String>),
    /// Passed to `/bin/sh -c`.
    Shell(String),
}

/// A command to run in the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    pub program: Program,
    /// Working directory; the guest's `/root` when absent.
    pub cwd: Option<String>,
    /// Added to (and overriding) the agent's base environment.
    pub env: Vec<(String, String)>,
    /// After this many milliseconds every process the command started is killed.
    pub timeout_ms: Option<u64>,
    /// Whether the host will send stdin (`Stdin`/`StdinClose`); otherwise stdin is `/dev/null`.
    pub stdin: bool,
    /// Run on a pseudo-terminal of this size: standard input, output and error are all the
    /// terminal (its output comes as `Stdout`; `StdinClose` sends the terminal's end of file),
    /// the command leads a session of its own, and `Resize` changes the size.
    pub tty: Option<WinSize>,
    /// Run as this user: NAME, UID, NAME:GROUP or UID:GID, looked up in the guest's
    /// `/etc/passwd` and `/etc/group`; root when absent.
    pub user: Option<String>,
}

/// A terminal's size in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WinSize {
    pub rows: u16,
    pub cols: u16,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    /// The shell convention: the code, or 128 + the signal number.
    /// The signal that ended the command, if one did.
    pub fn signal(self) -> Option<i32> {
        match self {
            ExitStatus::Signal(s) => Some(s),
            ExitStatus::Code(_) => None,
        }
    }

    pub fn as_shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }
}

/// Kinds of failure the agent reports for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    NotFound,
    PermissionDenied,
    InvalidRequest,
    Io,
}

/// Messages from the host to the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HostMsg {
    Ping {
        id: u32,
    },
    Exec {
        id: u32,
        spec: ExecSpec,
    },
    Stdin {
        id: u32,
        data: Vec<u8>,
    },
    StdinClose {
        id: u32,
    },
    /// Sends a signal to every process of a running command.
    Signal {
        id: u32,
        signal: i32,
    },
    /// Writes `data` to `path` (creating parent directories). `append` continues a file that an
    /// earlier message with the same id started; the last chunk has `last` set.
    WriteFile {
        id: u32,
        path: String,
        mode: u32,
        append: bool,
        data: Vec<u8>,
        last: bool,
    },
    ReadFile {
        id: u32,
        path: String,
    },
    /// A chunk of a tar archive compressed with zstd, to unpack into the directory `dest`
    /// (created if missing). The last chunk has `last` set; the agent then answers `Done`.
    PutArchive {
        id: u32,
        dest: String,
        data: Vec<u8>,
        last: bool,
    },
    /// Asks for `path` (a file or a directory) as a zstd-compressed tar archive, sent as
    /// `FileData` chunks and a final `Done`.
    GetArchive {
        id: u32,
        path: String,
    },
    /// Sent to a copy restored from a snapshot before it is reported ready: mix `entropy` into
    /// the kernel's RNG and reseed it, set the wall clock, take a new identity. Answered with
    /// `Done` once all of it is in effect.
    Refresh {
        id: u32,
        refresh: Refresh,
    },
    /// Starts the guest's outbound proxy on 127.0.0.1:`port` (once; again is a no-op), answered
    /// with `Done`. Each connection a guest program makes to it becomes a tunnel the host opens,
    /// or refuses, by the sandbox's network policy.
    NetUp {
        id: u32,
        port: u16,
    },
    /// The host's answer to [`AgentMsg::TunnelOpen`]: connected, or refused with the reason.
    TunnelReady {
        tunnel: u32,
        error: Option<String>,
    },
    /// Bytes from the remote end, for the guest program.
    TunnelData {
        tunnel: u32,
        data: Vec<u8>,
    },
    /// The remote end will send no more.
    TunnelEof {
        tunnel: u32,
    },
    /// The host wrote `bytes` of the guest's data to the remote end: that much more may come.
    TunnelAck {
        tunnel: u32,
        bytes: u32,
    },
    /// The tunnel is gone (an error, or it is unknown to the host).
    TunnelClose {
        tunnel: u32,
    },
    /// A command run on a terminal (`ExecSpec::tty`) gets a new terminal size.
    Resize {
        id: u32,
        size: WinSize,
    },
    /// (After `Resize`: the encodings of the messages before stay as they were.) A connection to the guest's 127.0.0.1:`port` for a port forward: the agent connects and
    /// answers [`AgentMsg::ForwardReady`]; the bytes then flow as on any tunnel. `tunnel` is
    /// numbered by the host, with [`HOST_TUNNEL`] set (the agent's own never have it).
    ForwardOpen {
        tunnel: u32,
        port: u16,
    },
    /// (After `ForwardOpen`.) Mounts volumes, answered with `Done` once all are mounted (or
    /// `Error`, with none of them left mounted): each the disk whose serial is `serial`, its
    /// cached blocks dropped first (the slot held another disk before).
    Mount {
        id: u32,
        mounts: Vec<GuestMount>,
    },
    /// Unmounts the volumes at `paths` and drops their cached blocks, answered with `Done`; an
    /// `Error` (a process has files open there) leaves all of them mounted.
    Unmount {
        id: u32,
        paths: Vec<String>,
    },
}

/// A volume for the guest to mount (see [`HostMsg::Mount`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestMount {
    pub serial: String,
    pub path: String,
    pub read_only: bool,
}

/// Bytes one side of a tunnel may send ahead of the other side's `TunnelAck`s.
pub const TUNNEL_WINDOW: u32 = 1024 * 1024;

/// What makes a restored copy its own machine (see [`HostMsg::Refresh`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refresh {
    /// Fresh random bytes from the host, credited to the guest kernel's entropy pool.
    pub entropy: Vec<u8>,
    /// The host's wall clock: seconds and nanoseconds since the Unix epoch.
    pub unix_secs: u64,
    pub unix_nanos: u32,
    pub hostname: String,
    /// 32 lowercase hex digits, written to /etc/machine-id, with a new boot id drawn; empty
    /// for the same machine resumed (a hibernated sandbox woken), which keeps both.
    pub machine_id: String,
    /// New cap on the processes of the copy's commands (0: unchanged).
    pub max_procs: u32,
    /// The root disk was grown to this many bytes: grow the root filesystem to fill it
    /// (0: unchanged).
    pub grow_root_to: u64,
}

/// Messages from the agent to the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentMsg {
    Pong {
        id: u32,
    },
    Started {
        id: u32,
        pid: u32,
    },
    Stdout {
        id: u32,
        data: Vec<u8>,
    },
    Stderr {
        id: u32,
        data: Vec<u8>,
    },
    Exited {
        id: u32,
        status: ExitStatus,
        timed_out: bool,
        duration_ms: u64,
    },
    FileData {
        id: u32,
        data: Vec<u8>,
    },
    /// The request finished without other result (a file written, a file fully sent).
    Done {
        id: u32,
    },
    Error {
        id: u32,
        kind: ErrorKind,
        message: String,
    },
    /// A guest program asked the proxy for `host`:`port`; `tunnel` is numbered by the agent.
    TunnelOpen {
        tunnel: u32,
        host: String,
        port: u16,
    },
    /// Bytes from the guest program, for the remote end.
    TunnelData {
        tunnel: u32,
        data: Vec<u8>,
    },
    /// The guest program will send no more.
    TunnelEof {
        tunnel: u32,
    },
    /// The agent wrote `bytes` of the host's data to the guest program.
    TunnelAck {
        tunnel: u32,
        bytes: u32,
    },
    /// The guest program's connection is gone.
    TunnelClose {
        tunnel: u32,
    },
    /// The agent's answer to [`HostMsg::ForwardOpen`]: connected, or why not (nobody listens
    /// on that port, say).
    ForwardReady {
        tunnel: u32,
        error: Option<String>,
    },
}

/// The bit set in the numbers of tunnels the host opens (port forwards), so that they never
/// meet the agent's own.
pub const HOST_TUNNEL: u32 = 1 << 31;

impl AgentMsg {
    /// The tunnel a message belongs to, for tunnel messages.
    pub fn tunnel(&self) -> Option<u32> {
        match self {
            AgentMsg::TunnelOpen { tunnel, .. }
            | AgentMsg::TunnelData { tunnel, .. }
            | AgentMsg::TunnelEof { tunnel }
            | AgentMsg::TunnelAck { tunnel, .. }
            | AgentMsg::TunnelClose { tunnel }
            | AgentMsg::ForwardReady { tunnel, .. } => Some(*tunnel),
            _ => None,
        }
    }

    pub fn id(&self) -> u32 {
        match self {
            AgentMsg::Pong { id }
            | AgentMsg::Started { id, .. }
            | AgentMsg::Stdout { id, .. }
            | AgentMsg::Stderr { id, .. }
            | AgentMsg::Exited { id, .. }
            | AgentMsg::FileData { id, .. }
            | AgentMsg::Done { id }
            | AgentMsg::Error { id, .. } => *id,
            // Tunnels are numbered apart from requests; see `tunnel()`.
            AgentMsg::TunnelOpen { .. }
            | AgentMsg::TunnelData { .. }
            | AgentMsg::TunnelEof { .. }
            | AgentMsg::TunnelAck { .. }
            | AgentMsg::TunnelClose { .. }
            | AgentMsg::ForwardReady { .. } => 0,
        }
    }
}

fn with_prefix(payload: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 4);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Encodes a message as a complete frame.
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtocolError> {
    let payload = postcard::to_stdvec(msg)?;
    if payload.len() > MAX_FRAME {
        return Err(ProtocolError::FrameTooLarge(payload.len()));
    }
    Ok(with_prefix(payload))
}

/// Decodes one frame's payload.
pub fn decode<'a, T: Deserialize<'a>>(payload: &'a [u8]) -> Result<T, ProtocolError> {
    Ok(postcard::from_bytes(payload)?)
}

/// Splits a byte stream into frame payloads. Feed it bytes as they arrive.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    start: usize,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Whether it holds no bytes of a frame not yet returned.
    pub fn is_empty(&self) -> bool {
        self.start == self.buf.len()
    }

    /// The next complete payload, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, ProtocolError> {
        let avail = &self.buf[self.start..];
        if avail.len() < 4 {
            self.compact();
            return Ok(None);
        }
        let len = u32::from_le_bytes([avail[0], avail[1], avail[2], avail[3]]) as usize;
        if len > MAX_FRAME {
            return Err(ProtocolError::FrameTooLarge(len));
        }
        if avail.len() < 4 + len {
            self.compact();
            return Ok(None);
        }
        let payload = avail[4..4 + len].to_vec();
        self.start += 4 + len;
        Ok(Some(payload))
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_pushes_reassemble() {
        let a = encode_frame(&HostMsg::Stdin {
            id: 1,
            data: vec![9; 1000],
        })
        .unwrap();
        let b = encode_frame(&HostMsg::StdinClose { id: 1 }).unwrap();
        let all: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
        let mut dec = FrameDecoder::new();
        let mut got = Vec::new();
        for chunk in all.chunks(7) {
            dec.push(chunk);
            while let Some(p) = dec.next_frame().unwrap() {
                got.push(decode::<HostMsg>(&p).unwrap());
            }
        }
        assert!(dec.is_empty());
        let mut half = FrameDecoder::new();
        half.push(&a[..a.len() / 2]);
        assert_eq!(half.next_frame().unwrap(), None);
        assert!(!half.is_empty(), "half a frame is held");
        assert_eq!(
            got,
            vec![
                HostMsg::Stdin {
                    id: 1,
                    data: vec![9; 1000]
                },
                HostMsg::StdinClose { id: 1 }
            ]
        );
    }

    #[test]
    fn oversized_length_is_an_error_not_an_allocation() {
        let mut dec = FrameDecoder::new();
        dec.push(&u32::MAX.to_le_bytes());
        assert!(matches!(
            dec.next_frame(),
            Err(ProtocolError::FrameTooLarge(_))
        ));
    }

    #[test]
    fn hello_round_trips_and_rejects_other_versions() {
        let info = HelloInfo {
            software: "x".into(),
            kernel: "6.1".into(),
            uptime_ms: 5,
        };
        let frame = Hello::ours(info.clone()).to_frame().unwrap();
        let h = Hello::parse(&frame[4..]).unwrap();
        assert_eq!(h.info, info);
        let mut other = frame[4..].to_vec();
        other[4..8].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
        match Hello::parse(&other) {
            Err(ProtocolError::VersionMismatch { ours, theirs }) => {
                assert_eq!((ours, theirs), (PROTOCOL_VERSION, PROTOCOL_VERSION + 1))
            }
            other => panic!("expected a version mismatch, got {other:?}"),
        }
        assert!(matches!(
            Hello::parse(b"NOPE\0\0\0\0"),
            Err(ProtocolError::BadMagic)
        ));
    }

    #[test]
    fn garbage_payload_is_malformed() {
        assert!(decode::<AgentMsg>(&[0xff, 0xff, 0xff]).is_err());
    }
}
