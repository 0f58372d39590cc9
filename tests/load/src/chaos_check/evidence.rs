//! What a chaos run recorded, as plain data: the [`Evidence`] and its rows (what the load
//! generator got accepted, the fakes' records, the database's rows, the kills and crashes).
use serde::{Deserialize, Serialize};

use super::memory::MemoryEvidence;
use super::secs;
use crate::channels::{Channel, ClientReply};
use crate::observers::{CallRecord, RefusedCall, RunnerOutage, SendRecord};

/// One message the gateway accepted (answered 200).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AcceptedMessage {
    /// The channel it came in on (evidence of Twilio-only runs has none).
    #[serde(default)]
    pub channel: Channel,
    pub sender: usize,
    pub index: u32,
    /// The id the product keeps for it (`turns.provider_message_id`): Twilio's `MessageSid`,
    /// TextMagic's `id`, the key of a chat client id or an API `Idempotency-Key`.
    pub sid: String,
    /// The correlation id the gateway answered with (chat and API).
    #[serde(default)]
    pub correlation_id: String,
    pub accepted_us: u64,
    /// Its sender talks to the `collect` agent.
    #[serde(default)]
    pub collect: bool,
}

/// A row of `switchboard.mailbox`: a chat or API reply (part), stored once per (reply, part).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MailboxRow {
    pub seq: i64,
    pub reply_id: String,
    pub part: i32,
    /// `admin_chat` or `api`.
    pub channel: String,
    /// The chat `sub` or API key owner it is for.
    pub address: String,
    /// The reply less the runner's `echo: ` (so the message text it answers).
    pub text: String,
    /// `reply`, or `notice` (told while a turn waited; not an answer).
    #[serde(default)]
    pub kind: String,
}

impl MailboxRow {
    pub(super) fn is_notice(&self) -> bool {
        self.kind == "notice"
    }
}

/// A row of `switchboard.turns`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TurnRow {
    /// The inbound message's provider id (`MessageSid`).
    pub provider_message_id: String,
    pub status: String,
    pub seq: i64,
    pub reply_id: Option<String>,
    /// The turn whose call answered this one with it (collect): the last of the group.
    #[serde(default)]
    pub joined_into: Option<i64>,
    /// When the session stage opened it (`created_at`), on the harness's clock.
    #[serde(default)]
    pub opened_us: Option<u64>,
    /// When a dispatcher first took it up (`picked_at`: leased the session's call slot for
    /// it), on the harness's clock; `None` if none did (a joined turn, whose call is its
    /// head's).
    #[serde(default)]
    pub picked_us: Option<u64>,
    /// The pid of the dispatcher process that first took it up (`turns.picked_by`'s
    /// `dispatchers.instance`); `None` in evidence recorded before turns carried it.
    #[serde(default)]
    pub picked_by_pid: Option<u32>,
}

/// A row of the delivery ledger (`switchboard.deliveries`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LedgerRow {
    pub reply_id: String,
    pub status: String,
    /// The provider's ids of the parts the ledger recorded as sent.
    pub provider_message_ids: Vec<String>,
    /// Why the last attempt failed (a `failed` reply's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the attempt at a part whose outcome the ledger never recorded began
    /// (`attempt_started_at`), on the harness's clock; `None` when every attempt's outcome is
    /// recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_started_us: Option<u64>,
}

/// A worker process SIGKILLed by the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Kill {
    pub at_us: u64,
    /// The worker kind (`gateway`, `identify`, `session`, `dispatch`, `log`, `deliver`).
    pub kind: String,
    /// `<kind>-<instance>`.
    pub target: String,
    pub pid: u32,
}

/// NATS or Postgres SIGKILLed and brought back by crash recovery.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerCrash {
    pub server: String,
    pub at_us: u64,
    pub back_us: u64,
    pub recovered: bool,
}

