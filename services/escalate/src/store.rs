//! Escalations as stored (`switchboard.escalations`): raised once per (reply, label), listed
//! for the console's queue with what the person and the agent last said, acknowledged once.
//! Each change writes its journal entry in the same transaction.
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use switchboard_kit::status::SessionEventKind;
use uuid::Uuid;

/// One escalation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Escalation {
    pub id: Uuid,
    pub session_id: Uuid,
    pub person_id: String,
    pub agent_identity: String,
    pub channel: String,
    pub label: String,
    pub inbound_message_id: Option<Uuid>,
    pub outbound_message_id: Uuid,
    pub raised_at: DateTime<Utc>,
    pub acknowledged_at: Option<DateTime<Utc>>,
    pub acknowledged_by: Option<String>,
}

/// What [`raise`] is told: a labelled exchange.
#[derive(Debug, Clone)]
pub struct NewEscalation {
    pub session_id: Uuid,
    pub person_id: String,
    pub agent_identity: String,
    pub channel: String,
    pub label: String,
    pub inbound_message_id: Option<Uuid>,
    pub outbound_message_id: Uuid,
}

/// What [`raise`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Raised {
    /// Raised now.
    New(Escalation),
    /// Raised before (the event came again): the same escalation.
    Before(Escalation),
    /// The session is gone (its person was forgotten): nothing to raise.
    SessionGone,
}

