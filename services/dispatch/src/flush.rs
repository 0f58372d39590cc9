//! The flush before a reset: before a turn starts a fresh engine session (any
//! [`ResetReason`]), the pipeline itself runs one silent turn on the OLD engine session asking
//! the agent to write what it must keep into memory.md, instead of leaving it to the model's
//! goodwill. memory.md is written before the call and read back after it, like any turn (the
//! agent's edit is kept through the same compare-and-set). The answer is logged as an outbound
//! message marked `memory_flush`, never published as a reply, so nothing of it reaches the
//! person. Then the turn goes on with its fresh engine session.
//!
//! Once per engine session, under redelivery, crashes and failed turns: the flush is gated by
//! its journal entry (`memory_flush:<session>:<old engine session>`); its runner call is made
//! under one Idempotency-Key per turn, so a dispatcher that died between the call and the entry
//! gets the runner's cached answer. A flush
//! that fails (runner error, timeout) is recorded with the reason and does not stop the reset.
use std::path::Path;

use switchboard_kit::config::AgentConfig;
use switchboard_kit::proto::Turn;
use switchboard_kit::status::{ResetReason, SessionEventKind};
use switchboard_memory::curated::AgentWrite;
use uuid::Uuid;

use crate::lease::CallLease;
use crate::runner::RunRequest;
use crate::{DispatchError, TurnDispatcher, prompt};

/// `metadata.kind` of the logged answer of a flush (never delivered, never a reply).
pub const MEMORY_FLUSH_KIND: &str = "memory_flush";

/// The journal key of the flush of one engine session of a session: its presence means that
/// engine session was flushed (or its flush failed) for good. Keyed by the engine session, not
/// the turn: a reset whose turn failed moves to the next turn (pending), which must not ask
/// the same engine session again.
fn journal_key(session: Uuid, engine_session: &str) -> String {
    format!("memory_flush:{session}:{engine_session}")
}

/// What became of a flush, as the journal records it.
#[derive(Debug)]
enum Outcome {
    /// The agent answered; `memory_changed`: it changed memory.md (and the change was kept).
    Flushed {
        reply_id: Uuid,
        text: String,
        processing_ms: i64,
        memory_changed: bool,
    },
    /// The call failed; the reset goes on without it.
    Failed { error: String },
    /// Nothing to ask: the session has no workspace, so the agent has no memory.md to write.
    NoWorkspace,
}

/// The turn the flush comes before, and what it knows.
pub(crate) struct Before<'a> {
    pub turn: &'a Turn,
    pub agent: &'a AgentConfig,
    pub person_id: &'a str,
    pub reset: ResetReason,
    pub correlation_id: &'a str,
}

