//! The chaos run's verdict, as a pure function of what the run recorded.
//!
//! A run collects its [`Evidence`] (what the load generator got accepted on each channel, every
//! call the fake runner received, every SMS the fake Twilio and TextMagic accepted, the chat and
//! API replies in the mailbox table and those their clients got, the database's turns, log rows
//! and delivery ledger, every kill and server crash, the runner's outage and the waits the
//! database recorded for it, the dead letters) and writes it next to its report; [`judge`]
//! turns it into a [`Verdict`], with a tally per channel ([`ChannelTally`]). Keeping the two
//! apart lets the checker itself be tested on recorded evidence: each kind of broken promise
//! must make it fail, with the evidence.
//!
//! A reply names the messages it answers: the fake runner answers `echo: ` and every message
//! its call carried, in the prompt's order (`echo: s1#2` alone, `echo: s1#2 s1#3` for a call
//! that joined two messages under queue mode `collect`). A message is answered by its own
//! reply or by the one reply of the call it was joined into.
//!
//! What fails a run (each a kind of [`Finding`]):
//! - a message the gateway never accepted, an accepted one with no turn or no inbound log row
//!   (or more than one: joined or not, every message keeps its own);
//! - a reply never sent (SMS: not at the fake provider; chat and API: not in the mailbox), a
//!   chat or API reply in the mailbox that its client never got (pushed on the socket, or read
//!   back with `GET /api/v1/messages/<id>`), a reply sent to anyone but the person who wrote or
//!   on another channel than theirs, or naming a message of someone else, a message without
//!   exactly one outbound log row answering it;
//! - a message answered by two different replies (alone and joined, or in two groups);
//! - a runner call (first or repeated) for a turn of a person after a call that carried a
//!   later message of theirs (by the session's turn number or by the person's own order),
//!   unless it is the same turn called again; an SMS (first or re-sent; a mailbox entry, by
//!   `seq`) after a reply answering a later message of the same person;
//! - a joined call whose messages are not in the person's order, a joined call by the
//!   `followup` agent, a joined message whose turn does not record the join
//!   (`turns.joined_into` = the last message's turn, whose row holds the reply), and a run
//!   with `collect` people in which no call joined anything (it proves nothing about collect);
//! - two different turns of one person at the runner at once; a turn called again while an
//!   earlier call of it still ran; a turn called again under another `Idempotency-Key` than
//!   its first call's, or with no dispatcher killed and no NATS or Postgres crash between its
//!   first call and the re-run ([`reruns`]);
//! - a reply delivered twice: an SMS sent again (the provider-log look-up closed the window a
//!   killed deliverer used to leave, so even a re-send the window explains fails; the report
//!   says which were explained: the deliver process that made the previous send, named by its
//!   `User-Agent`, SIGKILLed within its lease of that send and before the re-send, the ledger
//!   never recording the previous send), a reply stored in the mailbox as two entries, a reply
//!   its client was handed twice;
//! - the runner's outage (see below) told someone twice, told someone with nothing waiting,
//!   left someone untold, or made nothing wait;
//! - any dead letter, a dead-letter list that could not be read, a pipeline that did not settle.
//!
//! **The runner's outage, and who must be told.** The fake runner answers 503 for a while,
//! then stops listening (connections refused), then listens again ([`RunnerOutage`]). What the
//! evidence can show, and so what is checked:
//! - *Notices* are what the person got that is not an answer: an SMS whose text is the
//!   configured `dispatch.runner_down_notice`, a chat `notice` frame, an entry of an API
//!   message's `notices`, a mailbox entry of kind `notice`. They are counted apart from
//!   replies: they answer no message, are never "lost" or "doubled" replies, and a reply check
//!   never sees one.
//! - *Waits the product recorded*: the journal's `waiting` entries (one per session and
//!   outage, with the notice's id), written in the transaction that marks the session
//!   waiting. Each must reach its person on their channel: an SMS notice (the fake provider
//!   cannot see reply ids, so: at least one notice SMS to them), the chat notice frame and the
//!   API listing with that notice's id.
//! - *Who could have waited* (the harness's own evidence, independent of the product's
//!   records): a person with a message accepted before the runner was back (plus
//!   [`NOTICE_SLACK_US`]) whose last answered runner call for it began after the outage began
//!   (or which never got one). A notice or recorded wait for anyone else (a message that
//!   arrived after the runner was back, say) is a notice without a waiting turn.
//! - *Who certainly waited at a dispatcher*: a person with a message whose turn a dispatcher
//!   first picked up [`PICKUP_GRACE_US`] or more before the runner was back, and which was
//!   first called after it, must have been told ([`waited`]): the people not told are those
//!   whose turn reached a dispatcher only after the runner was back.
//! - *Who certainly waited*: a person whose call the runner refused with 503 at least
//!   [`NOTICE_GRACE_US`] before it was back (time for the dispatcher's breaker to open and
//!   the turn to wait) must have a recorded wait, so be told. Connections refused leave no
//!   trace at the fake, so people whose turns only met a closed port are held to the
//!   product's record and the "could have waited" bound, not to this one.
//! - *Told once*: per person, at most one notice SMS, one notice frame, one notice id listed
//!   once by the API (a notice is listed under the one message it was told for), one
//!   mailbox notice, one recorded wait; the run has one outage, so one each.
//! - *Turns waited*: messages accepted before the runner was back whose first answered call
//!   began after it was back, and the recorded waits: an outage with none of either proves
//!   nothing, and fails.
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::channels::{Channel, ClientReply};
use super::fakes::{CallRecord, RefusedCall, RunnerOutage, SendRecord};
use super::{parse_answers, parse_text};

mod memory;
mod reruns;
mod waited;

pub use memory::{
    CategoryRow, LoggedMessage, MEMORY_STAGES, MemoryEvidence, MemoryTally, ModelPrompt,
    SummarisedEntry, SummaryRow, VectorRow,
};

pub use waited::PICKUP_GRACE_US;

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
    fn is_notice(&self) -> bool {
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
}

/// A row of the delivery ledger (`switchboard.deliveries`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LedgerRow {
    pub reply_id: String,
    pub status: String,
    /// The provider's ids of the parts the ledger recorded as sent.
    pub provider_message_ids: Vec<String>,
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
}

/// A `waiting` entry of the sessions' journal: the product recorded that a person's turn
/// waited for the runner, and which notice tells them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WaitingRow {
    /// The session's person id (`phone:+1…`, `user:…`, `api:…`).
    pub person: String,
    pub notice_id: String,
    /// The turn that waited.
    pub seq: i64,
    /// When it was written, on the harness's clock (µs).
    pub at_us: u64,
}

