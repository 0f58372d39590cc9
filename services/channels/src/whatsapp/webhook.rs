//! `GET /webhooks/whatsapp` (the subscription handshake) and `POST /webhooks/whatsapp` (a
//! notification: messages and statuses, several at once).
//!
//! `POST`, in order: the adapter is configured (an app secret, else 403 `not_configured`); the
//! body carries Meta's signature (401 `missing_signature` / `invalid_signature`); only then is
//! it read (415, 400 `malformed_json`, `missing_field`/`invalid_field`, 413). Every message of
//! the notification is taken, in order; statuses (sent, delivered, read, failed) are delivery
//! receipts, kept by the wamid of the message they speak of; reactions are acknowledged and
//! counted.
//!
//! A message is known by a digest of its `wamid` (`wa-<hex>`: wamids are base64 with `.` and
//! `=`, not header-safe): Meta sends a notification again until it is answered with a 2xx,
//! with the same wamids, so a retry is the same turns.
use http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use switchboard_kit::config::Config;

use super::{CHANNEL, MEDIA_SCHEME, PROVIDER, SIGNATURE_HEADER, WhatsAppSettings};
use crate::ApiError;
use crate::ingress::{
    self, Ack, Answer, Incoming, Receipt, ReceiptStatus, Received, Webhook, WebhookRequest,
};
use switchboard_kit::receipts::MAX_RECEIPT_ID_CHARS;

pub struct WhatsAppWebhook {
    settings: Result<WhatsAppSettings, String>,
    max_text_chars: usize,
}

impl WhatsAppWebhook {
    pub fn new(config: &Config) -> Self {
        Self {
            settings: super::settings(config),
            max_text_chars: config.gateway.max_text_chars,
        }
    }
}

#[derive(Deserialize)]
struct Notification {
    #[serde(default)]
    object: String,
    #[serde(default)]
    entry: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    changes: Vec<Change>,
}

#[derive(Deserialize)]
struct Change {
    #[serde(default)]
    field: String,
    #[serde(default)]
    value: ChangeValue,
}

#[derive(Deserialize, Default)]
struct ChangeValue {
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(default)]
    messages: Vec<Message>,
    #[serde(default)]
    statuses: Vec<Status>,
}

/// A status: what became of a message we sent.
#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    id: String,
    #[serde(default)]
    status: String,
    /// Unix seconds, as a string.
    #[serde(default)]
    timestamp: String,
    #[serde(default)]
    errors: Vec<StatusError>,
}

#[derive(Deserialize)]
struct StatusError {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    title: String,
    #[serde(default)]
    error_data: Option<ErrorData>,
}

#[derive(Deserialize)]
struct ErrorData {
    #[serde(default)]
    details: String,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    phone_number_id: String,
}

#[derive(Deserialize)]
struct Message {
    from: String,
    id: String,
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    text: Option<Body>,
    #[serde(default)]
    image: Option<Media>,
    #[serde(default)]
    document: Option<Media>,
    #[serde(default)]
    audio: Option<Media>,
    #[serde(default)]
    video: Option<Media>,
    #[serde(default)]
    sticker: Option<Media>,
    #[serde(default)]
    button: Option<Button>,
    #[serde(default)]
    interactive: Option<Value>,
    #[serde(default)]
    location: Option<Location>,
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    body: String,
}

#[derive(Deserialize)]
struct Media {
    id: String,
    #[serde(default)]
    caption: String,
}

#[derive(Deserialize)]
struct Button {
    #[serde(default)]
    text: String,
}

#[derive(Deserialize)]
struct Location {
    latitude: f64,
    longitude: f64,
    #[serde(default)]
    name: String,
    #[serde(default)]
    address: String,
}

/// Longest wamid taken.
const MAX_WAMID_CHARS: usize = 256;

fn invalid(field: &str, why: &str) -> ApiError {
    ApiError::bad_request("invalid_field", format!("{field} {why}"))
}

/// The header-safe id of a wamid.
fn message_key(wamid: &str) -> String {
    format!(
        "wa-{}",
        &hex::encode(Sha256::digest(wamid.as_bytes()))[..40]
    )
}

