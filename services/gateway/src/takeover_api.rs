//! An operator steps into a conversation ([`switchboard_kit::takeovers`]):
//!
//! - `GET /api/v1/sessions/{id}/takeover`: the open takeover, else the latest (`null`: never
//!   taken over). Scope `ops:read`.
//! - `POST /api/v1/sessions/{id}/takeover`: 201 with the takeover, taken by the caller (the
//!   key's owner or the operator's login); again by them: 200, unchanged; 409 `taken_over`
//!   (someone else has it, named), `session_terminated`, `shared_session`; 404. With
//!   `[escalation] takeover_notice` set the person is told, once, as the operator's first reply.
//!   Scope `ops:write`.
//! - `POST /api/v1/sessions/{id}/replies` `{"text"}` (optional `Idempotency-Key`): 202 with the
//!   message's id; it goes to the person on the channel they last wrote on in this session,
//!   after the replies before it, once (a repeated key is the same message). 409
//!   `not_taken_over`, `no_channel`. Scope `ops:write`.
//! - `POST /api/v1/sessions/{id}/handback`: 200 with the takeover, how many of the person's
//!   messages it held, and whether the agent gets a turn to answer the ones after the
//!   operator's last reply; again: 200, unchanged; 409 `not_taken_over`. Scope `ops:write`.
//!
//! Checked in this order, as the sessions API: the key (401), its scope (403), the request (400,
//! `invalid_session_id` for a path that is no UUID), the session (404 `session_not_found`).
//!
//! The same routes serve the console on the admin address.
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use switchboard_channels::ApiError;
use switchboard_channels::api::{self, Scope};
use switchboard_channels::ingress::message_text;
use switchboard_kit::shutdown::Shutdown;
use switchboard_kit::takeovers::{self, HandedBack, PublishError, TakenOver, Takeover};
use uuid::Uuid;

use crate::api::idempotency_header;
use crate::auth::Key;
use crate::refusal::{refuse, unavailable};
use crate::sessions_api::{session_id, session_not_found};
use crate::{GatewayState, Refused, read_body};

pub fn routes() -> Router<GatewayState> {
    Router::new()
        .route("/api/v1/sessions/{id}/takeover", get(show).post(take))
        .route("/api/v1/sessions/{id}/replies", post(reply))
        .route("/api/v1/sessions/{id}/handback", post(hand_back))
}

fn conflict(code: &'static str, message: impl Into<String>) -> Refused {
    refuse(ApiError::new(StatusCode::CONFLICT, code, message))
}

async fn show(
    State(state): State<GatewayState>,
    Key(caller): Key,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::OpsRead).map_err(refuse)?;
    let id = session_id(path)?;
    if takeovers::party(&state.db, id)
        .await
        .map_err(unavailable)?
        .is_none()
    {
        return Err(session_not_found(id));
    }
    let latest = takeovers::latest(&state.db, id)
        .await
        .map_err(unavailable)?;
    Ok(Json(serde_json::json!({ "takeover": latest })).into_response())
}

