//! The gateway: authenticates channel requests, normalises them into `InboundMessage`s,
//! publishes them durably, and only then answers the channel.
pub mod twilio;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, OriginalUri, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use switchboard_kit::config::Config;
use switchboard_kit::proto::InboundMessage;
use switchboard_kit::runtime::{Output, Runtime};
use uuid::Uuid;

/// Most parameters a Twilio SMS webhook carries is ~40 (more with media); anything far beyond
/// that is not Twilio.
const MAX_FORM_FIELDS: usize = 200;

#[derive(Clone)]
pub struct GatewayState {
    pub config: Arc<Config>,
    pub runtime: Runtime,
}

/// A rejected request: status, a stable code, and a reason, as `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        (self.status, axum::Json(body)).into_response()
    }
}

fn rejected(channel: &'static str, e: ApiError) -> ApiError {
    metrics::counter!("sb_gateway_rejected_total", "channel" => channel, "reason" => e.code)
        .increment(1);
    tracing::info!(
        channel,
        code = e.code,
        status = e.status.as_u16(),
        "request rejected"
    );
    e
}

pub fn router(state: GatewayState) -> Router {
    let limit = state.config.gateway.max_body_bytes;
    Router::new()
        .route("/webhooks/twilio/sms", post(twilio_sms))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

const EMPTY_TWIML: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response></Response>";

async fn twilio_sms(
    State(state): State<GatewayState>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let channel = "sms";
    let cfg = &state.config;
    let signature = headers
        .get("x-twilio-signature")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            rejected(
                channel,
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    "missing_signature",
                    "X-Twilio-Signature is required",
                ),
            )
        })?;
    if std::str::from_utf8(&body).is_err() {
        return Err(rejected(
            channel,
            ApiError::new(StatusCode::BAD_REQUEST, "bad_encoding", "body is not UTF-8"),
        ));
    }
    let params: Vec<(String, String)> = form_urlencoded::parse(&body)
        .take(MAX_FORM_FIELDS + 1)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if params.len() > MAX_FORM_FIELDS {
        return Err(rejected(
            channel,
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "too_many_fields",
                "too many form fields",
            ),
        ));
    }
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let url = format!("{}{}", cfg.gateway.public_url.trim_end_matches('/'), path);
    if !twilio::verify_twilio_signature(cfg.twilio.auth_token.expose(), &url, &params, signature) {
        return Err(rejected(
            channel,
            ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_signature",
                "X-Twilio-Signature does not match",
            ),
        ));
    }

    let field = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let missing = |name: &str| {
        rejected(
            channel,
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "missing_field",
                format!("{name} is required"),
            ),
        )
    };
    let sid = field("MessageSid")
        .or_else(|| field("SmsSid"))
        .filter(|s| !s.is_empty())
        .ok_or_else(|| missing("MessageSid"))?;
    let from = field("From").ok_or_else(|| missing("From"))?;
    let to = field("To").unwrap_or_default();
    let text = field("Body").unwrap_or_default();
    if text.chars().count() > cfg.gateway.max_text_chars {
        return Err(rejected(
            channel,
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "text_too_long",
                format!(
                    "Body is longer than {} characters",
                    cfg.gateway.max_text_chars
                ),
            ),
        ));
    }
    let sender = switchboard_kit::address::normalize_phone(from, &cfg.identity.default_region)
        .map_err(|e| {
            rejected(
                channel,
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_from", e.to_string()),
            )
        })?;
    let num_media: usize = field("NumMedia").and_then(|n| n.parse().ok()).unwrap_or(0);
    let media_urls = (0..num_media.min(10))
        .filter_map(|i| field(&format!("MediaUrl{i}")).map(str::to_string))
        .collect();

    let id = Uuid::now_v7();
    let inbound = InboundMessage {
        id: id.to_string(),
        channel: channel.into(),
        provider: "twilio".into(),
        sender,
        recipient: to.to_string(),
        text: text.to_string(),
        provider_message_id: sid.to_string(),
        received_at_ms: switchboard_kit::now_ms(),
        correlation_id: id.to_string(),
        agent: String::new(),
        media_urls,
    };
    let out = Output::new(
        state.runtime.topology.inbound(channel),
        format!("twilio:{sid}"),
        &inbound,
    )
    .correlated(inbound.correlation_id.clone());
    if let Err(e) = state.runtime.publish("gateway", &out).await {
        tracing::error!(error = %e, "could not store inbound message");
        metrics::counter!("sb_gateway_unavailable_total", "channel" => channel).increment(1);
        // Twilio retries on errors; the same MessageSid is deduplicated downstream.
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "message could not be stored; retry",
        ));
    }
    metrics::counter!("sb_gateway_accepted_total", "channel" => channel).increment(1);
    tracing::info!(correlation_id = %inbound.correlation_id, provider = "twilio", "accepted");
    Ok(([(header::CONTENT_TYPE, "text/xml")], EMPTY_TWIML).into_response())
}
