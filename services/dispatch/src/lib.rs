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
//!
//! Where each part lives: [`turn`] runs a turn (acquire → plan → call → settle), [`lease`] holds
//! the call slot and the process's heartbeat, [`turn_store`] keeps the cursor and the stored
//! replies, [`wakers`] parks the turns waiting on their session, [`queue`] joins the messages
//! that arrive meanwhile (queue modes), [`outage`] waits out a runner that is down (beside the
//! [`breaker`]), [`replies`] says what a turn publishes, [`flush`] asks the agent to keep what
//! matters before a reset.
pub mod attachments;
pub mod breaker;
mod exports;
pub mod flush;
mod journal;
mod lease;
mod outage;
pub mod prompt;
mod queue;
mod reachable;
mod recall;
mod replies;
pub mod runner;
pub mod schedule;
mod settler;
mod takeover;
mod turn;
mod turn_store;
mod wakers;
pub mod wakeups;
mod workspace_files;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use switchboard_kit::config::{AgentConfig, Config, DispatchConfig, PromptConfig, ResetNotices};
use switchboard_kit::proto::Turn;
use switchboard_kit::startup::{App, Task};
use switchboard_kit::status::ResetReason;
use switchboard_kit::{Attempt, GiveUp, Output, Stage, StageError, Topology, Wake};
use switchboard_kit::{Registration, Source, StageSpec};
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::lease::{CALL_DEADLINE_MARGIN, CallSlots};
use crate::runner::{RunnerClient, RunnerError, TurnCredentials};
use crate::turn_store::TurnStore;
use crate::wakers::Wakers;
use switchboard_memory::curated::MemoryStore;

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
    /// `outage`: the outage the session waits out, if it does (its `waiting_notice`).
    #[error("turn {seq} waits for turn {next}")]
    NotYet {
        seq: i64,
        next: i64,
        wake: Wake,
        outage: Option<Uuid>,
    },
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
        /// The database was unreachable: the wait is not recorded (the notice carries it).
        unrecorded: bool,
    },
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error("session store: {0}")]
    Database(#[from] sqlx::Error),
    /// The group commit this answer joined went away unanswered (the process is stopping).
    #[error("the group commit went away: {0}")]
    Unanswered(#[from] switchboard_kit::coalesce::Unanswered),
}

impl DispatchError {
    fn is_transient(&self) -> bool {
        match self {
            DispatchError::Runner(e) => e.is_transient(),
            DispatchError::Database(_) | DispatchError::Unanswered(_) => true,
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
pub struct TurnDispatcher {
    /// This process's hold on sessions' call slots, and the heartbeat that keeps them.
    slots: CallSlots,
    /// The sessions' cursors and the turns' stored replies.
    turns: TurnStore,
    db: PgPool,
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
    /// Whether a turn's person was forgotten since its message came (asked twice a turn).
    forgotten: switchboard_kit::forgotten::ForgottenCheck,
    /// Whether the database still answers, while a check call is being prepared.
    database: reachable::DatabaseProbe,
    /// `[memory]`: the daily notes' calendar and cap.
    daily_notes: workspace_files::DailyNotesSettings,
    /// `[wakeups] time_zone`: the times of a person's `/reminders` list.
    reminders_zone: chrono_tz::Tz,
    /// `[workspace]`: the caps and lifetime of the files sent from `exports/`.
    config_exports: switchboard_kit::config::WorkspaceConfig,
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
        // Checks a turn may repeat at will run at most the pool's size less two at once (see
        // `TurnStore`).
        let checks = Arc::new(Semaphore::new(
            (db.options().get_max_connections() as usize)
                .saturating_sub(2)
                .max(1),
        ));
        let wakers = Wakers::default();
        let liveness = Duration::from_millis(config.dispatch.liveness_ms.max(300));
        let uploads = attachments::Uploads::new(db.clone(), config.workspace.max_attachment_bytes);
        let memories = MemoryStore::new(db.clone(), config.memory.max_chars);
        let recall = recall::Recaller::new(db.clone(), config);
        let credentials = TurnCredentials::new(db.clone(), config);
        let forgotten = switchboard_kit::forgotten::ForgottenCheck::new(db.clone());
        Self {
            slots: CallSlots::new(db.clone(), liveness, wakers.clone()),
            database: reachable::DatabaseProbe::new(&db),
            turns: TurnStore::new(db.clone(), checks, wakers.clone()),
            db,
            agents,
            runner: RunnerClient::new(),
            topology,
            config: config.dispatch.clone(),
            prompt: config.prompt.clone(),
            notices: config.session.reset_notices.clone(),
            wakers,
            media: attachments::MediaFetcher::new(
                switchboard_channels::Channels::product().media(config),
                config.workspace.max_attachment_bytes,
            ),
            uploads,
            memories,
            recall,
            credentials,
            forgotten,
            daily_notes: workspace_files::DailyNotesSettings::from_config(&config.memory),
            // Checked when the configuration is loaded; UTC only for one built by hand.
            reminders_zone: config.wakeups.tz().unwrap_or(chrono_tz::UTC),
            config_exports: config.workspace.clone(),
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

    /// The same dispatcher fetching media through `media` (the app's channels', see
    /// `switchboard_channels::Channels::of`) instead of the product's adapters.
    pub fn with_media(self, media: switchboard_channels::MediaSources) -> Self {
        Self {
            media: self.media.with_sources(media),
            ..self
        }
    }

    /// Tell the other dispatchers this process is alive (its runner-call leases hold).
    pub async fn heartbeat(&self) -> Result<(), DispatchError> {
        self.slots.heartbeat().await
    }

    /// Wake the turns waiting on a session when another replica moves it on (one query a
    /// `dispatch.hold_poll_ms` tick for all of them); never returns.
    pub async fn watch_sessions(&self) {
        let tick = Duration::from_millis(self.config.hold_poll_ms.max(10));
        self.wakers
            .watch_sessions(self.slots.watch_db(), tick)
            .await
    }
}

impl Stage for TurnDispatcher {
    type Input = Turn;
    /// Each turn mostly waits on a runner: many at once per process (agents' own
    /// `concurrency` still caps each agent).
    const SPEC: StageSpec = StageSpec::new("dispatch", Source::Work("turn.>")).concurrency(256);

    async fn handle(&self, turn: Turn, attempt: &Attempt) -> Result<Vec<Output>, StageError> {
        // A turn of a person forgotten since their message arrived is not run, and what it
        // made while they were being forgotten (a reply, a failure) is dropped.
        switchboard_kit::trace::record_session(&turn.session_id);
        if self.forgotten(&turn).await? {
            return Ok(Vec::new());
        }
        let result = self.dispatch_turn(&turn, attempt).await;
        // A notice told while the database is unreachable cannot wait for this check (it would
        // wait out the pool's acquire timeout): the deliverer and the message log drop a
        // forgotten person's messages themselves.
        let unreachable = matches!(
            result,
            Err(DispatchError::RunnerDown {
                unrecorded: true,
                ..
            })
        );
        if !unreachable && self.forgotten(&turn).await? {
            return Ok(Vec::new());
        }
        match result {
            Ok(out) => Ok(out),
            Err(DispatchError::RunnerDown {
                after,
                notice,
                recovery,
                ..
            }) => Err(StageError::Outage {
                after,
                why: "the agent's runner is down".into(),
                outputs: notice,
                wake: Some(recovery),
            }),
            Err(e @ DispatchError::Interrupted { .. }) => {
                Err(StageError::Defer(Duration::from_millis(10), e.to_string()))
            }
            Err(DispatchError::NotYet {
                seq, next, wake, ..
            }) => {
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
        match self
            .turns
            .mark_failed(session, turn.seq, reset, &reason)
            .await
        {
            // An expired turn is not silent: the person is told, in the turn's place.
            Ok(true) if expired(cause) => self
                .expired(turn, session, &reason)
                .await
                .map_err(StageError::transient),
            Ok(true) | Err(DispatchError::UnknownSession(_)) => Ok(Vec::new()),
            // Its predecessor is not settled yet, or a live call holds the session: the turn
            // may still be answered; give up once that is over.
            Ok(false) => Err(StageError::Defer(
                self.slots.liveness(),
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
        let gone = self
            .forgotten
            .received_before(person, received)
            .await
            .map_err(|e| StageError::transient(DispatchError::from(e)))?;
        if gone {
            switchboard_kit::forgotten::dropped("dispatch", "turn");
        }
        Ok(gone)
    }
}

/// The dispatch stage, as the product lists it.
pub const STAGE: Registration = Registration {
    spec: TurnDispatcher::SPEC,
    worker: "dispatch",
    start: task,
};

fn task(app: &App) -> Task {
    let c = &app.config;
    let stage = Arc::new(
        TurnDispatcher::new(app.db.clone(), app.topology.clone(), c)
            .with_media(switchboard_channels::Channels::of(app).media(c)),
    );
    let run = app.shared_stage_task(stage.clone());
    let scheduler = schedule::Scheduler::new(
        app.db.clone(),
        app.runtime(),
        app.topology.clone(),
        &c.schedules,
        Duration::from_millis(c.dispatch.schedule_tick_ms),
        Duration::from_secs(c.dispatch.schedule_lateness_s),
    );
    let firer = wakeups::WakeupFirer::new(
        app.db.clone(),
        app.runtime(),
        app.topology.clone(),
        &c.wakeups,
    );
    // Heartbeat until the stage has drained (in-flight calls still hold their leases).
    Box::pin(async move {
        let result = tokio::select! {
            r = run => r,
            _ = stage.slots.keep_alive() => unreachable!("keep_alive never returns"),
            _ = stage.watch_sessions() => unreachable!("watch_sessions never returns"),
            _ = scheduler.run() => unreachable!("the scheduler never returns"),
            _ = firer.run() => unreachable!("the wake-up firer never returns"),
        };
        stage.slots.retire().await;
        result
    })
}

#[cfg(test)]
mod tests;
