//! Runner dispatch: turns of one session reach the agent's runner in `seq` order, one at a time,
//! across any number of dispatcher replicas, each resuming the engine session the previous turn
//! recorded.
//!
//! How order holds without trusting delivery order: a turn runs only when the session's cursor
//! (`sessions.last_seq`) is exactly `seq - 1`; a later turn waits (re-checking) or goes back to
//! the stream. The cursor advances by compare-and-set in the same transaction that stores the
//! reply, so a dispatcher that lost the race (or woke up late) cannot commit a second answer; it
//! re-emits the stored one instead, under the same dedupe id.
//!
//! How calls never overlap: before calling the runner a dispatcher leases the session's call
//! slot (`sessions.running_call`). The lease holds while the dispatcher process is alive (it
//! heartbeats in `switchboard.dispatchers`) and the call's deadline has not passed, so a turn
//! redelivered to another replica while the first one still calls the runner (NATS restarted,
//! progress acks lost) waits for that call instead of running beside it; a crashed
//! dispatcher's lease ends with its heartbeat.
pub mod prompt;
pub mod runner;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{PgPool, Row};
use switchboard_kit::config::{AgentConfig, DispatchConfig};
use switchboard_kit::proto::{Reply, Turn};
use switchboard_kit::retry::{self, Backoff};
use switchboard_kit::startup::{App, Task};
use switchboard_kit::status::TurnStatus;
use switchboard_kit::{Attempt, Output, Stage, StageError, Topology};
use switchboard_kit::{Registration, Source, StageSpec};
use tokio::sync::{Notify, Semaphore};
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
    #[error("another call of turn {seq} holds the session; its answer will stand")]
    Superseded { seq: i64 },
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

/// A runner call's lease outlives the agent's timeout by this much, so only a call that is
/// certainly over (or whose dispatcher is dead) lets the next one start.
const CALL_DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// How long a runner's answer is kept trying to be stored (the commit is a compare-and-set
/// on the call's lease, so a late success is still exactly one answer).
const COMMIT_RETRY_FOR: Duration = Duration::from_secs(30);

/// Turns waiting in this process for their session's cursor to move or its call slot to be
/// freed, woken the moment this process does either.
#[derive(Default)]
struct Wakers(std::sync::Mutex<HashMap<Uuid, Arc<Notify>>>);

impl Wakers {
    fn wait_on(&self, session: Uuid) -> WaitingTurn<'_> {
        let notify = self.0.lock().unwrap().entry(session).or_default().clone();
        WaitingTurn {
            wakers: self,
            session,
            notify: Some(notify),
        }
    }

    fn wake(&self, session: Uuid) {
        if let Some(n) = self.0.lock().unwrap().get(&session) {
            n.notify_waiters();
        }
    }
}

/// One waiting turn's registration; the session's entry goes when its last waiter does.
struct WaitingTurn<'a> {
    wakers: &'a Wakers,
    session: Uuid,
    notify: Option<Arc<Notify>>,
}

impl WaitingTurn<'_> {
    fn notify(&self) -> &Notify {
        self.notify.as_deref().expect("held until dropped")
    }
}

impl Drop for WaitingTurn<'_> {
    fn drop(&mut self) {
        let mut map = self.wakers.0.lock().unwrap();
        drop(self.notify.take());
        if map
            .get(&self.session)
            .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            map.remove(&self.session);
        }
    }
}

