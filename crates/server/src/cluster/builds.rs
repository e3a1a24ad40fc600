//! The progress of a carried image's first build in the cluster (see `transfer::first_build`),
//! kept by the node that builds it and asked for through any node: `GET
//! /v1/cluster/builds/NAME?from=K` answers the lines from K on, here when this node builds it,
//! else from the node whose claim etcd holds (`builds/NAME`). The CLI's create polls it while
//! the create waits, and prints what a single daemon's CLI prints when it builds.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use forkbox_engine::api::{BuildLogView, BuildProgress, Code};
use forkbox_engine::image::BuildEvent;

use super::Node;
use crate::refusal;

/// Lines a build's log keeps (the newest; a poller that falls behind skips the oldest).
const MAX_LINES: usize = 2000;

struct Log {
    started: Instant,
    /// Lines dropped from the front.
    dropped: usize,
    lines: VecDeque<String>,
    done: bool,
    error: Option<String>,
}

/// The builds this node ran for the cluster, by image name (the last one of each).
#[derive(Default)]
pub struct Builds {
    logs: Mutex<HashMap<String, Log>>,
}

impl Builds {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Log>) -> T) -> T {
        f(&mut self.logs.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A build of `image` starts here.
    pub fn start(&self, image: &str) {
        self.with(|m| {
            m.insert(
                image.to_string(),
                Log {
                    started: Instant::now(),
                    dropped: 0,
                    lines: VecDeque::new(),
                    done: false,
                    error: None,
                },
            )
        });
    }

    /// One event of its progress, as a line like the CLI's own build prints.
    pub fn record(&self, image: &str, ev: &BuildProgress) {
        self.with(|m| {
            let Some(log) = m.get_mut(image) else { return };
            let ev = match ev {
                BuildProgress::Step { n, total, what } => BuildEvent::Step {
                    n: *n,
                    total: *total,
                    what: what.clone(),
                },
                BuildProgress::Log { line } => BuildEvent::Log(line.clone()),
                _ => return,
            };
            let line = ev.line(log.started.elapsed().as_secs_f64());
            log.lines.push_back(line);
            if log.lines.len() > MAX_LINES {
                log.lines.pop_front();
                log.dropped += 1;
            }
        });
    }

    /// It ended: built, or with `error`.
    pub fn end(&self, image: &str, error: Option<String>) {
        self.with(|m| {
            if let Some(log) = m.get_mut(image) {
                log.done = true;
                log.error = error;
            }
        });
    }

    fn view(&self, image: &str, node: &str, from: usize) -> Option<BuildLogView> {
        self.with(|m| {
            let log = m.get(image)?;
            let skip = from.saturating_sub(log.dropped).min(log.lines.len());
            Some(BuildLogView {
                image: image.to_string(),
                node: node.to_string(),
                lines: log.lines.iter().skip(skip).cloned().collect(),
                next: log.dropped + log.lines.len(),
                done: log.done,
                error: log.error.clone(),
            })
        })
    }
}

fn from_of(req: &Request) -> usize {
    req.uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("from="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn not_here(image: &str) -> Response {
    refusal(
        Code::ImageNotFound,
        format!("no node of the cluster builds image {image} now or has built it since it started"),
    )
}

/// This node's log of `image`'s build (a peer's call, or the user's when it builds here).
pub fn local(node: &Node, image: &str, req: &Request) -> Response {
    match node.builds.view(image, &node.name, from_of(req)) {
        Some(v) => axum::Json(v).into_response(),
        None => not_here(image),
    }
}

/// A user's call: answered here when this node builds `image`, else by the node etcd names as
/// its builder.
pub async fn route(node: &Node, image: &str, req: Request) -> Response {
    if let Some(v) = node.builds.view(image, &node.name, from_of(&req)) {
        return axum::Json(v).into_response();
    }
    let Some(c) = node.cluster().await else {
        return not_here(image);
    };
    let builder = match c.builder(image).await {
        Ok(Some(b)) if b != node.name => b,
        Ok(_) => return not_here(image),
        Err(e) => return Node::unavailable(e),
    };
    let live = match c.nodes().await {
        Ok(n) => n,
        Err(e) => return Node::unavailable(e),
    };
    match live.iter().find(|n| n.name == builder) {
        Some(target) => node.forward(target, req).await,
        None => not_here(image),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_poller_gets_each_line_once_and_skips_what_was_dropped() {
        let b = Builds::default();
        assert!(b.view("img", "a", 0).is_none());
        b.start("img");
        let step = |n| BuildProgress::Step {
            n,
            total: 3,
            what: format!("step {n}"),
        };
        b.record("img", &step(1));
        b.record("img", &BuildProgress::Log { line: "apt".into() });
        let v = b.view("img", "a", 0).unwrap();
        assert_eq!(v.lines.len(), 2);
        assert!(v.lines[0].starts_with("[1/3] step 1 (at "), "{:?}", v.lines);
        assert_eq!(v.lines[1], "      apt");
        assert!(!v.done);
        let again = b.view("img", "a", v.next).unwrap();
        assert!(again.lines.is_empty());
        for i in 0..MAX_LINES + 5 {
            b.record(
                "img",
                &BuildProgress::Log {
                    line: format!("l{i}"),
                },
            );
        }
        let late = b.view("img", "a", v.next).unwrap();
        assert_eq!(late.lines.len(), MAX_LINES, "the oldest are gone");
        assert_eq!(late.next, MAX_LINES + 7);
        assert_eq!(
            late.lines.last().unwrap(),
            &format!("      l{}", MAX_LINES + 4)
        );
        b.end("img", Some("mirror down".into()));
        let end = b.view("img", "a", late.next).unwrap();
        assert!(end.done && end.error.as_deref() == Some("mirror down"));
    }
}
