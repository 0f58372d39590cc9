//! The channels a load run drives, and the one place that knows how each one's load client
//! reaches the gateway and where its replies come back:
//!
//! - Twilio: a signed form post ([`GatewayClient`]); replies at the fake Twilio.
//! - TextMagic, Telegram, Slack, WhatsApp: each provider's webhook as it posts it
//!   ([`webhooks`]); replies at each one's fake ([`Providers`]).
//! - Chat: one WebSocket per person on `/ws/chat` with an HS256 JWT ([`chat`]).
//! - API: `POST /api/v1/messages` with the person's own API key ([`api`]).
//!
//! Chat and API replies are rows of the mailbox table before they reach the client; the chaos
//! verdict reads both.
use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchboard_channels::api::{ApiKeys, Scope};
use switchboard_channels::textmagic::textmagic_number;
use switchboard_e2e::{
    SLACK_SIGNING_SECRET, SLACK_TEAM, TELEGRAM_BOT_ID, TELEGRAM_SECRET, WHATSAPP_APP_SECRET,
    WHATSAPP_NUMBER_ID,
};

use super::pipeline::GatewayClient;
use super::{message_text, sender_phone};

mod api;
mod chat;
mod providers;
mod webhooks;

pub use chat::chat_token;
pub use providers::{Providers, configure};

/// The HS256 secret load runs configure for chat tokens.
pub const CHAT_SECRET: &str = "load-chat-secret-5e1f";
/// The secret of the TextMagic callback URL in load runs.
pub const TEXTMAGIC_TOKEN: &str = "load-textmagic-token";
/// Our TextMagic number, as TextMagic writes numbers.
pub const TEXTMAGIC_NUMBER: &str = "15555550198";
/// The TextMagic number the chaos run's `collect` people text (given to the collect agent).
pub const TEXTMAGIC_COLLECT_NUMBER: &str = "15555550196";
/// The number the chaos run's front-desk people text by TextMagic.
pub const TEXTMAGIC_SHARED_NUMBER: &str = "15555550194";

/// A channel the load comes in on (and its replies go back on).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    #[default]
    Twilio,
    #[serde(rename = "textmagic")]
    TextMagic,
    Chat,
    Api,
    Telegram,
    Slack,
    #[serde(rename = "whatsapp")]
    WhatsApp,
}

impl Channel {
    pub const ALL: [Channel; 7] = [
        Channel::Twilio,
        Channel::TextMagic,
        Channel::Chat,
        Channel::Api,
        Channel::Telegram,
        Channel::Slack,
        Channel::WhatsApp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Channel::Twilio => "twilio",
            Channel::TextMagic => "textmagic",
            Channel::Chat => "chat",
            Channel::Api => "api",
            Channel::Telegram => "telegram",
            Channel::Slack => "slack",
            Channel::WhatsApp => "whatsapp",
        }
    }

    /// The person id the identify stage gives this channel's sender number `sender` (the
    /// adapter's `Received.sender` under the channel's prefix, a WhatsApp number in E.164).
    pub fn person(self, sender: usize) -> String {
        match self {
            Channel::Twilio | Channel::TextMagic => format!("phone:{}", sender_phone(sender)),
            Channel::Chat => format!("user:{}", client_name(sender)),
            Channel::Api => format!("api:{}", client_name(sender)),
            Channel::Telegram => format!("telegram:{}", telegram_chat(sender)),
            Channel::Slack => format!("slack:{SLACK_TEAM}:{}", slack_user(sender)),
            Channel::WhatsApp => format!("whatsapp:{}", sender_phone(sender)),
        }
    }

    /// Where `sender`'s replies go, as the far end writes it: the `To` Twilio is asked for
    /// (E.164), the `phones` TextMagic is asked for (digits), the mailbox `address` (the chat
    /// token's `sub`, the API key's owner), Telegram's `chat_id`, the Slack DM, the WhatsApp
    /// number's digits.
    pub fn address(self, sender: usize) -> String {
        match self {
            Channel::Twilio => sender_phone(sender),
            Channel::TextMagic => textmagic_number(&sender_phone(sender)),
            Channel::Chat | Channel::Api => client_name(sender),
            Channel::Telegram => telegram_chat(sender).to_string(),
            Channel::Slack => slack_channel(sender),
            Channel::WhatsApp => whatsapp_id(sender),
        }
    }

    /// The mailbox `channel` of this channel's replies (`None`: sent through a provider).
    pub fn mailbox_channel(self) -> Option<&'static str> {
        match self {
            Channel::Chat => Some(switchboard_channels::chat::CHANNELS[0]),
            Channel::Api => Some(switchboard_channels::api::CHANNEL),
            _ => None,
        }
    }

    /// Whether the run can send this channel's people to another agent than the default:
    /// SMS by the number they text (`[channels.sms.recipients]`), chat and API by naming it.
    /// The chat platforms' routing is by the number written to, and a load run has one bot,
    /// one workspace and one business number (a Slack DM's id is no number): their people
    /// talk to the per-person agent.
    pub fn routes_agents(self) -> bool {
        matches!(
            self,
            Channel::Twilio | Channel::TextMagic | Channel::Chat | Channel::Api
        )
    }

    /// A provider without a message log to read: a part whose send may have reached it before
    /// its deliverer died is never sent again, and its reply ends in `delivery.failed`.
    pub fn keeps_no_log(self) -> bool {
        matches!(self, Channel::Telegram | Channel::WhatsApp)
    }
}

