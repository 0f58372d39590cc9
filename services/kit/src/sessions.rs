//! Sessions as operators read them, and the reset they may ask for: one read model for the
//! sessions API (`GET /api/v1/sessions…`, the gateway) and `switchboard sessions` (the CLI),
//! so that both show the same thing.
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::status::{ResetReason, SessionEventKind, SessionStatus};

/// Every status a session can have, as filters name them.
pub const STATUSES: [SessionStatus; 5] = [
    SessionStatus::Idle,
    SessionStatus::Running,
    SessionStatus::Waiting,
    SessionStatus::Terminated,
    SessionStatus::Rescheduling,
];

/// The status named `name`, if it is one.
pub fn parse_status(name: &str) -> Option<SessionStatus> {
    STATUSES.into_iter().find(|s| s.as_str() == name)
}

/// Which sessions a list shows (each filter, when given, must hold).
#[derive(Debug, Default, Clone)]
pub struct SessionFilter {
    pub person: Option<String>,
    /// An engine variant (`reggie_oc`) or an identity (`reggie`: every variant of it).
    pub agent: Option<String>,
    pub status: Option<SessionStatus>,
    /// The channel it began on or any its messages used.
    pub channel: Option<String>,
}

/// Entries in order and where the next page starts (`None` on the last).
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<Uuid>,
}

impl<T> Page<T> {
    /// A page of `rows` asked for with `limit`, one more than that fetched.
    fn of(mut rows: Vec<T>, limit: i64, id: impl Fn(&T) -> Uuid) -> Self {
        let more = rows.len() as i64 > limit;
        rows.truncate(limit.max(0) as usize);
        let next = more.then(|| rows.last().map(&id)).flatten();
        Self { items: rows, next }
    }
}

