//! A session's call slot (`sessions.running_call`): before calling the runner a dispatcher
//! leases it, so two calls of one session never overlap. The lease holds while the dispatcher
//! process is alive (it heartbeats in `switchboard.dispatchers`) and the call's deadline has not
//! passed; a crashed dispatcher's leases end with its heartbeat.
//!
//! A [`CallLease`] is given back in exactly one place, [`CallLease::finish`], once the turn is
//! over (unless the statement that settled the call cleared the slot itself, in the same
//! transaction).
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use switchboard_kit::config::SessionScope;
use switchboard_kit::status::{ResetReason, SessionEventKind, SessionStatus};
use switchboard_memory::curated::CuratedMemory;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use crate::DispatchError;
use crate::wakers::Wakers;

/// A runner call's lease outlives the agent's timeout by this much, so only a call that is
/// certainly over (or whose dispatcher is dead) lets the next one start.
pub(crate) const CALL_DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// What taking a session's call slot tells the turn about its session.
pub(crate) struct SessionAtCall {
    /// The engine session to resume (`None`: a new one).
    pub engine_session: Option<String>,
    /// A reset asked for outside the conversation, and when (it is cleared only if unchanged).
    pub pending_reset: Option<(ResetReason, Option<DateTime<Utc>>)>,
    pub workspace: Option<String>,
    /// The identity's summary and when it was written.
    pub summary: Option<(String, DateTime<Utc>)>,
    /// The notice that told the person of the runner's outage this session waits out.
    pub waiting_notice: Option<Uuid>,
    /// The turn's person's curated memory of the identity (memory.md), as the turn found it.
    pub memory: Option<CuratedMemory>,
    /// The session is shared by everyone who writes to the agent (`session.scope = "main"`):
    /// nothing person-private (curated memory, recall, summary) goes into it, because every
    /// next sender continues the engine session that would hold it.
    pub shared: bool,
}

/// Whether `turn`'s session is one everyone who writes to the agent continues (scope `main`),
/// as its scope key says. A heartbeat's session is its schedule's own, never shared.
pub(crate) fn shared_by_everyone(turn: &switchboard_kit::proto::Turn) -> bool {
    turn.scope_key == SessionScope::Main.key(&turn.agent_name, "", "", "", "")
}

/// What taking the call slot reads, as one row.
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

impl LeaseRow {
    fn into_session(self, person_id: &str, shared: bool) -> SessionAtCall {
        let memory = match (
            self.memory,
            self.memory_version,
            self.memory_by,
            self.memory_at,
            self.memory_identity,
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
        // A shared session's summary is written from everyone's messages, and the curated
        // memory is the sender's own: neither is loaded into it (seed 004, layer 3: long-term
        // memory in private sessions only).
        let (memory, summary) = if shared {
            (None, None)
        } else {
            (memory, self.summary.zip(self.summary_at))
        };
        SessionAtCall {
            engine_session: self.engine_session_id,
            pending_reset: self.pending_reset.map(|r| (r, self.pending_reset_at)),
            workspace: self.workspace_path,
            summary,
            waiting_notice: self.waiting_notice,
            memory,
            shared,
        }
    }
}

/// The turn whose call would take the slot.
pub(crate) struct CallFor<'a> {
    pub session: Uuid,
    pub seq: i64,
    /// The cursor value the turn commits against: its predecessor, or itself when a failed
    /// latest turn is run again.
    pub after: i64,
    pub timeout: Duration,
    pub person_id: &'a str,
    /// The session is shared by everyone ([`shared_by_everyone`]).
    pub shared: bool,
}

/// This process as the holder of runner-call leases: its heartbeat keeps them alive.
pub(crate) struct CallSlots {
    id: Uuid,
    /// When this process last told `dispatchers` it is alive (ms since the Unix epoch).
    last_beat: AtomicI64,
    /// A connection of its own for heartbeats, so a busy pool cannot make a live dispatcher
    /// look dead to the others.
    beat_db: PgPool,
    db: PgPool,
    liveness: Duration,
    /// Checks a turn may repeat at will run at most the pool's size less two at once (see
    /// [`crate::turn_store::TurnStore`]).
    checks: Arc<Semaphore>,
    wakers: Wakers,
}

impl CallSlots {
    pub fn new(db: PgPool, liveness: Duration, checks: Arc<Semaphore>, wakers: Wakers) -> Self {
        // The heartbeat and the session watch each have a connection of their own: the turns
        // can use up the main pool under overload, and neither may wait behind them.
        let beat_db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with((*db.connect_options()).clone());
        Self {
            id: Uuid::new_v4(),
            last_beat: AtomicI64::default(),
            beat_db,
            db,
            liveness,
            checks,
            wakers,
        }
    }

