//! The Bot API out: `sendMessage` for text (at most 4,096 UTF-16 code units a message), and
//! `sendDocument` for each file the agent left, uploaded (the Bot API fetches documents by URL
//! only for GIF, PDF and ZIP, so the file is read from its signed link and sent as
//! `multipart/form-data`, at most 50 MB).
//!
//! Answers: `{"ok":true,"result":{"message_id":…}}`; errors carry `error_code` and a
//! `description`, and a 429 its wait in `parameters.retry_after` (seconds), which the deliver
//! stage waits out before the next attempt.
//!
//! The Bot API keeps no log of what a bot sent that a bot can read, so a part whose send may
//! have reached Telegram before its deliverer died is not sent again ([`Egress::find_sent`]
//! answers that the log cannot be read): the reply ends in `delivery.failed`, never doubled.
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::Deserialize;

use super::TelegramSettings;
use crate::egress::{self, AttachmentStyle, Egress, OutboundPart, SendError};

/// Telegram's limit on one message's text, in UTF-16 code units.
pub const MAX_TEXT_UNITS: usize = 4096;
/// Telegram's limit on a document's caption, in UTF-16 code units.
pub const MAX_CAPTION_UNITS: usize = 1024;
/// The largest file a bot may upload.
pub const MAX_UPLOAD_BYTES: i64 = 50 * 1024 * 1024;

pub struct TelegramSender {
    http: reqwest::Client,
    settings: Result<TelegramSettings, String>,
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    ok: bool,
    #[serde(default)]
    result: Option<Sent>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    parameters: Option<Parameters>,
}

#[derive(Deserialize)]
struct Sent {
    message_id: i64,
}

#[derive(Deserialize)]
struct Parameters {
    #[serde(default)]
    retry_after: Option<u64>,
}

/// Split `text` into messages of at most [`MAX_TEXT_UNITS`] UTF-16 code units, at whitespace
/// where it can.
pub fn split_text(text: &str) -> Vec<String> {
    egress::split_message(text, MAX_TEXT_UNITS)
        .into_iter()
        .flat_map(|part| {
            if part.encode_utf16().count() <= MAX_TEXT_UNITS {
                vec![part]
            } else {
                // Characters outside the BMP count twice: half as many characters always fit.
                egress::split_message(&part, MAX_TEXT_UNITS / 2)
            }
        })
        .collect()
}

/// What a Bot API answer means: the message id, or the [`SendError`] it says.
fn read_answer(
    status: u16,
    retry_header: Option<Duration>,
    body: &str,
) -> Result<String, SendError> {
    let answer: Option<Answer> = serde_json::from_str(body).ok();
    let detail = |a: &Option<Answer>| {
        let described = a.as_ref().map(|a| a.description.as_str()).unwrap_or("");
        let shown = if described.is_empty() {
            body.chars().take(300).collect::<String>()
        } else {
            described.chars().take(300).collect()
        };
        format!("Telegram HTTP {status}: {shown}")
    };
    match (status, &answer) {
        (
            200..=299,
            Some(Answer {
                ok: true,
                result: Some(sent),
                ..
            }),
        ) => Ok(sent.message_id.to_string()),
        (200..=299, _) => Err(SendError::Unavailable(format!(
            "unreadable Telegram answer: {}",
            detail(&answer)
        ))),
        (429, _) => Err(SendError::Throttled {
            retry_after: answer
                .as_ref()
                .and_then(|a| a.parameters.as_ref()?.retry_after)
                .map(Duration::from_secs)
                .or(retry_header),
            detail: detail(&answer),
        }),
        // The message is wrong for this chat (no such chat, too long, a bad file), or the
        // person blocked the bot or left: sending it again cannot help.
        (400 | 403, _) => Err(SendError::Rejected(detail(&answer))),
        // 401/404: the token is wrong (an operator can fix it); 5xx: Telegram is down.
        _ => Err(SendError::Unavailable(detail(&answer))),
    }
}

impl TelegramSender {
    pub fn new(settings: Result<TelegramSettings, String>) -> Self {
        Self {
            http: crate::http_client(),
            settings,
        }
    }

    fn settings(&self) -> Result<&TelegramSettings, SendError> {
        let settings = self
            .settings
            .as_ref()
            .map_err(|e| SendError::Unavailable(format!("providers.telegram: {e}")))?;
        if settings.bot_id().is_none() {
            return Err(SendError::Unavailable(
                "providers.telegram.bot_token is not set".into(),
            ));
        }
        Ok(settings)
    }

