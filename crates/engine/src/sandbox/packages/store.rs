//! The package cache's files: per response a body and what HTTP caching says of it (its
//! [`CachePolicy`], JSON), under `store/<2 hex>/<key>`; kept within a size by dropping what
//! was used longest ago. A body is written whole under a temporary name and then put in
//! place, and its policy after it: a process killed in between leaves a body without a
//! policy, which is a miss (and removed when the store is next opened), or a temporary file
//! (removed by the next process to open the store an hour later). Removing the whole
//! directory while a daemon runs is safe: what is gone is a miss.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use http_cache_semantics::CachePolicy;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;

/// A response's key: the request's URL and the headers a registry's answer varies by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key(String);

impl Key {
    /// The key of a GET of `parts.uri` with its `Accept` and `Accept-Encoding`.
    pub fn of(parts: &http::request::Parts) -> Key {
        let header = |name: http::HeaderName| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let text = format!(
            "GET {}\n{}\n{}",
            parts.uri,
            header(http::header::ACCEPT),
            header(http::header::ACCEPT_ENCODING)
        );
        Key(blake3::hash(text.as_bytes()).to_hex().to_string())
    }
}

/// What is kept beside a body.
#[derive(Serialize, Deserialize)]
struct Meta {
    url: String,
    size: u64,
    policy: CachePolicy,
}

/// A stored response.
pub struct Stored {
    pub policy: CachePolicy,
    pub body: tokio::fs::File,
    pub size: u64,
}

struct Index {
    /// Per key: its body's size and when it was last used.
    entries: HashMap<Key, (u64, SystemTime)>,
    total: u64,
}

/// The cache's files, within `max_bytes`.
pub struct Store {
    dir: PathBuf,
    max_bytes: u64,
    index: Mutex<Index>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store {
    /// The store in `dir` (made if missing): what is there is counted, and what a killed
    /// process left half-written removed.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Store> {
        std::fs::create_dir_all(dir.join("tmp"))?;
        // What a killed process left half-written (an hour old: another process using the
        // same home may be writing now).
        for e in std::fs::read_dir(dir.join("tmp"))?.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() > 3600);
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let mut entries = HashMap::new();
        let mut total = 0;
        for shard in std::fs::read_dir(dir)?.flatten() {
            if shard.file_name() == "tmp" || !shard.path().is_dir() {
                continue;
            }
            for e in std::fs::read_dir(shard.path())?.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "body") {
                    let meta = p.with_extension("meta");
                    let (Ok(body), Ok(m)) = (e.metadata(), std::fs::metadata(&meta)) else {
                        let _ = std::fs::remove_file(&p);
                        continue;
                    };
                    let Some(stem) = p.file_stem().and_then(|s| s.to_str()) else {
                        continue;
                    };
                    let used = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    entries.insert(Key(stem.to_string()), (body.len(), used));
                    total += body.len();
                }
            }
        }
        Ok(Store {
            dir: dir.to_path_buf(),
            max_bytes,
            index: Mutex::new(Index { entries, total }),
        })
    }

    /// The largest response kept: an eighth of the whole.
    pub fn largest(&self) -> u64 {
        self.max_bytes / 8
    }

    /// Bytes kept and responses kept.
    pub fn size(&self) -> (u64, usize) {
        let i = lock(&self.index);
        (i.total, i.entries.len())
    }

    fn path(&self, key: &Key, ext: &str) -> PathBuf {
        self.dir.join(&key.0[..2]).join(format!("{}.{ext}", key.0))
    }

    /// The response kept under `key`, if there is one whole.
    pub async fn get(&self, key: &Key) -> Option<Stored> {
        let text = tokio::fs::read(self.path(key, "meta")).await.ok()?;
        let meta: Meta = serde_json::from_slice(&text).ok()?;
        let body = tokio::fs::File::open(self.path(key, "body")).await.ok()?;
        let size = body.metadata().await.ok()?.len();
        if size != meta.size {
            return None;
        }
        self.used(key);
        Some(Stored {
            policy: meta.policy,
            body,
            size,
        })
    }

    /// Marks `key` used now (in memory, and on its file for the next process).
    fn used(&self, key: &Key) {
        let now = SystemTime::now();
        if let Some(e) = lock(&self.index).entries.get_mut(key) {
            e.1 = now;
        }
        if let Ok(f) = std::fs::File::options()
            .write(true)
            .open(self.path(key, "meta"))
        {
            let _ = f.set_modified(now);
        }
    }

    /// A file to write a new body into (removed unless [`Store::put`] keeps it).
    pub async fn begin(&self) -> std::io::Result<Writing> {
        let name = crate::random::hex(12)?;
        tokio::fs::create_dir_all(self.dir.join("tmp")).await?;
        let path = self.dir.join("tmp").join(name);
        let file = tokio::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await?;
        Ok(Writing {
            path,
            file,
            size: 0,
        })
    }

    /// Replaces the policy kept under `key` (a response revalidated).
    pub async fn update(&self, key: &Key, policy: &CachePolicy, size: u64, url: &str) {
        let meta = Meta {
            url: url.to_string(),
            size,
            policy: policy.clone(),
        };
        if let Err(e) = self.write_meta(key, &meta).await {
            tracing::info!("package cache: keep {url}: {e}");
        }
    }

    async fn write_meta(&self, key: &Key, meta: &Meta) -> std::io::Result<()> {
        let text = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
        let tmp = self.dir.join("tmp").join(crate::random::hex(12)?);
        tokio::fs::write(&tmp, text).await?;
        tokio::fs::rename(&tmp, self.path(key, "meta")).await
    }

    /// Keeps the body written in `w` under `key` with `policy`; then drops what was used
    /// longest ago until the store is within its size again.
    pub async fn put(
        &self,
        key: &Key,
        w: &mut Writing,
        policy: &CachePolicy,
        url: &str,
    ) -> std::io::Result<()> {
        w.file.flush().await?;
        tokio::fs::create_dir_all(self.dir.join(&key.0[..2])).await?;
        tokio::fs::rename(&w.path, self.path(key, "body")).await?;
        let meta = Meta {
            url: url.to_string(),
            size: w.size,
            policy: policy.clone(),
        };
        self.write_meta(key, &meta).await?;
        let evict = {
            let mut i = lock(&self.index);
            if let Some((old, _)) = i.entries.insert(key.clone(), (w.size, SystemTime::now())) {
                i.total -= old;
            }
            i.total += w.size;
            self.over(&mut i)
        };
        for k in evict {
            let _ = tokio::fs::remove_file(self.path(&k, "meta")).await;
            let _ = tokio::fs::remove_file(self.path(&k, "body")).await;
        }
        Ok(())
    }

    /// The keys to drop, oldest use first, for the store to be within nine tenths of its size
    /// (taken out of the index).
    fn over(&self, i: &mut Index) -> Vec<Key> {
        if i.total <= self.max_bytes {
            return Vec::new();
        }
        let mut all: Vec<(Key, u64, SystemTime)> = i
            .entries
            .iter()
            .map(|(k, (s, t))| (k.clone(), *s, *t))
            .collect();
        all.sort_by_key(|e| e.2);
        let mut out = Vec::new();
        for (k, size, _) in all {
            if i.total <= self.max_bytes / 10 * 9 {
                break;
            }
            i.entries.remove(&k);
            i.total -= size;
            out.push(k);
        }
        out
    }
}