impl Kill {
    /// "dispatch-1 killed at 12.017 s", as findings name it.
    pub fn described(&self) -> String {
        format!("{} killed at {}", self.target, secs(self.at_us))
    }
}

impl ServerCrash {
    /// "postgres down from 13.030 s to 31.460 s", as findings name it.
    pub fn described(&self) -> String {
        format!(
            "{} down from {} to {}",
            self.server,
            secs(self.at_us),
            secs(self.back_us)
        )
    }
}

/// A dead letter, in short.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DeadLetterNote {
    pub seq: u64,
    pub stage: String,
    pub error: String,
    /// The reply a deliverer gave up on (the deliver stage's letters carry a `Reply`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_id: Option<String>,
}

/// A `waiting` entry of the sessions' journal: the product recorded that a person's turn
/// waited for the runner, and which notice tells them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WaitingRow {
    /// The person told (`phone:+1…`, `user:…`, `api:…`): the entry's own, else the session's.
    pub person: String,
    pub notice_id: String,
    /// The turn that waited.
    pub seq: i64,
    /// When it was written, on the harness's clock (µs).
    pub at_us: u64,
}

/// What the takeover did, for the verdict.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TakeoverRecord {
    pub sender: usize,
    /// The messages sent after the takeover (`s<sender>#<index>`).
    pub sent_after: Vec<String>,
    /// The messages the product held for the operator, in the session's order.
    pub held: Vec<String>,
    /// What the hand-back said: the agent gets a turn (it should not: everything was answered).
    pub agent_answers: bool,
}

/// Everything a chaos run recorded, as plain data (saved as `chaos-evidence.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Evidence {
    /// Messages the load generator gave up on (never accepted).
    pub never_accepted: u64,
    pub accepted: Vec<AcceptedMessage>,
    pub runner_calls: Vec<CallRecord>,
    /// Every message the providers' fakes accepted (Twilio, TextMagic, Telegram, Slack,
    /// WhatsApp).
    pub sends: Vec<SendRecord>,
    /// Every chat and API reply stored in the mailbox.
    #[serde(default)]
    pub mailbox: Vec<MailboxRow>,
    /// Every chat reply pushed to a client's socket, and every API reply its caller read back.
    #[serde(default)]
    pub client_replies: Vec<ClientReply>,
    pub turns: Vec<TurnRow>,
    /// `external_id` of every inbound log row.
    pub inbound_logged: Vec<String>,
    /// The text of every outbound log row.
    pub outbound_logged: Vec<String>,
    pub ledger: Vec<LedgerRow>,
    pub kills: Vec<Kill>,
    pub crashes: Vec<ServerCrash>,
    pub dead_letters: Vec<DeadLetterNote>,
    /// Why the dead letters could not be listed, if they could not.
    pub dead_letters_unreadable: Option<String>,
    /// Whether every consumer had nothing pending and nothing unacked at the end.
    pub settled: bool,
    /// The runner's outage, if the run had one.
    #[serde(default)]
    pub runner_outage: Option<RunnerOutage>,
    /// Calls the runner answered 503 during its outage.
    #[serde(default)]
    pub refused_calls: Vec<RefusedCall>,
    /// `dispatch.runner_down_notice`: what an SMS notice says.
    #[serde(default)]
    pub notice_text: String,
    /// The journal's `waiting` entries.
    #[serde(default)]
    pub waiting: Vec<WaitingRow>,
    /// What the memory workers left, and the prompts' canaries ([`memory`](super::memory)).
    #[serde(default)]
    pub memory: Option<MemoryEvidence>,
    /// The operator's takeover of one person ([`crate::chaos_takeover`]).
    #[serde(default)]
    pub takeover: Option<TakeoverRecord>,
}

impl Evidence {
    /// A provider's message whose text is the configured `dispatch.runner_down_notice`: a
    /// notice, not a reply.
    pub(super) fn is_notice_sms(&self, s: &SendRecord) -> bool {
        !self.notice_text.is_empty() && s.text == self.notice_text
    }
}
