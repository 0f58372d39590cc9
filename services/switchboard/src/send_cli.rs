//! `switchboard send`: one message in through any channel, exactly as that channel's client
//! would send it (a signed Twilio webhook, TextMagic's callback, the chat socket with a JWT,
//! the REST API with a key, a Telegram update with the webhook's secret token), and the reply printed: for trying the product end to end.
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use serde_json::json;
use switchboard_kit::Config;

use crate::sms_cli::{SmsProvider, send_sms};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Channel {
    /// A Twilio SMS webhook, signed with the configured auth token.
    Sms,
    /// A TextMagic SMS callback to the token URL.
    Textmagic,
    /// The chat socket (`/ws/chat`), with a token signed by `chat.jwt_secret`.
    Chat,
    /// `POST /api/v1/messages` with an API key, waiting for the answer.
    Api,
    /// A Telegram bot's update (a private message), with the webhook's secret token.
    Telegram,
    /// A Slack direct message to the app, signed with its signing secret.
    Slack,
    /// A WhatsApp message to the business number, signed with the app secret as Meta signs it.
    Whatsapp,
}

#[derive(Args)]
pub struct SendArgs {
    /// What the person says.
    pub text: String,
    #[arg(long, value_enum, default_value_t = Channel::Sms)]
    pub channel: Channel,
    /// Who sends it: a phone number (sms, textmagic), a chat user (chat), a Telegram user id
    /// (telegram), a Slack user id (slack, `U…`), a phone number (whatsapp); for the API the
    /// sender is the key's owner.
    #[arg(long, default_value = "+15555550100")]
    pub from: String,
    /// The agent to talk to (chat, API; SMS goes by the number written to).
    #[arg(long, default_value = "")]
    pub agent: String,
    /// An API key (channel api; default: $SB_API_KEY).
    #[arg(long, env = "SB_API_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// Seconds to wait for the reply.
    #[arg(long, default_value_t = 30)]
    pub wait: u64,
    /// `{"channel", "from", "replies": [...]}`.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(config: Config, args: SendArgs) -> anyhow::Result<()> {
    let (from, replies): (String, Vec<String>) = match args.channel {
        Channel::Sms | Channel::Textmagic => {
            let via = if args.channel == Channel::Sms {
                SmsProvider::Twilio
            } else {
                SmsProvider::Textmagic
            };
            let sent = send_sms(&config, via, &args.from, &args.text, None, args.wait).await?;
            let replies = sent
                .replies
                .context("no demo outbox to read the reply from: it went out through the provider")?
                .into_iter()
                .map(|m| m.body)
                .collect();
            (sent.from, replies)
        }
        Channel::Chat => {
            let sub = args.from.clone();
            let token = switchboard::chat::token(&config, &sub, "", "", 600)?;
            let reply = switchboard::chat::send(
                &config,
                &token,
                "admin_chat",
                &args.agent,
                &args.text,
                &[],
                Duration::from_secs(args.wait),
            )
            .await?;
            (format!("user:{sub}"), vec![reply.text])
        }
        Channel::Telegram => {
            crate::telegram_cli::send_update(&config, &args.from, &args.text, args.wait).await?
        }
        Channel::Slack => {
            crate::slack_cli::send_dm(&config, &args.from, &args.text, args.wait).await?
        }
        Channel::Whatsapp => {
            crate::whatsapp_cli::send_text(&config, &args.from, &args.text, args.wait).await?
        }
        Channel::Api => {
            let Some(key) = args.key else {
                bail!(
                    "the api channel needs a key: --key, or SB_API_KEY \
                     (make one with `switchboard api-keys create --owner <who>`)"
                );
            };
            // The sender is the key's owner (`api:<owner>`), which the key does not show.
            let replies = api_send(&config, &key, &args.agent, &args.text, args.wait).await?;
            ("api".to_string(), replies)
        }
    };
    if args.json {
        let channel = args
            .channel
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        println!(
            "{}",
            json!({ "channel": channel, "from": from, "replies": replies })
        );
    } else {
        for reply in &replies {
            println!("reply to {from}: {reply}");
        }
    }
    Ok(())
}

/// `POST /api/v1/messages` with `"wait": true`: the replies.
async fn api_send(
    config: &Config,
    key: &str,
    agent: &str,
    text: &str,
    wait: u64,
) -> anyhow::Result<Vec<String>> {
    let base = config.gateway.public_url.trim_end_matches('/');
    let mut body = json!({ "text": text, "wait": true });
    if !agent.is_empty() {
        body["agent"] = agent.into();
    }
    let url = format!("{base}/api/v1/messages");
    let resp = reqwest::Client::new()
        .post(&url)
        .bearer_auth(key)
        .timeout(Duration::from_secs(wait.max(1) + 5))
        .json(&body)
        .send()
        .await
        .with_context(|| format!("posting to {url} (is `make run` running?)"))?;
    let status = resp.status();
    let answer: serde_json::Value = resp.json().await.unwrap_or_default();
    if !status.is_success() {
        bail!("the gateway answered {status}: {answer}");
    }
    if answer["status"] != "answered" {
        bail!(
            "not answered within the API's wait (status {}); the Location header of \
             POST /api/v1/messages tells where to ask later",
            answer["status"]
        );
    }
    let replies = answer["replies"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|r| r["text"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    Ok(replies)
}
