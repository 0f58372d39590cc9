//! The REST API: `POST /api/v1/messages` and `GET /api/v1/messages/<correlation id>`, behind
//! API keys (`Authorization: Bearer <key>`, made by `switchboard api-keys create`).
use std::time::Duration;
use switchboard_kit::receipts::{ReceiptOutcome, ReceiptStatus, ReceiptStore};

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use switchboard_channels::api::{self, Scope};
use switchboard_channels::{ApiError, MailboxEntry, Received, client_message_key};
use switchboard_kit::proto::Person;
use switchboard_kit::status::{DeliveryStatus, TurnStatus};
use uuid::Uuid;

use crate::auth::{Key, KeyOrTurn};
use crate::refusal::{refuse, unavailable};
use crate::{Accept, GatewayState, Published, Refused, check_agent, publish, read_body};

pub fn routes() -> Router<GatewayState> {
    Router::new()
        .route("/api/v1/messages", post(send_message))
        .route("/api/v1/messages/{correlation_id}", get(message_status))
}

/// How often a waiting request reads the mailbox itself, in case the announcement is lost.
const WAIT_POLL: Duration = Duration::from_secs(1);

/// The `Idempotency-Key` header (a value that is not text reads as one that fails the check).
pub(crate) fn idempotency_header(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap_or("\u{fffd}"))
}

/// Where a message stands, as both routes answer it.
#[derive(Debug, Serialize)]
pub struct MessageStatus {
    pub correlation_id: String,
    /// `pending`, `answered`, `failed`, or `expired` (never taken: `retention.api_pending_expiry_s`).
    pub status: &'static str,
    pub replies: Vec<ReplyView>,
    /// What the person was told while the message waited (the agent's host was down).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notices: Vec<ReplyView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ReplyView {
    pub reply_id: String,
    pub agent: String,
    pub text: String,
    pub sent_at: String,
    /// Files the agent left for the person: name, content type, size, a signed link that
    /// works until `expires_at`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<switchboard_kit::exports::ExportLink>,
    /// For a reply sent through a provider that reports on it (WhatsApp, Twilio): how far it
    /// has gone, `sent`, `delivered`, `read` or `failed`; absent before any report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt: Option<&'static str>,
}

impl From<&MailboxEntry> for ReplyView {
    fn from(e: &MailboxEntry) -> Self {
        Self {
            reply_id: e.reply_id.to_string(),
            agent: e.agent.clone(),
            text: e.text.clone(),
            sent_at: e.created_at.to_rfc3339(),
            attachments: e.attachments.0.clone(),
            receipt: None,
        }
    }
}

/// The API route a request was sent to: an Idempotency-Key is the caller's own per route, so
/// the same key on `/messages` and on `/outbound` is two requests.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RequestKind {
    Message,
    Outbound,
}

/// Record an accepted API request and give it its correlation id: a new one, or, for a key
/// this owner already used on this route, the one the first request was given. The row also
/// says who may read the message's status. `true` with a new id, `false` with the first
/// request's.
pub(crate) async fn record_request(
    state: &GatewayState,
    owner: &str,
    agent: &str,
    kind: RequestKind,
    idempotency_key: Option<&str>,
) -> Result<(Uuid, bool), Refused> {
    let scope = match kind {
        RequestKind::Message => "messages",
        RequestKind::Outbound => "outbound",
    };
    let new_id = Uuid::now_v7();
    let correlation_id = sqlx::query_scalar!(
        "INSERT INTO switchboard.api_requests (correlation_id, owner, agent, idempotency_key)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (owner, idempotency_key) DO UPDATE SET owner = EXCLUDED.owner
         RETURNING correlation_id",
        new_id.to_string(),
        owner,
        agent,
        idempotency_key.map(|k| format!("{scope}/{k}")),
    )
    .fetch_one(&state.db)
    .await
    .map_err(unavailable)?;
    let id: Uuid = correlation_id.parse().map_err(unavailable)?;
    Ok((id, id == new_id))
}

