//! The channels a load run drives, and the one place that knows how each one's load client
//! reaches the gateway and where its replies come back:
//!
//! - Twilio: a signed form post ([`GatewayClient`]); replies at the fake Twilio.
//! - TextMagic: the JSON callback to `/webhooks/textmagic/sms/<token>` ([`TextMagicClient`]);
//!   replies at the fake TextMagic.
//! - Chat: one WebSocket per person on `/ws/chat` with an HS256 JWT ([`ChatClients`]). A socket
//!   that drops (a gateway SIGKILLed) is opened again with `?since=<last seq seen>`, and every
//!   message not yet `accepted` is sent again with the same client id.
//! - API: `POST /api/v1/messages` with the person's own API key and an `Idempotency-Key` that a
//!   retry repeats ([`ApiClients`]); replies read back with `GET /api/v1/messages/<id>`.
//!
//! Chat and API replies are rows of the mailbox table before they reach the client; the chaos
//! verdict reads both.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use serde::{Deserialize, Serialize};
use switchboard_channels::api::{ApiKeys, Scope};
use switchboard_channels::chat::ServerFrame;
use switchboard_channels::client_message_key;
use switchboard_channels::textmagic::textmagic_number;
use switchboard_kit::config::{Config, Secret};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message;

use super::observers::LoadTextMagic;
use super::pipeline::GatewayClient;
use super::{message_text, now_us, sender_phone};

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
}

impl Channel {
    pub const ALL: [Channel; 4] = [
        Channel::Twilio,
        Channel::TextMagic,
        Channel::Chat,
        Channel::Api,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Channel::Twilio => "twilio",
            Channel::TextMagic => "textmagic",
            Channel::Chat => "chat",
            Channel::Api => "api",
        }
    }

    /// The person id the identify stage gives this channel's sender number `sender`.
    pub fn person(self, sender: usize) -> String {
        match self {
            Channel::Twilio | Channel::TextMagic => format!("phone:{}", sender_phone(sender)),
            Channel::Chat => format!("user:{}", client_name(sender)),
            Channel::Api => format!("api:{}", client_name(sender)),
        }
    }

    /// Where `sender`'s replies go, as the far end writes it: the `To` Twilio is asked for
    /// (E.164), the `phones` TextMagic is asked for (digits), the mailbox `address` (the chat
    /// token's `sub`, the API key's owner).
    pub fn address(self, sender: usize) -> String {
        match self {
            Channel::Twilio => sender_phone(sender),
            Channel::TextMagic => textmagic_number(&sender_phone(sender)),
            Channel::Chat | Channel::Api => client_name(sender),
        }
    }

    /// The mailbox `channel` of this channel's replies (`None`: sent through a provider).
    pub fn mailbox_channel(self) -> Option<&'static str> {
        match self {
            Channel::Twilio | Channel::TextMagic => None,
            Channel::Chat => Some(switchboard_channels::chat::CHANNELS[0]),
            Channel::Api => Some(switchboard_channels::api::CHANNEL),
        }
    }
}

/// A chat user's `sub` and an API key's owner: one per sender.
pub fn client_name(sender: usize) -> String {
    format!("load-{sender}")
}

