//! The engine's modules in layers, and arrows that run one way: a module may name (`crate::X`)
//! modules of its own layer or below, never above. Nothing below `api` reaches up into it (its
//! request and reply types live in `forkbox-api`, under the whole engine). A new module must be
//! given a layer here; a new upward reference fails with the file and line that makes it.
//! Reads the source; no VM.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;

/// Top to bottom: each layer's folder under `src/` (its first name) and the modules in it, by
/// the names the crate root re-exports them under (`crate::paths` is `host/paths.rs`). Within a
/// layer modules may use each other (sandbox and image do: a build runs in a sandbox, a sandbox
/// boots an image).
const LAYERS: &[(&str, &[&str])] = &[
    ("api", &["api"]),
    ("lifecycle", &["lifecycle", "pool", "commands", "doctor"]),
    (
        "sandbox",
        &[
            "sandbox",
            "client",
            "activity",
            "files",
            "net",
            "handshakes",
            "secrets",
            "ca",
            "intercept",
            "packages",
            "volumes",
            "diskwatch",
            "image",
        ],
    ),
    (
        "snapshot",
        &["snapshot", "fastram", "ram", "runstate", "state"],
    ),
    ("vm", &["vm"]),
    (
        "host",
        &[
            "host",
            "paths",
            "setup",
            "kernel",
            "cpio",
            "agent_bin",
            "random",
            "limits",
            "fds",
            "procfs",
            "guestlog",
            "metrics",
            "tree",
        ],
    ),
];

/// The errors of every layer, in one module each layer may name (an error wraps the errors of
/// what it called), itself naming only error types.
const SHARED: &[&str] = &["error"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

/// `(file, line number, text)` of every line outside tests and comments.
fn lines(dir: &Path, out: &mut Vec<(String, usize, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            lines(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (n, l) in code.lines().enumerate() {
                let t = l.trim_start();
                if !t.starts_with("//") {
                    out.push((path.display().to_string(), n + 1, t.to_string()));
                }
            }
        }
    }
}

/// The module a file of `src` belongs to: its first path component (a layer's folder, or a
/// module of its own such as `image/` or `error.rs`).
fn module_of(file: &str, src: &Path) -> String {
    let rel = Path::new(file).strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// Every module `line` names through `crate::` (macros, `crate::name!`, are not modules).
fn named(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && !rest[name.len()..].starts_with('!') {
            out.push(name);
        }
    }
    out
}

/// The tree shows the layers: every folder and file directly under `src/` is a layer, a module
/// of one, or the shared errors.
#[test]
fn the_source_tree_is_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let module = name.trim_end_matches(".rs");
        assert!(
            module == "lib" || SHARED.contains(&module) || layer_of(module).is_some(),
            "src/{name} is in no layer (tests/layers.rs)"
        );
    }
    for (layer, _) in LAYERS {
        assert!(
            src.join(layer).is_dir() || src.join(format!("{layer}.rs")).is_file(),
            "no src/{layer}/"
        );
    }
}

#[test]
fn every_module_names_only_its_layer_and_those_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    lines(&src, &mut all);
    let mut upward = Vec::new();
    let mut unplaced = std::collections::BTreeSet::new();
    for (file, n, line) in &all {
        let from = module_of(file, &src);
        if from == "lib" {
            continue;
        }
        let from_layer = if SHARED.contains(&from.as_str()) {
            None
        } else {
            match layer_of(&from) {
                Some(l) => Some(l),
                None => {
                    unplaced.insert(from.clone());
                    continue;
                }
            }
        };
        for to in named(line) {
            if to == from || SHARED.contains(&to.as_str()) {
                continue;
            }
            let Some(to_layer) = layer_of(&to) else {
                unplaced.insert(to);
                continue;
            };
            // The shared errors may name any layer's error type; others only down.
            if from_layer.is_some_and(|f| to_layer < f) {
                upward.push(format!(
                    "{file}:{n}: {from} ({}) names {to} ({}): {line}",
                    LAYERS[from_layer.unwrap_or(0)].0,
                    LAYERS[to_layer].0
                ));
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules without a layer in tests/layers.rs: {unplaced:?}"
    );
    assert!(
        upward.is_empty(),
        "upward references:\n{}",
        upward.join("\n")
    );
}

/// The check sees what it is meant to: a reference up from a lower layer is reported.
#[test]
fn an_upward_reference_would_be_found() {
    assert_eq!(named("use crate::api::EngineError;"), vec!["api"]);
    assert_eq!(named("crate::guest_info!(x)"), Vec::<String>::new());
    assert!(layer_of("api") < layer_of("vm"));
    assert_eq!(
        named("let a = crate::paths::x(crate::sandbox::y);"),
        vec!["paths", "sandbox"]
    );
}
