//! A channel's way in: a webhook route, the request's authentication, and its reading.
use http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ApiError;
pub use switchboard_kit::receipts::{Receipt, ReceiptStatus};

/// Whether a secret a request carries is the configured one, in constant time, also in its
/// length (both sides are hashed first). An empty configured secret matches nothing, so an
/// unconfigured channel never lets an empty credential in.
pub fn secret_matches(given: &str, expected: &str) -> bool {
    if expected.is_empty() {
        return false;
    }
    let given = Sha256::digest(given.as_bytes());
    let expected = Sha256::digest(expected.as_bytes());
    given.ct_eq(&expected).into()
}

/// A signed request's timestamp (`header`, unix seconds) within `window_s` of `now`, else 401
/// `invalid_timestamp` / `stale_timestamp`: what keeps a captured request from being replayed
/// later. Checked after the signature, so a forged request learns nothing of our clock.
pub fn check_timestamp(
    header: &str,
    timestamp: &str,
    window_s: u64,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    let sent: i64 = Some(timestamp)
        .filter(|t| (1..=18).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_timestamp",
                format!("{header} must be unix seconds"),
            )
        })?;
    if now.timestamp().abs_diff(sent) > window_s {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "stale_timestamp",
            format!("{header} is more than {window_s} s from our clock"),
        ));
    }
    Ok(())
}

/// What a webhook handler gets to look at: the request, as received, and where it was posted.
#[derive(Debug, Clone, Copy)]
pub struct WebhookRequest<'a> {
    /// The full public URL the provider posted to (configured base URL + path and query):
    /// what providers that sign the URL sign.
    pub url: &'a str,
    /// The path alone (`/webhooks/textmagic/sms/<token>`).
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
    /// When the gateway received it: what signed timestamps are checked against (given, not
    /// read from the clock, so `receive` stays pure and testable).
    pub now: chrono::DateTime<chrono::Utc>,
}

impl WebhookRequest<'_> {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn content_type(&self) -> Option<&str> {
        self.header("content-type")
    }
}

/// A message a webhook authenticated and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The provider's id for this message: its retries carry the same one, so they become one
    /// turn. At most [`MAX_PROVIDER_ID_CHARS`] ASCII letters, digits, `-` and `_`.
    pub provider_message_id: String,
    /// The sender's address, normalised (E.164 for phones).
    pub sender: String,
    /// The address the sender wrote to (our number), as sent.
    pub recipient: String,
    /// The text, UTF-8, control characters removed, within the configured length.
    pub text: String,
    pub media_urls: Vec<String>,
    /// The agent the message goes to; empty: the channel's default.
    pub agent: String,
}

/// What an authenticated webhook request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// Messages to take, in order, each numbered and published before the provider is
    /// answered with [`Webhook::ack`] (a provider may batch several in one request).
    Messages(Vec<Received>),
    /// Reports on messages we sent (delivery receipts: WhatsApp's statuses, Twilio's status
    /// callbacks), kept before the provider is answered, and the messages that came with them.
    Receipts {
        receipts: Vec<Receipt>,
        messages: Vec<Received>,
    },
    /// A request the provider makes of the endpoint itself (Slack's `url_verification`):
    /// answered as given, nothing published.
    Answer(Answer),
    /// An event that is no message for us (an edit, a status callback, a group chat that is
    /// not configured as a conversation): acknowledged, so the provider does not send it again,
    /// and counted and logged with this reason (`sb_gateway_ignored_total`), never dropped
    /// unseen.
    Ignored(&'static str),
}

impl From<Received> for Incoming {
    fn from(received: Received) -> Self {
        Incoming::Messages(vec![received])
    }
}

impl Incoming {
    /// The messages it carries (none for an answer or an ignored event).
    pub fn messages(self) -> Vec<Received> {
        match self {
            Incoming::Messages(messages) | Incoming::Receipts { messages, .. } => messages,
            Incoming::Answer(_) | Incoming::Ignored(_) => Vec::new(),
        }
    }

