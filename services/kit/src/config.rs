//! Configuration: `switchboard.toml` (or the file named by `SB_CONFIG`), overridden by `SB_…`
//! environment variables with nested keys joined by `__` (e.g. `SB_TWILIO__API_BASE`).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// A secret value: deserialised like a string, never printed by `Debug`.
#[derive(Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

/// `Debug` shows `nats_url` and `database_url` without their passwords.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Config {
    pub nats_url: String,
    pub database_url: String,
    /// Prefix of every subject and stream. Production uses the default `sb`; tests use their own
    /// so that many runs share one NATS server.
    pub subject_prefix: String,
    /// `text` or `json`.
    pub log_format: String,
    pub gateway: GatewayConfig,
    pub admin: AdminConfig,
    pub twilio: TwilioConfig,
    pub textmagic: TextMagicConfig,
    pub chat: ChatConfig,
    pub api: ApiConfig,
    pub rate_limit: RateLimitConfig,
    /// `[webhooks.<source>]`: the sources that may post to `/webhooks/generic/<source>`.
    pub webhooks: BTreeMap<String, WebhookSourceConfig>,
    pub channels: BTreeMap<String, ChannelConfig>,
    pub agents: Vec<AgentConfig>,
    pub identity: IdentityConfig,
    pub runtime: RuntimeConfig,
    pub session: SessionConfig,
    pub dispatch: DispatchConfig,
    pub workspace: WorkspaceConfig,
    pub prompt: PromptConfig,
    /// `[[schedules]]`: inputs agents get on a timetable.
    pub schedules: Vec<ScheduleConfig>,
    /// `[stages.<name>]`: per-stage overrides of the runtime knobs (see [`crate::stage`]).
    pub stages: BTreeMap<String, crate::stage::StageOverrides>,
    pub demo: DemoConfig,
    pub llm: crate::memory_config::LlmConfig,
    pub embedding: crate::memory_config::EmbeddingConfig,
    pub summary: crate::memory_config::SummaryConfig,
    pub categorise: crate::memory_config::CategoriseConfig,
    pub recall: crate::memory_config::RecallConfig,
    pub memory: crate::memory_config::MemoryConfig,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::endpoint::redact_url;
        f.debug_struct("Config")
            .field("nats_url", &redact_url(&self.nats_url))
            .field("database_url", &redact_url(&self.database_url))
            .field("subject_prefix", &self.subject_prefix)
            .field("log_format", &self.log_format)
            .field("gateway", &self.gateway)
            .field("admin", &self.admin)
            .field("twilio", &self.twilio)
            .field("textmagic", &self.textmagic)
            .field("chat", &self.chat)
            .field("api", &self.api)
            .field("rate_limit", &self.rate_limit)
            .field("webhooks", &self.webhooks)
            .field("channels", &self.channels)
            .field("agents", &self.agents)
            .field("identity", &self.identity)
            .field("runtime", &self.runtime)
            .field("session", &self.session)
            .field("dispatch", &self.dispatch)
            .field("workspace", &self.workspace)
            .field("prompt", &self.prompt)
            .field("schedules", &self.schedules)
            .field("stages", &self.stages)
            .field("demo", &self.demo)
            .field("llm", &self.llm)
            .field("embedding", &self.embedding)
            .field("summary", &self.summary)
            .field("categorise", &self.categorise)
            .field("recall", &self.recall)
            .field("memory", &self.memory)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            nats_url: "nats://127.0.0.1:14222".into(),
            database_url: "postgres://switchboard@127.0.0.1:15432/switchboard".into(),
            subject_prefix: "sb".into(),
            log_format: "text".into(),
            gateway: GatewayConfig::default(),
            admin: AdminConfig::default(),
            twilio: TwilioConfig::default(),
            textmagic: TextMagicConfig::default(),
            chat: ChatConfig::default(),
            api: ApiConfig::default(),
            rate_limit: RateLimitConfig::default(),
            webhooks: BTreeMap::new(),
            channels: ["sms", "admin_chat", "header_widget", "api", "webhook"]
                .into_iter()
                .map(|channel| {
                    let default_agent = "reggie_oc".into();
                    (
                        channel.to_string(),
                        ChannelConfig {
                            default_agent,
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            agents: Vec::new(),
            identity: IdentityConfig::default(),
            runtime: RuntimeConfig::default(),
            session: SessionConfig::default(),
            dispatch: DispatchConfig::default(),
            workspace: WorkspaceConfig::default(),
            prompt: PromptConfig::default(),
            schedules: Vec::new(),
            stages: BTreeMap::new(),
            demo: DemoConfig::default(),
            llm: Default::default(),
            embedding: Default::default(),
            summary: Default::default(),
            categorise: Default::default(),
            recall: Default::default(),
            memory: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct GatewayConfig {
    pub http_addr: String,
    /// The base URL providers call (scheme, host, optional path prefix). Twilio signs the full
    /// URL it called, so behind a proxy this must be the public one.
    pub public_url: String,
    pub max_body_bytes: usize,
    /// Longest accepted message text, in characters.
    pub max_text_chars: usize,
    /// A connection that has not sent a whole request head within this time is closed (slow
    /// or stalled clients cannot hold the gateway).
    pub header_timeout_ms: u64,
    /// A request not answered within this time (a body trickling in included) gets 408.
    pub request_timeout_ms: u64,
    /// Connections served at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// Postgres connections of a gateway process (and of `switchboard up`), unless
    /// `runtime.db_pool_size` says otherwise. Accepting a message waits on commits, not on the
    /// CPU, and Postgres flushes the commits waiting together with one write of its log: more
    /// connections take more messages per flush (8 starved when the memory workers' index
    /// writes made each flush slower: the chaos run in the README).
    pub db_pool_size: u32,
    /// Postgres connections reading the mailbox for sockets and waiting API requests, apart
    /// from those accepting messages: thousands of sockets catching up (after a restart, say)
    /// wait for these, never in front of a message being accepted.
    pub mailbox_pool_size: u32,
    /// Signs the turn tokens agents call the API with (`turn_token`). Unset: a key generated
    /// once and kept in Postgres (`switchboard.turn_token_secret`), shared by every replica.
    pub turn_token_secret: Secret,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            http_addr: "127.0.0.1:8080".into(),
            public_url: "http://127.0.0.1:8080".into(),
            max_body_bytes: 64 * 1024,
            max_text_chars: 4096,
            header_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
            max_connections: 4_096,
            db_pool_size: 32,
            mailbox_pool_size: 4,
            turn_token_secret: Secret::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct AdminConfig {
    /// Where a worker process serves `/healthz`, `/readyz` and `/metrics`. Port 0 picks a free
    /// port below the ephemeral range (`net::FREE_PORTS`, logged at start); the gateway and `switchboard up` serve them on the gateway port too.
    pub http_addr: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            http_addr: "127.0.0.1:0".into(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct TwilioConfig {
    pub account_sid: String,
    pub auth_token: Secret,
    pub from_number: String,
    /// Used instead of `from_number` when set.
    pub messaging_service_sid: String,
    pub api_base: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct TextMagicConfig {
    pub username: String,
    pub api_key: Secret,
    pub from_number: String,
    pub api_base: String,
    pub webhook_token: Secret,
}

/// The chat WebSocket (`GET /ws/chat`): who may connect is said by a JWT the operator's own
/// login issues.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct ChatConfig {
    /// HS256 shared secret. Exactly one of this and `jwt_public_key` is set to enable chat.
    pub jwt_secret: Secret,
    /// Path to an RS256 public key (PEM).
    pub jwt_public_key: String,
    /// When set, tokens must carry this `iss`.
    pub jwt_issuer: String,
    /// When set, tokens must carry this `aud`.
    pub jwt_audience: String,
    /// Replies a reconnecting client is sent at most, oldest first.
    pub replay_limit: i64,
    /// A socket that has not been heard from (messages or pongs) within this time is closed.
    pub idle_timeout_ms: u64,
    /// How often a socket reads the mailbox itself, for replies whose announcement it missed.
    pub catch_up_ms: u64,
    /// Uploads (`POST /chat/uploads`) are kept this long for a message to name them; older
    /// ones are deleted (a turn that runs later says the file is gone).
    pub upload_retention_s: u64,
    /// Most uploads one message may name.
    pub max_uploads_per_message: usize,
    /// Most bytes of uploads one person may have stored at once (within the retention).
    pub upload_quota_bytes: u64,
}

impl Default for ChatConfig {
    fn default() -> Self {
        Self {
            jwt_secret: Secret::default(),
            jwt_public_key: String::new(),
            jwt_issuer: String::new(),
            jwt_audience: String::new(),
            replay_limit: 200,
            idle_timeout_ms: 120_000,
            catch_up_ms: 5_000,
            upload_retention_s: 86_400,
            max_uploads_per_message: 10,
            upload_quota_bytes: 100 * 1024 * 1024,
        }
    }
}

/// Per-sender rate limit, on every channel, across gateway replicas.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct RateLimitConfig {
    /// Messages one sender (one address on one channel) may send in a minute; 0: no limit.
    /// Over it, a message is not answered: SMS senders are told once a minute (`notice`) and the
    /// message is dead-lettered (stage `gateway`, replayable); chat gets an error frame, the
    /// API 429 with `Retry-After`.
    pub per_sender_per_minute: u32,
    /// What an SMS sender over the limit is told, once a minute.
    pub notice: String,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            per_sender_per_minute: 0,
            notice: "You are sending messages faster than we can answer them. Messages sent in \
                     the next minute will not be answered; please wait a moment."
                .into(),
        }
    }
}

/// The REST API (`/api/v1/…`, API keys made by `switchboard api-keys create`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct ApiConfig {
    /// Longest time `POST /api/v1/messages` with `"wait": true` holds the request for the reply
    /// before answering 202 (kept below `gateway.request_timeout_ms`).
    pub wait_max_ms: u64,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            wait_max_ms: 20_000,
        }
    }
}

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

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct ChannelConfig {
    pub default_agent: String,
    /// `[channels.<channel>.recipients]`: the agent a message written to one of our numbers
    /// goes to (`"+15555550198" = "reggie_fd"`), for a business with a number per agent;
    /// numbers compare by their digits. A message that names its agent (chat, API) keeps it.
    pub recipients: BTreeMap<String, String>,
}

impl ChannelConfig {
    /// The agent for a message written to `recipient`: the one its number is given, else the
    /// channel's default.
    pub fn agent_for(&self, recipient: &str) -> &str {
        let digits = |n: &str| n.chars().filter(char::is_ascii_digit).collect::<String>();
        let wanted = digits(recipient);
        self.recipients
            .iter()
            .find(|(number, _)| !wanted.is_empty() && digits(number) == wanted)
            .map_or(self.default_agent.as_str(), |(_, agent)| agent.as_str())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct AgentConfig {
    /// Engine variant, e.g. `reggie_oc`.
    pub name: String,
    /// Persona shared by the variants, e.g. `reggie`.
    pub identity: String,
    /// `openclaw`, `droid`, ...
    pub engine: String,
    pub runner_url: String,
    #[serde(default)]
    pub token: Secret,
    #[serde(default = "default_agent_timeout")]
    pub timeout_s: u64,
    /// Turns of this agent run at once across one dispatcher.
    #[serde(default = "default_agent_concurrency")]
    pub concurrency: usize,
    /// A message after a gap longer than this starts a fresh engine session (0: never).
    #[serde(default)]
    pub idle_reset_s: u64,
    /// A message after this local time passed since the person's last one starts a fresh
    /// engine session, e.g. `"04:00"` (empty: never).
    #[serde(default)]
    pub daily_reset: String,
    /// The IANA time zone `daily_reset` is read in, e.g. `"Europe/London"`.
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    /// `/new` and `/reset` start a fresh engine session (false: they go to the agent as text).
    #[serde(default = "default_true")]
    pub reset_commands: bool,
    /// What happens to messages that arrive while one of the session's turns runs.
    #[serde(default)]
    pub queue_mode: QueueMode,
    /// Before a reset, run one silent turn asking the agent to write what it must keep into
    /// `memory.md` (its reply is logged, never sent).
    #[serde(default = "default_true")]
    pub memory_flush: bool,
}

/// `[[agents]] queue_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueMode {
    /// Each message is its own turn, in order.
    #[default]
    Followup,
    /// Messages that arrived while a turn ran are joined into the next turn, in order.
    Collect,
    /// A new message cancels the running call at the runner; the next turn carries both.
    Interrupt,
}

impl QueueMode {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueMode::Followup => "followup",
            QueueMode::Collect => "collect",
            QueueMode::Interrupt => "interrupt",
        }
    }

    /// Whether the session's waiting messages are joined into one runner call.
    pub fn joins(self) -> bool {
        self != QueueMode::Followup
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            identity: String::new(),
            engine: String::new(),
            runner_url: String::new(),
            token: Secret::default(),
            timeout_s: default_agent_timeout(),
            concurrency: default_agent_concurrency(),
            idle_reset_s: 0,
            daily_reset: String::new(),
            time_zone: default_time_zone(),
            reset_commands: true,
            queue_mode: QueueMode::Followup,
            memory_flush: true,
        }
    }
}

