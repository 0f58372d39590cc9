//! Sessions: one per person + agent. The session stage finds or creates the session and gives
//! the message its place in the session (a contiguous `seq`), then emits the turn.
//!
//! Provider retries of the same message (same channel + provider message id) map to the same
//! turn, however late they come, so they never run twice.
//!
//! Turns open in the order the person wrote: the gateway numbers each sender's messages
//! ([`switchboard_kit::arrival`]) and a message waits here until its sender's previous number
//! has its turn. Stages before this one run messages concurrently and a crashed worker's
//! message only comes back after `ack_wait`, so without the wait a later message would overtake.
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use sqlx::PgPool;
use switchboard_kit::config::{AgentConfig, ChannelConfig, SessionScope, WorkspaceConfig};
use switchboard_kit::lifecycle::{ResetPolicy, reset_command};
use switchboard_kit::proto::InboundMessage;
use switchboard_kit::proto::{IdentifiedMessage, SessionCreated, Turn};
use switchboard_kit::startup::{App, Task};
use switchboard_kit::status::{ResetReason, SessionEventKind};
use switchboard_kit::workspace;
use switchboard_kit::{Attempt, BatchStage, Hold, Outcome, Output, StageError, Topology};
use switchboard_kit::{Registration, Source, StageSpec};
use uuid::Uuid;

mod arrival;
mod batch;
mod sender_backlog;
mod summary_due;

