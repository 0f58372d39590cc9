//! The gateway: authenticates channel requests, normalises them into `InboundMessage`s,
//! publishes them durably, and only then answers the channel.
pub mod form;
pub mod twilio;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, OriginalUri, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use switchboard_kit::arrival::ArrivalCounter;
use switchboard_kit::config::Config;
use switchboard_kit::proto::InboundMessage;
use switchboard_kit::runtime::{Output, Runtime};
use uuid::Uuid;

/// Most parameters a Twilio SMS webhook carries is ~40 (more with media); anything far beyond
/// that is not Twilio.
pub const MAX_FORM_FIELDS: usize = 200;

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

/// A rejected request: status, a stable code, and a reason, as `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable error code (also the `reason` label of `sb_gateway_rejected_total`).
    pub fn code(&self) -> &'static str {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }

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

/// What checking a Twilio webhook needs besides the request itself.
#[derive(Debug, Clone, Copy)]
pub struct TwilioCheck<'a> {
    pub auth_token: &'a str,
    /// The full URL Twilio posted to (public base URL + path and query): Twilio signs it.
    pub url: &'a str,
    pub max_text_chars: usize,
    /// Region for numbers written without a country code (ISO 3166, e.g. `US`).
    pub default_region: &'a str,
}

/// A Twilio SMS webhook, authenticated and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSms {
    /// `MessageSid` (or `SmsSid`): 1 to [`MAX_SID_CHARS`] ASCII letters and digits.
    pub message_sid: String,
    /// `From`, normalised to E.164.
    pub sender: String,
    /// `To`, as sent.
    pub recipient: String,
    /// `Body`, at most `max_text_chars` characters.
    pub text: String,
    pub media_urls: Vec<String>,
}

/// Longest accepted `MessageSid`. Twilio's are 34 characters (`SM` or `MM` and 32 hex digits).
pub const MAX_SID_CHARS: usize = 64;

const FORM_CONTENT_TYPE: &str = "application/x-www-form-urlencoded";

/// `application/x-www-form-urlencoded`, with no charset or a UTF-8 one.
fn is_form_content_type(content_type: &str) -> bool {
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case(FORM_CONTENT_TYPE) {
        return false;
    }
    parts.all(|param| match param.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            let value = value.trim().trim_matches('"');
            value.eq_ignore_ascii_case("utf-8") || value.eq_ignore_ascii_case("utf8")
        }
        _ => true,
    })
}

/// Authenticate and validate a Twilio SMS webhook: the pure part of `POST
/// /webhooks/twilio/sms`, shared by the handler and the fuzz target `twilio_webhook`.
///
/// In order: the signature header is present (403), the content type is a UTF-8 form (415), the
/// body is a well-formed form of UTF-8 fields without NUL and at most [`MAX_FORM_FIELDS`] fields
/// (400), the signature matches (403), `MessageSid` and `From` are present and the sid is
/// well-formed (400), `Body` is within `max_text_chars` (413), `From` is a phone number (400).
pub fn parse_twilio_sms(
    body: &[u8],
    content_type: Option<&str>,
    signature: Option<&str>,
    check: &TwilioCheck<'_>,
) -> Result<ParsedSms, ApiError> {
    let signature = signature.ok_or_else(|| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "missing_signature",
            "X-Twilio-Signature is required",
        )
    })?;
    if !content_type.is_some_and(is_form_content_type) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("Content-Type must be {FORM_CONTENT_TYPE} (UTF-8)"),
        ));
    }
    if std::str::from_utf8(body).is_err() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_encoding",
            "body is not UTF-8",
        ));
    }
    let params = form::parse_form(body, MAX_FORM_FIELDS).map_err(|e| {
        let code = match e {
            form::FormError::BadEscape => "malformed_form",
            form::FormError::NotUtf8 | form::FormError::Nul => "bad_encoding",
            form::FormError::TooManyFields => "too_many_fields",
        };
        ApiError::new(StatusCode::BAD_REQUEST, code, e.to_string())
    })?;
    if !twilio::verify_twilio_signature(check.auth_token, check.url, &params, signature) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "invalid_signature",
            "X-Twilio-Signature does not match",
        ));
    }

    let field = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let missing = |name: &str| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "missing_field",
            format!("{name} is required"),
        )
    };
    let sid = field("MessageSid")
        .or_else(|| field("SmsSid"))
        .filter(|s| !s.is_empty())
        .ok_or_else(|| missing("MessageSid"))?;
    // The sid becomes part of a NATS header (the dedupe id): letters and digits only.
    if sid.len() > MAX_SID_CHARS || !sid.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_field",
            format!("MessageSid must be 1 to {MAX_SID_CHARS} ASCII letters and digits"),
        ));
    }
    let from = field("From").ok_or_else(|| missing("From"))?;
    let to = field("To").unwrap_or_default();
    let text = field("Body").unwrap_or_default();
    if text.chars().count() > check.max_text_chars {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "text_too_long",
            format!("Body is longer than {} characters", check.max_text_chars),
        ));
    }
    let sender = switchboard_kit::address::normalize_phone(from, check.default_region)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_from", e.to_string()))?;
    let num_media: usize = field("NumMedia").and_then(|n| n.parse().ok()).unwrap_or(0);
    let media_urls = (0..num_media.min(10))
        .filter_map(|i| field(&format!("MediaUrl{i}")).map(str::to_string))
        .collect();
    Ok(ParsedSms {
        message_sid: sid.to_string(),
        sender,
        recipient: to.to_string(),
        text: text.to_string(),
        media_urls,
    })
}

