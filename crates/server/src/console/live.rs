//! What the console shows, and its event stream: the whole state once, again only after the
//! engine's change counter moved (or a sandbox's state moved by itself: a VM that failed), and
//! the VMs' figures every few seconds. A page with nothing changing costs a few hundred bytes
//! every 5 s; the page itself never asks again.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Router;
use forkbox_engine::api::{
    ops, Engine, ImageView, InfoView, MigrationView, SandboxView, SnapshotMeta,
};
use serde::{Deserialize, Serialize};
use tower::ServiceExt;

/// The most bytes of a cluster listing the console reads.
const MAX_LISTING: usize = 64 << 20;
/// How often the VMs' figures go out, and sandboxes' states are looked at again.
pub const TICK: Duration = Duration::from_secs(5);
/// How long a burst of changes is let settle before the state is read again.
const SETTLE: Duration = Duration::from_millis(50);
/// The host's figures: one point every 30 s, the last hour of them.
const SERIES_EVERY: Duration = Duration::from_secs(30);
const SERIES_POINTS: usize = 120;

/// Where the console reads what it lists: this daemon's engine, and on a cluster's node the
/// API with the cluster's routing, so that the sandboxes and snapshots of every live node are
/// listed (each with its node) through the same forwarding as the API's own listings.
#[derive(Clone)]
pub struct Source {
    pub engine: Arc<Engine>,
    pub cluster_api: Option<Router>,
}

/// A snapshot (or a migration) as a listing gives it: in a cluster, with the node that holds
/// it.
#[derive(Serialize, Deserialize)]
pub struct Held<T = SnapshotMeta> {
    #[serde(flatten)]
    pub meta: T,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// The state the pages draw.
#[derive(Serialize)]
pub struct State {
    pub sandboxes: Vec<SandboxView>,
    pub snapshots: Vec<Held>,
    pub images: Vec<ImageView>,
    pub info: Option<InfoView>,
    /// Runs of `forkbox migrate` that registered, newest first (in a cluster, every node's,
    /// each with its node).
    pub migrations: Vec<Held<MigrationView>>,
}

/// The VMs' figures now, and the daemon's clock (for TTLs left).
#[derive(Serialize)]
struct Usage {
    now_unix: u64,
    usage: HashMap<String, forkbox_engine::metrics::Usage>,
}

/// One point of the host's figures.
#[derive(Serialize, Clone, Copy)]
pub struct Point {
    pub t: u64,
    pub sandboxes: usize,
    pub cpu_percent: f64,
    pub rss_mib: f64,
    pub disk_free_gib: f64,
    pub pool_ready: usize,
}

/// The host's figures of the last hour.
pub struct Series {
    points: Mutex<VecDeque<Point>>,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Series {
    /// Samples the host every 30 s from now on, for as long as the daemon runs.
    pub fn spawn(engine: Arc<Engine>) -> Arc<Series> {
        let series = Arc::new(Series {
            points: Mutex::new(VecDeque::with_capacity(SERIES_POINTS)),
        });
        let s = series.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SERIES_EVERY);
            loop {
                every.tick().await;
                let p = sample(&engine).await;
                if let Ok(mut points) = s.points.lock() {
                    if points.len() == SERIES_POINTS {
                        points.pop_front();
                    }
                    points.push_back(p);
                }
            }
        });
        series
    }

    pub fn points(&self) -> Vec<Point> {
        self.points
            .lock()
            .map(|p| p.iter().copied().collect())
            .unwrap_or_default()
    }
}

async fn sample(engine: &Engine) -> Point {
    let usage = engine.metrics().usage();
    let info = engine.call(ops::Info {}).await.ok();
    let free = nix::sys::statvfs::statvfs(engine.paths().home())
        .map(|s| s.blocks_available() as f64 * s.fragment_size() as f64)
        .unwrap_or(0.0);
    Point {
        t: now_unix(),
        sandboxes: info.as_ref().map_or(0, |i| i.sandboxes),
        cpu_percent: usage.values().map(|u| u.cpu_percent).sum(),
        rss_mib: usage.values().map(|u| u.rss_mib).sum(),
        disk_free_gib: free / (1u64 << 30) as f64,
        pool_ready: info
            .as_ref()
            .map_or(0, |i| i.pool.slots.iter().map(|c| c.ready).sum()),
    }
}

