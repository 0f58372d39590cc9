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
pub mod attachments;
pub mod breaker;
pub mod flush;
pub mod prompt;
mod recall;
pub mod runner;
pub mod schedule;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use switchboard_kit::config::{
    AgentConfig, Config, DispatchConfig, PromptConfig, QueueMode, ResetNotices, StaleTurns,
};
use switchboard_kit::proto::{Reply, SessionReset, Turn};
use switchboard_kit::retry::{self, Backoff};
use switchboard_kit::startup::{App, Task};
use switchboard_kit::status::ResetReason;
use switchboard_kit::status::TurnStatus;
use switchboard_kit::{Attempt, GiveUp, Output, Stage, StageError, Topology, Wake};
use switchboard_kit::{Registration, Source, StageSpec};
use tokio::sync::{Semaphore, watch};
use uuid::Uuid;

use crate::runner::{RunRequest, RunnerClient, RunnerError, TurnCredentials};
use switchboard_memory::curated::{CuratedMemory, MemoryStore};

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
    NotYet { seq: i64, next: i64, wake: Wake },
    #[error("another call of turn {seq} holds the session; its answer will stand")]
    Superseded { seq: i64 },
    /// The turn's call was cancelled by a newer message (queue mode interrupt): it runs again,
    /// joined with it.
    #[error("turn {seq}'s call was interrupted by a newer message")]
    Interrupted { seq: i64 },
    /// The turn's message was answered by turn `into`'s runner call (queue mode collect).
    #[error("turn {seq} was answered together with turn {into}")]
    JoinedInto { seq: i64, into: i64 },
    /// Too old when it could first run, and `stale_turns = expire`: not run.
    #[error("{EXPIRED}: the message waited {} before it could run (dispatch.max_turn_age_s is {max_s})", prompt::for_how_long(*waited))]
    Expired {
        waited: chrono::Duration,
        max_s: u64,
    },
    /// The agent's runner is down: the turn waits for it (`notice`: what to tell the person,
    /// when they are to be told), until `after` or until `recovery` says it is back.
    #[error("the agent's runner is down; the turn waits for it")]
    RunnerDown {
        after: Duration,
        notice: Vec<Output>,
        recovery: Wake,
    },
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

/// How an expired turn's dead letter begins.
const EXPIRED: &str = "expired";

/// Whether the turn was given up because it expired (the person is told so): decided by the
/// error its handler returned, never by the reason's wording (a runner's "expired token" is
/// not the person's message expiring).
fn expired(cause: &GiveUp) -> bool {
    matches!(
        cause,
        GiveUp::Rejected(e) if matches!(e.downcast_ref(), Some(DispatchError::Expired { .. }))
    )
}

/// A turn's stored outcome.
struct StoredReply {
    reply_id: Uuid,
    text: String,
    engine_session_id: String,
    processing_ms: i64,
    tool_calls_count: i64,
    /// The fresh engine session the turn started (the reply tells the person).
    reset: Option<ResetReason>,
    /// The inbound messages a joined call answered, in order (empty: this turn's alone).
    answers: Vec<String>,
}

/// The engine session a session goes on with after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextEngineSession {
    /// As it was: the turn was answered without the agent.
    Keep,
    /// The one the runner answered with.
    Answered,
    /// None: the turn only reset the session (`/new` alone); the next turn starts one.
    Cleared,
}

impl NextEngineSession {
    fn as_str(self) -> &'static str {
        match self {
            NextEngineSession::Keep => "keep",
            NextEngineSession::Answered => "answered",
            NextEngineSession::Cleared => "cleared",
        }
    }
}

/// What taking a session's call slot tells the turn about its session.
struct Lease {
    /// The engine session to resume (`None`: a new one).
    engine_session: Option<String>,
    /// A reset asked for outside the conversation, and when (it is cleared only if unchanged).
    pending_reset: Option<(ResetReason, Option<DateTime<Utc>>)>,
    workspace: Option<String>,
    /// The identity's summary and when it was written.
    summary: Option<(String, DateTime<Utc>)>,
    /// The notice that told the person of the runner's outage this session waits out.
    waiting_notice: Option<Uuid>,
    /// The turn's person's curated memory of the identity (memory.md), as the turn found it.
    memory: Option<CuratedMemory>,
}

/// What taking the call slot reads, as one row.
#[derive(sqlx::FromRow)]
struct LeaseRow {
    engine_session_id: Option<String>,
    pending_reset: Option<ResetReason>,
    pending_reset_at: Option<DateTime<Utc>>,
    workspace_path: Option<String>,
    summary: Option<String>,
    summary_at: Option<DateTime<Utc>>,
    waiting_notice: Option<Uuid>,
    memory: Option<String>,
    memory_version: Option<i64>,
    memory_by: Option<String>,
    memory_at: Option<DateTime<Utc>>,
    memory_identity: Option<String>,
}

/// A runner call's lease outlives the agent's timeout by this much, so only a call that is
/// certainly over (or whose dispatcher is dead) lets the next one start.
const CALL_DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// How long a runner's answer is kept trying to be stored (the commit is a compare-and-set
/// on the call's lease, so a late success is still exactly one answer).
const COMMIT_RETRY_FOR: Duration = Duration::from_secs(30);

/// Turns waiting in this process for their session's cursor to move or its call slot to be
/// freed (parked by the runtime, without a handler slot), woken the moment this process does
/// either, or the session watch sees another replica do it.
#[derive(Default, Clone)]
struct Wakers(Arc<std::sync::Mutex<HashMap<Uuid, watch::Sender<u64>>>>);

impl Wakers {
    /// Register before checking the session, so a change between the check and the wait
    /// still wakes the turn.
    fn wait_on(&self, session: Uuid) -> WaitingTurn {
        let rx = self
            .0
            .lock()
            .unwrap()
            .entry(session)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        WaitingTurn {
            wakers: self.clone(),
            session,
            rx: Some(rx),
        }
    }

    fn wake(&self, session: Uuid) {
        if let Some(tx) = self.0.lock().unwrap().get(&session) {
            tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    fn waited_on(&self) -> Vec<Uuid> {
        self.0.lock().unwrap().keys().copied().collect()
    }
}

/// One waiting turn's registration; the session's entry goes when its last waiter does.
struct WaitingTurn {
    wakers: Wakers,
    session: Uuid,
    rx: Option<watch::Receiver<u64>>,
}

impl WaitingTurn {
    /// Resolves at the session's first wake after the registration.
    async fn woken(mut self) {
        if let Some(rx) = self.rx.as_mut() {
            // The sender stays while a receiver does: an error cannot happen here.
            let _ = rx.changed().await;
        }
    }
}

impl Drop for WaitingTurn {
    fn drop(&mut self) {
        let mut map = self.wakers.0.lock().unwrap();
        drop(self.rx.take());
        if map
            .get(&self.session)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            map.remove(&self.session);
        }
    }
}

/// An entry of a session's journal (`switchboard.session_events`), written in the transaction
/// of the change it records; its key makes it once-only.
struct Journal {
    session: Uuid,
    key: String,
    kind: &'static str,
    seq: i64,
    detail: serde_json::Value,
}

impl Journal {
    fn new(
        session: Uuid,
        key: String,
        kind: &'static str,
        seq: i64,
        detail: serde_json::Value,
    ) -> Self {
        Self {
            session,
            key,
            kind,
            seq,
            detail,
        }
    }