/// Everything a chaos run recorded, as plain data (saved as `chaos-evidence.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Evidence {
    /// Messages the load generator gave up on (never accepted).
    pub never_accepted: u64,
    pub accepted: Vec<AcceptedMessage>,
    pub runner_calls: Vec<CallRecord>,
    /// Every SMS the fake Twilio and TextMagic accepted.
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
    /// What the memory workers left, and the prompts' canaries ([`memory`]).
    #[serde(default)]
    pub memory: Option<MemoryEvidence>,
}

/// The kinds of broken promise, in the order the report shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    NeverAccepted,
    NoTurn,
    NoInboundLogRow,
    InboundLoggedTwice,
    ReplyNeverSent,
    ReplyNotReceived,
    ReplyToWrongNumber,
    NoOutboundLogRow,
    OutboundLoggedTwice,
    AnsweredTwice,
    WrongPersonInPrompt,
    RunnerOrder,
    ReplyOrder,
    JoinedOutOfOrder,
    JoinedUnderFollowup,
    JoinNotRecorded,
    NothingJoined,
    OverlappingTurns,
    TurnRunBesideItself,
    RerunUnderAnotherKey,
    RerunUnexplained,
    DoubleOutsideWindow,
    DoubleInWindow,
    StoredTwice,
    ReceivedTwice,
    ToldTwice,
    NoticeNotReceived,
    NoticeWithoutWait,
    WaitNotRecorded,
    NotTold,
    OutageWaitedNothing,
    DeadLetter,
    DeadLettersUnreadable,
    NotSettled,
    ServerDidNotRecover,
    ForeignCanary,
    ModelPromptMixed,
    KeyMixesPeople,
    SummaryOfAnotherPerson,
    NotEmbeddedOnce,
    VectorOfAnotherPerson,
    NotCategorisedOnce,
    LabelWithoutItsMessage,
    CategorisedEventsNotOnce,
    SummaryVersions,
    SummaryCoverage,
    NotSummarised,
    MemoryNotCaughtUp,
    MemoryEvidenceUnreadable,
}

impl Kind {
    pub fn describe(self) -> &'static str {
        match self {
            Kind::NeverAccepted => "messages never accepted by the gateway",
            Kind::NoTurn => "accepted messages with no turn",
            Kind::NoInboundLogRow => "accepted messages with no inbound log row",
            Kind::InboundLoggedTwice => "accepted messages logged inbound more than once",
            Kind::ReplyNeverSent => "accepted messages whose reply was never sent",
            Kind::ReplyNotReceived => "replies in the mailbox their client never got",
            Kind::ReplyToWrongNumber => {
                "replies sent to someone other than the sender, or on another channel"
            }
            Kind::NoOutboundLogRow => "replies with no outbound log row",
            Kind::OutboundLoggedTwice => "replies logged outbound more than once",
            Kind::AnsweredTwice => "messages answered by more than one reply",
            Kind::WrongPersonInPrompt => "runner calls whose prompt names another person",
            Kind::RunnerOrder => "runner calls out of the person's order",
            Kind::ReplyOrder => "replies out of the person's order",
            Kind::JoinedOutOfOrder => "joined calls whose messages are out of the person's order",
            Kind::JoinedUnderFollowup => "calls of a followup agent that joined messages",
            Kind::JoinNotRecorded => "joined messages whose turn does not record the join",
            Kind::NothingJoined => "runs with collect people where no call joined messages",
            Kind::OverlappingTurns => "turns of one person at the runner at once",
            Kind::TurnRunBesideItself => "turns called again while an earlier call of them ran",
            Kind::RerunUnderAnotherKey => {
                "turns called again under another Idempotency-Key than their first call's"
            }
            Kind::RerunUnexplained => {
                "turns called again with no dispatcher killed and no server crash in between"
            }
            Kind::DoubleOutsideWindow => "replies sent again outside the documented window",
            Kind::DoubleInWindow => {
                "replies sent again by a deliverer killed before the ledger recorded the send \
                 (the provider's log should have shown it)"
            }
            Kind::StoredTwice => "replies stored in the mailbox as more than one entry",
            Kind::ReceivedTwice => "replies a client was handed more than once",
            Kind::ToldTwice => "people told more than once that the agent was unavailable",
            Kind::NoticeNotReceived => {
                "people whose wait the product recorded who were not told on their channel"
            }
            Kind::NoticeWithoutWait => {
                "people told the agent was unavailable with no turn waiting on the down runner"
            }
            Kind::WaitNotRecorded => {
                "people whose turn the down runner refused with no wait recorded"
            }
            Kind::NotTold => {
                "people whose turn waited at a dispatcher for the down runner who were never told \
                 on their channel"
            }
            Kind::OutageWaitedNothing => "runner outages during which no turn waited",
            Kind::DeadLetter => "dead letters",
            Kind::DeadLettersUnreadable => "dead-letter list unreadable",
            Kind::NotSettled => "pipeline did not settle",
            Kind::ServerDidNotRecover => "servers that did not come back after a crash",
            Kind::ForeignCanary => "runner prompts carrying another person's canary",
            Kind::ModelPromptMixed => {
                "summary or label model prompts carrying more than one person's canary"
            }
            Kind::KeyMixesPeople => "memory keys holding more than one person's messages",
            Kind::SummaryOfAnotherPerson => "summaries carrying another person's canary",
            Kind::NotEmbeddedOnce => {
                "logged messages without exactly one vector under the configured model"
            }
            Kind::VectorOfAnotherPerson => "vectors filed under another person than their message",
            Kind::NotCategorisedOnce => "exchanges without exactly one label",
            Kind::LabelWithoutItsMessage => {
                "exchanges labelled without the person's message they answer"
            }
            Kind::CategorisedEventsNotOnce => {
                "exchanges announced (exchange.categorised) other than exactly once"
            }
            Kind::SummaryVersions => {
                "memory keys whose journal does not hold summary versions 1..n once each"
            }
            Kind::SummaryCoverage => "summaries that passed a message over or covered one twice",
            Kind::NotSummarised => "memory keys with messages never summarised",
            Kind::MemoryNotCaughtUp => "memory workers that did not catch up after the drain",
            Kind::MemoryEvidenceUnreadable => "memory evidence that could not be read",
        }
    }
}

/// One broken promise, with the evidence for it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finding {
    pub kind: Kind,
    pub evidence: String,
}

