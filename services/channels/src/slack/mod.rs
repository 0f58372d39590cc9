//! Slack: an app's Events API in (`POST /webhooks/slack/events`, signed with the app's signing
//! secret: `X-Slack-Signature: v0=<hex HMAC-SHA256(secret, "v0:<timestamp>:<body>")>`, the
//! timestamp within five minutes), `chat.postMessage` out and the agent's files uploaded
//! (`files.getUploadURLExternal`, the bytes, `files.completeUploadExternal`), the channel's
//! history asked before a part of unknown outcome is sent again, a person's files fetched from
//! `files.slack.com` with the bot's token.
//!
//! A Slack user is one person, `slack:<team>:<user>`, wherever they write: a direct message
//! with the app, or a thread that mentions it. The conversation's place (the channel, and the
//! thread) is the message's recipient, so a reply goes back to the thread it answers.
//!
//! Settings: `[providers.slack]` ([`SlackSettings`]); the agent is `[channels.slack]`'s.
pub mod media;
pub mod send;
pub mod upload;
pub mod webhook;

use std::sync::Arc;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use switchboard_kit::config::{Config, Secret};

pub use media::SlackMedia;
pub use send::SlackSender;
pub use webhook::{SlackEvent, SlackWebhook, parse_event};

use crate::Adapter;

/// The provider name messages and replies carry.
pub const PROVIDER: &str = "slack";
/// The logical channel (`[channels.slack]`, contact kind `slack`).
pub const CHANNEL: &str = "slack";
pub const SIGNATURE_HEADER: &str = "x-slack-signature";
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";

pub const ADAPTER: Adapter = Adapter {
    provider: PROVIDER,
    webhook: Some(|config| Arc::new(SlackWebhook::new(config))),
    egress: Some(|config| Arc::new(SlackSender::new(settings(config)))),
    media: Some(|config| Arc::new(SlackMedia::new(settings(config)))),
};

/// `[providers.slack]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct SlackSettings {
    /// The app's signing secret (Basic Information): every event is signed with it.
    pub signing_secret: Secret,
    /// The bot token (`xoxb-…`): sends, uploads, reads the history, fetches files.
    pub bot_token: Secret,
    /// How far an event's `X-Slack-Request-Timestamp` may be from our clock (Slack's advice:
    /// five minutes), so that a captured request cannot be replayed later.
    pub timestamp_window_s: u64,
    /// The Web API's base (`https://slack.com`); tests and the demo name a fake.
    pub api_base: String,
    /// Where Slack serves files (`https://files.slack.com`): the only origin a person's file is
    /// fetched from with the bot's token.
    pub files_base: String,
}

impl Default for SlackSettings {
    fn default() -> Self {
        Self {
            signing_secret: Secret::default(),
            bot_token: Secret::default(),
            timestamp_window_s: 300,
            api_base: String::new(),
            files_base: String::new(),
        }
    }
}

/// The settings as read, or why they cannot be (kept by the adapter: it refuses with it).
pub(crate) fn settings(config: &Config) -> Result<SlackSettings, String> {
    config
        .provider_settings::<SlackSettings>(PROVIDER)
        .map_err(|e| e.to_string())
}

impl SlackSettings {
    /// The Web API's base, without a trailing `/`.
    pub fn base(&self) -> &str {
        crate::egress::api_base(&self.api_base, "https://slack.com")
    }

    /// Where files are served, without a trailing `/`.
    pub fn files(&self) -> &str {
        crate::egress::api_base(&self.files_base, "https://files.slack.com")
    }

    pub(crate) fn method_url(&self, method: &str) -> String {
        format!("{}/api/{method}", self.base())
    }
}

/// `v0=<lowercase hex HMAC-SHA256(secret, "v0:<timestamp>:<body>")>`: Slack's request signature.
pub fn sign(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    format!(
        "v0={}",
        hex::encode(mac(secret, timestamp, body).finalize().into_bytes())
    )
}

/// Whether `signature` is Slack's signature of `body` at `timestamp`, in constant time.
pub fn verify(secret: &[u8], timestamp: &str, body: &[u8], signature: &str) -> bool {
    let Some(given) = signature.trim().strip_prefix("v0=") else {
        return false;
    };
    let Ok(given) = hex::decode(given) else {
        return false;
    };
    let expected = mac(secret, timestamp, body).finalize().into_bytes();
    given.len() == expected.len() && bool::from(given.as_slice().ct_eq(expected.as_slice()))
}

fn mac(secret: &[u8], timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    mac
}

/// Slack's text with its three escapes undone (`&amp;`, `&lt;`, `&gt;`): what the person typed.
pub fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Text for Slack: `&`, `<` and `>` escaped, so that an agent's `<` is never read as a link or
/// a mention.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slack's own example (api.slack.com/authentication/verifying-requests-from-slack).
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const TIMESTAMP: &str = "1531420618";
    const BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIGNATURE: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    #[test]
    fn the_signature_is_slacks_documented_v0_hmac() {
        assert_eq!(
            sign(SECRET.as_bytes(), TIMESTAMP, BODY.as_bytes()),
            SIGNATURE
        );
        assert!(verify(
            SECRET.as_bytes(),
            TIMESTAMP,
            BODY.as_bytes(),
            SIGNATURE
        ));
        assert!(!verify(b"other", TIMESTAMP, BODY.as_bytes(), SIGNATURE));
        assert!(!verify(
            SECRET.as_bytes(),
            "1531420619",
            BODY.as_bytes(),
            SIGNATURE
        ));
        for malformed in [
            "",
            "v0=",
            &SIGNATURE[3..],
            "v1=a2",
            &format!("{SIGNATURE}00"),
        ] {
            assert!(!verify(
                SECRET.as_bytes(),
                TIMESTAMP,
                BODY.as_bytes(),
                malformed
            ));
        }
    }

    #[test]
    fn the_example_configuration_names_only_slack_settings() {
        let read: SlackSettings = crate::example_settings("slack");
        assert!(!read.signing_secret.is_empty() && !read.bot_token.is_empty());
    }

    #[test]
    fn slacks_three_escapes_go_both_ways() {
        assert_eq!(unescape("a &lt;b&gt; &amp;lt; c"), "a <b> &lt; c");
        assert_eq!(escape("a <b> & c"), "a &lt;b&gt; &amp; c");
        assert_eq!(unescape(&escape("<@U1> & &amp;")), "<@U1> & &amp;");
    }
}
