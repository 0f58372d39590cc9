//! The sessions API: what happened in each person + agent variant's session, and a reset asked
//! for from outside the conversation. Behind API keys with the scopes `sessions:read` (every
//! `GET`) and `sessions:write` (the reset), which a key has only when an operator names them.
//!
//! - `GET /api/v1/sessions?person=&agent=&status=&channel=&after=&limit=`: sessions, newest
//!   first (by id: session ids are UUIDv7, so that is creation order); `after` is the `next` of
//!   the page before.
//! - `GET /api/v1/sessions/{id}`: one session, with its identity's summary.
//! - `GET /api/v1/sessions/{id}/messages?after=&limit=`: every message in and out, oldest first.
//! - `GET /api/v1/sessions/{id}/events?after=&limit=`: the session's journal, oldest first.
//! - `POST /api/v1/sessions/{id}/reset`: the session's next turn starts a fresh engine session.
//! - `GET /api/v1/sessions/{id}/export`: the conversation as JSONL, one message a line.
//!
//! An agent's turn token (`sbt_…`, docs/agent-tools.md) reads one session and its messages
//! only when the session is its person's with its identity (else 403); it lists, exports,
//! resets and reads journals never.
//!
//! Checked in this order: the key (401), its scope (403), the request (400), the session (404).
use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use switchboard_channels::ApiError;
use switchboard_channels::api::{ApiCaller, Scope};
use switchboard_kit::status::{ResetReason, SessionEventKind, SessionStatus};
use switchboard_kit::turn_token::TurnClaims;
use uuid::Uuid;

use crate::api::{caller, key_or_turn, outside_turn, refuse, unavailable};
use crate::query_params::{bad, given, query, query_limit};
use crate::{GatewayState, Refused, read_body};

pub fn routes() -> Router<GatewayState> {
    Router::new()
        .route("/api/v1/sessions", get(list))
        .route("/api/v1/sessions/{id}", get(show))
        .route("/api/v1/sessions/{id}/messages", get(messages))
        .route("/api/v1/sessions/{id}/events", get(events))
        .route("/api/v1/sessions/{id}/reset", post(reset))
        .route("/api/v1/sessions/{id}/export", get(export))
}

/// A page holds this many entries unless `limit` says otherwise.
const DEFAULT_LIMIT: i64 = 50;
/// The most a page holds.
const MAX_LIMIT: i64 = 500;
/// The export reads the conversation this many messages at a time, sending each batch as it
/// comes: a conversation of any length is exported whole, holding no database connection
/// between batches.
const EXPORT_BATCH: i64 = 500;

const STATUSES: [SessionStatus; 4] = [
    SessionStatus::Idle,
    SessionStatus::Running,
    SessionStatus::Waiting,
    SessionStatus::Terminated,
];

fn session_not_found(id: Uuid) -> Refused {
    refuse(ApiError::new(
        StatusCode::NOT_FOUND,
        "session_not_found",
        format!("no session {id}"),
    ))
}

async fn reader(state: &GatewayState, headers: &HeaderMap) -> Result<ApiCaller, Refused> {
    let caller = caller(state, headers).await?;
    caller.require(Scope::SessionsRead).map_err(refuse)?;
    Ok(caller)
}

/// A reader of one session: a key with `sessions:read`, or an agent's turn (its claims: the
/// session must then pass [`turn_may_read`]).
async fn session_reader(
    state: &GatewayState,
    headers: &HeaderMap,
) -> Result<Option<TurnClaims>, Refused> {
    let (caller, turn) = key_or_turn(state, headers).await?;
    caller.require(Scope::SessionsRead).map_err(refuse)?;
    Ok(turn)
}

