//! The Graph API out: `POST /{version}/{phone number id}/messages`, text split at 4,096
//! characters, each file the agent leaves a `document` message of its own by its signed link
//! (Meta fetches it). Errors come as `{"error":{"code":…}}`: throughput limits (130429, 131056,
//! 80007) are throttling, an expired token (190) and Meta's own trouble (131000, 131016, 5xx)
//! are retried, anything else about the message (an invalid number, a closed 24-hour window
//! the API refuses at once) ends the reply in `delivery.failed`.
//!
//! The 24-hour window: Meta accepts a free-form message to someone who last wrote more than 24
//! hours ago, then fails it (131047). So the deliver stage says when the person last wrote, and
//! outside the window a part goes as the configured template (its text the template's
//! parameter), or, with none configured, ends in `delivery.failed` saying why.
//!
//! The Cloud API keeps no log of sent messages a business can read: a part whose send may have
//! reached Meta before its deliverer died is not sent again (the reply ends in
//! `delivery.failed` with the reason, never doubled).
use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::Deserialize;

use super::WhatsAppSettings;
use crate::egress::{self, AttachmentStyle, Egress, OutboundPart, SendError};
use switchboard_kit::exports::ExportLink;

/// WhatsApp's limit on a text message's body.
pub const MAX_TEXT_CHARS: usize = 4096;
/// The customer-service window: how long after the person last wrote a business may answer
/// freely.
pub const SESSION_WINDOW: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// Taken off the window, so that a part sent at its very end is not refused by Meta for the
/// time it took to get there.
const WINDOW_MARGIN: chrono::Duration = chrono::Duration::minutes(2);
/// The longest text a template's body parameter carries here.
const MAX_PARAMETER_CHARS: usize = 1000;

/// `text` as a template's parameter: cut to the longest a parameter may be, the cut marked.
pub fn template_parameter(text: &str) -> String {
    if text.chars().count() > MAX_PARAMETER_CHARS {
        let cut: String = text.chars().take(MAX_PARAMETER_CHARS - 1).collect();
        format!("{cut}…")
    } else {
        text.to_string()
    }
}

/// How a WhatsApp part goes out, whichever API carries it.
#[derive(Debug)]
pub enum WindowShape<'a> {
    /// Inside the window: the text, or the part's one file with the text as its caption.
    Free { file: Option<&'a ExportLink> },
    /// Outside it: the template `name`, its one parameter the text.
    Template { name: &'a str, parameter: String },
}

/// The shape of `part` at `now`: free inside the window; outside it the `template` (empty: not
/// configured, and the setting `setting` is named in the reason), text only. A part carries at most
/// one file (files are parts of their own: [`AttachmentStyle::PartEach`]). A part that cannot
/// go is `Rejected` with the reason, never sent for WhatsApp to drop.
pub fn window_shape<'a>(
    part: &OutboundPart<'a>,
    template: &'a str,
    setting: &str,
    now: DateTime<Utc>,
) -> Result<WindowShape<'a>, SendError> {
    let file = match part.attachments {
        [] => None,
        [file] => Some(file),
        more => {
            return Err(SendError::Rejected(format!(
                "a WhatsApp part carries one file, not {}",
                more.len()
            )));
        }
    };
    if window_open(part.last_inbound, now) {
        return Ok(WindowShape::Free { file });
    }
    let since = part
        .last_inbound
        .map_or("never".to_string(), |t| t.to_rfc3339());
    if template.is_empty() {
        return Err(SendError::Rejected(format!(
            "the 24-hour window is closed (the person last wrote: {since}) and {setting} is \
             not set"
        )));
    }
    if file.is_some() {
        return Err(SendError::Rejected(format!(
            "a file cannot go outside the 24-hour window (the person last wrote: {since})"
        )));
    }
    Ok(WindowShape::Template {
        name: template,
        parameter: template_parameter(part.text),
    })
}

/// Whether the window is open at `now` for a person who last wrote at `last_inbound`.
pub fn window_open(last_inbound: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
    let window = chrono::Duration::from_std(SESSION_WINDOW).expect("a day") - WINDOW_MARGIN;
    last_inbound.is_some_and(|t| now - t < window)
}

pub struct WhatsAppSender {
    http: reqwest::Client,
    settings: Result<WhatsAppSettings, String>,
}

#[derive(Deserialize)]
struct Sent {
    #[serde(default)]
    messages: Vec<SentMessage>,
}

#[derive(Deserialize)]
struct SentMessage {
    id: String,
}

#[derive(Deserialize)]
struct Failure {
    error: GraphError,
}

#[derive(Deserialize)]
struct GraphError {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    message: String,
}

/// Throughput and pair rate limits.
const THROTTLED: &[i64] = &[130429, 131056, 80007, 4, 17, 32, 613];
/// The token, and Meta's own trouble: an operator or time fixes them.
const RETRIED: &[i64] = &[190, 131000, 131016, 1, 2];

