//! Messages an agent starts: `POST /api/v1/outbound` (scope `outbound:write`, granted only by
//! name) with `{"person_id","agent","text","channel"?}` and an optional `Idempotency-Key`.
//!
//! Where it goes: the person's latest inbound message in the log (on `channel` when named)
//! says the channel, the provider, the person's address and ours.
//!
//! How it keeps its place: it is published like any message on `{p}.in.<channel>`, from the
//! person's address, so identify finds the same person and the session stage gives it the
//! next turn of the session; dispatch sends its text as that turn's reply without calling the
//! runner (`InboundMessage.outbound_text`), so deliver sends it after the replies before it.
//! It is unnumbered (`arrival_seq` 0): it is not the person's message and holds no one's order.
//!
//! An agent's turn token (`sbt_…`, docs/agent-tools.md) sends only to its turn's person, as its
//! turn's agent (`agent` may be left out); anyone else is 403 `outside_turn`.
//!
//! The answer is 202 with the correlation id; `GET /api/v1/messages/<id>` reads it until it is
//! `answered` (delivered) or `failed`.
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use switchboard_channels::ApiError;
use switchboard_channels::Received;
use switchboard_channels::api::{self, Scope};
use switchboard_channels::ingress::message_text;
use switchboard_kit::proto::Person;

use crate::api::{RequestKind, idempotency_header, record_request};
use crate::auth::{KeyOrTurn, outside_turn};
use crate::refusal::{refuse, unavailable};
use crate::{Accept, GatewayState, Refused, check_agent, publish, read_body};

pub fn routes() -> Router<GatewayState> {
    Router::new().route("/api/v1/outbound", post(send_outbound))
}

/// `POST /api/v1/outbound`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutboundRequest {
    person_id: String,
    /// Required with an API key; a turn's token sends as its own agent.
    #[serde(default)]
    agent: String,
    text: String,
    /// The channel to use; else the one the person wrote on last.
    #[serde(default)]
    channel: Option<String>,
}

/// The answer: where it went and the id to follow it by.
#[derive(Debug, Serialize)]
struct OutboundAccepted {
    correlation_id: String,
    status: &'static str,
    channel: String,
}

/// How the person last reached us: the way back.
#[derive(Debug)]
struct Route {
    channel: String,
    provider: Option<String>,
    sender: Option<String>,
    recipient: Option<String>,
    person_type: String,
}

fn no_channel(channel: Option<&str>) -> Refused {
    let message = match channel {
        Some(c) => format!("this person has not written on {c} yet"),
        None => "this person has not written on any channel yet".to_string(),
    };
    Refused(ApiError::new(StatusCode::CONFLICT, "no_channel", message))
}

async fn send_outbound(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, turn }: KeyOrTurn,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refused> {
    caller.require(Scope::OutboundWrite).map_err(refuse)?;
    let body = read_body(&headers, body, state.config.gateway.max_body_bytes)
        .await
        .map_err(refuse)?;
    let request: OutboundRequest = serde_json::from_slice(&body).map_err(|e| {
        refuse(ApiError::bad_request(
            "invalid_body",
            format!("expected JSON {{\"person_id\", \"agent\", \"text\", \"channel\"?}}: {e}"),
        ))
    })?;
    let text =
        message_text("text", &request.text, state.config.gateway.max_text_chars).map_err(refuse)?;
    let person_id = request.person_id.trim();
    if person_id.is_empty() {
        return Err(refuse(ApiError::missing_field("person_id")));
    }
    // Required here: there is no channel default for a message nobody sent. A turn's token
    // writes only to its person, from its agent (the default).
    let mut agent = request.agent.trim().to_string();
    if let Some(turn) = &turn {
        if person_id != turn.person() {
            return Err(outside_turn(
                "this turn's token sends only to its own person",
            ));
        }
        if agent.is_empty() {
            agent = turn.agent.clone();
        } else if agent != turn.agent {
            return Err(outside_turn(format!(
                "this turn's token sends only as the agent {}",
                turn.agent
            )));
        }
    }
    if agent.is_empty() {
        return Err(refuse(ApiError::missing_field("agent")));
    }
    check_agent(&state.config, &agent).map_err(refuse)?;
    let channel = request
        .channel
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty());
    let idempotency_key =
        api::checked_idempotency_key(idempotency_header(&headers)).map_err(refuse)?;

    // The latest message the person sent (on the named channel), with where it came from.
    // An unknown person and one who never wrote are answered alike: nothing more is revealed.
    let route = sqlx::query_as!(
        Route,
        r#"SELECT m.channel, m.metadata->>'provider' AS "provider?",
                  m.metadata->>'sender' AS "sender?", m.metadata->>'recipient' AS "recipient?",
                  s.person_type
             FROM switchboard.messages m
             JOIN switchboard.sessions s ON s.id = m.session_id
            WHERE m.person_id = $1 AND m.direction = 'inbound'
              AND ($2::text IS NULL OR m.channel = $2)
              AND m.metadata ? 'sender'
            ORDER BY m.id DESC
            LIMIT 1"#,
        person_id,
        channel,
    )
    .fetch_optional(&state.db)
    .await
    .map_err(unavailable)?;
    let Some(Route {
        channel,
        provider: Some(provider),
        sender: Some(sender),
        recipient,
        person_type,
    }) = route
    else {
        return Err(no_channel(channel));
    };

    let (id, _) = record_request(
        &state,
        &caller.owner,
        &agent,
        RequestKind::Outbound,
        idempotency_key.as_deref(),
    )
    .await?;
    let correlation_id = id.to_string();

    // A repeated request whose message already has its turn is that message, wherever the
    // person has written since.
    let placed = sqlx::query_scalar!(
        "SELECT channel FROM switchboard.turns WHERE inbound_id = $1",
        id
    )
    .fetch_optional(&state.db)
    .await
    .map_err(unavailable)?;
    let channel = match placed {
        Some(placed) => placed,
        None => {
            let received = Received {
                // None: the session keys the turn by the message id (the correlation id).
                provider_message_id: String::new(),
                // From the person's address, so it is theirs: same person, same session.
                sender,
                recipient: recipient.unwrap_or_default(),
                text: String::new(),
                media_urls: Vec::new(),
                agent,
            };
            let mut accept = Accept::new(channel.clone(), provider, received);
            accept.id = Some(id);
            accept.outbound_text = text;
            // For channels whose people only the channel vouches for (chat users the directory
            // does not know): the person the log says it is.
            accept.asserted = Some(Person {
                person_id: person_id.to_string(),
                person_type,
                ..Default::default()
            });
            publish(&state, accept).await?;
            channel
        }
    };
    let location = format!("/api/v1/messages/{correlation_id}");
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(OutboundAccepted {
            correlation_id,
            status: "pending",
            channel,
        }),
    )
        .into_response())
}