/// A turn reads session `id` only when its person has it with its identity (any other
/// session, existing or not, is 403: nothing is revealed).
async fn turn_may_read(
    state: &GatewayState,
    turn: Option<&TurnClaims>,
    id: Uuid,
) -> Result<(), Refused> {
    let Some(turn) = turn else {
        return Ok(());
    };
    let theirs = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM switchboard.sessions
                           WHERE id = $1 AND person_id = $2 AND agent_identity = $3) AS "theirs!""#,
        id,
        turn.person(),
        turn.identity,
    )
    .fetch_one(&state.db)
    .await
    .map_err(unavailable)?;
    if !theirs {
        return Err(outside_turn(
            "this turn's token reads only its own person's sessions with its identity",
        ));
    }
    Ok(())
}

/// The session id of the path: 400 `invalid_session_id` unless it is a UUID.
fn session_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, Refused> {
    let Path(raw) = path.map_err(|e| bad("invalid_session_id", e.body_text()))?;
    raw.parse().map_err(|_| {
        let shown: String = raw.chars().filter(|c| !c.is_control()).take(60).collect();
        bad(
            "invalid_session_id",
            format!("{shown:?} is not a session id (a UUID)"),
        )
    })
}

/// `after`: the `next` cursor a page gave (an id).
fn cursor(value: Option<String>) -> Result<Option<Uuid>, Refused> {
    given(value)
        .map(|v| {
            v.parse().map_err(|_| {
                bad(
                    "invalid_cursor",
                    "after must be the `next` value of the page before",
                )
            })
        })
        .transpose()
}

fn status(value: Option<String>) -> Result<Option<SessionStatus>, Refused> {
    given(value)
        .map(|v| {
            STATUSES
                .into_iter()
                .find(|s| s.as_str() == v)
                .ok_or_else(|| {
                    let known: Vec<_> = STATUSES.iter().map(|s| s.as_str()).collect();
                    bad(
                        "invalid_status",
                        format!("status must be one of {}", known.join(", ")),
                    )
                })
        })
        .transpose()
}

/// A page of `rows` asked for with `limit`, one more than that fetched: the entries and the
/// cursor of the next page (`None` on the last).
fn page<T>(mut rows: Vec<T>, limit: i64, id: impl Fn(&T) -> Uuid) -> (Vec<T>, Option<String>) {
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next = more
        .then(|| rows.last().map(|r| id(r).to_string()))
        .flatten();
    (rows, next)
}

// ---- The read model -------------------------------------------------------------------------

/// A session as stored, with the channels its messages used (the same columns in
/// [`find_session`] and [`list`]).
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
struct SessionView {
    id: Uuid,
    person: PersonView,
    agent: AgentView,
    status: SessionStatus,
    /// The engine's own session id; `null` until the first reply (and after a reset, until
    /// the next one).
    engine_session_id: Option<String>,
    /// The channel the session began on.
    channel: String,
    /// Every channel the session's messages came or went by (with `channel`), sorted.
    channels: Vec<String>,
    turns: TurnsView,
    last_message_at: Option<DateTime<Utc>>,
    /// `"api"` while a reset asked for through this API waits for the next turn, else `null`.
    pending_reset: Option<String>,
    pending_reset_at: Option<DateTime<Utc>>,
    /// How many times the session started over with a fresh engine session.
    resets: i32,
    workspace_path: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

#[derive(Debug, Serialize)]
struct PersonView {
    id: String,
    #[serde(rename = "type")]
    person_type: String,
}

#[derive(Debug, Serialize)]
struct AgentView {
    name: String,
    identity: String,
    engine: String,
}

#[derive(Debug, Serialize)]
struct TurnsView {
    /// Turns finished (answered or given up on): the dispatcher's cursor.
    done: i64,
    /// The last finished turn's number (equal to `done`: turns are numbered from 1).
    last_seq: i64,
    /// Turns the session has numbered; `opened - done` are waiting or running.
    opened: i64,
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
        }
    }
}