fn default_agent_timeout() -> u64 {
    120
}
fn default_agent_concurrency() -> usize {
    16
}
fn default_time_zone() -> String {
    "UTC".into()
}
fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct IdentityConfig {
    /// Region used to read phone numbers written without a country code.
    pub default_region: String,
    /// Extra lookups against the operator's own tables, tried in order after the directory.
    pub lookups: Vec<IdentityLookup>,
    /// `[identity.proof]`: links a person proves with a code texted to their phone.
    pub proof: LinkProofConfig,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            default_region: "US".into(),
            lookups: Vec::new(),
            proof: LinkProofConfig::default(),
        }
    }
}

/// "link my phone +61…" in chat (or the API) texts a one-time code to that number; the code
/// texted back from it, or typed where it was asked for, within `code_ttl_s` records the link.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct LinkProofConfig {
    /// Off: the words are passed to the agent like any message.
    pub enabled: bool,
    /// How long a code may be used.
    pub code_ttl_s: u64,
    /// Wrong codes a claim survives; the next one voids it (a new code must be asked for).
    pub max_wrong_codes: u32,
    /// Codes one person may ask for, and one number may be sent, in an hour.
    pub codes_per_hour: u32,
    /// The provider that texts the code (`twilio`, `textmagic`); empty: Twilio when its
    /// account is set, else TextMagic when its account is set.
    pub sms_provider: String,
}

