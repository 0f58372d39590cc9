//! WhatsApp through a Twilio WhatsApp sender in the tests: the app's fake Twilio answers for it
//! (the same account as SMS), and messages are posted as Twilio posts a WhatsApp sender's: the
//! SMS form with `whatsapp:` addresses, signed for `/webhooks/twilio/whatsapp`.
use std::time::Duration;

use crate::{SentSms, TestApp, twilio_sms_params, wait_for_sent};

/// Our Twilio WhatsApp sender (Twilio's sandbox number), as a WhatsApp address.
pub const TWILIO_WHATSAPP_FROM: &str = "whatsapp:+14155238886";
/// The route Twilio posts a WhatsApp sender's messages to.
pub const TWILIO_WHATSAPP_ROUTE: &str = "/webhooks/twilio/whatsapp";

impl TestApp {
    /// The form Twilio posts for a WhatsApp message from `from` (E.164) to our sender.
    pub fn twilio_whatsapp_params(
        &self,
        from: &str,
        text: &str,
        sid: &str,
    ) -> Vec<(String, String)> {
        let mut params = twilio_sms_params(&self.config.twilio.account_sid, from, text, sid);
        for (key, value) in &mut params {
            match key.as_str() {
                "From" => *value = format!("whatsapp:{from}"),
                "To" => *value = TWILIO_WHATSAPP_FROM.into(),
                _ => {}
            }
        }
        params.extend([
            ("WaId".to_string(), from.trim_start_matches('+').to_string()),
            ("ProfileName".to_string(), "Ana".to_string()),
        ]);
        params
    }

    /// Post `params` to the WhatsApp sender's webhook, signed as Twilio signs it, with the
    /// auth token `token`.
    pub async fn post_twilio_whatsapp_signed(
        &self,
        params: &[(String, String)],
        token: &str,
    ) -> reqwest::Response {
        self.post_twilio_form(TWILIO_WHATSAPP_ROUTE, params, token)
            .await
    }

    /// Post the form `params` to the gateway's `path` as Twilio does: signed with `token` over
    /// the public URL Twilio was given.
    pub async fn post_twilio_form(
        &self,
        path: &str,
        params: &[(String, String)],
        token: &str,
    ) -> reqwest::Response {
        let url = format!(
            "{}{path}",
            self.config.gateway.public_url.trim_end_matches('/')
        );
        let signature = switchboard_channels::twilio::twilio_signature(token, &url, params);
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        reqwest::Client::new()
            .post(format!("{}{path}", self.gateway_url))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("X-Twilio-Signature", signature)
            .body(body)
            .send()
            .await
            .expect("gateway reachable")
    }

    /// Post `params` to the WhatsApp sender's webhook as Twilio does.
    pub async fn post_twilio_whatsapp(&self, params: &[(String, String)]) -> reqwest::Response {
        let token = self.config.twilio.auth_token.expose().to_string();
        self.post_twilio_whatsapp_signed(params, &token).await
    }

    /// What Twilio sent to WhatsApp addresses, once it has sent at least `n`.
    pub async fn wait_for_twilio_whatsapp(&self, n: usize, timeout: Duration) -> Vec<SentSms> {
        wait_for_sent("Twilio WhatsApp messages", n, timeout, || {
            self.twilio
                .sent()
                .into_iter()
                .filter(|m| m.to.starts_with("whatsapp:"))
                .collect()
        })
        .await
    }
}