    async fn write(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        entries: &[Journal],
    ) -> Result<(), sqlx::Error> {
        let ids: Vec<Uuid> = entries.iter().map(|_| Uuid::now_v7()).collect();
        let sessions: Vec<Uuid> = entries.iter().map(|e| e.session).collect();
        let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
        let kinds: Vec<&str> = entries.iter().map(|e| e.kind).collect();
        let seqs: Vec<i64> = entries.iter().map(|e| e.seq).collect();
        let details: Vec<&serde_json::Value> = entries.iter().map(|e| &e.detail).collect();
        sqlx::query(
            "INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::bigint[],
                                  $6::jsonb[])
             ON CONFLICT (key) DO NOTHING",
        )
        .bind(ids)
        .bind(sessions)
        .bind(keys)
        .bind(kinds)
        .bind(seqs)
        .bind(details)
        .execute(&mut **tx)
        .await?;
        Ok(())
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
    prompt: PromptConfig,
    notices: ResetNotices,
    wakers: Wakers,
    breakers: breaker::Breakers,
    media: attachments::MediaFetcher,
    uploads: attachments::Uploads,
    /// The curated memory (memory.md) of each turn's person + identity.
    memories: MemoryStore,
    /// Each call's recall of the person's earlier messages.
    recall: recall::Recaller,
    /// Each runner call's turn token and API URL.
    credentials: TurnCredentials,
}

impl TurnDispatcher {
    pub fn new(db: PgPool, topology: Topology, config: &Config) -> Self {
        let agents = config
            .agents
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
        let uploads = attachments::Uploads::new(db.clone(), config.workspace.max_attachment_bytes);
        let memories = MemoryStore::new(db.clone(), config.memory.max_chars);
        let recall = recall::Recaller::new(db.clone(), config);
        let credentials = TurnCredentials::new(db.clone(), config);
        Self {
            id: Uuid::new_v4(),
            last_beat: Default::default(),
            beat_db,
            checks,
            db,
            agents,
            runner: RunnerClient::new(),
            topology,
            config: config.dispatch.clone(),
            prompt: config.prompt.clone(),
            notices: config.session.reset_notices.clone(),
            wakers: Wakers::default(),
            media: attachments::MediaFetcher::new(
                &config.twilio.api_base,
                &config.twilio.account_sid,
                config.twilio.auth_token.clone(),
                config.workspace.max_attachment_bytes,
            ),
            uploads,
            memories,
            recall,
            credentials,
            breakers: breaker::Breakers::new(
                config.dispatch.breaker_failures,
                Duration::from_millis(config.dispatch.breaker_probe_ms.max(10)),
                Duration::from_millis(config.dispatch.breaker_probe_max_ms),
                // A probe is one runner call: it reports within the agent's timeout.
                config
                    .agents
                    .iter()
                    .map(|a| Duration::from_secs(a.timeout_s))
                    .max()
                    .unwrap_or_default()
                    + CALL_DEADLINE_MARGIN,
            ),
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
            let waited_on = self.wakers.waited_on();
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

    /// Take the session's call slot for turn `seq` after `after` (as call `call`), if the
    /// cursor is still at `after` and no live lease is held by another call. `None`: not
    /// taken. The journal records the call's start in the same statement.
    async fn lease_call(
        &self,
        session: Uuid,
        seq: i64,
        after: i64,
        call: Uuid,
        timeout: Duration,
        person_id: &str,
    ) -> Result<Option<Lease>, DispatchError> {
        self.ensure_alive().await?;
        let _admitted = self.checks.acquire().await.expect("never closed");
        let leased: Option<LeaseRow> = sqlx::query_as(
            "WITH leased AS (
                UPDATE switchboard.sessions s
                   SET running_call = $3, running_by = $4, status = 'running',
                       running_until = now() + $5 * interval '1 millisecond',
                       running_key = NULL, running_last = NULL, running_interrupted = false
                 WHERE s.id = $1 AND s.last_seq = $2
                   AND (s.running_call IS NULL OR s.running_until < now()
                        OR NOT EXISTS (SELECT 1 FROM switchboard.dispatchers d
                                        WHERE d.id = s.running_by AND d.alive_until > now()))
                RETURNING s.id, s.engine_session_id, s.pending_reset, s.pending_reset_at,
                          s.workspace_path, s.memory_key, s.agent_identity,
                          s.waiting_notice),
             started AS (
                INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
                SELECT $6, id, 'turn_started:' || $3::text, 'turn_started', $7,
                       jsonb_build_object('call', $3::text, 'resumes', engine_session_id)
                  FROM leased
                ON CONFLICT (key) DO NOTHING),
             -- The turn's first pickup, set once (a redelivery keeps the first).
             picked AS (
                UPDATE switchboard.turns t SET picked_at = now()
                  FROM leased l
                 WHERE t.session_id = l.id AND t.seq = $7 AND t.picked_at IS NULL)
             SELECT l.engine_session_id, l.pending_reset, l.pending_reset_at, l.workspace_path,
                    m.summary, m.updated_at AS summary_at, l.waiting_notice,
                    c.body AS memory, c.version AS memory_version,
                    c.updated_by AS memory_by, c.updated_at AS memory_at,
                    c.agent_identity AS memory_identity
               FROM leased l
               LEFT JOIN switchboard.summaries m ON m.memory_key = l.memory_key
               -- The curated memory of the turn's person (not the session's: a session
               -- shared by everyone never shares anyone's memory).
               LEFT JOIN switchboard.memories c
                      ON c.person_id = $8 AND c.agent_identity = l.agent_identity",
        )
        .bind(session)
        .bind(after)
        .bind(call)
        .bind(self.id)
        .bind(timeout.as_millis() as f64)
        .bind(Uuid::now_v7())
        .bind(seq)
        .bind(person_id)
        .fetch_optional(&self.db)
        .await?;
        Ok(leased.map(|row| {
            let memory = match (
                row.memory,
                row.memory_version,
                row.memory_by,
                row.memory_at,
                row.memory_identity,
            ) {
                (Some(body), Some(version), Some(updated_by), Some(updated_at), Some(identity)) => {
                    Some(CuratedMemory {
                        person_id: person_id.to_string(),
                        agent_identity: identity,
                        body,
                        version,
                        updated_by,
                        updated_at,
                    })
                }
                _ => None,
            };
            Lease {
                engine_session: row.engine_session_id,
                pending_reset: row.pending_reset.map(|r| (r, row.pending_reset_at)),
                workspace: row.workspace_path,
                summary: row.summary.zip(row.summary_at),
                waiting_notice: row.waiting_notice,
                memory,
            }
        }))
    }

    /// `result`, the call slot given back first if it is an error: a step between the lease
    /// and the runner call that fails must not hold the session until the call's deadline.
    async fn or_release<T>(
        &self,
        session: Uuid,
        call: Uuid,
        result: Result<T, DispatchError>,
    ) -> Result<T, DispatchError> {
        if result.is_err()
            && let Err(db) = self.release_call(session, call).await
        {
            tracing::warn!(%session, error = %db, "could not release the call slot");
        }
        result
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
            "SELECT status, error, reply_id, reply_text, engine_session_id, processing_ms,
                    tool_calls_count, reset, joined_into,
                    (SELECT array_agg(j.inbound_id::text ORDER BY j.seq)
                       FROM switchboard.turns j
                      WHERE j.session_id = t.session_id AND j.joined_into = t.seq
                        AND j.status = 'done' AND j.seq < t.seq)
               FROM switchboard.turns t WHERE session_id = $1 AND seq = $2",
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
        let reply_id: Option<Uuid> = row.get(2);
        let Some(reply_id) = reply_id else {
            return Err(DispatchError::JoinedInto {
                seq,
                into: row.get::<Option<i64>, _>(8).unwrap_or(seq),
            });
        };
        let mut answers: Vec<String> = row.get::<Option<Vec<String>>, _>(9).unwrap_or_default();
        if !answers.is_empty() {
            let own: Option<String> = sqlx::query_scalar(
                "SELECT inbound_id::text FROM switchboard.turns WHERE session_id = $1 AND seq = $2",
            )
            .bind(session)
            .bind(seq)
            .fetch_optional(&self.db)
            .await?;
            answers.extend(own);
        }
        Ok(StoredReply {
            answers,
            reply_id,
            text: row.get(3),
            engine_session_id: row.get(4),
            processing_ms: row.get::<Option<i64>, _>(5).unwrap_or(0),
            tool_calls_count: row.get::<Option<i64>, _>(6).unwrap_or(0),
            reset: row.get(7),
        })
    }

    /// Move the cursor from `after` to `seq` and store the reply, only if the cursor is still at
    /// `after` and this call holds the session's slot. Returns false if another dispatcher got
    /// there first. `next` says which engine session the session goes on with; a pending reset
    /// this turn applied (`consumed`: when it was asked for) is cleared unless a newer one came
    /// meanwhile. The journal records the reply (and the reset) in the same transaction.
    async fn commit(
        &self,
        session: Uuid,
        seq: i64,
        after: i64,
        call: Uuid,
        settlement: &Settlement,
    ) -> Result<bool, DispatchError> {
        let Settlement {
            reply,
            next,
            consumed,
            recall,
            ..
        } = settlement;
        let mut tx = self.db.begin().await?;
        // Only the call holding the session's slot may commit: a call whose lease lapsed (its
        // dispatcher stalled) and was taken over is not committed, whoever finishes first.
        let previous: Option<(Option<String>,)> = sqlx::query_as(
            "WITH before AS (
                SELECT engine_session_id FROM switchboard.sessions
                 WHERE id = $1 AND last_seq = $4 AND running_call = $5 FOR UPDATE)
             UPDATE switchboard.sessions s
                SET last_seq = $2, updated_at = now(), status = 'idle',
                    engine_session_id = CASE $6 WHEN 'keep' THEN s.engine_session_id
                                                WHEN 'cleared' THEN NULL ELSE $3 END,
                    resets = s.resets + $7,
                    pending_reset = CASE WHEN $8 AND s.pending_reset_at IS NOT DISTINCT FROM $9
                                         THEN NULL ELSE s.pending_reset END,
                    pending_reset_at = CASE WHEN $8 AND s.pending_reset_at IS NOT DISTINCT FROM $9
                                            THEN NULL ELSE s.pending_reset_at END,
                    waiting_since = NULL, waiting_notice = NULL,
                    running_call = NULL, running_by = NULL, running_until = NULL
               FROM before
              WHERE s.id = $1
             RETURNING before.engine_session_id",
        )
        .bind(session)
        .bind(seq)
        .bind(&reply.engine_session_id)
        .bind(after)
        .bind(call)
        .bind(next.as_str())
        .bind(i32::from(reply.reset.is_some()))
        .bind(consumed.is_some())
        .bind(consumed.flatten())
        .fetch_optional(&mut *tx)
        .await?;
        let Some((previous,)) = previous else {
            return Ok(false);
        };
        let first = settlement.first;
        if first < seq {
            sqlx::query(
                "UPDATE switchboard.turns
                    SET status = 'done', error = NULL, joined_into = $3, completed_at = now()
                  WHERE session_id = $1 AND seq >= $2 AND seq < $3 AND status <> 'done'",
            )
            .bind(session)
            .bind(first)
            .bind(seq)
            .execute(&mut *tx)
            .await?;
        }
        // A done turn keeps its first reply (a replayed failed turn can be run by two copies).
        let stored = sqlx::query(
            "UPDATE switchboard.turns
                SET status = 'done', error = NULL, reply_id = $3, reply_text = $4, engine_session_id = $5,
                    processing_ms = $6, tool_calls_count = $7, completed_at = now(), reset = $8
              WHERE session_id = $1 AND seq = $2 AND status <> 'done'",
        )
        .bind(session)
        .bind(seq)
        .bind(reply.reply_id)
        .bind(&reply.text)
        .bind(&reply.engine_session_id)
        .bind(reply.processing_ms)
        .bind(reply.tool_calls_count)
        .bind(reply.reset)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if stored == 0 {
            return Ok(false);
        }
        // What the call recalled comes before its reply in the story.
        let mut entries: Vec<Journal> = recall
            .iter()
            .map(|recall| {
                Journal::new(
                    session,
                    format!("recall:{session}:{seq}"),
                    "recall",
                    seq,
                    recall.clone(),
                )
            })
            .collect();
        entries.push(Journal::new(
            session,
            format!("reply:{session}:{seq}"),
            "reply",
            seq,
            serde_json::json!({
                "reply_id": reply.reply_id,
                "engine_session_id": reply.engine_session_id,
                "processing_ms": reply.processing_ms,
                "tool_calls_count": reply.tool_calls_count,
                "joined": (first..=seq).collect::<Vec<i64>>(),
            }),
        ));
        if let Some(reason) = reply.reset {
            entries.push(Journal::new(
                session,
                format!("reset:{session}:{seq}"),
                "reset",
                seq,
                serde_json::json!({
                    "reason": reason.as_str(),
                    "previous_engine_session_id": previous,
                }),
            ));
        }
        Journal::write(&mut tx, &entries).await?;
        tx.commit().await?;
        self.wakers.wake(session);
        Ok(true)
    }