/// Read an authenticated notification (the pure part of the webhook, also the fuzz target's):
/// its messages, in order, or why it carries none.
pub fn parse_notification(
    body: &[u8],
    content_type: Option<&str>,
    default_region: &str,
    max_text_chars: usize,
) -> Result<Incoming, ApiError> {
    let notification: Notification = ingress::json_body(body, content_type)?;
    if notification.object != "whatsapp_business_account" {
        return Ok(Incoming::Ignored("other_object"));
    }
    let mut messages = Vec::new();
    let mut receipts = Vec::new();
    let (mut statuses, mut skipped) = (0usize, 0usize);
    for change in notification.entry.into_iter().flat_map(|e| e.changes) {
        if change.field != "messages" {
            skipped += 1;
            continue;
        }
        for status in change.value.statuses {
            match read_status(status)? {
                Some(receipt) => receipts.push(receipt),
                None => statuses += 1,
            }
        }
        let ours = change
            .value
            .metadata
            .map(|m| m.phone_number_id)
            .unwrap_or_default();
        if !ours.is_empty() && !ours.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid("metadata.phone_number_id", "must be digits"));
        }
        for message in change.value.messages {
            match read_message(message, &ours, default_region, max_text_chars)? {
                Some(received) => messages.push(received),
                None => skipped += 1,
            }
        }
    }
    if !receipts.is_empty() {
        return Ok(Incoming::Receipts { receipts, messages });
    }
    Ok(match (messages.is_empty(), statuses, skipped) {
        (false, _, _) => Incoming::Messages(messages),
        (true, 1.., _) => Incoming::Ignored("status"),
        (true, 0, 1..) => Incoming::Ignored("unsupported_message"),
        (true, 0, 0) => Incoming::Ignored("empty_notification"),
    })
}

/// One status as a delivery receipt, or `None` for a status this product does not read
/// (`deleted`, `warning`).
fn read_status(s: Status) -> Result<Option<Receipt>, ApiError> {
    let status = match s.status.as_str() {
        "sent" => ReceiptStatus::Sent,
        "delivered" => ReceiptStatus::Delivered,
        "read" => ReceiptStatus::Read,
        "failed" => ReceiptStatus::Failed,
        _ => return Ok(None),
    };
    if s.id.is_empty()
        || s.id.chars().count() > MAX_RECEIPT_ID_CHARS
        || s.id.chars().any(char::is_control)
    {
        return Err(invalid("statuses.id", "must be a wamid"));
    }
    let reported_at = s
        .timestamp
        .parse::<i64>()
        .ok()
        .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
        .ok_or_else(|| invalid("statuses.timestamp", "must be unix seconds"))?;
    let error = s
        .errors
        .iter()
        .map(|e| {
            let details = e.error_data.as_ref().map_or("", |d| d.details.as_str());
            let mut why = format!("({}) {}", e.code, e.title);
            if !details.is_empty() {
                why.push_str(": ");
                why.push_str(details);
            }
            why.chars()
                .filter(|c| !c.is_control())
                .take(500)
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("; ");
    Ok(Some(Receipt {
        provider_message_id: s.id,
        status,
        error,
        reported_at,
    }))
}

/// One message, or `None` for one that is no turn (a reaction, a kind we do not read).
fn read_message(
    m: Message,
    ours: &str,
    default_region: &str,
    max_text_chars: usize,
) -> Result<Option<Received>, ApiError> {
    if m.id.is_empty()
        || m.id.chars().count() > MAX_WAMID_CHARS
        || m.id.chars().any(char::is_control)
    {
        return Err(invalid("messages.id", "is not a wamid"));
    }
    if m.from.is_empty() || m.from.len() > 15 || !m.from.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid("messages.from", "must be a WhatsApp id (digits)"));
    }
    let sender = switchboard_kit::address::normalize_phone(&format!("+{}", m.from), default_region)
        .map_err(|e| invalid("messages.from", &e.to_string()))?;
    let media = [&m.image, &m.document, &m.audio, &m.video, &m.sticker]
        .into_iter()
        .flatten()
        .next();
    let (text, files) = match m.kind.as_str() {
        "text" => (m.text.map(|t| t.body).unwrap_or_default(), Vec::new()),
        "image" | "document" | "audio" | "video" | "sticker" => {
            let Some(media) = media else {
                return Err(ApiError::missing_field(&format!("messages.{}", m.kind)));
            };
            if media.id.is_empty()
                || media.id.len() > 64
                || !media.id.bytes().all(|b| b.is_ascii_alphanumeric())
            {
                return Err(invalid("messages media id", "must be letters and digits"));
            }
            (
                media.caption.clone(),
                vec![format!("{MEDIA_SCHEME}{}", media.id)],
            )
        }
        "button" => (m.button.map(|b| b.text).unwrap_or_default(), Vec::new()),
        "interactive" => {
            let reply = m.interactive.unwrap_or_default();
            let title = ["button_reply", "list_reply"]
                .iter()
                .find_map(|k| reply.get(k)?.get("title")?.as_str())
                .unwrap_or_default()
                .to_string();
            (title, Vec::new())
        }
        "location" => {
            let Some(l) = m.location else {
                return Err(ApiError::missing_field("messages.location"));
            };
            let place = [l.name.as_str(), l.address.as_str()]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(", ");
            let text = if place.is_empty() {
                format!("Location: {}, {}", l.latitude, l.longitude)
            } else {
                format!("Location: {}, {} ({place})", l.latitude, l.longitude)
            };
            (text, Vec::new())
        }
        // Reactions, system messages and kinds this product does not read are no turn.
        _ => return Ok(None),
    };
    let text = ingress::clean_text("messages.text", &text, max_text_chars)?;
    if text.trim().is_empty() && files.is_empty() {
        return Ok(None);
    }
    Ok(Some(Received {
        provider_message_id: message_key(&m.id),
        sender,
        recipient: ours.to_string(),
        text,
        media_urls: files,
        agent: String::new(),
    }))
}

