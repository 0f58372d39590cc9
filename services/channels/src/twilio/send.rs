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
        let base = egress::api_base(&self.config.api_base, "https://api.twilio.com");
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
        let request = self
            .http
            .post(url)
            .basic_auth(
                &self.config.account_sid,
                Some(self.config.auth_token.expose()),
            )
            .form(&form);
        // 400 and 422: the request is wrong for this recipient (invalid number, unsubscribed).
        let created: Created = egress::send_request(request, "Twilio", &[400, 422]).await?;
        Ok(created.sid)
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
