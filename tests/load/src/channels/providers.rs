//! The providers' fakes a mixed run starts beside Twilio's, and what the run adds to its
//! configuration for them: TextMagic, Telegram, Slack and WhatsApp pointed at their fakes,
//! chat tokens, and the collect and front-desk agents.
use switchboard_channels::slack::SlackSettings;
use switchboard_channels::telegram::TelegramSettings;
use switchboard_channels::whatsapp::WhatsAppSettings;
use switchboard_e2e::{
    SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET, SLACK_TEAM, TELEGRAM_BOT_TOKEN, TELEGRAM_SECRET,
    WHATSAPP_APP_SECRET, WHATSAPP_NUMBER_ID, WHATSAPP_TOKEN, WHATSAPP_VERIFY_TOKEN,
};
use switchboard_kit::config::{Config, Secret};

use super::TEXTMAGIC_TOKEN;
use super::{CHAT_SECRET, TEXTMAGIC_COLLECT_NUMBER, TEXTMAGIC_NUMBER, TEXTMAGIC_SHARED_NUMBER};
use crate::observers::{LoadSlack, LoadTelegram, LoadTextMagic, LoadWhatsApp, SendRecord};
use crate::pipeline;

/// The providers' fakes a mixed run adds to Twilio's: TextMagic and the chat platforms.
#[derive(Clone)]
pub struct Providers {
    pub textmagic: LoadTextMagic,
    pub telegram: LoadTelegram,
    pub slack: LoadSlack,
    pub whatsapp: LoadWhatsApp,
}

impl Providers {
    pub async fn start() -> Self {
        Self {
            textmagic: LoadTextMagic::start("load-textmagic", "load-textmagic-key").await,
            telegram: LoadTelegram::start(TELEGRAM_BOT_TOKEN).await,
            slack: LoadSlack::start(SLACK_BOT_TOKEN, SLACK_TEAM).await,
            whatsapp: LoadWhatsApp::start(WHATSAPP_TOKEN, WHATSAPP_NUMBER_ID).await,
        }
    }

    /// Every send each fake accepted so far, in the order it took them.
    pub fn sends(&self) -> Vec<SendRecord> {
        [
            self.textmagic.sends(),
            self.telegram.sends(),
            self.slack.sends(),
            self.whatsapp.sends(),
        ]
        .concat()
    }

    /// Distinct replies they took so far.
    pub fn distinct(&self) -> u64 {
        self.textmagic.distinct()
            + self.telegram.distinct()
            + self.slack.distinct()
            + self.whatsapp.distinct()
    }
}

/// What the chaos run adds to a load run's configuration: TextMagic and the chat platforms
/// (pointed at their fakes, their people at the per-person agent), chat tokens, and the
/// collect and front-desk agents.
pub fn configure(c: &mut Config, fakes: &Providers) {
    let textmagic = &fakes.textmagic;
    c.textmagic.username = textmagic.username.clone();
    c.textmagic.api_key = Secret::new(textmagic.api_key.clone());
    c.textmagic.api_base = textmagic.url.clone();
    c.textmagic.from_number = TEXTMAGIC_NUMBER.into();
    c.textmagic.webhook_token = Secret::new(TEXTMAGIC_TOKEN);
    c.chat.jwt_secret = Secret::new(CHAT_SECRET);
    // A reconnecting client asks for every reply after its last; keep them all replayable.
    c.chat.replay_limit = 1_000;
    // A second agent on the same runner, collecting; the collect people's numbers go to it
    // (chat and API name it).
    if let Some(first) = c.agents.first().cloned()
        && c.agent(pipeline::COLLECT_AGENT).is_none()
    {
        c.agents.push(switchboard_kit::config::AgentConfig {
            name: pipeline::COLLECT_AGENT.into(),
            queue_mode: switchboard_kit::config::QueueMode::Collect,
            ..first
        });
    }
    // The front desk: one session for everyone who writes to it, an identity of its own (the
    // variants of one identity share one scope).
    if let Some(first) = c.agents.first().cloned()
        && c.agent(pipeline::SHARED_AGENT).is_none()
    {
        c.agents.push(switchboard_kit::config::AgentConfig {
            name: pipeline::SHARED_AGENT.into(),
            identity: pipeline::SHARED_AGENT.into(),
            scope: Some(switchboard_kit::config::SessionScope::Main),
            ..first
        });
    }
    if let Some(sms) = c.channels.get_mut("sms") {
        for (number, agent) in [
            (pipeline::TWILIO_COLLECT_NUMBER, pipeline::COLLECT_AGENT),
            (TEXTMAGIC_COLLECT_NUMBER, pipeline::COLLECT_AGENT),
            (pipeline::TWILIO_SHARED_NUMBER, pipeline::SHARED_AGENT),
            (TEXTMAGIC_SHARED_NUMBER, pipeline::SHARED_AGENT),
        ] {
            sms.recipients.insert(number.into(), agent.into());
        }
    }
    configure_platforms(c, fakes);
}

