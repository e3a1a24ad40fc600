//! The Connect protocol's enveloped messages, as a server stream (and a client-streaming
//! request) carries them with the JSON codec: one flag byte, a 4-byte big-endian length, the
//! message. Flag bit `0x02` marks the end of the stream: a JSON `{}` or `{"error": {...}}`
//! (the HTTP status of a stream is 200 whatever happened). A reader gets the body in pieces
//! that do not follow the frames (chunked bodies split them anywhere).

use serde_json::{json, Value};

/// The end-of-stream flag.
pub const END_STREAM: u8 = 0x02;
/// The compressed flag (forkbox never sends it and refuses it: the SDKs send no compression).
pub const COMPRESSED: u8 = 0x01;
/// The largest message a reader takes (a file's bytes travel over `/files`, not here).
pub const MAX_MESSAGE: usize = 4 << 20;

/// One message, framed.
pub fn frame(flags: u8, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(flags);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A JSON message of a stream, framed.
pub fn message(v: &Value) -> Vec<u8> {
    frame(0, v.to_string().as_bytes())
}

/// The end of a stream: `{}`, or the error it ended with (a Connect code such as
/// `not_found`, see [`crate::errors::connect_code`]).
pub fn end(error: Option<(&str, &str)>) -> Vec<u8> {
    let body = match error {
        None => json!({}),
        Some((code, msg)) => json!({ "error": { "code": code, "message": msg } }),
    };
    frame(END_STREAM, body.to_string().as_bytes())
}

/// A frame as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub flags: u8,
    pub message: Vec<u8>,
}

impl Frame {
    pub fn is_end(&self) -> bool {
        self.flags & END_STREAM != 0
    }
}

/// Why a stream's bytes are not frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    Compressed,
    TooLarge(usize),
    /// The body ended inside a frame.
    Truncated {
        have: usize,
        want: usize,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Compressed => write!(f, "a compressed message (no compression is spoken)"),
            FrameError::TooLarge(n) => write!(f, "a message of {n} bytes (at most {MAX_MESSAGE})"),
            FrameError::Truncated { have, want } => {
                write!(f, "the body ended inside a frame ({have} of {want} bytes)")
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// Frames out of a body that comes in pieces.
#[derive(Debug, Default)]
pub struct Reader {
    buf: Vec<u8>,
}

impl Reader {
    /// Takes the next piece of the body; the frames it completes.
    pub fn push(&mut self, piece: &[u8]) -> Result<Vec<Frame>, FrameError> {
        self.buf.extend_from_slice(piece);
        let mut out = Vec::new();
        loop {
            let Some(head) = self.buf.get(..5) else {
                return Ok(out);
            };
            let (flags, len) = (
                head[0],
                u32::from_be_bytes([head[1], head[2], head[3], head[4]]),
            );
            let len = len as usize;
            if flags & COMPRESSED != 0 {
                return Err(FrameError::Compressed);
            }
            if len > MAX_MESSAGE {
                return Err(FrameError::TooLarge(len));
            }
            if self.buf.len() < 5 + len {
                return Ok(out);
            }
            let message = self.buf[5..5 + len].to_vec();
            self.buf.drain(..5 + len);
            out.push(Frame { flags, message });
        }
    }

    /// The body ended: an error if it ended inside a frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.buf.len() {
            0 => Ok(()),
            n if n < 5 => Err(FrameError::Truncated { have: n, want: 5 }),
            n => {
                let want =
                    5 + u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                        as usize;
                Err(FrameError::Truncated { have: n, want })
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_anywhere_are_read_whole_and_in_order() {
        let start = message(&json!({"event": {"start": {"pid": 7}}}));
        let data = message(&json!({"event": {"data": {"stdout": "aGkK"}}}));
        let stop = end(None);
        let body: Vec<u8> = [start.clone(), data.clone(), stop.clone()].concat();
        // Every split of the body into two pieces, and one byte at a time.
        for cut in 0..=body.len() {
            let mut r = Reader::default();
            let mut got = r.push(&body[..cut]).unwrap();
            got.extend(r.push(&body[cut..]).unwrap());
            r.finish().unwrap();
            assert_eq!(got.len(), 3, "cut at {cut}");
            assert!(got[2].is_end() && !got[0].is_end());
            assert_eq!(got[1].message, data[5..].to_vec());
        }
        let mut r = Reader::default();
        let n: usize = body.iter().map(|b| r.push(&[*b]).unwrap().len()).sum();
        assert_eq!(n, 3);
    }

    #[test]
    fn an_error_ends_a_stream_and_bad_frames_are_refused() {
        let e = end(Some(("not_found", "no process 9")));
        assert_eq!(e[0], END_STREAM);
        let v: Value = serde_json::from_slice(&e[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        let mut r = Reader::default();
        assert_eq!(
            r.push(&frame(COMPRESSED, b"x")),
            Err(FrameError::Compressed)
        );
        let mut r = Reader::default();
        let huge = [0u8, 0xff, 0xff, 0xff, 0xff];
        assert!(matches!(r.push(&huge), Err(FrameError::TooLarge(_))));
        let mut r = Reader::default();
        r.push(&message(&json!({}))[..4]).unwrap();
        assert_eq!(r.finish(), Err(FrameError::Truncated { have: 4, want: 5 }));
    }
}