async fn take(
    State(state): State<GatewayState>,
    Key(caller): Key,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::OpsWrite).map_err(refuse)?;
    let id = session_id(path)?;
    let by = caller.owner.as_str();
    match takeovers::take_over(&state.db, id, by)
        .await
        .map_err(unavailable)?
    {
        TakenOver::Now(t) => {
            metrics::counter!("sb_takeovers_total").increment(1);
            tracing::info!(session = %id, %by, takeover = %t.id, "conversation taken over");
            publish_taken(&state, &t).await?;
            Ok((StatusCode::CREATED, Json(t)).into_response())
        }
        // Published again (each once): the first answer may have been lost.
        TakenOver::Already(t) => {
            publish_taken(&state, &t).await?;
            Ok(Json(t).into_response())
        }
        TakenOver::HeldByOther(t) => Err(conflict(
            "taken_over",
            format!(
                "{} has this conversation since {}",
                t.taken_by, t.started_at
            ),
        )),
        TakenOver::NoSuchSession => Err(session_not_found(id)),
        TakenOver::Terminated => Err(conflict(
            "session_terminated",
            format!("session {id} is terminated: it takes no more turns"),
        )),
        TakenOver::Shared => Err(conflict(
            "shared_session",
            "everyone who writes to this agent shares this session: an operator's reply \
             would go to one of many people",
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplyRequest {
    text: String,
}

async fn reply(
    State(state): State<GatewayState>,
    Key(caller): Key,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, Refused> {
    caller.require(Scope::OpsWrite).map_err(refuse)?;
    let id = session_id(path)?;
    let body = read_body(&headers, body, state.config.gateway.max_body_bytes)
        .await
        .map_err(refuse)?;
    let request: ReplyRequest = serde_json::from_slice(&body).map_err(|e| {
        refuse(ApiError::bad_request(
            "invalid_body",
            format!("expected JSON {{\"text\"}}: {e}"),
        ))
    })?;
    let text =
        message_text("text", &request.text, state.config.gateway.max_text_chars).map_err(refuse)?;
    let key = api::checked_idempotency_key(idempotency_header(&headers)).map_err(refuse)?;
    let Some(takeover) = takeovers::open(&state.db, id).await.map_err(unavailable)? else {
        if takeovers::party(&state.db, id)
            .await
            .map_err(unavailable)?
            .is_none()
        {
            return Err(session_not_found(id));
        }
        return Err(conflict(
            "not_taken_over",
            "the agent has this conversation: take it over first",
        ));
    };
    // A repeated Idempotency-Key is the same message (the session stage keeps one turn of it).
    let message = match &key {
        Some(k) => Uuid::new_v5(
            &takeover.id,
            format!("reply:{}:{k}", caller.owner).as_bytes(),
        ),
        None => Uuid::now_v7(),
    };
    let channel = send_as_operator(&state, &takeover, &caller.owner, message, text).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({
            "message_id": message,
            "takeover_id": takeover.id,
            "channel": channel,
            "status": "pending",
        })),
    )
        .into_response())
}

/// Send as the operator ([`takeovers::send_as_operator`]); the channel it goes on.
async fn send_as_operator(
    state: &GatewayState,
    takeover: &Takeover,
    by: &str,
    message: Uuid,
    text: String,
) -> Result<String, Refused> {
    let (db, runtime, arrivals) = (&state.db, &state.runtime, &state.arrivals);
    let channel = takeovers::send_as_operator(db, runtime, arrivals, takeover, by, message, text)
        .await
        .map_err(refused)?;
    metrics::counter!("sb_operator_replies_total").increment(1);
    Ok(channel)
}

/// The takeover's event and the person's notice ([`takeovers::publish_taken`]).
async fn publish_taken(state: &GatewayState, t: &Takeover) -> Result<(), Refused> {
    let notice = &state.config.escalation.takeover_notice;
    takeovers::publish_taken(&state.db, &state.runtime, &state.arrivals, t, notice)
        .await
        .map_err(refused)
}

fn refused(e: PublishError) -> Refused {
    match e {
        PublishError::NoChannel => conflict("no_channel", e.to_string()),
        e => unavailable(e),
    }
}

async fn hand_back(
    State(state): State<GatewayState>,
    Key(caller): Key,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Refused> {
    caller.require(Scope::OpsWrite).map_err(refuse)?;
    let id = session_id(path)?;
    let by = caller.owner.as_str();
    let (takeover, held) = match takeovers::hand_back(&state.db, id, by)
        .await
        .map_err(unavailable)?
    {
        HandedBack::Now { takeover, held } => {
            metrics::counter!("sb_handbacks_total").increment(1);
            tracing::info!(session = %id, %by, takeover = %takeover.id, held,
                agent_answers = takeover.handback_input.is_some(), "conversation handed back");
            (takeover, Some(held))
        }
        HandedBack::Before(t) if t.ended_at.is_some() => (t, None),
        HandedBack::Before(_) | HandedBack::NotTaken => {
            return Err(conflict(
                "not_taken_over",
                "the agent has this conversation already",
            ));
        }
        HandedBack::NoSuchSession => return Err(session_not_found(id)),
    };
    takeovers::announce_handed_back(&state.db, &state.runtime, &takeover)
        .await
        .map_err(refused)?;
    // The agent's turn (once, whichever hand-back or sweep publishes it).
    if takeover.handback_input.is_some() && takeover.handback_published_at.is_none() {
        takeovers::publish_handback(&state.db, &state.runtime, &state.arrivals, &takeover)
            .await
            .map_err(refused)?;
    }
    Ok(Json(serde_json::json!({
        "takeover": takeover,
        "held": held,
        "agent_answers": takeover.handback_input.is_some(),
    }))
    .into_response())
}

/// Hand-backs whose agent turn a gateway drew and died before publishing, published by
/// whichever replica finds them (until shutdown).
pub(crate) async fn publish_stranded_handbacks(state: GatewayState, shutdown: Shutdown) {
    const EVERY: Duration = Duration::from_secs(5);
    const STRANDED_AFTER: Duration = Duration::from_secs(10);
    loop {
        match takeovers::unpublished(&state.db, STRANDED_AFTER, 50).await {
            Ok(stranded) => {
                for t in stranded {
                    let published =
                        takeovers::publish_handback(&state.db, &state.runtime, &state.arrivals, &t);
                    if let Err(e) = published.await {
                        tracing::warn!(takeover = %t.id, error = %e,
                            "a hand-back's agent turn could not be published; trying again");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not look for stranded hand-backs"),
        }
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            () = shutdown.wait() => return,
        }
    }
}
