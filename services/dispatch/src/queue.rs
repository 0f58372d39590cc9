//! Queue modes: messages that arrive while a session's call runs join its next call
//! (`collect`), or also cancel the running call so the next one answers them all at once
//! (`interrupt`). The group a call answers is recorded before the call, so a retry makes the
//! same call under the same Idempotency-Key.
use switchboard_kit::config::AgentConfig;
use switchboard_kit::proto::Turn;
use switchboard_kit::status::{ResetReason, SessionStatus, TurnStatus};
use uuid::Uuid;

use crate::lease::CallLease;
use crate::{DispatchError, TurnDispatcher};

/// The turns one call answers: the head, then the messages that joined it.
pub(crate) struct Group {
    pub turns: Vec<Turn>,
    /// How many of the head's calls were cancelled (interrupt): the next call's key differs.
    pub interrupts: i32,
}

impl Group {
    pub fn alone(turn: &Turn) -> Self {
        Self {
            turns: vec![turn.clone()],
            interrupts: 0,
        }
    }

    /// The turn the call's reply is committed at.
    pub fn last(&self) -> &Turn {
        self.turns.last().expect("a group holds its head")
    }

    /// The runner call's Idempotency-Key: one per group and cancellation, so a retry of the
    /// same plan gets the runner's cached answer and a call after a cancellation does not.
    pub fn call_key(&self, session: Uuid) -> String {
        let head = self.turns[0].seq;
        let mut key = if self.turns.len() > 1 {
            format!("turn:{session}:{head}-{}", self.last().seq)
        } else {
            format!("turn:{session}:{head}")
        };
        // A call cancelled at the runner keeps its answer (`cancelled`) under its key.
        if self.interrupts > 0 {
            key.push_str(&format!("~{}", self.interrupts));
        }
        key
    }
}

/// A turn that may join a call, as [`TurnDispatcher::joinable`] reads it.
struct Joining {
    seq: i64,
    payload: Option<Vec<u8>>,
    reset: Option<ResetReason>,
}

impl TurnDispatcher {
    /// The session's messages waiting right after `head` that one call may answer with it:
    /// the group planned by an earlier attempt at `head` (so a retry makes the same call,
    /// under the same Idempotency-Key), else the open turns that follow it without a gap, up
    /// to `dispatch.collect_max`, stopping at one that must stand alone (answered without the
    /// agent, or starting a fresh engine session). The plan is recorded before the call, a
    /// plan to go alone too (`joined_into` = `head.seq`).
    pub(crate) async fn joinable(
        &self,
        session: Uuid,
        head: &Turn,
    ) -> Result<Group, DispatchError> {
        let (planned, interrupts) = sqlx::query!(
            "SELECT joined_into, interrupts FROM switchboard.turns
              WHERE session_id = $1 AND seq = $2",
            session,
            head.seq,
        )
        .fetch_optional(&self.db)
        .await?
        .map_or((None, 0), |t| (t.joined_into, t.interrupts));
        let rows = match planned {
            // Planned alone.
            Some(last) if last <= head.seq => Vec::new(),
            Some(last) => {
                sqlx::query_as!(
                    Joining,
                    r#"SELECT seq, payload, reset AS "reset: ResetReason" FROM switchboard.turns
                        WHERE session_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq"#,
                    session,
                    head.seq,
                    last,
                )
                .fetch_all(&self.db)
                .await?
            }
            _ => {
                sqlx::query_as!(
                    Joining,
                    r#"SELECT seq, payload, reset AS "reset: ResetReason" FROM switchboard.turns
                        WHERE session_id = $1 AND seq > $2 AND status = $4
                        ORDER BY seq LIMIT $3"#,
                    session,
                    head.seq,
                    self.config.collect_max.saturating_sub(1).max(1) as i64,
                    TurnStatus::Open as TurnStatus,
                )
                .fetch_all(&self.db)
                .await?
            }
        };
        let mut turns = vec![head.clone()];
        for (
            next,
            Joining {
                seq,
                payload,
                reset,
            },
        ) in (head.seq + 1..).zip(rows)
        {
            let message = payload.and_then(|p| {
                <switchboard_kit::proto::IdentifiedMessage as prost::Message>::decode(p.as_slice())
                    .ok()
            });
            let Some(message) = message else { break };
            let turn = Turn {
                session_id: head.session_id.clone(),
                seq,
                agent_name: head.agent_name.clone(),
                agent_identity: head.agent_identity.clone(),
                scope_key: head.scope_key.clone(),
                message: Some(message),
                reset: String::new(),
            };
            if seq != next || reset.is_some() || turn.given_answer().is_some() {
                break;
            }
            turns.push(turn);
        }
        // A call that goes alone records that too (`joined_into` = its own seq): a retry after
        // its dispatcher died must not join messages that arrived meanwhile (another key,
        // so the runner would run the agent twice on `head`).
        if planned.is_none() {
            let last = turns.last().map_or(head.seq, |t| t.seq);
            sqlx::query!(
                "UPDATE switchboard.turns SET joined_into = $3
                  WHERE session_id = $1 AND seq >= $2 AND seq <= $3 AND status = $4",
                session,
                head.seq,
                last,
                TurnStatus::Open as TurnStatus,
            )
            .execute(&self.db)
            .await?;
        }
        Ok(Group { turns, interrupts })
    }

