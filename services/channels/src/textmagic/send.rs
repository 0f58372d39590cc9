//! TextMagic's v2 Messages API: `POST {base}/api/v2/messages` with `X-TM-Username` and
//! `X-TM-Key`, a JSON body of `text`, `phones` (digits, no `+`) and `from`; 201 with the
//! message's `id`, 429 when we must slow down.
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use switchboard_kit::config::TextMagicConfig;

use crate::egress::{self, Egress, OutboundPart, SendError};

/// TextMagic sends one message as at most 6 SMS parts: 6 × 153 GSM characters.
pub const MAX_GSM_CHARS: usize = 918;
/// … or 6 × 67 characters when the text needs Unicode (UCS-2).
pub const MAX_UNICODE_CHARS: usize = 402;
/// GSM characters that take two of a part's places (the escape table).
const GSM_EXTENDED: &str = "^{}\\[~]|";

#[derive(Clone)]
pub struct TextMagicSender {
    http: reqwest::Client,
    config: TextMagicConfig,
}

#[derive(Serialize)]
struct NewMessage<'a> {
    text: &'a str,
    phones: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    from: &'a str,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Created {
    id: Option<serde_json::Value>,
    message_id: Option<serde_json::Value>,
}

/// A number as TextMagic writes it: digits only, no `+` (`+44 7860-021130` → `447860021130`).
pub fn textmagic_number(number: &str) -> String {
    number.chars().filter(char::is_ascii_digit).collect()
}

fn id_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

impl TextMagicSender {
    pub fn new(config: TextMagicConfig) -> Self {
        Self {
            http: crate::http_client(),
            config,
        }
    }

    /// Send one message (at most 6 parts long). Returns TextMagic's message id.
    pub async fn send_text(&self, to: &str, from: &str, text: &str) -> Result<String, SendError> {
        let base = egress::api_base(&self.config.api_base, "https://rest.textmagic.com");
        let from = if self.config.from_number.is_empty() {
            textmagic_number(from)
        } else {
            textmagic_number(&self.config.from_number)
        };
        let phones = textmagic_number(to);
        let request = self
            .http
            .post(format!("{base}/api/v2/messages"))
            .header("X-TM-Username", &self.config.username)
            .header("X-TM-Key", self.config.api_key.expose())
            .json(&NewMessage {
                text,
                phones: &phones,
                from: &from,
            });
        // 400, 404, 422: validation failed (invalid number, text too long).
        let created: Created = egress::send_request(request, "TextMagic", &[400, 404, 422]).await?;
        created
            .message_id
            .as_ref()
            .and_then(id_text)
            .or_else(|| created.id.as_ref().and_then(id_text))
            .ok_or_else(|| SendError::Unavailable("TextMagic answered without a message id".into()))
    }
}

/// The longest part TextMagic takes for `text`: GSM text fits more than Unicode text.
pub fn max_part_chars(text: &str) -> usize {
    if text.is_ascii() {
        if text.chars().any(|c| GSM_EXTENDED.contains(c)) {
            MAX_GSM_CHARS / 2
        } else {
            MAX_GSM_CHARS
        }
    } else {
        MAX_UNICODE_CHARS
    }
}

impl Egress for TextMagicSender {
    fn split(&self, text: &str) -> Vec<String> {
        egress::split_message(text, max_part_chars(text))
    }

    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
        self.send_text(part.to, part.from, part.text).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_fit_six_sms() {
        assert_eq!(max_part_chars("hello"), 918);
        assert_eq!(max_part_chars("a [link]"), 459);
        assert_eq!(max_part_chars("héllo"), 402);
        assert_eq!(textmagic_number("+44 7860-021130"), "447860021130");
    }
}