async fn send_message(
    State(state): State<GatewayState>,
    Key(caller): Key,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refused> {
    caller.require(Scope::MessagesWrite).map_err(refuse)?;
    let body = read_body(&headers, body, state.config.gateway.max_body_bytes)
        .await
        .map_err(refuse)?;
    let message = api::read_message(
        &body,
        idempotency_header(&headers),
        state.config.gateway.max_text_chars,
    )
    .map_err(refuse)?;
    check_agent(&state.config, &message.agent).map_err(refuse)?;

    let (id, first) = record_request(
        &state,
        &caller.owner,
        &message.agent,
        RequestKind::Message,
        message.idempotency_key.as_deref(),
    )
    .await?;
    let correlation_id = id.to_string();

    // Registered before publishing, so a fast reply is not missed.
    let waiter = message.wait.then(|| state.hub.waiter(&correlation_id));
    let client_id = message
        .idempotency_key
        .clone()
        .unwrap_or_else(|| id.to_string());
    let received = Received {
        provider_message_id: client_message_key(&caller.owner, &client_id),
        sender: caller.owner.clone(),
        recipient: api::CHANNEL.into(),
        text: message.text,
        media_urls: Vec::new(),
        agent: message.agent,
    };
    let mut accept = Accept::new(api::CHANNEL, api::PROVIDER, received);
    accept.id = Some(id);
    // An integration, not a person (seed 000 §3.1): `system`, with its own authority line
    // (`prompt.authority.system`), never a signed-in user's full authority.
    accept.asserted = Some(Person {
        person_id: format!("api:{}", caller.owner),
        person_type: "system".into(),
        name: caller.owner.clone(),
        role: String::new(),
        email: String::new(),
    });
    if let Published::Limited(limited) = publish(&state, accept).await? {
        // Not taken: the request row goes, so the caller may send the same Idempotency-Key
        // again once the minute is over.
        let _ = sqlx::query!(
            "DELETE FROM switchboard.api_requests WHERE correlation_id = $1",
            correlation_id,
        )
        .execute(&state.db)
        .await;
        let retry_after = limited.retry_after.as_secs().max(1).to_string();
        let e = limited.error(state.config.rate_limit.per_sender_per_minute);
        return Ok((
            e.status(),
            [(header::RETRY_AFTER, retry_after)],
            Json(e.body()),
        )
            .into_response());
    }

    if let Some((_registration, mut live)) = waiter {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(state.config.api.wait_max_ms);
        let mut poll = tokio::time::interval(WAIT_POLL);
        loop {
            tokio::select! {
                Some(_) = live.recv() => {}
                _ = poll.tick() => {}
                _ = tokio::time::sleep_until(deadline) => break,
                _ = state.shutdown.wait() => break,
            }
            let status = accepted_status(&state, &correlation_id).await;
            if status.status != "pending" {
                return Ok((StatusCode::OK, Json(status)).into_response());
            }
        }
    }
    // A message sent for the first time, not waited for, is pending: nothing to read. A
    // retry's may be answered, and a waited-for one may carry notices.
    let status = if first && !message.wait {
        pending(&correlation_id)
    } else {
        accepted_status(&state, &correlation_id).await
    };
    let code = if status.status == "pending" {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let location = format!("/api/v1/messages/{correlation_id}");
    Ok((code, [(header::LOCATION, location)], Json(status)).into_response())
}

async fn message_status(
    State(state): State<GatewayState>,
    KeyOrTurn { caller, .. }: KeyOrTurn,
    Path(correlation_id): Path<String>,
) -> Result<Response, Refused> {
    // A turn's token too: it follows the follow-ups it sent (the owner check below confines it
    // to them).
    // Whoever may send a message may follow it (agent-started ones included).
    caller
        .require_any(&[
            Scope::MessagesRead,
            Scope::MessagesWrite,
            Scope::OutboundWrite,
        ])
        .map_err(refuse)?;
    let owner = sqlx::query_scalar!(
        "SELECT owner FROM switchboard.api_requests WHERE correlation_id = $1",
        correlation_id,
    )
    .fetch_optional(&state.db)
    .await
    .map_err(unavailable)?;
    // Another owner's message is as unknown as one that never was.
    if owner.as_deref() != Some(caller.owner.as_str()) {
        return Err(Refused(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no message with this correlation id was sent with this key's owner",
        )));
    }
    Ok(Json(status_of(&state, &correlation_id).await?).into_response())
}

/// The status of a message just accepted. It is taken whatever happens now: a status that
/// cannot be read yet (the database busy or down) is `pending`, never an error that would
/// make a caller without an Idempotency-Key send it again.
async fn accepted_status(state: &GatewayState, correlation_id: &str) -> MessageStatus {
    status_of(state, correlation_id)
        .await
        .unwrap_or_else(|_| pending(correlation_id))
}

fn pending(correlation_id: &str) -> MessageStatus {
    MessageStatus {
        correlation_id: correlation_id.into(),
        status: "pending",
        replies: Vec::new(),
        notices: Vec::new(),
        error: None,
    }
}

/// Answered once a reply is in the mailbox (or, sent by a provider, in the delivery ledger as
/// sent); failed once its turn or delivery failed for good.
async fn status_of(state: &GatewayState, correlation_id: &str) -> Result<MessageStatus, Refused> {
    let mut entries = state
        .mailbox
        .for_correlation(correlation_id)
        .await
        .map_err(unavailable)?;
    // A message answered together with later ones (queue mode collect): the answer is the
    // reply of the turn it was joined into.
    if !entries.iter().any(|e| !e.is_notice()) {
        let joined: Option<Uuid> = sqlx::query_scalar!(
            r#"SELECT m.reply_id AS "reply_id?" FROM switchboard.turns t
                 JOIN switchboard.turns m
                   ON m.session_id = t.session_id AND m.seq = t.joined_into
                WHERE t.inbound_id = $1 AND t.status = $2 AND t.reply_id IS NULL"#,
            correlation_id.parse::<Uuid>().unwrap_or_default(),
            TurnStatus::Done as TurnStatus,
        )
        .fetch_optional(&state.db)
        .await
        .map_err(unavailable)?
        .flatten();
        if let Some(reply) = joined {
            entries.extend(state.mailbox.for_reply(reply).await.map_err(unavailable)?);
        }
    }
    let (notices, replies): (Vec<_>, Vec<_>) =
        entries.into_iter().partition(MailboxEntry::is_notice);
    let notices: Vec<ReplyView> = notices.iter().map(ReplyView::from).collect();
    if !replies.is_empty() {
        return Ok(MessageStatus {
            correlation_id: correlation_id.into(),
            status: "answered",
            replies: replies.iter().map(ReplyView::from).collect(),
            notices,
            error: None,
        });
    }
    let id: Uuid = correlation_id.parse().unwrap_or_default();
    // A reply sent through a provider (an agent-started SMS) has no mailbox entry: answered
    // once the delivery ledger says it went out.
    let delivered = sqlx::query!(
        r#"SELECT t.reply_id AS "reply_id!", s.agent_name, t.reply_text AS "reply_text!",
                  d.updated_at, d.provider, d.provider_message_ids
             FROM switchboard.turns t
             JOIN switchboard.sessions s ON s.id = t.session_id
             JOIN switchboard.deliveries d ON d.reply_id = t.reply_id
            WHERE t.inbound_id = $1 AND d.status = $2"#,
        id,
        DeliveryStatus::Sent as DeliveryStatus,
    )
    .fetch_optional(&state.db)
    .await
    .map_err(unavailable)?;
    if let Some(d) = delivered {
        // What the provider reported after it took the parts: a part it could not deliver
        // after all fails the message, saying why.
        let receipt = ReceiptStore::new(state.db.clone())
            .outcome(&d.provider, &d.provider_message_ids)
            .await
            .map_err(unavailable)?;
        let reply = ReplyView {
            reply_id: d.reply_id.to_string(),
            agent: d.agent_name,
            text: d.reply_text,
            sent_at: d.updated_at.to_rfc3339(),
            // Sent on the provider's channel, as its links or media.
            attachments: Vec::new(),
            receipt: match &receipt {
                ReceiptOutcome::Reached(status) => Some(status.as_str()),
                ReceiptOutcome::Failed(_) => Some(ReceiptStatus::Failed.as_str()),
                ReceiptOutcome::Unreported => None,
            },
        };
        return Ok(match receipt {
            ReceiptOutcome::Failed(why) => MessageStatus {
                correlation_id: correlation_id.into(),
                status: "failed",
                replies: vec![reply],
                notices,
                error: Some(format!("{}: {why}", d.provider)),
            },
            _ => MessageStatus {
                correlation_id: correlation_id.into(),
                status: "answered",
                replies: vec![reply],
                notices,
                error: None,
            },
        });
    }
    let failure: Option<Option<String>> = sqlx::query_scalar!(
        r#"SELECT COALESCE(d.last_error, t.error) AS "error?"
             FROM switchboard.turns t
             LEFT JOIN switchboard.deliveries d ON d.reply_id = t.reply_id
            WHERE t.inbound_id = $1 AND (t.status = $2 OR d.status = $3)"#,
        id,
        TurnStatus::Failed as TurnStatus,
        DeliveryStatus::Failed as DeliveryStatus,
    )
    .fetch_optional(&state.db)
    .await
    .map_err(unavailable)?;
    if failure.is_some() {
        return Ok(MessageStatus {
            correlation_id: correlation_id.into(),
            status: "failed",
            replies: Vec::new(),
            notices,
            error: failure.flatten(),
        });
    }
    // A message no turn ever took (its stored copy lost to a failed clean-up, say) is ended by
    // the retention sweep (`retention.api_pending_expiry_s`) instead of reading `pending` forever.
    let expired: Option<bool> = sqlx::query_scalar(
        "SELECT expired_at IS NOT NULL FROM switchboard.api_requests WHERE correlation_id = $1",
    )
    .bind(correlation_id)
    .fetch_optional(&state.db)
    .await
    .map_err(unavailable)?;
    let expired = expired.unwrap_or(false);
    Ok(MessageStatus {
        correlation_id: correlation_id.into(),
        status: if expired { "expired" } else { "pending" },
        replies: Vec::new(),
        notices,
        error: expired.then(|| "the message was never taken by an agent; send it again".into()),
    })
}
