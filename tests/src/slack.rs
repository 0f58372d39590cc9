//! A Slack app in the tests: the fake Web API every app is configured with, Events API
//! requests posted to the gateway as Slack posts them (JSON, signed with the app's signing
//! secret by the fake's own HMAC code), and a deliverer that dies once Slack took a file.
use std::time::{Duration, Instant};

use switchboard_channels::slack::SlackSettings;
use switchboard_channels::{AttachmentStyle, OutboundPart};
use switchboard_deliver::{Claim, DeliveryLedger, PartAttempt};
use switchboard_fakes::slack::{SIGNATURE_HEADER, SlackUploaded, TIMESTAMP_HEADER, sign};
use switchboard_fakes::{FakeSlack, SlackPosted};
use switchboard_kit::config::{Config, Secret};
use switchboard_kit::exports::{ExportLink, ExportLinkKeys};
use switchboard_kit::proto::Reply;

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

    /// Wait until the fake Web API has taken at least `n` files the app uploaded and shared.
    pub async fn wait_for_slack_files(&self, n: usize, timeout: Duration) -> Vec<SlackUploaded> {
        wait_for_sent("Slack file uploads", n, timeout, || {
            self.slack.uploaded_files()
        })
        .await
    }

    /// [`TestApp::deliverer_dies_sending`] for a Slack reply that ends with the agent's files
    /// (each a part of its own after the text's, as the deliver stage makes them): the
    /// deliverer takes the reply with a lease of `lease`, sends and records every part before
    /// the last file's, has Slack take that one (uploaded and shared through the real send
    /// API), and dies before recording it.
    pub async fn slack_deliverer_dies_uploading(&self, reply: &Reply, lease: Duration) {
        let id: uuid::Uuid = reply.id.parse().expect("reply id");
        let senders = switchboard_deliver::senders(&self.app);
        let sender = senders.get(&reply.provider).expect("the reply's provider");
        assert_eq!(
            sender.attachments(),
            AttachmentStyle::PartEach,
            "Slack sends each file as a part of its own"
        );
        let keys = ExportLinkKeys::new(self.db.clone(), &self.config);
        let links = keys.get().await.expect("the export link key");
        let mut parts = sender.split(&reply.text);
        let mut files: Vec<Vec<ExportLink>> = vec![Vec::new(); parts.len()];
        for export in &reply.exports {
            let expires_at =
                chrono::DateTime::from_timestamp_millis(export.expires_at_ms).expect("an expiry");
            let export_id = export.id.parse().expect("an export's id");
            parts.push(String::new());
            files.push(vec![links.link(
                export_id,
                &export.name,
                &export.content_type,
                export.size_bytes,
                expires_at,
            )]);
        }
        let last = parts.len() - 1;
        assert!(!files[last].is_empty(), "the reply ends with a file");
        let ledger = DeliveryLedger::new(self.db.clone(), lease);
        let claim = ledger
            .claim(reply, id, parts.len())
            .await
            .expect("claim the reply");
        assert!(
            matches!(
                claim,
                Claim::Send {
                    parts_sent: 0,
                    attempt: PartAttempt::Started,
                    ..
                }
            ),
            "the dead deliverer must be the first to take the reply"
        );
        for index in 0..=last {
            let part =
                OutboundPart::new(reply, index, &parts[index]).with_attachments(&files[index]);
            let sid = sender.send(part).await.expect("Slack takes the part");
            if index < last {
                ledger
                    .record_part_sent(id, &sid, index, false, Instant::now() + lease)
                    .await
                    .expect("record the part");
            }
        }
    }
}
