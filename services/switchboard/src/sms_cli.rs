//! `switchboard sms send`: post an SMS webhook to the gateway exactly as the provider would
//! (Twilio: a signed form; TextMagic: JSON to the token URL), then wait for the reply in the
//! demo outbox. [`send_sms`] is also `switchboard send --channel sms|textmagic`.
use anyhow::{Context as _, bail};
use clap::Subcommand;
use serde::Serialize;
use switchboard_kit::Config;

use crate::demo_outbox::DemoOutbox;

#[derive(Subcommand)]
pub enum SmsCommand {
    /// Post an SMS webhook to the gateway as the provider would (Twilio: signed form;
    /// TextMagic: JSON to the token URL), then wait for the reply in the demo outbox.
    Send {
        /// The sender's phone number.
        #[arg(long, default_value = "+15555550100")]
        from: String,
        #[arg(long)]
        text: String,
        /// Our number (defaults to the provider's from_number).
        #[arg(long)]
        to: Option<String>,
        /// Which provider the SMS comes through.
        #[arg(long, value_enum, default_value_t = SmsProvider::Twilio)]
        via: SmsProvider,
        /// Seconds to wait for the reply (0: don't wait).
        #[arg(long, default_value_t = 30)]
        wait: u64,
        /// `{"id", "from", "replies"}` (`replies`: null without a demo outbox).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SmsProvider {
    Twilio,
    Textmagic,
}

/// An SMS as sent, and what came back.
#[derive(Debug, Serialize)]
pub struct SmsSent {
    /// The provider's message id the webhook carried.
    pub id: String,
    /// The sender, normalised (E.164).
    pub from: String,
    /// The replies the demo outbox took for the sender; `None` when there is no demo outbox
    /// (the replies went out through the real provider) or nobody waited.
    pub replies: Option<Vec<OutboxSms>>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct OutboxSms {
    #[serde(default)]
    pub to: String,
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub body: String,
}

pub async fn run(config: Config, command: SmsCommand) -> anyhow::Result<()> {
    let SmsCommand::Send {
        from,
        text,
        to,
        wait,
        via,
        json,
    } = command;
    let sent = send_sms(&config, via, &from, &text, to, wait).await?;
    if json {
        println!("{}", serde_json::to_string(&sent)?);
        return Ok(());
    }
    println!(
        "sent {} from {}: gateway answered 200 OK",
        sent.id, sent.from
    );
    match &sent.replies {
        Some(replies) => {
            for m in replies {
                println!("reply to {} by {}: {}", m.to, m.provider, m.body);
            }
        }
        None if wait > 0 => {
            println!("(no demo outbox; the reply goes out through the provider)");
        }
        None => {}
    }
    Ok(())
}

/// Post the webhook; wait up to `wait` seconds for the reply in the demo outbox (0: don't).
pub async fn send_sms(
    config: &Config,
    via: SmsProvider,
    from: &str,
    text: &str,
    to: Option<String>,
    wait: u64,
) -> anyhow::Result<SmsSent> {
    let from = switchboard_kit::address::normalize_phone(from, &config.identity.default_region)?;
    let base = config.gateway.public_url.trim_end_matches('/').to_string();
    let http = reqwest::Client::new();
    let outbox = DemoOutbox::of(config, &from, None);
    let before = outbox.list().await.map(|l| l.len());
    let (id, url, request) = match via {
        SmsProvider::Twilio => {
            let to = to.unwrap_or_else(|| config.twilio.from_number.clone());
            let url = format!("{base}/webhooks/twilio/sms");
            let sid = format!("SM{}", uuid::Uuid::new_v4().simple());
            let params: Vec<(String, String)> = vec![
                ("AccountSid".into(), config.twilio.account_sid.clone()),
                ("ApiVersion".into(), "2010-04-01".into()),
                ("Body".into(), text.to_string()),
                ("From".into(), from.clone()),
                ("MessageSid".into(), sid.clone()),
                ("NumMedia".into(), "0".into()),
                ("SmsSid".into(), sid.clone()),
                ("To".into(), to),
            ];
            let signature = switchboard_channels::twilio::twilio_signature(
                config.twilio.auth_token.expose(),
                &url,
                &params,
            );
            let request = http
                .post(&url)
                .header("X-Twilio-Signature", signature)
                .form(&params);
            (sid, url, request)
        }
        SmsProvider::Textmagic => {
            // TextMagic writes numbers as digits, without `+`, and signs nothing: the token in
            // the URL is the credential.
            use switchboard_channels::textmagic::textmagic_number;
            let to = to.unwrap_or_else(|| config.textmagic.from_number.clone());
            let url = format!(
                "{base}/webhooks/textmagic/sms/{}",
                config.textmagic.webhook_token.expose()
            );
            let id = (uuid::Uuid::new_v4().as_u128() % 1_000_000_000_000).to_string();
            let callback = serde_json::json!({
                "id": id,
                "sender": textmagic_number(&from),
                "receiver": textmagic_number(&to),
                "messageTime": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%z").to_string(),
                "text": text,
            });
            (id, url.clone(), http.post(&url).json(&callback))
        }
    };
    let resp = request
        .send()
        .await
        .with_context(|| format!("posting to {url} (is `make run` running?)"))?;
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    if !status.is_success() {
        bail!("gateway answered {status}: {body}");
    }
    let (Some(before), true) = (before, wait > 0) else {
        return Ok(SmsSent {
            id,
            from,
            replies: None,
        });
    };
    let replies = outbox.wait_past(before, wait).await?;
    Ok(SmsSent {
        id,
        from,
        replies: Some(replies),
    })
}
