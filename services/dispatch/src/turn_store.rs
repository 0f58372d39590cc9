//! What the dispatcher keeps of a session's turns: the cursor (`sessions.last_seq`, the last
//! turn done or failed for good), each turn's stored reply, and the compare-and-set commits
//! that move the cursor, each with its journal entries in the same transaction.
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use switchboard_kit::status::{ResetReason, SessionEventKind, SessionStatus, TurnStatus};
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::DispatchError;
use crate::journal::Journal;
use crate::lease::CallLease;
use crate::settler::{Commit, Settler};
use crate::wakers::Wakers;

/// A turn's stored outcome.
#[derive(Clone)]
pub(crate) struct StoredReply {
    pub reply_id: Uuid,
    pub text: String,
    pub engine_session_id: String,
    pub processing_ms: i64,
    pub tool_calls_count: i64,
    /// The tools the engine called, by name.
    pub tool_names: Vec<String>,
    /// The fresh engine session the turn started (the reply tells the person).
    pub reset: Option<ResetReason>,
    /// The inbound messages a joined call answered, in order (empty: this turn's alone).
    pub answers: Vec<String>,
    /// The files of `exports/` kept for the person with this reply.
    pub exports: Vec<crate::exports::KeptExport>,
}

impl StoredReply {
    /// A reply of Switchboard's own (a notice, an answer without the agent), not yet stored.
    pub fn new(reply_id: Uuid, text: String, reset: Option<ResetReason>) -> Self {
        Self {
            reply_id,
            text,
            engine_session_id: String::new(),
            processing_ms: 0,
            tool_calls_count: 0,
            tool_names: Vec::new(),
            reset,
            answers: Vec::new(),
            exports: Vec::new(),
        }
    }
}

/// A turn's row as [`TurnStore::stored_reply`] reads it.
struct TurnRow {
    status: TurnStatus,
    error: Option<String>,
    reply_id: Option<Uuid>,
    reply_text: Option<String>,
    engine_session_id: Option<String>,
    processing_ms: Option<i64>,
    tool_calls_count: Option<i64>,
    tool_names: Option<Vec<String>>,
    reset: Option<ResetReason>,
    joined_into: Option<i64>,
    /// The inbound ids of the turns joined into this one, in order.
    joined: Option<Vec<String>>,
    exports: Option<sqlx::types::Json<Vec<crate::exports::KeptExport>>>,
}

/// The engine session a session goes on with after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextEngineSession {
    /// As it was: the turn was answered without the agent.
    Keep,
    /// The one the runner answered with.
    Answered,
    /// None: the turn only reset the session (`/new` alone); the next turn starts one.
    Cleared,
}

impl NextEngineSession {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NextEngineSession::Keep => "keep",
            NextEngineSession::Answered => "answered",
            NextEngineSession::Cleared => "cleared",
        }
    }
}

/// A turn's answer, ready to commit.
#[derive(Clone)]
pub(crate) struct Settlement {
    pub reply: StoredReply,
    pub next: NextEngineSession,
    /// The pending reset this turn applied: when it was asked for.
    pub consumed: Option<Option<DateTime<Utc>>>,
    /// The first turn the call answered (earlier than the committed one when it joined
    /// several: those are done, joined into it).
    pub first: i64,
    /// What the call's prompt recalled (the journal's `recall` entry).
    pub recall: Option<serde_json::Value>,
    /// The prompt retold the takeovers ended by then: the commit marks them briefed.
    pub briefed_through: Option<DateTime<Utc>>,
}

pub(crate) struct TurnStore {
    db: PgPool,
    /// Checks a turn may repeat at will (is it next? can it take the call slot?) run at most
    /// the pool's size less two at once, so under overload the answers agents already gave
    /// always find a connection: a waiting turn is delayed, an answer is never lost to a busy
    /// pool (which would fail the turn and run the agent again).
    checks: Arc<Semaphore>,
    wakers: Wakers,
    /// The group commit of runner answers.
    settler: Settler,
}

