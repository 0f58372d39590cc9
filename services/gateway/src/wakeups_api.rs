//! Wake-ups an agent schedules for itself (seed 002, [`switchboard_kit::wakeups`]): at a time,
//! its session gets a turn whose input is the agent's note, and the reply goes to the person
//! on the channel they last wrote on.
//!
//! - `POST /api/v1/wakeups` `{"due_at" | "delay_s", "note", "session_id"?}`: 201 with the
//!   wake-up. A turn's token schedules in its own session (`session_id` may be left out);
//!   an API key names the session. Scope `outbound:write` (the agent will speak first).
//! - `GET /api/v1/wakeups?person=&agent=&session=&status=&limit=`: soonest first. Scope
//!   `sessions:read`; a turn sees its own person's with its identity only.
//! - `GET /api/v1/wakeups/{id}`: one.
//! - `DELETE /api/v1/wakeups/{id}`: cancel a pending one (200 with it; 409 `not_pending` once
//!   it fired or was cancelled). Scope `outbound:write` or `sessions:write`; a turn cancels
//!   its own person's with its identity only.
//!
//! A person has at most `[wakeups] max_pending_per_person` pending with one identity (429
//! `too_many_wakeups`); a due time is from now to `max_ahead_days` ahead.
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use switchboard_channels::ApiError;
use switchboard_channels::api::Scope;
use switchboard_kit::turn_token::TurnClaims;
use switchboard_kit::wakeups::{self, NewWakeup, Wakeup, WakeupError, WakeupFilter, WakeupStatus};
use uuid::Uuid;

use crate::auth::{KeyOrTurn, outside_turn};
use crate::query_params::{bad, given, query, query_limit};
use crate::refusal::{refuse, unavailable};
use crate::{GatewayState, Refused, read_body};

pub fn routes() -> Router<GatewayState> {
    Router::new()
        .route("/api/v1/wakeups", get(list).post(create))
        .route("/api/v1/wakeups/{id}", get(show).delete(cancel))
}

const DEFAULT_LIMIT: i64 = 50;
const MAX_LIMIT: i64 = 500;
/// A due time this far in the past is taken as "now" (clocks differ; the agent computed it a
/// moment ago); further back is refused.
const PAST_GRACE_S: i64 = 60;

/// `POST /api/v1/wakeups`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRequest {
    /// RFC 3339, with its offset.
    #[serde(default)]
    due_at: Option<String>,
    /// Seconds from now (instead of `due_at`).
    #[serde(default)]
    delay_s: Option<i64>,
    note: String,
    /// Required with an API key; a turn's token schedules in its own session.
    #[serde(default)]
    session_id: Option<String>,
}

fn not_found(id: Uuid) -> Refused {
    refuse(ApiError::new(
        StatusCode::NOT_FOUND,
        "wakeup_not_found",
        format!("no wake-up {id}"),
    ))
}

/// A turn reaches only its own person's wake-ups with its identity.
fn turn_may_reach(turn: Option<&TurnClaims>, w: &Wakeup) -> Result<(), Refused> {
    match turn {
        Some(t) if w.person_id != t.person() || w.agent_identity != t.identity => {
            Err(outside_turn(
                "this turn's token reaches only its own person's wake-ups with its identity",
            ))
        }
        _ => Ok(()),
    }
}

/// When it is due: exactly one of `due_at` and `delay_s`, from now to `max_ahead_days`.
fn due_time(
    request: &CreateRequest,
    now: DateTime<Utc>,
    max_ahead_days: u32,
) -> Result<DateTime<Utc>, Refused> {
    let due = match (&request.due_at, request.delay_s) {
        (Some(at), None) => DateTime::parse_from_rfc3339(at.trim())
            .map_err(|_| {
                let shown: String = at.chars().filter(|c| !c.is_control()).take(60).collect();
                bad(
                    "invalid_due_at",
                    format!("due_at must be an RFC 3339 time with its offset, not {shown:?}"),
                )
            })?
            .with_timezone(&Utc),
        (None, Some(s)) if s >= 0 => now + chrono::Duration::seconds(s.min(i64::from(u32::MAX))),
        (None, Some(_)) => return Err(bad("invalid_delay", "delay_s must be 0 or more")),
        _ => {
            return Err(bad(
                "invalid_due",
                "give exactly one of due_at (an RFC 3339 time) and delay_s (seconds from now)",
            ));
        }
    };
    if due < now - chrono::Duration::seconds(PAST_GRACE_S) {
        return Err(bad(
            "due_in_past",
            format!("{due} has passed (it is {now})"),
        ));
    }
    if due > now + chrono::Duration::days(i64::from(max_ahead_days)) {
        return Err(bad(
            "due_too_far",
            format!("a wake-up may be due at most {max_ahead_days} days ahead"),
        ));
    }
    Ok(due.max(now))
}