/// A chat user's `sub` and an API key's owner: one per sender.
pub fn client_name(sender: usize) -> String {
    format!("load-{sender}")
}

/// A Telegram user's id, which is their private chat's: one per sender.
pub fn telegram_chat(sender: usize) -> i64 {
    900_000_000 + sender as i64
}

/// A Slack user of the workspace ([`SLACK_TEAM`]): one per sender.
pub fn slack_user(sender: usize) -> String {
    format!("U0L{sender:07}")
}

/// The app's DM with [`slack_user`]: what `chat.postMessage` answers for the user's id.
pub fn slack_channel(sender: usize) -> String {
    format!("D0L{sender:07}")
}

/// A WhatsApp id (the number's digits): the sender's phone, as for SMS.
pub fn whatsapp_id(sender: usize) -> String {
    sender_phone(sender).trim_start_matches('+').to_string()
}

/// How many senders of every `total()` go to each channel, interleaved (so every group of
/// senders the load generator runs together mixes the channels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mix {
    pub twilio: usize,
    pub textmagic: usize,
    pub chat: usize,
    pub api: usize,
    pub telegram: usize,
    pub slack: usize,
    pub whatsapp: usize,
    /// One group of `total()` senders (one of each channel's share) in this many talks to the
    /// `collect` agent ([`super::pipeline::COLLECT_AGENT`]); 0: nobody does. Only the people of
    /// channels that can name another agent ([`Channel::routes_agents`]).
    pub collect_every: usize,
    /// The one group of `total()` senders (by index; never a collecting group) that talks to
    /// the shared front desk ([`super::pipeline::SHARED_AGENT`]); none: nobody does. One group
    /// only, whatever the run's size: a session everyone shares runs its turns one at a time,
    /// so its load is bounded by design (the full run's 400 msg/s would queue thousands).
    /// Only its people of channels that can name another agent.
    pub front_desk_group: Option<usize>,
}

/// Which agent a sender talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentKind {
    /// [`super::pipeline::AGENT`], one session per person.
    Own,
    /// [`super::pipeline::COLLECT_AGENT`].
    Collect,
    /// [`super::pipeline::SHARED_AGENT`], one session for all its people.
    Shared,
}

impl Mix {
    pub const TWILIO_ONLY: Mix = Mix {
        twilio: 1,
        textmagic: 0,
        chat: 0,
        api: 0,
        telegram: 0,
        slack: 0,
        whatsapp: 0,
        collect_every: 0,
        front_desk_group: None,
    };
    /// 25% Twilio, 12.5% each of TextMagic, chat, API, Telegram, Slack and WhatsApp; a quarter
    /// of the SMS, chat and API people talk to the `collect` agent, and one group's five of
    /// them to the shared front desk.
    pub const CHAOS: Mix = Mix {
        twilio: 2,
        textmagic: 1,
        chat: 1,
        api: 1,
        telegram: 1,
        slack: 1,
        whatsapp: 1,
        collect_every: 4,
        front_desk_group: Some(2),
    };