impl Source {
    /// `GET pq` of the cluster's API, parsed (an empty list when it does not answer: the page
    /// shows what it can and reads again at the next change or tick).
    async fn listing<T: serde::de::DeserializeOwned>(api: &Router, pq: &str) -> Vec<T> {
        let Ok(req) = axum::http::Request::get(pq).body(axum::body::Body::empty()) else {
            return Vec::new();
        };
        let Ok(r) = api.clone().oneshot(req).await;
        if !r.status().is_success() {
            tracing::warn!("console: {pq} answered {}", r.status());
            return Vec::new();
        }
        match axum::body::to_bytes(r.into_body(), MAX_LISTING).await {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    async fn sandboxes(&self) -> Vec<SandboxView> {
        match &self.cluster_api {
            Some(api) => Source::listing(api, "/v1/sandboxes").await,
            None => sandboxes(&self.engine).await,
        }
    }

    async fn snapshots(&self) -> Vec<Held> {
        match &self.cluster_api {
            Some(api) => Source::listing(api, "/v1/snapshots").await,
            None => {
                let local = self.engine.call(ops::ListSnapshots {}).await;
                here(local.unwrap_or_default())
            }
        }
    }

    async fn migrations(&self) -> Vec<Held<MigrationView>> {
        match &self.cluster_api {
            Some(api) => {
                let mut v: Vec<Held<MigrationView>> = Source::listing(api, "/v1/migrations").await;
                v.sort_by_key(|m| std::cmp::Reverse(m.meta.started_unix));
                v
            }
            None => {
                let local = self.engine.call(ops::ListMigrations {}).await;
                here(local.unwrap_or_default())
            }
        }
    }
}

/// This daemon's own items, with no node named.
fn here<T>(items: Vec<T>) -> Vec<Held<T>> {
    items
        .into_iter()
        .map(|meta| Held { meta, node: None })
        .collect()
}

impl State {
    pub async fn now(source: &Source) -> State {
        let engine = &source.engine;
        State {
            sandboxes: source.sandboxes().await,
            snapshots: source.snapshots().await,
            images: engine.call(ops::ListImages {}).await.unwrap_or_default(),
            info: engine.call(ops::Info {}).await.ok(),
            migrations: source.migrations().await,
        }
    }

    /// The JSON a page starts from: the state, the figures now and the host's series.
    pub fn initial(&self, engine: &Engine, series: &Series) -> String {
        serde_json::json!({
            "state": self,
            "usage": Usage::now(engine),
            "series": series.points(),
        })
        .to_string()
    }
}

async fn sandboxes(engine: &Engine) -> Vec<SandboxView> {
    engine
        .call(ops::List {
            label: None,
            state: None,
        })
        .await
        .unwrap_or_default()
}

impl Usage {
    fn now(engine: &Engine) -> Usage {
        Usage {
            now_unix: now_unix(),
            usage: engine.metrics().usage(),
        }
    }
}

fn json(v: &impl Serialize) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn event(name: &str, data: &impl Serialize) -> Option<Event> {
    let json = serde_json::to_string(data).ok()?;
    Some(Event::default().event(name).data(json))
}

/// The event stream of a page: `state` (everything, as [`State`]) at once and after each
/// change, `usage` (the VMs' figures) every [`TICK`], `series` (the host's figures) when a
/// point is added.
pub fn events(source: Source, series: Arc<Series>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(8);
    tokio::spawn(async move {
        let engine = source.engine.clone();
        let mut changes = engine.changes();
        let mut tick = tokio::time::interval(TICK);
        let mut last = State::now(&source).await;
        let mut last_json = json(&last);
        let mut last_sandboxes = json(&last.sandboxes);
        let mut sent_points = 0u64;
        let send = |e: Option<Event>| {
            let tx = tx.clone();
            async move {
                match e {
                    Some(e) => tx.send(Ok(e)).await.is_ok(),
                    None => true,
                }
            }
        };
        if !send(event("state", &last)).await {
            return;
        }
        loop {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    tokio::time::sleep(SETTLE).await;
                    changes.borrow_and_update();
                    let now = State::now(&source).await;
                    let now_json = json(&now);
                    if now_json != last_json {
                        last = now;
                        last_json = now_json;
                        last_sandboxes = json(&last.sandboxes);
                        if !send(event("state", &last)).await {
                            return;
                        }
                    }
                }
                _ = tick.tick() => {
                    // A sandbox's state can move without an operation (its VM failed); in a
                    // cluster, what other nodes do moves no counter here.
                    let moved = if source.cluster_api.is_some() {
                        let now = State::now(&source).await;
                        let now_json = json(&now);
                        let moved = now_json != last_json;
                        if moved {
                            last = now;
                            last_json = now_json;
                            last_sandboxes = json(&last.sandboxes);
                        }
                        moved
                    } else {
                        let now = source.sandboxes().await;
                        let now_json = json(&now);
                        let moved = now_json != last_sandboxes;
                        if moved {
                            last.sandboxes = now;
                            last_sandboxes = now_json;
                            last_json = json(&last);
                        }
                        moved
                    };
                    if moved && !send(event("state", &last)).await {
                        return;
                    }
                    if !send(event("usage", &Usage::now(&engine))).await {
                        return;
                    }
                    let points = series.points();
                    let newest = points.last().map_or(0, |p| p.t);
                    if newest != sent_points {
                        sent_points = newest;
                        if !send(event("series", &points)).await {
                            return;
                        }
                    }
                }
                _ = tx.closed() => return,
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
