//! A sandbox's metrics as E2B serves them (`GET /sandboxes/{id}/metrics?start=&end=`): a
//! bounded series per sandbox, served by range.
//!
//! A sample is read in the guest (`guest::METRICS_SCRIPT`) when metrics are asked for and the
//! newest kept one is older than [`BUCKET`] (E2B collects every 5 s); each is kept with its
//! time, at most [`KEPT`] per sandbox (the oldest go first), across a pause, and forgotten when
//! the sandbox is killed here or its newest sample is older than [`KEPT`] buckets (a sandbox
//! that ended otherwise).
//! A range is inclusive at both ends, in Unix seconds; without one, every kept sample.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// The age under which the newest sample answers instead of a new one.
pub const BUCKET: Duration = Duration::from_secs(5);
/// Samples kept per sandbox.
pub const KEPT: usize = 720;

/// One reading: its time and the numbers the guest printed.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: SystemTime,
    pub cpu_count: u64,
    pub cpu_used_pct: u64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

impl Sample {
    /// A sample from the guest script's output (numbers in its order; a missing one is 0).
    pub fn parse(at: SystemTime, out: &str) -> Sample {
        let n: Vec<u64> = out
            .split_whitespace()
            .map(|w| w.parse().unwrap_or(0))
            .collect();
        let v = |i: usize| n.get(i).copied().unwrap_or(0);
        Sample {
            at,
            cpu_count: v(0),
            cpu_used_pct: v(1),
            mem_used: v(2),
            mem_total: v(3),
            mem_cache: v(4),
            disk_used: v(5),
            disk_total: v(6),
        }
    }

    fn unix(&self) -> u64 {
        self.at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// E2B's JSON of it.
    pub fn json(&self) -> Value {
        json!({
            "timestamp": humantime::format_rfc3339_seconds(self.at).to_string(),
            "timestampUnix": self.unix(),
            "cpuCount": self.cpu_count,
            "cpuUsedPct": self.cpu_used_pct as f64,
            "memUsed": self.mem_used,
            "memTotal": self.mem_total,
            "memCache": self.mem_cache,
            "diskUsed": self.disk_used,
            "diskTotal": self.disk_total,
        })
    }
}

/// Every sandbox's kept samples.
#[derive(Default)]
pub struct Series {
    kept: Mutex<HashMap<String, VecDeque<Sample>>>,
}

impl Series {
    /// Whether sandbox `id`'s newest sample is older than [`BUCKET`] at `now` (or it has none).
    pub fn wants_sample(&self, id: &str, now: SystemTime) -> bool {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.get(id)
            .and_then(|s| s.back())
            .is_none_or(|s| now.duration_since(s.at).unwrap_or_default() >= BUCKET)
    }

    /// Keeps `s` for sandbox `id`, the oldest going past [`KEPT`].
    pub fn keep(&self, id: &str, s: Sample) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let old = BUCKET * KEPT as u32;
        kept.retain(|_, series| {
            series
                .back()
                .is_some_and(|b| s.at.duration_since(b.at).unwrap_or_default() < old)
        });
        let series = kept.entry(id.to_string()).or_default();
        series.push_back(s);
        while series.len() > KEPT {
            series.pop_front();
        }
    }

    /// Sandbox `id`'s samples from `start` to `end` (Unix seconds, inclusive; either may be
    /// left out), oldest first.
    pub fn range(&self, id: &str, start: Option<u64>, end: Option<u64>) -> Vec<Sample> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.get(id)
            .into_iter()
            .flatten()
            .filter(|s| start.is_none_or(|t| s.unix() >= t) && end.is_none_or(|t| s.unix() <= t))
            .cloned()
            .collect()
    }

    /// Drops sandbox `id`'s samples.
    pub fn forget(&self, id: &str) {
        self.kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn samples_are_kept_bounded_and_served_by_range() {
        let s = Series::default();
        assert!(s.wants_sample("sb-a", at(100)));
        s.keep("sb-a", Sample::parse(at(100), "1 16 100 1000 5 10 20"));
        assert!(!s.wants_sample("sb-a", at(104)));
        assert!(s.wants_sample("sb-a", at(105)));
        assert!(s.wants_sample("sb-b", at(104)));
        s.keep("sb-a", Sample::parse(at(110), "1 3"));
        assert_eq!(s.range("sb-a", Some(100), Some(110)).len(), 2);
        assert_eq!(s.range("sb-a", Some(101), None).len(), 1);
        assert!(s.range("sb-a", Some(10), Some(99)).is_empty());
        assert_eq!(s.range("sb-a", None, None)[1].mem_used, 0);
        assert_eq!(s.range("sb-a", None, None)[0].json()["cpuUsedPct"], 16.0);
        for i in 0..KEPT as u64 + 5 {
            s.keep("sb-a", Sample::parse(at(200 + i), "1"));
        }
        let all = s.range("sb-a", None, None);
        assert_eq!(all.len(), KEPT);
        assert_eq!(all[0].unix(), 205);
        s.forget("sb-a");
        assert!(s.range("sb-a", None, None).is_empty());
        // A series not added to for KEPT buckets goes when another is kept.
        s.keep("sb-b", Sample::parse(at(1000), "1"));
        s.keep("sb-c", Sample::parse(at(1000 + 3600), "1"));
        assert!(s.range("sb-b", None, None).is_empty());
    }
}