/// One reply sent again, and what explains it (if anything).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Double {
    pub text: String,
    pub to: String,
    /// The send before the re-send: when, by which process, with which provider id.
    pub previous_at_us: u64,
    pub previous_pid: Option<u32>,
    pub previous_sid: String,
    pub resent_at_us: u64,
    pub resent_pid: Option<u32>,
    /// The kill of the previous sender between the two sends, if there was one.
    pub explained_by: Option<Kill>,
    /// Whether the ledger holds the previous send's provider id (then nothing explains it).
    pub ledger_recorded_previous: bool,
}

/// One channel's messages: how many were accepted, answered (the reply reached its far end:
/// the provider, or the chat or API client), lost (accepted, never answered), and doubled
/// (replies delivered more than once, messages answered twice); and how many of its people
/// were told the agent was unavailable (notices, not answers).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ChannelTally {
    pub accepted: u64,
    pub answered: u64,
    pub lost: u64,
    pub doubled: u64,
    /// People told (once each, or a finding) that the agent was unavailable.
    #[serde(default)]
    pub told: u64,
}

/// What the runner's outage did: who waited and who was told.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OutageTally {
    /// Seconds from the first 503 to listening again.
    pub down_s: f64,
    /// Calls answered 503 (the connections refused after them leave no trace at the fake).
    pub refused_calls: u64,
    /// Messages accepted before the runner was back whose first answered call came after.
    pub waited_messages: u64,
    /// People with a message open across the outage (could have waited).
    pub people_open: u64,
    /// Waits the product recorded (journal `waiting`, one per session and outage).
    pub waits_recorded: u64,
    /// People who got a notice on their channel.
    pub people_told: u64,
    /// People with a message whose turn a dispatcher picked up at least
    /// [`waited::PICKUP_GRACE_US`] before the runner was back and which was first called after
    /// it (each must be told).
    pub people_waited: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Verdict {
    /// Per channel the run drove.
    pub channels: BTreeMap<Channel, ChannelTally>,
    /// Every finding, by kind.
    pub findings: BTreeMap<Kind, Vec<Finding>>,
    /// Every reply sent more than once (explained or not), in the order of the re-sends.
    pub doubles: Vec<Double>,
    /// Runner calls of a turn already called before: allowed, and counted, when under the
    /// first call's `Idempotency-Key`, never beside the earlier call, and after a dispatcher
    /// was killed or a server crashed ([`reruns`]).
    pub reruns: u64,
    /// What explains each allowed re-run (the kill or the crash), in the order judged.
    #[serde(default)]
    pub rerun_causes: Vec<String>,
    pub runner_calls: u64,
    pub distinct_turns_called: u64,
    pub sends: u64,
    pub distinct_replies_sent: u64,
    /// Distinct runner calls that joined messages (collect), and the messages they joined.
    #[serde(default)]
    pub joined_calls: u64,
    #[serde(default)]
    pub joined_messages: u64,
    /// People talking to the collect agent.
    #[serde(default)]
    pub collect_people: u64,
    #[serde(default)]
    pub outage: Option<OutageTally>,
    /// The memory workers' figures (runs with memory workers).
    #[serde(default)]
    pub memory: Option<MemoryTally>,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }

    pub fn count(&self, kind: Kind) -> usize {
        self.findings.get(&kind).map_or(0, Vec::len)
    }

    /// One line per kind: "<n> <what>".
    pub fn failures(&self) -> Vec<String> {
        self.findings
            .iter()
            .map(|(k, v)| format!("{} {}", v.len(), k.describe()))
            .collect()
    }

    pub fn doubles_in_window(&self) -> usize {
        self.doubles
            .iter()
            .filter(|d| d.explained_by.is_some())
            .count()
    }

    fn add(&mut self, kind: Kind, evidence: String) {
        self.findings
            .entry(kind)
            .or_default()
            .push(Finding { kind, evidence });
    }
}

/// How much later than the sender's death the fake provider may record a request the sender
/// had already put on the wire (measured: up to 33 ms under chaos load).
const SEND_RECORD_LAG_US: u64 = 2_000_000;

/// The deliverer's lease (`switchboard_deliver::DELIVERY_LEASE`): a live sender records its
/// send well within it.
const DELIVERY_LEASE_US: u64 = switchboard_deliver::DELIVERY_LEASE.as_micros() as u64;

/// A message handed in this little after the runner was back may still have met the outage
/// (the gateway publishes it before its 200 reaches the client).
pub const NOTICE_SLACK_US: u64 = 1_000_000;

/// A call refused (503) at least this long before the runner was back leaves the turn time
/// to meet an open breaker and wait (the breaker opens after `dispatch.breaker_failures`
/// down answers; a killed dispatcher's turn is redelivered within `ack_wait`).
pub const NOTICE_GRACE_US: u64 = 5_000_000;

fn secs(us: u64) -> String {
    format!("{:.3}s", us as f64 / 1e6)
}

/// The text of a reply's last message (a joined reply's is the one it is committed at).
fn last_answer(text: &str) -> Option<(usize, u32)> {
    parse_answers(text).and_then(|a| a.last().copied())
}

/// In evidence recorded before turns carried their pickup ([`waited`]): a message whose turn
/// was opened at least this long before the runner was back, and which was first called after
/// it, is taken to have reached a dispatcher while the runner was down, so its person must
/// have been told.
pub const TOLD_GRACE_US: u64 = 5_000_000;