pub use arrival::{ArrivalWait, Placement, place_arrival};
use batch::Placing;
pub use sender_backlog::SenderBacklog;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("message has no {0}")]
    Incomplete(&'static str),
    #[error("no agent named {0:?} is configured")]
    UnknownAgent(String),
    #[error("channel {0:?} has no default agent and the message names none")]
    NoAgent(String),
    #[error(transparent)]
    Policy(#[from] switchboard_kit::lifecycle::PolicyError),
    #[error("session folder {0}: {1}")]
    Workspace(String, #[source] std::io::Error),
    #[error("session store: {0}")]
    Database(#[from] sqlx::Error),
}

impl SessionError {
    fn into_stage(self) -> StageError {
        match self {
            // A full or unmounted disk may come back.
            SessionError::Database(_) | SessionError::Workspace(..) => StageError::transient(self),
            _ => StageError::permanent(self),
        }
    }
}

/// What opening a turn came to.
#[derive(Debug, Clone)]
pub enum Opened {
    Turn(OpenedTurn),
    /// The sender's previous message has no turn yet; nothing was written.
    Waiting,
    /// The person was forgotten after this message was received: nothing was written.
    Forgotten,
}

/// The session a turn belongs to.
#[derive(Debug, Clone)]
pub struct OpenedTurn {
    pub session_id: Uuid,
    pub seq: i64,
    pub inbound_id: Uuid,
    pub scope_key: String,
    /// The person + identity's key (summary, memory), shared by the identity's variants.
    pub memory_key: String,
    /// The fresh engine session the turn starts with, if any.
    pub reset: Option<ResetReason>,
}

/// A turn already placed for a message (a retry keeps it).
struct PlacedTurn {
    session_id: Uuid,
    seq: i64,
    inbound_id: Uuid,
    reset: Option<ResetReason>,
}

pub struct SessionStore {
    db: PgPool,
    scope: SessionScope,
    workspace: WorkspaceConfig,
}

impl SessionStore {
    /// Sessions of the default scope (one per person and agent), without workspaces.
    pub fn new(db: PgPool) -> Self {
        Self::scoped(db, SessionScope::Person)
    }

    pub fn scoped(db: PgPool, scope: SessionScope) -> Self {
        Self {
            db,
            scope,
            workspace: WorkspaceConfig::default(),
        }
    }

    /// Give each session a folder under `workspace.root` (a relative root is taken from the
    /// working directory: the runner gets absolute paths).
    pub fn with_workspaces(mut self, mut workspace: WorkspaceConfig) -> Self {
        if !workspace.root.is_empty()
            && let Ok(root) = std::path::absolute(&workspace.root)
        {
            workspace.root = root.to_string_lossy().into_owned();
        }
        self.workspace = workspace;
        self
    }

    /// Whether the message may be placed now (read-only; used while a message waits).
    /// `overdue`: it has waited longer than the gap timeout.
    pub async fn arrival_ready(
        &self,
        msg: &IdentifiedMessage,
        overdue: bool,
    ) -> Result<bool, SessionError> {
        let Some(inbound) = msg.inbound.as_ref().filter(|i| i.arrival_seq > 0) else {
            return Ok(true);
        };
        let cursor = self.arrival_cursor(inbound).await?;
        let placement = place_arrival(cursor, inbound.arrival_epoch, arrival_seq(inbound), overdue);
        Ok(placement != Placement::Wait)
    }

    /// The sender's arrival cursor, (epoch, last placed number); nothing placed yet reads as
    /// the message's own epoch at 0 (read-only).
    async fn arrival_cursor(&self, inbound: &InboundMessage) -> Result<(i64, i64), SessionError> {
        Ok(sqlx::query!(
            "SELECT epoch, last_seq FROM switchboard.arrival_cursors
              WHERE channel = $1 AND sender = $2",
            inbound.channel,
            inbound.sender,
        )
        .fetch_optional(&self.db)
        .await?
        .map_or((inbound.arrival_epoch, 0), |c| (c.epoch, c.last_seq)))
    }

    /// Let the sender's later messages go on without this one (it cannot be answered: no
    /// agent, say), in its turn. False: an earlier message has not had its turn yet.
    pub async fn pass_arrival(
        &self,
        msg: &IdentifiedMessage,
        overdue: bool,
    ) -> Result<bool, SessionError> {
        let Some(inbound) = msg.inbound.as_ref() else {
            return Ok(true);
        };
        let mut tx = self.db.begin().await?;
        if !take_arrival(&mut tx, inbound, overdue).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    /// What placing `msg` for `agent` needs, worked out before any statement runs.
    fn placing<'a>(
        &self,
        msg: &'a IdentifiedMessage,
        agent: &'a AgentConfig,
        overdue: bool,
    ) -> Result<Placing<'a>, SessionError> {
        let inbound = msg
            .inbound
            .as_ref()
            .ok_or(SessionError::Incomplete("inbound"))?;
        let person = msg
            .person
            .as_ref()
            .ok_or(SessionError::Incomplete("person"))?;
        let inbound_id: Uuid = inbound
            .id
            .parse()
            .map_err(|_| SessionError::Incomplete("valid message id"))?;
        let key_for = |name: &str| {
            if inbound.heartbeat {
                // A heartbeat's session is its schedule's, whatever the scope mode.
                return format!("{name}:heartbeat:{}", inbound.scheduled);
            }
            agent.scope_or(self.scope).key(
                name,
                &person.person_type,
                &person.person_id,
                &inbound.channel,
                &inbound.recipient,
            )
        };
        // Without a provider id, the message id is the dedupe key.
        let provider_id = if inbound.provider_message_id.is_empty() {
            inbound.id.clone()
        } else {
            inbound.provider_message_id.clone()
        };
        Ok(Placing {
            msg,
            inbound,
            person,
            agent,
            inbound_id,
            scope_key: key_for(&agent.name),
            // The person + agent identity: shared by the identity's engine variants (summary).
            memory_key: key_for(&agent.identity),
            provider_id,
            policy: ResetPolicy::of(agent).map_err(SessionError::Policy)?,
            person_spoke: inbound.is_from_person(),
            received: DateTime::from_timestamp_millis(inbound.received_at_ms)
                .filter(|_| inbound.received_at_ms > 0)
                .unwrap_or_else(Utc::now),
            overdue,
        })
    }

    /// Find or create the session of (scope, agent) and give this message its turn, unless the
    /// sender's previous message has none yet ([`Opened::Waiting`]). Race-free across replicas:
    /// the sender's arrival cursor, then the session row, are locked while the next `seq` is
    /// taken. `overdue`: the message has waited longer than the gap timeout.
    pub async fn open_turn(
        &self,
        msg: &IdentifiedMessage,
        agent: &AgentConfig,
        overdue: bool,
    ) -> Result<Opened, SessionError> {
        let Placing {
            inbound,
            person,
            inbound_id,
            scope_key,
            memory_key,
            provider_id,
            policy,
            person_spoke,
            received,
            ..
        } = self.placing(msg, agent, overdue)?;

        let mut tx = self.db.begin().await?;
        switchboard_kit::forgotten::lock_shared(&mut *tx, &person.person_id).await?;
        if switchboard_kit::forgotten::received_before(&mut *tx, &person.person_id, received)
            .await?
        {
            tx.rollback().await?;
            return Ok(Opened::Forgotten);
        }
        if !take_arrival(&mut tx, inbound, overdue).await? {
            tx.rollback().await?;
            return Ok(Opened::Waiting);
        }
        // Find or create the session, and lock it while this message takes its place.
        let session = sqlx::query!(
            "INSERT INTO switchboard.sessions
                (id, person_type, person_id, agent_identity, agent_name, engine_type, channel,
                 scope_key, memory_key)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (scope_key, agent_name) DO UPDATE SET updated_at = now()
             RETURNING id, last_message_at, workspace_path",
            Uuid::now_v7(),
            person.person_type,
            person.person_id,
            agent.identity,
            agent.name,
            agent.engine,
            inbound.channel,
            scope_key,
            memory_key,
        )
        .fetch_one(&mut *tx)
        .await?;
        let (session_id, last_message_at, workspace) =
            (session.id, session.last_message_at, session.workspace_path);

        // A retry of a message we already placed keeps its original turn.
        if let Some(r) = sqlx::query_as!(
            PlacedTurn,
            r#"SELECT session_id, seq, inbound_id, reset AS "reset: ResetReason"
                 FROM switchboard.turns
                WHERE channel = $1 AND provider_message_id = $2"#,
            inbound.channel,
            provider_id,
        )
        .fetch_optional(&mut *tx)
        .await?
        {
            tx.commit().await?;
            return Ok(Opened::Turn(OpenedTurn {
                session_id: r.session_id,
                seq: r.seq,
                inbound_id: r.inbound_id,
                scope_key,
                memory_key,
                reset: r.reset,
            }));
        }

        // Only the person's own messages reset a session or count as its activity; a message
        // the agent starts goes on in the session as it is.
        let reset = if !person_spoke {
            None
        } else if policy.commands && reset_command(&inbound.text).is_some() {
            Some(ResetReason::Command)
        } else {
            policy.due(last_message_at, received)
        };
        if workspace.is_none() && !self.workspace.root.is_empty() {
            self.make_workspace(&mut tx, session_id, &memory_key)
                .await?;
        }

        let seq = sqlx::query_scalar!(
            r#"UPDATE switchboard.sessions SET next_seq = next_seq + 1, updated_at = now(),
                      last_message_at = CASE WHEN $2 THEN GREATEST(last_message_at, $3)
                                             ELSE last_message_at END
                WHERE id = $1 RETURNING next_seq - 1 AS "seq!""#,
            session_id,
            person_spoke,
            received,
        )
        .fetch_one(&mut *tx)
        .await?;
        let entry = serde_json::json!({
            "message_id": inbound.id,
            "channel": inbound.channel,
            "provider": inbound.provider,
            "agent_started": !person_spoke,
            "reset": reset.map(ResetReason::as_str),
        });
        // The turn and its journal entry in one statement.
        // An agent that joins waiting messages reads them from here.
        let payload = agent
            .queue_mode
            .joins()
            .then(|| prost::Message::encode_to_vec(msg));
        sqlx::query!(
            "WITH turn AS (
                INSERT INTO switchboard.turns
                    (session_id, seq, inbound_id, channel, provider_message_id, reset, payload)
                VALUES ($1, $2, $3, $4, $5, $6, $9)
                RETURNING session_id, seq)
             INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
             SELECT $7, session_id, $10::text || ':' || session_id || ':' || seq, $10, seq, $8
               FROM turn",
            session_id,
            seq,
            inbound_id,
            inbound.channel,
            provider_id,
            reset as Option<ResetReason>,
            Uuid::now_v7(),
            entry,
            payload,
            SessionEventKind::MessageIn as SessionEventKind,
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Opened::Turn(OpenedTurn {
            session_id,
            seq,
            inbound_id,
            scope_key,
            memory_key,
            reset,
        }))
    }

    /// Give the session its folder (made on disk before the row says so): the folder of a
    /// sibling engine variant of the same identity when variants share, else its own, named
    /// by the session id.
    async fn make_workspace(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        session_id: Uuid,
        memory_key: &str,
    ) -> Result<(), SessionError> {
        let sibling: Option<String> = if self.workspace.separate_variants {
            None
        } else {
            sqlx::query_scalar!(
                r#"SELECT workspace_path AS "workspace_path!" FROM switchboard.sessions
                    WHERE memory_key = $1 AND id <> $2 AND workspace_path IS NOT NULL
                    ORDER BY created_at LIMIT 1"#,
                memory_key,
                session_id,
            )
            .fetch_optional(&mut **tx)
            .await?
        };
        let path = sibling.unwrap_or_else(|| {
            std::path::Path::new(&self.workspace.root)
                .join(session_id.to_string())
                .to_string_lossy()
                .into_owned()
        });
        workspace::prepare(std::path::Path::new(&path))
            .await
            .map_err(|e| SessionError::Workspace(path.clone(), e))?;
        sqlx::query!(
            "UPDATE switchboard.sessions SET workspace_path = $2 WHERE id = $1",
            session_id,
            path,
        )
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}

/// Lock the sender's arrival cursor and move it to this message if it is the sender's next
/// (or has waited long enough for a missing predecessor). False: it must wait; nothing was
/// written, and the caller rolls back. Unnumbered messages never wait.
async fn take_arrival(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    inbound: &switchboard_kit::proto::InboundMessage,
    overdue: bool,
) -> Result<bool, SessionError> {
    if inbound.arrival_seq == 0 {
        return Ok(true);
    }
    // Locks the sender's cursor (created at this message's epoch, nothing placed).
    let cursor = sqlx::query!(
        "INSERT INTO switchboard.arrival_cursors (channel, sender, epoch, last_seq)
             VALUES ($1, $2, $3, 0)
             ON CONFLICT (channel, sender) DO UPDATE SET updated_at = now()
             RETURNING epoch, last_seq",
        inbound.channel,
        inbound.sender,
        inbound.arrival_epoch,
    )
    .fetch_one(&mut **tx)
    .await?;
    let cursor = (cursor.epoch, cursor.last_seq);
    let seq = arrival_seq(inbound);
    let placement = place_arrival(cursor, inbound.arrival_epoch, seq, overdue);
    arrival::count_placement(inbound, placement, seq, cursor.1);
    match placement {
        Placement::Wait => return Ok(false),
        Placement::Late => {}
        Placement::Next | Placement::SkipGap => {
            sqlx::query!(
                "UPDATE switchboard.arrival_cursors SET epoch = $3, last_seq = $4
                      WHERE channel = $1 AND sender = $2",
                inbound.channel,
                inbound.sender,
                inbound.arrival_epoch,
                seq,
            )
            .execute(&mut **tx)
            .await?;
        }
    }
    Ok(true)
}

/// The arrival number as the database stores it (numbers beyond `i64` do not occur: the
/// gateway counts one by one).
fn arrival_seq(inbound: &switchboard_kit::proto::InboundMessage) -> i64 {
    i64::try_from(inbound.arrival_seq).unwrap_or(i64::MAX)
}

/// Which agent a message goes to: the one it names, else the one the number it was written
/// to is given (`[channels.<channel>.recipients]`), else its channel's default.
pub fn route_agent<'a>(
    agents: &'a [AgentConfig],
    channels: &BTreeMap<String, ChannelConfig>,
    channel: &str,
    recipient: &str,
    requested: &str,
) -> Result<&'a AgentConfig, SessionError> {
    let name = if requested.is_empty() {
        channels
            .get(channel)
            .map(|c| c.agent_for(recipient))
            .filter(|a| !a.is_empty())
            .ok_or_else(|| SessionError::NoAgent(channel.to_string()))?
    } else {
        requested
    };
    agents
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(|| SessionError::UnknownAgent(name.to_string()))
}

