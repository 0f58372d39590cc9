//! Accepting a message: the body read within its limit, the sender's rate limit, the number
//! among the sender's messages, and the publish that must succeed before any channel is
//! answered. Every channel (webhooks, chat, the API, outbound) comes through here.
use std::borrow::Cow;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use switchboard_channels::{ApiError, OutboundPart, Received};
use switchboard_kit::arrival::Admission;
use switchboard_kit::config::Config;
use switchboard_kit::proto::{DeadLetter, InboundMessage, Person, Reply};
use switchboard_kit::runtime::Output;
use uuid::Uuid;

use crate::{GatewayState, Refused};

/// The request body, at most `limit` bytes. A request that declares a longer body is refused
/// before any of it is read; one that sends more than it may (chunked, or lying) is cut off at
/// the limit. Either way 413, answered as JSON and counted like any refusal.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<axum::body::Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("body is larger than {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let length_limit = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if length_limit {
            too_large()
        } else {
            ApiError::bad_request("bad_request", format!("reading the body: {e}"))
        }
    })
}

/// A message a channel authenticated and read, ready to be numbered and published.
pub(crate) struct Accept {
    pub channel: Cow<'static, str>,
    pub provider: Cow<'static, str>,
    pub received: Received,
    /// Who the channel authenticated the sender as (chat, API).
    pub asserted: Option<Person>,
    /// The message's id and correlation id (else a new one): an API request retried with its
    /// Idempotency-Key keeps the id it was first given.
    pub id: Option<Uuid>,
    /// Set for a message the agent starts (`POST /api/v1/outbound`): its text, sent as the
    /// turn's reply. Such a message is not the person's, so it is not numbered among theirs
    /// (it holds no one's order) nor counted against their rate limit.
    pub outbound_text: String,
    /// Upload ids the message names (chat), checked to be the sender's.
    pub uploads: Vec<String>,
}

impl Accept {
    pub fn new(
        channel: impl Into<Cow<'static, str>>,
        provider: impl Into<Cow<'static, str>>,
        received: Received,
    ) -> Self {
        Self {
            channel: channel.into(),
            provider: provider.into(),
            received,
            asserted: None,
            id: None,
            outbound_text: String::new(),
            uploads: Vec::new(),
        }
    }
}

/// What became of an accepted message.
pub(crate) enum Published {
    /// Stored; its correlation id.
    Stored(Uuid),
    /// Over the sender's rate limit: not stored for answering.
    Limited(Box<Limited>),
}

pub(crate) struct Limited {
    pub inbound: InboundMessage,
    /// The one limited message per sender and minute whose sender is told.
    pub first: bool,
    pub retry_after: std::time::Duration,
}

impl Limited {
    /// What chat and API callers are told (429).
    pub fn error(&self, per_minute: u32) -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "more than {per_minute} messages in a minute from this sender; this one was not \
                 taken: send it again in {} s",
                self.retry_after.as_secs().max(1)
            ),
        )
    }
}

/// 503: the message could not be stored. Providers retry on it; a retry of the same message id
/// gets the same number and is deduplicated downstream.
pub(crate) fn not_stored(
    channel: Cow<'static, str>,
    provider: &str,
    what: &str,
    e: &dyn std::fmt::Display,
) -> Refused {
    tracing::error!(error = %e, provider, "could not {what}");
    metrics::counter!("sb_gateway_unavailable_total", "channel" => channel).increment(1);
    Refused(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "message could not be stored; retry",
    ))
}

