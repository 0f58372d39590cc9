//! The message log: every message in and out, one table, one function ([`MessageLog::record`]).
//! Writes are idempotent on the message id (and the provider's id per channel), so redelivery
//! never doubles a row. Each new row is announced as `message.logged`.
use sqlx::PgPool;
use switchboard_kit::proto::{MessageLogged, Reply, Turn};
use switchboard_kit::startup::App;
use switchboard_kit::{Attempt, Output, Stage, StageError, Topology};
use switchboard_kit::{Registration, Source, StageSpec};
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Inbound,
    Outbound,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
        }
    }
}

/// One row of the log.
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub id: Uuid,
    pub session_id: Uuid,
    pub person_id: String,
    pub agent_name: String,
    pub agent_identity: String,
    pub direction: Direction,
    pub channel: String,
    pub message: String,
    pub processing_ms: Option<i64>,
    pub tool_calls_count: Option<i64>,
    pub correlation_id: String,
    pub external_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("entry is malformed: {0}")]
    Malformed(&'static str),
    #[error("message log: {0}")]
    Database(#[from] sqlx::Error),
}

impl LogError {
    fn into_stage(self) -> StageError {
        match self {
            LogError::Database(_) => StageError::transient(self),
            LogError::Malformed(_) => StageError::permanent(self),
        }
    }
}

#[derive(Clone)]
pub struct MessageLog {
    db: PgPool,
}

impl MessageLog {
    pub fn new(db: PgPool) -> Self {
        Self { db }
    }

    /// Write the entry unless it is already there.
    pub async fn record(&self, e: &LogEntry) -> Result<(), LogError> {
        sqlx::query(
            "INSERT INTO switchboard.messages
                (id, session_id, person_id, agent_name, agent_identity, direction, channel, message,
                 processing_ms, tool_calls_count, correlation_id, external_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT DO NOTHING",
        )
        .bind(e.id)
        .bind(e.session_id)
        .bind(&e.person_id)
        .bind(&e.agent_name)
        .bind(&e.agent_identity)
        .bind(e.direction.as_str())
        .bind(&e.channel)
        .bind(&e.message)
        .bind(e.processing_ms)
        .bind(e.tool_calls_count)
        .bind(&e.correlation_id)
        .bind(&e.external_id)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    fn logged_event(&self, topology: &Topology, e: &LogEntry) -> Output {
        let event = MessageLogged {
            message_id: e.id.to_string(),
            session_id: e.session_id.to_string(),
            person_id: e.person_id.clone(),
            agent_name: e.agent_name.clone(),
            agent_identity: e.agent_identity.clone(),
            direction: e.direction.as_str().into(),
            channel: e.channel.clone(),
            correlation_id: e.correlation_id.clone(),
            processing_ms: e.processing_ms.unwrap_or(0),
            tool_calls_count: e.tool_calls_count.unwrap_or(0),
            logged_at_ms: switchboard_kit::now_ms(),
        };
        Output::new(topology.event("message.logged"), e.id.to_string(), &event)
            .correlated(e.correlation_id.clone())
    }
}

fn parse_uuid(s: &str, what: &'static str) -> Result<Uuid, LogError> {
    s.parse().map_err(|_| LogError::Malformed(what))
}

/// Logs the inbound side of each turn (it carries the session the message belongs to).
pub struct LogInbound {
    log: MessageLog,
    topology: Topology,
}

impl LogInbound {
    pub fn new(log: MessageLog, topology: Topology) -> Self {
        Self { log, topology }
    }
}

impl Stage for LogInbound {
    type Input = Turn;
    const SPEC: StageSpec = StageSpec::new("log-inbound", Source::Work("turn.>"));

    async fn handle(&self, turn: Turn, _d: &Attempt) -> Result<Vec<Output>, StageError> {
        let entry = inbound_entry(&turn).map_err(LogError::into_stage)?;
        self.log
            .record(&entry)
            .await
            .map_err(LogError::into_stage)?;
        Ok(vec![self.log.logged_event(&self.topology, &entry)])
    }
}

fn inbound_entry(turn: &Turn) -> Result<LogEntry, LogError> {
    let msg = turn
        .message
        .as_ref()
        .ok_or(LogError::Malformed("message"))?;
    let inbound = msg.inbound.as_ref().ok_or(LogError::Malformed("inbound"))?;
    let person = msg.person.as_ref().ok_or(LogError::Malformed("person"))?;
    Ok(LogEntry {
        id: parse_uuid(&inbound.id, "message id")?,
        session_id: parse_uuid(&turn.session_id, "session id")?,
        person_id: person.person_id.clone(),
        agent_name: turn.agent_name.clone(),
        agent_identity: turn.agent_identity.clone(),
        direction: Direction::Inbound,
        channel: inbound.channel.clone(),
        message: inbound.text.clone(),
        processing_ms: None,
        tool_calls_count: None,
        correlation_id: inbound.correlation_id.clone(),
        external_id: Some(inbound.provider_message_id.clone()).filter(|s| !s.is_empty()),
    })
}

/// Logs agents' replies.
pub struct LogOutbound {
    log: MessageLog,
    topology: Topology,
}

impl LogOutbound {
    pub fn new(log: MessageLog, topology: Topology) -> Self {
        Self { log, topology }
    }
}

impl Stage for LogOutbound {
    type Input = Reply;
    const SPEC: StageSpec = StageSpec::new("log-outbound", Source::Work("reply"));

    async fn handle(&self, reply: Reply, _d: &Attempt) -> Result<Vec<Output>, StageError> {
        let entry = LogEntry {
            id: parse_uuid(&reply.id, "reply id").map_err(LogError::into_stage)?,
            session_id: parse_uuid(&reply.session_id, "session id")
                .map_err(LogError::into_stage)?,
            person_id: reply
                .person
                .as_ref()
                .map(|p| p.person_id.clone())
                .unwrap_or_default(),
            agent_name: reply.agent_name.clone(),
            agent_identity: reply.agent_identity.clone(),
            direction: Direction::Outbound,
            channel: reply.channel.clone(),
            message: reply.text.clone(),
            processing_ms: Some(reply.processing_ms),
            tool_calls_count: Some(reply.tool_calls_count),
            correlation_id: reply.correlation_id.clone(),
            external_id: None,
        };
        self.log
            .record(&entry)
            .await
            .map_err(LogError::into_stage)?;
        Ok(vec![self.log.logged_event(&self.topology, &entry)])
    }
}

/// The inbound log stage, as the product lists it.
pub const INBOUND: Registration = Registration {
    spec: LogInbound::SPEC,
    worker: "log",
    start: |app: &App| {
        app.stage_task(LogInbound::new(
            MessageLog::new(app.db.clone()),
            app.topology.clone(),
        ))
    },
};

/// The outbound log stage, as the product lists it.
pub const OUTBOUND: Registration = Registration {
    spec: LogOutbound::SPEC,
    worker: "log",
    start: |app: &App| {
        app.stage_task(LogOutbound::new(
            MessageLog::new(app.db.clone()),
            app.topology.clone(),
        ))
    },
};
