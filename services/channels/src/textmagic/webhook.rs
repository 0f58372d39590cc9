//! TextMagic's inbound message callback.
//!
//! It carries `id`, `sender`, `receiver`, `messageTime` (`2012-11-28T18:38:28+0000`) and
//! `text`: as a JSON body per the v2 documentation, and as form or multipart fields from older
//! set-ups; all three are read the same way. Numbers come as digits without `+`.
use futures::FutureExt as _;
use http::StatusCode;
use switchboard_kit::config::{Config, Secret};

use crate::ApiError;
use crate::form::{self, MAX_FORM_FIELDS};
use crate::ingress::{self, Ack, Incoming, Received, Webhook, WebhookRequest};

const PATH_PREFIX: &str = "/webhooks/textmagic/sms/";

/// A TextMagic callback, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextMagicSms {
    /// `id`: TextMagic's message id (its retries carry the same one).
    pub id: String,
    /// `sender`, normalised to E.164.
    pub sender: String,
    /// `receiver` (our number), as sent.
    pub receiver: String,
    /// `text`, control characters removed, at most `max_text_chars` characters.
    pub text: String,
}

/// The callback's fields, whichever encoding brought them.
#[derive(Debug, Default)]
struct Fields {
    id: Option<String>,
    sender: Option<String>,
    receiver: Option<String>,
    text: Option<String>,
}

impl Fields {
    fn set(&mut self, name: &str, value: String) {
        match name {
            "id" => self.id = Some(value),
            "sender" => self.sender = Some(value),
            "receiver" => self.receiver = Some(value),
            "text" => self.text = Some(value),
            _ => {}
        }
    }
}

/// A JSON scalar as text: TextMagic sends ids as numbers, numbers as strings or digits.
fn scalar(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn read_json(body: &[u8]) -> Result<Fields, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("malformed_json", format!("body is not JSON: {e}")))?;
    let object = value
        .as_object()
        .ok_or_else(|| ApiError::bad_request("malformed_json", "body must be a JSON object"))?;
    let mut fields = Fields::default();
    for name in ["id", "sender", "receiver", "text"] {
        if let Some(v) = object.get(name).filter(|v| !v.is_null()) {
            let text = scalar(v).ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_field",
                    format!("{name} must be a string or number"),
                )
            })?;
            fields.set(name, text);
        }
    }
    Ok(fields)
}

fn read_form(body: &[u8]) -> Result<Fields, ApiError> {
    let mut fields = Fields::default();
    for (name, value) in
        form::parse_form(body, MAX_FORM_FIELDS).map_err(form::FormError::rejection)?
    {
        fields.set(&name, value);
    }
    Ok(fields)
}

fn read_multipart(body: &[u8], content_type: &str) -> Result<Fields, ApiError> {
    let malformed = |e: &dyn std::fmt::Display| {
        ApiError::bad_request("malformed_multipart", format!("multipart body: {e}"))
    };
    let boundary = multer::parse_boundary(content_type).map_err(|e| malformed(&e))?;
    let chunk = bytes::Bytes::copy_from_slice(body);
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(chunk) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    // The whole body is in memory, so parsing never waits: one poll finishes it.
    let parsed = async {
        let mut fields = Fields::default();
        let mut count = 0;
        while let Some(field) = multipart.next_field().await.map_err(|e| malformed(&e))? {
            count += 1;
            if count > MAX_FORM_FIELDS {
                return Err(form::FormError::TooManyFields.rejection());
            }
            let name = field.name().unwrap_or_default().to_string();
            let bytes = field.bytes().await.map_err(|e| malformed(&e))?;
            let value = String::from_utf8(bytes.to_vec()).map_err(|_| {
                ApiError::bad_request("bad_encoding", format!("{name} is not UTF-8"))
            })?;
            fields.set(&name, value);
        }
        Ok(fields)
    }
    .now_or_never();
    parsed.unwrap_or_else(|| Err(malformed(&"incomplete body")))
}

