//! Runner dispatch: turns of one session reach the agent's runner in `seq` order, one at a time,
//! across any number of dispatcher replicas, each resuming the engine session the previous turn
//! recorded.
//!
//! How order holds without trusting delivery order: a turn runs only when the session's cursor
//! (`sessions.last_seq`) is exactly `seq - 1`; a later turn waits (re-checking) or goes back to
//! the stream. The cursor advances by compare-and-set in the same transaction that stores the
//! reply, so a dispatcher that lost the race (or woke up late) cannot commit a second answer; it
//! re-emits the stored one instead, under the same dedupe id.
pub mod prompt;
pub mod runner;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{PgPool, Row};
use switchboard_kit::config::{AgentConfig, DispatchConfig};
use switchboard_kit::proto::{Reply, Turn};
use switchboard_kit::{Delivery, Output, Stage, StageError, StageName, Topology};
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::runner::{RunRequest, RunnerClient, RunnerError};

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("turn is malformed: {0}")]
    Malformed(&'static str),
    #[error("no agent named {0:?} is configured")]
    UnknownAgent(String),
    #[error("session {0} does not exist")]
    UnknownSession(Uuid),
    #[error("turn {seq} of session {session} failed earlier and later turns have run: {error}")]
    FailedEarlier {
        session: Uuid,
        seq: i64,
        error: String,
    },
    #[error("turn {seq} waits for turn {next}")]
    NotYet { seq: i64, next: i64 },
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error("session store: {0}")]
    Database(#[from] sqlx::Error),
}

impl DispatchError {
    fn is_transient(&self) -> bool {
        match self {
            DispatchError::Runner(e) => e.is_transient(),
            DispatchError::Database(_) => true,
            _ => false,
        }
    }
}

/// A turn's stored outcome.
struct StoredReply {
    reply_id: Uuid,
    text: String,
    engine_session_id: String,
    processing_ms: i64,
    tool_calls_count: i64,
}

pub struct TurnDispatcher {
    db: PgPool,
    agents: HashMap<String, (AgentConfig, Arc<Semaphore>)>,
    runner: RunnerClient,
    topology: Topology,
    config: DispatchConfig,
}

impl TurnDispatcher {
    pub fn new(
        db: PgPool,
        agents: &[AgentConfig],
        topology: Topology,
        config: DispatchConfig,
    ) -> Self {
        let agents = agents
            .iter()
            .map(|a| {
                let sem = Arc::new(Semaphore::new(a.concurrency.max(1)));
                (a.name.clone(), (a.clone(), sem))
            })
            .collect();
        Self {
            db,
            agents,
            runner: RunnerClient::new(),
            topology,
            config,
        }
    }

    async fn cursor(&self, session: Uuid) -> Result<(i64, Option<String>), DispatchError> {
        let row = sqlx::query(
            "SELECT last_seq, engine_session_id FROM switchboard.sessions WHERE id = $1",
        )
        .bind(session)
        .fetch_optional(&self.db)
        .await?
        .ok_or(DispatchError::UnknownSession(session))?;
        Ok((row.get(0), row.get(1)))
    }

    async fn stored_reply(&self, session: Uuid, seq: i64) -> Result<StoredReply, DispatchError> {
        let row = sqlx::query(
            "SELECT status, error, reply_id, reply_text, engine_session_id, processing_ms, tool_calls_count
               FROM switchboard.turns WHERE session_id = $1 AND seq = $2",
        )
        .bind(session)
        .bind(seq)
        .fetch_one(&self.db)
        .await?;
        let status: String = row.get(0);
        if status != "done" {
            return Err(DispatchError::FailedEarlier {
                session,
                seq,
                error: row.get::<Option<String>, _>(1).unwrap_or_default(),
            });
        }
        Ok(StoredReply {
            reply_id: row.get(2),
            text: row.get(3),
            engine_session_id: row.get(4),
            processing_ms: row.get::<Option<i64>, _>(5).unwrap_or(0),
            tool_calls_count: row.get::<Option<i64>, _>(6).unwrap_or(0),
        })
    }

