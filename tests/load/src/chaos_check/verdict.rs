//! The verdict: the kinds of broken promise ([`Kind`]) and how each reads, the findings, the
//! doubles, and the tallies per channel, of the outage and of the memory workers.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Kill;
use super::memory::MemoryTally;
use crate::channels::Channel;

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
    ReturnerForgotten,
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
    SharedSummarised,
    MemoryNotCaughtUp,
    MemoryEvidenceUnreadable,
    Takeover,
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
            Kind::ReturnerForgotten => {
                "people back after their summary was written whose prompt carried no memory"
            }
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
            Kind::SharedSummarised => {
                "sessions everyone shares that were summarised (they never are)"
            }
            Kind::MemoryNotCaughtUp => "memory workers that did not catch up after the drain",
            Kind::MemoryEvidenceUnreadable => "memory evidence that could not be read",
            Kind::Takeover => {
                "a takeover that held nothing, let a held message reach the agent, or left the \
                 agent something to answer"
            }
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
/// the provider, or the chat or API client), failed and recorded so without reaching it
/// ([`FailedRecorded`]), lost (accepted, never answered), and doubled (replies delivered more
/// than once, messages answered twice); and how many of its people were told the agent was
/// unavailable (notices, not answers).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ChannelTally {
    pub accepted: u64,
    pub answered: u64,
    /// Replies the ledger recorded failed as the channel promises, which the provider never
    /// took (not lost: the person was never sent it twice nor silently), with their evidence in
    /// [`Verdict::failed_recorded`] (which lists those the provider took before, too).
    #[serde(default)]
    pub failed_recorded: u64,
    pub lost: u64,
    pub doubled: u64,
    /// People told (once each, or a finding) that the agent was unavailable.
    #[serde(default)]
    pub told: u64,
}

/// A reply or notice on a channel whose provider keeps no log to read
/// ([`Channel::keeps_no_log`]), not sent again after its deliverer died mid-send: the ledger
/// recorded it failed, with its reason ([`no_log`](super::no_log)).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FailedRecorded {
    pub channel: Channel,
    /// What it was: the reply to `s<sender>#<index>`, or a person's notice of a turn.
    pub what: String,
    pub reply_id: String,
    /// The ledger's reason.
    pub reason: String,
    /// When the attempt whose outcome was never recorded began.
    pub attempt_started_us: u64,
    /// The deliverer SIGKILLed during that attempt.
    pub killed: Kill,
    /// The provider took the part before its deliverer died: the person has it, once.
    #[serde(default)]
    pub delivered: bool,
    /// The deliver stage's dead letter of it (left by products before 59b4f76, which gave such
    /// a reply up only after the stage's retries).
    #[serde(default)]
    pub dead_letter: Option<u64>,
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
    /// [`waited::PICKUP_GRACE_US`](super::waited::PICKUP_GRACE_US) before the runner was back and which was first called after
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
    /// Replies and notices failed as a channel without a log promises (taken by the provider
    /// before their deliverer died, or not), in the order judged.
    #[serde(default)]
    pub failed_recorded: Vec<FailedRecorded>,
    /// Runner calls of a turn already called before: allowed, and counted, when under the
    /// first call's `Idempotency-Key`, never beside the earlier call, and after a dispatcher
    /// was killed or a server crashed ([`reruns`](super::reruns)).
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

    pub(super) fn add(&mut self, kind: Kind, evidence: String) {
        self.findings
            .entry(kind)
            .or_default()
            .push(Finding { kind, evidence });
    }
}
