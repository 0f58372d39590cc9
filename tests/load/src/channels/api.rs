//! API callers: `POST /api/v1/messages` with the person's own API key and an
//! `Idempotency-Key` that a retry repeats; replies read back with `GET /api/v1/messages/<id>`.
use std::collections::HashMap;

use futures::StreamExt as _;
use serde::Deserialize;
use switchboard_channels::client_message_key;

use super::{Channel, ClientReply, Posted, client_name};
use crate::now_us;

/// API callers, one key per sender.
pub(super) struct ApiClients {
    pub(super) http: reqwest::Client,
    pub(super) base: String,
    pub(super) keys: HashMap<usize, String>,
}

#[derive(Deserialize)]
struct ApiStatus {
    correlation_id: String,
    #[serde(default)]
    replies: Vec<ApiReply>,
    /// What the person was told while the message waited (not answers).
    #[serde(default)]
    notices: Vec<ApiReply>,
}

#[derive(Deserialize)]
struct ApiReply {
    reply_id: String,
    text: String,
}

impl ApiClients {
    pub(super) async fn post(&self, sender: usize, index: u32, agent: &str, text: &str) -> Posted {
        let Some(key) = self.keys.get(&sender) else {
            return Posted::Refused("no API key made for this sender".into());
        };
        let idempotency_key = format!("m{index}");
        let mut body = serde_json::json!({"text": text});
        if !agent.is_empty() {
            body["agent"] = agent.into();
        }
        let resp = self
            .http
            .post(format!("{}/api/v1/messages", self.base))
            .bearer_auth(key)
            .header("Idempotency-Key", &idempotency_key)
            .json(&body)
            .send()
            .await;
        let Ok(resp) = resp else {
            return Posted::Failed;
        };
        let status = resp.status();
        if !status.is_success() {
            let _ = resp.bytes().await;
            return Posted::Refused(status.as_u16().to_string());
        }
        match resp.json::<ApiStatus>().await {
            Ok(answer) => Posted::Accepted {
                provider_id: client_message_key(&client_name(sender), &idempotency_key),
                correlation_id: answer.correlation_id,
            },
            // The message was taken, but its answer was cut off: the retry says the id again.
            Err(_) => Posted::Failed,
        }
    }

    pub(super) async fn replies(&self, messages: &[(usize, String)]) -> Vec<ClientReply> {
        let polls = futures::stream::iter(messages.iter().cloned())
            .map(|(sender, correlation_id)| async move {
                let key = self.keys.get(&sender)?;
                let status: ApiStatus = self
                    .http
                    .get(format!("{}/api/v1/messages/{correlation_id}", self.base))
                    .bearer_auth(key)
                    .send()
                    .await
                    .ok()?
                    .error_for_status()
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let at_us = now_us();
                let reply = |r: ApiReply, notice: bool| ClientReply {
                    channel: Channel::Api,
                    sender,
                    seq: -1,
                    reply_id: r.reply_id,
                    text: r.text.strip_prefix("echo: ").unwrap_or(&r.text).into(),
                    at_us,
                    notice,
                    listed_under: correlation_id.clone(),
                };
                Some(
                    status
                        .replies
                        .into_iter()
                        .map(|r| reply(r, false))
                        .chain(status.notices.into_iter().map(|r| reply(r, true)))
                        .collect::<Vec<_>>(),
                )
            })
            .buffer_unordered(32);
        polls.filter_map(|r| async { r }).concat().await
    }
}
