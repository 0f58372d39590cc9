//! `POST /webhooks/generic/<source>`: a configured source's signed JSON event.
//!
//! In order: the source is configured with a secret (400 `unknown_source`); both signature
//! headers are there (401 `missing_signature`); the signature is the HMAC of this timestamp and
//! body (401 `invalid_signature`); the timestamp is unix seconds (401 `invalid_timestamp`)
//! within the source's window of our clock (401 `stale_timestamp`); only then is the body read
//! (415, 400 `malformed_json`, `missing_field`/`invalid_field` naming the dotted path, 413).
use std::collections::BTreeMap;

use http::StatusCode;
use serde_json::Value;
use switchboard_kit::config::{Config, WebhookSourceConfig};

use super::{CHANNEL, PROVIDER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use crate::ApiError;
use crate::ingress::{self, Ack, Incoming, Received, Webhook, WebhookRequest};

const PATH_PREFIX: &str = "/webhooks/generic/";
/// Longest sender id a source may give (it becomes part of an address and a person id).
pub const MAX_SENDER_CHARS: usize = 256;

/// An event, authenticated and read: the fields as the source sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenericEvent {
    /// The event id (header-safe, at most 40 characters): a resend carries the same one.
    pub id: String,
    /// The sender's id in the source's own terms, trimmed.
    pub sender: String,
    /// Control characters removed, at most `max_text_chars` characters.
    pub text: String,
}

/// 401 with `code`: every authentication failure is the same status, told apart by its code.
fn unauthorized(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, code, message)
}

/// Check a request's signature headers against `secret` and the time `now`: the signature
/// first (so a forged request learns nothing about our clock), then the window.
pub fn check_signature(
    secret: &[u8],
    window_s: u64,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(unauthorized(
            "missing_signature",
            "X-Switchboard-Timestamp and X-Switchboard-Signature are required",
        ));
    };
    if !super::verify(secret, timestamp, body, signature) {
        return Err(unauthorized(
            "invalid_signature",
            "X-Switchboard-Signature is not sha256=<hex HMAC-SHA256 of timestamp.body> with this \
             source's secret",
        ));
    }
    ingress::check_timestamp("X-Switchboard-Timestamp", timestamp, window_s, now)
}

/// The value at a dotted path (`user.id`) of a JSON object; a missing or null value is `None`.
pub fn field_at<'a>(body: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(body, |value, key| value.as_object()?.get(key))
        .filter(|v| !v.is_null())
}

/// A string or number as text (sources send ids either way); anything else is refused.
fn scalar(value: &Value, path: &str) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(ApiError::bad_request(
            "invalid_field",
            format!("{path} must be a string or number"),
        )),
    }
}

/// Read an authenticated event's body with the source's field paths: the pure part of `POST
/// /webhooks/generic/<source>` after its signature was checked (also the fuzz target's).
pub fn parse_generic_event(
    body: &[u8],
    content_type: Option<&str>,
    source: &WebhookSourceConfig,
    max_text_chars: usize,
) -> Result<GenericEvent, ApiError> {
    let value: Value = ingress::json_body(body, content_type)?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "malformed_json",
            "body must be a JSON object",
        ));
    }
    let required = |path: &str| field_at(&value, path).ok_or_else(|| ApiError::missing_field(path));

    let sender_path = source.sender_field.as_str();
    let sender = scalar(required(sender_path)?, sender_path)?;
    let sender = sender.trim();
    if sender.is_empty() {
        return Err(ApiError::missing_field(sender_path));
    }
    if sender.chars().count() > MAX_SENDER_CHARS || sender.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "invalid_field",
            format!(
                "{sender_path} must be at most {MAX_SENDER_CHARS} characters, with no control \
                 characters"
            ),
        ));
    }

    let id_path = source.id_field.as_str();
    let id = scalar(required(id_path)?, id_path)?;
    // Scoped by the sender into a provider id later, so it must leave room: 40 characters.
    ingress::check_client_id(id_path, &id)?;

    let text_path = source.text_field.as_str();
    let Value::String(text) = required(text_path)? else {
        return Err(ApiError::bad_request(
            "invalid_field",
            format!("{text_path} must be a string"),
        ));
    };
    let text = ingress::message_text(text_path, text, max_text_chars)?;
    Ok(GenericEvent {
        id,
        sender: sender.to_string(),
        text,
    })
}