/// A session as stored, with the channels its messages used.
#[derive(Debug)]
struct SessionRow {
    id: Uuid,
    person_type: String,
    person_id: String,
    agent_name: String,
    agent_identity: String,
    engine_type: String,
    engine_session_id: Option<String>,
    channel: String,
    channels: Vec<String>,
    memory_key: String,
    status: SessionStatus,
    next_seq: i64,
    last_seq: i64,
    last_message_at: Option<DateTime<Utc>>,
    pending_reset: Option<String>,
    pending_reset_at: Option<DateTime<Utc>>,
    resets: i32,
    workspace_path: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

#[derive(Debug, Serialize)]
pub struct SessionView {
    pub id: Uuid,
    pub person: PersonView,
    pub agent: AgentView,
    pub status: SessionStatus,
    /// The engine's own session id; `null` until the first reply (and after a reset, until
    /// the next one).
    pub engine_session_id: Option<String>,
    /// The channel the session began on.
    pub channel: String,
    /// Every channel the session's messages came or went by (with `channel`), sorted.
    pub channels: Vec<String>,
    pub turns: TurnsView,
    pub last_message_at: Option<DateTime<Utc>>,
    /// `"api"` while a reset asked for from outside the conversation waits for the next turn,
    /// else `null`.
    pub pending_reset: Option<String>,
    pub pending_reset_at: Option<DateTime<Utc>>,
    /// How many times the session started over with a fresh engine session.
    pub resets: i32,
    pub workspace_path: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Whose summary the session shares (its person + agent identity); not shown.
    #[serde(skip)]
    pub memory_key: String,
}

#[derive(Debug, Serialize)]
pub struct PersonView {
    pub id: String,
    #[serde(rename = "type")]
    pub person_type: String,
}

#[derive(Debug, Serialize)]
pub struct AgentView {
    pub name: String,
    pub identity: String,
    pub engine: String,
}

#[derive(Debug, Serialize)]
pub struct TurnsView {
    /// Turns finished (answered or given up on): the dispatcher's cursor.
    pub done: i64,
    /// The last finished turn's number (equal to `done`: turns are numbered from 1).
    pub last_seq: i64,
    /// Turns the session has numbered; `opened - done` are waiting or running.
    pub opened: i64,
}

impl From<SessionRow> for SessionView {
    fn from(s: SessionRow) -> Self {
        Self {
            id: s.id,
            person: PersonView {
                id: s.person_id,
                person_type: s.person_type,
            },
            agent: AgentView {
                name: s.agent_name,
                identity: s.agent_identity,
                engine: s.engine_type,
            },
            status: s.status,
            engine_session_id: s.engine_session_id,
            channel: s.channel,
            channels: s.channels,
            turns: TurnsView {
                done: s.last_seq,
                last_seq: s.last_seq,
                opened: s.next_seq - 1,
            },
            last_message_at: s.last_message_at,
            pending_reset: s.pending_reset,
            pending_reset_at: s.pending_reset_at,
            resets: s.resets,
            workspace_path: s.workspace_path,
            created_at: s.created_at,
            updated_at: s.updated_at,
            memory_key: s.memory_key,
        }
    }
}

/// One message in or out, as the messages page and the export show it.
#[derive(Debug, Serialize)]
pub struct MessageView {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    /// `inbound` (the person's) or `outbound` (the agent's).
    pub direction: String,
    pub channel: String,
    pub agent: String,
    pub text: String,
    pub correlation_id: String,
    pub processing_ms: Option<i64>,
    pub tool_calls_count: Option<i64>,
    /// The tools the engine called for an agent's reply, by name (never their arguments).
    pub tool_names: Vec<String>,
    /// The operator who wrote an outbound message during a takeover (`null`: the agent, or
    /// Switchboard).
    pub operator: Option<String>,
}

/// An entry of the session's journal (resets, waits, recalls, summaries).
#[derive(Debug, Serialize)]
pub struct EventView {
    pub id: Uuid,
    pub kind: SessionEventKind,
    /// The turn the entry belongs to, if it belongs to one.
    pub seq: Option<i64>,
    pub at: DateTime<Utc>,
    pub detail: serde_json::Value,
}

/// The identity's summary as a session shows it: what it says, when it was written, how
/// (`model` or `extractive`) and what it covers.
#[derive(Debug, Serialize)]
pub struct SummaryView {
    pub text: String,
    pub version: i64,
    pub method: String,
    pub written_at: DateTime<Utc>,
    /// Kept for clients of the first version of this view.
    pub updated_at: DateTime<Utc>,
    pub first_message_id: Option<Uuid>,
    pub last_message_id: Option<Uuid>,
    pub messages_covered: i64,
}

/// Up to `limit` sessions after `after` (a page's `next`), newest first (by id: session ids
/// are UUIDv7, so that is creation order).
pub async fn list_sessions(
    db: &PgPool,
    filter: &SessionFilter,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Page<SessionView>, sqlx::Error> {
    let rows = sqlx::query_as!(
        SessionRow,
        r#"SELECT s.id, s.person_type, s.person_id, s.agent_name, s.agent_identity, s.engine_type,
                  s.engine_session_id, s.channel,
                  ARRAY(SELECT s.channel
                        UNION SELECT m.channel FROM switchboard.messages m
                         WHERE m.session_id = s.id
                        ORDER BY 1) AS "channels!",
                  s.memory_key,
                  CASE WHEN s.status = 'idle' AND EXISTS (
                           SELECT 1 FROM switchboard.wakeups w
                            WHERE w.session_id = s.id AND w.status = 'pending')
                       THEN 'rescheduling' ELSE s.status END AS "status!: SessionStatus",
                  s.next_seq, s.last_seq,
                  s.last_message_at, s.pending_reset, s.pending_reset_at, s.resets,
                  s.workspace_path, s.created_at, s.updated_at
             FROM switchboard.sessions s
            WHERE ($1::text IS NULL OR s.person_id = $1)
              AND ($2::text IS NULL OR s.agent_name = $2 OR s.agent_identity = $2)
              AND ($3::text IS NULL OR (CASE WHEN s.status = 'idle' AND EXISTS (
                           SELECT 1 FROM switchboard.wakeups w
                            WHERE w.session_id = s.id AND w.status = 'pending')
                       THEN 'rescheduling' ELSE s.status END) = $3)
              AND ($4::text IS NULL OR s.channel = $4 OR EXISTS (
                      SELECT 1 FROM switchboard.messages m
                       WHERE m.session_id = s.id AND m.channel = $4))
              AND ($5::uuid IS NULL OR s.id < $5)
            ORDER BY s.id DESC
            LIMIT $6"#,
        filter.person,
        filter.agent,
        filter.status.map(SessionStatus::as_str),
        filter.channel,
        after,
        limit + 1,
    )
    .fetch_all(db)
    .await?;
    let page = Page::of(rows, limit, |s| s.id);
    Ok(Page {
        items: page.items.into_iter().map(SessionView::from).collect(),
        next: page.next,
    })
}

/// Session `id`, if there is one.
pub async fn find_session(db: &PgPool, id: Uuid) -> Result<Option<SessionView>, sqlx::Error> {
    let row = sqlx::query_as!(
        SessionRow,
        r#"SELECT s.id, s.person_type, s.person_id, s.agent_name, s.agent_identity, s.engine_type,
                  s.engine_session_id, s.channel,
                  ARRAY(SELECT s.channel
                        UNION SELECT m.channel FROM switchboard.messages m
                         WHERE m.session_id = s.id
                        ORDER BY 1) AS "channels!",
                  s.memory_key,
                  CASE WHEN s.status = 'idle' AND EXISTS (
                           SELECT 1 FROM switchboard.wakeups w
                            WHERE w.session_id = s.id AND w.status = 'pending')
                       THEN 'rescheduling' ELSE s.status END AS "status!: SessionStatus",
                  s.next_seq, s.last_seq,
                  s.last_message_at, s.pending_reset, s.pending_reset_at, s.resets,
                  s.workspace_path, s.created_at, s.updated_at
             FROM switchboard.sessions s WHERE s.id = $1"#,
        id,
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(SessionView::from))
}

/// Whether session `id` exists.
pub async fn session_exists(db: &PgPool, id: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM switchboard.sessions WHERE id = $1) AS "found!""#,
        id,
    )
    .fetch_one(db)
    .await
}