pub struct TurnDispatcher {
    /// This process, as the holder of runner-call leases.
    id: Uuid,
    /// When this process last told `dispatchers` it is alive (ms since the Unix epoch).
    last_beat: std::sync::atomic::AtomicI64,
    /// A connection of its own for heartbeats, so a busy pool cannot make a live dispatcher
    /// look dead to the others.
    beat_db: PgPool,
    db: PgPool,
    /// Checks a turn may repeat at will (is it next? can it take the call slot?) run at most
    /// the pool's size less two at once, so under overload the answers agents already gave
    /// always find a connection: a waiting turn is delayed, an answer is never lost to a busy
    /// pool (which would fail the turn and run the agent again).
    checks: Semaphore,
    agents: HashMap<String, (AgentConfig, Arc<Semaphore>)>,
    runner: RunnerClient,
    topology: Topology,
    config: DispatchConfig,
    wakers: Wakers,
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
        // The heartbeat and the session watch each have a connection of their own: the turns
        // can use up the main pool under overload, and neither may wait behind them.
        let beat_db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with((*db.connect_options()).clone());
        let checks = Semaphore::new(
            (db.options().get_max_connections() as usize)
                .saturating_sub(2)
                .max(1),
        );
        Self {
            id: Uuid::new_v4(),
            last_beat: Default::default(),
            beat_db,
            checks,
            db,
            agents,
            runner: RunnerClient::new(),
            topology,
            config,
            wakers: Wakers::default(),
        }
    }

    fn liveness(&self) -> Duration {
        Duration::from_millis(self.config.liveness_ms.max(300))
    }

    /// Tell the other dispatchers this process is alive (its runner-call leases hold).
    pub async fn heartbeat(&self) -> Result<(), DispatchError> {
        if self.last_beat.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            // First beat of this process: forget dispatchers long dead.
            sqlx::query(
                "DELETE FROM switchboard.dispatchers WHERE alive_until < now() - interval '1 day'",
            )
            .execute(&self.beat_db)
            .await?;
        }
        sqlx::query(
            "INSERT INTO switchboard.dispatchers (id, alive_until)
             VALUES ($1, now() + $2 * interval '1 millisecond')
             ON CONFLICT (id) DO UPDATE SET alive_until = EXCLUDED.alive_until",
        )
        .bind(self.id)
        .bind(self.liveness().as_millis() as f64)
        .execute(&self.beat_db)
        .await?;
        self.last_beat.store(
            switchboard_kit::now_ms(),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(())
    }

    /// Heartbeat now unless a recent one still has half its liveness left (the keep-alive
    /// task beats every third, so this fires only before its first beat or when it is stuck).
    async fn ensure_alive(&self) -> Result<(), DispatchError> {
        let last = self.last_beat.load(std::sync::atomic::Ordering::Relaxed);
        let fresh = (self.liveness().as_millis() / 2) as i64;
        if switchboard_kit::now_ms() - last > fresh {
            self.heartbeat().await?;
        }
        Ok(())
    }

    /// Heartbeat every third of the liveness window, for as long as the future runs.
    pub async fn keep_alive(&self) {
        loop {
            tokio::time::sleep(self.liveness() / 3).await;
            if let Err(e) = self.heartbeat().await {
                tracing::warn!(error = %e, "dispatcher heartbeat failed");
            }
        }
    }

    /// Watch the sessions this process's turns wait on, with one query every
    /// `dispatch.hold_poll_ms` for all of them, and wake a session's waiting turns when its
    /// cursor, its call slot or the slot's holder's liveness changed (or when first seen, as
    /// it may have changed before the watch saw it). A turn waiting behind a predecessor run
    /// by another replica learns of it here; one run by this process wakes it at once. So
    /// thousands of waiting turns cost one statement per tick, not one each.
    pub async fn watch_sessions(&self) {
        type Seen = (i64, Option<Uuid>, bool);
        let mut seen: HashMap<Uuid, Seen> = HashMap::new();
        let tick = Duration::from_millis(self.config.hold_poll_ms.max(10));
        loop {
            tokio::time::sleep(tick).await;
            let waited_on: Vec<Uuid> = self.wakers.0.lock().unwrap().keys().copied().collect();
            if waited_on.is_empty() {
                seen.clear();
                continue;
            }
            let rows: Vec<(Uuid, i64, Option<Uuid>, bool)> = match sqlx::query_as(
                "SELECT s.id, s.last_seq, s.running_call,
                        (s.running_call IS NULL OR s.running_until < now()
                         OR NOT EXISTS (SELECT 1 FROM switchboard.dispatchers d
                                         WHERE d.id = s.running_by AND d.alive_until > now()))
                   FROM switchboard.sessions s WHERE s.id = ANY($1)",
            )
            .bind(&waited_on)
            .fetch_all(&self.beat_db)
            .await
            {
                Ok(rows) => rows,
                Err(e) => {
                    // The waiting turns still re-check when their hold ends.
                    tracing::warn!(error = %e, "watching the waited-on sessions failed");
                    continue;
                }
            };
            let mut now = HashMap::with_capacity(rows.len());
            for (id, last, call, free) in rows {
                let state = (last, call, free);
                if seen.get(&id) != Some(&state) {
                    self.wakers.wake(id);
                }
                now.insert(id, state);
            }
            seen = now;
        }
    }

    /// This process makes no more runner calls: its leases end now, not at its liveness.
    pub async fn retire(&self) {
        let _ = sqlx::query("DELETE FROM switchboard.dispatchers WHERE id = $1")
            .bind(self.id)
            .execute(&self.beat_db)
            .await;
    }

    /// Take the session's call slot for the turn after `after` (as call `call`), if the cursor
    /// is still at `after` and no live lease is held by another call. Returns the engine
    /// session to resume (`Some(None)`: a new one) when the slot was taken.
    async fn lease_call(
        &self,
        session: Uuid,
        after: i64,
        call: Uuid,
        timeout: Duration,
    ) -> Result<Option<Option<String>>, DispatchError> {
        self.ensure_alive().await?;
        let _admitted = self.checks.acquire().await.expect("never closed");
        let leased: Option<(Option<String>,)> = sqlx::query_as(
            "UPDATE switchboard.sessions s
                SET running_call = $3, running_by = $4, status = 'running',
                    running_until = now() + $5 * interval '1 millisecond'
              WHERE s.id = $1 AND s.last_seq = $2
                AND (s.running_call IS NULL OR s.running_until < now()
                     OR NOT EXISTS (SELECT 1 FROM switchboard.dispatchers d
                                     WHERE d.id = s.running_by AND d.alive_until > now()))
             RETURNING s.engine_session_id",
        )
        .bind(session)
        .bind(after)
        .bind(call)
        .bind(self.id)
        .bind(timeout.as_millis() as f64)
        .fetch_optional(&self.db)
        .await?;
        Ok(leased.map(|(engine_session,)| engine_session))
    }

    /// Give the call slot back (the call failed, or another dispatcher committed the turn).
    async fn release_call(&self, session: Uuid, call: Uuid) -> Result<(), DispatchError> {
        sqlx::query(
            "UPDATE switchboard.sessions
                SET running_call = NULL, running_by = NULL, running_until = NULL, status = 'idle'
              WHERE id = $1 AND running_call = $2",
        )
        .bind(session)
        .bind(call)
        .execute(&self.db)
        .await?;
        self.wakers.wake(session);
        Ok(())
    }

    /// The session's cursor: the last turn done (or failed for good).
    async fn cursor(&self, session: Uuid) -> Result<i64, DispatchError> {
        let _admitted = self.checks.acquire().await.expect("never closed");
        sqlx::query_scalar("SELECT last_seq FROM switchboard.sessions WHERE id = $1")
            .bind(session)
            .fetch_optional(&self.db)
            .await?
            .ok_or(DispatchError::UnknownSession(session))
    }

    async fn stored_reply(&self, session: Uuid, seq: i64) -> Result<StoredReply, DispatchError> {
        let _admitted = self.checks.acquire().await.expect("never closed");
        let row = sqlx::query(
            "SELECT status, error, reply_id, reply_text, engine_session_id, processing_ms, tool_calls_count
               FROM switchboard.turns WHERE session_id = $1 AND seq = $2",
        )
        .bind(session)
        .bind(seq)
        .fetch_one(&self.db)
        .await?;
        if row.get::<TurnStatus, _>(0) != TurnStatus::Done {
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
    /// `after`. Returns false if another dispatcher got there first. A reply given without the
    /// agent (`keeps_engine_session`) leaves the session's engine session as it was.
    async fn commit(
        &self,
        session: Uuid,
        seq: i64,
        after: i64,
        call: Uuid,
        reply: &StoredReply,
        keeps_engine_session: bool,
    ) -> Result<bool, DispatchError> {
        let mut tx = self.db.begin().await?;
        // Only the call holding the session's slot may commit: a call whose lease lapsed (its
        // dispatcher stalled) and was taken over is not committed, whoever finishes first.
        let moved = sqlx::query(
            "UPDATE switchboard.sessions
                SET last_seq = $2, updated_at = now(), status = 'idle',
                    engine_session_id = CASE WHEN $6 THEN engine_session_id ELSE $3 END,
                    running_call = NULL, running_by = NULL, running_until = NULL
              WHERE id = $1 AND last_seq = $4 AND running_call = $5",
        )
        .bind(session)
        .bind(seq)
        .bind(&reply.engine_session_id)
        .bind(after)
        .bind(call)
        .bind(keeps_engine_session)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if moved == 0 {
            return Ok(false);
        }
        // A done turn keeps its first reply (a replayed failed turn can be run by two copies).
        let stored = sqlx::query(
            "UPDATE switchboard.turns
                SET status = 'done', error = NULL, reply_id = $3, reply_text = $4, engine_session_id = $5,
                    processing_ms = $6, tool_calls_count = $7, completed_at = now()
              WHERE session_id = $1 AND seq = $2 AND status <> 'done'",
        )
        .bind(session)
        .bind(seq)
        .bind(reply.reply_id)
        .bind(&reply.text)
        .bind(&reply.engine_session_id)
        .bind(reply.processing_ms)
        .bind(reply.tool_calls_count)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if stored == 0 {
            return Ok(false);
        }
        tx.commit().await?;
        self.wakers.wake(session);
        Ok(true)
    }

    /// Give up on a turn so that the session's later turns are not blocked behind it forever.
    /// False: a live dispatcher still holds the session's call lease (the turn may yet be
    /// answered), so nothing changed.
    async fn mark_failed(
        &self,
        session: Uuid,
        seq: i64,
        error: &str,
    ) -> Result<bool, DispatchError> {
        let mut tx = self.db.begin().await?;
        let moved = sqlx::query(
            "UPDATE switchboard.sessions s SET last_seq = $2, status = 'idle', updated_at = now(),
                    running_call = NULL, running_by = NULL, running_until = NULL
              WHERE s.id = $1 AND s.last_seq = $2 - 1
                AND (s.running_call IS NULL OR s.running_until < now()
                     OR NOT EXISTS (SELECT 1 FROM switchboard.dispatchers d
                                     WHERE d.id = s.running_by AND d.alive_until > now()))",
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
            tx.commit().await?;
            self.wakers.wake(session);
            return Ok(true);
        }
        tx.rollback().await?;
        // Not moved: either the cursor is already past this turn (done, or failed before), or
        // a live call lease holds it.
        Ok(self.cursor(session).await? >= seq)
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
            provider_message_id: inbound.provider_message_id.clone(),
        };
        Output::new(
            self.topology.reply(),
            format!("{session}:{}", turn.seq),
            &reply,
        )
        .correlated(inbound.correlation_id)
    }

    /// Run one turn. Returns the reply to publish.
    async fn dispatch_turn(&self, turn: &Turn, attempt: &Attempt) -> Result<Output, DispatchError> {
        let session: Uuid = turn
            .session_id
            .parse()
            .map_err(|_| DispatchError::Malformed("session_id"))?;
        let (agent, slots) = self
            .agents
            .get(&turn.agent_name)
            .ok_or_else(|| DispatchError::UnknownAgent(turn.agent_name.clone()))?;

        // Wait until this turn is next and the session's call slot is free. `after` is the
        // cursor value this turn commits against: its predecessor, or itself when a failed
        // latest turn is run again (a replay).
        let deadline = Instant::now() + Duration::from_millis(self.config.hold_timeout_ms);
        let call = Uuid::now_v7();
        let call_timeout = Duration::from_secs(agent.timeout_s) + CALL_DEADLINE_MARGIN;
        let _slot;
        // The usual case in one statement: this turn is next and the slot is free.
        // (Only with a free agent slot at hand: a redelivered or early turn must not queue for
        // one before the checks below.)
        let fast = match slots.clone().try_acquire_owned() {
            Ok(slot) => self
                .lease_call(session, turn.seq - 1, call, call_timeout)
                .await?
                .map(|engine_session| (slot, engine_session)),
            Err(_) => None,
        };
        let (engine_session, after) = if let Some((slot, engine_session)) = fast {
            _slot = slot;
            (engine_session, turn.seq - 1)
        } else {
            // Woken by this process moving the session on, or by the session watch.
            let waiting = self.wakers.wait_on(session);
            loop {
                // Registered before the check, so a wake between the check and the wait counts.
                let woken = waiting.notify().notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                let last = self.cursor(session).await?;
                let mut ready = None;
                if turn.seq <= last {
                    match self.stored_reply(session, turn.seq).await {
                        // Already done (by us before a crash, or by another replica): same answer.
                        Ok(stored) => return Ok(self.reply_output(turn, session, &stored)),
                        // It failed for good, and nothing ran after it: run it again in place.
                        Err(DispatchError::FailedEarlier { .. }) if turn.seq == last => {
                            ready = Some(last);
                        }
                        Err(e) => return Err(e),
                    }
                } else if turn.seq == last + 1 {
                    ready = Some(last);
                }
                if let Some(after) = ready {
                    // The agent's concurrency slot first, so a lease is never held while queueing.
                    let slot = slots
                        .clone()
                        .acquire_owned()
                        .await
                        .expect("semaphore never closed");
                    if let Some(engine_session) =
                        self.lease_call(session, after, call, call_timeout).await?
                    {
                        _slot = slot;
                        break (engine_session, after);
                    }
                }
                if Instant::now() >= deadline {
                    return Err(DispatchError::NotYet {
                        seq: turn.seq,
                        next: last + 1,
                    });
                }
                tokio::select! {
                    _ = woken => {}
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                }
            }
        };

        // A message the agent started, or one Switchboard answered itself, has its answer: no
        // runner call, the text is committed as the turn's reply, in the turn's place (after
        // the replies before it).
        if let Some(text) = turn.given_answer() {
            let stored = StoredReply {
                reply_id: Uuid::now_v7(),
                text: text.to_string(),
                // The engine session goes on as it was.
                engine_session_id: engine_session.unwrap_or_default(),
                processing_ms: 0,
                tool_calls_count: 0,
            };
            return self.settle(turn, session, after, call, stored).await;
        }

        let prompt = prompt::build_prompt(turn);
        let correlation = turn
            .message
            .as_ref()
            .and_then(|m| m.inbound.as_ref())
            .map(|i| i.correlation_id.as_str())
            .unwrap_or(&attempt.correlation_id);
        let request = RunRequest {
            agent: &agent.name,
            prompt: &prompt,
            session_id: engine_session.as_deref(),
            correlation_id: correlation,
        };
        let key = format!("turn:{session}:{}", turn.seq);
        let started = Instant::now();
        let resp = match self.runner.run(agent, &request, &key).await {
            Ok(resp) => resp,
            Err(e) => {
                // Best effort: a lease left behind only delays this turn's retry until it ends.
                if let Err(db) = self.release_call(session, call).await {
                    tracing::warn!(%session, error = %db, "could not release the call slot");
                }
                return Err(e.into());
            }
        };
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
        self.settle(turn, session, after, call, stored).await
    }

    /// Commit the turn's answer (compare-and-set on the cursor and the call slot) and return
    /// the reply to publish: this one, or the one another call of the turn committed.
    async fn settle(
        &self,
        turn: &Turn,
        session: Uuid,
        after: i64,
        call: Uuid,
        stored: StoredReply,
    ) -> Result<Output, DispatchError> {
        // The agent has answered: a database hiccup must not make it answer again, so the
        // commit is tried again for a while before the turn fails (and is run again).
        let keeps_engine_session = turn.given_answer().is_some();
        let committed = match retry::until(
            Instant::now() + COMMIT_RETRY_FOR,
            Backoff::new(Duration::from_millis(50), Duration::from_secs(2)),
            "storing the agent's reply",
            || {
                self.commit(
                    session,
                    turn.seq,
                    after,
                    call,
                    &stored,
                    keeps_engine_session,
                )
            },
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                if let Err(db) = self.release_call(session, call).await {
                    tracing::warn!(%session, error = %db, "could not release the call slot");
                }
                return Err(e);
            }
        };
        if committed {
            return Ok(self.reply_output(turn, session, &stored));
        }
        self.release_call(session, call).await?;
        match self.stored_reply(session, turn.seq).await {
            // Another call of this turn committed while we ran it: its answer stands.
            Ok(stored) => {
                tracing::warn!(%session, seq = turn.seq, "turn committed elsewhere; re-emitting that reply");
                Ok(self.reply_output(turn, session, &stored))
            }
            // Another call of this turn holds the slot and is still running: its answer will
            // stand; come back for it.
            Err(DispatchError::FailedEarlier { .. }) => {
                Err(DispatchError::Superseded { seq: turn.seq })
            }
            Err(e) => Err(e),
        }
    }
}

