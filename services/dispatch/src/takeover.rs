//! Turns of a session an operator has taken over ([`switchboard_kit::takeovers`]): held, not
//! given to the agent. A held turn is done with no reply (`turns.held_by`), so it holds no later
//! reply back and a redelivery of it publishes nothing; its message stays in the log and the
//! console. The hand-back counts the turns a takeover held; the two never cross (see the kit).
use sqlx::PgPool;
use switchboard_kit::status::{ResetReason, SessionEventKind, SessionStatus, TurnStatus};
use uuid::Uuid;

use crate::DispatchError;
use crate::lease::CallLease;

/// Hold turn `seq` of the lease's session for `takeover`, moving the session past it (a
/// compare-and-set on the cursor and the call slot, as a commit). A reset the turn started is
/// left pending for the agent's next turn. False: the takeover ended meanwhile (the turn goes
/// to the agent), or the lease lapsed.
pub(crate) async fn hold(
    db: &PgPool,
    lease: &CallLease,
    seq: i64,
    takeover: Uuid,
    reset: Option<ResetReason>,
) -> Result<bool, DispatchError> {
    let held: bool = sqlx::query_scalar(
        r#"WITH open AS (
             SELECT id FROM switchboard.takeovers
              WHERE id = $1 AND ended_at IS NULL FOR SHARE),
           moved AS (
             UPDATE switchboard.sessions s
                SET last_seq = $3, updated_at = now(), status = $6,
                    pending_reset = CASE WHEN $7::text IS NOT NULL AND s.pending_reset IS NULL
                                         THEN $7 ELSE s.pending_reset END,
                    pending_reset_at = CASE WHEN $7::text IS NOT NULL AND s.pending_reset IS NULL
                                            THEN now() ELSE s.pending_reset_at END,
                    waiting_since = NULL, waiting_notice = NULL,
                    running_call = NULL, running_by = NULL, running_until = NULL
              WHERE s.id = $2 AND s.last_seq = $4 AND s.running_call = $5
                AND EXISTS (SELECT 1 FROM open)
             RETURNING s.id),
           turn AS (
             UPDATE switchboard.turns t
                SET status = $8, error = NULL, completed_at = now(), held_by = $1
              WHERE t.session_id = $2 AND t.seq = $3 AND EXISTS (SELECT 1 FROM moved)),
           journal AS (
             INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
             SELECT $9, id, 'held:' || id::text || ':' || $3::text, $10, $3,
                    jsonb_build_object('takeover_id', $1::uuid)
               FROM moved
             ON CONFLICT (key) DO NOTHING)
         SELECT EXISTS (SELECT 1 FROM moved)"#,
    )
    .bind(takeover)
    .bind(lease.session)
    .bind(seq)
    .bind(lease.after)
    .bind(lease.call)
    .bind(SessionStatus::Idle)
    .bind(reset)
    .bind(TurnStatus::Done)
    .bind(Uuid::now_v7())
    .bind(SessionEventKind::Held)
    .fetch_one(db)
    .await?;
    Ok(held)
}