impl Default for LinkProofConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            code_ttl_s: 600,
            max_wrong_codes: 4,
            codes_per_hour: 3,
            sms_provider: String::new(),
        }
    }
}

/// Who sends an SMS Switchboard starts itself: the provider and the number it is sent from
/// (empty when the provider picks it, as a Twilio Messaging Service does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmsSender {
    pub provider: String,
    pub from: String,
}

/// `sql` takes the normalised address as `$1` and returns one row with text columns
/// `person_id`, `name`, `role` (the last two may be NULL).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct IdentityLookup {
    pub person_type: String,
    /// Which contact kinds it applies to (`phone`, `chat_user`, ...).
    #[serde(default = "default_lookup_kind")]
    pub kind: String,
    pub sql: String,
}

fn default_lookup_kind() -> String {
    "phone".into()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct RuntimeConfig {
    /// Messages pulled per request.
    pub batch: usize,
    /// Messages handled at once per stage and process.
    pub concurrency: usize,
    /// How long the server waits for an ack before redelivering. In-flight work sends progress
    /// acks, so this bounds only how soon a dead process's work comes back.
    pub ack_wait_ms: u64,
    /// Deliveries after which a failing message is dead-lettered. Counts handler errors and
    /// crashes (a message whose worker died comes back as a new delivery); waiting does not.
    pub max_deliver: u64,
    /// How long a message may wait (for its predecessor, a lease, another worker) in a
    /// running process before it is dead-lettered as "waited too long". Keep it above the
    /// longest agent `timeout_s`: a turn waits for the call before it.
    pub max_wait_ms: u64,
    /// Retry delay after the first failure; doubles each time up to `retry_max_ms`.
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// How long SIGTERM waits for in-flight work before exiting.
    pub shutdown_grace_ms: u64,
    /// Number of turn partitions (`sb.turn.<n>`).
    pub turn_partitions: u32,
    /// JetStream dedupe window.
    pub duplicate_window_s: u64,
    /// Events stream retention.
    pub events_max_age_days: u64,
    /// Unacked messages a stage's consumer hands out across all its replicas. Must cover the
    /// replicas' combined concurrency (dispatch: turns waiting on runners).
    pub max_ack_pending: i64,
    /// A sender's arrival counter is forgotten after this many idle days; their next message
    /// starts a new epoch.
    pub arrival_counter_idle_days: u64,
    /// Postgres connections per process; 0 means `concurrency`, between 4 and 8. More only
    /// add contention on a small database host (bench, 2 cores: 8 per process ran as fast as
    /// 32 with 40% of Postgres's memory).
    pub db_pool_size: u32,
}

impl RuntimeConfig {
    /// Postgres connections per process: `db_pool_size`, or 0 for `concurrency` between 4
    /// and 8.
    pub fn pool_size(&self) -> u32 {
        match self.db_pool_size {
            0 => (self.concurrency as u32).clamp(4, 8),
            n => n,
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            batch: 64,
            concurrency: 64,
            ack_wait_ms: 30_000,
            max_deliver: 8,
            max_wait_ms: 3_600_000,
            retry_base_ms: 500,
            retry_max_ms: 60_000,
            shutdown_grace_ms: 20_000,
            turn_partitions: 32,
            duplicate_window_s: 600,
            events_max_age_days: 7,
            max_ack_pending: 20_000,
            arrival_counter_idle_days: 7,
            db_pool_size: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct SessionConfig {
    /// What one session (per agent) spans; see [`SessionScope`].
    pub scope: SessionScope,
    /// How often a message waiting for its sender's previous message re-checks while held.
    pub arrival_poll_ms: u64,
    /// How long a waiting message is held in its handler before it goes back to the stream.
    /// Short on purpose: a held message occupies a handler slot, and under a backlog (after a
    /// NATS restart, say) the messages it waits for may be queued behind it.
    pub arrival_hold_ms: u64,
    /// Longest delay before a waiting message that went back to the stream is tried again; the
    /// delay doubles from `arrival_poll_ms` with each try.
    pub arrival_retry_max_ms: u64,
    /// How long a message waits for a missing predecessor at most, counted while the
    /// session stage runs (time it was down does not count); then it takes its turn anyway.
    /// A predecessor is missing for long only when it never got published (a gateway died
    /// between numbering and publishing it and the provider never retried); a crashed worker's
    /// message comes back after `runtime.ack_wait_ms`, so keep this well above that.
    pub arrival_gap_timeout_ms: u64,
    /// What the person is told, ahead of the next reply, when their session started over.
    pub reset_notices: ResetNotices,
}

/// `[session.reset_notices]`: one text per reason a session starts a fresh engine session. A
/// reset is never silent: the next reply starts with its text.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct ResetNotices {
    /// The person sent `/new` or `/reset`.
    pub command: String,
    /// The session had been idle longer than the agent's `idle_reset_s`.
    pub idle: String,
    /// The agent's daily reset time passed.
    pub daily: String,
    /// An operator reset it (sessions API).
    pub api: String,
}

impl Default for ResetNotices {
    fn default() -> Self {
        Self {
            command: "New conversation started.".into(),
            idle: "(We're starting a new conversation: the last one had been quiet for a while.)"
                .into(),
            daily: "(We're starting a new conversation: conversations start fresh each day.)"
                .into(),
            api: "(We're starting a new conversation: this one was reset by an operator.)".into(),
        }
    }
}

impl ResetNotices {
    pub fn for_reason(&self, reason: crate::status::ResetReason) -> &str {
        use crate::status::ResetReason::*;
        match reason {
            Command => &self.command,
            Idle => &self.idle,
            Daily => &self.daily,
            Api => &self.api,
        }
    }
}

/// `[workspace]`: a folder per session on storage the agent hosts mount (`summary.md`,
/// `attachments/`, `exports/`, `context/`), its path sent to the runner with each turn.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct WorkspaceConfig {
    /// Where session folders are made (empty: no workspaces).
    pub root: String,
    /// The engine variants of one identity (`reggie_oc`, `reggie_fd`) share one person's
    /// folder (the first session's); false gives each session its own.
    pub separate_variants: bool,
    /// Media a person sends (MMS) larger than this is not kept in `attachments/`; a chat
    /// upload larger than this is refused (413).
    pub max_attachment_bytes: u64,
}

/// What one session of an agent spans (`session.scope`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SessionScope {
    /// One session per person and agent, whatever the channel (the default): a person who
    /// texts and then chats continues the same conversation.
    #[default]
    Person,
    /// One per person, agent and channel (`sms`, `admin_chat`, …).
    Channel,
    /// One per person, agent, channel and the account they wrote to (our number, say).
    AccountChannel,
    /// One session per agent, shared by everyone who writes to it.
    Main,
}

impl SessionScope {
    /// The readable key of the session a message belongs to, e.g. `reggie_oc:person:staff:17`.
    pub fn key(
        self,
        agent: &str,
        person_type: &str,
        person_id: &str,
        channel: &str,
        account: &str,
    ) -> String {
        match self {
            SessionScope::Person => format!("{agent}:person:{person_type}:{person_id}"),
            SessionScope::Channel => {
                format!("{agent}:channel:{channel}:{person_type}:{person_id}")
            }
            SessionScope::AccountChannel => {
                format!("{agent}:account-channel:{channel}:{account}:{person_type}:{person_id}")
            }
            SessionScope::Main => format!("{agent}:main"),
        }
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            scope: SessionScope::Person,
            arrival_poll_ms: 25,
            arrival_hold_ms: 250,
            arrival_retry_max_ms: 5_000,
            arrival_gap_timeout_ms: 120_000,
            reset_notices: ResetNotices::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct DispatchConfig {
    /// How often a dispatcher checks the sessions its waiting turns wait on (one query for all
    /// of them), for a predecessor finished or a call slot freed by another replica; a cursor
    /// moved by the same process wakes its turns at once.
    pub hold_poll_ms: u64,
    /// A turn waiting for its predecessor is parked (no handler slot held) until its session
    /// moves; it checks again after this long even if nothing woke it.
    pub hold_timeout_ms: u64,
    /// A dispatcher counts as alive (its runner calls keep their sessions' call slots) this
    /// long after its last heartbeat; it heartbeats every third of it. After a dispatcher
    /// dies, its sessions wait at most this long.
    pub liveness_ms: u64,
    /// A runner whose calls failed this many times in a row (unreachable, timed out, 5xx) is
    /// taken as down: its turns wait for it without using up their failure budget.
    pub breaker_failures: u32,
    /// While a runner is down, one call tries it this often (doubling up to
    /// `breaker_probe_max_ms`); the first that succeeds lets the waiting turns run, in order.
    pub breaker_probe_ms: u64,
    pub breaker_probe_max_ms: u64,
    /// What a person whose turn waits for a down runner is told, once per outage.
    pub runner_down_notice: String,
    /// A turn older than this (since its message was received) when it can first run is
    /// stale (0: never): see `stale_turns`.
    pub max_turn_age_s: u64,
    /// What happens to a stale turn: `answer` (run it; the prompt says how old it is) or
    /// `expire` (not run: dead-lettered as expired and the person told).
    pub stale_turns: StaleTurns,
    /// What a person whose message expired is told (`{sent}`: when they sent it).
    pub expired_notice: String,
    /// Most messages one runner call joins (`collect`, `interrupt`); the rest go in the next.
    pub collect_max: usize,
    /// How often each dispatcher looks for a `[[schedules]]` time that has come.
    pub schedule_tick_ms: u64,
    /// A schedule time missed by more than this (every dispatcher was down) is skipped, not
    /// fired late.
    pub schedule_lateness_s: u64,
}

/// `dispatch.stale_turns`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StaleTurns {
    /// Run it, with its age in the prompt.
    #[default]
    Answer,
    /// Do not run it: dead-letter it as expired and tell the person.
    Expire,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            hold_poll_ms: 100,
            hold_timeout_ms: 20_000,
            liveness_ms: 6_000,
            breaker_failures: 3,
            breaker_probe_ms: 1_000,
            breaker_probe_max_ms: 15_000,
            runner_down_notice: "Your message is safe with us: the assistant is briefly \
                                 unavailable and will answer shortly."
                .into(),
            max_turn_age_s: 3_600,
            collect_max: 20,
            schedule_tick_ms: 1_000,
            schedule_lateness_s: 300,
            stale_turns: StaleTurns::Answer,
            expired_notice: "Sorry: your message sent {sent} waited too long while the \
                             assistant was unavailable and was not answered. Please send it \
                             again if it still matters."
                .into(),
        }
    }
}

