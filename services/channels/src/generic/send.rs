//! Replies to a generic webhook source: `POST <callback_url>` with a JSON body, signed like the
//! inbound events (same headers, same secret), plus `X-Switchboard-Delivery: <reply id>:<part>`.
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::Serialize;
use switchboard_kit::config::WebhookSourceConfig;

use super::{DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use crate::egress::{self, AttachmentStyle, Egress, OutboundPart, SendError};
use crate::ingress;

/// What a callback receiver gets.
#[derive(Debug, Serialize)]
pub struct Callback<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub reply_id: &'a str,
    pub part: usize,
    /// The sender the reply is for, as the source named them in its event.
    pub to: &'a str,
    /// The event id this answers, as the source sent it.
    pub in_reply_to: &'a str,
    pub correlation_id: &'a str,
    pub agent: &'a str,
    pub text: &'a str,
    /// The files the agent left for the person (name, type, size, a signed expiring link).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub attachments: &'a [switchboard_kit::exports::ExportLink],
}

/// The egress of the `generic` provider: one signed POST per reply.
pub struct GenericWebhookSender {
    http: reqwest::Client,
    sources: BTreeMap<String, WebhookSourceConfig>,
}

impl GenericWebhookSender {
    pub fn new(sources: BTreeMap<String, WebhookSourceConfig>) -> Self {
        Self {
            http: crate::http_client(),
            sources,
        }
    }

    /// POST one part to its source's callback URL; the delivery id on a 2xx.
    async fn post(&self, part: OutboundPart<'_>) -> Result<String, SendError> {
        // The inbound recipient, which is where a reply comes from, is the source's name.
        let name = part.from();
        let source = self.sources.get(name).ok_or_else(|| {
            SendError::Rejected(format!("no webhook source {name:?} is configured"))
        })?;
        if source.callback_url.is_empty() {
            return Err(SendError::Rejected("no callback_url".into()));
        }
        let Some(key) = source.signing_key() else {
            return Err(SendError::Rejected("no secret to sign the callback".into()));
        };
        let reply = part.reply;
        let delivery = format!("{}:{}", reply.id, part.index);
        let callback = Callback {
            kind: "reply",
            reply_id: &reply.id,
            part: part.index,
            to: super::webhook::sender_in(name, part.to()),
            in_reply_to: ingress::client_id(part.to(), &reply.provider_message_id),
            correlation_id: &reply.correlation_id,
            agent: &reply.agent_name,
            text: part.text,
            attachments: part.attachments,
        };
        let body = serde_json::to_vec(&callback)
            .map_err(|e| SendError::Unavailable(format!("callback as JSON: {e}")))?;
        // Signed at each attempt: a retry an hour later must still be inside the window.
        let timestamp = Utc::now().timestamp().to_string();
        let signature = super::sign(key, &timestamp, &body);
        let request = self
            .http
            .post(&source.callback_url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(TIMESTAMP_HEADER, &timestamp)
            .header(SIGNATURE_HEADER, signature)
            .header(DELIVERY_HEADER, &delivery)
            .body(body);
        // 400, 404, 410, 422: the receiver says this reply is wrong or its addressee gone.
        egress::send_for_status(request, &format!("{name} callback"), &[400, 404, 410, 422])
            .await?;
        Ok(delivery)
    }
}

impl Egress for GenericWebhookSender {
    /// One part: a callback body has no length limit of its own.
    fn split(&self, text: &str) -> Vec<String> {
        egress::whole_message(text)
    }

    /// The callback body lists them.
    fn attachments(&self) -> AttachmentStyle {
        AttachmentStyle::Listed
    }

    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>> {
        self.post(part).boxed()
    }

    /// A callback receiver keeps no log we can read, but every attempt of a part carries the
    /// same `X-Switchboard-Delivery`, which the contract asks receivers to dedupe by. So a part
    /// of unknown outcome is "not found": send it again, and the receiver drops the double.
    fn find_sent<'a>(
        &'a self,
        part: OutboundPart<'a>,
        since: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<String>, SendError>> {
        let _ = (part, since);
        Box::pin(async { Ok(Vec::new()) })
    }
}