/// The session stage: `sb.identified` → `sb.turn.<partition>` (+ `session.created`).
pub struct SessionStage {
    store: SessionStore,
    agents: Vec<AgentConfig>,
    channels: BTreeMap<String, ChannelConfig>,
    topology: Topology,
    wait: ArrivalWait,
    backlog: SenderBacklog,
}

impl SessionStage {
    pub fn new(
        store: SessionStore,
        agents: Vec<AgentConfig>,
        channels: BTreeMap<String, ChannelConfig>,
        topology: Topology,
        wait: ArrivalWait,
        backlog: SenderBacklog,
    ) -> Self {
        Self {
            store,
            agents,
            channels,
            topology,
            wait,
            backlog,
        }
    }

    /// Whether a message may skip its sender's missing predecessor: it has waited the gap
    /// timeout and the predecessor is not on its way ([`SenderBacklog`]). A look that cannot
    /// be made answers no: the message waits and is asked about again.
    async fn overdue(&self, msg: &IdentifiedMessage, waiting: &Attempt) -> bool {
        if !self.wait.overdue(waiting.waited) {
            return false;
        }
        let Some(inbound) = msg.inbound.as_ref().filter(|i| i.arrival_seq > 0) else {
            return true;
        };
        let cursor = match self.store.arrival_cursor(inbound).await {
            Ok(cursor) => cursor,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the sender's arrival cursor");
                return false;
            }
        };
        let seq = arrival_seq(inbound);
        if place_arrival(cursor, inbound.arrival_epoch, seq, false) != Placement::Wait {
            // Nothing to skip: it is the sender's next (or late) as it is.
            return true;
        }
        if self.backlog.holds_predecessor(inbound, cursor).await {
            metrics::counter!("sb_session_arrival_gaps_on_their_way_total").increment(1);
            tracing::debug!(
                correlation_id = %inbound.correlation_id,
                arrival = seq,
                after = cursor.1,
                "past the gap timeout, but the sender's earlier message is on its way: waiting for it"
            );
            return false;
        }
        true
    }

    /// Run `attempt` once the sender's previous message has had its turn: `attempt(overdue)`
    /// answers `None` while it must wait. Held briefly, then back to the stream with a growing
    /// delay.
    async fn in_arrival_order<T, F, Fut>(
        &self,
        msg: &IdentifiedMessage,
        waiting: &Attempt,
        mut attempt: F,
    ) -> Result<T, StageError>
    where
        F: FnMut(bool) -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, SessionError>>,
    {
        let overdue = self.overdue(msg, waiting).await;
        let hold = Hold {
            poll: self.wait.poll,
            hold: self.wait.hold,
            retry: self.wait.retry_after(waiting.waits),
        };
        let why = || "waiting for the sender's earlier message".to_string();
        let mut counted = false;
        loop {
            if let Some(done) = attempt(overdue).await.map_err(SessionError::into_stage)? {
                return Ok(done);
            }
            if !counted {
                metrics::counter!("sb_session_arrival_waits_total").increment(1);
                counted = true;
            }
            // Read-only until the predecessor is placed, then try again.
            hold.until(why, || async {
                self.store
                    .arrival_ready(msg, overdue)
                    .await
                    .map_err(SessionError::into_stage)
            })
            .await?;
        }
    }
}

