//! Twilio's Messages API: `POST {base}/2010-04-01/Accounts/{AccountSid}/Messages.json`.
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::Deserialize;
use switchboard_kit::config::TwilioConfig;

use crate::egress::{self, Egress, OutboundPart, SendError};

/// Twilio's limit on one message body.
pub const MAX_BODY_CHARS: usize = 1600;

#[derive(Clone)]
pub struct TwilioSender {
    http: reqwest::Client,
    config: TwilioConfig,
}

#[derive(Deserialize)]
struct Created {
    sid: String,
}

impl TwilioSender {
    pub fn new(config: TwilioConfig) -> Self {
        Self {
            http: crate::http_client(),
            config,
        }
    }

    /// Send one body (≤ 1,600 characters). Returns Twilio's message sid.
    pub async fn send_body(&self, to: &str, from: &str, body: &str) -> Result<String, SendError> {
        let base = if self.config.api_base.is_empty() {
            "https://api.twilio.com"
        } else {
            self.config.api_base.trim_end_matches('/')
        };
        let url = format!(
            "{base}/2010-04-01/Accounts/{}/Messages.json",
            self.config.account_sid
        );
        let mut form: Vec<(&str, &str)> = vec![("To", to), ("Body", body)];
        if !self.config.messaging_service_sid.is_empty() {
            form.push(("MessagingServiceSid", &self.config.messaging_service_sid));
        } else if !self.config.from_number.is_empty() {
            form.push(("From", &self.config.from_number));
        } else {
            form.push(("From", from));
        }
        let resp = self
            .http
            .post(url)
            .basic_auth(
                &self.config.account_sid,
                Some(self.config.auth_token.expose()),
            )
            .form(&form)
            .send()
            .await
            .map_err(|e| SendError::Unavailable(e.to_string()))?;
        let status = resp.status().as_u16();
        let retry_after = egress::retry_after(resp.headers());
        let text = resp.text().await.unwrap_or_default();
        let detail = || format!("Twilio HTTP {status}: {}", egress::clip(&text));
        match status {
            200..=299 => serde_json::from_str::<Created>(&text)
                .map(|c| c.sid)
                .map_err(|e| SendError::Unavailable(format!("unreadable Twilio answer: {e}"))),
            // The request itself is wrong for this recipient (invalid number, unsubscribed...):
            // sending it again cannot help.
            400 | 422 => Err(SendError::Rejected(detail())),
            429 => Err(SendError::Throttled {
                retry_after,
                detail: detail(),
            }),
            // 5xx, and credential or account errors an operator can fix: retry, then
            // dead-letter (replayable once fixed).
            _ => Err(SendError::Unavailable(detail())),
        }
    }
}

impl Egress for TwilioSender {
    fn split(&self, text: &str) -> Vec<String> {
        egress::split_message(text, MAX_BODY_CHARS)
    }

    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
        self.send_body(part.to, part.from, part.text).boxed()
    }
}
