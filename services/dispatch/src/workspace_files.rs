//! The session's workspace files around a runner call: summary.md and memory.md written
//! before it (the prompt carries both anyway), memory.md read back after it and kept if the
//! agent changed it. The agent works in that folder, so what it holds is untrusted: a
//! memory.md that is a link, a FIFO, a device, a hard link or over the cap is refused (logged,
//! counted in `sb_workspace_refused_total`) and the turn goes on as if the agent had not
//! touched it; the next turn's refresh replaces it with the stored memory.
//!
//! A session shared by everyone (scope `main`) gets no memory.md: the file would hand one
//! person's memory to the next, and what the agent leaves there is nobody's to keep.
//!
//! The agent's daily notes (`memory/YYYY-MM-DD.md`, seeds 001 and 004) are its own: read
//! before the call, today's and yesterday's, for the prompt; never stored elsewhere, erased
//! with the workspace. A note file refused like memory.md is left out of the prompt.
use std::path::{Path, PathBuf};

use chrono::{DateTime, NaiveDate, Utc};
use switchboard_kit::config::MemoryConfig;
use switchboard_memory::curated::AgentWrite;
use uuid::Uuid;

use crate::TurnDispatcher;
use crate::lease::SessionAtCall;

/// What the daily notes in the prompt are: the calendar that names their days, and their cap.
pub(crate) struct DailyNotesSettings {
    tz: chrono_tz::Tz,
    pub max_chars: usize,
}

impl DailyNotesSettings {
    pub fn from_config(memory: &MemoryConfig) -> Self {
        Self {
            // Checked when the configuration is loaded; UTC only for one built by hand.
            tz: memory.daily_notes_tz().unwrap_or(chrono_tz::UTC),
            max_chars: memory.daily_notes_max_chars,
        }
    }

    /// The day it is at `now` on the notes' calendar.
    pub fn today(&self, now: DateTime<Utc>) -> NaiveDate {
        now.with_timezone(&self.tz).date_naive()
    }
}

impl TurnDispatcher {
    /// The agent's notes of today and yesterday (those that exist, today's first), from the
    /// folder whose memory.md it may edit.
    pub(crate) async fn read_daily_notes(
        &self,
        session: Uuid,
        folder: &Path,
        today: NaiveDate,
    ) -> Vec<(NaiveDate, String)> {
        let days = [Some(today), today.pred_opt()]
            .into_iter()
            .flatten()
            .collect();
        let (notes, refused) = switchboard_kit::workspace::read_daily_notes(folder, days).await;
        for e in refused {
            tracing::warn!(%session, error = %e, "a daily note refused; the prompt goes without it");
            if e.is_refusal() {
                metrics::counter!("sb_workspace_refused_total", "file" => "daily note", "reason" => e.reason())
                    .increment(1);
            }
        }
        notes
    }

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