impl WhatsAppWebhook {
    fn configured(&self) -> Result<&WhatsAppSettings, ApiError> {
        self.settings
            .as_ref()
            .map_err(|e| ApiError::forbidden("not_configured", format!("providers.whatsapp: {e}")))
    }
}

impl Webhook for WhatsAppWebhook {
    fn route(&self) -> &'static str {
        "/webhooks/whatsapp"
    }

    fn channel(&self) -> &'static str {
        CHANNEL
    }

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn receive(&self, request: &WebhookRequest<'_>) -> Result<Incoming, ApiError> {
        let settings = self.configured()?;
        if settings.app_secret.is_empty() {
            return Err(ApiError::forbidden(
                "not_configured",
                "providers.whatsapp.app_secret is not set: notifications cannot be verified",
            ));
        }
        let Some(signature) = request.header(SIGNATURE_HEADER) else {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing_signature",
                "X-Hub-Signature-256 is required",
            ));
        };
        if !super::verify(
            settings.app_secret.expose().as_bytes(),
            request.body,
            signature,
        ) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_signature",
                "X-Hub-Signature-256 is not sha256=<hex HMAC-SHA256 of the body> with the app secret",
            ));
        }
        parse_notification(
            request.body,
            request.content_type(),
            "",
            self.max_text_chars,
        )
    }

    fn ack(&self) -> Ack {
        Ack {
            content_type: "application/json",
            body: "{}",
        }
    }

    fn handshake(&self, request: &WebhookRequest<'_>) -> Option<Result<Answer, ApiError>> {
        Some((|| {
            let settings = self.configured()?;
            let url = url::Url::parse(request.url)
                .map_err(|_| ApiError::bad_request("bad_request", "unreadable URL"))?;
            let param = |name: &str| {
                url.query_pairs()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.into_owned())
            };
            if param("hub.mode").as_deref() != Some("subscribe") {
                return Err(ApiError::bad_request(
                    "invalid_field",
                    "hub.mode must be subscribe",
                ));
            }
            let token = param("hub.verify_token").unwrap_or_default();
            if !ingress::secret_matches(&token, settings.verify_token.expose()) {
                return Err(ApiError::forbidden(
                    "invalid_verify_token",
                    "hub.verify_token is not the configured verify token",
                ));
            }
            let challenge = param("hub.challenge")
                .filter(|c| !c.is_empty() && c.len() <= 256 && !c.chars().any(char::is_control))
                .ok_or_else(|| ApiError::missing_field("hub.challenge"))?;
            Ok(Answer {
                content_type: "text/plain",
                body: challenge,
            })
        })())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<Incoming, ApiError> {
        parse_notification(body.as_bytes(), Some("application/json"), "", 4000)
    }

    fn notification(value: &str) -> String {
        format!(
            r#"{{"object":"whatsapp_business_account","entry":[{{"id":"1","changes":[{{"field":"messages","value":{value}}}]}}]}}"#
        )
    }

    #[test]
    fn every_message_of_a_notification_is_taken_in_order() {
        let body = notification(
            r#"{"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550001234","phone_number_id":"106540352242922"},
               "messages":[{"from":"16505551234","id":"wamid.A=","timestamp":"1","type":"text","text":{"body":"hi"}},
                           {"from":"447700900123","id":"wamid.B=","timestamp":"1","type":"image","image":{"id":"555","caption":"look"}},
                           {"from":"16505551234","id":"wamid.C=","timestamp":"1","type":"reaction","reaction":{"emoji":"👍"}},
                           {"from":"16505551234","id":"wamid.D=","timestamp":"1","type":"location","location":{"latitude":1.5,"longitude":2.25,"name":"Cafe"}}]}"#,
        );
        let messages = parse(&body).unwrap().messages();
        assert_eq!(messages.len(), 3, "the reaction is no turn");
        assert_eq!(
            (
                messages[0].sender.as_str(),
                messages[0].recipient.as_str(),
                messages[0].text.as_str()
            ),
            ("+16505551234", "106540352242922", "hi")
        );
        assert!(messages[0].provider_message_id.starts_with("wa-"));
        assert!(ingress::check_provider_id("id", &messages[0].provider_message_id).is_ok());
        assert_eq!(messages[1].media_urls, ["whatsapp-media:555"]);
        assert_eq!(messages[1].text, "look");
        assert_eq!(messages[2].text, "Location: 1.5, 2.25 (Cafe)");
    }

    #[test]
    fn statuses_are_receipts_by_wamid_with_metas_reason() {
        let statuses = notification(
            r#"{"metadata":{"phone_number_id":"1"},"statuses":[
                {"id":"wamid.X=","status":"delivered","timestamp":"1765000000"},
                {"id":"wamid.Y=","status":"failed","timestamp":"1765000001","errors":[
                    {"code":131047,"title":"Re-engagement message",
                     "error_data":{"details":"More than 24 hours have passed"}}]},
                {"id":"wamid.Z=","status":"deleted","timestamp":"1765000002"}]}"#,
        );
        let incoming = parse(&statuses).unwrap();
        let receipts = incoming.receipts();
        assert_eq!(receipts.len(), 2, "{incoming:?}");
        assert_eq!(
            (receipts[0].provider_message_id.as_str(), receipts[0].status),
            ("wamid.X=", ReceiptStatus::Delivered)
        );
        assert_eq!(receipts[0].reported_at.timestamp(), 1_765_000_000);
        assert_eq!(receipts[1].status, ReceiptStatus::Failed);
        assert_eq!(
            receipts[1].error,
            "(131047) Re-engagement message: More than 24 hours have passed"
        );
        assert!(incoming.messages().is_empty());
        let bad = |status: &str| {
            parse(&notification(&format!(r#"{{"statuses":[{status}]}}"#)))
                .unwrap_err()
                .code()
        };
        assert_eq!(
            bad(r#"{"id":"","status":"read","timestamp":"1"}"#),
            "invalid_field"
        );
        assert_eq!(
            bad(r#"{"id":"w","status":"read","timestamp":"soon"}"#),
            "invalid_field"
        );
    }

    #[test]
    fn statuses_not_read_and_other_objects_are_acknowledged_with_their_reason() {
        let statuses = notification(
            r#"{"metadata":{"phone_number_id":"1"},"statuses":[{"id":"wamid.X","status":"warning"}]}"#,
        );
        assert_eq!(parse(&statuses).unwrap(), Incoming::Ignored("status"));
        assert_eq!(
            parse(r#"{"object":"page","entry":[]}"#).unwrap(),
            Incoming::Ignored("other_object")
        );
    }

    #[test]
    fn bad_notifications_get_their_code() {
        let code = |body: &str| parse(body).unwrap_err().code();
        assert_eq!(code("nope"), "malformed_json");
        let m = |message: &str| notification(&format!(r#"{{"messages":[{message}]}}"#));
        assert_eq!(
            code(&m(r#"{"from":"+1650","id":"w","type":"text"}"#)),
            "invalid_field"
        );
        assert_eq!(
            code(&m(r#"{"from":"1650","id":"","type":"text"}"#)),
            "invalid_field"
        );
        assert_eq!(
            code(&m(r#"{"from":"16505551234","id":"w","type":"image"}"#)),
            "missing_field"
        );
        assert_eq!(
            code(&m(
                r#"{"from":"16505551234","id":"w","type":"image","image":{"id":"../x"}}"#
            )),
            "invalid_field"
        );
    }
}
