//! A run's folder, `state_dir/runs/<sha256(key)>/`: everything a runner (this one, or the next
//! one after a crash) needs to know about an engine run it may not have started.
//!
//! - `spec.json`: what to run and how to read its answer (written before the supervisor starts);
//! - `lock`: held (flock) by the supervisor for its whole life, handed to it by the runner that
//!   took it, so "the lock is free" proves nothing of the run is left to finish it;
//! - `started.json`: the supervisor's pid, its start time from `/proc/<pid>/stat` (a reused pid
//!   is never signalled) and when the engine started (the timeout counts from it); written
//!   before the engine starts, so without it the engine never ran;
//! - `prompt`, `stdout`, `stderr`: the engine's input and output (each output capped);
//! - `exit.json`: how the engine ended, written aside, synced and renamed by the supervisor;
//! - `cancelled` / `timed_out`: what a runner decided before it killed the run's group.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What the supervisor runs, and how the runner reads the answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    pub key: String,
    pub agent: String,
    /// The engine session id the run was started with (the answer's fallback).
    pub session_id: String,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// The prompt file is the engine's stdin.
    pub stdin_prompt: bool,
    pub timeout_s: u64,
    pub max_output_bytes: usize,
    pub text_path: String,
    pub session_id_path: String,
    pub tool_calls_path: String,
    /// Absent from the specs of runs kept by an older runner.
    #[serde(default)]
    pub tool_names_path: String,
    /// When the runner took the call (processing_ms counts from it).
    pub created_at_ms: u64,
    /// An earlier run of this key died unfinished (its answer says so).
    #[serde(default)]
    pub rerun: bool,
    /// The turn's credentials for the engine (`SWITCHBOARD_TURN_TOKEN`, `SWITCHBOARD_API_URL`):
    /// handed to the supervisor's environment, which the engine inherits; never written to
    /// `spec.json` (nor to the command line, where `ps` would show them).
    #[serde(skip)]
    pub turn_env: BTreeMap<String, String>,
}

/// The supervisor, recorded before it starts the engine.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Started {
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot).
    pub start_ticks: u64,
    pub started_at_ms: u64,
}

/// How the engine ended, as its supervisor saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Exit {
    /// `exit status: 3`, `signal: 9 (SIGKILL)`, …
    pub status: String,
    pub success: bool,
    /// Killed by its supervisor at the timeout.
    pub timed_out: bool,
    pub stdout_cut: bool,
    /// It could not be started at all.
    pub spawn_error: Option<String>,
    pub finished_at_ms: u64,
}

/// A runner's decision about a run, recorded before it kills the run's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Cancelled,
    TimedOut,
}

impl Mark {
    fn file(self) -> &'static str {
        match self {
            Mark::Cancelled => "cancelled",
            Mark::TimedOut => "timed_out",
        }
    }
}

/// How a run that nothing is running any more ended.
#[derive(Debug, Clone)]
pub enum Settled {
    Exited(Exit),
    Cancelled,
    TimedOut,
    /// The engine started and died without an exit status (its runner and supervisor died).
    DiedUnfinished,
    /// The engine never started.
    NeverStarted,
}

#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// State (`R`, `S`, `Z`, …), process group and start time of a process, from `/proc`.
pub fn proc_stat(pid: i32) -> Option<(char, i32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let pgrp = fields.get(2)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, pgrp, start))
}