    /// Queue mode interrupt: record what a message arriving now cancels (the running call's
    /// key, and the last turn it answers).
    pub(crate) async fn mark_cancellable(
        &self,
        lease: &CallLease,
        key: &str,
        last: i64,
    ) -> Result<(), DispatchError> {
        sqlx::query!(
            "UPDATE switchboard.sessions SET running_key = $3, running_last = $4
              WHERE id = $1 AND running_call = $2",
            lease.session,
            lease.call,
            key,
            last,
        )
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// The turn's call was cancelled at the runner: forget the group it planned (the next call
    /// joins what is waiting now), count the cancellation (the next call's key differs) and
    /// give the call slot back.
    pub(crate) async fn interrupted(
        &self,
        lease: &mut CallLease,
        head: i64,
    ) -> Result<(), DispatchError> {
        let session = lease.session;
        let mut tx = self.db.begin().await?;
        sqlx::query!(
            "UPDATE switchboard.turns
                SET joined_into = NULL,
                    interrupts = interrupts + CASE WHEN seq = $2 THEN 1 ELSE 0 END
              WHERE session_id = $1 AND seq >= $2 AND status = $3",
            session,
            head,
            TurnStatus::Open as TurnStatus,
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query!(
            "UPDATE switchboard.sessions
                SET running_call = NULL, running_by = NULL, running_until = NULL, status = $3,
                    running_key = NULL, running_last = NULL, running_interrupted = false
              WHERE id = $1 AND running_call = $2",
            session,
            lease.call,
            SessionStatus::Idle as SessionStatus,
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        lease.cleared();
        self.wakers.wake(session);
        metrics::counter!("sb_dispatch_calls_interrupted_total").increment(1);
        Ok(())
    }

    /// Queue mode interrupt: a message that could join the next call cancels the session's
    /// running call at the runner, once per call, unless that call already carries it.
    pub(crate) async fn interrupt_running_call(
        &self,
        session: Uuid,
        turn: &Turn,
        agent: &AgentConfig,
    ) {
        if turn.given_answer().is_some() || !turn.reset.is_empty() {
            return;
        }
        let key = sqlx::query_scalar!(
            r#"UPDATE switchboard.sessions SET running_interrupted = true
                WHERE id = $1 AND running_call IS NOT NULL AND running_key IS NOT NULL
                  AND NOT running_interrupted AND running_last < $2 AND running_until > now()
               RETURNING running_key AS "running_key!""#,
            session,
            turn.seq,
        )
        .fetch_optional(&self.db)
        .await;
        match key {
            Ok(Some(key)) => match self.runner.cancel(agent, &key).await {
                Ok(status) => {
                    tracing::debug!(%session, status, "asked the runner to cancel the running call")
                }
                Err(e) => tracing::warn!(%session, error = %e, "could not cancel the running call"),
            },
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(%session, error = %e, "could not look for a call to interrupt")
            }
        }
    }
}
