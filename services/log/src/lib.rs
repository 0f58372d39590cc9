//! The message log: every message in and out, one table, one statement per batch
//! ([`MessageLog::record_all`]). Writes are idempotent on the message id (and the provider's id
//! per channel), so redelivery never doubles a row. Each row is announced as `message.logged`.
//!
//! Both log stages are [`BatchStage`]s: what one pull brought is written with one
//! `INSERT … SELECT FROM unnest(…)` and one commit.
use std::time::Duration;

use sqlx::PgPool;
use switchboard_kit::proto::{MessageLogged, Reply, Turn};
use switchboard_kit::startup::App;
use switchboard_kit::status::{SessionEventKind, waiting_key};
use switchboard_kit::{Attempt, BatchStage, Outcome, Output, StageError, Topology};
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
    /// The tools the engine called for an outbound row, by name (also in its `metadata`).
    pub tool_names: Vec<String>,
    pub correlation_id: String,
    pub external_id: Option<String>,
    /// The row's `metadata` (a JSON object). Inbound rows keep where the message came from
    /// (`provider`, `sender`, `recipient`): an agent-started message goes back the same way.
    pub metadata: serde_json::Value,
    /// When the message the row belongs to was received (a reply: the message it answers). A
    /// row of a person forgotten since is not written ([`switchboard_kit::forgotten`]).
    pub received_at: chrono::DateTime<chrono::Utc>,
    /// A notice that the turn `seq` waits for the agent's runner: the wait it tells of is
    /// recorded in the session's journal with the row (the dispatcher records it too, unless
    /// the database was down when it told the person).
    pub runner_wait: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("entry is malformed: {0}")]
    Malformed(&'static str),
    /// The row breaks a constraint (e.g. its session does not exist): writing it again
    /// cannot succeed.
    #[error("entry refused by the database: {0}")]
    Refused(sqlx::Error),
    #[error("message log: {0}")]
    Database(sqlx::Error),
}

impl From<sqlx::Error> for LogError {
    fn from(e: sqlx::Error) -> Self {
        // SQLSTATE class 23: integrity constraint violation.
        let refused = e
            .as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|c| c.starts_with("23"));
        if refused {
            LogError::Refused(e)
        } else {
            LogError::Database(e)
        }
    }
}