/// How many senders of every `total()` go to each channel, interleaved (so every group of
/// senders the load generator runs together mixes the channels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mix {
    pub twilio: usize,
    pub textmagic: usize,
    pub chat: usize,
    pub api: usize,
    /// One group of `total()` senders (one of each channel's share) in this many talks to the
    /// `collect` agent ([`super::pipeline::COLLECT_AGENT`]); 0: nobody does.
    pub collect_every: usize,
    /// The one group of `total()` senders (by index; never a collecting group) that talks to
    /// the shared front desk ([`super::pipeline::SHARED_AGENT`]); none: nobody does. One group
    /// only, whatever the run's size: a session everyone shares runs its turns one at a time,
    /// so its load is bounded by design (the full run's 400 msg/s would queue thousands).
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
        collect_every: 0,
        front_desk_group: None,
    };
    /// 40% Twilio, 20% each of TextMagic, chat and API; a quarter of each channel's people
    /// talk to the `collect` agent, and one group (five people) to the shared front desk.
    pub const CHAOS: Mix = Mix {
        twilio: 2,
        textmagic: 1,
        chat: 1,
        api: 1,
        collect_every: 4,
        front_desk_group: Some(2),
    };

    fn shares(&self) -> [(Channel, usize); 4] {
        [
            (Channel::Twilio, self.twilio),
            (Channel::TextMagic, self.textmagic),
            (Channel::Chat, self.chat),
            (Channel::Api, self.api),
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
        self.collect_every > 0 && (sender / self.total()).is_multiple_of(self.collect_every)
    }

    /// Whether sender `sender` talks to the shared front desk.
    pub fn at_front_desk(&self, sender: usize) -> bool {
        self.front_desk_group == Some(sender / self.total()) && !self.collects(sender)
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
    textmagic: TextMagicClient,
    chat: ChatClients,
    api: ApiClients,
    /// Makes Twilio's `MessageSid`s this run's own.
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
        Self {
            mix,
            textmagic: TextMagicClient {
                http: http.clone(),
                url: format!("{base}/webhooks/textmagic/sms/{TEXTMAGIC_TOKEN}"),
            },
            chat: ChatClients::new(&base),
            api: ApiClients {
                http,
                base,
                keys: api_keys,
            },
            twilio: gateway,
            tag: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
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
    /// Idempotency-Key), as a retrying provider or client does.
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
        }
    }

    /// Every reply the chat clients were pushed so far.
    pub fn chat_replies(&self) -> Vec<ClientReply> {
        self.chat.received.lock().unwrap().clone()
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

/// What the chaos run adds to a load run's configuration: TextMagic (pointed at the fake) and
/// chat tokens.
pub fn configure(c: &mut Config, textmagic: &LoadTextMagic) {
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
        && c.agent(super::pipeline::COLLECT_AGENT).is_none()
    {
        c.agents.push(switchboard_kit::config::AgentConfig {
            name: super::pipeline::COLLECT_AGENT.into(),
            queue_mode: switchboard_kit::config::QueueMode::Collect,
            ..first
        });
    }
    // The front desk: one session for everyone who writes to it, an identity of its own (the
    // variants of one identity share one scope).
    if let Some(first) = c.agents.first().cloned()
        && c.agent(super::pipeline::SHARED_AGENT).is_none()
    {
        c.agents.push(switchboard_kit::config::AgentConfig {
            name: super::pipeline::SHARED_AGENT.into(),
            identity: super::pipeline::SHARED_AGENT.into(),
            scope: Some(switchboard_kit::config::SessionScope::Main),
            ..first
        });
    }
    if let Some(sms) = c.channels.get_mut("sms") {
        for (number, agent) in [
            (
                super::pipeline::TWILIO_COLLECT_NUMBER,
                super::pipeline::COLLECT_AGENT,
            ),
            (TEXTMAGIC_COLLECT_NUMBER, super::pipeline::COLLECT_AGENT),
            (
                super::pipeline::TWILIO_SHARED_NUMBER,
                super::pipeline::SHARED_AGENT,
            ),
            (TEXTMAGIC_SHARED_NUMBER, super::pipeline::SHARED_AGENT),
        ] {
            sms.recipients.insert(number.into(), agent.into());
        }
    }
}

/// Posts TextMagic's inbound-message callback: JSON, numbers as digits.
struct TextMagicClient {
    http: reqwest::Client,
    url: String,
}

impl TextMagicClient {
    async fn post(
        &self,
        sender: usize,
        receiver: &str,
        text: &str,
        id: u64,
    ) -> Result<reqwest::StatusCode, reqwest::Error> {
        let resp = self
            .http
            .post(&self.url)
            .json(&serde_json::json!({
                "id": id,
                "sender": textmagic_number(&sender_phone(sender)),
                "receiver": receiver,
                "messageTime": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%z").to_string(),
                "text": text,
            }))
            .send()
            .await?;
        let status = resp.status();
        let _ = resp.bytes().await;
        Ok(status)
    }
}

/// API callers, one key per sender.
struct ApiClients {
    http: reqwest::Client,
    base: String,
    keys: HashMap<usize, String>,
}

#[derive(Deserialize)]
struct ApiStatus {
    correlation_id: String,
    #[serde(default)]
    replies: Vec<ApiReply>,
    /// What the person was told while the message waited (not answers).
    #[serde(default)]
    notices: Vec<ApiReply>,
}

#[derive(Deserialize)]
struct ApiReply {
    reply_id: String,
    text: String,
}

impl ApiClients {
    async fn post(&self, sender: usize, index: u32, agent: &str, text: &str) -> Posted {
        let Some(key) = self.keys.get(&sender) else {
            return Posted::Refused("no API key made for this sender".into());
        };
        let idempotency_key = format!("m{index}");
        let mut body = serde_json::json!({"text": text});
        if !agent.is_empty() {
            body["agent"] = agent.into();
        }
        let resp = self
            .http
            .post(format!("{}/api/v1/messages", self.base))
            .bearer_auth(key)
            .header("Idempotency-Key", &idempotency_key)
            .json(&body)
            .send()
            .await;
        let Ok(resp) = resp else {
            return Posted::Failed;
        };
        let status = resp.status();
        if !status.is_success() {
            let _ = resp.bytes().await;
            return Posted::Refused(status.as_u16().to_string());
        }
        match resp.json::<ApiStatus>().await {
            Ok(answer) => Posted::Accepted {
                provider_id: client_message_key(&client_name(sender), &idempotency_key),
                correlation_id: answer.correlation_id,
            },
            // The message was taken, but its answer was cut off: the retry says the id again.
            Err(_) => Posted::Failed,
        }
    }

    async fn replies(&self, messages: &[(usize, String)]) -> Vec<ClientReply> {
        let polls = futures::stream::iter(messages.iter().cloned())
            .map(|(sender, correlation_id)| async move {
                let key = self.keys.get(&sender)?;
                let status: ApiStatus = self
                    .http
                    .get(format!("{}/api/v1/messages/{correlation_id}", self.base))
                    .bearer_auth(key)
                    .send()
                    .await
                    .ok()?
                    .error_for_status()
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let at_us = now_us();
                let reply = |r: ApiReply, notice: bool| ClientReply {
                    channel: Channel::Api,
                    sender,
                    seq: -1,
                    reply_id: r.reply_id,
                    text: r.text.strip_prefix("echo: ").unwrap_or(&r.text).into(),
                    at_us,
                    notice,
                    listed_under: correlation_id.clone(),
                };
                Some(
                    status
                        .replies
                        .into_iter()
                        .map(|r| reply(r, false))
                        .chain(status.notices.into_iter().map(|r| reply(r, true)))
                        .collect::<Vec<_>>(),
                )
            })
            .buffer_unordered(32);
        polls.filter_map(|r| async { r }).concat().await
    }
}

/// The chat users of a run: one socket each, opened on their first message.
struct ChatClients {
    ws_base: String,
    sessions: Mutex<HashMap<usize, mpsc::UnboundedSender<Outgoing>>>,
    received: Arc<Mutex<Vec<ClientReply>>>,
    stop: watch::Sender<bool>,
}

/// A message for a chat user's socket, and where to say what the gateway answered.
struct Outgoing {
    id: String,
    agent: String,
    text: String,
    answer: oneshot::Sender<Posted>,
}

/// How long a chat client waits for `accepted` before it counts the attempt as failed.
const CHAT_ACCEPT_WAIT: Duration = Duration::from_secs(20);

impl ChatClients {
    fn new(http_base: &str) -> Self {
        Self {
            ws_base: http_base.replacen("http", "ws", 1),
            sessions: Default::default(),
            received: Default::default(),
            stop: watch::channel(false).0,
        }
    }

    async fn post(&self, sender: usize, index: u32, agent: &str, text: &str) -> Posted {
        let sub = client_name(sender);
        let id = format!("m{index}");
        let (answer, answered) = oneshot::channel();
        let outgoing = Outgoing {
            id: id.clone(),
            agent: agent.to_string(),
            text: text.to_string(),
            answer,
        };
        {
            let mut sessions = self.sessions.lock().unwrap();
            let session = sessions.entry(sender).or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                let user = ChatUser {
                    sender,
                    url: format!("{}/ws/chat?token={}", self.ws_base, chat_token(&sub)),
                    received: self.received.clone(),
                };
                tokio::spawn(user.run(rx, self.stop.subscribe()));
                tx
            });
            if session.send(outgoing).is_err() {
                return Posted::Failed;
            }
        }
        match tokio::time::timeout(CHAT_ACCEPT_WAIT, answered).await {
            Ok(Ok(Posted::Accepted { correlation_id, .. })) => Posted::Accepted {
                provider_id: client_message_key(&sub, &id),
                correlation_id,
            },
            Ok(Ok(other)) => other,
            _ => Posted::Failed,
        }
    }

    fn close(&self) {
        let _ = self.stop.send(true);
    }
}

