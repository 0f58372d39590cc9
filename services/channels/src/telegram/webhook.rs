//! `POST /webhooks/telegram`: one Bot API `Update` a request.
//!
//! In order: the adapter is configured (a bot token and a secret token, else 403
//! `not_configured`); the request carries the secret token (401 `invalid_secret_token`,
//! compared in constant time); only then is the body read (415, 400 `malformed_json`,
//! `missing_field`/`invalid_field`, 413).
//!
//! An update is one message, or no message for us: an edit, a channel post, a button press, a
//! membership change, a message in a group that is not configured as a conversation, or one
//! with nothing we take (a location, a poll). Those are acknowledged (Telegram would otherwise
//! send them again for a day) and counted by reason (`sb_gateway_ignored_total`).
//!
//! A message is known by `<bot id>_<chat id>_<message id>`: Telegram sends an update again
//! until it is answered with a 2xx, and each retry carries the same message, so the retry is
//! the same turn. (`update_id` alone would not do as the key: Telegram numbers updates afresh
//! from a random value after a week without any, while a chat's message ids never repeat.)
use http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use switchboard_kit::config::Config;

use super::{CHANNEL, FILE_SCHEME, PROVIDER, SECRET_HEADER, TelegramSettings};
use crate::ApiError;
use crate::ingress::{self, Ack, Incoming, Received, Webhook, WebhookRequest};

pub struct TelegramWebhook {
    settings: Result<TelegramSettings, String>,
    max_text_chars: usize,
}

impl TelegramWebhook {
    pub fn new(config: &Config) -> Self {
        Self {
            settings: super::settings(config),
            max_text_chars: config.gateway.max_text_chars,
        }
    }
}

/// A message the bot was sent, read from an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelegramMessage {
    /// `<bot id>_<chat id>_<message id>`.
    pub id: String,
    /// The chat's id: the person's (a private chat's id is the user's), or a configured group's.
    pub chat_id: String,
    pub text: String,
    /// Each file as `telegram-file:<file_id>` (a photo at its largest size).
    pub files: Vec<String>,
}

#[derive(Deserialize)]
struct Message {
    message_id: i64,
    chat: Chat,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    caption: Option<String>,
    #[serde(default)]
    photo: Vec<PhotoSize>,
    #[serde(default)]
    document: Option<File>,
    #[serde(default)]
    voice: Option<File>,
    #[serde(default)]
    audio: Option<File>,
    #[serde(default)]
    video: Option<File>,
    #[serde(default)]
    video_note: Option<File>,
    #[serde(default)]
    animation: Option<File>,
}

#[derive(Deserialize)]
struct Chat {
    id: i64,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct File {
    file_id: String,
}

#[derive(Deserialize)]
struct PhotoSize {
    file_id: String,
    #[serde(default)]
    width: u64,
    #[serde(default)]
    height: u64,
}

/// Longest file id taken (Telegram's are under 100 characters).
const MAX_FILE_ID_CHARS: usize = 256;

fn invalid(field: &str, why: &str) -> ApiError {
    ApiError::bad_request("invalid_field", format!("{field} {why}"))
}

/// Why an update that carries no message for us is acknowledged, by the update's kind.
fn not_a_message(update: &serde_json::Map<String, Value>) -> &'static str {
    const KINDS: &[(&str, &str)] = &[
        ("edited_message", "edited_message"),
        ("channel_post", "channel_post"),
        ("edited_channel_post", "channel_post"),
        ("callback_query", "callback_query"),
        ("my_chat_member", "membership"),
        ("chat_member", "membership"),
        ("chat_join_request", "membership"),
    ];
    KINDS
        .iter()
        .find(|(key, _)| update.contains_key(*key))
        .map_or("other_update", |(_, reason)| reason)
}