impl TurnStore {
    pub fn new(db: PgPool, checks: Arc<Semaphore>, wakers: Wakers) -> Self {
        let settler = Settler::new(db.clone(), wakers.clone());
        Self {
            db,
            checks,
            wakers,
            settler,
        }
    }

    /// The session's cursor: the last turn done (or failed for good).
    /// [`Self::cursor`], and the outage the session waits out (its `waiting_notice` while it
    /// says `waiting`), in the same read: a turn queued behind it learns both at once.
    pub async fn cursor_and_outage(
        &self,
        session: Uuid,
    ) -> Result<(i64, Option<Uuid>), DispatchError> {
        let _admitted = self.checks.acquire().await.expect("never closed");
        let row = sqlx::query!(
            "SELECT last_seq,
                    CASE WHEN status = $2 THEN waiting_notice END AS outage
               FROM switchboard.sessions WHERE id = $1",
            session,
            SessionStatus::Waiting as SessionStatus,
        )
        .fetch_optional(&self.db)
        .await?
        .ok_or(DispatchError::UnknownSession(session))?;
        Ok((row.last_seq, row.outage))
    }

    pub async fn cursor(&self, session: Uuid) -> Result<i64, DispatchError> {
        let _admitted = self.checks.acquire().await.expect("never closed");
        sqlx::query_scalar!(
            "SELECT last_seq FROM switchboard.sessions WHERE id = $1",
            session
        )
        .fetch_optional(&self.db)
        .await?
        .ok_or(DispatchError::UnknownSession(session))
    }

    /// The reply turn `seq` stored. Errors: it failed ([`DispatchError::FailedEarlier`], also
    /// while it is still open), or was answered by a later turn's call
    /// ([`DispatchError::JoinedInto`]).
    pub async fn stored_reply(
        &self,
        session: Uuid,
        seq: i64,
    ) -> Result<StoredReply, DispatchError> {
        let _admitted = self.checks.acquire().await.expect("never closed");
        let row = sqlx::query_as!(
            TurnRow,
            r#"SELECT status AS "status: TurnStatus", error, reply_id, reply_text,
                      engine_session_id, processing_ms, tool_calls_count, tool_names,
                      reset AS "reset: ResetReason", joined_into,
                      (SELECT array_agg(j.inbound_id::text ORDER BY j.seq)
                         FROM switchboard.turns j
                        WHERE j.session_id = t.session_id AND j.joined_into = t.seq
                          AND j.status = $3 AND j.seq < t.seq) AS joined,
                      exports AS "exports: sqlx::types::Json<Vec<crate::exports::KeptExport>>"
                 FROM switchboard.turns t WHERE session_id = $1 AND seq = $2"#,
            session,
            seq,
            TurnStatus::Done as TurnStatus,
        )
        .fetch_one(&self.db)
        .await?;
        if row.status != TurnStatus::Done {
            return Err(DispatchError::FailedEarlier {
                session,
                seq,
                error: row.error.unwrap_or_default(),
            });
        }
        let Some(reply_id) = row.reply_id else {
            return Err(DispatchError::JoinedInto {
                seq,
                into: row.joined_into.unwrap_or(seq),
            });
        };
        let mut answers = row.joined.unwrap_or_default();
        if !answers.is_empty() {
            let own = sqlx::query_scalar!(
                r#"SELECT inbound_id::text AS "inbound_id!" FROM switchboard.turns
                    WHERE session_id = $1 AND seq = $2"#,
                session,
                seq,
            )
            .fetch_optional(&self.db)
            .await?;
            answers.extend(own);
        }
        Ok(StoredReply {
            answers,
            reply_id,
            text: row.reply_text.unwrap_or_default(),
            engine_session_id: row.engine_session_id.unwrap_or_default(),
            processing_ms: row.processing_ms.unwrap_or(0),
            tool_calls_count: row.tool_calls_count.unwrap_or(0),
            tool_names: row.tool_names.unwrap_or_default(),
            reset: row.reset,
            exports: row.exports.map(|e| e.0).unwrap_or_default(),
        })
    }