/// Judge a run by its evidence.
pub fn judge(e: &Evidence) -> Verdict {
    let mut v = Verdict {
        runner_calls: e.runner_calls.len() as u64,
        sends: e.sends.len() as u64,
        ..Default::default()
    };

    if e.never_accepted > 0 {
        v.add(
            Kind::NeverAccepted,
            format!(
                "{} messages were never accepted by the gateway",
                e.never_accepted
            ),
        );
    }

    // What was accepted, once per message (the load generator may record a retried accept).
    let mut accepted: Vec<&AcceptedMessage> = Vec::new();
    let mut seen_sids = HashSet::new();
    for a in &e.accepted {
        if seen_sids.insert(a.sid.as_str()) {
            accepted.push(a);
        }
    }
    let channel_of = channels_of(e);
    let collects: HashSet<usize> = e
        .accepted
        .iter()
        .filter(|a| a.collect)
        .map(|a| a.sender)
        .collect();
    v.collect_people = collects.len() as u64;
    let turn_of: HashMap<&str, &TurnRow> = e
        .turns
        .iter()
        .map(|t| (t.provider_message_id.as_str(), t))
        .collect();
    let sid_of: HashMap<(usize, u32), &str> = accepted
        .iter()
        .map(|a| ((a.sender, a.index), a.sid.as_str()))
        .collect();
    let turn_of_key =
        |key: (usize, u32)| -> Option<&TurnRow> { turn_of.get(sid_of.get(&key)?).copied() };
    let seq_of_key = |key: (usize, u32)| -> Option<i64> { Some(turn_of_key(key)?.seq) };
    let ledger: HashMap<&str, &LedgerRow> =
        e.ledger.iter().map(|l| (l.reply_id.as_str(), l)).collect();
    let mut inbound_rows: HashMap<&str, usize> = HashMap::new();
    for id in &e.inbound_logged {
        *inbound_rows.entry(id.as_str()).or_default() += 1;
    }
    // Outbound log rows, by each message they answer.
    let mut outbound_rows: HashMap<String, usize> = HashMap::new();
    for text in &e.outbound_logged {
        for (s, i) in parse_answers(text).unwrap_or_default() {
            *outbound_rows.entry(super::message_text(s, i)).or_default() += 1;
        }
    }
    let is_notice_sms = |s: &SendRecord| !e.notice_text.is_empty() && s.text == e.notice_text;
    // Where each reply arrived, by its whole text (a reply delivered twice has the same).
    let mut sends_of: HashMap<&str, Vec<&SendRecord>> = HashMap::new();
    for s in e.sends.iter().filter(|s| !is_notice_sms(s)) {
        sends_of.entry(s.text.as_str()).or_default().push(s);
    }
    v.distinct_replies_sent = sends_of.len() as u64;
    let mut stored_of: HashMap<&str, Vec<&MailboxRow>> = HashMap::new();
    for m in e.mailbox.iter().filter(|m| !m.is_notice()) {
        stored_of.entry(m.text.as_str()).or_default().push(m);
    }
    let client_replies: Vec<&ClientReply> = e.client_replies.iter().filter(|r| !r.notice).collect();
    // And by each message they answer: the distinct reply texts that answer it.
    let mut sent_for: HashMap<String, Vec<&str>> = HashMap::new();
    for text in sends_of.keys() {
        for (s, i) in parse_answers(text).unwrap_or_default() {
            sent_for
                .entry(super::message_text(s, i))
                .or_default()
                .push(text);
        }
    }
    let mut stored_for: HashMap<String, Vec<&str>> = HashMap::new();
    for text in stored_of.keys() {
        for (s, i) in parse_answers(text).unwrap_or_default() {
            stored_for
                .entry(super::message_text(s, i))
                .or_default()
                .push(text);
        }
    }
    let mut received_for: HashSet<String> = HashSet::new();
    for r in &client_replies {
        for (s, i) in parse_answers(&r.text).unwrap_or_default() {
            received_for.insert(super::message_text(s, i));
        }
    }

    // Every accepted message: a turn, one inbound row, a reply that reached its far end (its
    // own, or the one it was joined into), one outbound row answering it.
    for a in &accepted {
        let text = super::message_text(a.sender, a.index);
        let turn = turn_of.get(a.sid.as_str());
        let status = turn.map_or("missing", |t| t.status.as_str());
        let replies = match a.channel.mailbox_channel() {
            None => sent_for.get(&text),
            Some(_) => stored_for.get(&text),
        };
        let lost = match a.channel.mailbox_channel() {
            None => replies.is_none().then(|| {
                (
                    Kind::ReplyNeverSent,
                    format!("no {} SMS reply", a.channel.name()),
                )
            }),
            Some(_) if replies.is_none() => Some((
                Kind::ReplyNeverSent,
                format!("no {} reply in the mailbox", a.channel.name()),
            )),
            Some(_) => (!received_for.contains(&text)).then(|| {
                (
                    Kind::ReplyNotReceived,
                    format!(
                        "its reply is in the mailbox; the {} client never got it",
                        a.channel.name()
                    ),
                )
            }),
        };
        let tally = v.channels.entry(a.channel).or_default();
        tally.accepted += 1;
        match &lost {
            Some(_) => tally.lost += 1,
            None => tally.answered += 1,
        }
        if let Some(replies) = replies.filter(|r| r.len() > 1) {
            tally.doubled += 1;
            let mut replies = replies.clone();
            replies.sort();
            v.add(
                Kind::AnsweredTwice,
                format!(
                    "{text} ({}) is answered by {} replies: {}",
                    a.sid,
                    replies.len(),
                    replies
                        .iter()
                        .map(|r| format!("{r:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        if let Some((kind, what)) = lost {
            v.add(
                kind,
                format!(
                    "{text} ({}) accepted at {}: {what} (turn {status})",
                    a.sid,
                    secs(a.accepted_us)
                ),
            );
        }
        if turn.is_none() {
            v.add(
                Kind::NoTurn,
                format!(
                    "{text} ({}) accepted at {} has no turn",
                    a.sid,
                    secs(a.accepted_us)
                ),
            );
        }
        match inbound_rows.get(a.sid.as_str()).copied().unwrap_or(0) {
            0 => v.add(
                Kind::NoInboundLogRow,
                format!("{text} ({}) has no inbound log row", a.sid),
            ),
            1 => {}
            n => v.add(
                Kind::InboundLoggedTwice,
                format!("{text} ({}) has {n} inbound log rows", a.sid),
            ),
        }
        if turn.is_some_and(|t| t.status == "done") {
            match outbound_rows.get(&text).copied().unwrap_or(0) {
                0 => v.add(
                    Kind::NoOutboundLogRow,
                    format!("the reply to {text} has no outbound log row"),
                ),
                1 => {}
                n => v.add(
                    Kind::OutboundLoggedTwice,
                    format!("the reply to {text} has {n} outbound log rows"),
                ),
            }
        }
    }

    judge_runner_calls(e, &channel_of, &collects, &mut v);

    // A joined reply is committed at its last message's turn; the others record the join.
    let mut groups: Vec<&str> = sends_of
        .keys()
        .chain(stored_of.keys())
        .copied()
        .filter(|t| parse_answers(t).is_some_and(|a| a.len() > 1))
        .collect();
    groups.sort();
    groups.dedup();
    for text in groups {
        let answers = parse_answers(text).unwrap_or_default();
        let Some(&last) = answers.last() else {
            continue;
        };
        let Some(last_turn) = turn_of_key(last) else {
            continue;
        };
        let mut wrong = Vec::new();
        if last_turn.reply_id.is_none() {
            wrong.push(format!(
                "its last message's turn {} holds no reply",
                last_turn.seq
            ));
        }
        for &key in &answers[..answers.len() - 1] {
            let (s, i) = key;
            match turn_of_key(key) {
                Some(t) if t.joined_into == Some(last_turn.seq) && t.reply_id.is_none() => {}
                Some(t) => wrong.push(format!(
                    "s{s}#{i}'s turn {} says joined into {:?}, reply {:?}",
                    t.seq, t.joined_into, t.reply_id
                )),
                None => {}
            }
        }
        if !wrong.is_empty() {
            v.add(
                Kind::JoinNotRecorded,
                format!("the reply {text:?}: {}", wrong.join("; ")),
            );
        }
    }

    // Every reply delivered, SMS in the order the providers took them, mailbox entries by
    // `seq`: to the sender, on the sender's channel, in the sender's order (re-sends included;
    // a joined reply in the place of its last message).
    let mut stored: Vec<&MailboxRow> = e.mailbox.iter().filter(|m| !m.is_notice()).collect();
    stored.sort_by_key(|m| m.seq);
    let delivered = e
        .sends
        .iter()
        .filter(|s| !is_notice_sms(s))
        .map(|s| Delivered {
            channel: DeliveredOn::Provider(s.channel),
            to: &s.to,
            text: &s.text,
            when: format!("at {}", secs(s.at_us)),
        })
        .chain(stored.iter().map(|m| Delivered {
            channel: DeliveredOn::Mailbox(&m.channel),
            to: &m.address,
            text: &m.text,
            when: format!("as mailbox entry {}", m.seq),
        }));
    let mut per_recipient: HashMap<(DeliveredOn, &str), (u32, i64, &str)> = HashMap::new();
    for d in delivered {
        let Some(answers) = parse_answers(d.text) else {
            v.add(
                Kind::ReplyToWrongNumber,
                format!(
                    "a reply to {} ({}) {} answers no message of the run: {:?}",
                    d.to,
                    d.channel.describe(),
                    d.when,
                    d.text
                ),
            );
            continue;
        };
        let (sender, index) = *answers.last().expect("parse_answers is never empty");
        let channel = channel_of.get(&sender).copied().unwrap_or_default();
        let owner = channel.address(sender);
        let others: Vec<usize> = answers
            .iter()
            .map(|(s, _)| *s)
            .filter(|s| *s != sender)
            .collect();
        if d.to != owner || !d.channel.is(channel) || !others.is_empty() {
            v.add(
                Kind::ReplyToWrongNumber,
                format!(
                    "the reply to {} (from {owner} by {}) went to {} by {} {}{}",
                    d.text,
                    channel.name(),
                    d.to,
                    d.channel.describe(),
                    d.when,
                    if others.is_empty() {
                        String::new()
                    } else {
                        format!("; it answers messages of senders {others:?} too")
                    }
                ),
            );
            continue;
        }
        let seq = seq_of_key((sender, index)).unwrap_or(-1);
        let key = (d.channel, d.to);
        if let Some((max_index, max_seq, max_text)) = per_recipient.get(&key).copied()
            && (index < max_index || (seq >= 0 && seq < max_seq))
        {
            v.add(
                Kind::ReplyOrder,
                format!(
                    "{} got {} (turn {seq}) {} after {max_text} (turn {max_seq})",
                    d.to, d.text, d.when
                ),
            );
        }
        let entry = per_recipient.entry(key).or_insert((index, seq, d.text));
        if (index, seq) > (entry.0, entry.1) {
            *entry = (index, seq, d.text);
        }
    }

    // Every SMS re-send is a double. It is explained (the report says so) only by a kill of
    // the process that made the previous send, between the two sends, with the previous send
    // absent from the ledger; since deliverers look such a send up in the provider's log, even
    // an explained one is a finding.
    for (text, sends) in &sends_of {
        if sends.len() < 2 {
            continue;
        }
        let mut sends = sends.clone();
        sends.sort_by_key(|s| s.at_us);
        let reply_id = last_answer(text)
            .and_then(turn_of_key)
            .and_then(|t| t.reply_id.as_deref());
        let recorded: HashSet<&str> = reply_id
            .and_then(|r| ledger.get(r))
            .map(|l| l.provider_message_ids.iter().map(String::as_str).collect())
            .unwrap_or_default();
        if let Some((sender, _)) = last_answer(text) {
            let channel = channel_of.get(&sender).copied().unwrap_or_default();
            v.channels.entry(channel).or_default().doubled += 1;
        }
        for pair in sends.windows(2) {
            let (prev, next) = (pair[0], pair[1]);
            let ledger_recorded_previous = recorded.contains(prev.sid.as_str());
            // A dead process sends nothing, so a kill of the sender necessarily came after its
            // send; the fake may record the send a little after the kill (the request was on
            // the wire), hence the lag. A kill long after the send explains nothing: alive, the
            // sender would have recorded it within its lease.
            let kill = e
                .kills
                .iter()
                .find(|k| {
                    k.kind == "deliver"
                        && Some(k.pid) == prev.sender_pid
                        && k.at_us + SEND_RECORD_LAG_US >= prev.at_us
                        && k.at_us <= prev.at_us + DELIVERY_LEASE_US
                        && k.at_us < next.at_us
                })
                .filter(|_| !ledger_recorded_previous)
                .cloned();
            let d = Double {
                text: text.to_string(),
                to: next.to.clone(),
                previous_at_us: prev.at_us,
                previous_pid: prev.sender_pid,
                previous_sid: prev.sid.clone(),
                resent_at_us: next.at_us,
                resent_pid: next.sender_pid,
                explained_by: kill,
                ledger_recorded_previous,
            };
            let (kind, why) = match &d.explained_by {
                Some(k) => (
                    Kind::DoubleInWindow,
                    format!(
                        "its sender {} was killed at {} before the ledger recorded it, and the \
                         provider's log was not asked or did not show it",
                        k.target,
                        secs(k.at_us)
                    ),
                ),
                None if ledger_recorded_previous => (
                    Kind::DoubleOutsideWindow,
                    "the ledger had recorded the first send".into(),
                ),
                None => (
                    Kind::DoubleOutsideWindow,
                    "no kill of the first sender in between".into(),
                ),
            };
            v.add(
                kind,
                format!(
                    "the reply to {text} was sent at {} by pid {:?} and again at {} by pid {:?}; {why}",
                    secs(d.previous_at_us),
                    d.previous_pid,
                    secs(d.resent_at_us),
                    d.resent_pid,
                ),
            );
            v.doubles.push(d);
        }
    }
    v.doubles.sort_by_key(|d| d.resent_at_us);

    // A chat or API reply is one mailbox entry (per part) and reaches its client once.
    let mut stored_twice: Vec<(&str, Vec<&MailboxRow>)> = stored_of
        .iter()
        .filter(|(_, rows)| rows.len() > 1)
        .map(|(t, rows)| (*t, rows.clone()))
        .collect();
    stored_twice.sort_by_key(|(_, rows)| rows.iter().map(|r| r.seq).min());
    for (text, rows) in stored_twice {
        let entries: Vec<String> = rows
            .iter()
            .map(|r| format!("#{} (reply {} part {})", r.seq, r.reply_id, r.part))
            .collect();
        if let Some((sender, _)) = last_answer(text) {
            let channel = channel_of.get(&sender).copied().unwrap_or_default();
            v.channels.entry(channel).or_default().doubled += 1;
        }
        v.add(
            Kind::StoredTwice,
            format!(
                "the reply to {text} is in the mailbox {} times: {}",
                rows.len(),
                entries.join(", ")
            ),
        );
    }
    // (An API caller reads each message's status: a joined reply is rightly listed under
    // every message it answers, and must be listed under each once.)
    let mut handed: BTreeMap<(Channel, &str, &str), Vec<&ClientReply>> = BTreeMap::new();
    for r in &client_replies {
        handed
            .entry((r.channel, &r.reply_id, &r.listed_under))
            .or_default()
            .push(r);
    }
    for ((channel, reply_id, _), got) in handed {
        if got.len() > 1 {
            v.channels.entry(channel).or_default().doubled += 1;
            let when: Vec<String> = got
                .iter()
                .map(|r| format!("#{} at {}", r.seq, secs(r.at_us)))
                .collect();
            v.add(
                Kind::ReceivedTwice,
                format!(
                    "the {} client of {} got reply {reply_id} ({}) {} times: {}",
                    channel.name(),
                    channel.address(got[0].sender),
                    got[0].text,
                    got.len(),
                    when.join(", ")
                ),
            );
        }
    }

    judge_notices(e, &accepted, &channel_of, &mut v);

    for d in &e.dead_letters {
        v.add(
            Kind::DeadLetter,
            format!("dead letter #{} from {}: {}", d.seq, d.stage, d.error),
        );
    }
    if let Some(why) = &e.dead_letters_unreadable {
        v.add(
            Kind::DeadLettersUnreadable,
            format!("listing dead letters failed: {why}"),
        );
    }
    if !e.settled {
        v.add(
            Kind::NotSettled,
            "consumers still had pending or unacknowledged messages at the end".into(),
        );
    }
    for c in &e.crashes {
        if !c.recovered {
            v.add(
                Kind::ServerDidNotRecover,
                format!(
                    "{} crashed at {} and did not come back",
                    c.server,
                    secs(c.at_us)
                ),
            );
        }
    }
    memory::judge(e, &mut v);
    v
}

/// Each sender's channel, from what the gateway accepted.
fn channels_of(e: &Evidence) -> HashMap<usize, Channel> {
    e.accepted.iter().map(|a| (a.sender, a.channel)).collect()
}

/// Where a reply was delivered: a provider's send API or the mailbox (by its `channel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DeliveredOn<'a> {
    Provider(Channel),
    Mailbox(&'a str),
}

impl DeliveredOn<'_> {
    fn is(self, channel: Channel) -> bool {
        match self {
            DeliveredOn::Provider(c) => c == channel,
            DeliveredOn::Mailbox(name) => channel.mailbox_channel() == Some(name),
        }
    }

    fn describe(self) -> String {
        match self {
            DeliveredOn::Provider(c) => c.name().to_string(),
            DeliveredOn::Mailbox(name) => format!("the {name} mailbox"),
        }
    }
}

/// One reply delivered, as the order and recipient checks see it.
struct Delivered<'a> {
    channel: DeliveredOn<'a>,
    to: &'a str,
    text: &'a str,
    when: String,
}

/// One runner call as the order checks see it: the person's messages it carried.
struct CallView<'a> {
    call: &'a CallRecord,
    /// (index, text) of every message, in the prompt's order.
    messages: Vec<(u32, &'a str)>,
    /// The turn numbers it spans (the first from the prompt; joined ones follow it).
    seqs: (i64, i64),
}

impl CallView<'_> {
    fn head(&self) -> (u32, &str) {
        self.messages[0]
    }

    fn max_index(&self) -> u32 {
        self.messages.iter().map(|(i, _)| *i).max().unwrap_or(0)
    }
}

/// Order, overlap, joins and identity at the runner, over every call (re-runs included).
fn judge_runner_calls(
    e: &Evidence,
    channel_of: &HashMap<usize, Channel>,
    collects: &HashSet<usize>,
    v: &mut Verdict,
) {
    let mut by_sender: BTreeMap<usize, Vec<&CallRecord>> = BTreeMap::new();
    for c in &e.runner_calls {
        match parse_text(c.messages()[0]) {
            Some((sender, _)) => by_sender.entry(sender).or_default().push(c),
            None => v.add(
                Kind::WrongPersonInPrompt,
                format!(
                    "a runner call at {} carries no message of the run: {:?}",
                    secs(c.start_us),
                    c.text
                ),
            ),
        }
    }
    let mut distinct: HashSet<&str> = HashSet::new();
    let mut groups: HashSet<Vec<&str>> = HashSet::new();
    for (sender, mut calls) in by_sender {
        calls.sort_by_key(|c| c.start_us);
        let person = channel_of
            .get(&sender)
            .copied()
            .unwrap_or_default()
            .person(sender);
        let mut views: Vec<CallView> = Vec::new();
        for c in calls {
            let mut messages = Vec::new();
            for text in c.messages() {
                match parse_text(text) {
                    Some((s, i)) if s == sender => messages.push((i, text)),
                    _ => v.add(
                        Kind::WrongPersonInPrompt,
                        format!(
                            "the call for {} at {} ({person}) also carries {text:?}",
                            c.text,
                            secs(c.start_us)
                        ),
                    ),
                }
            }
            let first = c.seq.unwrap_or(-1);
            let seqs = (first, first + messages.len().max(1) as i64 - 1);
            views.push(CallView {
                call: c,
                messages,
                seqs,
            });
        }
        let mut heads: HashSet<&str> = HashSet::new();
        for (i, cv) in views.iter().enumerate() {
            let c = cv.call;
            let (index, head_text) = cv.head();
            let seq = cv.seqs.0;
            if c.person != person {
                v.add(
                    Kind::WrongPersonInPrompt,
                    format!(
                        "the call for {} at {} names person {:?}, not {person}",
                        c.text,
                        secs(c.start_us),
                        c.person
                    ),
                );
            }
            distinct.extend(cv.messages.iter().map(|(_, t)| *t));
            if !heads.insert(head_text) {
                v.reruns += 1;
                if let Some(first) = views[..i].iter().find(|f| f.head().1 == head_text) {
                    reruns::judge_rerun(e, &person, first.call, c, v);
                }
            }
            if cv.messages.len() > 1 {
                let texts: Vec<&str> = cv.messages.iter().map(|(_, t)| *t).collect();
                if groups.insert(texts.clone()) {
                    v.joined_calls += 1;
                    v.joined_messages += texts.len() as u64;
                }
                if !cv.messages.windows(2).all(|w| w[0].0 < w[1].0) {
                    v.add(
                        Kind::JoinedOutOfOrder,
                        format!(
                            "{person}: the call at {} joins {texts:?}, not in the order sent",
                            secs(c.start_us)
                        ),
                    );
                }
                if !collects.contains(&sender) {
                    v.add(
                        Kind::JoinedUnderFollowup,
                        format!(
                            "{person} talks to a followup agent ({:?}), yet the call at {} \
                             joins {texts:?}",
                            c.agent,
                            secs(c.start_us)
                        ),
                    );
                }
            }
            // A call that carried a later message of the person, before this one (and is
            // not this same turn called again), ran ahead of it.
            if let Some(ahead) = views[..i].iter().find(|earlier| {
                earlier.head().1 != head_text
                    && (earlier.max_index() > index || (seq >= 0 && earlier.seqs.1 > seq))
            }) {
                let ahead_texts: Vec<&str> = ahead.messages.iter().map(|(_, t)| *t).collect();
                v.add(
                    Kind::RunnerOrder,
                    format!(
                        "{person}: {head_text} (turn {seq}) called at {} after {} (turn {}, called {})",
                        secs(c.start_us),
                        ahead_texts.join(" "),
                        ahead.seqs.1,
                        secs(ahead.call.start_us)
                    ),
                );
            }
            // Calls that began earlier and had not ended when this one began.
            for earlier in &views[..i] {
                if earlier.call.end_us.is_none_or(|end| end > c.start_us) {
                    let (kind, what) = if earlier.head().1 == head_text {
                        (Kind::TurnRunBesideItself, "its own earlier call")
                    } else {
                        (Kind::OverlappingTurns, "another turn")
                    };
                    v.add(
                        kind,
                        format!(
                            "{person}: {head_text} began at {} while {what} ({}, begun {}) still ran",
                            secs(c.start_us),
                            earlier.head().1,
                            secs(earlier.call.start_us)
                        ),
                    );
                }
            }
        }
    }
    v.distinct_turns_called = distinct.len() as u64;
    if !collects.is_empty() && v.joined_calls == 0 {
        v.add(
            Kind::NothingJoined,
            format!(
                "{} people talk to the collect agent, yet no runner call joined two messages: \
                 the run shows nothing about collect",
                collects.len()
            ),
        );
    }
}

/// Who was told the runner was down, who could have waited, who certainly waited (see the
/// module's docs).
fn judge_notices(
    e: &Evidence,
    accepted: &[&AcceptedMessage],
    channel_of: &HashMap<usize, Channel>,
    v: &mut Verdict,
) {
    // Everyone's person id and far-end address, back to their sender number.
    let mut by_person: HashMap<String, usize> = HashMap::new();
    let mut by_address: HashMap<(Channel, String), usize> = HashMap::new();
    for (&sender, &channel) in channel_of {
        by_person.insert(channel.person(sender), sender);
        by_address.insert((channel, channel.address(sender)), sender);
    }
    // Notices per sender, by where they came.
    #[derive(Default)]
    struct Told {
        sms: Vec<String>,
        frames: Vec<String>,
        listed: Vec<String>,
        stored: Vec<String>,
    }
    let mut told: BTreeMap<usize, Told> = BTreeMap::new();
    let mut stray = Vec::new();
    for s in &e.sends {
        if e.notice_text.is_empty() || s.text != e.notice_text {
            continue;
        }
        match by_address.get(&(s.channel, s.to.clone())) {
            Some(&sender) => told.entry(sender).or_default().sms.push(format!(
                "{} SMS at {}",
                s.channel.name(),
                secs(s.at_us)
            )),
            None => stray.push(format!("a notice SMS to {} at {}", s.to, secs(s.at_us))),
        }
    }
    for r in e.client_replies.iter().filter(|r| r.notice) {
        let t = told.entry(r.sender).or_default();
        match r.channel {
            Channel::Api => t.listed.push(r.reply_id.clone()),
            _ => t.frames.push(r.reply_id.clone()),
        }
    }
    for m in e.mailbox.iter().filter(|m| m.is_notice()) {
        let channel = Channel::ALL
            .into_iter()
            .find(|c| c.mailbox_channel() == Some(m.channel.as_str()))
            .unwrap_or_default();
        match by_address.get(&(channel, m.address.clone())) {
            Some(&sender) => told
                .entry(sender)
                .or_default()
                .stored
                .push(m.reply_id.clone()),
            None => stray.push(format!(
                "a notice in the {} mailbox for {} (#{})",
                m.channel, m.address, m.seq
            )),
        }
    }
    for s in stray {
        v.add(Kind::NoticeWithoutWait, format!("{s}: nobody of the run"));
    }
    let mut waits: BTreeMap<usize, Vec<&WaitingRow>> = BTreeMap::new();
    for w in &e.waiting {
        match by_person.get(&w.person) {
            Some(&sender) => waits.entry(sender).or_default().push(w),
            None => v.add(
                Kind::NoticeWithoutWait,
                format!(
                    "a wait recorded for {} (turn {}) at {}: nobody of the run",
                    w.person,
                    w.seq,
                    secs(w.at_us)
                ),
            ),
        }
    }

    // Who could have waited: a message open across the outage. Who certainly waited, long
    // enough to be told: a message whose turn was at a dispatcher well before the runner was
    // back, first called after it ([`waited`]).
    let mut must_tell = BTreeMap::new();
    let (open, waited_messages) = match &e.runner_outage {
        Some(o) => {
            // The last answered call of each message, and the first.
            let mut calls_of: HashMap<&str, (u64, u64)> = HashMap::new();
            for c in &e.runner_calls {
                for t in c.messages() {
                    let entry = calls_of.entry(t).or_insert((c.start_us, c.start_us));
                    entry.0 = entry.0.min(c.start_us);
                    entry.1 = entry.1.max(c.start_us);
                }
            }
            let mut open: HashSet<usize> = HashSet::new();
            let mut waited = 0u64;
            for a in accepted {
                if a.accepted_us >= o.back_us + NOTICE_SLACK_US {
                    continue;
                }
                let text = super::message_text(a.sender, a.index);
                let calls = calls_of.get(text.as_str());
                if calls.is_none_or(|(_, last)| *last >= o.unavailable_us) {
                    open.insert(a.sender);
                }
                if calls.is_some_and(|(first, _)| *first >= o.back_us) {
                    waited += 1;
                }
            }
            let first_calls: HashMap<&str, u64> = calls_of
                .iter()
                .map(|(t, (first, _))| (*t, *first))
                .collect();
            must_tell = waited::who_must_be_told(e, accepted, &first_calls, o);
            (open, waited)
        }
        None => (HashSet::new(), 0),
    };

    let mut people_told = 0u64;
    let mut told_people: HashSet<usize> = HashSet::new();
    let senders: HashSet<usize> = told.keys().chain(waits.keys()).copied().collect();
    let mut senders: Vec<usize> = senders.into_iter().collect();
    senders.sort_unstable();
    for sender in senders {
        let channel = channel_of.get(&sender).copied().unwrap_or_default();
        let person = channel.person(sender);
        let t = told.remove(&sender).unwrap_or_default();
        let w = waits.get(&sender).cloned().unwrap_or_default();
        let delivered = match channel {
            Channel::Twilio | Channel::TextMagic => !t.sms.is_empty(),
            Channel::Chat => !t.frames.is_empty(),
            Channel::Api => !t.listed.is_empty(),
        };
        if delivered {
            people_told += 1;
            v.channels.entry(channel).or_default().told += 1;
            told_people.insert(sender);
        }
        let distinct = |ids: &[String]| ids.iter().collect::<HashSet<_>>().len();
        let mut twice = Vec::new();
        if t.sms.len() > 1 {
            twice.push(format!("{} notice SMS ({})", t.sms.len(), t.sms.join(", ")));
        }
        if t.frames.len() > 1 {
            twice.push(format!(
                "{} notice frames ({} notices)",
                t.frames.len(),
                distinct(&t.frames)
            ));
        }
        if t.listed.len() > 1 {
            twice.push(format!(
                "notices listed {} times by the API ({} notices)",
                t.listed.len(),
                distinct(&t.listed)
            ));
        }
        if t.stored.len() > 1 {
            twice.push(format!(
                "{} notices in the mailbox ({} distinct)",
                t.stored.len(),
                distinct(&t.stored)
            ));
        }
        if w.len() > 1 {
            let turns: Vec<String> = w
                .iter()
                .map(|w| format!("turn {} at {}", w.seq, secs(w.at_us)))
                .collect();
            twice.push(format!("{} waits recorded ({})", w.len(), turns.join(", ")));
        }
        if !twice.is_empty() {
            v.add(
                Kind::ToldTwice,
                format!("{person} ({}): {}", channel.name(), twice.join("; ")),
            );
        }
        // Each recorded wait's notice reached them on their channel.
        for wait in &w {
            let got = match channel {
                Channel::Twilio | Channel::TextMagic => !t.sms.is_empty(),
                Channel::Chat => t.frames.contains(&wait.notice_id),
                Channel::Api => t.listed.contains(&wait.notice_id),
            };
            if !got {
                v.add(
                    Kind::NoticeNotReceived,
                    format!(
                        "{person} ({}): the wait of turn {} recorded at {} (notice {}) was never \
                         told on their channel",
                        channel.name(),
                        wait.seq,
                        secs(wait.at_us),
                        wait.notice_id
                    ),
                );
            }
        }
        let any_notice = delivered || !t.stored.is_empty() || !t.frames.is_empty();
        if any_notice && w.is_empty() {
            v.add(
                Kind::NoticeWithoutWait,
                format!(
                    "{person} ({}) was told, and the product recorded no wait of theirs",
                    channel.name()
                ),
            );
        } else if (any_notice || !w.is_empty()) && !open.contains(&sender) {
            v.add(
                Kind::NoticeWithoutWait,
                format!(
                    "{person} ({}) was told or recorded waiting (turn {:?}), with no message \
                     open during the outage",
                    channel.name(),
                    w.first().map(|w| w.seq)
                ),
            );
        }
    }

    let Some(o) = &e.runner_outage else {
        return;
    };
    // Who certainly waited: refused by the runner itself, with time left to wait.
    let mut refused_people: BTreeMap<&str, u64> = BTreeMap::new();
    for r in &e.refused_calls {
        if r.at_us + NOTICE_GRACE_US <= o.back_us {
            refused_people.entry(r.person.as_str()).or_insert(r.at_us);
        }
    }
    for (person, at) in refused_people {
        let sender = by_person.get(person).copied();
        if sender.is_none_or(|s| !waits.contains_key(&s)) {
            v.add(
                Kind::WaitNotRecorded,
                format!(
                    "{person}: the runner refused their turn at {} (back at {}), and no wait \
                     of theirs was recorded",
                    secs(at),
                    secs(o.back_us)
                ),
            );
        }
    }
    waited::judge_not_told(e, &must_tell, &told_people, channel_of, o, v);
    let tally = OutageTally {
        down_s: o.back_us.saturating_sub(o.unavailable_us) as f64 / 1e6,
        refused_calls: e.refused_calls.len() as u64,
        waited_messages,
        people_open: open.len() as u64,
        waits_recorded: e.waiting.len() as u64,
        people_told,
        people_waited: must_tell.len() as u64,
    };
    if tally.waits_recorded == 0 || tally.waited_messages == 0 {
        v.add(
            Kind::OutageWaitedNothing,
            format!(
                "the runner was down {:.1} s from {}: {} waits recorded, {} messages answered \
                 only after it was back",
                tally.down_s,
                secs(o.unavailable_us),
                tally.waits_recorded,
                tally.waited_messages
            ),
        );
    }
    v.outage = Some(tally);
}

#[cfg(test)]
mod joined_tests;
#[cfg(test)]
mod memory_tests;
#[cfg(test)]
mod outage_tests;
#[cfg(test)]
mod tests;
