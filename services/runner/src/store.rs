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
    /// `message` is what the caller is told; `detail` (the engine's stderr, its output's end,
    /// a path) stays on this host: in the runner's log and in this store, never in an answer,
    /// since the caller may pass the error on to the person or the API's client.
    Failed {
        code: String,
        message: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        detail: String,
    },
}

impl Outcome {
    pub fn failed(code: &str, message: impl Into<String>, detail: impl Into<String>) -> Self {
        Outcome::Failed {
            code: code.into(),
            message: message.into(),
            detail: detail.into(),
        }
    }
}

#[derive(Clone)]
pub struct ResultStore {
    dir: PathBuf,
}

impl ResultStore {
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        crate::rundir::private_dir(&dir.join("results"))?;
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
        let mut f = crate::rundir::private_file(&tmp)?;
        f.write_all(&serde_json::to_vec(outcome).expect("serialisable"))?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&self.dir)?.sync_all()
    }
}