/// `[[schedules]]`: an input an agent gets on a timetable, for one person or for everyone a
/// directory query names. At each time the cron pattern gives (in `time_zone`), `text` opens a
/// turn of the person's session with `agent`, once across all dispatch replicas, and the
/// agent's reply goes out on the channel the person last wrote on. A heartbeat
/// (`kind = "heartbeat"`) opens one turn for the whole batch instead, answered to `deliver_to`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct ScheduleConfig {
    /// Names the schedule in the log and in its firing record (letters, digits, `-`, `_`).
    pub name: String,
    pub agent: String,
    /// `person` (each person's own turn) or `heartbeat` (one turn for the batch).
    pub kind: ScheduleKind,
    /// A heartbeat's reader: the person (canonical id) its answer is sent to, on the channel
    /// they last wrote on. Only for `kind = "heartbeat"`.
    pub deliver_to: String,
    /// One person, by canonical id (e.g. `staff-7`, `phone:+14155550100`)...
    pub person: String,
    /// ...or a directory query: SQL returning a `person_id` column, e.g.
    /// `SELECT person_id FROM switchboard.people WHERE person_type = 'staff'`. Run read-only.
    pub people: String,
    /// POSIX cron (`minute hour day month weekday`), optionally with seconds first.
    pub cron: String,
    pub time_zone: String,
    /// What the agent is given at that time.
    pub text: String,
}