    /// Move the cursor from the lease's `after` to `seq` and store the reply, only if the
    /// cursor is still there and this call holds the session's slot. Returns false if another
    /// dispatcher got there first. The settlement's `next` says which engine session the
    /// session goes on with; a pending reset this turn applied (`consumed`: when it was asked
    /// for) is cleared unless a newer one came meanwhile. The journal records the reply (and
    /// the reset) in the same statement, which also clears the call slot; answers finished
    /// together are committed together ([`Settler`]).
    pub async fn commit(
        &self,
        lease: &CallLease,
        seq: i64,
        settlement: &Settlement,
    ) -> Result<bool, DispatchError> {
        self.settler
            .commit(Commit {
                session: lease.session,
                seq,
                after: lease.after,
                call: lease.call,
                settlement: settlement.clone(),
            })
            .await
    }

    /// Give up on a turn so that the session's later turns are not blocked behind it forever.
    /// False: a live dispatcher still holds the session's call lease (the turn may yet be
    /// answered), so nothing changed. A reset the turn would have started is left pending
    /// for the next turn: the person is still told, and the engine session still starts over.
    pub async fn mark_failed(
        &self,
        session: Uuid,
        seq: i64,
        reset: Option<ResetReason>,
        error: &str,
    ) -> Result<bool, DispatchError> {
        let mut tx = self.db.begin().await?;
        let moved = sqlx::query!(
            "UPDATE switchboard.sessions s SET last_seq = $2::bigint, status = $4, updated_at = now(),
                    running_call = NULL, running_by = NULL, running_until = NULL,
                    pending_reset = COALESCE($3, s.pending_reset),
                    pending_reset_at = CASE WHEN $3 IS NULL THEN s.pending_reset_at ELSE now() END
              WHERE s.id = $1 AND s.last_seq = $2::bigint - 1
                AND (s.running_call IS NULL OR s.running_until < now()
                     OR NOT EXISTS (SELECT 1 FROM switchboard.dispatchers d
                                     WHERE d.id = s.running_by AND d.alive_until > now()))",
            session,
            seq,
            reset as Option<ResetReason>,
            SessionStatus::Idle as SessionStatus,
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if moved == 1 {
            sqlx::query!(
                "UPDATE switchboard.turns SET status = $4, error = $3, completed_at = now()
                  WHERE session_id = $1 AND seq = $2",
                session,
                seq,
                error,
                TurnStatus::Failed as TurnStatus,
            )
            .execute(&mut *tx)
            .await?;
            let entry = Journal::new(
                session,
                format!("failure:{session}:{seq}"),
                SessionEventKind::Failure,
                seq,
                serde_json::json!({ "error": error }),
            );
            Journal::write(&mut tx, &[entry]).await?;
            tx.commit().await?;
            self.wakers.wake(session);
            return Ok(true);
        }
        tx.rollback().await?;
        // Not moved: either the cursor is already past this turn (done, or failed before), or
        // a live call lease holds it.
        Ok(self.cursor(session).await? >= seq)
    }

    /// Record that turn `seq` expired; the id of the notice that tells the person (kept in
    /// the journal entry, so a repeated give-up tells the same message).
    pub async fn record_expired(
        &self,
        session: Uuid,
        seq: i64,
        reason: &str,
    ) -> Result<Uuid, DispatchError> {
        let notice = sqlx::query_scalar!(
            r#"INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
               VALUES ($1, $2, $3, $7, $4,
                       jsonb_build_object('notice_id', $5::text, 'reason', $6::text))
               ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key
               RETURNING detail->>'notice_id' AS "notice!""#,
            Uuid::now_v7(),
            session,
            format!("expired:{session}:{seq}"),
            seq,
            Uuid::now_v7().to_string(),
            reason,
            SessionEventKind::Expired as SessionEventKind,
        )
        .fetch_one(&self.db)
        .await?;
        Ok(notice.parse().unwrap_or_else(|_| Uuid::now_v7()))
    }
}