/// Read a TextMagic callback body (after its token was checked): the pure part of `POST
/// /webhooks/textmagic/sms/<token>`, shared by the webhook and the fuzz target
/// `textmagic_webhook`.
///
/// In order: the content type is JSON, a form or multipart (415); the body reads as such, in
/// UTF-8 (400); `id` and `sender` are present and the id is header-safe (400); `text` is within
/// `max_text_chars` (413); `sender` is a phone number (400). No field may contain NUL.
pub fn parse_textmagic_sms(
    body: &[u8],
    content_type: Option<&str>,
    max_text_chars: usize,
    default_region: &str,
) -> Result<TextMagicSms, ApiError> {
    let content_type = content_type.unwrap_or_default();
    let media_type = ingress::media_type(content_type);
    if !ingress::charset_is_utf8(content_type) {
        return Err(unsupported());
    }
    let fields = match media_type.as_str() {
        "application/json" => read_json(body)?,
        "application/x-www-form-urlencoded" => read_form(body)?,
        "multipart/form-data" => read_multipart(body, content_type)?,
        _ => return Err(unsupported()),
    };
    for value in [&fields.id, &fields.sender, &fields.receiver, &fields.text]
        .into_iter()
        .flatten()
    {
        if value.contains('\0') {
            return Err(ApiError::bad_request(
                "bad_encoding",
                "a field contains a NUL character",
            ));
        }
    }
    let id = fields.id.unwrap_or_default();
    ingress::check_provider_id("id", &id)?;
    let sender = fields
        .sender
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| ApiError::missing_field("sender"))?;
    let text = ingress::clean_text(
        "text",
        fields.text.as_deref().unwrap_or_default(),
        max_text_chars,
    )?;
    // TextMagic writes numbers in international form without the `+`.
    let trimmed = sender.trim();
    let international = if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        format!("+{trimmed}")
    } else {
        trimmed.to_string()
    };
    let sender = switchboard_kit::address::normalize_phone(&international, default_region)
        .map_err(|e| ApiError::bad_request("invalid_sender", e.to_string()))?;
    Ok(TextMagicSms {
        id,
        sender,
        receiver: fields.receiver.unwrap_or_default(),
        text,
    })
}

fn unsupported() -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        "Content-Type must be application/json, application/x-www-form-urlencoded or \
         multipart/form-data (UTF-8)",
    )
}

/// `POST /webhooks/textmagic/sms/<token>`.
pub struct TextMagicWebhook {
    token: Secret,
    max_text_chars: usize,
    default_region: String,
}

impl TextMagicWebhook {
    pub fn new(config: &Config) -> Self {
        Self {
            token: config.textmagic.webhook_token.clone(),
            max_text_chars: config.gateway.max_text_chars,
            default_region: config.identity.default_region.clone(),
        }
    }

    /// Whether the path's token is the configured one ([`ingress::secret_matches`]).
    fn token_matches(&self, path: &str) -> bool {
        let given = path.strip_prefix(PATH_PREFIX).unwrap_or_default();
        ingress::secret_matches(given, self.token.expose())
    }
}