/// The summary the session's person + agent identity share, if one was written.
pub async fn session_summary(
    db: &PgPool,
    session: &SessionView,
) -> Result<Option<SummaryView>, sqlx::Error> {
    sqlx::query_as!(
        SummaryView,
        "SELECT summary AS text, version, method, updated_at AS written_at, updated_at,
                first_message_in_summary AS first_message_id,
                last_message_in_summary AS last_message_id, messages_covered
           FROM switchboard.summaries WHERE memory_key = $1",
        session.memory_key,
    )
    .fetch_optional(db)
    .await
}

/// Up to `limit` of the session's messages after `after`, oldest first.
pub async fn session_messages(
    db: &PgPool,
    session: Uuid,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Page<MessageView>, sqlx::Error> {
    let rows = sqlx::query_as!(
        MessageView,
        r#"SELECT id, created_at AS at, direction, channel, agent_name AS agent, message AS text,
                correlation_id, processing_ms, tool_calls_count,
                ARRAY(SELECT jsonb_array_elements_text(
                          CASE jsonb_typeof(metadata->'tool_names')
                               WHEN 'array' THEN metadata->'tool_names' ELSE '[]' END))
                    AS "tool_names!",
                metadata->>'operator' AS operator
           FROM switchboard.messages
          WHERE session_id = $1 AND ($2::uuid IS NULL OR id > $2)
          ORDER BY id
          LIMIT $3"#,
        session,
        after,
        limit + 1,
    )
    .fetch_all(db)
    .await?;
    Ok(Page::of(rows, limit, |m| m.id))
}

/// The session's last `limit` messages, oldest first.
pub async fn last_messages(
    db: &PgPool,
    session: Uuid,
    limit: i64,
) -> Result<Vec<MessageView>, sqlx::Error> {
    let mut rows = sqlx::query_as!(
        MessageView,
        r#"SELECT id, created_at AS at, direction, channel, agent_name AS agent, message AS text,
                correlation_id, processing_ms, tool_calls_count,
                ARRAY(SELECT jsonb_array_elements_text(
                          CASE jsonb_typeof(metadata->'tool_names')
                               WHEN 'array' THEN metadata->'tool_names' ELSE '[]' END))
                    AS "tool_names!",
                metadata->>'operator' AS operator
           FROM switchboard.messages
          WHERE session_id = $1
          ORDER BY id DESC
          LIMIT $2"#,
        session,
        limit,
    )
    .fetch_all(db)
    .await?;
    rows.reverse();
    Ok(rows)
}

/// Up to `limit` entries of the session's journal after `after`, oldest first.
pub async fn session_events(
    db: &PgPool,
    session: Uuid,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Page<EventView>, sqlx::Error> {
    let rows = sqlx::query_as!(
        EventView,
        r#"SELECT id, kind AS "kind: SessionEventKind", seq, at, detail
             FROM switchboard.session_events
            WHERE session_id = $1 AND ($2::uuid IS NULL OR id > $2)
            ORDER BY id
            LIMIT $3"#,
        session,
        after,
        limit + 1,
    )
    .fetch_all(db)
    .await?;
    Ok(Page::of(rows, limit, |e| e.id))
}

/// The session's last `limit` journal entries, oldest first.
pub async fn last_events(
    db: &PgPool,
    session: Uuid,
    limit: i64,
) -> Result<Vec<EventView>, sqlx::Error> {
    let mut rows = sqlx::query_as!(
        EventView,
        r#"SELECT id, kind AS "kind: SessionEventKind", seq, at, detail
             FROM switchboard.session_events
            WHERE session_id = $1
            ORDER BY id DESC
            LIMIT $2"#,
        session,
        limit,
    )
    .fetch_all(db)
    .await?;
    rows.reverse();
    Ok(rows)
}

/// What asking for a reset did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetRequest {
    /// Pending since then: the session's next turn starts a fresh engine session.
    Pending(DateTime<Utc>),
    NoSuchSession,
    /// The session takes no more turns.
    Terminated,
}

/// Ask for a fresh engine session on behalf of `by` (`api:<owner>`, `cli:<user>`): marked
/// pending on the session and written in its journal in one transaction; the session's next
/// turn applies it, in its order. Asking again while one is pending leaves one pending reset
/// (and one more journal entry: who asked, when).
pub async fn request_reset(db: &PgPool, id: Uuid, by: &str) -> Result<ResetRequest, sqlx::Error> {
    let mut tx = db.begin().await?;
    let status = sqlx::query_scalar!(
        r#"SELECT status AS "status: SessionStatus" FROM switchboard.sessions
            WHERE id = $1 FOR UPDATE"#,
        id,
    )
    .fetch_optional(&mut *tx)
    .await?;
    match status {
        None => return Ok(ResetRequest::NoSuchSession),
        Some(SessionStatus::Terminated) => return Ok(ResetRequest::Terminated),
        Some(_) => {}
    }
    let pending_reset_at = sqlx::query_scalar!(
        r#"UPDATE switchboard.sessions SET pending_reset = $2, pending_reset_at = now()
            WHERE id = $1
           RETURNING pending_reset_at AS "pending_reset_at!""#,
        id,
        ResetReason::Api as ResetReason,
    )
    .fetch_one(&mut *tx)
    .await?;
    let entry = Uuid::now_v7();
    sqlx::query!(
        "INSERT INTO switchboard.session_events (id, session_id, key, kind, detail)
         VALUES ($1, $2, $3, $4, $5)",
        entry,
        id,
        format!("reset_requested:{id}:{entry}"),
        SessionEventKind::ResetRequested as SessionEventKind,
        serde_json::json!({ "by": by }),
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::info!(session_id = %id, by, "session reset requested");
    Ok(ResetRequest::Pending(pending_reset_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_that_is_full_points_to_the_next() {
        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
        let page = Page::of(ids.clone(), 2, |u| *u);
        assert_eq!((page.items.len(), page.next), (2, Some(ids[1])));
        let page = Page::of(ids.clone(), 3, |u| *u);
        assert_eq!((page.items.len(), page.next), (3, None));
    }

    #[test]
    fn statuses_are_found_by_name() {
        assert_eq!(parse_status("waiting"), Some(SessionStatus::Waiting));
        assert_eq!(parse_status("asleep"), None);
    }
}
