//! A session's folder: `summary.md` (the identity's summary, refreshed before each turn),
//! `attachments/` (media the person sent), `exports/` (what the agent produces for them) and
//! `context/` (files an operator gives the agent). It lives under `workspace.root`, on storage
//! the agent hosts mount, and its path goes to the runner with every turn.
//!
//! The agent works in that folder, so what is in it is untrusted: every read and write here
//! goes through [`crate::workspace_fs`] (no links followed, regular files only, reads capped,
//! writes through an exclusive temporary file).
use std::io;
use std::path::{Path, PathBuf};

use crate::workspace_fs::{WorkspaceDir, WorkspaceFileError};

/// The folders every workspace has.
pub const FOLDERS: [&str; 3] = ["attachments", "exports", "context"];

/// The person's curated memory, as the agent reads and edits it.
pub const MEMORY_FILE: &str = "memory.md";

/// The most of memory.md read back after a turn. The memory store keeps `[memory] max_chars`
/// characters anyway; a larger file is refused whole (not cut), so an agent's runaway file
/// never becomes half a memory.
pub const MEMORY_FILE_MAX_BYTES: u64 = 1 << 20;

/// The folder of the agent's daily notes: `memory/YYYY-MM-DD.md`, one file a day.
pub const DAILY_NOTES_DIR: &str = "memory";

/// The most of one day's notes read; a larger file is refused whole (the prompt carries
/// `[memory] daily_notes_max_chars` of them anyway).
pub const DAILY_NOTE_MAX_BYTES: u64 = 256 << 10;

/// The file of `day`'s notes, in [`DAILY_NOTES_DIR`].
fn daily_note_file(day: chrono::NaiveDate) -> String {
    format!("{}.md", day.format("%Y-%m-%d"))
}

/// Where the notes of `day` are, in the workspace.
pub fn daily_note_path(day: chrono::NaiveDate) -> String {
    format!("{DAILY_NOTES_DIR}/{}", daily_note_file(day))
}

/// The agent's notes of those of `days` that have a file, in the order asked. A day whose
/// file is refused (a link, a FIFO, a hard link, too large, not UTF-8) is left out and its
/// reason returned beside; so is a `memory` folder that is not a plain folder.
pub async fn read_daily_notes(
    path: &Path,
    days: Vec<chrono::NaiveDate>,
) -> (Vec<(chrono::NaiveDate, String)>, Vec<WorkspaceFileError>) {
    let path = path.to_path_buf();
    let read = blocking(move || {
        let dir = match WorkspaceDir::open(&path)?.dir(DAILY_NOTES_DIR, false) {
            Ok(dir) => dir,
            Err(WorkspaceFileError::Io { source, .. })
                if source.kind() == io::ErrorKind::NotFound =>
            {
                return Ok((Vec::new(), Vec::new()));
            }
            Err(e) => return Err(e),
        };
        let (mut notes, mut refused) = (Vec::new(), Vec::new());
        for day in days {
            match dir.read_text(&daily_note_file(day), DAILY_NOTE_MAX_BYTES) {
                Ok(Some(text)) => notes.push((day, text)),
                Ok(None) => {}
                Err(e) => refused.push(e),
            }
        }
        Ok((notes, refused))
    })
    .await;
    read.unwrap_or_else(|e| (Vec::new(), vec![e]))
}

/// Run a blocking workspace operation on the blocking pool.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WorkspaceFileError> + Send + 'static,
) -> Result<T, WorkspaceFileError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(WorkspaceFileError::Io {
            path: PathBuf::new(),
            source: io::Error::other(e),
        })
    })
}

/// Make the folder and its parts (idempotent: an existing workspace is left as it is). A
/// workspace folder or part that is a link is refused.
pub async fn prepare(path: &Path) -> io::Result<()> {
    let path = path.to_path_buf();
    blocking(move || {
        let dir = WorkspaceDir::create(&path)?;
        for folder in FOLDERS {
            dir.dir(folder, true)?;
        }
        dir.create_empty("summary.md")
    })
    .await
    .map_err(io::Error::from)
}

/// Write the summary into the workspace when it differs from what is there.
pub async fn refresh_summary(path: &Path, summary: &str) -> Result<(), WorkspaceFileError> {
    refresh(path, "summary.md", summary).await
}

/// Write the curated memory into the workspace when it differs from what is there.
pub async fn refresh_memory(path: &Path, memory: &str) -> Result<(), WorkspaceFileError> {
    refresh(path, MEMORY_FILE, memory).await
}

/// What the agent left in memory.md (`None`: no such file). A link, a FIFO, a device, a
/// hard-linked or a too large file is refused ([`WorkspaceFileError::is_refusal`]).
pub async fn read_memory(path: &Path) -> Result<Option<String>, WorkspaceFileError> {
    let path = path.to_path_buf();
    blocking(move || WorkspaceDir::open(&path)?.read_text(MEMORY_FILE, MEMORY_FILE_MAX_BYTES)).await
}

async fn refresh(path: &Path, name: &'static str, content: &str) -> Result<(), WorkspaceFileError> {
    let (path, content) = (path.to_path_buf(), content.to_string());
    blocking(move || {
        let dir = WorkspaceDir::open(&path)?;
        // What is there is compared only if it reads as a plain file; anything else is
        // replaced (written aside and renamed, so an engine reading it never sees half).
        let cap = content.len() as u64;
        if dir.read(name, cap).ok().flatten().as_deref() == Some(content.as_bytes()) {
            return Ok(());
        }
        dir.write(name, content.as_bytes())
    })
    .await
}