impl TurnDispatcher {
    /// Flush before the turn's reset, if the agent wants it, the old engine session exists and
    /// this turn has not flushed yet. The lease's memory is read again afterwards, so the
    /// turn's own prompt carries what the agent wrote; the lease is extended after the flush,
    /// which used part of its time.
    pub(crate) async fn flush_before_reset(
        &self,
        before: &Before<'_>,
        lease: &mut CallLease,
    ) -> Result<(), DispatchError> {
        let Some(old) = lease.found.engine_session.clone() else {
            return Ok(());
        };
        // A shared session holds no one's memory.md to flush into.
        if !before.agent.memory_flush || lease.found.shared {
            return Ok(());
        }
        let (session, seq) = (lease.session, before.turn.seq);
        let done = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM switchboard.session_events WHERE key = $1) AS "done!""#,
            journal_key(session, &old),
        )
        .fetch_one(&self.db)
        .await?;
        if done {
            return Ok(());
        }
        let outcome = match lease.found.workspace.clone() {
            None => Outcome::NoWorkspace,
            Some(folder) => {
                self.ask_to_flush(before, lease, &old, Path::new(&folder))
                    .await
            }
        };
        self.record_flush(before, session, &old, &outcome).await?;
        switchboard_kit::failpoint::crash_at("dispatch.flush_recorded");
        // The flush used part of the call's time: the turn's own call gets all of it again.
        let extended = sqlx::query!(
            "UPDATE switchboard.sessions
                SET running_until = now() + $3 * interval '1 millisecond'
              WHERE id = $1 AND running_call = $2",
            session,
            lease.call,
            lease.timeout.as_millis() as f64,
        )
        .execute(&self.db)
        .await?
        .rows_affected();
        if extended == 0 {
            // The lease lapsed during the flush and another call holds the session now.
            return Err(DispatchError::Superseded { seq });
        }
        Ok(())
    }

    /// The silent call on the old engine session, memory.md written before and read back
    /// after it.
    async fn ask_to_flush(
        &self,
        before: &Before<'_>,
        lease: &mut CallLease,
        old: &str,
        folder: &Path,
    ) -> Outcome {
        let session = lease.session;
        let body = lease
            .found
            .memory
            .as_ref()
            .map(|m| m.body.as_str())
            .unwrap_or("");
        if let Err(e) = switchboard_kit::workspace::refresh_memory(folder, body).await {
            tracing::warn!(%session, error = %e, "could not write memory.md for the flush");
            return Outcome::Failed {
                error: format!("could not write memory.md in the workspace: {e}"),
            };
        }
        let text = prompt::flush_prompt(before.reset, self.daily_notes.today(chrono::Utc::now()));
        let workspace = folder.to_string_lossy();
        let request = RunRequest {
            agent: &before.agent.name,
            prompt: &text,
            session_id: Some(old),
            correlation_id: before.correlation_id,
            workspace: Some(&workspace),
            queue_mode: before.agent.queue_mode.as_str(),
            // The flush keeps what matters through memory.md; it has no turn of the person's
            // to act in, so it gets no token for the API.
            turn_token: None,
            api_url: None,
        };
        let key = format!("flush:{session}:{}", before.turn.seq);
        let started = std::time::Instant::now();
        let resp = match self.runner.run(before.agent, &request, &key).await {
            Ok(resp) => resp,
            Err(e) => {
                metrics::counter!("sb_memory_flush_total", "outcome" => "failed").increment(1);
                tracing::warn!(%session, error = %e, "the flush before a reset failed; the reset goes on");
                return Outcome::Failed {
                    error: e.to_string(),
                };
            }
        };
        // Its own id for the memory's journal: the turn's call writes its own entry after.
        let written = self
            .keep_agent_memory(
                session,
                Uuid::now_v7(),
                before.person_id,
                &before.turn.agent_identity,
                &lease.found,
                folder,
            )
            .await;
        let memory_changed = matches!(written, Some(AgentWrite::Stored { .. }));
        if memory_changed {
            match self
                .memories
                .get(before.person_id, &before.turn.agent_identity)
                .await
            {
                Ok(now) => lease.found.memory = now,
                Err(e) => {
                    tracing::warn!(%session, error = %e, "could not read the flushed memory back")
                }
            }
        }
        metrics::counter!("sb_memory_flush_total", "outcome" => "flushed").increment(1);
        Outcome::Flushed {
            reply_id: Uuid::now_v7(),
            text: resp.text,
            processing_ms: if resp.processing_ms > 0 {
                resp.processing_ms
            } else {
                started.elapsed().as_millis() as i64
            },
            memory_changed,
        }
    }

    /// The journal entry (once per turn) and, for an answer, its outbound log row marked
    /// `memory_flush`, in one transaction. A person forgotten since the turn's message arrived
    /// gets neither.
    async fn record_flush(
        &self,
        before: &Before<'_>,
        session: Uuid,
        old: &str,
        outcome: &Outcome,
    ) -> Result<(), DispatchError> {
        let seq = before.turn.seq;
        let mut detail = serde_json::json!({
            "reset": before.reset.as_str(),
            "engine_session_id": old,
        });
        match outcome {
            Outcome::Flushed {
                reply_id,
                memory_changed,
                ..
            } => {
                detail["outcome"] = "flushed".into();
                detail["message_id"] = reply_id.to_string().into();
                detail["memory_changed"] = (*memory_changed).into();
            }
            Outcome::Failed { error } => {
                detail["outcome"] = "failed".into();
                detail["error"] = error.clone().into();
                detail["reset_goes_on"] = true.into();
            }
            Outcome::NoWorkspace => {
                detail["outcome"] = "skipped".into();
                detail["error"] = "the session has no workspace: no memory.md to write".into();
                detail["reset_goes_on"] = true.into();
            }
        }
        let inbound = before
            .turn
            .message
            .as_ref()
            .and_then(|m| m.inbound.as_ref());
        let received =
            switchboard_kit::forgotten::received_at(inbound.map_or(0, |i| i.received_at_ms));
        let mut tx = self.db.begin().await?;
        switchboard_kit::forgotten::lock_shared(&mut *tx, before.person_id).await?;
        if switchboard_kit::forgotten::received_before(&mut *tx, before.person_id, received).await?
        {
            tx.rollback().await?;
            switchboard_kit::forgotten::dropped("dispatch", "memory_flush");
            return Ok(());
        }
        let entered = sqlx::query_scalar!(
            "INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
             VALUES ($1, $2, $3, $6, $4, $5)
             ON CONFLICT (key) DO NOTHING
             RETURNING id",
            Uuid::now_v7(),
            session,
            journal_key(session, old),
            seq,
            detail,
            SessionEventKind::MemoryFlush as SessionEventKind,
        )
        .fetch_optional(&mut *tx)
        .await?;
        if let (
            Some(_),
            Outcome::Flushed {
                reply_id,
                text,
                processing_ms,
                ..
            },
        ) = (entered, outcome)
        {
            // Logged like a reply, but not as one: it is never published on the reply
            // subject, so no deliverer ever sees it.
            sqlx::query!(
                "INSERT INTO switchboard.messages
                    (id, session_id, person_id, agent_name, agent_identity, direction, channel,
                     message, processing_ms, tool_calls_count, correlation_id, metadata)
                 VALUES ($1, $2, $3, $4, $5, 'outbound', $6, $7, $8, 0, $9,
                         jsonb_build_object('kind', $10::text, 'reset', $11::text))
                 ON CONFLICT DO NOTHING",
                reply_id,
                session,
                before.person_id,
                before.turn.agent_name,
                before.turn.agent_identity,
                inbound.map_or("", |i| i.channel.as_str()),
                text,
                processing_ms,
                before.correlation_id,
                MEMORY_FLUSH_KIND,
                before.reset.as_str(),
            )
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