fn read_answer(status: u16, body: &str) -> Result<String, SendError> {
    if (200..300).contains(&status) {
        return serde_json::from_str::<Sent>(body)
            .ok()
            .and_then(|s| s.messages.into_iter().next())
            .map(|m| m.id)
            .ok_or_else(|| {
                SendError::Unavailable(format!(
                    "unreadable WhatsApp answer: {}",
                    body.chars().take(300).collect::<String>()
                ))
            });
    }
    let error = serde_json::from_str::<Failure>(body).ok().map(|f| f.error);
    let detail = match &error {
        Some(e) => format!("WhatsApp HTTP {status}: ({}) {}", e.code, e.message),
        None => format!(
            "WhatsApp HTTP {status}: {}",
            body.chars().take(300).collect::<String>()
        ),
    };
    let code = error.map(|e| e.code).unwrap_or_default();
    if status == 429 || THROTTLED.contains(&code) {
        return Err(SendError::Throttled {
            retry_after: None,
            detail,
        });
    }
    if status >= 500 || status == 401 || RETRIED.contains(&code) {
        return Err(SendError::Unavailable(detail));
    }
    Err(SendError::Rejected(detail))
}

impl WhatsAppSender {
    pub fn new(settings: Result<WhatsAppSettings, String>) -> Self {
        Self {
            http: crate::http_client(),
            settings,
        }
    }

    fn settings(&self) -> Result<&WhatsAppSettings, SendError> {
        let settings = self
            .settings
            .as_ref()
            .map_err(|e| SendError::Unavailable(format!("providers.whatsapp: {e}")))?;
        if settings.access_token.is_empty() {
            return Err(SendError::Unavailable(
                "providers.whatsapp.access_token is not set".into(),
            ));
        }
        Ok(settings)
    }
}

impl Egress for WhatsAppSender {
    fn split(&self, text: &str) -> Vec<String> {
        egress::split_message(text, MAX_TEXT_CHARS)
    }

    fn attachments(&self) -> AttachmentStyle {
        AttachmentStyle::PartEach
    }

    fn session_window(&self) -> Option<std::time::Duration> {
        Some(SESSION_WINDOW)
    }

    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
        async move {
            let settings = self.settings()?;
            // The number the person wrote to, else the configured one.
            let from = if part.from().is_empty() {
                settings.phone_number_id.as_str()
            } else {
                part.from()
            };
            if from.is_empty() {
                return Err(SendError::Unavailable(
                    "providers.whatsapp.phone_number_id is not set".into(),
                ));
            }
            let to = part.to().trim_start_matches('+');
            let mut body = serde_json::json!({
                "messaging_product": "whatsapp",
                "recipient_type": "individual",
                "to": to,
            });
            match window_shape(
                &part,
                &settings.window_template,
                "providers.whatsapp.window_template",
                Utc::now(),
            )? {
                WindowShape::Template { name, parameter } => {
                    body["type"] = "template".into();
                    body["template"] = serde_json::json!({
                        "name": name,
                        "language": { "code": settings.window_template_language },
                        "components": [{
                            "type": "body",
                            "parameters": [{ "type": "text", "text": parameter }],
                        }],
                    });
                }
                WindowShape::Free { file: None } => {
                    body["type"] = "text".into();
                    body["text"] = serde_json::json!({ "preview_url": false, "body": part.text });
                }
                WindowShape::Free { file: Some(file) } => {
                    body["type"] = "document".into();
                    body["document"] =
                        serde_json::json!({ "link": file.url, "filename": file.name });
                    if !part.text.is_empty() {
                        body["document"]["caption"] = part.text.into();
                    }
                }
            }
            let resp = self
                .http
                .post(settings.graph_url(&format!("{from}/messages")))
                .bearer_auth(settings.access_token.expose())
                .json(&body)
                .send()
                .await
                .map_err(|e| SendError::Unavailable(format!("WhatsApp: {e}")))?;
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            read_answer(status, &text)
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
            "the WhatsApp Cloud API keeps no log of sent messages: a part that may have reached \
             Meta is not sent again"
                .into(),
        )))
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_open_for_a_day_after_the_person_last_wrote_less_a_margin() {
        let now = Utc::now();
        assert!(window_open(Some(now - chrono::Duration::hours(23)), now));
        assert!(!window_open(
            Some(now - chrono::Duration::minutes(24 * 60 - 1)),
            now
        ));
        assert!(!window_open(Some(now - chrono::Duration::hours(25)), now));
        assert!(!window_open(None, now), "never wrote: closed");
    }

    #[test]
    fn metas_answer_says_whether_to_retry() {
        assert_eq!(
            read_answer(
                200,
                r#"{"messaging_product":"whatsapp","messages":[{"id":"wamid.X="}]}"#
            ),
            Ok("wamid.X=".into())
        );
        let rate = r#"{"error":{"message":"(#130429) Rate limit hit","code":130429}}"#;
        assert!(matches!(
            read_answer(400, rate),
            Err(SendError::Throttled { .. })
        ));
        let token = r#"{"error":{"message":"Invalid OAuth access token","code":190}}"#;
        assert!(matches!(
            read_answer(401, token),
            Err(SendError::Unavailable(_))
        ));
        let number =
            r#"{"error":{"message":"(#131009) Parameter value is not valid","code":131009}}"#;
        assert!(
            matches!(read_answer(400, number), Err(SendError::Rejected(d)) if d.contains("131009"))
        );
        assert!(matches!(
            read_answer(503, "down"),
            Err(SendError::Unavailable(_))
        ));
    }
}