    /// The delivery receipts it carries.
    pub fn receipts(&self) -> &[Receipt] {
        match self {
            Incoming::Receipts { receipts, .. } => receipts,
            _ => &[],
        }
    }

    /// Its one message: what a test of a one-message channel reads (`None` otherwise).
    pub fn message(self) -> Option<Received> {
        let mut messages = self.messages();
        (messages.len() == 1).then(|| messages.remove(0))
    }
}

/// A provider's request answered by the endpoint itself: 200 with this body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub content_type: &'static str,
    pub body: String,
}

/// What the provider is answered once the message is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub content_type: &'static str,
    pub body: &'static str,
}

/// A channel's ingress: the route it is posted to and how a request becomes a [`Received`].
///
/// `receive` is pure (no I/O): the gateway does the rest the same way for every channel
/// (numbering the sender's messages, publishing durably, answering only after the publish was
/// acknowledged, counting refusals by channel and reason).
pub trait Webhook: Send + Sync + 'static {
    /// The axum route (`/webhooks/twilio/sms`, `/webhooks/textmagic/sms/{token}`).
    fn route(&self) -> &'static str;
    /// The logical channel (`sms`): replies go back on it, and the directory and session scope
    /// see it.
    fn channel(&self) -> &'static str;
    /// The provider (`twilio`), which also picks the egress for the reply.
    fn provider(&self) -> &'static str;
    /// Authenticate the request and read what it carries, or say why not (status, code,
    /// reason).
    fn receive(&self, request: &WebhookRequest<'_>) -> Result<Incoming, ApiError>;
    /// The answer once the message is stored.
    fn ack(&self) -> Ack;
    /// A provider's `GET` to the route: the subscription handshake some make (Meta's
    /// `hub.challenge`, checked against a verify token). `None`: the provider makes none, and a
    /// `GET` is answered 405.
    fn handshake(&self, _request: &WebhookRequest<'_>) -> Option<Result<Answer, ApiError>> {
        None
    }
}

/// Longest accepted provider message id. Twilio's are 34 characters, TextMagic's are numbers.
pub const MAX_PROVIDER_ID_CHARS: usize = 64;

/// A provider message id becomes part of a NATS header (the dedupe id): letters, digits, `-`
/// and `_` only, and not empty.
pub fn check_provider_id(field: &str, id: &str) -> Result<(), ApiError> {
    if id.is_empty() {
        return Err(ApiError::missing_field(field));
    }
    if id.len() > MAX_PROVIDER_ID_CHARS
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ApiError::bad_request(
            "invalid_field",
            format!(
                "{field} must be 1 to {MAX_PROVIDER_ID_CHARS} ASCII letters, digits, '-' or '_'"
            ),
        ));
    }
    Ok(())
}

/// Longest id a client (chat, API) may give its message.
pub const MAX_CLIENT_ID_CHARS: usize = 40;

/// The channel-wide id of a client's message. Clients pick their own ids, so two people may both
/// send "1"; prefixed by a digest of the sender it is unique across the channel (the turns table
/// and the dedupe window key on it) and stays header-safe whatever the sender's address is.
pub fn client_message_key(sender: &str, client_id: &str) -> String {
    format!("{}-{client_id}", sender_digest(sender))
}

/// The client's own id back from [`client_message_key`] (the key itself if it is not one).
pub fn client_id<'a>(sender: &str, key: &'a str) -> &'a str {
    key.strip_prefix(sender_digest(sender).as_str())
        .and_then(|rest| rest.strip_prefix('-'))
        .unwrap_or(key)
}

fn sender_digest(sender: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(sender.as_bytes());
    hex::encode(&digest[..8])
}

/// A client's id for its message: like a provider id, at most [`MAX_CLIENT_ID_CHARS`].
pub fn check_client_id(field: &str, id: &str) -> Result<(), ApiError> {
    check_provider_id(field, id)?;
    if id.len() > MAX_CLIENT_ID_CHARS {
        return Err(ApiError::bad_request(
            "invalid_field",
            format!("{field} must be at most {MAX_CLIENT_ID_CHARS} characters"),
        ));
    }
    Ok(())
}