    /// How long a lease outlives this process's last heartbeat.
    pub fn liveness(&self) -> Duration {
        self.liveness
    }

    /// The pool the heartbeat uses: for the session watch, which the turns may not starve.
    pub fn watch_db(&self) -> &PgPool {
        &self.beat_db
    }

    /// Tell the other dispatchers this process is alive (its runner-call leases hold).
    pub async fn heartbeat(&self) -> Result<(), DispatchError> {
        if self.last_beat.load(Ordering::Relaxed) == 0 {
            // First beat of this process: forget dispatchers long dead.
            sqlx::query!(
                "DELETE FROM switchboard.dispatchers WHERE alive_until < now() - interval '1 day'",
            )
            .execute(&self.beat_db)
            .await?;
        }
        sqlx::query!(
            "INSERT INTO switchboard.dispatchers (id, alive_until, instance)
             VALUES ($1, now() + $2 * interval '1 millisecond', $3)
             ON CONFLICT (id) DO UPDATE SET alive_until = EXCLUDED.alive_until",
            self.id,
            self.liveness.as_millis() as f64,
            switchboard_kit::instance_id(),
        )
        .execute(&self.beat_db)
        .await?;
        self.last_beat
            .store(switchboard_kit::now_ms(), Ordering::Relaxed);
        Ok(())
    }

    /// Heartbeat now unless a recent one still has half its liveness left (the keep-alive
    /// task beats every third, so this fires only before its first beat or when it is stuck).
    async fn ensure_alive(&self) -> Result<(), DispatchError> {
        let last = self.last_beat.load(Ordering::Relaxed);
        let fresh = (self.liveness.as_millis() / 2) as i64;
        if switchboard_kit::now_ms() - last > fresh {
            self.heartbeat().await?;
        }
        Ok(())
    }

    /// Heartbeat every third of the liveness window, for as long as the future runs.
    pub async fn keep_alive(&self) {
        loop {
            tokio::time::sleep(self.liveness / 3).await;
            if let Err(e) = self.heartbeat().await {
                tracing::warn!(error = %e, "dispatcher heartbeat failed");
            }
        }
    }

    /// This process makes no more runner calls: its leases end now, not at its liveness.
    pub async fn retire(&self) {
        let _ = sqlx::query!("DELETE FROM switchboard.dispatchers WHERE id = $1", self.id)
            .execute(&self.beat_db)
            .await;
    }

    /// Take the session's call slot for `call`'s turn, if the cursor is still at `call.after`
    /// and no live lease is held by another call. `None`: not taken. The journal records the
    /// call's start in the same statement. The lease keeps `agent_slot` (the agent's
    /// concurrency) until it is given back.
    pub async fn take(
        &self,
        call: &CallFor<'_>,
        agent_slot: OwnedSemaphorePermit,
    ) -> Result<Option<CallLease>, DispatchError> {
        self.ensure_alive().await?;
        let _admitted = self.checks.acquire().await.expect("never closed");
        let id = Uuid::now_v7();
        let leased = sqlx::query_as!(
            LeaseRow,
            r#"WITH leased AS (
                UPDATE switchboard.sessions s
                   SET running_call = $3, running_by = $4, status = $9,
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
                SELECT $6, id, $10::text || ':' || $3::text, $10, $7,
                       jsonb_build_object('call', $3::text, 'resumes', engine_session_id)
                  FROM leased
                ON CONFLICT (key) DO NOTHING),
             -- The turn's first pickup and by whom, set once (a redelivery keeps the first).
             -- Keyed by the parameters, not joined to `leased`: planned while `turns` was
             -- nearly empty, the join was a sequential scan of every turn, cached for good
             -- with the statement (one per turn in the bench, growing with the table).
             picked AS (
                UPDATE switchboard.turns t SET picked_at = now(), picked_by = $4
                 WHERE t.session_id = $1 AND t.seq = $7 AND t.picked_at IS NULL
                   AND EXISTS (SELECT 1 FROM leased))
             -- Every column may be NULL: those of the session's, and those of the joins.
             SELECT l.engine_session_id AS "engine_session_id?",
                    l.pending_reset AS "pending_reset?: ResetReason",
                    l.pending_reset_at AS "pending_reset_at?", l.workspace_path AS "workspace_path?",
                    m.summary AS "summary?", m.updated_at AS "summary_at?",
                    l.waiting_notice AS "waiting_notice?",
                    c.body AS "memory?", c.version AS "memory_version?",
                    c.updated_by AS "memory_by?", c.updated_at AS "memory_at?",
                    c.agent_identity AS "memory_identity?"
               FROM leased l
               LEFT JOIN switchboard.summaries m ON m.memory_key = l.memory_key
               -- The curated memory of the turn's person (not the session's: a session
               -- shared by everyone never shares anyone's memory).
               LEFT JOIN switchboard.memories c
                      ON c.person_id = $8 AND c.agent_identity = l.agent_identity"#,
            call.session,
            call.after,
            id,
            self.id,
            call.timeout.as_millis() as f64,
            Uuid::now_v7(),
            call.seq,
            call.person_id,
            SessionStatus::Running as SessionStatus,
            SessionEventKind::TurnStarted as SessionEventKind,
        )
        .fetch_optional(&self.db)
        .await?;
        Ok(leased.map(|row| CallLease {
            session: call.session,
            call: id,
            after: call.after,
            timeout: call.timeout,
            found: row.into_session(call.person_id, call.shared),
            db: self.db.clone(),
            wakers: self.wakers.clone(),
            held: true,
            _agent_slot: agent_slot,
        }))
    }
}

