//! The gateway: authenticates channel requests, normalises them into `InboundMessage`s,
//! publishes them durably, and only then answers the channel.
//!
//! It knows no provider: every webhook of `switchboard_channels::ADAPTERS` is mounted on its
//! route and handled the same way (see [`receive_webhook`]).
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{OriginalUri, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use switchboard_channels::{Received, Webhook, WebhookRequest};
use switchboard_kit::arrival::ArrivalCounter;
use switchboard_kit::config::Config;
use switchboard_kit::proto::InboundMessage;
use switchboard_kit::runtime::{Output, Runtime};
use uuid::Uuid;

pub use switchboard_channels::ApiError;

#[derive(Clone)]
pub struct GatewayState {
    pub config: Arc<Config>,
    pub runtime: Runtime,
    /// Numbers each sender's messages in the order they were accepted.
    pub arrivals: ArrivalCounter,
}

impl GatewayState {
    pub fn new(config: Arc<Config>, runtime: Runtime) -> Self {
        let arrivals = ArrivalCounter::new(runtime.js.clone(), &runtime.topology);
        Self {
            config,
            runtime,
            arrivals,
        }
    }
}

/// A refused request, answered as `{"error": {"code", "message"}}` with its status.
#[derive(Debug)]
pub struct Refused(pub ApiError);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (self.0.status(), axum::Json(self.0.body())).into_response()
    }
}

/// Count and log a refusal by channel, provider and reason.
fn refused(hook: &dyn Webhook, e: ApiError) -> Refused {
    metrics::counter!(
        "sb_gateway_rejected_total",
        "channel" => hook.channel(),
        "reason" => e.code(),
        "provider" => hook.provider()
    )
    .increment(1);
    tracing::info!(
        channel = hook.channel(),
        provider = hook.provider(),
        code = e.code(),
        status = e.status().as_u16(),
        "request rejected"
    );
    Refused(e)
}

pub fn router(state: GatewayState) -> Router {
    let mut router = Router::new();
    for hook in switchboard_channels::webhooks(&state.config) {
        let route = hook.route();
        router = router.route(
            route,
            post(
                move |state: State<GatewayState>,
                      uri: OriginalUri,
                      headers: HeaderMap,
                      body: Body| {
                    receive_webhook(state, hook.clone(), uri, headers, body)
                },
            ),
        );
    }
    router.with_state(state)
}

/// Any channel's webhook: read and authenticate it (the adapter), number the sender's message,
/// publish it durably, then acknowledge. A failure to store answers 503, so the provider
/// retries; its retry carries the same provider message id and becomes the same turn.
async fn receive_webhook(
    State(state): State<GatewayState>,
    hook: Arc<dyn Webhook>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refused> {
    let cfg = &state.config;
    let body = read_body(&headers, body, cfg.gateway.max_body_bytes)
        .await
        .map_err(|e| refused(hook.as_ref(), e))?;
    let path_and_query = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let url = format!(
        "{}{}",
        cfg.gateway.public_url.trim_end_matches('/'),
        path_and_query
    );
    let request = WebhookRequest {
        url: &url,
        path: uri.path(),
        headers: &headers,
        body: &body,
    };
    let received = hook
        .receive(&request)
        .map_err(|e| refused(hook.as_ref(), e))?;
    let correlation_id = publish(&state, hook.as_ref(), received).await?;
    metrics::counter!(
        "sb_gateway_accepted_total",
        "channel" => hook.channel(),
        "provider" => hook.provider()
    )
    .increment(1);
    tracing::info!(%correlation_id, provider = hook.provider(), "accepted");
    let ack = hook.ack();
    Ok(([(header::CONTENT_TYPE, ack.content_type)], ack.body).into_response())
}

/// The request body, at most `limit` bytes. A request that declares a longer body is refused
/// before any of it is read; one that sends more than it may (chunked, or lying) is cut off at
/// the limit. Either way 413, answered as JSON and counted like any refusal.
async fn read_body(
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

/// Number the message among its sender's and publish it; its correlation id once stored.
async fn publish(
    state: &GatewayState,
    hook: &dyn Webhook,
    received: Received,
) -> Result<String, Refused> {
    let channel = hook.channel();
    let provider = hook.provider();
    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        tracing::error!(error = %e, provider, "could not {what}");
        metrics::counter!("sb_gateway_unavailable_total", "channel" => channel).increment(1);
        // Providers retry on errors; a retry of the same message id gets the same number and
        // is deduplicated downstream.
        Refused(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "message could not be stored; retry",
        ))
    };
    let message_id = received.provider_message_id;
    let arrival = state
        .arrivals
        .next(channel, &received.sender, &message_id)
        .await
        .map_err(|e| unavailable("number the inbound message", &e))?;
    let id = Uuid::now_v7();
    let inbound = InboundMessage {
        id: id.to_string(),
        channel: channel.into(),
        provider: provider.into(),
        sender: received.sender,
        recipient: received.recipient,
        text: received.text,
        provider_message_id: message_id.clone(),
        received_at_ms: switchboard_kit::now_ms(),
        correlation_id: id.to_string(),
        agent: String::new(),
        media_urls: received.media_urls,
        arrival_seq: arrival.seq,
        arrival_epoch: arrival.epoch,
    };
    // The arrival number is part of the dedupe id: a retry that got the same number is dropped
    // by JetStream, one that got a new number (another message came in between) must reach the
    // session stage, which maps it to the original turn and moves the sender's cursor past it.
    let out = Output::new(
        state.runtime.topology.inbound(channel),
        format!("{provider}:{message_id}:{}.{}", arrival.epoch, arrival.seq),
        &inbound,
    )
    .correlated(inbound.correlation_id.clone());
    state
        .runtime
        .publish("gateway", &out)
        .await
        .map_err(|e| unavailable("store the inbound message", &e))?;
    Ok(inbound.correlation_id)
}