    fn shares(&self) -> [(Channel, usize); 7] {
        [
            (Channel::Twilio, self.twilio),
            (Channel::TextMagic, self.textmagic),
            (Channel::Chat, self.chat),
            (Channel::Api, self.api),
            (Channel::Telegram, self.telegram),
            (Channel::Slack, self.slack),
            (Channel::WhatsApp, self.whatsapp),
        ]
    }

    fn total(&self) -> usize {
        self.shares().iter().map(|(_, n)| n).sum::<usize>().max(1)
    }

    /// The channel of sender `sender`.
    pub fn channel_of(&self, sender: usize) -> Channel {
        let mut slot = sender % self.total();
        for (channel, n) in self.shares() {
            if slot < n {
                return channel;
            }
            slot -= n;
        }
        Channel::Twilio
    }

    /// Whether sender `sender` talks to the `collect` agent (else to the `followup` one).
    pub fn collects(&self, sender: usize) -> bool {
        self.collect_every > 0
            && (sender / self.total()).is_multiple_of(self.collect_every)
            && self.channel_of(sender).routes_agents()
    }

    /// Whether sender `sender` talks to the shared front desk.
    pub fn at_front_desk(&self, sender: usize) -> bool {
        self.front_desk_group == Some(sender / self.total())
            && !self.collects(sender)
            && self.channel_of(sender).routes_agents()
    }

    pub fn kind_of(&self, sender: usize) -> AgentKind {
        if self.collects(sender) {
            AgentKind::Collect
        } else if self.at_front_desk(sender) {
            AgentKind::Shared
        } else {
            AgentKind::Own
        }
    }

    /// The agent sender `sender` talks to.
    pub fn agent_of(&self, sender: usize) -> &'static str {
        match self.kind_of(sender) {
            AgentKind::Collect => super::pipeline::COLLECT_AGENT,
            AgentKind::Shared => super::pipeline::SHARED_AGENT,
            AgentKind::Own => super::pipeline::AGENT,
        }
    }

    pub fn uses(&self, channel: Channel) -> bool {
        self.shares().iter().any(|(c, n)| *c == channel && *n > 0)
    }
}

/// The gateway's answer to one attempt at handing it a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Posted {
    /// Stored: the id the product keeps for the message (`turns.provider_message_id`, the
    /// inbound log row's `external_id`) and, where the channel says one, its correlation id.
    Accepted {
        provider_id: String,
        correlation_id: String,
    },
    /// Answered, not stored (the status, or the chat error's code).
    Refused(String),
    /// No answer (gateway down, connection reset, no `accepted` frame in time).
    Failed,
}

/// A reply as the client it was meant for got it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClientReply {
    pub channel: Channel,
    pub sender: usize,
    /// The mailbox `seq` (chat frames carry it; the API does not say it: -1).
    pub seq: i64,
    pub reply_id: String,
    /// The reply less the runner's `echo: ` (so the message text it answers).
    pub text: String,
    pub at_us: u64,
    /// Not an answer: Switchboard telling the person their message waits (runner down): a
    /// chat `notice` frame, an entry of an API message's `notices`.
    #[serde(default)]
    pub notice: bool,
    /// API: the correlation id of the message whose status listed it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub listed_under: String,
}

/// Every channel's load client; senders are given channels by `mix`.
pub struct LoadClients {
    pub mix: Mix,
    twilio: GatewayClient,
    textmagic: webhooks::TextMagicClient,
    telegram: webhooks::TelegramClient,
    slack: webhooks::SlackClient,
    whatsapp: webhooks::WhatsAppClient,
    chat: chat::ChatClients,
    api: api::ApiClients,
    /// Makes Twilio's `MessageSid`s (and Slack's event ids, WhatsApp's wamids) this run's own.
    tag: String,
    /// Every message carries its person's canary after its text (chaos runs).
    canaries: Option<super::canary::Canaries>,
}

impl LoadClients {
    /// Twilio only (the bench).
    pub fn twilio_only(gateway: GatewayClient) -> Self {
        Self::new(gateway, Mix::TWILIO_ONLY, HashMap::new())
    }

