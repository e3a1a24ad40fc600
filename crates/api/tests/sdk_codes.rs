//! Both SDKs map every error code of the API to an error class, and no code the API lacks:
//! their tables (`BY_CODE` in sdk/typescript/src/errors.ts, `_BY_CODE` in
//! sdk/python/src/forkbox/errors.py) hold exactly [`Code::ALL`]. A code added to the API fails
//! here until both SDKs say what it raises.

use std::collections::BTreeSet;

use forkbox_api::Code;

/// The keys of the table that starts at `start` (the line after it to the closing brace).
fn table_keys(source: &str, start: &str) -> BTreeSet<String> {
    let Some(at) = source.find(start) else {
        panic!("no {start:?} in the SDK's errors");
    };
    source[at..]
        .lines()
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('}'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, _)| k.trim().trim_matches('"').to_string())
        .collect()
}

fn codes() -> BTreeSet<String> {
    Code::ALL.iter().map(|c| c.as_str().to_string()).collect()
}

fn sdk_file(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

#[test]
fn the_typescript_sdk_maps_every_code() {
    let keys = table_keys(
        &sdk_file("sdk/typescript/src/errors.ts"),
        "const BY_CODE: Record<string, ErrorClass> = {",
    );
    assert_eq!(keys, codes());
}

#[test]
fn the_python_sdk_maps_every_code() {
    let keys = table_keys(
        &sdk_file("sdk/python/src/forkbox/errors.py"),
        "_BY_CODE = {",
    );
    assert_eq!(keys, codes());
}
