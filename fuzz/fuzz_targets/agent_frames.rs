//! What a hostile guest can send the host: arbitrary bytes on the agent port, split anywhere.
#![no_main]

use forkbox_protocol::{decode, AgentMsg, FrameDecoder, Hello, MAGIC};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.first().copied().unwrap_or(1).max(1) as usize;
    let mut dec = FrameDecoder::new();
    for chunk in data.chunks(split) {
        dec.push(chunk);
        loop {
            match dec.next_frame() {
                Ok(Some(p)) if p.starts_with(&MAGIC) => {
                    let _ = Hello::parse(&p);
                }
                Ok(Some(p)) => {
                    let _ = decode::<AgentMsg>(&p);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