/// One message in or out, as the messages page and the export show it.
#[derive(Debug, Serialize)]
struct MessageView {
    id: Uuid,
    at: DateTime<Utc>,
    /// `inbound` (the person's) or `outbound` (the agent's).
    direction: String,
    channel: String,
    agent: String,
    text: String,
    correlation_id: String,
    processing_ms: Option<i64>,
    tool_calls_count: Option<i64>,
}

#[derive(Debug, Serialize)]
struct EventView {
    id: Uuid,
    kind: SessionEventKind,
    /// The turn the entry belongs to, if it belongs to one.
    seq: Option<i64>,
    at: DateTime<Utc>,
    detail: serde_json::Value,
}

/// The identity's summary as a session shows it: what it says, when it was written, how
/// (`model` or `extractive`) and what it covers.
#[derive(Debug, Serialize)]
struct SummaryView {
    text: String,
    version: i64,
    method: String,
    written_at: DateTime<Utc>,
    /// Kept for clients of the first version of this view.
    updated_at: DateTime<Utc>,
    first_message_id: Option<Uuid>,
    last_message_id: Option<Uuid>,
    messages_covered: i64,
}

async fn find_session(state: &GatewayState, id: Uuid) -> Result<SessionRow, Refused> {
    sqlx::query_as!(
        SessionRow,
        r#"SELECT s.id, s.person_type, s.person_id, s.agent_name, s.agent_identity, s.engine_type,
                  s.engine_session_id, s.channel,
                  ARRAY(SELECT s.channel
                        UNION SELECT m.channel FROM switchboard.messages m
                         WHERE m.session_id = s.id
                        ORDER BY 1) AS "channels!",
                  s.memory_key, s.status AS "status: SessionStatus", s.next_seq, s.last_seq,
                  s.last_message_at, s.pending_reset, s.pending_reset_at, s.resets,
                  s.workspace_path, s.created_at, s.updated_at
             FROM switchboard.sessions s WHERE s.id = $1"#,
        id,
    )
    .fetch_optional(&state.db)
    .await
    .map_err(unavailable)?
    .ok_or_else(|| session_not_found(id))
}

async fn exists(state: &GatewayState, id: Uuid) -> Result<(), Refused> {
    let found = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM switchboard.sessions WHERE id = $1) AS "found!""#,
        id,
    )
    .fetch_one(&state.db)
    .await
    .map_err(unavailable)?;
    if found {
        Ok(())
    } else {
        Err(session_not_found(id))
    }
}

/// Up to `limit` of the session's messages after `after`, oldest first.
async fn message_page(
    db: &sqlx::PgPool,
    session: Uuid,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<MessageView>, sqlx::Error> {
    sqlx::query_as!(
        MessageView,
        "SELECT id, created_at AS at, direction, channel, agent_name AS agent, message AS text,
                correlation_id, processing_ms, tool_calls_count
           FROM switchboard.messages
          WHERE session_id = $1 AND ($2::uuid IS NULL OR id > $2)
          ORDER BY id
          LIMIT $3",
        session,
        after,
        limit,
    )
    .fetch_all(db)
    .await
}

// ---- The routes -----------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    person: Option<String>,
    agent: Option<String>,
    status: Option<String>,
    channel: Option<String>,
    after: Option<String>,
    limit: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    after: Option<String>,
    limit: Option<String>,
}

