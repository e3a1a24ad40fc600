//! Prometheus metrics of the daemon's engine: sandboxes, latencies, bytes moved, and per-sandbox
//! CPU-seconds and memory-seconds of their QEMU processes (the basis for cost accounting).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SandboxLabel {
    pub sandbox: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NetLabel {
    pub sandbox: String,
    /// `out` (guest to remote) or `in`.
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AnswerLabel {
    /// `hit`, `revalidated`, `fetched` or `passed` (see the package cache).
    pub answer: String,
}

/// What a sandbox's proxy tunnels carried and how many the host refused, so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct NetCounts {
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub refused: u64,
    /// Connections a remote ended before the guest answered its first bytes (a guest too slow
    /// for the server: a TLS handshake not finished in the server's time).
    pub cut_short: u64,
}

pub struct Metrics {
    registry: Registry,
    /// The same metrics, each with its node's name as the label `node` (a cluster node's).
    labelled: std::sync::OnceLock<Registry>,
    pub sandboxes: Gauge,
    pub create_seconds: Histogram,
    pub exec_seconds: Histogram,
    /// Sandboxes put to sleep when idle, and how long each sleep's save took.
    pub sleep_seconds: Histogram,
    /// Sleeping sandboxes woken by a use, and how long each wake took (to agent-ready).
    pub wake_seconds: Histogram,
    pub bytes_uploaded: Counter,
    pub bytes_downloaded: Counter,
    pub cpu_seconds: Family<SandboxLabel, Gauge<f64, AtomicU64>>,
    pub memory_mib_seconds: Family<SandboxLabel, Counter<f64, AtomicU64>>,
    pub network_bytes: Family<NetLabel, Gauge>,
    pub network_refused: Family<SandboxLabel, Gauge>,
    pub network_cut_short: Family<SandboxLabel, Gauge>,
    /// The package cache's answers by kind, and the bytes it keeps.
    pub package_answers: Family<AnswerLabel, Gauge>,
    pub package_bytes: Gauge,
    /// Snapshots brought from other nodes, the chunks' bytes fetched, and those served.
    pub snapshots_pulled: Counter,
    pub chunk_bytes_fetched: Counter,
    pub chunk_bytes_served: Counter,
    /// Each sandbox's VM at its last sample: what a live view shows as "now".
    usage: std::sync::Mutex<std::collections::HashMap<String, Usage>>,
}

/// A sandbox's VM at one sample: the share of a core it used since the sample before, and
/// its resident memory.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Usage {
    pub cpu_percent: f64,
    pub rss_mib: f64,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Metrics {
            registry: Registry::default(),
            labelled: std::sync::OnceLock::new(),
            sandboxes: Gauge::default(),
            create_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            exec_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            sleep_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            wake_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            bytes_uploaded: Counter::default(),
            bytes_downloaded: Counter::default(),
            cpu_seconds: Family::default(),
            memory_mib_seconds: Family::default(),
            network_bytes: Family::default(),
            network_refused: Family::default(),
            network_cut_short: Family::default(),
            package_answers: Family::default(),
            package_bytes: Gauge::default(),
            snapshots_pulled: Counter::default(),
            chunk_bytes_fetched: Counter::default(),
            chunk_bytes_served: Counter::default(),
            usage: Default::default(),
        };
        m.registry = m.registry_with(Registry::with_prefix("forkbox"));
        m
    }
}

