//! `switchboard telegram set-webhook`: tell Telegram where the bot's updates go (this
//! gateway's `/webhooks/telegram`) and the secret token they carry. `switchboard send
//! --channel telegram` posts an update as Telegram would ([`send_update`]).
use anyhow::{Context as _, bail};
use clap::Subcommand;
use serde_json::json;
use switchboard_channels::telegram::{PROVIDER, SECRET_HEADER, TelegramSettings};
use switchboard_kit::Config;

use crate::demo_outbox::DemoOutbox;

#[derive(Subcommand)]
pub enum TelegramCommand {
    /// Point the bot's webhook at this gateway (`setWebhook` with `[providers.telegram]`'s
    /// secret token; only messages are asked for).
    SetWebhook {
        /// Where Telegram posts (default: `gateway.public_url` + `/webhooks/telegram`).
        #[arg(long)]
        url: Option<String>,
    },
}

fn settings(config: &Config) -> anyhow::Result<TelegramSettings> {
    let settings: TelegramSettings = config
        .provider_settings(PROVIDER)
        .context("reading [providers.telegram]")?;
    if settings.bot_id().is_none() {
        bail!("[providers.telegram] bot_token is not set (the token @BotFather gave the bot)");
    }
    if settings.secret_token.is_empty() {
        bail!("[providers.telegram] secret_token is not set: updates could not be authenticated");
    }
    Ok(settings)
}

pub async fn run(config: Config, command: TelegramCommand) -> anyhow::Result<()> {
    let TelegramCommand::SetWebhook { url } = command;
    let settings = settings(&config)?;
    let url = url.unwrap_or_else(|| {
        format!(
            "{}/webhooks/telegram",
            config.gateway.public_url.trim_end_matches('/')
        )
    });
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/bot{}/setWebhook",
            settings.base(),
            settings.bot_token.expose()
        ))
        .json(&json!({
            "url": url,
            "secret_token": settings.secret_token.expose(),
            "allowed_updates": ["message"],
        }))
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("calling setWebhook: {}", e.without_url()))?;
    let status = resp.status();
    let answer: serde_json::Value = resp.json().await.unwrap_or_default();
    if !status.is_success() || answer["ok"] != true {
        bail!(
            "Telegram answered {status}: {}",
            answer["description"].as_str().unwrap_or("(no description)")
        );
    }
    println!(
        "webhook set to {url}: {}",
        answer["description"].as_str().unwrap_or("ok")
    );
    Ok(())
}

/// Post a private message from Telegram user `from` to the gateway as Telegram would, and wait
/// up to `wait` seconds for the replies in the demo outbox.
pub async fn send_update(
    config: &Config,
    from: &str,
    text: &str,
    wait: u64,
) -> anyhow::Result<(String, Vec<String>)> {
    let user: i64 = from
        .parse()
        .ok()
        .filter(|id| *id > 0)
        .with_context(|| format!("--from {from:?} is not a Telegram user id (digits)"))?;
    let settings = settings(config)?;
    let base = config.gateway.public_url.trim_end_matches('/');
    let http = reqwest::Client::new();
    let chat = user.to_string();
    let outbox = DemoOutbox::of(config, &chat, Some(PROVIDER));
    let before = outbox.list().await.map(|l| l.len());
    let id =
        i64::try_from(uuid::Uuid::new_v4().as_u128() % 1_000_000_000).expect("under a billion");
    let update = switchboard_fakes::telegram::text_update(id, user, user, "private", text);
    let url = format!("{base}/webhooks/telegram");
    let resp = http
        .post(&url)
        .header(SECRET_HEADER, settings.secret_token.expose())
        .json(&update)
        .send()
        .await
        .with_context(|| format!("posting to {url} (is `make run` running?)"))?;
    let status = resp.status();
    if !status.is_success() {
        bail!(
            "the gateway answered {status}: {}",
            resp.text().await.unwrap_or_default()
        );
    }
    let from = format!("telegram:{user}");
    let Some(before) = before.filter(|_| wait > 0) else {
        bail!("no demo outbox to read the reply from: it went out through Telegram");
    };
    let replies = outbox.wait_past(before, wait).await?;
    Ok((from, replies.into_iter().map(|m| m.body).collect()))
}