/// `[providers.telegram|slack|whatsapp]` pointed at the fakes, and each platform's people at
/// the per-person agent ([`Channel::routes_agents`]).
fn configure_platforms(c: &mut Config, fakes: &Providers) {
    let (telegram, slack, whatsapp) = platform_settings(fakes);
    let set = [
        c.set_provider_settings("telegram", &telegram),
        c.set_provider_settings("slack", &slack),
        c.set_provider_settings("whatsapp", &whatsapp),
    ];
    for done in set {
        done.expect("a platform's settings are a table");
    }
    for channel in ["telegram", "slack", "whatsapp"] {
        c.channels.entry(channel.into()).or_default().default_agent = pipeline::AGENT.into();
    }
}

/// The chat platforms' settings naming the fakes, as a deployment writes them.
fn platform_settings(fakes: &Providers) -> (TelegramSettings, SlackSettings, WhatsAppSettings) {
    let telegram = TelegramSettings {
        bot_token: Secret::new(TELEGRAM_BOT_TOKEN),
        secret_token: Secret::new(TELEGRAM_SECRET),
        group_chats: Vec::new(),
        api_base: fakes.telegram.url.clone(),
    };
    let slack = SlackSettings {
        signing_secret: Secret::new(SLACK_SIGNING_SECRET),
        bot_token: Secret::new(SLACK_BOT_TOKEN),
        api_base: fakes.slack.url.clone(),
        files_base: fakes.slack.url.clone(),
        ..Default::default()
    };
    let whatsapp = WhatsAppSettings {
        access_token: Secret::new(WHATSAPP_TOKEN),
        app_secret: Secret::new(WHATSAPP_APP_SECRET),
        verify_token: Secret::new(WHATSAPP_VERIFY_TOKEN),
        phone_number_id: WHATSAPP_NUMBER_ID.into(),
        api_base: fakes.whatsapp.url.clone(),
        ..Default::default()
    };
    (telegram, slack, whatsapp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::{Channel, slack_channel, slack_user};
    use crate::sender_phone;
    use switchboard_channels::slack::SlackSender;
    use switchboard_channels::telegram::TelegramSender;
    use switchboard_channels::whatsapp::WhatsAppSender;
    use switchboard_channels::{Egress, OutboundPart};
    use switchboard_e2e::TELEGRAM_BOT_ID;
    use switchboard_kit::proto::Reply;

    #[tokio::test]
    async fn the_platforms_fakes_report_each_reply_the_products_senders_give_them() {
        let fakes = Providers::start().await;
        let mut c = Config::default();
        configure(&mut c, &fakes);
        // What the workers read back from their configuration.
        let read = |p: &str| c.provider_settings::<serde_json::Value>(p).unwrap();
        assert_eq!(read("telegram")["api_base"], fakes.telegram.url.as_str());
        assert_eq!(read("whatsapp")["phone_number_id"], WHATSAPP_NUMBER_ID);
        assert_eq!(c.channels["slack"].agent_for("D0L0000003"), pipeline::AGENT);
        let sender = 3;
        // A reply goes to the person's address, from the place (Slack) or number they wrote to.
        let reply = |c: Channel, from: &str| Reply {
            recipient: match c {
                Channel::Slack => format!("{SLACK_TEAM}:{}", slack_user(sender)),
                Channel::WhatsApp => sender_phone(sender),
                _ => c.address(sender),
            },
            reply_from: from.into(),
            ..Default::default()
        };
        let (telegram, slack, whatsapp) = platform_settings(&fakes);
        let senders: [(Channel, Box<dyn Egress>, Reply); 3] = [
            (
                Channel::Telegram,
                Box::new(TelegramSender::new(Ok(telegram))),
                reply(Channel::Telegram, TELEGRAM_BOT_ID),
            ),
            (
                Channel::Slack,
                Box::new(SlackSender::new(Ok(slack))),
                reply(Channel::Slack, &slack_channel(sender)),
            ),
            (
                Channel::WhatsApp,
                Box::new(WhatsAppSender::new(Ok(whatsapp))),
                reply(Channel::WhatsApp, WHATSAPP_NUMBER_ID),
            ),
        ];
        let since = chrono::Utc::now();
        for (channel, egress, reply) in &senders {
            let part = OutboundPart::new(reply, 0, "echo: s3#0").with_last_inbound(Some(since));
            let id = egress.send(part).await.unwrap();
            let took: Vec<SendRecord> = fakes
                .sends()
                .into_iter()
                .filter(|s| s.channel == *channel)
                .collect();
            assert_eq!(took.len(), 1, "{channel:?}");
            let s = &took[0];
            assert_eq!(
                (s.to.as_str(), s.text.as_str(), s.sid.as_str()),
                (channel.address(sender).as_str(), "s3#0", id.as_str()),
                "{channel:?}"
            );
        }
        // Slack's history shows the part; Telegram and WhatsApp have none to ask.
        let (_, slack, reply) = &senders[1];
        let part = OutboundPart::new(reply, 0, "echo: s3#0");
        assert_eq!(slack.find_sent(part, since).await.map(|f| f.len()), Ok(1));
        assert!(fakes.slack.stats().lookups >= 1);
        let (_, telegram, reply) = &senders[0];
        let part = OutboundPart::new(reply, 0, "echo: s3#0");
        assert!(telegram.find_sent(part, since).await.is_err());
    }
}
