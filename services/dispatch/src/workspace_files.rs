//! The session's workspace files around a runner call: summary.md and memory.md written
//! before it (the prompt carries both anyway), memory.md read back after it and kept if the
//! agent changed it. The agent works in that folder, so what it holds is untrusted: a
//! memory.md that is a link, a FIFO, a device, a hard link or over the cap is refused (logged,
//! counted in `sb_workspace_refused_total`) and the turn goes on as if the agent had not
//! touched it; the next turn's refresh replaces it with the stored memory.
//!
//! A session shared by everyone (scope `main`) gets no memory.md: the file would hand one
//! person's memory to the next, and what the agent leaves there is nobody's to keep.
use std::path::{Path, PathBuf};

use switchboard_memory::curated::AgentWrite;
use uuid::Uuid;

use crate::TurnDispatcher;
use crate::lease::SessionAtCall;

impl TurnDispatcher {
    /// Write summary.md and memory.md into the session's workspace; the folder whose
    /// memory.md the agent may edit (`None`: the session has no workspace).
    pub(crate) async fn write_workspace_files(
        &self,
        session: Uuid,
        found: &SessionAtCall,
    ) -> Option<PathBuf> {
        let folder = PathBuf::from(found.workspace.as_ref()?);
        if found.shared {
            return None;
        }
        if let Some((summary, _)) = &found.summary
            && let Err(e) = switchboard_kit::workspace::refresh_summary(&folder, summary).await
        {
            // The prompt carries the summary anyway.
            tracing::warn!(%session, error = %e, "could not write summary.md in the workspace");
        }
        // The person's curated memory, as the agent reads and edits it this turn.
        let body = found.memory.as_ref().map(|m| m.body.as_str()).unwrap_or("");
        if let Err(e) = switchboard_kit::workspace::refresh_memory(&folder, body).await {
            // The prompt carries the memory anyway; an edit of the agent's is not read back
            // from a file we could not write.
            tracing::warn!(%session, error = %e, "could not write memory.md in the workspace");
        }
        Some(folder)
    }

    /// Store what the agent left in memory.md, if it changed it. A failure here does not fail
    /// the turn (the answer is given): it is logged and counted, and the file keeps the edit
    /// until the session's next turn. Returns what became of the edit (`None`: not read or
    /// not stored).
    pub(crate) async fn keep_agent_memory(
        &self,
        session: Uuid,
        call: Uuid,
        person_id: &str,
        identity: &str,
        found: &SessionAtCall,
        folder: &Path,
    ) -> Option<AgentWrite> {
        if found.shared {
            return None;
        }
        let body = match switchboard_kit::workspace::read_memory(folder).await {
            Ok(Some(body)) => body,
            Ok(None) => return Some(AgentWrite::Unchanged),
            Err(e) if e.is_refusal() => {
                // The agent's doing (a link to a file elsewhere, a FIFO, a huge file): not
                // read, not kept. The stored memory stands.
                tracing::warn!(%session, error = %e, "memory.md refused; the agent's edit is not kept");
                metrics::counter!("sb_workspace_refused_total", "file" => "memory.md", "reason" => e.reason())
                    .increment(1);
                return None;
            }
            Err(e) => {
                tracing::warn!(%session, error = %e, "could not read memory.md back");
                metrics::counter!("sb_memory_store_failures_total").increment(1);
                return None;
            }
        };
        let written = self
            .memories
            .agent_wrote(
                session,
                call,
                person_id,
                identity,
                found.memory.as_ref(),
                &body,
            )
            .await;
        match written {
            Ok(AgentWrite::Conflict) => tracing::warn!(
                %session,
                "memory.md was edited by the agent while someone else wrote the memory; the \
                 newer memory is kept"
            ),
            Ok(_) => {}
            Err(ref e) => {
                tracing::warn!(%session, error = %e, "could not store the agent's memory.md");
                metrics::counter!("sb_memory_store_failures_total").increment(1);
            }
        }
        written.ok()
    }
}