impl Metrics {
    /// Every metric, registered in `registry` (handles share their values).
    fn registry_with(&self, mut registry: Registry) -> Registry {
        registry.register(
            "sandbox_network_bytes",
            "Bytes a sandbox's proxy tunnels carried (out: to remote hosts, in: back)",
            self.network_bytes.clone(),
        );
        registry.register(
            "sandbox_network_refused",
            "Connections of a sandbox the host refused by its network policy",
            self.network_refused.clone(),
        );
        registry.register(
            "sandbox_network_cut_short",
            "Connections of a sandbox a remote ended before the guest answered its first bytes \
             (a guest too slow for the server's handshake time)",
            self.network_cut_short.clone(),
        );
        registry.register(
            "package_cache_answers",
            "Registry requests of sandboxes the package cache answered, by how: from the cache \
             (hit), from the cache after asking the registry (revalidated), fetched and kept \
             (fetched), carried and kept nowhere (passed)",
            self.package_answers.clone(),
        );
        registry.register(
            "package_cache_bytes",
            "Bytes of registry responses the package cache keeps",
            self.package_bytes.clone(),
        );
        registry.register(
            "sandboxes_running",
            "Sandboxes the daemon runs",
            self.sandboxes.clone(),
        );
        registry.register(
            "create_seconds",
            "Time to create a sandbox (to agent-ready)",
            self.create_seconds.clone(),
        );
        registry.register(
            "exec_seconds",
            "Time of plain exec calls, start to exit",
            self.exec_seconds.clone(),
        );
        registry.register(
            "sleep_seconds",
            "Sandboxes hibernated for being idle (count) and the time each took",
            self.sleep_seconds.clone(),
        );
        registry.register(
            "wake_seconds",
            "Sleeping sandboxes woken by a use (count) and the time each took to answer",
            self.wake_seconds.clone(),
        );
        registry.register(
            "uploaded_bytes",
            "Compressed bytes uploaded into sandboxes",
            self.bytes_uploaded.clone(),
        );
        registry.register(
            "downloaded_bytes",
            "Compressed bytes downloaded from sandboxes",
            self.bytes_downloaded.clone(),
        );
        registry.register(
            "sandbox_cpu_seconds",
            "CPU time of a sandbox's VM process",
            self.cpu_seconds.clone(),
        );
        registry.register(
            "sandbox_memory_mib_seconds",
            "Resident memory of a sandbox's VM process integrated over time",
            self.memory_mib_seconds.clone(),
        );
        registry.register(
            "snapshots_pulled",
            "Snapshots this node brought from other nodes by chunks",
            self.snapshots_pulled.clone(),
        );
        registry.register(
            "chunk_fetched_bytes",
            "Bytes of snapshot chunks this node fetched from other nodes",
            self.chunk_bytes_fetched.clone(),
        );
        registry.register(
            "chunk_served_bytes",
            "Bytes of snapshot chunks this node sent to other nodes",
            self.chunk_bytes_served.clone(),
        );
        registry
    }

    /// From now on every metric carries `node="NAME"` (a cluster node's metrics, scraped from
    /// many nodes, tell their node apart). Once.
    pub fn label_node(&self, node: &str) {
        let labels = [(
            std::borrow::Cow::Borrowed("node"),
            std::borrow::Cow::Owned(node.to_string()),
        )];
        let r = Registry::with_prefix_and_labels("forkbox", labels.into_iter());
        let _ = self.labelled.set(self.registry_with(r));
    }