/// A body being written.
pub struct Writing {
    path: PathBuf,
    pub file: tokio::fs::File,
    pub size: u64,
}

impl Writing {
    pub async fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.file.write_all(data).await?;
        self.size += data.len() as u64;
        Ok(())
    }

    /// The body written so far, to read from the start: kept in the store by [`Store::put`], or
    /// else removed from its directory when this is dropped (it lives while it is read).
    pub async fn into_read(mut self) -> std::io::Result<tokio::fs::File> {
        use tokio::io::AsyncSeekExt as _;
        self.file.flush().await?;
        let mut file = self.file.try_clone().await?;
        file.seek(std::io::SeekFrom::Start(0)).await?;
        Ok(file)
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        // Kept (renamed away) or read (removed already): either way nothing is left here.
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(url: &str) -> (http::request::Parts, CachePolicy) {
        let (parts, ()) = http::Request::get(url)
            .body(())
            .expect("request")
            .into_parts();
        let res = http::Response::builder()
            .header("cache-control", "max-age=300")
            .body(())
            .expect("response");
        let p = CachePolicy::new(&parts, &res);
        (parts, p)
    }

    #[tokio::test]
    async fn bodies_are_kept_read_back_and_the_oldest_dropped_past_the_size() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(dir.path(), 1000).expect("store");
        let mut keys = Vec::new();
        for n in 0..4 {
            let url = format!("https://registry.example/p{n}");
            let (parts, p) = policy(&url);
            let key = Key::of(&parts);
            let mut w = store.begin().await.expect("begin");
            w.write(&[n as u8; 300]).await.expect("write");
            store.put(&key, &mut w, &p, &url).await.expect("put");
            drop(w);
            keys.push(key);
            // The first is used again before the fourth comes: the second goes, not it.
            if n == 2 {
                assert!(store.get(&keys[0]).await.is_some());
            }
        }
        assert!(store.get(&keys[1]).await.is_none(), "the least used went");
        let kept = store.get(&keys[0]).await.expect("kept");
        assert_eq!(kept.size, 300);
        assert!(store.size().0 <= 900);
        // Nothing half-written stays, and a new process counts what is there.
        assert_eq!(
            std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0
        );
        let again = Store::open(dir.path(), 1000).expect("store");
        assert_eq!(again.size(), store.size());
        // A directory removed under a running store is a miss, not an error.
        forkbox_hostfs::remove_tree(dir.path()).expect("remove");
        assert!(store.get(&keys[0]).await.is_none());
    }
}