/// Number the message among its sender's and publish it; its correlation id once stored.
pub(crate) async fn publish(state: &GatewayState, message: Accept) -> Result<Published, Refused> {
    let Accept {
        channel,
        provider,
        received,
        asserted,
        id,
        outbound_text,
        uploads,
    } = message;
    let unavailable =
        |what: &str, e: &dyn std::fmt::Display| not_stored(channel.clone(), &provider, what, e);
    let message_id = received.provider_message_id;
    // Unnumbered (0) for an agent-started or a rate-limited message (whose replayed dead letter
    // is answered without holding anyone's order).
    let unnumbered = switchboard_kit::arrival::Arrival { epoch: 0, seq: 0 };
    let (arrival, limited) = if !outbound_text.is_empty() {
        (unnumbered, None)
    } else {
        match state
            .arrivals
            .admit(
                &channel,
                &received.sender,
                &message_id,
                state.config.rate_limit.per_sender_per_minute,
            )
            .await
            .map_err(|e| unavailable("number the inbound message", &e))?
        {
            Admission::Accepted(arrival) => (arrival, None),
            Admission::Limited { first, retry_after } => (unnumbered, Some((first, retry_after))),
        }
    };
    let id = id.unwrap_or_else(Uuid::now_v7);
    switchboard_kit::trace::record("correlation_id", id);
    let inbound = InboundMessage {
        id: id.to_string(),
        channel: channel.to_string(),
        provider: provider.to_string(),
        sender: received.sender,
        recipient: received.recipient,
        text: received.text,
        provider_message_id: message_id.clone(),
        received_at_ms: switchboard_kit::now_ms(),
        correlation_id: id.to_string(),
        agent: received.agent,
        media_urls: received.media_urls,
        arrival_seq: arrival.seq,
        arrival_epoch: arrival.epoch,
        asserted,
        outbound_text,
        // The gateway takes what people send; schedules are fired by dispatch.
        scheduled: String::new(),
        uploads,
        heartbeat: false,
        wakeup: None,
        // Operators' replies are published by the takeover's own path.
        operator: String::new(),
    };
    if let Some((first, retry_after)) = limited {
        metrics::counter!("sb_gateway_rate_limited_total", "channel" => channel.clone())
            .increment(1);
        tracing::info!(correlation_id = %id, %provider, first, "sender over the rate limit");
        return Ok(Published::Limited(Box::new(Limited {
            inbound,
            first,
            retry_after,
        })));
    }
    // The arrival number is part of the dedupe id: a retry that got the same number is dropped
    // by JetStream, one that got a new number (another message came in between) must reach the
    // session stage, which maps it to the original turn and moves the sender's cursor past it.
    // A message without a provider id (an agent-started one) is known by its own id.
    let key = if message_id.is_empty() {
        &inbound.id
    } else {
        &message_id
    };
    let out = Output::new(
        state
            .runtime
            .topology
            .inbound_from(&channel, &inbound.sender),
        format!("{provider}:{key}:{}.{}", arrival.epoch, arrival.seq),
        &inbound,
    )
    .correlated(inbound.correlation_id.clone());
    state
        .runtime
        .publish("gateway", &out)
        .await
        .map_err(|e| unavailable("store the inbound message", &e))?;
    metrics::counter!(
        "sb_gateway_accepted_total",
        "channel" => channel,
        "provider" => provider.clone()
    )
    .increment(1);
    tracing::info!(correlation_id = %id, %provider, "accepted");
    Ok(Published::Stored(id))
}

/// A rate-limited message acknowledged to its provider: kept as a dead letter (replayable by an
/// operator, with the reason), and, for the first such message of the minute, the sender told
/// through the provider's send API. A failure to store the dead letter answers 503, so the
/// provider retries and nothing acknowledged is lost.
pub(crate) async fn rate_limited(
    state: &GatewayState,
    limited: Box<Limited>,
) -> Result<(), Refused> {
    let inbound = &limited.inbound;
    let letter = DeadLetter {
        stage: "gateway".into(),
        subject: state.runtime.topology.inbound(&inbound.channel),
        error: format!(
            "rate limited: more than {} messages in a minute from this sender (rate_limit.per_sender_per_minute); replay to answer it",
            state.config.rate_limit.per_sender_per_minute
        ),
        delivery_count: 0,
        payload: prost::Message::encode_to_vec(inbound),
        message_type: <InboundMessage as prost::Name>::full_name(),
        correlation_id: inbound.correlation_id.clone(),
        failed_at_ms: switchboard_kit::now_ms(),
        stream_sequence: 0,
    };
    let out = Output::new(
        state.runtime.topology.dead_letter("gateway"),
        format!(
            "limited:{}:{}",
            inbound.provider, inbound.provider_message_id
        ),
        &letter,
    )
    .correlated(inbound.correlation_id.clone());
    state.runtime.publish("gateway", &out).await.map_err(|e| {
        not_stored(
            inbound.channel.clone().into(),
            &inbound.provider,
            "store a rate-limited message",
            &e,
        )
    })?;
    if limited.first
        && let Some(sender) = state.senders.get(&inbound.provider).cloned()
    {
        let notice = Reply {
            id: Uuid::now_v7().to_string(),
            channel: inbound.channel.clone(),
            provider: inbound.provider.clone(),
            recipient: inbound.sender.clone(),
            reply_from: inbound.recipient.clone(),
            text: state.config.rate_limit.notice.clone(),
            correlation_id: inbound.correlation_id.clone(),
            ..Default::default()
        };
        // Told in the background: the provider's answer does not wait for our send.
        tokio::spawn(async move {
            // The person wrote just now: a channel with a window (WhatsApp) has it open.
            let part = OutboundPart::new(&notice, 0, &notice.text)
                .with_last_inbound(Some(chrono::Utc::now()));
            if let Err(e) = sender.send(part).await {
                tracing::warn!(error = %e, "could not tell a sender they are rate-limited");
            }
        });
    }
    Ok(())
}

/// 400 unless `agent` is empty (the channel's default) or a configured agent.
pub(crate) fn check_agent(config: &Config, agent: &str) -> Result<(), ApiError> {
    if agent.is_empty() || config.agents.iter().any(|a| a.name == agent) {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "unknown_agent",
            format!("no agent is named {agent:?}"),
        ))
    }
}