async fn create(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, turn }: KeyOrTurn,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refused> {
    caller.require(Scope::OutboundWrite).map_err(refuse)?;
    let body = read_body(&headers, body, state.config.gateway.max_body_bytes)
        .await
        .map_err(refuse)?;
    let request: CreateRequest = serde_json::from_slice(&body).map_err(|e| {
        bad(
            "invalid_body",
            format!("expected JSON {{\"due_at\" | \"delay_s\", \"note\", \"session_id\"?}}: {e}"),
        )
    })?;
    let settings = &state.config.wakeups;
    let note = request.note.trim();
    if note.is_empty() {
        return Err(refuse(ApiError::missing_field("note")));
    }
    if note.chars().count() > settings.max_note_chars {
        return Err(bad(
            "note_too_long",
            format!(
                "a note holds at most {} characters",
                settings.max_note_chars
            ),
        ));
    }
    let due_at = due_time(&request, Utc::now(), settings.max_ahead_days)?;
    let named = given(request.session_id.clone())
        .map(|s| {
            s.parse::<Uuid>()
                .map_err(|_| bad("invalid_session_id", "session_id must be a session's id"))
        })
        .transpose()?;
    let (session_id, created_by) = match &turn {
        Some(t) => {
            let own: Uuid = t
                .session
                .parse()
                .map_err(|_| outside_turn("this turn's token names no session"))?;
            if named.is_some_and(|n| n != own) {
                return Err(outside_turn(
                    "this turn's token schedules wake-ups in its own session only",
                ));
            }
            (own, format!("agent:{}", t.agent))
        }
        None => (
            named.ok_or_else(|| refuse(ApiError::missing_field("session_id")))?,
            format!("key:{}", caller.owner),
        ),
    };
    let session = sqlx::query!(
        "SELECT person_id, agent_name, agent_identity FROM switchboard.sessions WHERE id = $1",
        session_id,
    )
    .fetch_optional(&state.db)
    .await
    .map_err(unavailable)?
    .ok_or_else(|| {
        refuse(ApiError::new(
            StatusCode::NOT_FOUND,
            "session_not_found",
            format!("no session {session_id}"),
        ))
    })?;
    // A shared session (`session.scope = "main"`) is nobody's own: the token's person is who
    // the wake-up is for, and the turn runs in whatever session their next message would.
    let (person_id, agent_name, agent_identity) = match &turn {
        Some(t) => (t.person().to_string(), t.agent.clone(), t.identity.clone()),
        None => (
            session.person_id,
            session.agent_name,
            session.agent_identity,
        ),
    };
    let new = NewWakeup {
        session_id,
        person_id,
        agent_name,
        agent_identity,
        due_at,
        note: note.to_string(),
        created_by,
    };
    let wakeup = match wakeups::schedule(&state.db, new, settings.max_pending_per_person).await {
        Ok(w) => w,
        Err(WakeupError::TooMany { cap }) => {
            return Err(refuse(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_wakeups",
                format!(
                    "this person already has {cap} pending wake-ups with this agent: cancel one \
                     or wait until one fires"
                ),
            )));
        }
        Err(WakeupError::NoSession(id)) => {
            return Err(refuse(ApiError::new(
                StatusCode::NOT_FOUND,
                "session_not_found",
                format!("no session {id}"),
            )));
        }
        Err(WakeupError::Database(e)) => return Err(unavailable(e)),
    };
    metrics::counter!("sb_wakeups_scheduled_total").increment(1);
    let location = format!("/api/v1/wakeups/{}", wakeup.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(wakeup),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    person: Option<String>,
    /// An agent identity (`reggie`) or engine variant (`reggie_oc`: its identity).
    agent: Option<String>,
    session: Option<String>,
    status: Option<String>,
    limit: Option<String>,
}

async fn list(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, turn }: KeyOrTurn,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::SessionsRead).map_err(refuse)?;
    let q = query(q)?;
    let limit = query_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let status = given(q.status)
        .map(|s| {
            WakeupStatus::parse(&s).ok_or_else(|| {
                bad(
                    "invalid_status",
                    "status is one of pending, fired, cancelled, failed",
                )
            })
        })
        .transpose()?;
    let session = given(q.session)
        .map(|s| {
            s.parse::<Uuid>()
                .map_err(|_| bad("invalid_session_id", "session must be a session's id"))
        })
        .transpose()?;
    // An engine variant names its identity.
    let identity = given(q.agent).map(|a| {
        state
            .config
            .agent(&a)
            .map(|c| c.identity.clone())
            .unwrap_or(a)
    });
    let mut filter = WakeupFilter {
        person: given(q.person),
        identity,
        session,
        status,
    };
    if let Some(t) = &turn {
        if filter.person.as_deref().is_some_and(|p| p != t.person())
            || filter.identity.as_deref().is_some_and(|i| i != t.identity)
        {
            return Err(outside_turn(
                "this turn's token lists only its own person's wake-ups with its identity",
            ));
        }
        filter.person = Some(t.person().to_string());
        filter.identity = Some(t.identity.clone());
    }
    let items = wakeups::list(&state.db, &filter, limit)
        .await
        .map_err(unavailable)?;
    Ok(Json(serde_json::json!({ "wakeups": items })).into_response())
}