impl Webhook for TextMagicWebhook {
    fn route(&self) -> &'static str {
        "/webhooks/textmagic/sms/{token}"
    }

    fn channel(&self) -> &'static str {
        "sms"
    }

    fn provider(&self) -> &'static str {
        "textmagic"
    }

    fn receive(&self, request: &WebhookRequest<'_>) -> Result<Incoming, ApiError> {
        if self.token.expose().is_empty() {
            return Err(ApiError::forbidden(
                "not_configured",
                "textmagic.webhook_token is not set: TextMagic callbacks cannot be authenticated",
            ));
        }
        if !self.token_matches(request.path) {
            return Err(ApiError::forbidden(
                "invalid_token",
                "the token in the callback URL does not match",
            ));
        }
        let sms = parse_textmagic_sms(
            request.body,
            request.content_type(),
            self.max_text_chars,
            &self.default_region,
        )?;
        Ok(Received {
            provider_message_id: sms.id,
            sender: sms.sender,
            recipient: sms.receiver,
            text: sms.text,
            media_urls: Vec::new(),
            agent: String::new(),
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
    use super::*;

    fn parse(body: &str, content_type: &str) -> Result<TextMagicSms, ApiError> {
        parse_textmagic_sms(body.as_bytes(), Some(content_type), 100, "US")
    }

    fn expected() -> TextMagicSms {
        TextMagicSms {
            id: "49575710".into(),
            sender: "+447860021130".into(),
            receiver: "447624800500".into(),
            text: "Hi there".into(),
        }
    }

    #[test]
    fn json_form_and_multipart_callbacks_read_the_same() {
        let json = r#"{"id":49575710,"sender":"447860021130","receiver":"447624800500",
            "messageTime":"2012-11-28T18:38:28+0000","text":"Hi there"}"#;
        assert_eq!(parse(json, "application/json").unwrap(), expected());
        let form = "id=49575710&sender=447860021130&receiver=447624800500\
                    &messageTime=2012-11-28T18%3A38%3A28%2B0000&text=Hi+there";
        assert_eq!(
            parse(form, "application/x-www-form-urlencoded").unwrap(),
            expected()
        );
        let multipart = "--XyZ\r\nContent-Disposition: form-data; name=\"id\"\r\n\r\n49575710\r\n\
            --XyZ\r\nContent-Disposition: form-data; name=\"sender\"\r\n\r\n447860021130\r\n\
            --XyZ\r\nContent-Disposition: form-data; name=\"receiver\"\r\n\r\n447624800500\r\n\
            --XyZ\r\nContent-Disposition: form-data; name=\"text\"\r\n\r\nHi there\r\n--XyZ--\r\n";
        assert_eq!(
            parse(multipart, "multipart/form-data; boundary=XyZ").unwrap(),
            expected()
        );
    }

    #[test]
    fn bad_callbacks_are_refused_with_the_reason() {
        let code = |body: &str, ct: &str| parse(body, ct).unwrap_err().code();
        assert_eq!(code("{}", "text/plain"), "unsupported_media_type");
        assert_eq!(code("{", "application/json"), "malformed_json");
        assert_eq!(code("[1]", "application/json"), "malformed_json");
        assert_eq!(
            code(r#"{"sender":"1555"}"#, "application/json"),
            "missing_field"
        );
        assert_eq!(
            code(r#"{"id":"a b","sender":"1"}"#, "application/json"),
            "invalid_field"
        );
        assert_eq!(code(r#"{"id":1}"#, "application/json"), "missing_field");
        assert_eq!(
            code(r#"{"id":1,"sender":"hello"}"#, "application/json"),
            "invalid_sender"
        );
        assert_eq!(
            code(r#"{"id":1,"sender":{}}"#, "application/json"),
            "invalid_field"
        );
        let long = format!(
            r#"{{"id":1,"sender":"447860021130","text":"{}"}}"#,
            "x".repeat(101)
        );
        assert_eq!(code(&long, "application/json"), "text_too_long");
        assert_eq!(
            code("id=1&sender=%zz", "application/x-www-form-urlencoded"),
            "malformed_form"
        );
        assert_eq!(
            code("--x\r\nbroken", "multipart/form-data; boundary=x"),
            "malformed_multipart"
        );
        assert_eq!(code("id=1", "multipart/form-data"), "malformed_multipart");
        assert_eq!(
            code(
                r#"{"id":1,"sender":"447860021130","text":"a\u0000"}"#,
                "application/json"
            ),
            "bad_encoding"
        );
    }

    #[test]
    fn the_token_in_the_path_authenticates() {
        let mut config = Config::default();
        config.textmagic.webhook_token = Secret::new("s3cret");
        let hook = TextMagicWebhook::new(&config);
        assert!(hook.token_matches("/webhooks/textmagic/sms/s3cret"));
        assert!(!hook.token_matches("/webhooks/textmagic/sms/s3cre"));
        assert!(!hook.token_matches("/webhooks/textmagic/sms/"));
        let unset = TextMagicWebhook::new(&Config::default());
        let headers = http::HeaderMap::new();
        let request = WebhookRequest {
            url: "http://x/webhooks/textmagic/sms/",
            path: "/webhooks/textmagic/sms/",
            headers: &headers,
            body: b"",
            now: chrono::Utc::now(),
        };
        assert_eq!(
            unset.receive(&request).unwrap_err().code(),
            "not_configured"
        );
    }
}