impl Stage for TurnDispatcher {
    type Input = Turn;
    /// Each turn mostly waits on a runner: many at once per process (agents' own
    /// `concurrency` still caps each agent).
    const SPEC: StageSpec = StageSpec::new("dispatch", Source::Work("turn.>")).concurrency(256);

    async fn handle(&self, turn: Turn, attempt: &Attempt) -> Result<Vec<Output>, StageError> {
        match self.dispatch_turn(&turn, attempt).await {
            Ok(out) => Ok(vec![out]),
            Err(e @ (DispatchError::NotYet { .. } | DispatchError::Superseded { .. })) => {
                Err(StageError::Defer(
                    Duration::from_millis(self.config.hold_poll_ms),
                    e.to_string(),
                ))
            }
            Err(e) if e.is_transient() => Err(StageError::transient(e)),
            Err(e) => Err(StageError::permanent(e)),
        }
    }

    /// Out of attempts, retrying cannot help, or the turn kept crashing its dispatcher: record
    /// the turn as failed so the session's next turns go ahead. (A turn that failed earlier, or
    /// whose cursor moved on, is left as it is: the update is a compare-and-set.)
    async fn give_up(
        &self,
        turn: &Turn,
        _attempt: &Attempt,
        reason: &str,
    ) -> Result<Vec<Output>, StageError> {
        let Ok(session) = turn.session_id.parse::<Uuid>() else {
            return Ok(Vec::new());
        };
        match self.mark_failed(session, turn.seq, reason).await {
            Ok(true) | Err(DispatchError::UnknownSession(_)) => Ok(Vec::new()),
            // Its predecessor is not settled yet, or a live call holds the session: the turn
            // may still be answered; give up once that is over.
            Ok(false) => Err(StageError::Defer(
                self.liveness(),
                "the session's previous turn or a live call is not over".into(),
            )),
            Err(e) => Err(StageError::transient(e)),
        }
    }
}

/// The dispatch stage as a task of `app`.
/// The dispatch stage, as the product lists it.
pub const STAGE: Registration = Registration {
    spec: TurnDispatcher::SPEC,
    worker: "dispatch",
    start: task,
};

fn task(app: &App) -> Task {
    let c = &app.config;
    let stage = Arc::new(TurnDispatcher::new(
        app.db.clone(),
        &c.agents,
        app.topology.clone(),
        c.dispatch.clone(),
    ));
    let run = app.shared_stage_task(stage.clone());
    // Heartbeat until the stage has drained (in-flight calls still hold their leases).
    Box::pin(async move {
        let result = tokio::select! {
            r = run => r,
            _ = stage.keep_alive() => unreachable!("keep_alive never returns"),
            _ = stage.watch_sessions() => unreachable!("watch_sessions never returns"),
        };
        stage.retire().await;
        result
    })
}