/// A chat token for `sub`, valid for the longest run.
pub fn chat_token(sub: &str) -> String {
    let now = chrono::Utc::now().timestamp();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({"sub": sub, "iat": now, "exp": now + 6 * 3600}),
        &jsonwebtoken::EncodingKey::from_secret(CHAT_SECRET.as_bytes()),
    )
    .expect("sign a token")
}

/// One chat user's socket, kept open (and opened again) until the run closes it.
struct ChatUser {
    sender: usize,
    url: String,
    received: Arc<Mutex<Vec<ClientReply>>>,
}

/// Why a socket's session ended.
enum Ended {
    /// The socket dropped: open it again.
    Dropped,
    /// The run is over.
    Closed,
}

impl ChatUser {
    async fn run(
        self,
        mut outgoing: mpsc::UnboundedReceiver<Outgoing>,
        stop: watch::Receiver<bool>,
    ) {
        // Messages sent and not yet answered, in the order they were first sent.
        let mut pending: Vec<Outgoing> = Vec::new();
        let mut last_seq = 0i64;
        let mut backoff = Duration::from_millis(100);
        loop {
            if *stop.borrow() {
                return;
            }
            let url = format!("{}&since={last_seq}", self.url);
            let socket = match tokio_tungstenite::connect_async(&url).await {
                Ok((socket, _)) => socket,
                Err(_) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            let ended = self
                .session(
                    socket,
                    &mut pending,
                    &mut last_seq,
                    &mut outgoing,
                    stop.clone(),
                )
                .await;
            if let Ended::Closed = ended {
                return;
            }
        }
    }

    /// One socket: send again what is pending, then send, read and record until it drops.
    async fn session(
        &self,
        mut socket: tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        pending: &mut Vec<Outgoing>,
        last_seq: &mut i64,
        outgoing: &mut mpsc::UnboundedReceiver<Outgoing>,
        mut stop: watch::Receiver<bool>,
    ) -> Ended {
        let frame = |m: &Outgoing| {
            let mut f = serde_json::json!({"type": "message", "id": m.id, "text": m.text});
            if !m.agent.is_empty() {
                f["agent"] = m.agent.clone().into();
            }
            Message::text(f.to_string())
        };
        for m in pending.iter() {
            if socket.send(frame(m)).await.is_err() {
                return Ended::Dropped;
            }
        }
        loop {
            tokio::select! {
                // Open as long as the run holds the sending side.
                next = outgoing.recv(), if !outgoing.is_closed() => {
                    let Some(m) = next else { continue };
                    let send = frame(&m);
                    // A retry of a message still pending replaces it (same id: one message).
                    pending.retain(|p| p.id != m.id);
                    pending.push(m);
                    if socket.send(send).await.is_err() {
                        return Ended::Dropped;
                    }
                }
                incoming = socket.next() => {
                    let text = match incoming {
                        Some(Ok(Message::Text(text))) => text,
                        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Ended::Dropped,
                        Some(Ok(_)) => continue,
                    };
                    match serde_json::from_str::<ServerFrame>(text.as_str()) {
                        Ok(ServerFrame::Accepted { id, correlation_id }) => {
                            answer(pending, &id, Posted::Accepted {
                                provider_id: String::new(),
                                correlation_id,
                            });
                        }
                        Ok(ServerFrame::Error { id: Some(id), code, .. }) => {
                            answer(pending, &id, Posted::Refused(format!("chat {code}")));
                        }
                        Ok(ServerFrame::Reply { seq, reply_id, text, .. }) => {
                            *last_seq = (*last_seq).max(seq);
                            self.received.lock().unwrap().push(ClientReply {
                                channel: Channel::Chat,
                                sender: self.sender,
                                seq,
                                reply_id,
                                text: text.strip_prefix("echo: ").unwrap_or(&text).into(),
                                at_us: now_us(),
                                ..Default::default()
                            });
                        }
                        // Told while the message waited (runner down): not the answer, but
                        // the verdict counts them (each person told once per outage).
                        Ok(ServerFrame::Notice { seq, reply_id, text, .. }) => {
                            *last_seq = (*last_seq).max(seq);
                            self.received.lock().unwrap().push(ClientReply {
                                channel: Channel::Chat,
                                sender: self.sender,
                                seq,
                                reply_id,
                                text,
                                at_us: now_us(),
                                notice: true,
                                ..Default::default()
                            });
                        }
                        // This client sends no pings.
                        Ok(ServerFrame::Error { id: None, .. } | ServerFrame::Pong { .. })
                        | Err(_) => {}
                    }
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        let _ = socket.close(None).await;
                        return Ended::Closed;
                    }
                }
            }
        }
    }
}