async fn twilio_sms(
    State(state): State<GatewayState>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let channel = "sms";
    let cfg = &state.config;
    // Over the size limit (or unreadable): answered as JSON and counted like any rejection.
    let body = body.map_err(|e| {
        let err = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("body is larger than {} bytes", cfg.gateway.max_body_bytes),
            )
        } else {
            ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.body_text())
        };
        rejected(channel, err)
    })?;
    let header = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let url = format!("{}{}", cfg.gateway.public_url.trim_end_matches('/'), path);
    let check = TwilioCheck {
        auth_token: cfg.twilio.auth_token.expose(),
        url: &url,
        max_text_chars: cfg.gateway.max_text_chars,
        default_region: &cfg.identity.default_region,
    };
    let sms = parse_twilio_sms(
        &body,
        header(header::CONTENT_TYPE),
        header(header::HeaderName::from_static("x-twilio-signature")),
        &check,
    )
    .map_err(|e| rejected(channel, e))?;

    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        tracing::error!(error = %e, "could not {what}");
        metrics::counter!("sb_gateway_unavailable_total", "channel" => channel).increment(1);
        // Twilio retries on errors; a retry of the same MessageSid gets the same number and is
        // deduplicated downstream.
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "message could not be stored; retry",
        )
    };
    let sid = sms.message_sid;
    let arrival = state
        .arrivals
        .next(channel, &sms.sender, &sid)
        .await
        .map_err(|e| unavailable("number the inbound message", &e))?;
    let id = Uuid::now_v7();
    let inbound = InboundMessage {
        id: id.to_string(),
        channel: channel.into(),
        provider: "twilio".into(),
        sender: sms.sender,
        recipient: sms.recipient,
        text: sms.text,
        provider_message_id: sid.clone(),
        received_at_ms: switchboard_kit::now_ms(),
        correlation_id: id.to_string(),
        agent: String::new(),
        media_urls: sms.media_urls,
        arrival_seq: arrival.seq,
        arrival_epoch: arrival.epoch,
    };
    // The arrival number is part of the dedupe id: a retry that got the same number is dropped
    // by JetStream, one that got a new number (another message came in between) must reach the
    // session stage, which maps it to the original turn and moves the sender's cursor past it.
    let out = Output::new(
        state.runtime.topology.inbound(channel),
        format!("twilio:{sid}:{}.{}", arrival.epoch, arrival.seq),
        &inbound,
    )
    .correlated(inbound.correlation_id.clone());
    state
        .runtime
        .publish("gateway", &out)
        .await
        .map_err(|e| unavailable("store the inbound message", &e))?;
    metrics::counter!("sb_gateway_accepted_total", "channel" => channel).increment(1);
    tracing::info!(correlation_id = %inbound.correlation_id, provider = "twilio", "accepted");
    Ok(([(header::CONTENT_TYPE, "text/xml")], EMPTY_TWIML).into_response())
}