impl SessionStage {
    /// One message alone, waiting in place for its sender's earlier one as needed.
    async fn handle_one(&self, msg: IdentifiedMessage, attempt: &Attempt) -> Outcome {
        let inbound = msg
            .inbound
            .as_ref()
            .ok_or_else(|| SessionError::Incomplete("inbound").into_stage())?;
        let agent = match self.route(inbound) {
            Ok(agent) => agent,
            Err(e) => {
                // It will be dead-lettered, but in its turn: the sender's later messages must
                // not wait the gap timeout for it.
                let (store, m) = (&self.store, &msg);
                self.in_arrival_order(m, attempt, |overdue| async move {
                    Ok(store.pass_arrival(m, overdue).await?.then_some(()))
                })
                .await?;
                return Err(e.into_stage());
            }
        };
        let (store, m) = (&self.store, &msg);
        let opened = self
            .in_arrival_order(m, attempt, |overdue| async move {
                Ok(match store.open_turn(m, agent, overdue).await? {
                    Opened::Waiting => None,
                    opened => Some(opened),
                })
            })
            .await?;
        self.turn_outputs(msg, agent, opened).await
    }

    fn route(&self, inbound: &InboundMessage) -> Result<&AgentConfig, SessionError> {
        route_agent(
            &self.agents,
            &self.channels,
            &inbound.channel,
            &inbound.recipient,
            &inbound.agent,
        )
    }