/// Read an authenticated update (the pure part of the webhook, also the fuzz target's): its
/// message for bot `bot_id`, or why it carries none. Only `group_chats` among groups are
/// conversations.
pub fn parse_update(
    body: &[u8],
    content_type: Option<&str>,
    bot_id: &str,
    group_chats: &[i64],
    max_text_chars: usize,
) -> Result<Result<TelegramMessage, &'static str>, ApiError> {
    let value: Value = ingress::json_body(body, content_type)?;
    let Some(update) = value.as_object() else {
        return Err(ApiError::bad_request(
            "malformed_json",
            "an update is a JSON object",
        ));
    };
    match update.get("update_id") {
        Some(Value::Number(n)) if n.is_i64() => {}
        Some(_) => return Err(invalid("update_id", "must be an integer")),
        None => return Err(ApiError::missing_field("update_id")),
    }
    let Some(message) = update.get("message").filter(|m| !m.is_null()) else {
        return Ok(Err(not_a_message(update)));
    };
    let message = Message::deserialize(message)
        .map_err(|e| ApiError::bad_request("invalid_field", format!("message: {e}")))?;
    match message.chat.kind.as_str() {
        "private" => {}
        "group" | "supergroup" if group_chats.contains(&message.chat.id) => {}
        "group" | "supergroup" => return Ok(Err("group_not_configured")),
        _ => return Ok(Err("channel_post")),
    }
    let text = message.text.as_deref().or(message.caption.as_deref());
    let text = ingress::clean_text("message.text", text.unwrap_or_default(), max_text_chars)?;
    let largest_photo = message
        .photo
        .iter()
        .max_by_key(|p| p.width.saturating_mul(p.height))
        .map(|p| p.file_id.as_str());
    let files: Vec<String> = largest_photo
        .into_iter()
        .chain(
            [
                &message.document,
                &message.voice,
                &message.audio,
                &message.video,
                &message.video_note,
                &message.animation,
            ]
            .into_iter()
            .flatten()
            .map(|f| f.file_id.as_str()),
        )
        .map(|id| {
            let header_safe = !id.is_empty()
                && id.len() <= MAX_FILE_ID_CHARS
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if header_safe {
                Ok(format!("{FILE_SCHEME}{id}"))
            } else {
                Err(invalid(
                    "message's file_id",
                    "must be letters, digits, '-' or '_'",
                ))
            }
        })
        .collect::<Result<_, _>>()?;
    if text.trim().is_empty() && files.is_empty() {
        return Ok(Err("unsupported_message"));
    }
    let id = format!("{bot_id}_{}_{}", message.chat.id, message.message_id);
    ingress::check_provider_id("message.message_id", &id)?;
    Ok(Ok(TelegramMessage {
        id,
        chat_id: message.chat.id.to_string(),
        text,
        files,
    }))
}

impl Webhook for TelegramWebhook {
    fn route(&self) -> &'static str {
        "/webhooks/telegram"
    }

    fn channel(&self) -> &'static str {
        CHANNEL
    }

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn receive(&self, request: &WebhookRequest<'_>) -> Result<Incoming, ApiError> {
        let settings = self.settings.as_ref().map_err(|e| {
            ApiError::forbidden("not_configured", format!("providers.telegram: {e}"))
        })?;
        let Some(bot_id) = settings.bot_id() else {
            return Err(ApiError::forbidden(
                "not_configured",
                "providers.telegram.bot_token is not set (or not a bot token)",
            ));
        };
        if settings.secret_token.is_empty() {
            return Err(ApiError::forbidden(
                "not_configured",
                "providers.telegram.secret_token is not set: updates cannot be authenticated",
            ));
        }
        let given = request.header(SECRET_HEADER).unwrap_or_default();
        if !ingress::secret_matches(given, settings.secret_token.expose()) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_secret_token",
                "X-Telegram-Bot-Api-Secret-Token is not the webhook's secret token",
            ));
        }
        let message = match parse_update(
            request.body,
            request.content_type(),
            bot_id,
            &settings.group_chats,
            self.max_text_chars,
        )? {
            Ok(message) => message,
            Err(reason) => return Ok(Incoming::Ignored(reason)),
        };
        Ok(Received {
            provider_message_id: message.id,
            sender: message.chat_id,
            recipient: bot_id.to_string(),
            text: message.text,
            media_urls: message.files,
            agent: String::new(),
        }
        .into())
    }

    fn ack(&self) -> Ack {
        // Telegram reads a JSON body as a method to call; an empty object calls nothing.
        Ack {
            content_type: "application/json",
            body: "{}",
        }
    }
}

#[cfg(test)]
mod tests {
    use switchboard_kit::config::Secret;

    use super::*;

    const BOT: &str = "7000000001";