    /// Clients for `senders` senders mixed by `mix`: API keys are made (as `switchboard
    /// api-keys create` makes them) for the API senders.
    pub async fn start(
        gateway: GatewayClient,
        db: &sqlx::PgPool,
        mix: Mix,
        senders: usize,
    ) -> anyhow::Result<Self> {
        let store = ApiKeys::new(db.clone());
        let mut keys = HashMap::new();
        for sender in (0..senders).filter(|s| mix.channel_of(*s) == Channel::Api) {
            let (key, _) = store.create(&client_name(sender), &Scope::DEFAULT).await?;
            keys.insert(sender, key);
        }
        Ok(Self::new(gateway, mix, keys))
    }

    fn new(gateway: GatewayClient, mix: Mix, api_keys: HashMap<usize, String>) -> Self {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .timeout(Duration::from_secs(20))
            .build()
            .expect("HTTP client");
        let base = gateway.base.clone();
        let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        Self {
            mix,
            textmagic: webhooks::TextMagicClient {
                http: http.clone(),
                url: format!("{base}/webhooks/textmagic/sms/{TEXTMAGIC_TOKEN}"),
            },
            telegram: webhooks::TelegramClient::new(
                http.clone(),
                &base,
                TELEGRAM_BOT_ID,
                TELEGRAM_SECRET,
            ),
            slack: webhooks::SlackClient::new(
                http.clone(),
                &base,
                SLACK_TEAM,
                SLACK_SIGNING_SECRET,
                &tag,
            ),
            whatsapp: webhooks::WhatsAppClient::new(
                http.clone(),
                &base,
                WHATSAPP_APP_SECRET,
                WHATSAPP_NUMBER_ID,
                &tag,
            ),
            chat: chat::ChatClients::new(&base),
            api: api::ApiClients {
                http,
                base,
                keys: api_keys,
            },
            twilio: gateway,
            tag,
            canaries: None,
        }
    }

    /// Every message carries its person's canary (`s<sender>#<index> cnry-…`).
    pub fn with_canaries(mut self, canaries: super::canary::Canaries) -> Self {
        self.canaries = Some(canaries);
        self
    }

    pub fn channel_of(&self, sender: usize) -> Channel {
        self.mix.channel_of(sender)
    }

    /// Hand message `index` of `sender` to the gateway once, on the sender's channel. Every
    /// attempt at one message carries the same ids (MessageSid, TextMagic id, chat client id,
    /// Idempotency-Key, Telegram update, Slack event, wamid), as a retrying provider or client
    /// does.
    pub async fn post(&self, sender: usize, index: u32) -> Posted {
        let text = match &self.canaries {
            Some(c) => c.mark(sender, &message_text(sender, index)),
            None => message_text(sender, index),
        };
        let answered = |status: reqwest::StatusCode, provider_id: String| {
            if status.is_success() {
                Posted::Accepted {
                    provider_id,
                    correlation_id: String::new(),
                }
            } else {
                Posted::Refused(status.as_u16().to_string())
            }
        };
        let kind = self.mix.kind_of(sender);
        // Chat and API name their agent (none: the channel's default).
        let agent = match kind {
            AgentKind::Own => "",
            _ => self.mix.agent_of(sender),
        };
        match self.channel_of(sender) {
            Channel::Twilio => {
                let sid = format!("SM{}{sender:06}x{index:06}", self.tag);
                let to = match kind {
                    AgentKind::Collect => super::pipeline::TWILIO_COLLECT_NUMBER,
                    AgentKind::Shared => super::pipeline::TWILIO_SHARED_NUMBER,
                    AgentKind::Own => switchboard_e2e::TWILIO_NUMBER,
                };
                match self
                    .twilio
                    .post_sms_to(&sender_phone(sender), to, &text, &sid)
                    .await
                {
                    Ok(status) => answered(status, sid),
                    Err(_) => Posted::Failed,
                }
            }
            Channel::TextMagic => {
                // TextMagic's ids are numbers.
                let id = 7_000_000_000 + sender as u64 * 10_000 + index as u64;
                let to = match kind {
                    AgentKind::Collect => TEXTMAGIC_COLLECT_NUMBER,
                    AgentKind::Shared => TEXTMAGIC_SHARED_NUMBER,
                    AgentKind::Own => TEXTMAGIC_NUMBER,
                };
                match self.textmagic.post(sender, to, &text, id).await {
                    Ok(status) => answered(status, id.to_string()),
                    Err(_) => Posted::Failed,
                }
            }
            Channel::Chat => self.chat.post(sender, index, agent, &text).await,
            Channel::Api => self.api.post(sender, index, agent, &text).await,
            Channel::Telegram => self.telegram.post(sender, index, &text).await,
            Channel::Slack => self.slack.post(sender, index, &text).await,
            Channel::WhatsApp => self.whatsapp.post(sender, index, &text).await,
        }
    }