/// A runner call's hold on its session's call slot (and on a slot of its agent's concurrency).
pub(crate) struct CallLease {
    pub session: Uuid,
    /// This call (`sessions.running_call` while it holds the slot).
    pub call: Uuid,
    /// The cursor value the turn commits against.
    pub after: i64,
    /// How long the lease holds from its last renewal.
    pub timeout: Duration,
    /// The session as the lease found it.
    pub found: SessionAtCall,
    db: PgPool,
    wakers: Wakers,
    /// Whether the slot may still be this call's (false once given back or settled).
    held: bool,
    _agent_slot: OwnedSemaphorePermit,
}

impl CallLease {
    /// The statement that settled the call (its commit, the wait for the runner, the
    /// interruption) cleared the slot itself, in its own transaction.
    pub fn cleared(&mut self) {
        self.held = false;
    }

    /// Give the slot back now (another call of the turn committed, or the call is over); a
    /// slot taken over meanwhile by another call is left alone.
    pub async fn release(&mut self) -> Result<(), DispatchError> {
        if self.held {
            release(&self.db, self.session, self.call).await?;
            self.held = false;
            self.wakers.wake(self.session);
        }
        Ok(())
    }

    /// The turn is over: the slot is given back unless its settlement cleared it. When the
    /// database cannot be written (it is restarting), giving it back is tried again in the
    /// background until it is, or until the lease would have ended anyway: a slot left held
    /// by this live process would otherwise keep the session's next call (the same turn's
    /// retry, which may have a person to tell) waiting for the call's whole deadline.
    pub async fn finish(mut self) {
        let Err(e) = self.release().await else {
            return;
        };
        tracing::warn!(session = %self.session, error = %e,
            "could not release the call slot; trying again in the background");
        self.held = false; // handed to the retry below
        let (db, wakers, session, call) = (
            self.db.clone(),
            self.wakers.clone(),
            self.session,
            self.call,
        );
        let until = tokio::time::Instant::now() + self.timeout;
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(100);
            loop {
                tokio::time::sleep(delay).await;
                match release(&db, session, call).await {
                    Ok(()) => {
                        wakers.wake(session);
                        return;
                    }
                    Err(e) if tokio::time::Instant::now() >= until => {
                        tracing::warn!(%session, error = %e,
                            "gave up releasing the call slot; it lapses at its deadline");
                        return;
                    }
                    Err(_) => delay = (delay * 2).min(Duration::from_secs(1)),
                }
            }
        });
    }
}

impl Drop for CallLease {
    /// A lease dropped unfinished (the turn's future was dropped at shutdown, or panicked) is
    /// not given back here: its runner call may still be running at the agent host, so the
    /// slot lapses at the call's deadline, or at once when this process retires.
    fn drop(&mut self) {
        if self.held {
            tracing::debug!(session = %self.session, call = %self.call,
                "a call lease left unfinished holds until its deadline");
        }
    }
}

async fn release(db: &PgPool, session: Uuid, call: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE switchboard.sessions
            SET running_call = NULL, running_by = NULL, running_until = NULL, status = $3
          WHERE id = $1 AND running_call = $2",
        session,
        call,
        SessionStatus::Idle as SessionStatus,
    )
    .execute(db)
    .await?;
    Ok(())
}