    fn parse(body: &str) -> Result<Result<TelegramMessage, &'static str>, ApiError> {
        parse_update(
            body.as_bytes(),
            Some("application/json"),
            BOT,
            &[-1001],
            4000,
        )
    }

    fn update(message: &str) -> String {
        format!(r#"{{"update_id":10,"message":{message}}}"#)
    }

    #[test]
    fn a_private_message_is_known_by_bot_chat_and_message_id() {
        let m = parse(&update(
            r#"{"message_id":5,"from":{"id":42,"is_bot":false,"first_name":"Ana"},
                "chat":{"id":42,"type":"private","first_name":"Ana"},"date":1,"text":"hi\u0007 there"}"#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(m.id, "7000000001_42_5");
        assert_eq!(m.chat_id, "42");
        assert_eq!(m.text, "hi there");
        assert!(m.files.is_empty());
    }

    #[test]
    fn a_photo_is_taken_at_its_largest_size_with_its_caption_as_text() {
        let m = parse(&update(
            r#"{"message_id":6,"chat":{"id":42,"type":"private"},"date":1,"caption":"look",
                "photo":[{"file_id":"small","file_unique_id":"a","width":90,"height":67},
                         {"file_id":"big-one_1","file_unique_id":"b","width":1280,"height":960},
                         {"file_id":"mid","file_unique_id":"c","width":320,"height":240}],
                "document":{"file_id":"doc1","file_unique_id":"d"}}"#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(m.text, "look");
        assert_eq!(
            m.files,
            ["telegram-file:big-one_1", "telegram-file:doc1"],
            "largest photo first, then the other files"
        );
    }

    #[test]
    fn updates_that_are_no_message_for_us_are_acknowledged_with_their_reason() {
        let cases = [
            (r#"{"update_id":1,"edited_message":{}}"#, "edited_message"),
            (r#"{"update_id":1,"channel_post":{}}"#, "channel_post"),
            (r#"{"update_id":1,"my_chat_member":{}}"#, "membership"),
            (r#"{"update_id":1,"poll":{}}"#, "other_update"),
            (
                &update(r#"{"message_id":1,"chat":{"id":-5,"type":"group"},"text":"hi"}"#),
                "group_not_configured",
            ),
            (
                &update(r#"{"message_id":1,"chat":{"id":42,"type":"private"},"location":{}}"#),
                "unsupported_message",
            ),
        ];
        for (body, reason) in cases {
            assert_eq!(parse(body).unwrap(), Err(reason), "{body}");
        }
        let group = parse(&update(
            r#"{"message_id":3,"chat":{"id":-1001,"type":"supergroup"},"text":"hi all"}"#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            (group.chat_id.as_str(), group.id.as_str()),
            ("-1001", "7000000001_-1001_3")
        );
    }

    #[test]
    fn bad_bodies_get_their_code() {
        let code = |body: &str| parse(body).unwrap_err().code();
        assert_eq!(code("not json"), "malformed_json");
        assert_eq!(code("[]"), "malformed_json");
        assert_eq!(code(r#"{"message":{}}"#), "missing_field");
        assert_eq!(code(r#"{"update_id":"1"}"#), "invalid_field");
        assert_eq!(
            code(&update(r#"{"chat":{"id":1,"type":"private"}}"#)),
            "invalid_field"
        );
        assert_eq!(
            code(&update(
                r#"{"message_id":1,"chat":{"id":1,"type":"private"},"document":{"file_id":"a b"}}"#
            )),
            "invalid_field"
        );
        let long = update(&format!(
            r#"{{"message_id":1,"chat":{{"id":1,"type":"private"}},"text":"{}"}}"#,
            "x".repeat(4001)
        ));
        assert_eq!(code(&long), "text_too_long");
        let e = parse_update(b"{}", Some("text/plain"), BOT, &[], 10).unwrap_err();
        assert_eq!(e.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }

    fn hook(bot_token: &str, secret: &str) -> TelegramWebhook {
        TelegramWebhook {
            settings: Ok(TelegramSettings {
                bot_token: Secret::new(bot_token),
                secret_token: Secret::new(secret),
                ..Default::default()
            }),
            max_text_chars: 4000,
        }
    }

    fn post(hook: &TelegramWebhook, secret: Option<&str>) -> Result<Incoming, ApiError> {
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", "application/json".parse().unwrap());
        if let Some(secret) = secret {
            headers.insert(SECRET_HEADER, secret.parse().unwrap());
        }
        let body = update(r#"{"message_id":5,"chat":{"id":42,"type":"private"},"text":"hi"}"#);
        hook.receive(&WebhookRequest {
            url: "/webhooks/telegram",
            path: "/webhooks/telegram",
            headers: &headers,
            body: body.as_bytes(),
            now: chrono::Utc::now(),
        })
    }

    #[test]
    fn only_the_configured_secret_token_lets_an_update_in() {
        let good = hook("7000000001:AAH", "s3cret");
        let m = post(&good, Some("s3cret")).unwrap().message().unwrap();
        assert_eq!(
            (m.sender.as_str(), m.recipient.as_str()),
            ("42", "7000000001")
        );
        for wrong in [None, Some(""), Some("s3cre"), Some("s3cret2")] {
            assert_eq!(
                post(&good, wrong).unwrap_err().code(),
                "invalid_secret_token",
                "{wrong:?}"
            );
        }
        for unset in [hook("7000000001:AAH", ""), hook("", "s3cret")] {
            let e = post(&unset, Some("")).unwrap_err();
            assert_eq!(
                (e.status(), e.code()),
                (StatusCode::FORBIDDEN, "not_configured")
            );
        }
    }
}