    /// Every reply the chat clients were pushed so far.
    pub fn chat_replies(&self) -> Vec<ClientReply> {
        self.chat.received()
    }

    /// What `GET /api/v1/messages/<correlation id>` answers for each of `messages` (sender,
    /// correlation id), as the API caller would read its replies.
    pub async fn api_replies(&self, messages: &[(usize, String)]) -> Vec<ClientReply> {
        self.api.replies(messages).await
    }

    /// Close the chat sockets (their replies stay readable).
    pub fn close(&self) {
        self.chat.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chaos_mix_gives_each_channel_its_share_within_any_group() {
        let count = |senders: std::ops::Range<usize>, c: Channel| {
            senders.filter(|s| Mix::CHAOS.channel_of(*s) == c).count()
        };
        assert_eq!(count(0..2_000, Channel::Twilio), 500);
        for c in &Channel::ALL[1..] {
            assert_eq!(count(0..2_000, *c), 250, "{c:?}");
            // The load runs senders in groups of 10 to 50: each group mixes every channel.
            assert!(count(10..20, *c) >= 1, "{c:?}");
        }
        assert!((0..100).all(|s| Mix::TWILIO_ONLY.channel_of(s) == Channel::Twilio));
    }

    #[test]
    fn only_the_channels_that_can_name_an_agent_collect_or_share_the_front_desk() {
        let mix = Mix::CHAOS;
        let at = |kind: AgentKind, c: Channel| {
            (0..2_000)
                .filter(|&s| mix.channel_of(s) == c && mix.kind_of(s) == kind)
                .count()
        };
        // 250 groups of eight, one in four collecting (63), one at the front desk.
        assert_eq!(at(AgentKind::Collect, Channel::Twilio), 126);
        assert_eq!(at(AgentKind::Shared, Channel::Twilio), 2);
        for c in [Channel::TextMagic, Channel::Chat, Channel::Api] {
            assert_eq!(at(AgentKind::Collect, c), 63, "{c:?}");
            assert_eq!(at(AgentKind::Shared, c), 1, "{c:?}");
        }
        for c in [Channel::Telegram, Channel::Slack, Channel::WhatsApp] {
            assert_eq!(at(AgentKind::Own, c), 250, "{c:?}");
        }
    }

    #[test]
    fn each_channel_names_the_person_and_address_the_product_gives_its_sender() {
        assert_eq!(Channel::Twilio.person(3), Channel::TextMagic.person(3));
        assert_eq!(Channel::TextMagic.address(3), "14152000003");
        assert_eq!(Channel::Chat.person(3), "user:load-3");
        assert_eq!(Channel::Api.person(3), "api:load-3");
        assert_eq!(Channel::Api.mailbox_channel(), Some("api"));
        assert_eq!(Channel::Chat.mailbox_channel(), Some("admin_chat"));
        assert_eq!(Channel::Telegram.person(3), "telegram:900000003");
        assert_eq!(Channel::Telegram.address(3), "900000003");
        assert_eq!(Channel::Slack.person(3), "slack:T0TEST001:U0L0000003");
        assert_eq!(Channel::Slack.address(3), "D0L0000003");
        assert_eq!(Channel::WhatsApp.person(3), "whatsapp:+14152000003");
        assert_eq!(Channel::WhatsApp.address(3), "14152000003");
        for c in [Channel::Telegram, Channel::Slack, Channel::WhatsApp] {
            assert_eq!(c.mailbox_channel(), None, "{c:?}");
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.name()));
        }
    }
}
