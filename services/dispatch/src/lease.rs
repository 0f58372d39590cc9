//! A session's call slot (`sessions.running_call`): before calling the runner a dispatcher
//! leases it, so two calls of one session never overlap. The lease holds while the dispatcher
//! process is alive (it heartbeats in `switchboard.dispatchers`) and the call's deadline has not
//! passed; a crashed dispatcher's leases end with its heartbeat.
//!
//! A [`CallLease`] is given back in exactly one place, [`CallLease::finish`], once the turn is
//! over (unless the statement that settled the call cleared the slot itself, in the same
//! transaction). A take whose answer never came back (the database went away) gives back
//! whatever it may have taken, in the background.
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use switchboard_kit::coalesce::Coalescer;
use switchboard_kit::config::SessionScope;
use switchboard_kit::db::answer_group;
use switchboard_kit::status::{ResetReason, SessionEventKind, SessionStatus};
use switchboard_memory::curated::CuratedMemory;
use tokio::sync::OwnedSemaphorePermit;
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
    /// The operator's takeover holding the session ([`switchboard_kit::takeovers`]): its
    /// turns are held, not given to the agent.
    pub takeover: Option<Uuid>,
    /// A takeover ended that the agent was not told of yet: the call's prompt retells it.
    pub unbriefed: bool,
}

/// Whether `turn`'s session is one everyone who writes to the agent continues (scope `main`),
/// as its scope key says. A heartbeat's session is its schedule's own, never shared.
pub(crate) fn shared_by_everyone(turn: &switchboard_kit::proto::Turn) -> bool {
    turn.scope_key == SessionScope::Main.key(&turn.agent_name, "", "", "", "")
}

/// What taking the call slot reads, as one row.
#[derive(sqlx::FromRow)]
struct LeaseRow {
    /// The call that took it.
    call: Uuid,
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
    takeover: Option<Uuid>,
    unbriefed: bool,
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
            takeover: self.takeover,
            unbriefed: self.unbriefed,
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
    wakers: Wakers,
    /// The slot takes asked for together.
    takes: Takes,
}