/// What one firing of a schedule is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// Each target person gets the text as a turn of their own session; each is answered.
    #[default]
    Person,
    /// One turn for the whole batch (the targets listed in one prompt), run in a session of
    /// the schedule's own; the answer goes to `deliver_to`, unless it is `HEARTBEAT_OK`
    /// (nothing to report), which is only logged.
    Heartbeat,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            agent: String::new(),
            kind: ScheduleKind::Person,
            deliver_to: String::new(),
            person: String::new(),
            people: String::new(),
            cron: String::new(),
            time_zone: "UTC".into(),
            text: String::new(),
        }
    }
}

impl ScheduleConfig {
    /// The parsed pattern and zone, or why not.
    pub fn timetable(&self) -> Result<(croner::Cron, chrono_tz::Tz), String> {
        let cron = croner::parser::CronParser::new()
            .parse(&self.cron)
            .map_err(|e| format!("cron {:?}: {e}", self.cron))?;
        let zone = self
            .time_zone
            .trim()
            .parse()
            .map_err(|_| format!("time_zone {:?} is not an IANA time zone", self.time_zone))?;
        Ok((cron, zone))
    }
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        Self {
            root: String::new(),
            separate_variants: false,
            max_attachment_bytes: 10 * 1024 * 1024,
        }
    }
}

/// `[prompt]`: the envelope dispatch builds around each message.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct PromptConfig {
    /// What the agent may do for each person type (`[prompt.authority]`: `user`, `staff`,
    /// `participant`, `external`; another type gets `external`'s).
    pub authority: BTreeMap<String, String>,
    /// The summary is cut to this many characters, with a marker saying so.
    pub max_summary_chars: usize,
    /// The person's message is cut to this many characters, with a marker saying so.
    pub max_message_chars: usize,
}

