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
use serde::Deserialize;
use switchboard_channels::ApiError;
use switchboard_channels::api::Scope;
use switchboard_kit::sessions::{self, ResetRequest, SessionFilter, SessionView};
use switchboard_kit::status::SessionStatus;
use switchboard_kit::turn_token::TurnClaims;
use uuid::Uuid;

use crate::auth::{Key, KeyOrTurn, outside_turn};
use crate::query_params::{bad, given, query, query_limit};
use crate::refusal::{refuse, unavailable};
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

pub(crate) fn session_not_found(id: Uuid) -> Refused {
    refuse(ApiError::new(
        StatusCode::NOT_FOUND,
        "session_not_found",
        format!("no session {id}"),
    ))
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
pub(crate) fn session_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, Refused> {
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
            sessions::parse_status(&v).ok_or_else(|| {
                let known: Vec<_> = sessions::STATUSES.iter().map(|s| s.as_str()).collect();
                bad(
                    "invalid_status",
                    format!("status must be one of {}", known.join(", ")),
                )
            })
        })
        .transpose()
}

/// A page's `next` as the API gives it.
fn next(page_next: Option<Uuid>) -> Option<String> {
    page_next.map(|id| id.to_string())
}

async fn find_session(state: &GatewayState, id: Uuid) -> Result<SessionView, Refused> {
    sessions::find_session(&state.db, id)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| session_not_found(id))
}

async fn exists(state: &GatewayState, id: Uuid) -> Result<(), Refused> {
    if sessions::session_exists(&state.db, id)
        .await
        .map_err(unavailable)?
    {
        Ok(())
    } else {
        Err(session_not_found(id))
    }
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
    Key(caller): Key,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::SessionsRead).map_err(refuse)?;
    let q = query(q)?;
    let filter = SessionFilter {
        person: given(q.person),
        agent: given(q.agent),
        status: status(q.status)?,
        channel: given(q.channel),
    };
    let after = cursor(q.after)?;
    let limit = query_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let page = sessions::list_sessions(&state.db, &filter, after, limit)
        .await
        .map_err(unavailable)?;
    Ok(Json(serde_json::json!({"sessions": page.items, "next": next(page.next)})).into_response())
}

async fn show(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, turn }: KeyOrTurn,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::SessionsRead).map_err(refuse)?;
    let id = session_id(path)?;
    turn_may_read(&state, turn.as_ref(), id).await?;
    let session = find_session(&state, id).await?;
    let summary = sessions::session_summary(&state.db, &session)
        .await
        .map_err(unavailable)?;
    let mut body = serde_json::to_value(session).map_err(unavailable)?;
    body["summary"] = serde_json::to_value(summary).map_err(unavailable)?;
    Ok(Json(body).into_response())
}

async fn messages(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, turn }: KeyOrTurn,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::SessionsRead).map_err(refuse)?;
    let id = session_id(path)?;
    let q = query(q)?;
    let (after, limit) = (
        cursor(q.after)?,
        query_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)?,
    );
    turn_may_read(&state, turn.as_ref(), id).await?;
    exists(&state, id).await?;
    let page = sessions::session_messages(&state.db, id, after, limit)
        .await
        .map_err(unavailable)?;
    Ok(Json(serde_json::json!({"messages": page.items, "next": next(page.next)})).into_response())
}

async fn events(
    State(state): State<GatewayState>,
    Key(caller): Key,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::SessionsRead).map_err(refuse)?;
    let id = session_id(path)?;
    let q = query(q)?;
    let (after, limit) = (
        cursor(q.after)?,
        query_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)?,
    );
    exists(&state, id).await?;
    let page = sessions::session_events(&state.db, id, after, limit)
        .await
        .map_err(unavailable)?;
    Ok(Json(serde_json::json!({"events": page.items, "next": next(page.next)})).into_response())
}

/// Ask for a fresh engine session ([`sessions::request_reset`]): 202 with the pending reset.
async fn reset(
    State(state): State<GatewayState>,
    Key(caller): Key,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, Refused> {
    caller.require(Scope::SessionsWrite).map_err(refuse)?;
    let id = session_id(path)?;
    // No body is needed; one that is sent is bounded like every other.
    read_body(&headers, body, state.config.gateway.max_body_bytes)
        .await
        .map_err(refuse)?;
    let by = format!("api:{}", caller.owner);
    match sessions::request_reset(&state.db, id, &by)
        .await
        .map_err(unavailable)?
    {
        ResetRequest::Pending(pending_reset_at) => {
            let body = serde_json::json!({
                "session_id": id,
                "pending_reset": "api",
                "pending_reset_at": pending_reset_at,
            });
            Ok((StatusCode::ACCEPTED, Json(body)).into_response())
        }
        ResetRequest::NoSuchSession => Err(session_not_found(id)),
        ResetRequest::Terminated => Err(refuse(ApiError::new(
            StatusCode::CONFLICT,
            "session_terminated",
            format!("session {id} is terminated: it takes no more turns"),
        ))),
    }
}

/// The conversation as JSONL (`application/x-ndjson`): one [`MessageView`] a line, oldest
/// first, sent batch by batch as it is read. A failure after the first batch can no longer
/// change the status: the response is cut off (an incomplete transfer), never a short file
/// that looks whole.
async fn export(
    State(state): State<GatewayState>,
    Key(caller): Key,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::SessionsRead).map_err(refuse)?;
    let id = session_id(path)?;
    exists(&state, id).await?;
    let db = state.db.clone();
    let batches = futures::stream::try_unfold(Some(None), move |after: Option<Option<Uuid>>| {
        let db = db.clone();
        async move {
            let Some(after) = after else {
                return Ok(None);
            };
            let page = sessions::session_messages(&db, id, after, EXPORT_BATCH)
                .await
                .inspect_err(|e| tracing::error!(error = %e, session_id = %id, "export cut off"))?;
            if page.items.is_empty() {
                return Ok(None);
            }
            let mut lines = Vec::new();
            for row in &page.items {
                serde_json::to_writer(&mut lines, row).map_err(std::io::Error::other)?;
                lines.push(b'\n');
            }
            let next = page.next.map(Some);
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
}