    /// What an opened turn publishes: the turn, a summary item when one is due, and
    /// `session.created` for a session's first turn.
    async fn turn_outputs(
        &self,
        mut msg: IdentifiedMessage,
        agent: &AgentConfig,
        opened: Opened,
    ) -> Outcome {
        let Opened::Turn(opened) = opened else {
            switchboard_kit::forgotten::dropped("session", "message");
            return Ok(Vec::new());
        };
        let inbound = msg
            .inbound
            .as_ref()
            .ok_or_else(|| SessionError::Incomplete("inbound").into_stage())?;
        let correlation = inbound.correlation_id.clone();
        let channel = inbound.channel.clone();
        // A late provider retry carries a new message id; the turn keeps the first one.
        if let Some(i) = msg.inbound.as_mut() {
            i.id = opened.inbound_id.to_string();
        }
        let person = msg.person.clone().unwrap_or_default();
        let summary = summary_due::summary_due(
            &self.store.db,
            &self.topology,
            &opened,
            &person,
            &agent.identity,
        )
        .await
        .map_err(|e| SessionError::from(e).into_stage())?;
        switchboard_kit::trace::record_session(opened.session_id);
        let turn = Turn {
            session_id: opened.session_id.to_string(),
            seq: opened.seq,
            agent_name: agent.name.clone(),
            agent_identity: agent.identity.clone(),
            scope_key: opened.scope_key.clone(),
            message: Some(msg),
            reset: opened
                .reset
                .map(|r| r.as_str().to_string())
                .unwrap_or_default(),
        };
        let key = format!("{}:{}", opened.session_id, opened.seq);
        let mut out = vec![
            Output::new(self.topology.turn(&opened.session_id), key, &turn)
                .correlated(correlation.clone()),
        ];
        out.extend(summary);
        if opened.seq == 1 {
            let created = SessionCreated {
                session_id: opened.session_id.to_string(),
                person_id: person.person_id,
                person_type: person.person_type,
                agent_name: agent.name.clone(),
                agent_identity: agent.identity.clone(),
                channel,
                created_at_ms: switchboard_kit::now_ms(),
            };
            out.push(
                Output::new(
                    self.topology.event("session.created"),
                    opened.session_id.to_string(),
                    &created,
                )
                .correlated(correlation),
            );
        }
        Ok(out)
    }
}

