//! A session's folder: `summary.md` (the identity's summary, refreshed before each turn),
//! `attachments/` (media the person sent), `exports/` (what the agent produces for them) and
//! `context/` (files an operator gives the agent). It lives under `workspace.root`, on storage
//! the agent hosts mount, and its path goes to the runner with every turn.
use std::io;
use std::path::Path;

/// The folders every workspace has.
pub const FOLDERS: [&str; 3] = ["attachments", "exports", "context"];

/// Make the folder and its parts (idempotent: an existing workspace is left as it is).
pub async fn prepare(path: &Path) -> io::Result<()> {
    for folder in FOLDERS {
        tokio::fs::create_dir_all(path.join(folder)).await?;
    }
    let summary = path.join("summary.md");
    match tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&summary)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Write the summary into the workspace when it differs from what is there.
pub async fn refresh_summary(path: &Path, summary: &str) -> io::Result<()> {
    refresh(path, "summary.md", summary).await
}

/// The person's curated memory, as the agent reads and edits it.
pub const MEMORY_FILE: &str = "memory.md";

/// Write the curated memory into the workspace when it differs from what is there.
pub async fn refresh_memory(path: &Path, memory: &str) -> io::Result<()> {
    refresh(path, MEMORY_FILE, memory).await
}

/// What the agent left in memory.md (`None`: no such file).
pub async fn read_memory(path: &Path) -> io::Result<Option<String>> {
    match tokio::fs::read_to_string(path.join(MEMORY_FILE)).await {
        Ok(body) => Ok(Some(body)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

async fn refresh(path: &Path, name: &str, content: &str) -> io::Result<()> {
    let file = path.join(name);
    if tokio::fs::read_to_string(&file).await.ok().as_deref() == Some(content) {
        return Ok(());
    }
    // Written aside and renamed, so an engine reading it never sees half of it.
    let tmp = path.join(format!(".{name}.tmp"));
    tokio::fs::write(&tmp, content).await?;
    tokio::fs::rename(&tmp, &file).await
}