/// The message text every channel stores: control characters removed (tab and line feed
/// kept; `\r\n` becomes `\n`), at most `max_chars` characters (else 413, named after `field`).
pub fn clean_text(field: &str, text: &str, max_chars: usize) -> Result<String, ApiError> {
    let cleaned: String = text
        .chars()
        .filter(|&c| c == '\n' || c == '\t' || !c.is_control())
        .collect();
    if cleaned.chars().count() > max_chars {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "text_too_long",
            format!("{field} is longer than {max_chars} characters"),
        ));
    }
    Ok(cleaned)
}

/// The text of a message a client of ours sent (chat, API, generic webhook, an agent-started
/// message): [`clean_text`], and not blank, since a blank message would be a turn with nothing
/// to answer. (SMS keeps `clean_text` alone: an MMS may carry only media.)
pub fn message_text(field: &str, text: &str, max_chars: usize) -> Result<String, ApiError> {
    let cleaned = clean_text(field, text, max_chars)?;
    if cleaned.trim().is_empty() {
        return Err(ApiError::missing_field(field));
    }
    Ok(cleaned)
}

/// The media type of a `Content-Type` value, lowercased, without parameters.
pub fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// A webhook's JSON body read as `T`: 415 `unsupported_media_type` unless the `Content-Type` is
/// `application/json` (UTF-8), 400 `malformed_json` unless it parses. serde_json refuses bytes
/// that are not UTF-8, so every string read is valid text.
pub fn json_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
    content_type: Option<&str>,
) -> Result<T, ApiError> {
    let content_type = content_type.unwrap_or_default();
    if media_type(content_type) != "application/json" || !charset_is_utf8(content_type) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Content-Type must be application/json (UTF-8)",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("malformed_json", format!("body is not JSON: {e}")))
}

/// Whether a `Content-Type`'s charset (if any) is UTF-8.
pub fn charset_is_utf8(content_type: &str) -> bool {
    content_type
        .split(';')
        .skip(1)
        .all(|param| match param.split_once('=') {
            Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
                let value = value.trim().trim_matches('"');
                value.eq_ignore_ascii_case("utf-8") || value.eq_ignore_ascii_case("utf8")
            }
            _ => true,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_removed_and_length_counts_characters() {
        assert_eq!(
            clean_text("text", "a\u{0}b\u{7}c\r\nd\te\u{1b}[31m", 100).unwrap(),
            "abc\nd\te[31m"
        );
        assert_eq!(
            clean_text("text", "é".repeat(5).as_str(), 5).unwrap().len(),
            10
        );
        let e = clean_text("text", "123456", 5).unwrap_err();
        assert_eq!(e.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(e.code(), "text_too_long");
    }

    #[test]
    fn a_client_id_is_made_unique_by_its_sender_and_given_back_as_it_was() {
        let a = client_message_key("user-1", "1");
        let b = client_message_key("user-2", "1");
        assert_ne!(a, b);
        assert!(check_provider_id("key", &a).is_ok());
        assert_eq!(client_id("user-1", &a), "1");
        assert_eq!(client_id("user-2", &b), "1");
        assert_eq!(
            client_id("user-2", &a),
            a,
            "another sender's key is not theirs"
        );
        let long = "x".repeat(MAX_CLIENT_ID_CHARS);
        assert!(check_provider_id("key", &client_message_key("any sender", &long)).is_ok());
        assert!(check_client_id("id", &format!("{long}x")).is_err());
    }

    #[test]
    fn provider_ids_are_header_safe() {
        assert!(check_provider_id("id", "SM0123abc").is_ok());
        assert!(check_provider_id("id", "49575710").is_ok());
        assert_eq!(
            check_provider_id("id", "").unwrap_err().code(),
            "missing_field"
        );
        for bad in ["a b", "a\nb", "a.b", "ä", &"x".repeat(65)] {
            assert_eq!(
                check_provider_id("id", bad).unwrap_err().code(),
                "invalid_field"
            );
        }
    }
}
