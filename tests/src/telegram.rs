//! A Telegram bot in the tests: the fake Bot API every app is configured with, and updates
//! posted to the gateway as Telegram posts them (JSON, the webhook's secret token in its
//! header).
use std::time::Duration;

use switchboard_channels::telegram::{SECRET_HEADER, TelegramSettings};
use switchboard_fakes::{FakeTelegram, TelegramSent};
use switchboard_kit::config::{Config, Secret};

use crate::{TestApp, wait_for_sent};

/// The test bot's token; its id is the digits before the `:`.
pub const TELEGRAM_BOT_TOKEN: &str = "7000000001:AAHtest-bot_token";
pub const TELEGRAM_BOT_ID: &str = "7000000001";
/// The `secret_token` the tests' webhook was set with.
pub const TELEGRAM_SECRET: &str = "tg-secret-3b9c";

/// `[providers.telegram]` naming the fake.
pub(crate) fn configure(config: &mut Config, fake: &FakeTelegram) {
    let settings = TelegramSettings {
        bot_token: Secret::new(TELEGRAM_BOT_TOKEN),
        secret_token: Secret::new(TELEGRAM_SECRET),
        group_chats: Vec::new(),
        api_base: fake.url.clone(),
    };
    config
        .set_provider_settings("telegram", &settings)
        .expect("Telegram's settings are a table");
}

impl TestApp {
    /// Post `update` to the bot's webhook as Telegram does, with `secret` as its secret token.
    pub async fn post_telegram(
        &self,
        update: &serde_json::Value,
        secret: &str,
    ) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{}/webhooks/telegram", self.gateway_url))
            .header(SECRET_HEADER, secret)
            .json(update)
            .send()
            .await
            .expect("gateway reachable")
    }

    /// A private message `text` from Telegram user `user` (its chat's id is the user's), as
    /// update `update_id`.
    pub async fn telegram_says(&self, user: i64, text: &str, update_id: i64) -> reqwest::Response {
        let update =
            switchboard_fakes::telegram::text_update(update_id, user, user, "private", text);
        self.post_telegram(&update, TELEGRAM_SECRET).await
    }

    /// Wait until the fake Bot API has taken at least `n` messages from the bot.
    pub async fn wait_for_telegram(&self, n: usize, timeout: Duration) -> Vec<TelegramSent> {
        wait_for_sent("Telegram messages", n, timeout, || self.telegram.sent()).await
    }
}
