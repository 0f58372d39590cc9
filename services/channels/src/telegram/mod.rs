//! Telegram bots: the Bot API's webhook in (`POST /webhooks/telegram`, authenticated by the
//! `secret_token` given to `setWebhook`, which Telegram sends in every update's
//! `X-Telegram-Bot-Api-Secret-Token`), `sendMessage` and `sendDocument` out, files by id
//! through `getFile`.
//!
//! Settings: `[providers.telegram]` ([`TelegramSettings`]). The agent a bot's conversations go
//! to is the channel's as for every channel: `[channels.telegram] default_agent`, or per bot
//! `[channels.telegram.recipients] "<bot id>" = "<agent>"`.
pub mod media;
pub mod send;
pub mod webhook;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use switchboard_kit::config::{Config, Secret};

pub use media::TelegramMedia;
pub use send::TelegramSender;
pub use webhook::{TelegramMessage, TelegramWebhook, parse_update};

use crate::Adapter;

/// The provider name messages and replies carry.
pub const PROVIDER: &str = "telegram";
/// The logical channel (`[channels.telegram]`, contact kind `telegram`).
pub const CHANNEL: &str = "telegram";
/// The header Telegram sends the webhook's secret token in.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";
/// How a message names a file it carries (`telegram-file:<file_id>`): Telegram gives files by
/// id, and the URL to fetch one holds the bot's token, which must never be stored with a
/// message. [`TelegramMedia`] turns it into a download when the turn runs.
pub const FILE_SCHEME: &str = "telegram-file:";

pub const ADAPTER: Adapter = Adapter {
    provider: PROVIDER,
    webhook: Some(|config| Arc::new(TelegramWebhook::new(config))),
    egress: Some(|config| Arc::new(TelegramSender::new(settings(config)))),
    media: Some(|config| Arc::new(TelegramMedia::new(settings(config)))),
};

/// `[providers.telegram]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct TelegramSettings {
    /// The bot's token from @BotFather (`123456789:AA…`): its digits before `:` are the bot's
    /// id, which scopes message ids and names the recipient.
    pub bot_token: Secret,
    /// The `secret_token` given to `setWebhook` (1 to 256 of `A-Z a-z 0-9 _ -`): an update
    /// without it is refused.
    pub secret_token: Secret,
    /// Group chats (their ids, negative numbers) that are conversations of their own, answered
    /// in the group. A message in any other group is acknowledged and ignored (counted as
    /// `group_not_configured`): a bot added to a group does not start answering it unasked.
    pub group_chats: Vec<i64>,
    /// The Bot API's base (`https://api.telegram.org`); tests and the demo name a fake.
    pub api_base: String,
}

/// The settings as read, or why they cannot be (kept by the adapter: it refuses with it).
pub(crate) fn settings(config: &Config) -> Result<TelegramSettings, String> {
    config
        .provider_settings::<TelegramSettings>(PROVIDER)
        .map_err(|e| e.to_string())
}

impl TelegramSettings {
    /// The bot's id: the digits of its token before the `:`.
    pub fn bot_id(&self) -> Option<&str> {
        let (id, rest) = self.bot_token.expose().split_once(':')?;
        (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && !rest.is_empty()).then_some(id)
    }

    /// The Bot API's base, without a trailing `/`.
    pub fn base(&self) -> &str {
        crate::egress::api_base(&self.api_base, "https://api.telegram.org")
    }

    /// `{base}/bot<token>/<method>`.
    pub(crate) fn method_url(&self, method: &str) -> String {
        format!("{}/bot{}/{method}", self.base(), self.bot_token.expose())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_configuration_names_only_telegram_settings() {
        let read: TelegramSettings = crate::example_settings("telegram");
        assert!(read.bot_id().is_some() && !read.secret_token.is_empty());
    }

    #[test]
    fn the_bot_id_is_the_tokens_digits_before_the_colon() {
        let with = |token: &str| TelegramSettings {
            bot_token: Secret::new(token),
            ..Default::default()
        };
        assert_eq!(with("123456789:AAH-x_y").bot_id(), Some("123456789"));
        for bad in ["", "123456789", ":AAH", "12a:AAH", "123:"] {
            assert_eq!(with(bad).bot_id(), None, "{bad}");
        }
    }
}