fn wakeup_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, Refused> {
    let Path(raw) = path.map_err(|e| bad("invalid_wakeup_id", e.body_text()))?;
    raw.parse().map_err(|_| {
        let shown: String = raw.chars().filter(|c| !c.is_control()).take(60).collect();
        bad(
            "invalid_wakeup_id",
            format!("{shown:?} is not a wake-up id (a UUID)"),
        )
    })
}

async fn show(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, turn }: KeyOrTurn,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::SessionsRead).map_err(refuse)?;
    let id = wakeup_id(path)?;
    let found = wakeups::find(&state.db, id).await.map_err(unavailable)?;
    match found {
        // A turn is told 403 for another's, existing or not: nothing is revealed.
        None if turn.is_some() => Err(outside_turn(
            "this turn's token reaches only its own person's wake-ups with its identity",
        )),
        None => Err(not_found(id)),
        Some(w) => {
            turn_may_reach(turn.as_ref(), &w)?;
            Ok(Json(w).into_response())
        }
    }
}

async fn cancel(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, turn }: KeyOrTurn,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Refused> {
    caller
        .require_any(&[Scope::OutboundWrite, Scope::SessionsWrite])
        .map_err(refuse)?;
    let id = wakeup_id(path)?;
    let Some(found) = wakeups::find(&state.db, id).await.map_err(unavailable)? else {
        return Err(match turn {
            Some(_) => outside_turn(
                "this turn's token reaches only its own person's wake-ups with its identity",
            ),
            None => not_found(id),
        });
    };
    turn_may_reach(turn.as_ref(), &found)?;
    let by = match &turn {
        Some(t) => format!("agent:{}", t.agent),
        None => format!("key:{}", caller.owner),
    };
    match wakeups::cancel(&state.db, id, &by)
        .await
        .map_err(unavailable)?
    {
        Some(w) => Ok(Json(w).into_response()),
        None => {
            let now = wakeups::find(&state.db, id).await.map_err(unavailable)?;
            Err(refuse(match now {
                Some(w) if w.status == WakeupStatus::Pending => ApiError::new(
                    StatusCode::CONFLICT,
                    "firing",
                    format!("wake-up {id} is firing: its turn is on its way"),
                ),
                other => ApiError::new(
                    StatusCode::CONFLICT,
                    "not_pending",
                    format!(
                        "wake-up {id} is {}: only a pending one can be cancelled",
                        other.map_or("gone", |w| w.status.as_str())
                    ),
                ),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(due_at: Option<&str>, delay_s: Option<i64>) -> CreateRequest {
        CreateRequest {
            due_at: due_at.map(str::to_string),
            delay_s,
            note: "n".into(),
            session_id: None,
        }
    }

    fn code(r: Result<DateTime<Utc>, Refused>) -> &'static str {
        r.unwrap_err().0.code()
    }

    #[test]
    fn a_due_time_is_one_of_a_time_or_a_delay_from_now_within_reach() {
        let now = DateTime::parse_from_rfc3339("2026-12-07T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |r: &CreateRequest| due_time(r, now, 365);
        assert_eq!(
            at(&request(Some("2026-12-08T06:30:00+11:00"), None)).unwrap(),
            DateTime::parse_from_rfc3339("2026-12-07T19:30:00Z").unwrap()
        );
        assert_eq!(
            at(&request(None, Some(90))).unwrap(),
            now + chrono::Duration::seconds(90)
        );
        // A moment ago (clocks differ) is now; earlier is refused.
        assert_eq!(
            at(&request(Some("2026-12-07T09:59:30Z"), None)).unwrap(),
            now
        );
        assert_eq!(
            code(at(&request(Some("2026-12-07T09:00:00Z"), None))),
            "due_in_past"
        );
        assert_eq!(
            code(at(&request(Some("2028-01-01T00:00:00Z"), None))),
            "due_too_far"
        );
        assert_eq!(code(at(&request(Some("tomorrow"), None))), "invalid_due_at");
        assert_eq!(code(at(&request(None, Some(-5)))), "invalid_delay");
        assert_eq!(code(at(&request(None, None))), "invalid_due");
        assert_eq!(
            code(at(&request(Some("2026-12-08T06:30:00Z"), Some(5)))),
            "invalid_due"
        );
    }
}