/// Raise the escalation of a labelled exchange, once: a second call for the same reply and
/// label finds the first.
pub async fn raise(db: &PgPool, new: &NewEscalation) -> Result<Raised, sqlx::Error> {
    let mut tx = db.begin().await?;
    // Only while the session exists: a person forgotten since the label was given leaves
    // nothing behind.
    let inserted = sqlx::query_as!(
        Escalation,
        "INSERT INTO switchboard.escalations
                (id, session_id, person_id, agent_identity, channel, label,
                 inbound_message_id, outbound_message_id)
         SELECT $1, s.id, $3, $4, $5, $6, $7, $8
           FROM switchboard.sessions s WHERE s.id = $2
         ON CONFLICT (outbound_message_id, label) DO NOTHING
         RETURNING id, session_id, person_id, agent_identity, channel, label,
                   inbound_message_id, outbound_message_id, raised_at, acknowledged_at,
                   acknowledged_by",
        Uuid::now_v7(),
        new.session_id,
        new.person_id,
        new.agent_identity,
        new.channel,
        new.label,
        new.inbound_message_id,
        new.outbound_message_id,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(raised) = inserted else {
        tx.rollback().await?;
        let before = sqlx::query_as!(
            Escalation,
            "SELECT id, session_id, person_id, agent_identity, channel, label,
                    inbound_message_id, outbound_message_id, raised_at, acknowledged_at,
                    acknowledged_by
               FROM switchboard.escalations WHERE outbound_message_id = $1 AND label = $2",
            new.outbound_message_id,
            new.label,
        )
        .fetch_optional(db)
        .await?;
        return Ok(before.map_or(Raised::SessionGone, Raised::Before));
    };
    journal(
        &mut tx,
        raised.session_id,
        format!("escalated:{}", raised.id),
        SessionEventKind::Escalated,
        serde_json::json!({
            "escalation_id": raised.id,
            "label": raised.label,
            "outbound_message_id": raised.outbound_message_id,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(Raised::New(raised))
}

async fn journal(
    tx: &mut sqlx::PgConnection,
    session: Uuid,
    key: String,
    kind: SessionEventKind,
    detail: serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO switchboard.session_events (id, session_id, key, kind, detail)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (key) DO NOTHING",
        Uuid::now_v7(),
        session,
        key,
        kind as SessionEventKind,
        detail,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// What [`acknowledge`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acknowledged {
    /// Acknowledged now, by the caller.
    Now(Escalation),
    /// Acknowledged before (by whoever it says): nothing changed.
    Before(Escalation),
    NotFound,
}

/// Acknowledge escalation `id` as `by` (an operator's login or key owner), once.
pub async fn acknowledge(db: &PgPool, id: Uuid, by: &str) -> Result<Acknowledged, sqlx::Error> {
    let mut tx = db.begin().await?;
    let now = sqlx::query_as!(
        Escalation,
        "UPDATE switchboard.escalations SET acknowledged_at = now(), acknowledged_by = $2
          WHERE id = $1 AND acknowledged_at IS NULL
         RETURNING id, session_id, person_id, agent_identity, channel, label,
                   inbound_message_id, outbound_message_id, raised_at, acknowledged_at,
                   acknowledged_by",
        id,
        by,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(acknowledged) = now else {
        tx.rollback().await?;
        return Ok(match one(db, id).await? {
            Some(e) => Acknowledged::Before(e),
            None => Acknowledged::NotFound,
        });
    };
    journal(
        &mut tx,
        acknowledged.session_id,
        format!("escalation_acknowledged:{id}"),
        SessionEventKind::EscalationAcknowledged,
        serde_json::json!({"escalation_id": id, "by": by, "label": acknowledged.label}),
    )
    .await?;
    tx.commit().await?;
    Ok(Acknowledged::Now(acknowledged))
}

/// Escalation `id`.
pub async fn one(db: &PgPool, id: Uuid) -> Result<Option<Escalation>, sqlx::Error> {
    sqlx::query_as!(
        Escalation,
        "SELECT id, session_id, person_id, agent_identity, channel, label,
                inbound_message_id, outbound_message_id, raised_at, acknowledged_at,
                acknowledged_by
           FROM switchboard.escalations WHERE id = $1",
        id,
    )
    .fetch_optional(db)
    .await
}

/// Which escalations to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    Open,
    Acknowledged,
    All,
}

/// A message of the escalated conversation, as the queue shows it.
#[derive(Debug, Clone, Serialize)]
pub struct RecentMessage {
    pub direction: String,
    pub text: String,
    pub at: DateTime<Utc>,
}

/// An escalation with what the queue shows beside it.
#[derive(Debug, Clone, Serialize)]
pub struct QueuedEscalation {
    #[serde(flatten)]
    pub escalation: Escalation,
    /// The person's name in the directory (empty when it has none).
    pub person_name: String,
    /// The agent (engine variant) of the session.
    pub agent: String,
    /// The person's last messages and the agent's replies in that session, oldest first.
    pub last_messages: Vec<RecentMessage>,
}

/// Escalations, open ones oldest first (the queue's order: who has waited longest), the
/// others newest first; each with the person's last `recent` messages of the session.
pub async fn list(
    db: &PgPool,
    which: Listed,
    limit: i64,
    recent: i64,
) -> Result<Vec<QueuedEscalation>, sqlx::Error> {
    let (open, acked) = match which {
        Listed::Open => (true, false),
        Listed::Acknowledged => (false, true),
        Listed::All => (true, true),
    };
    let rows = sqlx::query!(
        r#"SELECT e.id, e.session_id, e.person_id, e.agent_identity, e.channel, e.label,
                  e.inbound_message_id, e.outbound_message_id, e.raised_at,
                  e.acknowledged_at, e.acknowledged_by,
                  COALESCE(p.name, '') AS "person_name!", s.agent_name
             FROM switchboard.escalations e
             JOIN switchboard.sessions s ON s.id = e.session_id
             LEFT JOIN switchboard.people p ON p.person_id = e.person_id
            WHERE (e.acknowledged_at IS NULL AND $1) OR (e.acknowledged_at IS NOT NULL AND $2)
            ORDER BY (e.acknowledged_at IS NULL) DESC,
                     CASE WHEN e.acknowledged_at IS NULL THEN e.raised_at END ASC,
                     e.raised_at DESC
            LIMIT $3"#,
        open,
        acked,
        limit,
    )
    .fetch_all(db)
    .await?;
    let sessions: Vec<Uuid> = rows.iter().map(|r| r.session_id).collect();
    let persons: Vec<String> = rows.iter().map(|r| r.person_id.clone()).collect();
    let messages = sqlx::query!(
        r#"SELECT session_id AS "session_id!", person_id AS "person_id!",
                  direction AS "direction!", message AS "message!", created_at AS "created_at!"
             FROM (SELECT m.session_id, m.person_id, m.direction, m.message, m.created_at,
                          row_number() OVER (PARTITION BY m.session_id, m.person_id
                                             ORDER BY m.id DESC) AS n
                     FROM switchboard.messages m
                     JOIN (SELECT DISTINCT * FROM unnest($1::uuid[], $2::text[])
                             AS u(session_id, person_id)) q
                       ON q.session_id = m.session_id AND q.person_id = m.person_id) recent
            WHERE n <= $3
            ORDER BY created_at"#,
        &sessions,
        &persons,
        recent,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let last_messages = messages
                .iter()
                .filter(|m| m.session_id == r.session_id && m.person_id == r.person_id)
                .map(|m| RecentMessage {
                    direction: m.direction.clone(),
                    text: m.message.clone(),
                    at: m.created_at,
                })
                .collect();
            QueuedEscalation {
                escalation: Escalation {
                    id: r.id,
                    session_id: r.session_id,
                    person_id: r.person_id,
                    agent_identity: r.agent_identity,
                    channel: r.channel,
                    label: r.label,
                    inbound_message_id: r.inbound_message_id,
                    outbound_message_id: r.outbound_message_id,
                    raised_at: r.raised_at,
                    acknowledged_at: r.acknowledged_at,
                    acknowledged_by: r.acknowledged_by,
                },
                person_name: r.person_name,
                agent: r.agent_name,
                last_messages,
            }
        })
        .collect())
}
