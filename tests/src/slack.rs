//! A Slack app in the tests: the fake Web API every app is configured with, and Events API
//! requests posted to the gateway as Slack posts them (JSON, signed with the app's signing
//! secret by the fake's own HMAC code).
use std::time::Duration;

use switchboard_channels::slack::SlackSettings;
use switchboard_fakes::slack::{SIGNATURE_HEADER, TIMESTAMP_HEADER, sign};
use switchboard_fakes::{FakeSlack, SlackPosted};
use switchboard_kit::config::{Config, Secret};

use crate::{TestApp, wait_for_sent};

pub const SLACK_BOT_TOKEN: &str = "xoxb-test-0001-bot-token";
pub const SLACK_SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
pub const SLACK_TEAM: &str = "T0TEST001";

/// `[providers.slack]` naming the fake (its Web API and its files).
pub(crate) fn configure(config: &mut Config, fake: &FakeSlack) {
    let settings = SlackSettings {
        signing_secret: Secret::new(SLACK_SIGNING_SECRET),
        bot_token: Secret::new(SLACK_BOT_TOKEN),
        api_base: fake.url.clone(),
        files_base: fake.url.clone(),
        ..Default::default()
    };
    config
        .set_provider_settings("slack", &settings)
        .expect("Slack's settings are a table");
}

impl TestApp {
    /// Post `body` to the Events API URL as Slack does, signed with `secret` at `timestamp`;
    /// `retry` adds Slack's retry headers.
    pub async fn post_slack_signed(
        &self,
        body: &serde_json::Value,
        secret: &str,
        timestamp: i64,
        retry: Option<u32>,
    ) -> reqwest::Response {
        let body = body.to_string();
        let mut request = reqwest::Client::new()
            .post(format!("{}/webhooks/slack/events", self.gateway_url))
            .header("content-type", "application/json")
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(SIGNATURE_HEADER, sign(secret, timestamp, body.as_bytes()));
        if let Some(n) = retry {
            request = request
                .header("x-slack-retry-num", n.to_string())
                .header("x-slack-retry-reason", "http_timeout");
        }
        request.body(body).send().await.expect("gateway reachable")
    }

    /// Post `body` as Slack does now, signed with the app's secret.
    pub async fn post_slack(&self, body: &serde_json::Value) -> reqwest::Response {
        self.post_slack_signed(
            body,
            SLACK_SIGNING_SECRET,
            chrono::Utc::now().timestamp(),
            None,
        )
        .await
    }

    /// Wait until the fake Web API has taken at least `n` messages from the app.
    pub async fn wait_for_slack(&self, n: usize, timeout: Duration) -> Vec<SlackPosted> {
        wait_for_sent("Slack messages", n, timeout, || self.slack.posted()).await
    }
}