impl BatchStage for SessionStage {
    type Input = IdentifiedMessage;
    const SPEC: StageSpec =
        StageSpec::new("session", Source::Work("identified.>")).also_reading("identified");

    /// The messages of different senders and sessions are placed together in one
    /// transaction ([`batch`]); the rest, and any the batch could not place (a sender's later
    /// message that must wait), one at a time as before. A batch whose transaction fails is
    /// tried again message by message here, so one bad message fails alone.
    async fn handle_batch(
        &self,
        inputs: Vec<IdentifiedMessage>,
        attempts: &[Attempt],
    ) -> Vec<Outcome> {
        if inputs.len() < 2 {
            return join_all(
                inputs
                    .into_iter()
                    .zip(attempts)
                    .map(|(m, a)| self.handle_one(m, a)),
            )
            .await;
        }
        let mut placing = Vec::new();
        let mut alone = Vec::new();
        let overdue = join_all(
            inputs
                .iter()
                .zip(attempts)
                .map(|(msg, attempt)| self.overdue(msg, attempt)),
        )
        .await;
        for (i, (msg, overdue)) in inputs.iter().zip(overdue).enumerate() {
            let prepared = msg
                .inbound
                .as_ref()
                .ok_or(SessionError::Incomplete("inbound"))
                .and_then(|inbound| self.route(inbound))
                .and_then(|agent| self.store.placing(msg, agent, overdue));
            match prepared {
                Ok(p) => placing.push((i, p)),
                Err(_) => alone.push(i),
            }
        }
        let (together, rest) = batch::split_batch(placing);
        alone.extend(rest);
        let mut outcomes: Vec<Option<Outcome>> = (0..inputs.len()).map(|_| None).collect();
        let (indexes, places): (Vec<usize>, Vec<Placing<'_>>) = together.into_iter().unzip();
        match self.store.open_turns(&places).await {
            Ok(opened) => {
                let placed = places.iter().zip(&indexes).zip(opened);
                let done = join_all(placed.map(|((p, &i), o)| async move {
                    match o {
                        Opened::Waiting => (i, None),
                        o => (i, Some(self.turn_outputs(p.msg.clone(), p.agent, o).await)),
                    }
                }))
                .await;
                for (i, outcome) in done {
                    match outcome {
                        Some(outcome) => outcomes[i] = Some(outcome),
                        None => alone.push(i),
                    }
                }
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    messages = indexes.len(),
                    "a batch of turns could not be opened together; opening them one at a time"
                );
                alone.extend(indexes);
            }
        }
        alone.sort_unstable();
        let rest = join_all(
            alone
                .iter()
                .map(|&i| self.handle_one(inputs[i].clone(), &attempts[i])),
        )
        .await;
        for (i, outcome) in alone.into_iter().zip(rest) {
            outcomes[i] = Some(outcome);
        }
        outcomes
            .into_iter()
            .map(|o| o.expect("every input has an outcome"))
            .collect()
    }

