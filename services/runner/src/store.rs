//! Outcomes by Idempotency-Key on disk: one file per key (named by its SHA-256), written
//! aside, synced and renamed before the call is answered, so a turn retried after a crash of
//! the caller or of the runner gets the same answer and the engine does not run again.
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::RunResponse;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Answered(RunResponse),
    Cancelled,
    Failed { code: String, message: String },
}

#[derive(Clone)]
pub struct ResultStore {
    dir: PathBuf,
}

impl ResultStore {
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir.join("results"))?;
        Ok(Self {
            dir: dir.join("results"),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!(
            "{}.json",
            hex::encode(Sha256::digest(key.as_bytes()))
        ))
    }

    pub fn get(&self, key: &str) -> std::io::Result<Option<Outcome>> {
        match std::fs::read(self.path(key)) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Remove outcomes written longer than `age` ago; how many went.
    pub fn prune(&self, age: std::time::Duration) -> std::io::Result<usize> {
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|e| e > age);
            if old && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    pub fn put(&self, key: &str, outcome: &Outcome) -> std::io::Result<()> {
        let path = self.path(key);
        let tmp = path.with_extension("part");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(outcome).expect("serialisable"))?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&self.dir)?.sync_all()
    }
}
