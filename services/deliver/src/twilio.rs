//! Twilio's Messages API: `POST {base}/2010-04-01/Accounts/{AccountSid}/Messages.json`.
use std::time::Duration;

use serde::Deserialize;
use switchboard_kit::config::TwilioConfig;

use crate::SendError;

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
        let http = reqwest::Client::builder()
            .user_agent(user_agent())
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .expect("HTTP client");
        Self { http, config }
    }

    /// Send one body (≤ 1,600 characters). Returns Twilio's message sid.
    pub async fn send(&self, to: &str, from: &str, body: &str) -> Result<String, SendError> {
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
        let text = resp.text().await.unwrap_or_default();
        match status {
            200..=299 => serde_json::from_str::<Created>(&text)
                .map(|c| c.sid)
                .map_err(|e| SendError::Unavailable(format!("unreadable Twilio answer: {e}"))),
            // The request itself is wrong for this recipient (invalid number, unsubscribed...):
            // sending it again cannot help.
            400 | 422 => Err(SendError::Rejected(format!(
                "Twilio HTTP {status}: {}",
                clip(&text)
            ))),
            // 429, 5xx, and credential or account errors an operator can fix: retry, then
            // dead-letter (replayable once fixed).
            _ => Err(SendError::Unavailable(format!(
                "Twilio HTTP {status}: {}",
                clip(&text)
            ))),
        }
    }
}

/// `switchboard-deliver/<version> (<host>:<pid>)`: which replica sent a message, as the
/// provider's request log (or a test's fake) sees it.
pub fn user_agent() -> String {
    format!(
        "switchboard-deliver/{} ({})",
        env!("CARGO_PKG_VERSION"),
        switchboard_kit::instance_id()
    )
}

fn clip(s: &str) -> String {
    s.chars().take(300).collect()
}