impl CallSlots {
    pub fn new(db: PgPool, liveness: Duration, wakers: Wakers) -> Self {
        // The heartbeat and the session watch each have a connection of their own: the turns
        // can use up the main pool under overload, and neither may wait behind them.
        let beat_db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with((*db.connect_options()).clone());
        let id = Uuid::new_v4();
        Self {
            id,
            takes: takes(db.clone(), id),
            last_beat: AtomicI64::default(),
            beat_db,
            db,
            liveness,
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
    /// concurrency) until it is given back. Takes asked for together go in one statement
    /// ([`take_all`]).
    pub async fn take(
        &self,
        call: &CallFor<'_>,
        agent_slot: OwnedSemaphorePermit,
    ) -> Result<Option<CallLease>, DispatchError> {
        self.ensure_alive().await?;
        let id = Uuid::now_v7();
        let mut asked = self
            .takes
            .call(Take {
                session: call.session,
                after: call.after,
                call: id,
                timeout_ms: call.timeout.as_millis() as f64,
                seq: call.seq,
                person_id: call.person_id.to_string(),
            })
            .await
            .map_err(DispatchError::from)
            .and_then(|taken| taken);
        if matches!(asked, Ok(Some(_)))
            && switchboard_kit::failpoint::lose_once_at("dispatch.take_answered")
        {
            asked = Err(DispatchError::Database(sqlx::Error::Io(
                std::io::ErrorKind::ConnectionReset.into(),
            )));
        }
        let leased = match asked {
            Ok(leased) => leased,
            Err(e) => {
                // The statement may have committed with only its answer lost (the database
                // went down as it replied): the slot would be held by this live process for
                // no call until the call's deadline, and the turn's retry, which may have a
                // person to tell of a down runner, kept waiting that long (a chaos run's
                // people never told). Given back once the database answers; a no-op when
                // it was never taken (only this call's lease is cleared).
                release_in_background(
                    self.db.clone(),
                    self.wakers.clone(),
                    call.session,
                    id,
                    call.timeout,
                );
                return Err(e);
            }
        };
        Ok(leased.map(|row| CallLease {
            session: call.session,
            call: id,
            after: call.after,
            timeout: call.timeout,
            found: row.into_session(call.person_id, call.shared),
            db: self.db.clone(),
            wakers: self.wakers.clone(),
            held: true,
            unreachable: false,
            _agent_slot: agent_slot,
        }))
    }
}

/// One call's ask for its session's slot.
struct Take {
    session: Uuid,
    after: i64,
    call: Uuid,
    timeout_ms: f64,
    seq: i64,
    person_id: String,
}

type Takes = Coalescer<Take, Result<Option<LeaseRow>, DispatchError>>;

/// Takes asked for together, in one statement; a session asked twice (a turn and its
/// redelivery) is taken alone, after; a failed statement as [`answer_group`] says.
fn takes(db: PgPool, dispatcher: Uuid) -> Takes {
    Coalescer::new(128, 2, move |batch: Vec<Take>| {
        let db = db.clone();
        async move {
            let mut sessions = std::collections::HashSet::new();
            let (firsts, repeats): (Vec<usize>, Vec<usize>) =
                (0..batch.len()).partition(|&i| sessions.insert(batch[i].session));
            let group: Vec<&Take> = firsts.iter().map(|&i| &batch[i]).collect();
            let together = take_all(&db, dispatcher, &group)
                .await
                .map(|mut rows| group.iter().map(|t| rows.remove(&t.call)).collect());
            let mut answers: Vec<Option<Result<Option<LeaseRow>, DispatchError>>> =
                (0..batch.len()).map(|_| None).collect();
            let grouped = answer_group(&group, together, |k| take_one(&db, dispatcher, group[k]));
            for (&i, answer) in firsts.iter().zip(grouped.await) {
                answers[i] = Some(answer.map_err(DispatchError::from));
            }
            for i in repeats {
                let answer = take_one(&db, dispatcher, &batch[i]).await;
                answers[i] = Some(answer.map_err(DispatchError::from));
            }
            answers.into_iter().map(|a| a.expect("answered")).collect()
        }
    })
}

/// Take one slot on its own; what the take found, if it took it.
async fn take_one(
    db: &PgPool,
    dispatcher: Uuid,
    ask: &Take,
) -> Result<Option<LeaseRow>, sqlx::Error> {
    Ok(take_all(db, dispatcher, &[ask]).await?.remove(&ask.call))
}

/// Take the slots `asks` ask for (no session twice), recording each call's start and its
/// turn's first pickup; what each taken one found, by call.
async fn take_all(
    db: &PgPool,
    dispatcher: Uuid,
    asks: &[&Take],
) -> Result<HashMap<Uuid, LeaseRow>, sqlx::Error> {
    let mut asks = asks.to_vec();
    // Sessions are locked in one order by every batch.
    asks.sort_unstable_by_key(|a| a.session);
    let rows: Vec<LeaseRow> = sqlx::query_as(
        r#"WITH input AS (
             SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::uuid[], $4::float8[],
                                  $5::uuid[], $6::bigint[], $7::text[])
               AS i(session_id, after, call, timeout_ms, event_id, seq, person_id)),
           leased AS (
             UPDATE switchboard.sessions s
                SET running_call = i.call, running_by = $8, status = $9,
                    running_until = now() + i.timeout_ms * interval '1 millisecond',
                    running_key = NULL, running_last = NULL, running_interrupted = false
               FROM input i
              WHERE s.id = i.session_id AND s.last_seq = i.after
                AND (s.running_call IS NULL OR s.running_until < now()
                     OR NOT EXISTS (SELECT 1 FROM switchboard.dispatchers d
                                     WHERE d.id = s.running_by AND d.alive_until > now()))
             RETURNING s.id, i.call, i.event_id, i.seq, i.person_id, s.engine_session_id,
                       s.pending_reset, s.pending_reset_at, s.workspace_path, s.memory_key,
                       s.agent_identity, s.waiting_notice),
           started AS (
             INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
             SELECT event_id, id, $10::text || ':' || call::text, $10, seq,
                    jsonb_build_object('call', call::text, 'resumes', engine_session_id)
               FROM leased
             ON CONFLICT (key) DO NOTHING),
           -- The turn's first pickup and by whom, set once (a redelivery keeps the first).
           picked AS (
             UPDATE switchboard.turns t SET picked_at = now(), picked_by = $8
               FROM leased l
              WHERE t.session_id = l.id AND t.seq = l.seq AND t.picked_at IS NULL)
         SELECT l.call, l.engine_session_id, l.pending_reset, l.pending_reset_at,
                l.workspace_path, m.summary, m.updated_at AS summary_at, l.waiting_notice,
                c.body AS memory, c.version AS memory_version, c.updated_by AS memory_by,
                c.updated_at AS memory_at, c.agent_identity AS memory_identity,
                (SELECT o.id FROM switchboard.takeovers o
                  WHERE o.session_id = l.id AND o.ended_at IS NULL) AS takeover,
                EXISTS (SELECT 1 FROM switchboard.takeovers b
                         WHERE b.session_id = l.id AND b.ended_at IS NOT NULL
                           AND b.briefed_at IS NULL) AS unbriefed
           FROM leased l
           LEFT JOIN switchboard.summaries m ON m.memory_key = l.memory_key
           -- The curated memory of the turn's person (not the session's: a session shared
           -- by everyone never shares anyone's memory).
           LEFT JOIN switchboard.memories c
                  ON c.person_id = l.person_id AND c.agent_identity = l.agent_identity"#,
    )
    .bind(asks.iter().map(|a| a.session).collect::<Vec<_>>())
    .bind(asks.iter().map(|a| a.after).collect::<Vec<_>>())
    .bind(asks.iter().map(|a| a.call).collect::<Vec<_>>())
    .bind(asks.iter().map(|a| a.timeout_ms).collect::<Vec<_>>())
    .bind(asks.iter().map(|_| Uuid::now_v7()).collect::<Vec<_>>())
    .bind(asks.iter().map(|a| a.seq).collect::<Vec<_>>())
    .bind(
        asks.iter()
            .map(|a| a.person_id.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(dispatcher)
    .bind(SessionStatus::Running)
    .bind(SessionEventKind::TurnStarted)
    // Planned for each batch's own arrays (a plan cached while `turns` was nearly empty
    // would scan every turn for good).
    .persistent(false)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.call, r)).collect())
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
    /// The database was found unreachable during the call: the slot is given back in the
    /// background, so the turn's outcome (a notice to publish) does not wait on the pool.
    unreachable: bool,
    _agent_slot: OwnedSemaphorePermit,
}

impl CallLease {
    /// The statement that settled the call (its commit, the wait for the runner, the
    /// interruption) cleared the slot itself, in its own transaction.
    pub fn cleared(&mut self) {
        self.held = false;
    }

    /// The database cannot be reached: [`CallLease::finish`] gives the slot back in the
    /// background only (a first try would wait out the pool's acquire timeout).
    pub fn database_unreachable(&mut self) {
        self.unreachable = true;
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
        if !self.held {
            return;
        }
        if !self.unreachable {
            let Err(e) = self.release().await else {
                return;
            };
            tracing::warn!(session = %self.session, error = %e,
                "could not release the call slot; trying again in the background");
        }
        self.held = false; // handed to the retry below
        let (db, wakers) = (self.db.clone(), self.wakers.clone());
        release_in_background(db, wakers, self.session, self.call, self.timeout);
    }
}

/// Give `call`'s slot back in the background, trying again until the database answers or the
/// lease would have lapsed anyway (`within`); the session's parked turns are woken after.
fn release_in_background(db: PgPool, wakers: Wakers, session: Uuid, call: Uuid, within: Duration) {
    let until = tokio::time::Instant::now() + within;
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
