//! WhatsApp in the tests: the fake Cloud API every app is configured with, and notifications
//! posted to the gateway as Meta posts them (JSON signed with the app secret by the fakes' own
//! HMAC).
use std::time::Duration;

use switchboard_channels::whatsapp::WhatsAppSettings;
use switchboard_fakes::whatsapp::{SIGNATURE_HEADER, sign};
use switchboard_fakes::{FakeWhatsApp, WhatsAppSent};
use switchboard_kit::config::{Config, Secret};

use crate::{TestApp, wait_for_sent};

pub const WHATSAPP_TOKEN: &str = "EAAGtest-whatsapp-token";
pub const WHATSAPP_APP_SECRET: &str = "wa-app-secret-7c1d";
pub const WHATSAPP_VERIFY_TOKEN: &str = "wa-verify-2b8e";
pub const WHATSAPP_NUMBER_ID: &str = "106540352242922";

pub(crate) fn configure(config: &mut Config, fake: &FakeWhatsApp) {
    let settings = WhatsAppSettings {
        access_token: Secret::new(WHATSAPP_TOKEN),
        app_secret: Secret::new(WHATSAPP_APP_SECRET),
        verify_token: Secret::new(WHATSAPP_VERIFY_TOKEN),
        phone_number_id: WHATSAPP_NUMBER_ID.into(),
        api_base: fake.url.clone(),
        ..Default::default()
    };
    config
        .set_provider_settings("whatsapp", &settings)
        .expect("WhatsApp's settings are a table");
}

impl TestApp {
    /// Post a notification to the webhook as Meta does, signed with `secret`.
    pub async fn post_whatsapp_signed(
        &self,
        body: &serde_json::Value,
        secret: &str,
    ) -> reqwest::Response {
        let body = body.to_string();
        reqwest::Client::new()
            .post(format!("{}/webhooks/whatsapp", self.gateway_url))
            .header("content-type", "application/json")
            .header(SIGNATURE_HEADER, sign(secret, body.as_bytes()))
            .body(body)
            .send()
            .await
            .expect("gateway reachable")
    }

    /// Post a notification as Meta does, signed with the app secret.
    pub async fn post_whatsapp(&self, body: &serde_json::Value) -> reqwest::Response {
        self.post_whatsapp_signed(body, WHATSAPP_APP_SECRET).await
    }

    /// Wait until the fake Cloud API has taken at least `n` messages.
    pub async fn wait_for_whatsapp(&self, n: usize, timeout: Duration) -> Vec<WhatsAppSent> {
        wait_for_sent("WhatsApp messages", n, timeout, || self.whatsapp.sent()).await
    }
}