    /// Move the cursor from `after` to `seq` and store the reply, only if the cursor is still at
    /// `after`. Returns false if another dispatcher got there first.
    async fn commit(
        &self,
        session: Uuid,
        seq: i64,
        after: i64,
        reply: &StoredReply,
    ) -> Result<bool, DispatchError> {
        let mut tx = self.db.begin().await?;
        let moved = sqlx::query(
            "UPDATE switchboard.sessions
                SET last_seq = $2, engine_session_id = $3, status = 'idle', updated_at = now()
              WHERE id = $1 AND last_seq = $4",
        )
        .bind(session)
        .bind(seq)
        .bind(&reply.engine_session_id)
        .bind(after)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if moved == 0 {
            return Ok(false);
        }
        sqlx::query(
            "UPDATE switchboard.turns
                SET status = 'done', error = NULL, reply_id = $3, reply_text = $4, engine_session_id = $5,
                    processing_ms = $6, tool_calls_count = $7, completed_at = now()
              WHERE session_id = $1 AND seq = $2",
        )
        .bind(session)
        .bind(seq)
        .bind(reply.reply_id)
        .bind(&reply.text)
        .bind(&reply.engine_session_id)
        .bind(reply.processing_ms)
        .bind(reply.tool_calls_count)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Give up on a turn so that the session's later turns are not blocked behind it forever.
    async fn mark_failed(&self, session: Uuid, seq: i64, error: &str) -> Result<(), DispatchError> {
        let mut tx = self.db.begin().await?;
        let moved = sqlx::query(
            "UPDATE switchboard.sessions SET last_seq = $2, status = 'idle', updated_at = now()
              WHERE id = $1 AND last_seq = $2 - 1",
        )
        .bind(session)
        .bind(seq)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if moved == 1 {
            sqlx::query(
                "UPDATE switchboard.turns SET status = 'failed', error = $3, completed_at = now()
                  WHERE session_id = $1 AND seq = $2",
            )
            .bind(session)
            .bind(seq)
            .bind(error)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    fn reply_output(&self, turn: &Turn, session: Uuid, stored: &StoredReply) -> Output {
        let msg = turn.message.clone().unwrap_or_default();
        let inbound = msg.inbound.unwrap_or_default();
        let reply = Reply {
            id: stored.reply_id.to_string(),
            session_id: session.to_string(),
            seq: turn.seq,
            agent_name: turn.agent_name.clone(),
            agent_identity: turn.agent_identity.clone(),
            text: stored.text.clone(),
            engine_session_id: stored.engine_session_id.clone(),
            processing_ms: stored.processing_ms,
            tool_calls_count: stored.tool_calls_count,
            correlation_id: inbound.correlation_id.clone(),
            in_reply_to: inbound.id.clone(),
            channel: inbound.channel.clone(),
            provider: inbound.provider.clone(),
            recipient: inbound.sender.clone(),
            reply_from: inbound.recipient.clone(),
            person: msg.person,
        };
        Output::new(
            self.topology.reply(),
            format!("{session}:{}", turn.seq),
            &reply,
        )
        .correlated(inbound.correlation_id)
    }

    /// Run one turn. Returns the reply to publish.
    async fn dispatch_turn(
        &self,
        turn: &Turn,
        delivery: &Delivery,
    ) -> Result<Output, DispatchError> {
        let session: Uuid = turn
            .session_id
            .parse()
            .map_err(|_| DispatchError::Malformed("session_id"))?;
        let (agent, slots) = self
            .agents
            .get(&turn.agent_name)
            .ok_or_else(|| DispatchError::UnknownAgent(turn.agent_name.clone()))?;

        // Wait until this turn is next. `after` is the cursor value this turn commits against:
        // its predecessor, or itself when a failed latest turn is run again (a replay).
        let deadline = Instant::now() + Duration::from_millis(self.config.hold_timeout_ms);
        let (engine_session, after) = loop {
            let (last, engine_session) = self.cursor(session).await?;
            if turn.seq <= last {
                match self.stored_reply(session, turn.seq).await {
                    // Already done (by us before a crash, or by another replica): same answer.
                    Ok(stored) => return Ok(self.reply_output(turn, session, &stored)),
                    // It failed for good, and nothing ran after it: run it again in place.
                    Err(DispatchError::FailedEarlier { .. }) if turn.seq == last => {
                        break (engine_session, last);
                    }
                    Err(e) => return Err(e),
                }
            }
            if turn.seq == last + 1 {
                break (engine_session, last);
            }
            if Instant::now() >= deadline {
                return Err(DispatchError::NotYet {
                    seq: turn.seq,
                    next: last + 1,
                });
            }
            tokio::time::sleep(Duration::from_millis(self.config.hold_poll_ms)).await;
        };

        let _slot = slots.acquire().await.expect("semaphore never closed");
        sqlx::query(
            "UPDATE switchboard.sessions SET status = 'running' WHERE id = $1 AND last_seq = $2",
        )
        .bind(session)
        .bind(after)
        .execute(&self.db)
        .await?;

        let prompt = prompt::build_prompt(turn);
        let correlation = turn
            .message
            .as_ref()
            .and_then(|m| m.inbound.as_ref())
            .map(|i| i.correlation_id.as_str())
            .unwrap_or(&delivery.correlation_id);
        let request = RunRequest {
            agent: &agent.name,
            prompt: &prompt,
            session_id: engine_session.as_deref(),
            correlation_id: correlation,
        };
        let key = format!("turn:{session}:{}", turn.seq);
        let started = Instant::now();
        let resp = self.runner.run(agent, &request, &key).await?;
        let processing_ms = if resp.processing_ms > 0 {
            resp.processing_ms
        } else {
            started.elapsed().as_millis() as i64
        };
        let stored = StoredReply {
            reply_id: Uuid::now_v7(),
            text: resp.text,
            engine_session_id: resp.session_id,
            processing_ms,
            tool_calls_count: resp.tool_calls_count,
        };
        if self.commit(session, turn.seq, after, &stored).await? {
            Ok(self.reply_output(turn, session, &stored))
        } else {
            // Another dispatcher committed this turn while we ran it: its answer stands.
            tracing::warn!(%session, seq = turn.seq, "turn committed elsewhere; re-emitting that reply");
            let stored = self.stored_reply(session, turn.seq).await?;
            Ok(self.reply_output(turn, session, &stored))
        }
    }
}

impl Stage for TurnDispatcher {
    type Input = Turn;
    const NAME: StageName = StageName::Dispatch;

    async fn handle(&self, turn: Turn, delivery: &Delivery) -> Result<Vec<Output>, StageError> {
        match self.dispatch_turn(&turn, delivery).await {
            Ok(out) => Ok(vec![out]),
            Err(e @ DispatchError::NotYet { .. }) => Err(StageError::Defer(
                Duration::from_millis(self.config.hold_poll_ms),
                e.to_string(),
            )),
            Err(e) => {
                let last_attempt = delivery.delivered >= self.config.max_deliver;
                if e.is_transient() && !last_attempt {
                    return Err(StageError::transient(e));
                }
                // Out of attempts, or retrying cannot help: record the failure so the session's
                // next turns can go ahead, then let the runtime dead-letter this one.
                if let Ok(session) = turn.session_id.parse::<Uuid>()
                    && !matches!(e, DispatchError::FailedEarlier { .. })
                    && let Err(db) = self.mark_failed(session, turn.seq, &e.to_string()).await
                {
                    return Err(StageError::transient(db));
                }
                Err(StageError::permanent(e))
            }
        }
    }
}

/// The dispatch stage as a task of `app`.
pub fn task(app: &switchboard_kit::startup::App) -> switchboard_kit::startup::Task {
    let c = &app.config;
    let stage = TurnDispatcher::new(
        app.db.clone(),
        &c.agents,
        app.topology.clone(),
        c.dispatch.clone(),
    );
    let mut opts = app.stage_options();
    // Waiting for a predecessor counts as a delivery, so dispatch allows more of them.
    opts.max_deliver = c.dispatch.max_deliver;
    if c.dispatch.concurrency > 0 {
        opts.concurrency = c.dispatch.concurrency;
    }
    app.stage_task(stage, opts)
}
