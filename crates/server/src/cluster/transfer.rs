//! Snapshots between nodes by chunks (see `forkbox_engine::snapshot::chunks`).
//!
//! A holder answers two calls, from signed peers only: `GET /v1/cluster/snapshots/NAME/manifest`
//! (the manifest, encoded) and `POST /v1/cluster/snapshots/NAME/chunks` (a body of 32-byte chunk
//! names; the reply is their bytes one after another). A node that must restore a snapshot it
//! lacks asks a holder for the manifest, plans what it holds already, fetches the rest in
//! batches on a few connections at once from the holders etcd names (the next holder when one
//! fails or sends a chunk that does not verify), and has the engine assemble and publish it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use forkbox_cluster::NodeRecord;
use forkbox_engine::api::{ops, Code, Transfer, MAX_CHUNKS_PER_CALL};
use forkbox_engine::snapshot::chunks::{self, Chunk, Hash, Manifest};
use futures_util::StreamExt;

use super::Node;
use crate::refusal;

/// Bytes of chunks one request asks for, at most.
const BATCH_BYTES: usize = 4 << 20;
/// Requests in flight at once.
const PARALLEL: usize = 4;
/// How long a create waits for a carried image another node builds for the cluster.
const FIRST_BUILD_WAIT: std::time::Duration = std::time::Duration::from_secs(20 * 60);
/// The header a node forwarding a fork sets: the node that holds the snapshot (its record may
/// not list it yet).
pub const HOLDER_HEADER: &str = "x-forkbox-holder";

/// Per snapshot name: one assembly at a time (a second fork waits and finds it here).
#[derive(Default)]
pub struct Pulls {
    locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Pulls {
    fn lock_for(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|_, l| Arc::strong_count(l) > 1);
        m.entry(name.to_string()).or_default().clone()
    }
}

/// A peer's call on `/v1/cluster/snapshots/NAME/...`, if this is one.
pub async fn serve(node: &Node, req: Request) -> Result<Response, Request> {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (req.method().clone(), segs.as_slice()) {
        (Method::GET, ["v1", "cluster", "snapshots", name, "manifest"]) => {
            let name = name.to_string();
            Ok(answer(
                node.engine.call(ops::SnapshotManifest { name }).await,
            ))
        }
        (Method::GET, ["v1", "cluster", "builds", image]) => {
            Ok(super::builds::local(node, image, &req))
        }
        (Method::GET, ["v1", "cluster", "images", reference, "manifest"]) => {
            let r = match reference.parse() {
                Ok(r) => node.engine.call(ops::ImageManifest { reference: r }).await,
                Err(e) => Err(forkbox_engine::api::EngineError::from(e)),
            };
            Ok(answer(r))
        }
        (Method::POST, ["v1", "cluster", kind @ ("snapshots" | "images"), name, "chunks"]) => {
            let name = match *kind {
                "images" => format!("image:{name}"),
                _ => name.to_string(),
            };
            let limit = MAX_CHUNKS_PER_CALL * 32;
            let body = match axum::body::to_bytes(req.into_body(), limit).await {
                Ok(b) => b,
                Err(e) => return Ok(refusal(Code::PayloadTooLarge, e.to_string())),
            };
            if body.len() % 32 != 0 {
                return Ok(refusal(Code::BadRequest, "chunk names are 32 bytes each"));
            }
            let hashes = body
                .chunks(32)
                .map(|h| {
                    let mut a = [0u8; 32];
                    a.copy_from_slice(h);
                    a
                })
                .collect();
            let r = node.engine.call(ops::SnapshotChunks { name, hashes }).await;
            if let Ok(b) = &r {
                node.engine
                    .metrics()
                    .chunk_bytes_served
                    .inc_by(b.len() as u64);
            }
            Ok(answer(r))
        }
        _ => Err(req),
    }
}

