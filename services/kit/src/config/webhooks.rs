//! `[webhooks.<source>]`: the sources of signed generic webhooks.
use serde::{Deserialize, Serialize};

use super::Secret;

/// One source of signed generic webhooks (`[webhooks.<source>]`): it posts JSON to
/// `/webhooks/generic/<source>` signed with `secret`, and gets replies at `callback_url`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct WebhookSourceConfig {
    /// HMAC-SHA256 key of both directions. Empty: the source is refused (`unknown_source`).
    #[serde(default)]
    pub secret: Secret,
    /// Dotted path of the sender's id in the body (`user.id`). Required: there is no sensible
    /// default for who a message is from.
    pub sender_field: String,
    /// Dotted path of the message text.
    #[serde(default = "default_text_field")]
    pub text_field: String,
    /// Dotted path of the event id: a resend carries the same one and is the same turn.
    #[serde(default = "default_id_field")]
    pub id_field: String,
    /// The agent this source's messages go to; empty: `channels.webhook.default_agent`.
    #[serde(default)]
    pub agent: String,
    /// Where replies are POSTed; empty: replies are refused (the source only talks to us).
    #[serde(default)]
    pub callback_url: String,
    /// How far a request's timestamp may be from our clock, either way (replay protection).
    #[serde(default = "default_timestamp_window_s")]
    pub timestamp_window_s: u64,
}

fn default_text_field() -> String {
    "text".into()
}
fn default_id_field() -> String {
    "id".into()
}
fn default_timestamp_window_s() -> u64 {
    300
}

impl WebhookSourceConfig {
    /// The HMAC key of both directions; `None` for a source without a secret, which can neither
    /// be verified nor sign, so it is refused everywhere (and at load).
    pub fn signing_key(&self) -> Option<&[u8]> {
        Some(self.secret.expose().as_bytes()).filter(|k| !k.is_empty())
    }
}

impl Default for WebhookSourceConfig {
    fn default() -> Self {
        Self {
            secret: Secret::default(),
            sender_field: String::new(),
            text_field: default_text_field(),
            id_field: default_id_field(),
            agent: String::new(),
            callback_url: String::new(),
            timestamp_window_s: default_timestamp_window_s(),
        }
    }
}

/// A webhook source's name: it is a URL path segment and part of sender addresses
/// (`<source>:<sender>`), so letters, digits, `-` and `_` only.
pub fn valid_source_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