/// A new (or emptied) file only the runner's user can read: run folders hold prompts, the
/// engine's output and outcomes, which other users of the agent host must not see.
pub fn private_file(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// `path` (and any parent it needs) as a folder only the runner's user can enter.
pub fn private_dir(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    // One made by an earlier version (or by hand) is closed too.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
}

/// Write `bytes` to `path` all or nothing: aside, synced, renamed, the folder synced.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("part");
    let mut f = private_file(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl RunDir {
    pub fn for_key(state_dir: &Path, key: &str) -> Self {
        Self::at(
            state_dir
                .join("runs")
                .join(hex::encode(Sha256::digest(key.as_bytes()))),
        )
    }

    pub fn at(path: PathBuf) -> Self {
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn exists(&self) -> bool {
        self.path.is_dir()
    }

    fn read<T: DeserializeOwned>(&self, name: &str) -> Option<T> {
        serde_json::from_slice(&std::fs::read(self.file(name)).ok()?).ok()
    }

    fn write<T: Serialize>(&self, name: &str, value: &T) -> std::io::Result<()> {
        write_atomic(
            &self.file(name),
            &serde_json::to_vec(value).expect("serialisable"),
        )
    }

    pub fn spec(&self) -> Option<Spec> {
        self.read("spec.json")
    }

    pub fn write_spec(&self, spec: &Spec) -> std::io::Result<()> {
        self.write("spec.json", spec)
    }

    pub fn started(&self) -> Option<Started> {
        self.read("started.json")
    }

    pub fn write_started(&self, started: &Started) -> std::io::Result<()> {
        self.write("started.json", started)
    }

    pub fn exit(&self) -> Option<Exit> {
        self.read("exit.json")
    }

    pub fn write_exit(&self, exit: &Exit) -> std::io::Result<()> {
        self.write("exit.json", exit)
    }

    pub fn mark(&self, mark: Mark) -> std::io::Result<()> {
        write_atomic(&self.file(mark.file()), b"")
    }

    pub fn marked(&self, mark: Mark) -> bool {
        self.file(mark.file()).exists()
    }

    /// The run's lock when nobody holds it (nothing of the run is alive); `None` while the
    /// supervisor (or a runner about to start one) holds it.
    pub fn try_lock(&self) -> std::io::Result<Option<File>> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.file("lock"))?;
        // SAFETY: flock(2) on a descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(f));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(None)
        } else {
            Err(e)
        }
    }

    /// Whether something still holds the run (its supervisor is alive).
    pub fn is_alive(&self) -> bool {
        matches!(self.try_lock(), Ok(None))
    }

    /// How a run nobody holds ended (call with its lock held or proven free).
    pub fn settled(&self) -> Settled {
        if self.marked(Mark::Cancelled) {
            Settled::Cancelled
        } else if let Some(exit) = self.exit() {
            Settled::Exited(exit)
        } else if self.marked(Mark::TimedOut) {
            Settled::TimedOut
        } else if self.started().is_some() {
            Settled::DiedUnfinished
        } else {
            Settled::NeverStarted
        }
    }

    /// SIGKILL the run's process group (the supervisor leads it; the engine and all it started
    /// are in it). Not when its pid now names another process (a different start time): the
    /// group of a dead leader keeps the number in use while any member lives, so a reused pid
    /// means nothing of ours is left.
    pub fn kill(&self) {
        let Some(s) = self.started() else { return };
        let ours = match proc_stat(s.pid) {
            Some((_, _, start)) => start == s.start_ticks,
            None => true,
        };
        if ours {
            crate::engine::kill_group(s.pid);
        }
    }

    /// Clear what an earlier, dead attempt left (keeping the lock file the caller holds).
    pub fn clear(&self) -> std::io::Result<()> {
        for name in [
            "started.json",
            "exit.json",
            "stdout",
            "stderr",
            "prompt",
            "cancelled",
            "timed_out",
        ] {
            match std::fs::remove_file(self.file(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    pub fn remove(&self) -> std::io::Result<()> {
        std::fs::remove_dir_all(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_processs_own_stat_is_read_and_a_missing_one_is_none() {
        let me = std::process::id() as i32;
        let (state, pgrp, start) = proc_stat(me).unwrap();
        assert_ne!(state, 'Z');
        // SAFETY: getpgrp(2) only reads.
        assert_eq!(pgrp, unsafe { libc::getpgrp() });
        assert!(start > 0);
        assert!(proc_stat(i32::MAX).is_none());
    }

    #[test]
    fn a_lock_is_held_until_its_holder_closes_it() {
        let dir = std::env::temp_dir().join(format!("sb-rundir-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = RunDir::at(dir.clone());
        let held = run.try_lock().unwrap().expect("free at first");
        assert!(run.is_alive());
        drop(held);
        assert!(!run.is_alive());
        assert!(matches!(run.settled(), Settled::NeverStarted));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