    /// Send a request to the Bot API and read its answer (errors never show the URL: it holds
    /// the token).
    async fn call(&self, request: reqwest::RequestBuilder) -> Result<String, SendError> {
        let resp = request
            .send()
            .await
            .map_err(|e| SendError::Unavailable(format!("Telegram: {}", e.without_url())))?;
        let status = resp.status().as_u16();
        let retry_header = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse().ok())
            .map(Duration::from_secs);
        let body = resp.text().await.unwrap_or_default();
        read_answer(status, retry_header, &body)
    }

    async fn send_text(&self, chat_id: &str, text: &str) -> Result<String, SendError> {
        let settings = self.settings()?;
        let body = serde_json::json!({ "chat_id": chat_id, "text": text });
        self.call(
            self.http
                .post(settings.method_url("sendMessage"))
                .json(&body),
        )
        .await
    }

    /// Upload one file (read from its signed link) as a document.
    async fn send_file(
        &self,
        chat_id: &str,
        caption: &str,
        file: &switchboard_kit::exports::ExportLink,
    ) -> Result<String, SendError> {
        let settings = self.settings()?;
        if file.size_bytes > MAX_UPLOAD_BYTES {
            return Err(SendError::Rejected(format!(
                "{} is {} bytes; a bot may upload at most {MAX_UPLOAD_BYTES}",
                file.name, file.size_bytes
            )));
        }
        let resp = self
            .http
            .get(&file.url)
            .send()
            .await
            .map_err(|e| SendError::Unavailable(format!("reading {}: {e}", file.name)))?;
        if !resp.status().is_success() {
            return Err(SendError::Unavailable(format!(
                "reading {} from its link answered {}",
                file.name,
                resp.status().as_u16()
            )));
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| SendError::Unavailable(format!("reading {}: {e}", file.name)))?;
        if bytes.len() as i64 > MAX_UPLOAD_BYTES {
            return Err(SendError::Rejected(format!(
                "{} is larger than a bot may upload",
                file.name
            )));
        }
        let document = reqwest::multipart::Part::bytes(bytes.to_vec())
            .file_name(file.name.clone())
            .mime_str(&file.content_type)
            .map_err(|e| SendError::Rejected(format!("{}: {e}", file.content_type)))?;
        let mut form = reqwest::multipart::Form::new()
            .text("chat_id", chat_id.to_string())
            .part("document", document);
        if !caption.is_empty() {
            form = form.text("caption", caption.to_string());
        }
        self.call(
            self.http
                .post(settings.method_url("sendDocument"))
                .multipart(form),
        )
        .await
    }
}

impl Egress for TelegramSender {
    fn split(&self, text: &str) -> Vec<String> {
        split_text(text)
    }

    fn attachments(&self) -> AttachmentStyle {
        AttachmentStyle::PartEach
    }

    /// A part may read a file from its link and upload it: two requests.
    fn lease(&self) -> Duration {
        egress::SEND_LEASE + crate::REQUEST_TIMEOUT
    }

    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
        async move {
            match part.attachments {
                [] => self.send_text(part.to(), part.text).await,
                [file] => {
                    let caption = if part.text.encode_utf16().count() <= MAX_CAPTION_UNITS {
                        part.text
                    } else {
                        ""
                    };
                    self.send_file(part.to(), caption, file).await
                }
                more => Err(SendError::Rejected(format!(
                    "a Telegram part carries one file, not {}",
                    more.len()
                ))),
            }
        }
        .boxed()
    }

    fn find_sent<'a>(
        &'a self,
        _part: OutboundPart<'a>,
        _since: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<String>, SendError>> {
        // Rejected: no later look-up can say either, so the reply ends now.
        futures::future::ready(Err(SendError::Rejected(
            "the Bot API keeps no log of a bot's messages: a part that may have reached \
             Telegram is not sent again"
                .into(),
        )))
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_reply_is_split_at_telegrams_limit_in_utf16_units() {
        let text = "word ".repeat(2000); // 10,000 characters
        let parts = split_text(&text);
        assert_eq!(parts.len(), 3);
        assert!(
            parts
                .iter()
                .all(|p| p.encode_utf16().count() <= MAX_TEXT_UNITS)
        );
        assert_eq!(parts.join(" "), text.trim_end());
        // 3,000 emoji are 6,000 UTF-16 units: over the limit as one message.
        let emoji = "😀".repeat(3000);
        let parts = split_text(&emoji);
        assert!(
            parts
                .iter()
                .all(|p| p.encode_utf16().count() <= MAX_TEXT_UNITS)
        );
        assert_eq!(parts.concat(), emoji);
    }

    #[test]
    fn telegrams_answer_says_whether_to_retry_and_when() {
        assert_eq!(
            read_answer(200, None, r#"{"ok":true,"result":{"message_id":77}}"#),
            Ok("77".into())
        );
        let throttled = read_answer(
            429,
            None,
            r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 7","parameters":{"retry_after":7}}"#,
        );
        assert!(
            matches!(&throttled, Err(SendError::Throttled { retry_after: Some(d), detail })
                if *d == Duration::from_secs(7) && detail.contains("retry after 7")),
            "{throttled:?}"
        );
        let blocked = r#"{"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"}"#;
        assert!(
            matches!(read_answer(403, None, blocked), Err(SendError::Rejected(d)) if d.contains("blocked"))
        );
        let not_found =
            r#"{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}"#;
        assert!(matches!(
            read_answer(400, None, not_found),
            Err(SendError::Rejected(_))
        ));
        for retried in [401, 404, 500, 502] {
            assert!(
                matches!(
                    read_answer(retried, None, "{}"),
                    Err(SendError::Unavailable(_))
                ),
                "{retried}"
            );
        }
        assert!(matches!(
            read_answer(200, None, r#"{"ok":true}"#),
            Err(SendError::Unavailable(_))
        ));
    }
}
