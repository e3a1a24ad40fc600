//! The daemon's catalogue of the sandboxes it reported created, in SQLite (`state.db` in
//! forkbox's home; WAL, `synchronous=FULL`, so a row is on disk when the call returns). A
//! sandbox is written here before it is reported created and removed after it is gone; a
//! daemon that starts again adopts exactly these (see `Engine::adopt_all`).
//!
//! What is per VM process (owner, QEMU PID and start time) stays in the run record beside the
//! VM (`runstate`), which one-shot users share; hibernated sandboxes are snapshots carrying
//! their record (`snapshot`).

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use crate::runstate::DaemonRecord;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("the daemon's state database {path}: {source}")]
    Db {
        path: String,
        source: rusqlite::Error,
    },
    #[error("the daemon's state database {path} has schema version {version}, newer than this forkbox knows ({known}); use the forkbox that wrote it")]
    Newer {
        path: String,
        version: i64,
        known: usize,
    },
    #[error("a sandbox record could not be encoded: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Schema migrations, applied in order; `PRAGMA user_version` says how many ran.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY NOT NULL,
        created_unix INTEGER NOT NULL,
        expires_unix INTEGER,
        record TEXT NOT NULL
    ) STRICT;
    CREATE INDEX sandboxes_expiry ON sandboxes (expires_unix);",
    // 2: bearer tokens for the TCP listener (their SHA-256 only).
    "CREATE TABLE tokens (
        name TEXT NOT NULL,
        sha256 TEXT NOT NULL UNIQUE,
        created_unix INTEGER NOT NULL
    ) STRICT;",
];

pub struct StateDb {
    conn: Mutex<Connection>,
    path: String,
}

impl StateDb {
    pub fn open(path: &Path) -> Result<StateDb, StateError> {
        let shown = path.display().to_string();
        let db = |source| StateError::Db {
            path: shown.clone(),
            source,
        };
        let mut conn = Connection::open(path).map_err(db)?;
        // Token hashes and sandbox records are root's business only (SQLite gives its -wal and
        // -shm files the database's mode).
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(db)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(db)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(db)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(db)?;
        if version < 0 || version as usize > MIGRATIONS.len() {
            return Err(StateError::Newer {
                path: shown,
                version,
                known: MIGRATIONS.len(),
            });
        }
        let tx = conn.transaction().map_err(db)?;
        for m in &MIGRATIONS[version as usize..] {
            tx.execute_batch(m).map_err(db)?;
        }
        tx.pragma_update(None, "user_version", MIGRATIONS.len() as i64)
            .map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(StateDb {
            conn: Mutex::new(conn),
            path: shown,
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn err(&self, source: rusqlite::Error) -> StateError {
        StateError::Db {
            path: self.path.clone(),
            source,
        }
    }

    /// Records (or updates) a sandbox; durable when it returns.
    pub fn put(&self, id: &str, r: &DaemonRecord) -> Result<(), StateError> {
        let json = serde_json::to_string(r)?;
        self.conn()
            .execute(
                "INSERT INTO sandboxes (id, created_unix, expires_unix, record) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (id) DO UPDATE SET expires_unix = excluded.expires_unix, record = excluded.record",
                params![id, r.created_unix as i64, r.expires_unix.map(|e| e as i64), json],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn remove(&self, id: &str) -> Result<(), StateError> {
        self.conn()
            .execute("DELETE FROM sandboxes WHERE id = ?1", params![id])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<Option<DaemonRecord>, StateError> {
        let text: Option<String> = self
            .conn()
            .query_row(
                "SELECT record FROM sandboxes WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(text.map(|t| serde_json::from_str(&t)).transpose()?)
    }

    /// Stores a token's hash under a name.
    pub fn add_token(&self, name: &str, sha256: &str, created_unix: u64) -> Result<(), StateError> {
        self.conn()
            .execute(
                "INSERT INTO tokens (name, sha256, created_unix) VALUES (?1, ?2, ?3)
                 ON CONFLICT (sha256) DO NOTHING",
                params![name, sha256, created_unix as i64],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The hashes of every stored token.
    pub fn token_hashes(&self) -> Result<Vec<String>, StateError> {
        let conn = self.conn();
        let mut st = conn
            .prepare("SELECT sha256 FROM tokens")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    /// Every sandbox recorded, oldest first. A row that cannot be read is skipped with a
    /// warning (and left for a person to look at).
    pub fn all(&self) -> Result<Vec<(String, DaemonRecord)>, StateError> {
        let conn = self.conn();
        let mut st = conn
            .prepare("SELECT id, record FROM sandboxes ORDER BY created_unix, id")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, text) = row.map_err(|e| self.err(e))?;
            match serde_json::from_str(&text) {
                Ok(r) => out.push((id, r)),
                Err(e) => tracing::warn!("{id}: unreadable record in the state database: {e}"),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn record(expires: Option<u64>) -> DaemonRecord {
        DaemonRecord {
            info: serde_json::json!({"id": "sb-1"}),
            labels: [("k".to_string(), "v".to_string())].into(),
            expires_unix: expires,
            ttl_action: Default::default(),
            created_unix: 5,
            network: Default::default(),
            idle: None,
            wake_on_use: false,
            without_memory: None,
        }
    }

    #[test]
    fn records_survive_reopening_and_updates_replace_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let db = StateDb::open(&path).unwrap();
            db.put("sb-1", &record(None)).unwrap();
            db.put("sb-2", &record(Some(9))).unwrap();
            db.put("sb-1", &record(Some(7))).unwrap();
            db.remove("sb-2").unwrap();
        }
        let db = StateDb::open(&path).unwrap();
        let all = db.all().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].0, "sb-1");
        assert_eq!(all[0].1.expires_unix, Some(7));
        assert_eq!(db.get("sb-2").unwrap(), None);
        let mode: String = db
            .conn()
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = db
            .conn()
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 2, "FULL");
    }

    #[test]
    fn a_database_from_a_newer_forkbox_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let c = Connection::open(&path).unwrap();
            c.pragma_update(None, "user_version", 99).unwrap();
        }
        let e = StateDb::open(&path).err().unwrap().to_string();
        assert!(e.contains("version 99"), "{e}");
    }
}