async fn list(
    State(state): State<GatewayState>,
    headers: HeaderMap,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Refused> {
    reader(&state, &headers).await?;
    let q = query(q)?;
    let status = status(q.status)?;
    let after = cursor(q.after)?;
    let limit = query_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let rows = sqlx::query_as!(
        SessionRow,
        r#"SELECT s.id, s.person_type, s.person_id, s.agent_name, s.agent_identity, s.engine_type,
                  s.engine_session_id, s.channel,
                  ARRAY(SELECT s.channel
                        UNION SELECT m.channel FROM switchboard.messages m
                         WHERE m.session_id = s.id
                        ORDER BY 1) AS "channels!",
                  s.memory_key, s.status AS "status: SessionStatus", s.next_seq, s.last_seq,
                  s.last_message_at, s.pending_reset, s.pending_reset_at, s.resets,
                  s.workspace_path, s.created_at, s.updated_at
             FROM switchboard.sessions s
            WHERE ($1::text IS NULL OR s.person_id = $1)
              AND ($2::text IS NULL OR s.agent_name = $2 OR s.agent_identity = $2)
              AND ($3::text IS NULL OR s.status = $3)
              AND ($4::text IS NULL OR s.channel = $4 OR EXISTS (
                      SELECT 1 FROM switchboard.messages m
                       WHERE m.session_id = s.id AND m.channel = $4))
              AND ($5::uuid IS NULL OR s.id < $5)
            ORDER BY s.id DESC
            LIMIT $6"#,
        given(q.person),
        given(q.agent),
        status.map(SessionStatus::as_str),
        given(q.channel),
        after,
        limit + 1,
    )
    .fetch_all(&state.db)
    .await
    .map_err(unavailable)?;
    let (rows, next) = page(rows, limit, |s| s.id);
    let sessions: Vec<SessionView> = rows.into_iter().map(SessionView::from).collect();
    Ok(Json(serde_json::json!({"sessions": sessions, "next": next})).into_response())
}

async fn show(
    State(state): State<GatewayState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Refused> {
    let turn = session_reader(&state, &headers).await?;
    let id = session_id(path)?;
    turn_may_read(&state, turn.as_ref(), id).await?;
    let session = find_session(&state, id).await?;
    let summary = sqlx::query_as!(
        SummaryView,
        "SELECT summary AS text, version, method, updated_at AS written_at, updated_at,
                first_message_in_summary AS first_message_id,
                last_message_in_summary AS last_message_id, messages_covered
           FROM switchboard.summaries WHERE memory_key = $1",
        session.memory_key,
    )
    .fetch_optional(&state.db)
    .await
    .map_err(unavailable)?;
    let mut body = serde_json::to_value(SessionView::from(session)).map_err(unavailable)?;
    body["summary"] = serde_json::to_value(summary).map_err(unavailable)?;
    Ok(Json(body).into_response())
}

async fn messages(
    State(state): State<GatewayState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, Refused> {
    let turn = session_reader(&state, &headers).await?;
    let id = session_id(path)?;
    let q = query(q)?;
    let (after, limit) = (
        cursor(q.after)?,
        query_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)?,
    );
    turn_may_read(&state, turn.as_ref(), id).await?;
    exists(&state, id).await?;
    let rows = message_page(&state.db, id, after, limit + 1)
        .await
        .map_err(unavailable)?;
    let (messages, next) = page(rows, limit, |m| m.id);
    Ok(Json(serde_json::json!({"messages": messages, "next": next})).into_response())
}

async fn events(
    State(state): State<GatewayState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, Refused> {
    reader(&state, &headers).await?;
    let id = session_id(path)?;
    let q = query(q)?;
    let (after, limit) = (
        cursor(q.after)?,
        query_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)?,
    );
    exists(&state, id).await?;
    let rows = sqlx::query_as!(
        EventView,
        r#"SELECT id, kind AS "kind: SessionEventKind", seq, at, detail
             FROM switchboard.session_events
            WHERE session_id = $1 AND ($2::uuid IS NULL OR id > $2)
            ORDER BY id
            LIMIT $3"#,
        id,
        after,
        limit + 1,
    )
    .fetch_all(&state.db)
    .await
    .map_err(unavailable)?;
    let (events, next) = page(rows, limit, |e| e.id);
    Ok(Json(serde_json::json!({"events": events, "next": next})).into_response())
}

/// Ask for a fresh engine session: marked pending on the session and written in its journal
/// in one transaction; the session's next turn applies it, in its order. Asking again while
/// one is pending leaves one pending reset (and one more journal entry: who asked, when).
async fn reset(
    State(state): State<GatewayState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, Refused> {
    let caller = caller(&state, &headers).await?;
    caller.require(Scope::SessionsWrite).map_err(refuse)?;
    let id = session_id(path)?;
    // No body is needed; one that is sent is bounded like every other.
    read_body(&headers, body, state.config.gateway.max_body_bytes)
        .await
        .map_err(refuse)?;

    let mut tx = state.db.begin().await.map_err(unavailable)?;
    let status = sqlx::query_scalar!(
        r#"SELECT status AS "status: SessionStatus" FROM switchboard.sessions
            WHERE id = $1 FOR UPDATE"#,
        id,
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(unavailable)?;
    match status {
        None => return Err(session_not_found(id)),
        Some(SessionStatus::Terminated) => {
            return Err(refuse(ApiError::new(
                StatusCode::CONFLICT,
                "session_terminated",
                format!("session {id} is terminated: it takes no more turns"),
            )));
        }
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
    .await
    .map_err(unavailable)?;
    let entry = Uuid::now_v7();
    sqlx::query!(
        "INSERT INTO switchboard.session_events (id, session_id, key, kind, detail)
         VALUES ($1, $2, $3, $4, $5)",
        entry,
        id,
        format!("reset_requested:{id}:{entry}"),
        SessionEventKind::ResetRequested as SessionEventKind,
        serde_json::json!({"by": format!("api:{}", caller.owner)}),
    )
    .execute(&mut *tx)
    .await
    .map_err(unavailable)?;
    tx.commit().await.map_err(unavailable)?;
    tracing::info!(session_id = %id, by = %caller.owner, "session reset requested");
    let body = serde_json::json!({
        "session_id": id,
        "pending_reset": "api",
        "pending_reset_at": pending_reset_at,
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// The conversation as JSONL (`application/x-ndjson`): one [`MessageView`] a line, oldest
/// first, sent batch by batch as it is read. A failure after the first batch can no longer
/// change the status: the response is cut off (an incomplete transfer), never a short file
/// that looks whole.
async fn export(
    State(state): State<GatewayState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Refused> {
    reader(&state, &headers).await?;
    let id = session_id(path)?;
    exists(&state, id).await?;
    let db = state.db.clone();
    let batches = futures::stream::try_unfold(Some(None), move |after: Option<Option<Uuid>>| {
        let db = db.clone();
        async move {
            let Some(after) = after else {
                return Ok(None);
            };
            let rows = message_page(&db, id, after, EXPORT_BATCH)
                .await
                .inspect_err(|e| tracing::error!(error = %e, session_id = %id, "export cut off"))?;
            if rows.is_empty() {
                return Ok(None);
            }
            let mut lines = Vec::new();
            for row in &rows {
                serde_json::to_writer(&mut lines, row).map_err(std::io::Error::other)?;
                lines.push(b'\n');
            }
            let next = (rows.len() as i64 == EXPORT_BATCH).then(|| rows.last().map(|m| m.id));
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Some((Bytes::from(lines), next)))
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"session-{id}.jsonl\""),
            ),
        ],
        Body::from_stream(batches),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<impl std::fmt::Debug, Refused>) -> &'static str {
        r.unwrap_err().0.code()
    }

    #[test]
    fn a_page_is_checked_before_anything_is_read() {
        assert_eq!(cursor(Some(String::new())).unwrap(), None);
        assert_eq!(code(cursor(Some("x".into()))), "invalid_cursor");
        assert_eq!(
            status(Some("waiting".into())).unwrap(),
            Some(SessionStatus::Waiting)
        );
        assert_eq!(code(status(Some("asleep".into()))), "invalid_status");
    }

    #[test]
    fn a_page_that_is_full_points_to_the_next() {
        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
        let (rows, next) = page(ids.clone(), 2, |u| *u);
        assert_eq!((rows.len(), next), (2, Some(ids[1].to_string())));
        let (rows, next) = page(ids.clone(), 3, |u| *u);
        assert_eq!((rows.len(), next), (3, None));
    }
}