    /// Sets the package cache's figures: its answers by kind, and the bytes it keeps.
    pub fn package_cache(&self, answers: &[(&str, u64)], bytes: u64) {
        for (answer, n) in answers {
            self.package_answers
                .get_or_create(&AnswerLabel {
                    answer: (*answer).to_string(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.package_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.labelled.get().unwrap_or(&self.registry);
        let _ = prometheus_client::encoding::text::encode(&mut out, registry);
        out
    }

    /// Samples one VM process: sets its CPU-seconds, adds `interval_s` of its resident memory,
    /// and sets what its network tunnels carried.
    pub fn sample(&self, sandbox: &str, pid: u32, interval_s: f64, net: NetCounts) {
        let label = SandboxLabel {
            sandbox: sandbox.to_string(),
        };
        for (direction, bytes) in [("out", net.bytes_out), ("in", net.bytes_in)] {
            let l = NetLabel {
                sandbox: sandbox.to_string(),
                direction: direction.into(),
            };
            self.network_bytes
                .get_or_create(&l)
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        self.network_refused
            .get_or_create(&label)
            .set(i64::try_from(net.refused).unwrap_or(i64::MAX));
        self.network_cut_short
            .get_or_create(&label)
            .set(i64::try_from(net.cut_short).unwrap_or(i64::MAX));
        let mut now = Usage::default();
        if let Some(cpu) = process_cpu_seconds(pid) {
            let gauge = self.cpu_seconds.get_or_create(&label);
            let before = gauge.get();
            gauge.set(cpu);
            if before > 0.0 && interval_s > 0.0 {
                now.cpu_percent =
                    ((cpu - before).max(0.0) / interval_s * 100.0).min(100.0 * 1024.0);
            }
        }
        if let Some(rss) = process_rss_mib(pid) {
            self.memory_mib_seconds
                .get_or_create(&label)
                .inc_by(rss * interval_s);
            now.rss_mib = rss;
        }
        if let Ok(mut u) = self.usage.lock() {
            u.insert(sandbox.to_string(), now);
        }
    }

    /// Every sampled sandbox's VM at its last sample.
    pub fn usage(&self) -> std::collections::HashMap<String, Usage> {
        self.usage.lock().map(|u| u.clone()).unwrap_or_default()
    }

    pub fn forget(&self, sandbox: &str) {
        if let Ok(mut u) = self.usage.lock() {
            u.remove(sandbox);
        }
        let label = SandboxLabel {
            sandbox: sandbox.to_string(),
        };
        self.cpu_seconds.remove(&label);
        self.memory_mib_seconds.remove(&label);
        self.network_refused.remove(&label);
        self.network_cut_short.remove(&label);
        for direction in ["out", "in"] {
            self.network_bytes.remove(&NetLabel {
                sandbox: sandbox.to_string(),
                direction: direction.into(),
            });
        }
    }
}

fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

/// User plus system CPU time of a process, in seconds.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks())
}

/// Resident memory of a process, in MiB.
pub fn process_rss_mib(pid: u32) -> Option<f64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as f64;
    Some(pages * page / (1024.0 * 1024.0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_sampled_and_encoded() {
        let m = Metrics::default();
        m.sample(
            "sb-self",
            std::process::id(),
            1.0,
            NetCounts {
                bytes_out: 7,
                bytes_in: 9,
                refused: 1,
                cut_short: 0,
            },
        );
        m.bytes_uploaded.inc_by(42);
        let text = m.encode();
        assert!(text.contains("forkbox_uploaded_bytes_total 42"), "{text}");
        assert!(
            text.contains("forkbox_sandbox_network_bytes{sandbox=\"sb-self\",direction=\"in\"} 9"),
            "{text}"
        );
        assert!(
            text.contains("forkbox_sandbox_network_refused{sandbox=\"sb-self\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("forkbox_sandbox_cpu_seconds{sandbox=\"sb-self\"}"),
            "{text}"
        );
        assert!(
            text.contains("forkbox_sandbox_memory_mib_seconds_total{sandbox=\"sb-self\"}"),
            "{text}"
        );
        m.forget("sb-self");
        assert!(!m.encode().contains("sb-self"));
    }

    #[test]
    fn a_cluster_node_labels_every_metric_with_its_name() {
        let m = Metrics::default();
        m.bytes_uploaded.inc_by(5);
        m.label_node("node-a");
        m.bytes_uploaded.inc_by(2);
        m.sample("sb-x", std::process::id(), 1.0, NetCounts::default());
        let text = m.encode();
        assert!(
            text.contains("forkbox_uploaded_bytes_total{node=\"node-a\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("forkbox_sandbox_cpu_seconds{node=\"node-a\",sandbox=\"sb-x\"}")
                || text.contains("forkbox_sandbox_cpu_seconds{sandbox=\"sb-x\",node=\"node-a\"}"),
            "{text}"
        );
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty());
        for line in samples {
            assert!(line.contains("node=\"node-a\""), "{line}");
        }
    }
}