    /// Give up on a turn so that the session's later turns are not blocked behind it forever.
    /// False: a live dispatcher still holds the session's call lease (the turn may yet be
    /// answered), so nothing changed. A reset the turn would have started is left pending
    /// for the next turn: the person is still told, and the engine session still starts over.
    async fn mark_failed(
        &self,
        session: Uuid,
        seq: i64,
        reset: Option<ResetReason>,
        error: &str,
    ) -> Result<bool, DispatchError> {
        let mut tx = self.db.begin().await?;
        let moved = sqlx::query(
            "UPDATE switchboard.sessions s SET last_seq = $2, status = 'idle', updated_at = now(),
                    running_call = NULL, running_by = NULL, running_until = NULL,
                    pending_reset = COALESCE($3, s.pending_reset),
                    pending_reset_at = CASE WHEN $3 IS NULL THEN s.pending_reset_at ELSE now() END
              WHERE s.id = $1 AND s.last_seq = $2 - 1
                AND (s.running_call IS NULL OR s.running_until < now()
                     OR NOT EXISTS (SELECT 1 FROM switchboard.dispatchers d
                                     WHERE d.id = s.running_by AND d.alive_until > now()))",
        )
        .bind(session)
        .bind(seq)
        .bind(reset)
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
            let entry = Journal::new(
                session,
                format!("failure:{session}:{seq}"),
                "failure",
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

    /// The turn's reply, and the `session.reset` event when it started a fresh engine session.
    fn outputs(&self, turn: &Turn, session: Uuid, stored: &StoredReply) -> Vec<Output> {
        let mut out = vec![self.reply_output(turn, session, stored)];
        if let Some(reason) = stored.reset {
            let person = turn
                .message
                .as_ref()
                .and_then(|m| m.person.clone())
                .unwrap_or_default();
            let event = SessionReset {
                session_id: session.to_string(),
                person_id: person.person_id,
                agent_name: turn.agent_name.clone(),
                agent_identity: turn.agent_identity.clone(),
                reason: reason.as_str().to_string(),
                seq: turn.seq,
                reset_at_ms: switchboard_kit::now_ms(),
            };
            let correlation = turn
                .message
                .as_ref()
                .and_then(|m| m.inbound.as_ref())
                .map(|i| i.correlation_id.clone())
                .unwrap_or_default();
            out.push(
                Output::new(
                    self.topology.event("session.reset"),
                    format!("{session}:{}", turn.seq),
                    &event,
                )
                .correlated(correlation),
            );
        }
        out
    }

    fn reply_output(&self, turn: &Turn, session: Uuid, stored: &StoredReply) -> Output {
        let reply = self.reply_message(turn, session, stored);
        Output::new(
            self.topology.reply(),
            format!("{session}:{}", turn.seq),
            &reply,
        )
        .correlated(reply.correlation_id.clone())
    }

    fn reply_message(&self, turn: &Turn, session: Uuid, stored: &StoredReply) -> Reply {
        let msg = turn.message.clone().unwrap_or_default();
        let inbound = msg.inbound.unwrap_or_default();
        // A heartbeat's "nothing to report" is logged, not sent; what it reports goes without
        // the token. Derived from the stored answer, so a redelivered turn says the same.
        let (text, kind) = if inbound.heartbeat {
            match schedule::heartbeat_report(&stored.text) {
                Some(report) => (report.to_string(), String::new()),
                None => (stored.text.clone(), schedule::HEARTBEAT_OK_KIND.to_string()),
            }
        } else {
            (stored.text.clone(), String::new())
        };
        Reply {
            id: stored.reply_id.to_string(),
            session_id: session.to_string(),
            seq: turn.seq,
            agent_name: turn.agent_name.clone(),
            agent_identity: turn.agent_identity.clone(),
            text,
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
            kind,
            answers: stored.answers.clone(),
        }
    }

    /// Run one turn. Returns the reply (and events) to publish.
    async fn dispatch_turn(
        &self,
        turn: &Turn,
        attempt: &Attempt,
    ) -> Result<Vec<Output>, DispatchError> {
        let session: Uuid = turn
            .session_id
            .parse()
            .map_err(|_| DispatchError::Malformed("session_id"))?;
        let (agent, slots) = self
            .agents
            .get(&turn.agent_name)
            .ok_or_else(|| DispatchError::UnknownAgent(turn.agent_name.clone()))?;

        // Run only when this turn is next and the session's call slot is free; otherwise the
        // turn is parked (no handler slot held) until the session moves. `after` is the cursor
        // value this turn commits against: its predecessor, or itself when a failed latest turn
        // is run again (a replay).
        let call = Uuid::now_v7();
        let call_timeout = Duration::from_secs(agent.timeout_s) + CALL_DEADLINE_MARGIN;
        let person_id = turn
            .message
            .as_ref()
            .and_then(|m| m.person.as_ref())
            .map(|p| p.person_id.clone())
            .unwrap_or_default();
        let _slot;
        // The usual case in one statement: this turn is next and the slot is free.
        // (Only with a free agent slot at hand: a redelivered or early turn must not queue for
        // one before the checks below.)
        let fast = match slots.clone().try_acquire_owned() {
            Ok(slot) => self
                .lease_call(
                    session,
                    turn.seq,
                    turn.seq - 1,
                    call,
                    call_timeout,
                    &person_id,
                )
                .await?
                .map(|lease| (slot, lease)),
            Err(_) => None,
        };
        let (mut lease, after) = if let Some((slot, lease)) = fast {
            _slot = slot;
            (lease, turn.seq - 1)
        } else {
            // Woken by this process moving the session on, or by the session watch.
            let waiting = self.wakers.wait_on(session);
            let last = self.cursor(session).await?;
            let mut ready = None;
            if turn.seq <= last {
                match self.stored_reply(session, turn.seq).await {
                    // Already done (by us before a crash, or by another replica): same answer.
                    Ok(stored) => return Ok(self.outputs(turn, session, &stored)),
                    // Answered by a later turn's call: its reply is that turn's to send.
                    Err(DispatchError::JoinedInto { .. }) => return Ok(Vec::new()),
                    // It failed for good, and nothing ran after it: run it again in place.
                    Err(DispatchError::FailedEarlier { .. }) if turn.seq == last => {
                        ready = Some(last);
                    }
                    Err(e) => return Err(e),
                }
            } else if turn.seq == last + 1 {
                ready = Some(last);
            }
            let mut leased = None;
            if let Some(after) = ready {
                // The agent's concurrency slot first, so a lease is never held while queueing.
                let slot = slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("semaphore never closed");
                if let Some(lease) = self
                    .lease_call(session, turn.seq, after, call, call_timeout, &person_id)
                    .await?
                {
                    _slot = slot;
                    leased = Some((lease, after));
                }
            }
            match leased {
                Some(leased) => leased,
                None => {
                    if agent.queue_mode == QueueMode::Interrupt {
                        self.interrupt_running_call(session, turn, agent).await;
                    }
                    return Err(DispatchError::NotYet {
                        seq: turn.seq,
                        next: last + 1,
                        wake: Wake::new(waiting.woken()),
                    });
                }
            }
        };

        // The session waited for the runner and its person was told. A redelivered turn (its
        // dispatcher died) tells them again with its answer, under the same notice id (sent once
        // however often it is published): the dispatcher that recorded the wait may have died
        // before publishing the notice, and the runner be back by now. (Whether this delivery
        // parked before does not matter: the notice may still never have gone out.)
        let retell = lease.waiting_notice.filter(|_| attempt.delivered > 1);
        let retold = |mut outputs: Vec<Output>| {
            if let Some(notice) = retell {
                let text = self.config.runner_down_notice.clone();
                outputs.insert(0, self.notice_output(turn, session, notice, text));
            }
            outputs
        };
        // The turn's own reset (decided when it was opened), else one asked for outside the
        // conversation. A message the agent started does not take an operator's reset: the
        // person's next message does, and is told.
        let given = turn.given_answer();
        let own_reset = ResetReason::parse(&turn.reset);
        let (reset, consumed) = match (given, own_reset, &lease.pending_reset) {
            (Some(_), own, _) => (own, None),
            (None, own, Some((pending, at))) => (own.or(Some(*pending)), Some(*at)),
            (None, own, None) => (own, None),
        };
        // Before the reset, the agent writes what it must keep (once per turn).
        if let Some(reason) = reset {
            let correlation_id = turn
                .message
                .as_ref()
                .and_then(|m| m.inbound.as_ref())
                .map(|i| i.correlation_id.as_str())
                .unwrap_or(&attempt.correlation_id);
            let before = flush::Before {
                turn,
                session,
                call,
                call_timeout,
                agent,
                person_id: &person_id,
                reset: reason,
                correlation_id,
            };
            let flushed = self.flush_before_reset(&before, &mut lease).await;
            self.or_release(session, call, flushed).await?;
        }
        let notice = |text: &str| match reset {
            Some(r) => format!("{}\n\n{text}", self.notices.for_reason(r)),
            None => text.to_string(),
        };
        let settlement = |text: String, engine_session_id: String, next| Settlement {
            reply: StoredReply {
                reply_id: Uuid::now_v7(),
                text,
                engine_session_id,
                processing_ms: 0,
                tool_calls_count: 0,
                reset,
                answers: Vec::new(),
            },
            next,
            first: turn.seq,
            // A pending reset applied here is cleared unless a newer one came meanwhile.
            consumed,
            recall: None,
        };

        // A message the agent started, or one Switchboard answered itself, has its answer: no
        // runner call, the text is committed as the turn's reply, in the turn's place (after
        // the replies before it).
        if let Some(text) = given {
            let mut text = text.to_string();
            // `/remember <text>` (answered by identify): kept in the person's memory here, in
            // the turn's order, once however often the turn is redelivered; the answer says so
            // when the memory was too full to keep it all.
            let inbound = turn.message.as_ref().and_then(|m| m.inbound.as_ref());
            if let Some(inbound) = inbound.filter(|i| i.is_from_person())
                && let Some(remembered) =
                    switchboard_kit::lifecycle::remember_command(&inbound.text)
            {
                let kept = self
                    .memories
                    .remember(
                        session,
                        &inbound.id,
                        &person_id,
                        &turn.agent_identity,
                        remembered,
                    )
                    .await
                    .map_err(DispatchError::from);
                let kept = self.or_release(session, call, kept).await?;
                if let Some(shortfall) = kept.shortfall(self.memories.max_chars()) {
                    text = shortfall;
                }
            }
            let next = if reset.is_some() {
                NextEngineSession::Cleared
            } else {
                NextEngineSession::Keep
            };
            let s = settlement(notice(&text), String::new(), next);
            return self.settle(turn, session, after, call, s).await.map(retold);
        }
        // `/new` alone: the reset is the whole turn; the next message starts the engine
        // session.
        if own_reset == Some(ResetReason::Command)
            && prompt::person_text(turn, &self.prompt).is_empty()
        {
            let text = self.notices.for_reason(ResetReason::Command).to_string();
            let s = settlement(text, String::new(), NextEngineSession::Cleared);
            return self.settle(turn, session, after, call, s).await.map(retold);
        }

        if let (Some(folder), Some((summary, _))) = (&lease.workspace, &lease.summary)
            && let Err(e) =
                switchboard_kit::workspace::refresh_summary(std::path::Path::new(folder), summary)
                    .await
        {
            // The prompt carries the summary anyway.
            tracing::warn!(%session, error = %e, "could not write summary.md in the workspace");
        }
        // The person's curated memory, as the agent reads and edits it this turn.
        let memory_file = lease.workspace.as_ref().map(std::path::PathBuf::from);
        if let Some(folder) = &memory_file {
            let body = lease.memory.as_ref().map(|m| m.body.as_str()).unwrap_or("");
            if let Err(e) = switchboard_kit::workspace::refresh_memory(folder, body).await {
                // The prompt carries the memory anyway; an edit of the agent's is not read back
                // from a file we could not write.
                tracing::warn!(%session, error = %e, "could not write memory.md in the workspace");
            }
        }
        // While the runner is down, only the breaker's probe calls it; the turns of sessions
        // told of the outage wait. A session not told yet calls once itself (a check, which
        // leaves the probes' schedule alone): this process's breaker may still be open after
        // another replica found the runner back, and nobody is told the agent is unavailable
        // on a stale word, only after their own turn found it down.
        // A wait for the runner ends when this process finds it back (taken before the
        // breaker is asked and the runner called, so a recovery in between is not missed).
        let recovery = Wake::new(self.breakers.recovery(&agent.runner_url));
        let check = match self.breakers.admit(&agent.runner_url, Instant::now()) {
            breaker::Admission::Call => false,
            breaker::Admission::Wait(after) if lease.waiting_notice.is_some() => {
                return Err(self
                    .wait_for_runner(turn, session, call, after, recovery, attempt)
                    .await);
            }
            breaker::Admission::Wait(_) => true,
        };
        // The turn can run now: is it older than turns may get?
        let now = Utc::now();
        let stale = turn_age(turn, now).filter(|age| {
            self.config.max_turn_age_s > 0
                && *age > chrono::Duration::seconds(self.config.max_turn_age_s as i64)
        });
        if stale.is_some() {
            metrics::counter!("sb_dispatch_stale_turns_total").increment(1);
        }
        // Messages that arrived while the previous turn ran join this call (collect,
        // interrupt); the reply is committed at the last of them.
        let mut group = vec![turn.clone()];
        let mut interrupts = 0;
        if agent.queue_mode.joins() && stale.is_none() {
            let joinable = self.joinable(session, turn).await;
            let (joined, cancelled) = self.or_release(session, call, joinable).await?;
            group.extend(joined);
            interrupts = cancelled;
        }
        let last = group.last().expect("the turn itself").clone();
        if group.len() > 1 {
            metrics::counter!("sb_dispatch_joined_messages_total").increment(group.len() as u64);
        }
        let kept = self
            .keep_attachments(&group, lease.workspace.as_deref())
            .await;
        let attachments = self.or_release(session, call, kept).await?;
        let held_by = match (reset, &lease.engine_session) {
            (None, Some(engine)) => Some((session, engine.as_str())),
            _ => None,
        };
        let recalled = self
            .recall
            .for_call(&group, &person_id, &turn.agent_identity, held_by)
            .await;
        let prompt = prompt::build_joined_prompt(
            &group,
            &prompt::PromptContext {
                attachments: &attachments,
                config: &self.prompt,
                summary: lease.summary.as_ref().map(|(s, at)| (s.as_str(), *at)),
                memory: lease
                    .memory
                    .as_ref()
                    .map(|m| (m.body.as_str(), m.updated_at)),
                recall: recalled.as_ref().and_then(|r| r.block.as_deref()),
                reset,
                now,
                stale: stale.is_some(),
            },
        );
        let correlation = turn
            .message
            .as_ref()
            .and_then(|m| m.inbound.as_ref())
            .map(|i| i.correlation_id.as_str())
            .unwrap_or(&attempt.correlation_id);
        let minted = self
            .credentials
            .for_turn(agent, &person_id, &session.to_string(), correlation)
            .await
            .map_err(DispatchError::from);
        let (turn_token, api_url) = self.or_release(session, call, minted).await?;
        let request = RunRequest {
            turn_token: Some(turn_token),
            api_url: Some(api_url),
            agent: &agent.name,
            prompt: &prompt,
            session_id: if reset.is_some() {
                None
            } else {
                lease.engine_session.as_deref()
            },
            correlation_id: correlation,
            workspace: lease.workspace.as_deref(),
            queue_mode: agent.queue_mode.as_str(),
        };
        if let Some(waited) = stale
            && self.config.stale_turns == StaleTurns::Expire
        {
            if !check {
                self.breakers
                    .probe_unused(&agent.runner_url, Instant::now());
            }
            if let Err(db) = self.release_call(session, call).await {
                tracing::warn!(%session, error = %db, "could not release the call slot");
            }
            return Err(DispatchError::Expired {
                waited,
                max_s: self.config.max_turn_age_s,
            });
        }
        let mut key = if group.len() > 1 {
            format!("turn:{session}:{}-{}", turn.seq, last.seq)
        } else {
            format!("turn:{session}:{}", turn.seq)
        };
        // A call cancelled at the runner keeps its answer (`cancelled`) under its key.
        if interrupts > 0 {
            key.push_str(&format!("~{interrupts}"));
        }
        if agent.queue_mode == QueueMode::Interrupt {
            // What a message arriving now cancels.
            let marked = sqlx::query(
                "UPDATE switchboard.sessions SET running_key = $3, running_last = $4
                  WHERE id = $1 AND running_call = $2",
            )
            .bind(session)
            .bind(call)
            .bind(&key)
            .bind(last.seq)
            .execute(&self.db)
            .await
            .map_err(DispatchError::from);
            self.or_release(session, call, marked).await?;
        }
        let started = Instant::now();
        let resp = match self.runner.run(agent, &request, &key).await {
            Ok(resp) => {
                self.breakers.succeeded(&agent.runner_url);
                resp
            }
            Err(e) if e.means_runner_down() => {
                // A check call's failure is not the breaker's (it would push the next probe
                // back). This replica's breaker opens on its own failures only; a session already
                // waiting on this outage (recorded by another replica) waits here too, so a turn
                // handed between dispatchers does not spend its failure budget on the outage.
                if check
                    || self.breakers.failed(&agent.runner_url, Instant::now())
                    || lease.waiting_notice.is_some()
                {
                    let after = Duration::from_millis(self.config.breaker_probe_ms.max(10));
                    return Err(self
                        .wait_for_runner(turn, session, call, after, recovery, attempt)
                        .await);
                }
                // Best effort: a lease left behind only delays this turn's retry until it ends.
                if let Err(db) = self.release_call(session, call).await {
                    tracing::warn!(%session, error = %db, "could not release the call slot");
                }
                return Err(e.into());
            }
            Err(RunnerError::Cancelled) => {
                // Interrupted by a newer message: run again at once, joined with it.
                self.breakers.succeeded(&agent.runner_url);
                let forgotten = self.interrupted(session, call, turn.seq).await;
                self.or_release(session, call, forgotten).await?;
                return Err(DispatchError::Interrupted { seq: turn.seq });
            }
            Err(e) => {
                // The turn's own problem (an engine error, a timeout); an answer says the
                // runner is up.
                if !matches!(e, RunnerError::Unavailable(_)) {
                    self.breakers.succeeded(&agent.runner_url);
                }
                if let Err(db) = self.release_call(session, call).await {
                    tracing::warn!(%session, error = %db, "could not release the call slot");
                }
                return Err(e.into());
            }
        };
        if let Some(folder) = &memory_file {
            let _ = self
                .keep_agent_memory(
                    session,
                    call,
                    &person_id,
                    &turn.agent_identity,
                    &lease,
                    folder,
                )
                .await;
        }
        let processing_ms = if resp.processing_ms > 0 {
            resp.processing_ms
        } else {
            started.elapsed().as_millis() as i64
        };
        let mut s = settlement(
            notice(&resp.text),
            resp.session_id,
            NextEngineSession::Answered,
        );
        s.reply.processing_ms = processing_ms;
        s.reply.tool_calls_count = resp.tool_calls_count;
        s.recall = recalled.map(|r| r.detail);
        if group.len() > 1 {
            s.reply.answers = group
                .iter()
                .filter_map(|t| t.message.as_ref()?.inbound.as_ref().map(|i| i.id.clone()))
                .collect();
        }
        self.settle(&last, session, after, call, s)
            .await
            .map(retold)
    }

    /// Store what the agent left in memory.md, if it changed it. A failure here does not fail
    /// the turn (the answer is given): it is logged and counted, and the file keeps the edit
    /// until the session's next turn. Returns what became of the edit (`None`: not read or
    /// not stored).
    async fn keep_agent_memory(
        &self,
        session: Uuid,
        call: Uuid,
        person_id: &str,
        identity: &str,
        lease: &Lease,
        folder: &std::path::Path,
    ) -> Option<switchboard_memory::curated::AgentWrite> {
        let body = match switchboard_kit::workspace::read_memory(folder).await {
            Ok(Some(body)) => body,
            Ok(None) => return Some(switchboard_memory::curated::AgentWrite::Unchanged),
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
                lease.memory.as_ref(),
                &body,
            )
            .await;
        match written {
            Ok(switchboard_memory::curated::AgentWrite::Conflict) => tracing::warn!(
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

    /// Keep what the messages carry besides text in the session's workspace; the prompt's
    /// lines for it.
    async fn keep_attachments(
        &self,
        group: &[Turn],
        workspace: Option<&str>,
    ) -> Result<Vec<String>, DispatchError> {
        let mut lines = Vec::new();
        for turn in group {
            let Some(inbound) = turn.message.as_ref().and_then(|m| m.inbound.as_ref()) else {
                continue;
            };
            let count = inbound.media_urls.len() + inbound.uploads.len();
            if count == 0 {
                continue;
            }
            let Some(folder) = workspace.map(std::path::Path::new) else {
                lines.push(format!(
                    "{count} attachment(s) not kept: no workspace is configured"
                ));
                continue;
            };
            if !inbound.media_urls.is_empty() {
                let kept = self
                    .media
                    .keep(folder, &inbound.id, &inbound.media_urls)
                    .await;
                lines.extend(kept.iter().map(attachments::Fetched::describe));
            }
            if !inbound.uploads.is_empty() {
                let kept = self
                    .uploads
                    .keep(
                        folder,
                        &inbound.id,
                        &inbound.sender,
                        &inbound.uploads,
                        inbound.media_urls.len(),
                    )
                    .await?;
                lines.extend(kept.iter().map(attachments::Fetched::describe));
            }
        }
        Ok(lines)
    }

    /// The turn's call was cancelled at the runner: forget the group it planned (the next call
    /// joins what is waiting now), count the cancellation (the next call's key differs) and
    /// give the call slot back.
    async fn interrupted(&self, session: Uuid, call: Uuid, head: i64) -> Result<(), DispatchError> {
        let mut tx = self.db.begin().await?;
        sqlx::query(
            "UPDATE switchboard.turns
                SET joined_into = NULL,
                    interrupts = interrupts + CASE WHEN seq = $2 THEN 1 ELSE 0 END
              WHERE session_id = $1 AND seq >= $2 AND status = 'open'",
        )
        .bind(session)
        .bind(head)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE switchboard.sessions
                SET running_call = NULL, running_by = NULL, running_until = NULL, status = 'idle',
                    running_key = NULL, running_last = NULL, running_interrupted = false
              WHERE id = $1 AND running_call = $2",
        )
        .bind(session)
        .bind(call)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.wakers.wake(session);
        metrics::counter!("sb_dispatch_calls_interrupted_total").increment(1);
        Ok(())
    }

    /// Queue mode interrupt: a message that could join the next call cancels the session's
    /// running call at the runner, once per call, unless that call already carries it.
    async fn interrupt_running_call(&self, session: Uuid, turn: &Turn, agent: &AgentConfig) {
        if turn.given_answer().is_some() || !turn.reset.is_empty() {
            return;
        }
        let key: Result<Option<String>, sqlx::Error> = sqlx::query_scalar(
            "UPDATE switchboard.sessions SET running_interrupted = true
              WHERE id = $1 AND running_call IS NOT NULL AND running_key IS NOT NULL
                AND NOT running_interrupted AND running_last < $2 AND running_until > now()
             RETURNING running_key",
        )
        .bind(session)
        .bind(turn.seq)
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

    /// The session's messages waiting right after `head` that one call may answer with it: the
    /// group planned by an earlier attempt at `head` (so a retry makes the same call, under
    /// the same Idempotency-Key), else the open turns that follow it without a gap, up to
    /// `dispatch.collect_max`, stopping at one that must stand alone (answered without the
    /// agent, or starting a fresh engine session). The plan is recorded before the call, a
    /// plan to go alone too (`joined_into` = `head.seq`).
    /// Also returns how many of `head`'s calls were cancelled (interrupt).
    async fn joinable(
        &self,
        session: Uuid,
        head: &Turn,
    ) -> Result<(Vec<Turn>, i32), DispatchError> {
        let (planned, interrupts): (Option<i64>, i32) = sqlx::query_as(
            "SELECT joined_into, interrupts FROM switchboard.turns
              WHERE session_id = $1 AND seq = $2",
        )
        .bind(session)
        .bind(head.seq)
        .fetch_optional(&self.db)
        .await?
        .unwrap_or((None, 0));
        let rows: Vec<(i64, Option<Vec<u8>>, Option<ResetReason>)> = match planned {
            // Planned alone.
            Some(last) if last <= head.seq => Vec::new(),
            Some(last) => {
                sqlx::query_as(
                    "SELECT seq, payload, reset FROM switchboard.turns
                      WHERE session_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq",
                )
                .bind(session)
                .bind(head.seq)
                .bind(last)
                .fetch_all(&self.db)
                .await?
            }
            _ => {
                sqlx::query_as(
                    "SELECT seq, payload, reset FROM switchboard.turns
                      WHERE session_id = $1 AND seq > $2 AND status = 'open'
                      ORDER BY seq LIMIT $3",
                )
                .bind(session)
                .bind(head.seq)
                .bind(self.config.collect_max.saturating_sub(1).max(1) as i64)
                .fetch_all(&self.db)
                .await?
            }
        };
        let mut joined = Vec::new();
        for (next, (seq, payload, reset)) in (head.seq + 1..).zip(rows) {
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
            joined.push(turn);
        }
        // A call that goes alone records that too (`joined_into` = its own seq): a retry after
        // its dispatcher died must not join messages that arrived meanwhile (another key,
        // so the runner would run the agent twice on `head`).
        if planned.is_none() {
            let last = joined.last().map_or(head.seq, |t| t.seq);
            sqlx::query(
                "UPDATE switchboard.turns SET joined_into = $3
                  WHERE session_id = $1 AND seq >= $2 AND seq <= $3 AND status = 'open'",
            )
            .bind(session)
            .bind(head.seq)
            .bind(last)
            .execute(&self.db)
            .await?;
        }
        Ok((joined, interrupts))
    }

    /// The turn waits for its agent's runner to come back: the call slot is given back, the
    /// session says `waiting`, and the person is told, once per outage (the notice's id is
    /// kept until the session's next answer, so telling again is the same message).
    async fn wait_for_runner(
        &self,
        turn: &Turn,
        session: Uuid,
        call: Uuid,
        after: Duration,
        recovery: Wake,
        attempt: &Attempt,
    ) -> DispatchError {
        let fresh = Uuid::now_v7();
        let marked: Result<Option<(Uuid, bool)>, sqlx::Error> = async {
            let mut tx = self.db.begin().await?;
            let marked: Option<(Uuid, bool)> = sqlx::query_as(
                "UPDATE switchboard.sessions
                    SET running_call = NULL, running_by = NULL, running_until = NULL,
                        status = 'waiting', waiting_since = COALESCE(waiting_since, now()),
                        waiting_notice = COALESCE(waiting_notice, $3)
                  WHERE id = $1 AND running_call = $2
                 RETURNING waiting_notice, waiting_notice = $3",
            )
            .bind(session)
            .bind(call)
            .bind(fresh)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some((notice, true)) = marked {
                let entry = Journal::new(
                    session,
                    format!("waiting:{session}:{notice}"),
                    "waiting",
                    turn.seq,
                    serde_json::json!({ "notice_id": notice }),
                );
                Journal::write(&mut tx, &[entry]).await?;
            }
            tx.commit().await?;
            // A dispatcher killed here recorded the wait and never told the person: the
            // turn's redelivery tells them (tests/tests/ordered_dispatch.rs).
            switchboard_kit::failpoint::crash_at("dispatch.wait_recorded");
            Ok(marked)
        }
        .await;
        self.wakers.wake(session);
        let notice = match marked {
            // Told when the outage began for this session, or again after a redelivery (the
            // first telling may not have been published): the same notice either way.
            Ok(Some((notice, first))) if first || attempt.waits == 0 => {
                let text = self.config.runner_down_notice.clone();
                vec![self.notice_output(turn, session, notice, text)]
            }
            Ok(_) => Vec::new(),
            Err(e) => {
                tracing::warn!(%session, error = %e, "could not mark the session waiting");
                Vec::new()
            }
        };
        metrics::counter!("sb_dispatch_turns_waiting_for_runner_total").increment(1);
        DispatchError::RunnerDown {
            after,
            notice,
            recovery,
        }
    }

    /// Record that the turn expired and tell the person (the notice's id is kept in the
    /// journal entry, so a repeated give-up tells the same message).
    async fn expired(
        &self,
        turn: &Turn,
        session: Uuid,
        reason: &str,
    ) -> Result<Vec<Output>, DispatchError> {
        let notice: String = sqlx::query_scalar(
            "INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
             VALUES ($1, $2, $3, 'expired', $4,
                     jsonb_build_object('notice_id', $5::text, 'reason', $6::text))
             ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key
             RETURNING detail->>'notice_id'",
        )
        .bind(Uuid::now_v7())
        .bind(session)
        .bind(format!("expired:{session}:{}", turn.seq))
        .bind(turn.seq)
        .bind(Uuid::now_v7().to_string())
        .bind(reason)
        .fetch_one(&self.db)
        .await?;
        let notice: Uuid = notice.parse().unwrap_or_else(|_| Uuid::now_v7());
        let sent = turn
            .message
            .as_ref()
            .and_then(|m| m.inbound.as_ref())
            .and_then(|i| DateTime::from_timestamp_millis(i.received_at_ms))
            .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
            .unwrap_or_else(|| "earlier".into());
        let text = self.config.expired_notice.replace("{sent}", &sent);
        Ok(vec![self.notice_output(turn, session, notice, text)])
    }

    fn notice_output(&self, turn: &Turn, session: Uuid, notice: Uuid, text: String) -> Output {
        let stored = StoredReply {
            reply_id: notice,
            text,
            engine_session_id: String::new(),
            processing_ms: 0,
            tool_calls_count: 0,
            reset: None,
            answers: Vec::new(),
        };
        let reply = Reply {
            kind: "notice".into(),
            ..self.reply_message(turn, session, &stored)
        };
        // Its own dedupe id: the turn's answer comes later under the turn's.
        Output::new(self.topology.reply(), format!("notice:{notice}"), &reply)
            .correlated(reply.correlation_id.clone())
    }

    /// Commit the turn's answer (compare-and-set on the cursor and the call slot) and return
    /// what to publish: this reply, or the one another call of the turn committed.
    async fn settle(
        &self,
        turn: &Turn,
        session: Uuid,
        after: i64,
        call: Uuid,
        settlement: Settlement,
    ) -> Result<Vec<Output>, DispatchError> {
        // The agent has answered: a database hiccup must not make it answer again, so the
        // commit is tried again for a while before the turn fails (and is run again).
        let committed = match retry::until(
            Instant::now() + COMMIT_RETRY_FOR,
            Backoff::new(Duration::from_millis(50), Duration::from_secs(2)),
            "storing the agent's reply",
            || self.commit(session, turn.seq, after, call, &settlement),
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
            return Ok(self.outputs(turn, session, &settlement.reply));
        }
        self.release_call(session, call).await?;
        match self.stored_reply(session, turn.seq).await {
            // Another call of this turn committed while we ran it: its answer stands.
            Ok(stored) => {
                tracing::warn!(%session, seq = turn.seq, "turn committed elsewhere; re-emitting that reply");
                Ok(self.outputs(turn, session, &stored))
            }
            Err(DispatchError::JoinedInto { .. }) => Ok(Vec::new()),
            // Another call of this turn holds the slot and is still running: its answer will
            // stand; come back for it.
            Err(DispatchError::FailedEarlier { .. }) => {
                Err(DispatchError::Superseded { seq: turn.seq })
            }
            Err(e) => Err(e),
        }
    }
}

/// How long ago the turn's message was received (`None`: it does not say).
fn turn_age(turn: &Turn, now: DateTime<Utc>) -> Option<chrono::Duration> {
    let received = turn.message.as_ref()?.inbound.as_ref()?.received_at_ms;
    if received <= 0 {
        return None;
    }
    Some(now.signed_duration_since(DateTime::from_timestamp_millis(received)?))
}

/// A turn's answer, ready to commit.
struct Settlement {
    reply: StoredReply,
    next: NextEngineSession,
    /// The pending reset this turn applied: when it was asked for.
    consumed: Option<Option<DateTime<Utc>>>,
    /// The first turn the call answered (earlier than the committed one when it joined
    /// several: those are done, joined into it).
    first: i64,
    /// What the call's prompt recalled (the journal's `recall` entry).
    recall: Option<serde_json::Value>,
}

impl Stage for TurnDispatcher {
    type Input = Turn;
    /// Each turn mostly waits on a runner: many at once per process (agents' own
    /// `concurrency` still caps each agent).
    const SPEC: StageSpec = StageSpec::new("dispatch", Source::Work("turn.>")).concurrency(256);

    async fn handle(&self, turn: Turn, attempt: &Attempt) -> Result<Vec<Output>, StageError> {
        // A turn of a person forgotten since their message arrived is not run, and what it
        // made while they were being forgotten (a reply, a failure) is dropped.
        if self.forgotten(&turn).await? {
            return Ok(Vec::new());
        }
        let result = self.dispatch_turn(&turn, attempt).await;
        if self.forgotten(&turn).await? {
            return Ok(Vec::new());
        }
        match result {
            Ok(out) => Ok(out),
            Err(DispatchError::RunnerDown {
                after,
                notice,
                recovery,
            }) => Err(StageError::Outage {
                after,
                why: "the agent's runner is down".into(),
                outputs: notice,
                wake: Some(recovery),
            }),
            Err(e @ DispatchError::Interrupted { .. }) => {
                Err(StageError::Defer(Duration::from_millis(10), e.to_string()))
            }
            Err(DispatchError::NotYet { seq, next, wake }) => {
                // Behind a turn that waits for a down runner, a turn waits as long as it does.
                let outage = self
                    .agents
                    .get(&turn.agent_name)
                    .is_some_and(|(a, _)| self.breakers.is_down(&a.runner_url));
                Err(StageError::Wait {
                    at_most: Duration::from_millis(self.config.hold_timeout_ms),
                    why: format!("turn {seq} waits for turn {next}"),
                    outage,
                    wake,
                })
            }
            Err(e @ DispatchError::Superseded { .. }) => Err(StageError::Defer(
                Duration::from_millis(self.config.hold_poll_ms),
                e.to_string(),
            )),
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
        cause: &GiveUp,
    ) -> Result<Vec<Output>, StageError> {
        let Ok(session) = turn.session_id.parse::<Uuid>() else {
            return Ok(Vec::new());
        };
        let reset = ResetReason::parse(&turn.reset);
        let reason = cause.to_string();
        match self.mark_failed(session, turn.seq, reset, &reason).await {
            // An expired turn is not silent: the person is told, in the turn's place.
            Ok(true) if expired(cause) => self
                .expired(turn, session, &reason)
                .await
                .map_err(StageError::transient),
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

impl TurnDispatcher {
    /// Whether the turn's person was forgotten after its message was received (counted).
    async fn forgotten(&self, turn: &Turn) -> Result<bool, StageError> {
        let msg = turn.message.as_ref();
        let person = msg
            .and_then(|m| m.person.as_ref())
            .map_or("", |p| &p.person_id);
        let received = msg
            .and_then(|m| m.inbound.as_ref())
            .map_or(0, |i| i.received_at_ms);
        let received = switchboard_kit::forgotten::received_at(received);
        let gone = switchboard_kit::forgotten::received_before(&self.db, person, received)
            .await
            .map_err(|e| StageError::transient(DispatchError::from(e)))?;
        if gone {
            switchboard_kit::forgotten::dropped("dispatch", "turn");
        }
        Ok(gone)
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
    let stage = Arc::new(TurnDispatcher::new(app.db.clone(), app.topology.clone(), c));
    let run = app.shared_stage_task(stage.clone());
    let scheduler = schedule::Scheduler::new(
        app.db.clone(),
        app.runtime(),
        app.topology.clone(),
        &c.schedules,
        Duration::from_millis(c.dispatch.schedule_tick_ms),
        Duration::from_secs(c.dispatch.schedule_lateness_s),
    );
    // Heartbeat until the stage has drained (in-flight calls still hold their leases).
    Box::pin(async move {
        let result = tokio::select! {
            r = run => r,
            _ = stage.keep_alive() => unreachable!("keep_alive never returns"),
            _ = stage.watch_sessions() => unreachable!("watch_sessions never returns"),
            _ = scheduler.run() => unreachable!("the scheduler never returns"),
        };
        stage.retire().await;
        result
    })
}

#[cfg(test)]
mod tests;