impl Default for PromptConfig {
    fn default() -> Self {
        let authority = [
            (
                "user",
                "Full: the person's own account and everything they are entitled to; act on their requests.",
            ),
            (
                "staff",
                "Standard: operations within their role; ask before anything irreversible.",
            ),
            (
                "participant",
                "Limited: their own participation only; share nothing about other people.",
            ),
            (
                "external",
                "Minimal: an unverified contact; general information only, nothing about any person or account.",
            ),
            (
                "schedule",
                "Operator's heartbeat: about the people it lists, answered only to the person it reports to.",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Self {
            authority,
            max_summary_chars: 4_000,
            max_message_chars: 8_000,
        }
    }
}

impl PromptConfig {
    /// The authority text for a person type (unknown types get the least: `external`'s).
    pub fn authority_for(&self, person_type: &str) -> &str {
        self.authority
            .get(person_type)
            .or_else(|| self.authority.get("external"))
            .map(String::as_str)
            .unwrap_or("Minimal.")
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct DemoConfig {
    /// `switchboard up` also serves a demo runner (`/demo/runner`) and a demo Twilio outbox
    /// (`/demo/twilio`), so the product can be tried with no external accounts.
    pub enabled: bool,
}

/// Merge `SB_…` variables with their scalar values kept as written. Figment's `Env` reads
/// `SB_TWILIO__FROM_NUMBER=+61400000000` as an integer, which a string field then refuses; here
/// it stays text, and lossy extraction turns text into a number or flag only where a field wants
/// one. Arrays and tables (`SB_X='[1, 2]'`) are still parsed; a quoted value loses its quotes.
fn merge_env_as_text(mut figment: Figment, env: Env) -> Figment {
    use figment::value::Value;
    for (key, raw) in env.iter() {
        let parsed: Value = raw.parse().expect("parsing a Value is infallible");
        let value = match parsed {
            Value::Num(..) | Value::Bool(..) | Value::Char(..) | Value::Empty(..) => {
                Value::from(raw)
            }
            other => other,
        };
        // A `(key path, value)` pair is a provider that nests the value at `a.b.c`.
        figment = figment.merge((key.as_str().to_string(), value));
    }
    figment
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// The provider that texts link codes ([`LinkProofConfig::sms_provider`]), if one is set up.
    pub fn proof_sms_sender(&self) -> Option<SmsSender> {
        let twilio = || {
            let t = &self.twilio;
            (!t.account_sid.is_empty()
                && (!t.from_number.is_empty() || !t.messaging_service_sid.is_empty()))
            .then(|| SmsSender {
                provider: "twilio".into(),
                from: t.from_number.clone(),
            })
        };
        let textmagic = || {
            (!self.textmagic.username.is_empty()).then(|| SmsSender {
                provider: "textmagic".into(),
                from: self.textmagic.from_number.clone(),
            })
        };
        match self.identity.proof.sms_provider.as_str() {
            "" => twilio().or_else(textmagic),
            "twilio" => twilio(),
            "textmagic" => textmagic(),
            _ => None,
        }
    }

    /// The file named by `SB_CONFIG`, else `switchboard.toml` in the working directory (if any),
    /// overridden by `SB_…` variables.
    pub fn load() -> Result<Self, ConfigError> {
        let path = std::env::var_os("SB_CONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("switchboard.toml"));
        Self::load_from(&path)
    }

    pub fn load_from(path: &Path) -> Result<Self, ConfigError> {
        let figment = merge_env_as_text(
            Figment::from(Serialized::defaults(Config::default())).merge(Toml::file(path)),
            Env::prefixed("SB_").split("__").ignore(&["config"]),
        );
        // Lossy: a value the environment gave as text becomes the number or flag a field needs.
        let config: Config = figment.extract_lossy().map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashSet::new();
        for a in &self.agents {
            if a.name.is_empty() || a.identity.is_empty() || a.runner_url.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "agent {:?} needs name, identity and runner_url",
                    a.name
                )));
            }
            crate::lifecycle::ResetPolicy::of(a)
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
            if !seen.insert(a.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "agent {} listed twice",
                    a.name
                )));
            }
        }
        for (channel, c) in &self.channels {
            for (number, agent) in &c.recipients {
                if self.agent(agent).is_none() {
                    return Err(ConfigError::Invalid(format!(
                        "channels.{channel}.recipients: {number} goes to agent {agent:?}, which \
                         is not configured"
                    )));
                }
            }
        }
        for (name, source) in &self.webhooks {
            let invalid = |why: &str| Err(ConfigError::Invalid(format!("webhooks.{name}: {why}")));
            if !valid_source_name(name) {
                return invalid("a source name is 1 to 64 ASCII letters, digits, '-' or '_'");
            }
            for (key, path) in [
                ("sender_field", &source.sender_field),
                ("text_field", &source.text_field),
                ("id_field", &source.id_field),
            ] {
                if path.is_empty() || path.split('.').any(str::is_empty) {
                    return invalid(&format!("{key} must be a dotted path like user.id"));
                }
            }
            if !source.agent.is_empty() && self.agent(&source.agent).is_none() {
                return invalid(&format!("agent {:?} is not configured", source.agent));
            }
            if source.timestamp_window_s == 0 {
                return invalid("timestamp_window_s must be > 0");
            }
            if source.signing_key().is_none() {
                return invalid(&format!(
                    "secret is required (or SB_WEBHOOKS__{}__SECRET)",
                    name.to_ascii_uppercase()
                ));
            }
        }
        let proof = &self.identity.proof;
        if !matches!(proof.sms_provider.as_str(), "" | "twilio" | "textmagic") {
            return Err(ConfigError::Invalid(format!(
                "identity.proof.sms_provider {:?}: twilio, textmagic or empty",
                proof.sms_provider
            )));
        }
        if proof.enabled && (proof.code_ttl_s == 0 || proof.codes_per_hour == 0) {
            return Err(ConfigError::Invalid(
                "identity.proof: code_ttl_s and codes_per_hour must be > 0 (or enabled = false)"
                    .into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for s in &self.schedules {
            let invalid = |why: String| {
                Err(ConfigError::Invalid(format!(
                    "schedules {:?}: {why}",
                    s.name
                )))
            };
            if !valid_source_name(&s.name) || !names.insert(s.name.as_str()) {
                return invalid("each needs a unique name of letters, digits, '-' or '_'".into());
            }
            if self.agent(&s.agent).is_none() {
                return invalid(format!("agent {:?} is not configured", s.agent));
            }
            if s.person.trim().is_empty() == s.people.trim().is_empty() {
                return invalid("give either person or people (a query), not both".into());
            }
            if s.text.trim().is_empty() {
                return invalid("text is empty".into());
            }
            match (s.kind, s.deliver_to.trim().is_empty()) {
                (ScheduleKind::Heartbeat, true) => {
                    return invalid(
                        "a heartbeat needs deliver_to: the person (id) its answer is sent to"
                            .into(),
                    );
                }
                (ScheduleKind::Person, false) => {
                    return invalid(
                        "deliver_to is for kind = \"heartbeat\"; a person schedule answers \
                         each person"
                            .into(),
                    );
                }
                _ => {}
            }
            if let Err(why) = s.timetable() {
                return invalid(why);
            }
        }
        if self.runtime.turn_partitions == 0 {
            return Err(ConfigError::Invalid(
                "runtime.turn_partitions must be > 0".into(),
            ));
        }
        if !(1..=crate::memory_config::MAX_HNSW_EF_SEARCH).contains(&self.embedding.hnsw_ef_search)
        {
            return Err(ConfigError::Invalid(format!(
                "embedding.hnsw_ef_search must be from 1 to {} (pgvector's range)",
                crate::memory_config::MAX_HNSW_EF_SEARCH
            )));
        }
        Ok(())
    }

    /// This configuration for a process serving the gateway: its Postgres pool is
    /// `gateway.db_pool_size` unless `runtime.db_pool_size` is set.
    pub fn for_gateway(mut self) -> Self {
        if self.runtime.db_pool_size == 0 {
            self.runtime.db_pool_size = self.gateway.db_pool_size.max(1);
        }
        self
    }

    pub fn agent(&self, name: &str) -> Option<&AgentConfig> {
        self.agents.iter().find(|a| a.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `toml` over the defaults, validated, as `Config::load` reads a file.
    fn parse(toml: &str) -> Result<Config, ConfigError> {
        let c: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(toml))
            .extract()
            .map_err(|e| ConfigError::Load(Box::new(e)))?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn secrets_are_not_printed_by_debug() {
        let mut c = Config::default();
        c.twilio.auth_token = Secret::new("hunter2");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's test jail API
    fn environment_overrides_nested_keys() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "sb.toml",
                r#"
                nats_url = "nats://file:1"
                [twilio]
                api_base = "http://file"
                [[agents]]
                name = "reggie_oc"
                identity = "reggie"
                engine = "openclaw"
                runner_url = "http://runner"
                "#,
            )?;
            jail.set_env("SB_TWILIO__API_BASE", "http://env");
            jail.set_env("SB_NATS_URL", "nats://env:2");
            // Values that look like numbers, unquoted, into text fields; text into numbers.
            jail.set_env("SB_TWILIO__FROM_NUMBER", "+61400000000");
            jail.set_env("SB_TWILIO__ACCOUNT_SID", "12345");
            jail.set_env("SB_TEXTMAGIC__WEBHOOK_TOKEN", "00731");
            jail.set_env("SB_GATEWAY__MAX_TEXT_CHARS", "99");
            jail.set_env("SB_DEMO__ENABLED", "true");
            jail.set_env("SB_TEXTMAGIC__USERNAME", "\"quoted\"");
            let c = Config::load_from(Path::new("sb.toml")).expect("loads");
            assert_eq!(c.twilio.from_number, "+61400000000");
            assert_eq!(c.twilio.account_sid, "12345");
            assert_eq!(c.textmagic.webhook_token.expose(), "00731");
            assert_eq!(c.gateway.max_text_chars, 99);
            assert!(c.demo.enabled);
            assert_eq!(c.textmagic.username, "quoted");
            assert_eq!(c.twilio.api_base, "http://env");
            assert_eq!(c.nats_url, "nats://env:2");
            assert_eq!(c.agent("reggie_oc").unwrap().timeout_s, 120);
            Ok(())
        });
    }

    #[test]
    fn each_session_scope_gives_a_readable_key() {
        let key =
            |scope: SessionScope| scope.key("reggie_oc", "staff", "17", "sms", "+15555550199");
        assert_eq!(key(SessionScope::Person), "reggie_oc:person:staff:17");
        assert_eq!(key(SessionScope::Channel), "reggie_oc:channel:sms:staff:17");
        assert_eq!(
            key(SessionScope::AccountChannel),
            "reggie_oc:account-channel:sms:+15555550199:staff:17"
        );
        assert_eq!(key(SessionScope::Main), "reggie_oc:main");
        // The same person on two channels (texting, then chatting): one session under `person`,
        // two under `channel` and `account-channel`, one shared by all under `main`.
        let on = |scope: SessionScope, channel| scope.key("reggie_oc", "staff", "17", channel, "");
        assert_eq!(
            on(SessionScope::Person, "sms"),
            on(SessionScope::Person, "admin_chat")
        );
        assert_ne!(
            on(SessionScope::Channel, "sms"),
            on(SessionScope::Channel, "admin_chat")
        );
        assert_ne!(
            on(SessionScope::AccountChannel, "sms"),
            on(SessionScope::AccountChannel, "admin_chat")
        );
        assert_eq!(
            SessionScope::Main.key("reggie_oc", "staff", "17", "sms", ""),
            SessionScope::Main.key("reggie_oc", "external", "phone:+1", "api", "")
        );
        let parsed: SessionConfig =
            serde_json::from_value(serde_json::json!({"scope": "account-channel"})).unwrap();
        assert_eq!(parsed.scope, SessionScope::AccountChannel);
        assert!(
            serde_json::from_value::<SessionConfig>(serde_json::json!({"scope": "nope"})).is_err()
        );
    }

    /// A shipped configuration file: every key in it is one the product reads (a typo there
    /// would be ignored silently), and it loads over the defaults.
    fn load_known_keys_only(relative: &str) -> Config {
        use figment::value::{Dict, Value};
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
        let file: Dict = Figment::from(Toml::file(&example))
            .extract()
            .expect("example parses");
        let known: Dict = Figment::from(Serialized::defaults(Config::default()))
            .extract()
            .expect("defaults serialise");
        fn check(path: &str, file: &Dict, known: &Dict) {
            for (key, value) in file {
                let here = format!("{path}{key}");
                // Maps and lists of the operator's own entries: any names allowed.
                if matches!(
                    key.as_str(),
                    "channels" | "agents" | "lookups" | "stages" | "authority" | "schedules"
                ) {
                    continue;
                }
                // Webhook sources: any names, but each entry's keys are checked.
                if key == "webhooks" {
                    let source: Dict =
                        Figment::from(Serialized::defaults(WebhookSourceConfig::default()))
                            .extract()
                            .expect("defaults serialise");
                    let Value::Dict(_, sources) = value else {
                        panic!("switchboard.toml: webhooks must be a table");
                    };
                    for (name, entry) in sources {
                        let Value::Dict(_, entry) = entry else {
                            panic!("switchboard.toml: webhooks.{name} must be a table");
                        };
                        check(&format!("{here}.{name}."), entry, &source);
                    }
                    continue;
                }
                let Some(k) = known.get(key) else {
                    panic!("unknown key {here}");
                };
                if let (Value::Dict(_, f), Value::Dict(_, k)) = (value, k) {
                    check(&format!("{here}."), f, k);
                }
            }
        }
        check("", &file, &known);
        Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::file(&example))
            .extract()
            .expect("example loads")
    }

    #[test]
    fn the_production_example_runs_no_demo_and_holds_no_secret() {
        let c = load_known_keys_only("../../deploy/switchboard.production.toml");
        assert!(!c.demo.enabled);
        assert!(c.twilio.auth_token.is_empty() && c.textmagic.api_key.is_empty());
        assert!(c.textmagic.webhook_token.is_empty() && c.chat.jwt_secret.is_empty());
        assert!(c.agents.iter().all(|a| a.token.is_empty()));
        assert!(c.nats_url.is_empty() && c.database_url.is_empty());
        assert!(c.api.wait_max_ms < c.gateway.request_timeout_ms);
    }

    #[test]
    fn the_example_configuration_names_only_known_keys() {
        let c = load_known_keys_only("../../switchboard.toml");
        assert_eq!(c.session.arrival_gap_timeout_ms, 120_000);
        assert_eq!(c.dispatch.liveness_ms, 6_000);
        assert!(c.demo.enabled);
        let demo = &c.webhooks["demo"];
        assert!(!demo.secret.is_empty() && !demo.sender_field.is_empty());
    }

    #[test]
    fn a_number_may_be_given_its_own_agent_and_only_a_configured_one() {
        let agent = |name: &str| {
            format!(
                "[[agents]]\nname = \"{name}\"\nidentity = \"reggie\"\nengine = \"openclaw\"\n\
                 runner_url = \"http://r\"\n"
            )
        };
        let agents = agent("reggie_oc") + &agent("reggie_fd");
        let c = parse(&format!(
            "{agents}[channels.sms]\ndefault_agent = \"reggie_oc\"\n\
             [channels.sms.recipients]\n\"+15555550198\" = \"reggie_fd\"\n"
        ))
        .unwrap();
        let sms = &c.channels["sms"];
        assert_eq!(sms.agent_for("15555550198"), "reggie_fd");
        assert_eq!(sms.agent_for("+15555550199"), "reggie_oc");
        assert_eq!(sms.agent_for(""), "reggie_oc");
        assert!(
            parse(&format!(
                "{agents}[channels.sms.recipients]\n\"+15555550198\" = \"nobody\"\n"
            ))
            .is_err(),
            "a number given to an agent that is not configured"
        );
    }

    #[test]
    fn a_webhook_source_needs_a_sender_field_and_gets_the_documented_defaults() {
        let c = parse("[webhooks.shop]\nsecret = \"k\"\nsender_field = \"user.id\"\n").unwrap();
        let shop = &c.webhooks["shop"];
        assert_eq!(
            (shop.text_field.as_str(), shop.id_field.as_str()),
            ("text", "id")
        );
        assert_eq!(shop.timestamp_window_s, 300);
        assert!(shop.agent.is_empty() && shop.callback_url.is_empty());
        assert_eq!(c.channels["webhook"].default_agent, "reggie_oc");
        assert!(
            parse("[webhooks.shop]\nsecret = \"k\"\n").is_err(),
            "sender_field is required"
        );
        for bad in [
            "[webhooks.\"a.b\"]\nsecret = \"k\"\nsender_field = \"u\"\n",
            "[webhooks.shop]\nsecret = \"k\"\nsender_field = \"user.\"\n",
            "[webhooks.shop]\nsecret = \"k\"\nsender_field = \"u\"\nagent = \"nobody\"\n",
            "[webhooks.shop]\nsecret = \"k\"\nsender_field = \"u\"\ntimestamp_window_s = 0\n",
            // Without a secret nothing could be verified or signed.
            "[webhooks.shop]\nsender_field = \"u\"\n",
            // pgvector refuses it at every search.
            "[embedding]\nhnsw_ef_search = 1001\n",
            "[embedding]\nhnsw_ef_search = 0\n",
        ] {
            assert!(matches!(parse(bad), Err(ConfigError::Invalid(_))), "{bad}");
        }
    }
}