impl LogError {
    fn into_stage(self) -> StageError {
        match self {
            LogError::Database(_) => StageError::transient(self),
            LogError::Malformed(_) | LogError::Refused(_) => StageError::permanent(self),
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

    /// Write the entries that are not already there, with one statement (one commit). Entries
    /// of a person forgotten after their message was received are dropped: their ids are
    /// returned.
    pub async fn record_all(&self, entries: &[LogEntry]) -> Result<Vec<Uuid>, LogError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let col = |f: fn(&LogEntry) -> String| entries.iter().map(f).collect::<Vec<_>>();
        let mut tx = self.db.begin().await?;
        // An erasure of one of these people waits for this write, or this write sees its
        // tombstone.
        let mut people = col(|e| e.person_id.clone());
        people.sort();
        people.dedup();
        switchboard_kit::forgotten::lock_shared_all(&mut *tx, &people).await?;
        let ids: Vec<Uuid> = entries.iter().map(|e| e.id).collect();
        let sessions: Vec<Uuid> = entries.iter().map(|e| e.session_id).collect();
        let processing_ms: Vec<Option<i64>> = entries.iter().map(|e| e.processing_ms).collect();
        let tool_calls: Vec<Option<i64>> = entries.iter().map(|e| e.tool_calls_count).collect();
        let external_ids: Vec<Option<String>> =
            entries.iter().map(|e| e.external_id.clone()).collect();
        let received: Vec<chrono::DateTime<chrono::Utc>> =
            entries.iter().map(|e| e.received_at).collect();
        let dropped = sqlx::query_scalar!(
            r#"WITH u AS (
                SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[],
                                     $6::text[], $7::text[], $8::text[], $9::bigint[],
                                     $10::bigint[], $11::text[], $12::text[], $13::text[],
                                     $14::timestamptz[])
                    AS u(id, session_id, person_id, agent_name, agent_identity, direction,
                         channel, message, processing_ms, tool_calls_count, correlation_id,
                         external_id, metadata, received)),
             dropped AS (
                SELECT id FROM u WHERE EXISTS (SELECT 1 FROM switchboard.forgotten_people f
                    WHERE f.person_sha256 = sha256(convert_to(u.person_id, 'UTF8'))
                      AND f.forgotten_at > u.received)),
             written AS (
                INSERT INTO switchboard.messages
                    (id, session_id, person_id, agent_name, agent_identity, direction, channel,
                     message, processing_ms, tool_calls_count, correlation_id, external_id,
                     metadata)
                SELECT id, session_id, person_id, agent_name, agent_identity, direction, channel,
                       message, processing_ms, tool_calls_count, correlation_id, external_id,
                       metadata::jsonb
                  FROM u WHERE id NOT IN (SELECT id FROM dropped)
                ON CONFLICT DO NOTHING)
             SELECT id AS "id!" FROM dropped"#,
            &ids,
            &sessions,
            &col(|e| e.person_id.clone()),
            &col(|e| e.agent_name.clone()),
            &col(|e| e.agent_identity.clone()),
            &col(|e| e.direction.as_str().to_string()),
            &col(|e| e.channel.clone()),
            &col(|e| e.message.clone()),
            // Entries that are not replies have none: arrays with NULLs.
            processing_ms as Vec<Option<i64>>,
            tool_calls as Vec<Option<i64>>,
            &col(|e| e.correlation_id.clone()),
            external_ids as Vec<Option<String>>,
            &col(|e| e.metadata.to_string()),
            &received,
        )
        .fetch_all(&mut *tx)
        .await?;
        self.record_runner_waits(&mut tx, entries, &dropped).await?;
        tx.commit().await?;
        Ok(dropped)
    }

    /// The journal entries of the runner waits that notices in `entries` tell of, as the
    /// dispatcher writes them (same key: whichever is second leaves the entry as it is). A wait
    /// of a session erased since is not written.
    async fn record_runner_waits(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        entries: &[LogEntry],
        dropped: &[Uuid],
    ) -> Result<(), sqlx::Error> {
        let waits: Vec<(&LogEntry, i64)> = entries
            .iter()
            .filter(|e| !dropped.contains(&e.id))
            .filter_map(|e| Some((e, e.runner_wait?)))
            .collect();
        if waits.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = waits.iter().map(|_| Uuid::now_v7()).collect();
        let sessions: Vec<Uuid> = waits.iter().map(|(e, _)| e.session_id).collect();
        let keys: Vec<String> = waits
            .iter()
            .map(|(e, _)| waiting_key(e.session_id, e.id))
            .collect();
        let seqs: Vec<i64> = waits.iter().map(|(_, seq)| *seq).collect();
        let details: Vec<serde_json::Value> = waits
            .iter()
            // Whom it told: in a session everyone shares, not the session's first person.
            .map(|(e, _)| serde_json::json!({ "notice_id": e.id, "person_id": e.person_id }))
            .collect();
        sqlx::query!(
            "INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
             SELECT w.id, w.session_id, w.key, $5, w.seq, w.detail
               FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[], $6::jsonb[])
                 AS w(id, session_id, key, seq, detail)
              WHERE EXISTS (SELECT 1 FROM switchboard.sessions s WHERE s.id = w.session_id)
             ON CONFLICT (key) DO NOTHING",
            &ids,
            &sessions,
            &keys,
            &seqs,
            SessionEventKind::Waiting as SessionEventKind,
            &details,
        )
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Write the well-formed entries of a batch at once; one outcome per entry, in order: the
    /// `message.logged` event, or why the entry was not written.
    async fn record_batch(
        &self,
        topology: &Topology,
        entries: Vec<Result<LogEntry, LogError>>,
    ) -> Vec<Outcome> {
        let valid: Vec<LogEntry> = entries
            .iter()
            .filter_map(|e| e.as_ref().ok())
            .cloned()
            .collect();
        // A row the database refuses fails the statement for the whole batch. Alone, an entry
        // gets the error itself (refused for good, or a database that is down or busy); in
        // company, every entry fails and the runtime runs each again by itself.
        let alone = valid.len() == 1;
        let (dropped, mut failure) = match self.record_all(&valid).await {
            Ok(dropped) => (dropped, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        entries
            .into_iter()
            .map(|entry| {
                let entry = entry.map_err(LogError::into_stage)?;
                match &failure {
                    // Their message was received before they were forgotten: not logged, not
                    // announced.
                    None if dropped.contains(&entry.id) => {
                        switchboard_kit::forgotten::dropped(
                            match entry.direction {
                                Direction::Inbound => "log-inbound",
                                Direction::Outbound => "log-outbound",
                            },
                            "message",
                        );
                        Ok(Vec::new())
                    }
                    None => Ok(vec![self.logged_event(topology, &entry)]),
                    Some(_) if alone => Err(failure.take().expect("checked").into_stage()),
                    Some(e) => Err(StageError::transient(anyhow::anyhow!("{e}"))),
                }
            })
            .collect()
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
            tool_names: e.tool_names.clone(),
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

/// How long a batch of the log may wait to fill. The log reads beside the reply path (no reply
/// waits for it), so under load it writes fewer, larger transactions (the bench's profile had a
/// commit for every 1.9 messages without it) for at most this much delay of `message.logged`.
pub const LINGER: Duration = Duration::from_millis(20);

impl LogInbound {
    pub fn new(log: MessageLog, topology: Topology) -> Self {
        Self { log, topology }
    }
}

impl BatchStage for LogInbound {
    type Input = Turn;
    const SPEC: StageSpec = StageSpec::new("log-inbound", Source::Work("turn.>")).linger(LINGER);

    async fn handle_batch(&self, turns: Vec<Turn>, _attempts: &[Attempt]) -> Vec<Outcome> {
        // A turn the agent started holds nothing the person said: no inbound row (its reply is
        // logged as outbound, like any reply).
        let person_said: Vec<&Turn> = turns.iter().filter(|t| t.person_said_something()).collect();
        let mut logged = self
            .log
            .record_batch(
                &self.topology,
                person_said.iter().map(|t| inbound_entry(t)).collect(),
            )
            .await
            .into_iter();
        turns
            .iter()
            .map(|t| {
                if t.person_said_something() {
                    logged.next().expect("one outcome per entry")
                } else {
                    Ok(Vec::new())
                }
            })
            .collect()
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
        tool_names: Vec::new(),
        correlation_id: inbound.correlation_id.clone(),
        external_id: Some(inbound.provider_message_id.clone()).filter(|s| !s.is_empty()),
        received_at: switchboard_kit::forgotten::received_at(inbound.received_at_ms),
        metadata: {
            let mut m = serde_json::json!({
                "provider": inbound.provider,
                "sender": inbound.sender,
                "recipient": inbound.recipient,
            });
            // A scheduled input is logged inbound (the agent answered it), marked as not the
            // person's words.
            if !inbound.scheduled.is_empty() {
                m["scheduled"] = inbound.scheduled.clone().into();
            }
            if inbound.heartbeat {
                m["heartbeat"] = true.into();
            }
            if !inbound.uploads.is_empty() {
                m["uploads"] = inbound.uploads.clone().into();
            }
            m
        },
        runner_wait: None,
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

impl BatchStage for LogOutbound {
    type Input = Reply;
    const SPEC: StageSpec = StageSpec::new("log-outbound", Source::Work("reply")).linger(LINGER);

    async fn handle_batch(&self, replies: Vec<Reply>, _attempts: &[Attempt]) -> Vec<Outcome> {
        let entries = replies.iter().map(outbound_entry).collect();
        self.log.record_batch(&self.topology, entries).await
    }
}

fn outbound_entry(reply: &Reply) -> Result<LogEntry, LogError> {
    Ok(LogEntry {
        id: parse_uuid(&reply.id, "reply id")?,
        session_id: parse_uuid(&reply.session_id, "session id")?,
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
        tool_names: reply.tool_names.clone(),
        correlation_id: reply.correlation_id.clone(),
        external_id: None,
        received_at: switchboard_kit::forgotten::id_time(&reply.in_reply_to),
        metadata: outbound_metadata(reply),
        runner_wait: (reply.kind == "notice" && reply.waits_for_runner).then_some(reply.seq),
    })
}

/// What an outbound row keeps beyond its text: a notice says so, a reply to several messages
/// (joined into one runner call) names them all, in order, the tools the engine called for
/// it are named (`tool_names`), and so are the files sent with it (`exports`: never a link).
fn outbound_metadata(reply: &Reply) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    if !reply.kind.is_empty() {
        m.insert("kind".into(), reply.kind.clone().into());
    }
    if !reply.answers.is_empty() {
        m.insert("answers".into(), reply.answers.clone().into());
    }
    if !reply.tool_names.is_empty() {
        m.insert("tool_names".into(), reply.tool_names.clone().into());
    }
    if !reply.operator.is_empty() {
        m.insert("operator".into(), reply.operator.clone().into());
    }
    if !reply.exports.is_empty() {
        let files: Vec<serde_json::Value> = reply
            .exports
            .iter()
            .map(|e| {
                serde_json::json!({
                    "id": e.id, "name": e.name, "content_type": e.content_type,
                    "size_bytes": e.size_bytes,
                })
            })
            .collect();
        m.insert("exports".into(), files.into());
    }
    m.into()
}

/// The inbound log stage, as the product lists it.
pub const INBOUND: Registration = Registration {
    spec: LogInbound::SPEC,
    worker: "log",
    start: |app: &App| {
        app.batch_stage_task(LogInbound::new(
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
        app.batch_stage_task(LogOutbound::new(
            MessageLog::new(app.db.clone()),
            app.topology.clone(),
        ))
    },
};

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_kit::proto::{IdentifiedMessage, InboundMessage, Person};

    fn turn(outbound_text: &str) -> Turn {
        Turn {
            session_id: Uuid::now_v7().to_string(),
            seq: 1,
            message: Some(IdentifiedMessage {
                inbound: Some(InboundMessage {
                    id: Uuid::now_v7().to_string(),
                    channel: "sms".into(),
                    provider: "twilio".into(),
                    sender: "+14155550100".into(),
                    recipient: "+15555550199".into(),
                    text: if outbound_text.is_empty() { "hi" } else { "" }.into(),
                    outbound_text: outbound_text.into(),
                    ..Default::default()
                }),
                person: Some(Person {
                    person_id: "phone:+14155550100".into(),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_inbound_row_keeps_the_way_back_to_the_person() {
        let entry = inbound_entry(&turn("")).unwrap();
        assert_eq!(
            entry.metadata,
            serde_json::json!({
                "provider": "twilio",
                "sender": "+14155550100",
                "recipient": "+15555550199",
            })
        );
    }

    #[test]
    fn a_turn_the_agent_started_has_nothing_the_person_said() {
        assert!(turn("").person_said_something());
        assert!(!turn("Your appointment is at 3pm.").person_said_something());
        let mut answered = turn("");
        let inbound = answered.message.as_mut().unwrap().inbound.as_mut().unwrap();
        inbound.outbound_text = "I sent a code to +14155550100.".into();
        assert!(
            answered.person_said_something(),
            "a message Switchboard answered itself is logged both ways"
        );
        let mut blank = turn("");
        let inbound = blank.message.as_mut().unwrap().inbound.as_mut().unwrap();
        inbound.text.clear();
        assert!(
            blank.person_said_something(),
            "a blank SMS (a picture alone) is the person's"
        );
    }
}