fn answer(r: Result<Vec<u8>, forkbox_engine::api::EngineError>) -> Response {
    match r {
        Ok(bytes) => (
            StatusCode::OK,
            [("content-type", "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(e) => crate::engine_error(e),
    }
}

/// Why a pull failed, as the reply to the call that needed it.
fn failed(code: Code, what: impl std::fmt::Display) -> Response {
    refusal(code, what.to_string())
}

impl Node {
    /// The nodes that hold snapshot `name` (`hint` first), this one left out.
    async fn holders(&self, name: &str, hint: Option<&str>) -> Vec<NodeRecord> {
        let Some(c) = self.cluster().await else {
            return Vec::new();
        };
        let live = match c.nodes().await {
            Ok(n) => n,
            Err(_) => return Vec::new(),
        };
        let mut out: Vec<NodeRecord> = live
            .iter()
            .filter(|n| n.name != self.name)
            .filter(|n| Some(n.name.as_str()) == hint)
            .cloned()
            .collect();
        out.extend(
            live.into_iter()
                .filter(|n| n.name != self.name && Some(n.name.as_str()) != hint)
                .filter(|n| n.snapshots.iter().any(|s| s == name)),
        );
        out
    }

    /// Makes sure snapshot `name` is held here, bringing it from the nodes that hold it when it
    /// is not: what moved, or `None` when it was here already. A failure leaves nothing behind.
    pub async fn pull(&self, name: &str, hint: Option<&str>) -> Result<Option<Transfer>, Response> {
        let here = || async {
            self.engine
                .call(ops::GetSnapshot {
                    name: name.to_string(),
                })
                .await
                .is_ok()
        };
        if here().await {
            return Ok(None);
        }
        let lock = self.pulls.lock_for(name);
        let _one = lock.lock().await;
        if here().await {
            return Ok(None);
        }
        let started = Instant::now();
        let holders = self.holders(name, hint).await;
        if holders.is_empty() {
            // Held nowhere: the engine says what is wrong with the request, as on one daemon.
            return Ok(None);
        }
        let (manifest, manifest_bytes, first) = self.fetch_manifest(name, &holders).await?;
        // A copy needs its image here too: brought first, so its root disk is here for the plan.
        let image = match manifest.meta() {
            Ok(m) => self.pull_image(&m.image).await?,
            Err(e) => return Err(crate::engine_error(e.into())),
        };
        let ms = |t: Instant| t.elapsed().as_millis();
        let (got_manifest, planning) = (ms(started), Instant::now());
        let layers = manifest.mem.len() as u32;
        let plan = self
            .engine
            .call(ops::PlanPull { manifest })
            .await
            .map_err(crate::engine_error)?;
        let needed_bytes = plan.bytes_written();
        let (layers_held, chunks_local) = (
            plan.base.as_ref().map_or(0, |b| b.1 as u32),
            plan.local.len() as u64,
        );
        tracing::info!(
            "snapshot {name}: bringing it from {}: {} chunks ({:.1} MiB) to fetch, {} read from \
             this node's files, {layers_held} of {layers} RAM layers held here",
            holders
                .iter()
                .map(|h| h.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            plan.missing.len(),
            plan.missing_bytes() as f64 / 1048576.0,
            chunks_local
        );
        // The holder that gave the manifest is asked first.
        let mut order = holders.clone();
        order.rotate_left(first);
        let planned = ms(planning);
        let got = self.fetch_and_assemble(name, plan, &order).await?;
        let (fetched, assembled) = (got.fetch_ms, got.assemble_ms);
        let (bytes_moved, chunks_fetched) = (got.bytes, got.count);
        let t = Transfer {
            snapshot: Some(name.to_string()),
            image: image.as_ref().and_then(|i| i.image.clone()),
            node: self.name.clone(),
            from: got.from,
            bytes_moved: bytes_moved + image.as_ref().map_or(0, |i| i.bytes_moved),
            needed_bytes: needed_bytes + image.as_ref().map_or(0, |i| i.needed_bytes),
            manifest_bytes,
            chunks_fetched,
            chunks_local,
            layers_held,
            layers,
            chunks_refetched: got.refetched,
            duration_ms: started.elapsed().as_millis() as u64,
        };
        let m = self.engine.metrics();
        m.snapshots_pulled.inc();
        m.chunk_bytes_fetched.inc_by(bytes_moved);
        tracing::info!(
            "{} (manifest {got_manifest} ms, plan {planned} ms, chunks {fetched} ms, assembly \
             {assembled} ms)",
            brought_line(&t)
        );
        self.publish_now().await;
        Ok(Some(t))
    }

    /// Fetches a planned snapshot's missing chunks while its RAM file is made and its base
    /// copied, then has the engine finish it; nothing is kept when either fails.
    async fn fetch_and_assemble(
        &self,
        name: &str,
        plan: chunks::Plan,
        order: &[NodeRecord],
    ) -> Result<Fetched, Response> {
        let started = Instant::now();
        let pq = format!("/v1/cluster/snapshots/{name}/chunks");
        let what = format!("snapshot {name}");
        let stage = self.engine.call(ops::StagePull {
            base: plan.base.as_ref().map(|b| b.0.clone()),
            mem_len: plan.manifest.mem_len,
        });
        let fetch = self.fetch_chunks(&what, &pq, &plan.missing, order);
        let (staged, mut got) = match tokio::join!(stage, fetch) {
            (Ok(s), Ok(g)) => (s, g),
            (Ok(s), Err(r)) => {
                let _ = self.engine.call(ops::DiscardStaged { staged: s }).await;
                return Err(r);
            }
            (Err(_), Err(r)) => return Err(r),
            (Err(e), Ok(_)) => return Err(crate::engine_error(e)),
        };
        got.fetch_ms = started.elapsed().as_millis();
        let assembling = Instant::now();
        let fetched = std::mem::take(&mut got.fetched);
        got.bytes = fetched.values().map(|b| b.len() as u64).sum();
        got.count = fetched.len() as u64;
        self.engine
            .call(ops::AssemblePull {
                plan,
                fetched,
                staged,
            })
            .await
            .map_err(crate::engine_error)?;
        got.assemble_ms = assembling.elapsed().as_millis();
        Ok(got)
    }

    /// Makes sure image `reference` (`NAME` or `NAME@N`) is held here, bringing it from a node
    /// that holds it when it is not: what moved, or `None` when it was here (or is held
    /// nowhere: the create then says the image is unknown, as on one daemon).
    pub async fn pull_image(&self, reference: &str) -> Result<Option<Transfer>, Response> {
        let Ok(want) = reference.parse::<forkbox_engine::image::ImageRef>() else {
            return Ok(None);
        };
        let here = || async {
            self.engine
                .call(ops::GetImage {
                    reference: want.clone(),
                })
                .await
                .is_ok()
        };
        if here().await {
            return Ok(None);
        }
        let lock = self.pulls.lock_for(&format!("image:{}", want.name));
        let _one = lock.lock().await;
        if here().await {
            return Ok(None);
        }
        let Some((exact, holders)) = self.image_source(&want).await? else {
            return Ok(None);
        };
        let started = Instant::now();
        let pq = format!("/v1/cluster/images/{exact}/manifest");
        let mut why = Vec::new();
        let mut got = None;
        for h in &holders {
            match self.peer_call(h, Method::GET, &pq, Vec::new()).await {
                Ok(b) => match chunks::ImageManifest::decode(&b) {
                    Ok(m) => {
                        got = Some((m, b.len() as u64));
                        break;
                    }
                    Err(e) => why.push(format!("node {}: {e}", h.name)),
                },
                Err(e) => why.push(format!("node {}: {e}", h.name)),
            }
        }
        let Some((manifest, manifest_bytes)) = got else {
            return Err(failed(
                Code::NodeUnreachable,
                format!(
                    "image {exact} could not be brought to {}: {}",
                    self.name,
                    why.join("; ")
                ),
            ));
        };
        let plan = self
            .engine
            .call(ops::PlanImagePull { manifest })
            .await
            .map_err(crate::engine_error)?;
        let chunks_local = plan.local.len() as u64;
        let needed_bytes = plan.manifest.rootfs.layer.bytes();
        let what = format!("image {exact}");
        let pq = format!("/v1/cluster/images/{exact}/chunks");
        let fetched = self
            .fetch_chunks(&what, &pq, &plan.missing, &holders)
            .await?;
        let bytes_moved = fetched
            .fetched
            .values()
            .map(|b| b.len() as u64)
            .sum::<u64>();
        let t = Transfer {
            snapshot: None,
            image: Some(exact.clone()),
            node: self.name.clone(),
            from: fetched.from.clone(),
            bytes_moved,
            needed_bytes,
            manifest_bytes,
            chunks_fetched: fetched.fetched.len() as u64,
            chunks_local,
            layers_held: 0,
            layers: 0,
            chunks_refetched: fetched.refetched,
            duration_ms: 0,
        };
        self.engine
            .call(ops::AssembleImagePull {
                plan,
                fetched: fetched.fetched,
            })
            .await
            .map_err(crate::engine_error)?;
        let t = Transfer {
            duration_ms: started.elapsed().as_millis() as u64,
            ..t
        };
        self.engine
            .metrics()
            .chunk_bytes_fetched
            .inc_by(bytes_moved);
        tracing::info!("{}", brought_line(&t));
        self.publish_now().await;
        Ok(Some(t))
    }

    /// Where image `want` comes from: the nodes that hold it, or, for a carried image no node
    /// holds, the node that built it first (`None` when it was built here or is nowhere).
    async fn image_source(
        &self,
        want: &forkbox_engine::image::ImageRef,
    ) -> Result<Option<(String, Vec<NodeRecord>)>, Response> {
        match self.image_holders(want).await {
            Some(h) => Ok(Some(h)),
            None => self.first_build(want).await,
        }
    }

    /// A carried image (see `forkbox_engine::image::bundled`) that no node holds: built here
    /// when this node wins the cluster's claim on its build, else waited for while another
    /// node builds it, then its holders (to bring it from). `None` when it was built here or
    /// is no carried image (the create then says it is missing).
    async fn first_build(
        &self,
        want: &forkbox_engine::image::ImageRef,
    ) -> Result<Option<(String, Vec<NodeRecord>)>, Response> {
        let text = match want.version {
            None => forkbox_engine::image::bundled::recipe(&want.name),
            Some(_) => None,
        };
        let (Some(text), Some(c)) = (text, self.cluster().await) else {
            return Ok(None);
        };
        let started = Instant::now();
        let mut said = false;
        loop {
            if let Some(h) = self.image_holders(want).await {
                return Ok(Some(h));
            }
            match c.claim_build(&want.name).await {
                Ok(None) => break,
                Ok(Some(builder)) => {
                    if !said {
                        tracing::info!(
                            "image {}: node {builder} builds it (its first use in the \
                             cluster); this node brings it from there once built",
                            want.name
                        );
                        said = true;
                    }
                }
                Err(e) => return Err(Node::unavailable(e)),
            }
            if started.elapsed() > FIRST_BUILD_WAIT {
                return Err(failed(
                    Code::ClusterUnavailable,
                    format!(
                        "image {} is being built on another node and was not there after {} \
                         minutes; try again later",
                        want.name,
                        FIRST_BUILD_WAIT.as_secs() / 60
                    ),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let built = self.build_here(want, text).await;
        // Published before the claim goes, so a waiting node finds a holder, never a gap.
        self.publish_now().await;
        if let Err(e) = c.release_build(&want.name).await {
            tracing::warn!(
                "image {}: built; its build claim goes with the lease: {e}",
                want.name
            );
        }
        built.map(|()| None)
    }

    /// Builds carried image `want` here from recipe `text`, its progress in the log.
    async fn build_here(
        &self,
        want: &forkbox_engine::image::ImageRef,
        text: &str,
    ) -> Result<(), Response> {
        let recipe = forkbox_engine::image::Recipe::parse(text)
            .map_err(|e| failed(Code::Internal, format!("forkbox's recipe of {want}: {e}")))?;
        tracing::info!(
            "image {}: no node holds it; building it here from forkbox's own recipe (its first \
             use in the cluster)",
            want.name
        );
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let name = want.name.clone();
        self.builds.start(&name);
        // Each step and log line goes to the log and to the build's progress users poll.
        let logging = async {
            while let Some(ev) = rx.recv().await {
                self.builds.record(&name, &ev);
                match ev {
                    forkbox_engine::api::BuildProgress::Step { n, total, what } => {
                        tracing::info!("image {name}: [{n}/{total}] {what}")
                    }
                    forkbox_engine::api::BuildProgress::Log { line } => {
                        tracing::info!("image {name}:       {line}")
                    }
                    _ => {}
                }
            }
        };
        let building = self.engine.call(ops::BuildImage {
            recipe,
            source: Some(text.to_string()),
            if_changed: true,
            events: Some(tx),
        });
        let (r, ()) = tokio::join!(building, logging);
        self.builds
            .end(&want.name, r.as_ref().err().map(ToString::to_string));
        match r {
            Ok(v) => {
                tracing::info!("image {}: built here as {}", want.name, v.reference);
                Ok(())
            }
            Err(e) => Err(crate::engine_error(e)),
        }
    }

    /// The exact reference (`NAME@N`, the newest version held when `want` names none) and the
    /// live nodes holding it; `None` when no other node does.
    async fn image_holders(
        &self,
        want: &forkbox_engine::image::ImageRef,
    ) -> Option<(String, Vec<NodeRecord>)> {
        let c = self.cluster().await?;
        let live = c.nodes().await.ok()?;
        let version_of = |r: &str| -> Option<u32> {
            let (n, v) = r.split_once('@')?;
            (n == want.name).then(|| v.parse().ok())?
        };
        let version = match want.version {
            Some(v) => v,
            None => live
                .iter()
                .filter(|n| n.name != self.name)
                .flat_map(|n| n.images.iter().filter_map(|r| version_of(r)))
                .max()?,
        };
        let exact = format!("{}@{version}", want.name);
        let holders: Vec<NodeRecord> = live
            .into_iter()
            .filter(|n| n.name != self.name && n.images.contains(&exact))
            .collect();
        (!holders.is_empty()).then_some((exact, holders))
    }

    /// The manifest from the first holder that gives one: it, its size, and that holder's
    /// place in `holders`.
    async fn fetch_manifest(
        &self,
        name: &str,
        holders: &[NodeRecord],
    ) -> Result<(Manifest, u64, usize), Response> {
        let pq = format!("/v1/cluster/snapshots/{name}/manifest");
        let mut why = Vec::new();
        for (i, h) in holders.iter().enumerate() {
            match self.peer_call(h, Method::GET, &pq, Vec::new()).await {
                Ok(b) => match Manifest::decode(&b) {
                    Ok(m) => return Ok((m, b.len() as u64, i)),
                    Err(e) => why.push(format!("node {}: {e}", h.name)),
                },
                Err(e) => why.push(format!("node {}: {e}", h.name)),
            }
        }
        Err(failed(
            Code::NodeUnreachable,
            format!(
                "snapshot {name} could not be brought to {}: no holder gave its manifest ({})",
                self.name,
                why.join("; ")
            ),
        ))
    }

    /// Fetches `missing` from `holders` (batches on a few connections; a batch that fails or
    /// holds a chunk that does not verify is asked of the next holder), every chunk verified.
    async fn fetch_chunks(
        &self,
        name: &str,
        pq: &str,
        missing: &[Chunk],
        holders: &[NodeRecord],
    ) -> Result<Fetched, Response> {
        let mut batches: Vec<Vec<Chunk>> = Vec::new();
        let mut size = 0usize;
        for c in missing {
            if batches.is_empty()
                || size + c.len() > BATCH_BYTES
                || batches
                    .last()
                    .is_some_and(|b| b.len() >= MAX_CHUNKS_PER_CALL)
            {
                batches.push(Vec::new());
                size = 0;
            }
            size += c.len();
            if let Some(b) = batches.last_mut() {
                b.push(*c);
            }
        }
        let dead: std::sync::Mutex<HashSet<String>> = Default::default();
        let results: Vec<Result<BatchGot, String>> = futures_util::stream::iter(batches)
            .map(|b| self.fetch_batch(name, pq, b, holders, &dead))
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        let mut out = Fetched::default();
        let mut from: HashSet<String> = HashSet::new();
        for r in results {
            let got = r.map_err(|e| {
                failed(
                    Code::NodeUnreachable,
                    format!(
                        "{name} could not be brought to {}: {e}; nothing of it was kept",
                        self.name
                    ),
                )
            })?;
            out.fetched.extend(got.chunks);
            out.refetched += got.refetched;
            from.insert(got.from);
        }
        out.from = from.into_iter().collect();
        out.from.sort();
        Ok(out)
    }

    /// One batch, from the first holder (not known dead) whose chunks all verify.
    async fn fetch_batch(
        &self,
        name: &str,
        pq: &str,
        batch: Vec<Chunk>,
        holders: &[NodeRecord],
        dead: &std::sync::Mutex<HashSet<String>>,
    ) -> Result<BatchGot, String> {
        let body: Vec<u8> = batch.iter().flat_map(|c| c.hash).collect();
        let mut why = Vec::new();
        let mut refetched = 0u64;
        for h in holders {
            if dead.lock().is_ok_and(|d| d.contains(&h.name)) {
                continue;
            }
            let bytes = match self.peer_call(h, Method::POST, pq, body.clone()).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!("{name}: fetching chunks from {}: {e}", h.name);
                    if let Ok(mut d) = dead.lock() {
                        d.insert(h.name.clone());
                    }
                    why.push(format!("node {}: {e}", h.name));
                    continue;
                }
            };
            match split_verified(&batch, &bytes) {
                Ok(chunks) => {
                    return Ok(BatchGot {
                        chunks,
                        refetched,
                        from: h.name.clone(),
                    })
                }
                Err(bad) => {
                    refetched += 1;
                    tracing::warn!(
                        "{name}: chunk {bad} from node {} does not match its name (corrupt \
                         there); asking another holder",
                        h.name
                    );
                    why.push(format!("node {} sent chunk {bad} corrupt", h.name));
                }
            }
        }
        Err(format!(
            "no holder gave {} of its chunks intact ({})",
            batch.len(),
            if why.is_empty() {
                "every holder failed before".to_string()
            } else {
                why.join("; ")
            }
        ))
    }
}

#[derive(Default)]
struct Fetched {
    fetched: HashMap<Hash, Vec<u8>>,
    from: Vec<String>,
    refetched: u64,
    fetch_ms: u128,
    assemble_ms: u128,
    /// What `fetched` held before it went to the assembly.
    bytes: u64,
    count: u64,
}

struct BatchGot {
    chunks: Vec<(Hash, Vec<u8>)>,
    refetched: u64,
    from: String,
}

/// The batch's chunks cut from `bytes`, each verified; the first that does not verify (its
/// name in hex) otherwise.
fn split_verified(batch: &[Chunk], bytes: &[u8]) -> Result<Vec<(Hash, Vec<u8>)>, String> {
    let mut out = Vec::with_capacity(batch.len());
    let mut at = 0usize;
    for c in batch {
        let end = at + c.len();
        let Some(b) = bytes.get(at..end) else {
            return Err(format!("{} (the reply ended early)", hex(&c.hash)));
        };
        if !chunks::verify(c, b) {
            return Err(hex(&c.hash));
        }
        out.push((c.hash, b.to_vec()));
        at = end;
    }
    if at != bytes.len() {
        return Err("(a reply longer than the chunks asked)".into());
    }
    Ok(out)
}

/// What a transfer moved, in words.
fn brought_line(t: &Transfer) -> String {
    format!(
        "{}: brought from {} in {} ms: {} chunks fetched ({:.1} MiB, {} refetched), {} read \
         from this node's files, {} of {} RAM layers held here, manifest {} KiB",
        match (&t.snapshot, &t.image) {
            (Some(s), _) => format!("snapshot {s}"),
            (None, Some(i)) => format!("image {i}"),
            _ => String::new(),
        },
        t.from.join(", "),
        t.duration_ms,
        t.chunks_fetched,
        t.bytes_moved as f64 / 1048576.0,
        t.chunks_refetched,
        t.chunks_local,
        t.layers_held,
        t.layers,
        t.manifest_bytes >> 10
    )
}

fn hex(h: &Hash) -> String {
    h.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