/// The address a source's sender has in Switchboard: `<source>:<sender>`, so the same id from
/// two sources is two senders.
pub fn sender_address(source: &str, sender: &str) -> String {
    format!("{source}:{sender}")
}

/// The sender's id in the source's own terms, back from [`sender_address`].
pub fn sender_in<'a>(source: &str, address: &'a str) -> &'a str {
    address
        .strip_prefix(source)
        .and_then(|rest| rest.strip_prefix(':'))
        .unwrap_or(address)
}

/// `POST /webhooks/generic/{source}`: one webhook for every configured source.
pub struct GenericWebhook {
    sources: BTreeMap<String, WebhookSourceConfig>,
    max_text_chars: usize,
}

impl GenericWebhook {
    pub fn new(config: &Config) -> Self {
        Self {
            sources: config.webhooks.clone(),
            max_text_chars: config.gateway.max_text_chars,
        }
    }
}

impl Webhook for GenericWebhook {
    fn route(&self) -> &'static str {
        "/webhooks/generic/{source}"
    }

    fn channel(&self) -> &'static str {
        CHANNEL
    }

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn receive(&self, request: &WebhookRequest<'_>) -> Result<Incoming, ApiError> {
        let name = request.path.strip_prefix(PATH_PREFIX).unwrap_or_default();
        let Some((source, key)) = self
            .sources
            .get(name)
            .and_then(|s| Some((s, s.signing_key()?)))
        else {
            // One answer for "not configured" and "no secret": an empty secret must never
            // verify anything, and callers need not learn which it is.
            let shown: String = name.chars().take(64).collect();
            return Err(ApiError::bad_request(
                "unknown_source",
                format!("no webhook source {shown:?} is configured with a secret"),
            ));
        };
        check_signature(
            key,
            source.timestamp_window_s,
            request.header(TIMESTAMP_HEADER),
            request.header(SIGNATURE_HEADER),
            request.body,
            request.now,
        )?;
        let event = parse_generic_event(
            request.body,
            request.content_type(),
            source,
            self.max_text_chars,
        )?;
        let sender = sender_address(name, &event.sender);
        Ok(Received {
            // Sources pick their own ids: scoped by the sender (which names the source) they are
            // unique across the channel, and the reply gets the source's id back.
            provider_message_id: ingress::client_message_key(&sender, &event.id),
            sender,
            recipient: name.to_string(),
            text: event.text,
            media_urls: Vec::new(),
            agent: source.agent.clone(),
        }
        .into())
    }

    fn ack(&self) -> Ack {
        Ack {
            content_type: "application/json",
            body: "{\"status\":\"accepted\"}",
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use switchboard_kit::config::Secret;

    use super::*;

    const SECRET: &str = "shop-secret";
    const T0: i64 = 1_800_000_000;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    fn source() -> WebhookSourceConfig {
        WebhookSourceConfig {
            secret: Secret::new(SECRET),
            sender_field: "user.id".into(),
            text_field: "message.body".into(),
            agent: "reggie_fd".into(),
            ..Default::default()
        }
    }

    fn hook() -> GenericWebhook {
        let mut config = Config::default();
        config.webhooks.insert("shop".into(), source());
        let mut unsigned = source();
        unsigned.secret = Secret::default();
        config.webhooks.insert("unsigned".into(), unsigned);
        GenericWebhook::new(&config)
    }

    /// A request to `path` with `body`, signed with `secret` at `signed_at`, received at `now`.
    fn post(
        hook: &GenericWebhook,
        path: &str,
        body: &str,
        secret: &str,
        signed_at: i64,
        now: i64,
    ) -> Result<Received, ApiError> {
        let timestamp = signed_at.to_string();
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", "application/json".parse().unwrap());
        headers.insert(TIMESTAMP_HEADER, timestamp.parse().unwrap());
        headers.insert(
            SIGNATURE_HEADER,
            super::super::sign(secret.as_bytes(), &timestamp, body.as_bytes())
                .parse()
                .unwrap(),
        );
        hook.receive(&WebhookRequest {
            url: path,
            path,
            headers: &headers,
            body: body.as_bytes(),
            now: at(now),
        })
        .map(|incoming| incoming.message().expect("one message"))
    }

    const EVENT: &str =
        r#"{"id":"evt-9","user":{"id":" u-42 "},"message":{"body":"hi\u0007 there"}}"#;

    #[test]
    fn a_signed_event_is_read_with_the_sources_field_paths() {
        let received = post(&hook(), "/webhooks/generic/shop", EVENT, SECRET, T0, T0).unwrap();
        assert_eq!(received.sender, "shop:u-42");
        assert_eq!(received.recipient, "shop", "a reply finds its source by it");
        assert_eq!(received.text, "hi there");
        assert_eq!(received.agent, "reggie_fd");
        assert_eq!(
            ingress::client_id(&received.sender, &received.provider_message_id),
            "evt-9",
            "the reply gets the source's own event id back"
        );
        assert!(ingress::check_provider_id("id", &received.provider_message_id).is_ok());
    }

    #[test]
    fn the_same_event_id_from_another_sender_or_source_is_another_message() {
        let mut config = Config::default();
        config.webhooks.insert("shop".into(), source());
        config.webhooks.insert("crm".into(), source());
        let hook = GenericWebhook::new(&config);
        let a = post(&hook, "/webhooks/generic/shop", EVENT, SECRET, T0, T0).unwrap();
        let b = post(&hook, "/webhooks/generic/crm", EVENT, SECRET, T0, T0).unwrap();
        let other = EVENT.replace("u-42", "u-43");
        let c = post(&hook, "/webhooks/generic/shop", &other, SECRET, T0, T0).unwrap();
        let resend = post(
            &hook,
            "/webhooks/generic/shop",
            EVENT,
            SECRET,
            T0 + 9,
            T0 + 9,
        )
        .unwrap();
        assert_ne!(a.provider_message_id, b.provider_message_id);
        assert_ne!(a.provider_message_id, c.provider_message_id);
        assert_eq!(a.provider_message_id, resend.provider_message_id);
    }

    #[test]
    fn a_timestamp_outside_the_window_either_way_is_stale() {
        let hook = hook();
        let code = |signed_at: i64| {
            post(
                &hook,
                "/webhooks/generic/shop",
                EVENT,
                SECRET,
                signed_at,
                T0,
            )
            .err()
            .map(|e| (e.status().as_u16(), e.code()))
        };
        assert_eq!(code(T0 - 300), None, "the window's edge is inside");
        assert_eq!(code(T0 + 300), None, "a sender's clock may be ahead");
        assert_eq!(code(T0 - 301), Some((401, "stale_timestamp")));
        assert_eq!(code(T0 + 301), Some((401, "stale_timestamp")));
        assert_eq!(code(0), Some((401, "stale_timestamp")));
    }

    #[test]
    fn authentication_failures_are_401_with_the_reason_and_come_before_the_body() {
        let hook = hook();
        let code = |r: Result<Received, ApiError>| r.map(|_| ()).unwrap_err().code();
        let path = "/webhooks/generic/shop";
        assert_eq!(
            code(post(&hook, path, EVENT, "wrong", T0, T0)),
            "invalid_signature"
        );
        // A body that is not even JSON, wrongly signed: the signature is what is refused.
        assert_eq!(
            code(post(&hook, path, "{", "wrong", T0, T0)),
            "invalid_signature"
        );
        // A forged request learns nothing about our clock.
        assert_eq!(
            code(post(&hook, path, EVENT, "wrong", 0, T0)),
            "invalid_signature"
        );
        let headers = http::HeaderMap::new();
        let missing = hook
            .receive(&WebhookRequest {
                url: path,
                path,
                headers: &headers,
                body: EVENT.as_bytes(),
                now: at(T0),
            })
            .unwrap_err();
        assert_eq!(
            (missing.status().as_u16(), missing.code()),
            (401, "missing_signature")
        );

        let ts = "1.8e9";
        assert_eq!(
            check_signature(
                SECRET.as_bytes(),
                300,
                Some(ts),
                Some(&super::super::sign(SECRET.as_bytes(), ts, b"{}")),
                b"{}",
                at(T0)
            )
            .unwrap_err()
            .code(),
            "invalid_timestamp"
        );
    }

    #[test]
    fn an_unknown_source_or_one_without_a_secret_is_400_naming_it() {
        let hook = hook();
        for name in ["nope", "unsigned"] {
            let e = post(
                &hook,
                &format!("/webhooks/generic/{name}"),
                EVENT,
                "",
                T0,
                T0,
            )
            .unwrap_err();
            assert_eq!((e.status().as_u16(), e.code()), (400, "unknown_source"));
            assert!(e.message().contains(&format!("{name:?}")), "{e}");
        }
    }

    #[test]
    fn fields_are_found_by_dotted_path_and_a_missing_one_is_named() {
        let body: Value = serde_json::json!({"a": {"b": {"c": 7}}, "n": null, "s": "x"});
        assert_eq!(field_at(&body, "a.b.c"), Some(&serde_json::json!(7)));
        assert_eq!(field_at(&body, "s"), Some(&serde_json::json!("x")));
        assert_eq!(field_at(&body, "n"), None, "null counts as missing");
        assert_eq!(field_at(&body, "a.x"), None);
        assert_eq!(field_at(&body, "s.x"), None, "a string has no fields");

        let src = source();
        let parse =
            |body: &str| parse_generic_event(body.as_bytes(), Some("application/json"), &src, 10);
        let err = |body: &str| {
            let e = parse(body).unwrap_err();
            (e.code(), e.message().to_string())
        };
        let ok = parse(r#"{"id":42,"user":{"id":7},"message":{"body":"hello"}}"#).unwrap();
        assert_eq!(
            (ok.id.as_str(), ok.sender.as_str()),
            ("42", "7"),
            "numbers are read as text"
        );
        assert_eq!(
            err(r#"{"id":"e","user":{},"message":{"body":"x"}}"#),
            ("missing_field", "user.id is required".into())
        );
        assert_eq!(
            err(r#"{"id":"e","user":{"id":"  "},"message":{"body":"x"}}"#).0,
            "missing_field"
        );
        assert_eq!(
            err(r#"{"user":{"id":"u"},"message":{"body":"x"}}"#),
            ("missing_field", "id is required".into())
        );
        assert_eq!(
            err(r#"{"id":"e","user":{"id":"u"}}"#),
            ("missing_field", "message.body is required".into())
        );
        for (body, code) in [
            (
                r#"{"id":"e","user":{"id":["u"]},"message":{"body":"x"}}"#,
                "invalid_field",
            ),
            (
                r#"{"id":"e","user":{"id":"u\u0000"},"message":{"body":"x"}}"#,
                "invalid_field",
            ),
            (
                r#"{"id":"e.1","user":{"id":"u"},"message":{"body":"x"}}"#,
                "invalid_field",
            ),
            (
                r#"{"id":"e","user":{"id":"u"},"message":{"body":7}}"#,
                "invalid_field",
            ),
            (
                r#"{"id":"e","user":{"id":"u"},"message":{"body":"12345678901"}}"#,
                "text_too_long",
            ),
            ("[1]", "malformed_json"),
            ("{", "malformed_json"),
        ] {
            assert_eq!(err(body).0, code, "{body}");
        }
        let long = format!(
            r#"{{"id":"e","user":{{"id":"{}"}},"message":{{"body":"x"}}}}"#,
            "u".repeat(MAX_SENDER_CHARS + 1)
        );
        assert_eq!(err(&long).0, "invalid_field");
        let latin1 = b"{\"id\":\"e\",\"user\":{\"id\":\"\xe9\"},\"message\":{\"body\":\"x\"}}";
        assert_eq!(
            parse_generic_event(latin1, Some("application/json"), &src, 10)
                .unwrap_err()
                .code(),
            "malformed_json",
            "only UTF-8"
        );
        for ct in [
            None,
            Some("text/plain"),
            Some("application/json; charset=latin1"),
        ] {
            assert_eq!(
                parse_generic_event(b"{}", ct, &src, 10).unwrap_err().code(),
                "unsupported_media_type"
            );
        }
    }
}