/// Tell whoever sent message `id` what the gateway answered.
fn answer(pending: &mut Vec<Outgoing>, id: &str, posted: Posted) {
    if let Some(i) = pending.iter().position(|p| p.id == id) {
        let _ = pending.remove(i).answer.send(posted);
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
        assert_eq!(count(0..2_000, Channel::Twilio), 800);
        for c in [Channel::TextMagic, Channel::Chat, Channel::Api] {
            assert_eq!(count(0..2_000, c), 400, "{c:?}");
            // The load runs senders in groups of 10 to 50: each group mixes every channel.
            assert_eq!(count(10..20, c), 2, "{c:?}");
        }
        assert!((0..100).all(|s| Mix::TWILIO_ONLY.channel_of(s) == Channel::Twilio));
    }

    #[test]
    fn each_channel_names_the_person_and_address_the_product_gives_its_sender() {
        assert_eq!(Channel::Twilio.person(3), Channel::TextMagic.person(3));
        assert_eq!(Channel::TextMagic.address(3), "14152000003");
        assert_eq!(Channel::Chat.person(3), "user:load-3");
        assert_eq!(Channel::Api.person(3), "api:load-3");
        assert_eq!(Channel::Api.mailbox_channel(), Some("api"));
        assert_eq!(Channel::Chat.mailbox_channel(), Some("admin_chat"));
    }
}
