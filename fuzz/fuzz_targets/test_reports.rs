//! Test reports come out of the sandbox (untrusted): every parser must return results or an
//! error for any bytes, never panic or blow up.
#![no_main]

use forkbox_migrate::reports::{parse, Format};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for format in [Format::Auto, Format::PytestRa, Format::Junit, Format::GoJson, Format::Cargo, Format::Tap] {
        let _ = parse(format, &text);
    }
});