    /// A message given up on (it kept failing or crashing its worker) passes its arrival turn,
    /// so the sender's later messages do not wait the gap timeout for it.
    async fn give_up(
        &self,
        msg: &IdentifiedMessage,
        _attempt: &Attempt,
        _cause: &switchboard_kit::GiveUp,
    ) -> Result<Vec<Output>, StageError> {
        self.store
            .pass_arrival(msg, true)
            .await
            .map_err(SessionError::into_stage)?;
        Ok(Vec::new())
    }
}

/// The session stage as a task of `app`.
/// The session stage, as the product lists it.
pub const STAGE: Registration = Registration {
    spec: SessionStage::SPEC,
    worker: "session",
    start: task,
};

fn task(app: &App) -> Task {
    let c = &app.config;
    let stage = SessionStage::new(
        SessionStore::scoped(app.db.clone(), app.config.session.scope)
            .with_workspaces(app.config.workspace.clone()),
        c.agents.clone(),
        c.channels.clone(),
        app.topology.clone(),
        ArrivalWait::from_config(&c.session),
        SenderBacklog::new(app.js.clone(), app.topology.clone()),
    );
    app.batch_stage_task(stage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn agent(name: &str) -> AgentConfig {
        AgentConfig {
            name: name.into(),
            identity: "reggie".into(),
            engine: "openclaw".into(),
            runner_url: "http://runner".into(),
            token: Default::default(),
            timeout_s: 10,
            concurrency: 1,
            ..Default::default()
        }
    }

    #[test]
    fn a_senders_messages_are_placed_in_the_order_they_arrived() {
        // Nothing placed yet in epoch 7: #1 is next, #2 waits (until overdue).
        assert_eq!(place_arrival((7, 0), 7, 1, false), Placement::Next);
        assert_eq!(place_arrival((7, 0), 7, 2, false), Placement::Wait);
        assert_eq!(place_arrival((7, 0), 7, 2, true), Placement::SkipGap);
        // #3 placed: #4 next, #3 again (a retry) or #2 (given up on) are late.
        assert_eq!(place_arrival((7, 3), 7, 4, false), Placement::Next);
        assert_eq!(place_arrival((7, 3), 7, 3, false), Placement::Late);
        assert_eq!(place_arrival((7, 3), 7, 2, false), Placement::Late);
        // A new epoch starts at 1; an old epoch's stragglers are late.
        assert_eq!(place_arrival((7, 3), 9, 1, false), Placement::Next);
        assert_eq!(place_arrival((7, 3), 9, 2, false), Placement::Wait);
        assert_eq!(place_arrival((9, 1), 7, 4, false), Placement::Late);
    }

    #[test]
    fn a_waiting_message_is_retried_sooner_first_then_at_most_every_retry_max() {
        let w = ArrivalWait {
            poll: Duration::from_millis(25),
            hold: Duration::from_millis(250),
            retry_max: Duration::from_secs(5),
            gap_timeout: Duration::from_secs(120),
        };
        assert_eq!(w.retry_after(0), Duration::from_millis(25));
        assert_eq!(w.retry_after(1), Duration::from_millis(50));
        assert_eq!(w.retry_after(4), Duration::from_millis(400));
        assert_eq!(w.retry_after(40), Duration::from_secs(5));
        // Overdue by the time waited, not by how often it was tried.
        assert!(!w.overdue(Duration::from_secs(119)));
        assert!(w.overdue(Duration::from_secs(120)));
        // A message never waits out the runtime's maximum wait before it may skip a gap.
        let defaults = ArrivalWait::from_config(&Default::default());
        let max_wait =
            Duration::from_millis(switchboard_kit::config::RuntimeConfig::default().max_wait_ms);
        assert!(defaults.gap_timeout + defaults.retry_max * 2 < max_wait);
    }

    #[test]
    fn a_message_goes_to_the_agent_it_names_else_the_channel_default() {
        let agents = vec![agent("reggie_oc"), agent("reggie_fd")];
        let channels = BTreeMap::from([(
            "sms".to_string(),
            ChannelConfig {
                default_agent: "reggie_oc".into(),
                recipients: BTreeMap::from([("+15555550198".into(), "reggie_fd".into())]),
            },
        )]);
        let ours = "+15555550199";
        assert_eq!(
            route_agent(&agents, &channels, "sms", ours, "")
                .unwrap()
                .name,
            "reggie_oc"
        );
        assert_eq!(
            route_agent(&agents, &channels, "sms", ours, "reggie_fd")
                .unwrap()
                .name,
            "reggie_fd"
        );
        // Written to the number given to reggie_fd, as Twilio (E.164) or TextMagic (digits)
        // write it.
        for to in ["+15555550198", "15555550198"] {
            assert_eq!(
                route_agent(&agents, &channels, "sms", to, "").unwrap().name,
                "reggie_fd",
                "{to}"
            );
        }
        // A message that names its agent keeps it.
        assert_eq!(
            route_agent(&agents, &channels, "sms", "+15555550198", "reggie_oc")
                .unwrap()
                .name,
            "reggie_oc"
        );
        assert!(matches!(
            route_agent(&agents, &channels, "sms", ours, "nobody"),
            Err(SessionError::UnknownAgent(_))
        ));
        assert!(matches!(
            route_agent(&agents, &channels, "api", "", ""),
            Err(SessionError::NoAgent(_))
        ));
    }
}
