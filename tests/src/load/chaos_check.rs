//! The chaos run's verdict, as a pure function of what the run recorded.
//!
//! A run collects its [`Evidence`] (what the load generator got accepted on each channel, every
//! call the fake runner received, every SMS the fake Twilio and TextMagic accepted, the chat and
//! API replies in the mailbox table and those their clients got, the database's turns, log rows
//! and delivery ledger, every kill and server crash, the dead letters) and writes it next to its
//! report; [`judge`] turns it into a [`Verdict`], with a tally per channel ([`ChannelTally`]). Keeping the two apart lets the checker itself be
//! tested on recorded evidence: each kind of broken promise must make it fail, with the evidence.
//!
//! What fails a run (each a kind of [`Finding`]):
//! - a message the gateway never accepted, an accepted one with no turn or no inbound log row;
//! - a reply never sent (SMS: not at the fake provider; chat and API: not in the mailbox), a
//!   chat or API reply in the mailbox that its client never got (pushed on the socket, or read
//!   back with `GET /api/v1/messages/<id>`), a reply sent to anyone but the person who wrote or
//!   on another channel than theirs, a reply without exactly one outbound log row;
//! - a runner call (first or repeated) for a turn of a person after a call for a later turn of
//!   theirs, by the session's turn number or by the person's own order; an SMS (first or
//!   re-sent; a mailbox entry, by `seq`) after a later reply of the same person;
//! - two different turns of one person at the runner at once; a turn called again while an
//!   earlier call of it still ran;
//! - a reply delivered twice: an SMS sent again (the provider-log look-up closed the window a
//!   killed deliverer used to leave, so even a re-send the window explains fails; the report
//!   says which were explained: the deliver process that made the previous send, named by its
//!   `User-Agent`, SIGKILLed within its lease of that send and before the re-send, the ledger
//!   never recording the previous send), a reply stored in the mailbox as two entries, a reply
//!   its client was handed twice;
//! - any dead letter, a dead-letter list that could not be read, a pipeline that did not settle.
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::channels::{Channel, ClientReply};
use super::fakes::{CallRecord, SendRecord};
use super::parse_text;

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
}

/// A row of `switchboard.turns`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TurnRow {
    /// The inbound message's provider id (`MessageSid`).
    pub provider_message_id: String,
    pub status: String,
    pub seq: i64,
    pub reply_id: Option<String>,
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

/// A dead letter, in short.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DeadLetterNote {
    pub seq: u64,
    pub stage: String,
    pub error: String,
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
    WrongPersonInPrompt,
    RunnerOrder,
    ReplyOrder,
    OverlappingTurns,
    TurnRunBesideItself,
    DoubleOutsideWindow,
    DoubleInWindow,
    StoredTwice,
    ReceivedTwice,
    DeadLetter,
    DeadLettersUnreadable,
    NotSettled,
    ServerDidNotRecover,
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
            Kind::WrongPersonInPrompt => "runner calls whose prompt names another person",
            Kind::RunnerOrder => "runner calls out of the person's order",
            Kind::ReplyOrder => "replies out of the person's order",
            Kind::OverlappingTurns => "turns of one person at the runner at once",
            Kind::TurnRunBesideItself => "turns called again while an earlier call of them ran",
            Kind::DoubleOutsideWindow => "replies sent again outside the documented window",
            Kind::DoubleInWindow => {
                "replies sent again by a deliverer killed before the ledger recorded the send \
                 (the provider's log should have shown it)"
            }
            Kind::StoredTwice => "replies stored in the mailbox as more than one entry",
            Kind::ReceivedTwice => "replies a client was handed more than once",
            Kind::DeadLetter => "dead letters",
            Kind::DeadLettersUnreadable => "dead-letter list unreadable",
            Kind::NotSettled => "pipeline did not settle",
            Kind::ServerDidNotRecover => "servers that did not come back after a crash",
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
/// (replies delivered more than once).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ChannelTally {
    pub accepted: u64,
    pub answered: u64,
    pub lost: u64,
    pub doubled: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Verdict {
    /// Per channel the run drove.
    pub channels: BTreeMap<Channel, ChannelTally>,
    /// Every finding, by kind.
    pub findings: BTreeMap<Kind, Vec<Finding>>,
    /// Every reply sent more than once (explained or not), in the order of the re-sends.
    pub doubles: Vec<Double>,
    /// Runner calls of a turn already called before (after its dispatcher died): allowed, and
    /// counted, when never beside the earlier call.
    pub reruns: u64,
    pub runner_calls: u64,
    pub distinct_turns_called: u64,
    pub sends: u64,
    pub distinct_replies_sent: u64,
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

fn secs(us: u64) -> String {
    format!("{:.3}s", us as f64 / 1e6)
}

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
    let turn_of: HashMap<&str, &TurnRow> = e
        .turns
        .iter()
        .map(|t| (t.provider_message_id.as_str(), t))
        .collect();
    let sid_of: HashMap<(usize, u32), &str> = accepted
        .iter()
        .map(|a| ((a.sender, a.index), a.sid.as_str()))
        .collect();
    let seq_of_text = |text: &str| -> Option<i64> {
        let key = parse_text(text)?;
        Some(turn_of.get(sid_of.get(&key)?)?.seq)
    };
    let ledger: HashMap<&str, &LedgerRow> =
        e.ledger.iter().map(|l| (l.reply_id.as_str(), l)).collect();
    let mut inbound_rows: HashMap<&str, usize> = HashMap::new();
    for id in &e.inbound_logged {
        *inbound_rows.entry(id.as_str()).or_default() += 1;
    }
    let mut outbound_rows: HashMap<&str, usize> = HashMap::new();
    for text in &e.outbound_logged {
        let t = text.strip_prefix("echo: ").unwrap_or(text);
        *outbound_rows.entry(t).or_default() += 1;
    }
    // Where each reply arrived, by the message text it answers.
    let mut sends_of: HashMap<&str, Vec<&SendRecord>> = HashMap::new();
    for s in &e.sends {
        sends_of.entry(s.text.as_str()).or_default().push(s);
    }
    v.distinct_replies_sent = sends_of.len() as u64;
    let mut stored_of: HashMap<&str, Vec<&MailboxRow>> = HashMap::new();
    for m in &e.mailbox {
        stored_of.entry(m.text.as_str()).or_default().push(m);
    }
    let mut received_of: HashMap<&str, Vec<&ClientReply>> = HashMap::new();
    for r in &e.client_replies {
        received_of.entry(r.text.as_str()).or_default().push(r);
    }

    // Every accepted message: a turn, one inbound row, a reply that reached its far end, one
    // outbound row.
    for a in &accepted {
        let text = super::message_text(a.sender, a.index);
        let turn = turn_of.get(a.sid.as_str());
        let status = turn.map_or("missing", |t| t.status.as_str());
        let lost = match a.channel.mailbox_channel() {
            None => (!sends_of.contains_key(text.as_str())).then(|| {
                (
                    Kind::ReplyNeverSent,
                    format!("no {} SMS reply", a.channel.name()),
                )
            }),
            Some(_) if !stored_of.contains_key(text.as_str()) => Some((
                Kind::ReplyNeverSent,
                format!("no {} reply in the mailbox", a.channel.name()),
            )),
            Some(_) => (!received_of.contains_key(text.as_str())).then(|| {
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
            match outbound_rows.get(text.as_str()).copied().unwrap_or(0) {
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

    judge_runner_calls(e, &channel_of, &mut v);

    // Every reply delivered, SMS in the order the providers took them, mailbox entries by
    // `seq`: to the sender, on the sender's channel, in the sender's order (re-sends included).
    let mut stored: Vec<&MailboxRow> = e.mailbox.iter().collect();
    stored.sort_by_key(|m| m.seq);
    let delivered = e
        .sends
        .iter()
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
        let Some((sender, index)) = parse_text(d.text) else {
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
        let channel = channel_of.get(&sender).copied().unwrap_or_default();
        let owner = channel.address(sender);
        if d.to != owner || !d.channel.is(channel) {
            v.add(
                Kind::ReplyToWrongNumber,
                format!(
                    "the reply to {} (from {owner} by {}) went to {} by {} {}",
                    d.text,
                    channel.name(),
                    d.to,
                    d.channel.describe(),
                    d.when
                ),
            );
            continue;
        }
        let seq = seq_of_text(d.text).unwrap_or(-1);
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
        let reply_id = parse_text(text)
            .and_then(|k| sid_of.get(&k))
            .and_then(|sid| turn_of.get(sid))
            .and_then(|t| t.reply_id.as_deref());
        let recorded: HashSet<&str> = reply_id
            .and_then(|r| ledger.get(r))
            .map(|l| l.provider_message_ids.iter().map(String::as_str).collect())
            .unwrap_or_default();
        if let Some((sender, _)) = parse_text(text) {
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
        if let Some((sender, _)) = parse_text(text) {
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
    let mut handed: BTreeMap<(Channel, &str), Vec<&ClientReply>> = BTreeMap::new();
    for r in &e.client_replies {
        handed.entry((r.channel, &r.reply_id)).or_default().push(r);
    }
    for ((channel, reply_id), got) in handed {
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

/// Order, overlap and identity at the runner, over every call (re-runs included).
fn judge_runner_calls(e: &Evidence, channel_of: &HashMap<usize, Channel>, v: &mut Verdict) {
    let mut by_sender: BTreeMap<usize, Vec<&CallRecord>> = BTreeMap::new();
    for c in &e.runner_calls {
        match parse_text(&c.text) {
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
    let mut distinct = 0u64;
    for (sender, mut calls) in by_sender {
        calls.sort_by_key(|c| c.start_us);
        let person = channel_of
            .get(&sender)
            .copied()
            .unwrap_or_default()
            .person(sender);
        let mut seen: HashSet<&str> = HashSet::new();
        let mut max: Option<(u32, i64, &str)> = None;
        for (i, c) in calls.iter().enumerate() {
            let (_, index) = parse_text(&c.text).expect("grouped by parsed text");
            let seq = c.seq.unwrap_or(-1);
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
            if !seen.insert(c.text.as_str()) {
                v.reruns += 1;
            }
            if let Some((max_index, max_seq, max_text)) = max
                && (index < max_index || seq < max_seq)
            {
                v.add(
                    Kind::RunnerOrder,
                    format!(
                        "{person}: {} (turn {seq}) called at {} after {max_text} (turn {max_seq})",
                        c.text,
                        secs(c.start_us)
                    ),
                );
            }
            if max.is_none_or(|(mi, ms, _)| (index, seq) > (mi, ms)) {
                max = Some((index, seq, c.text.as_str()));
            }
            // Calls that began earlier and had not ended when this one began.
            for earlier in &calls[..i] {
                if earlier.end_us.is_none_or(|end| end > c.start_us) {
                    let (kind, what) = if earlier.text == c.text {
                        (Kind::TurnRunBesideItself, "its own earlier call")
                    } else {
                        (Kind::OverlappingTurns, "another turn")
                    };
                    v.add(
                        kind,
                        format!(
                            "{person}: {} began at {} while {what} ({}, begun {}) still ran",
                            c.text,
                            secs(c.start_us),
                            earlier.text,
                            secs(earlier.start_us)
                        ),
                    );
                }
            }
        }
        distinct += seen.len() as u64;
    }
    v.distinct_turns_called = distinct;
}

#[cfg(test)]
mod tests {
    //! Each broken promise, recorded as a run would record it, must fail the verdict with its
    //! evidence; a clean run, with the re-runs a killed dispatcher allows, passes.
    use super::*;
    use crate::load::{message_text, sender_phone};

    const DELIVER_PID: u32 = 4242;

    /// The people of [`clean_run`], by sender number: two on Twilio, one on each other channel.
    const PEOPLE: [Channel; 5] = [
        Channel::Twilio,
        Channel::Twilio,
        Channel::TextMagic,
        Channel::Chat,
        Channel::Api,
    ];

    /// A clean run: five people, two messages each, each answered once, in order (senders 0
    /// and 1 on Twilio come first, so `sends[0..4]` and `ledger[0..4]` are theirs).
    fn clean_run() -> Evidence {
        let mut e = Evidence {
            settled: true,
            ..Default::default()
        };
        let mut t = 1_000_000;
        for (sender, channel) in PEOPLE.into_iter().enumerate() {
            for index in 0..2u32 {
                let text = message_text(sender, index);
                let sid = format!("SM{sender}x{index}");
                let reply_id = format!("reply-{sender}-{index}");
                let provider_sid = format!("SMout{sender}x{index}");
                e.accepted.push(AcceptedMessage {
                    channel,
                    sender,
                    index,
                    sid: sid.clone(),
                    correlation_id: String::new(),
                    accepted_us: t,
                });
                e.turns.push(TurnRow {
                    provider_message_id: sid.clone(),
                    status: "done".into(),
                    seq: index as i64 + 1,
                    reply_id: Some(reply_id.clone()),
                });
                e.inbound_logged.push(sid.clone());
                e.runner_calls.push(CallRecord {
                    start_us: t + 1_000,
                    end_us: Some(t + 21_000),
                    person: channel.person(sender),
                    text: text.clone(),
                    seq: Some(index as i64 + 1),
                    idempotency_key: format!("turn-{sender}-{index}"),
                });
                e.outbound_logged.push(format!("echo: {text}"));
                match channel.mailbox_channel() {
                    None => e.sends.push(SendRecord {
                        channel,
                        at_us: t + 30_000,
                        to: channel.address(sender),
                        text: text.clone(),
                        sid: provider_sid.clone(),
                        sender_pid: Some(DELIVER_PID),
                    }),
                    Some(mailbox) => {
                        let seq = e.mailbox.len() as i64 + 1;
                        e.mailbox.push(MailboxRow {
                            seq,
                            reply_id: reply_id.clone(),
                            part: 0,
                            channel: mailbox.into(),
                            address: channel.address(sender),
                            text: text.clone(),
                        });
                        e.client_replies.push(ClientReply {
                            channel,
                            sender,
                            seq,
                            reply_id: reply_id.clone(),
                            text: text.clone(),
                            at_us: t + 40_000,
                        });
                    }
                }
                e.ledger.push(LedgerRow {
                    reply_id,
                    status: "sent".into(),
                    provider_message_ids: vec![provider_sid],
                });
                t += 100_000;
            }
        }
        e
    }

    fn only_kind(v: &Verdict, kind: Kind) -> Finding {
        assert!(!v.passed(), "the verdict must fail");
        assert_eq!(
            v.findings.keys().copied().collect::<Vec<_>>(),
            vec![kind],
            "only {kind:?} is wrong here: {:?}",
            v.failures()
        );
        v.findings[&kind][0].clone()
    }

    /// `pid`, a deliverer, SIGKILLed at `at_us`.
    fn kill_deliverer(kills: &mut Vec<Kill>, at_us: u64, pid: u32) {
        kills.push(Kill {
            at_us,
            kind: "deliver".into(),
            target: format!("deliver-{pid}"),
            pid,
        });
    }

    /// The second send of s1#1, `after` µs after the first, by process `pid`.
    fn resend(e: &mut Evidence, after: u64, pid: u32) {
        let first = e.sends.iter().find(|s| s.text == "s1#1").unwrap().clone();
        e.sends.push(SendRecord {
            at_us: first.at_us + after,
            sid: "SMresent".into(),
            sender_pid: Some(pid),
            ..first
        });
    }

    #[test]
    fn a_clean_run_passes_with_every_channel_answered() {
        let v = judge(&clean_run());
        assert!(v.passed(), "{:?}", v.failures());
        assert_eq!(v.distinct_turns_called, 10);
        assert_eq!(v.distinct_replies_sent, 6, "Twilio's 4 and TextMagic's 2");
        let answered = |accepted| ChannelTally {
            accepted,
            answered: accepted,
            lost: 0,
            doubled: 0,
        };
        assert_eq!(v.channels[&Channel::Twilio], answered(4));
        for c in [Channel::TextMagic, Channel::Chat, Channel::Api] {
            assert_eq!(v.channels[&c], answered(2), "{c:?}");
        }
    }

    #[test]
    fn a_double_with_no_kill_to_explain_it_fails() {
        let mut e = clean_run();
        // The ledger never recorded the first send, but nothing explains why.
        e.ledger[3].provider_message_ids = vec!["SMresent".into()];
        resend(&mut e, 20_000_000, DELIVER_PID + 1);
        // A deliverer was killed between the sends, but not the one that sent first.
        kill_deliverer(&mut e.kills, e.sends[3].at_us + 1_000, DELIVER_PID + 1);
        let v = judge(&e);
        let f = only_kind(&v, Kind::DoubleOutsideWindow);
        assert!(f.evidence.contains("s1#1"), "{}", f.evidence);
        assert!(f.evidence.contains("no kill of the first sender"));
        assert_eq!(v.doubles.len(), 1, "every double is listed");
    }

    #[test]
    fn a_double_after_the_ledger_recorded_the_send_fails_even_with_a_kill() {
        let mut e = clean_run();
        resend(&mut e, 20_000_000, DELIVER_PID + 1);
        kill_deliverer(&mut e.kills, e.sends[3].at_us + 1_000, DELIVER_PID);
        let v = judge(&e);
        let f = only_kind(&v, Kind::DoubleOutsideWindow);
        assert!(
            f.evidence
                .contains("the ledger had recorded the first send")
        );
    }

    #[test]
    fn a_double_whose_sender_was_killed_before_the_ledger_recorded_it_is_explained_and_fails() {
        let mut e = clean_run();
        // The ledger never recorded the first send; its sender was killed right after it.
        let first_sid = e.sends[3].sid.clone();
        e.ledger[3].provider_message_ids = vec!["SMresent".into()];
        assert_ne!(first_sid, "SMresent");
        resend(&mut e, 46_000_000, DELIVER_PID + 1);
        kill_deliverer(&mut e.kills, e.sends[3].at_us + 500, DELIVER_PID);
        let v = judge(&e);
        // The provider's log says the first send went out: the re-send is still a double.
        let f = only_kind(&v, Kind::DoubleInWindow);
        assert!(f.evidence.contains("s1#1"), "{}", f.evidence);
        assert_eq!(v.doubles_in_window(), 1);
        assert_eq!(
            v.doubles[0].explained_by.as_ref().map(|k| k.pid),
            Some(DELIVER_PID)
        );
        assert_eq!(v.channels[&Channel::Twilio].doubled, 1);
        assert_eq!(v.channels[&Channel::Twilio].lost, 0);
    }

    #[test]
    fn a_send_recorded_just_after_its_senders_kill_is_in_the_window() {
        // The request was on the wire when the process died; the fake recorded it 30 ms later.
        let mut e = clean_run();
        e.ledger[3].provider_message_ids = vec!["SMresent".into()];
        resend(&mut e, 46_000_000, DELIVER_PID + 1);
        kill_deliverer(&mut e.kills, e.sends[3].at_us - 30_000, DELIVER_PID);
        let v = judge(&e);
        only_kind(&v, Kind::DoubleInWindow);
        assert_eq!(v.doubles_in_window(), 1);
    }

    #[test]
    fn a_textmagic_reply_sent_twice_is_a_textmagic_double() {
        let mut e = clean_run();
        // The person's last reply, so the re-send is out of no order.
        let mut again = e.sends.iter().find(|s| s.text == "s2#1").unwrap().clone();
        assert_eq!(again.channel, Channel::TextMagic);
        again.at_us += 3_000_000;
        again.sid = "60000099".into();
        e.sends.push(again);
        let v = judge(&e);
        let f = only_kind(&v, Kind::DoubleOutsideWindow);
        assert!(f.evidence.contains("s2#1"), "{}", f.evidence);
        assert_eq!(v.channels[&Channel::TextMagic].doubled, 1);
        assert_eq!(v.channels[&Channel::Twilio].doubled, 0);
    }

    #[test]
    fn a_chat_or_api_reply_missing_from_the_mailbox_is_lost() {
        for (channel, text) in [(Channel::Chat, "s3#1"), (Channel::Api, "s4#0")] {
            let mut e = clean_run();
            e.mailbox.retain(|m| m.text != text);
            e.client_replies.retain(|r| r.text != text);
            let v = judge(&e);
            let f = only_kind(&v, Kind::ReplyNeverSent);
            assert!(
                f.evidence.contains(text) && f.evidence.contains("mailbox"),
                "{}",
                f.evidence
            );
            assert_eq!(v.channels[&channel].lost, 1, "{channel:?}");
            assert_eq!(v.channels[&channel].answered, 1, "{channel:?}");
        }
    }

    #[test]
    fn a_reply_in_the_mailbox_its_client_never_got_is_lost() {
        let mut e = clean_run();
        e.client_replies.retain(|r| r.text != "s3#0");
        let v = judge(&e);
        let f = only_kind(&v, Kind::ReplyNotReceived);
        assert!(
            f.evidence.contains("s3#0") && f.evidence.contains("chat"),
            "{}",
            f.evidence
        );
        assert_eq!(v.channels[&Channel::Chat].lost, 1);
    }

    #[test]
    fn one_reply_stored_as_two_mailbox_entries_is_a_double() {
        let mut e = clean_run();
        let mut again = e.mailbox.iter().find(|m| m.text == "s4#1").unwrap().clone();
        again.seq = 99;
        again.reply_id = "reply-again".into();
        e.mailbox.push(again);
        let v = judge(&e);
        let f = only_kind(&v, Kind::StoredTwice);
        assert!(
            f.evidence.contains("s4#1") && f.evidence.contains("#99"),
            "{}",
            f.evidence
        );
        assert_eq!(v.channels[&Channel::Api].doubled, 1);
    }

    #[test]
    fn a_reply_pushed_twice_to_a_chat_client_is_a_double() {
        let mut e = clean_run();
        let mut again = e
            .client_replies
            .iter()
            .find(|r| r.text == "s3#0")
            .unwrap()
            .clone();
        again.at_us += 5_000_000;
        e.client_replies.push(again);
        let v = judge(&e);
        let f = only_kind(&v, Kind::ReceivedTwice);
        assert!(f.evidence.contains("load-3"), "{}", f.evidence);
        assert_eq!(v.channels[&Channel::Chat].doubled, 1);
    }

    #[test]
    fn a_reply_on_another_channel_or_to_another_client_fails() {
        let mut e = clean_run();
        // The chat person's reply went out by SMS.
        let chat = e.mailbox.iter().position(|m| m.text == "s3#0").unwrap();
        let row = e.mailbox.remove(chat);
        e.sends.push(SendRecord {
            channel: Channel::Twilio,
            at_us: 9_000_000,
            to: sender_phone(3),
            text: row.text,
            sid: "SMwrong".into(),
            sender_pid: Some(DELIVER_PID),
        });
        // The API person's reply was stored for someone else.
        e.mailbox
            .iter_mut()
            .find(|m| m.text == "s4#1")
            .unwrap()
            .address = "load-9".into();
        let v = judge(&e);
        assert_eq!(v.count(Kind::ReplyToWrongNumber), 2, "{:?}", v.findings);
        assert_eq!(
            v.count(Kind::ReplyNeverSent),
            1,
            "s3#0 is not in the mailbox"
        );
        assert!(
            v.findings[&Kind::ReplyToWrongNumber]
                .iter()
                .any(|f| f.evidence.contains("load-9"))
        );
    }

    #[test]
    fn mailbox_entries_out_of_the_persons_order_fail() {
        let mut e = clean_run();
        for m in e.mailbox.iter_mut().filter(|m| m.address == "load-3") {
            m.seq = 100 - m.seq;
        }
        let f = only_kind(&judge(&e), Kind::ReplyOrder);
        assert!(
            f.evidence.contains("s3#0") && f.evidence.contains("after s3#1"),
            "{}",
            f.evidence
        );
    }

    #[test]
    fn a_kill_long_after_the_send_explains_nothing() {
        // The sender lived on past its lease without recording the send: that is a bug.
        let mut e = clean_run();
        e.ledger[3].provider_message_ids = vec!["SMresent".into()];
        resend(&mut e, 120_000_000, DELIVER_PID + 1);
        kill_deliverer(&mut e.kills, e.sends[3].at_us + 60_000_000, DELIVER_PID);
        only_kind(&judge(&e), Kind::DoubleOutsideWindow);
    }

    #[test]
    fn a_kill_after_the_resend_explains_nothing() {
        let mut e = clean_run();
        e.ledger[3].provider_message_ids = vec!["SMresent".into()];
        resend(&mut e, 1_000_000, DELIVER_PID);
        kill_deliverer(&mut e.kills, e.sends[3].at_us + 2_000_000, DELIVER_PID);
        only_kind(&judge(&e), Kind::DoubleOutsideWindow);
    }

    #[test]
    fn a_reply_to_a_wrong_number_fails() {
        let mut e = clean_run();
        e.sends[1].to = sender_phone(1);
        let v = judge(&e);
        let f = only_kind(&v, Kind::ReplyToWrongNumber);
        assert!(f.evidence.contains("s0#1"), "{}", f.evidence);
        assert!(f.evidence.contains(&sender_phone(1)), "{}", f.evidence);
    }

    #[test]
    fn an_out_of_order_resend_fails() {
        let mut e = clean_run();
        // s0#0 is sent again after s0#1 went out (its sender was killed: the double is in the
        // window, and wrong anyway; so is the order).
        e.ledger[0].provider_message_ids = vec![];
        let mut again = e.sends[0].clone();
        again.at_us = e.sends[1].at_us + 1_000;
        again.sid = "SMagain".into();
        e.sends.push(again);
        kill_deliverer(&mut e.kills, e.sends[0].at_us + 10, DELIVER_PID);
        let mut v = judge(&e);
        assert_eq!(v.count(Kind::DoubleInWindow), 1);
        v.findings.remove(&Kind::DoubleInWindow);
        let f = only_kind(&v, Kind::ReplyOrder);
        assert!(
            f.evidence.contains("s0#0") && f.evidence.contains("after s0#1"),
            "{}",
            f.evidence
        );
    }

    #[test]
    fn an_out_of_order_runner_rerun_fails() {
        let mut e = clean_run();
        let mut again = e.runner_calls[0].clone();
        again.start_us = e.runner_calls[1].end_us.unwrap() + 1_000;
        again.end_us = Some(again.start_us + 20_000);
        e.runner_calls.push(again);
        let v = judge(&e);
        let f = only_kind(&v, Kind::RunnerOrder);
        assert!(f.evidence.contains("s0#0"), "{}", f.evidence);
        assert_eq!(v.reruns, 1);
    }

    #[test]
    fn a_rerun_in_order_and_not_beside_the_first_call_passes() {
        let mut e = clean_run();
        let mut again = e.runner_calls[0].clone();
        again.start_us = e.runner_calls[0].end_us.unwrap() + 6_000_000;
        again.end_us = Some(again.start_us + 20_000);
        // The next turn starts after the re-run.
        e.runner_calls[1].start_us = again.end_us.unwrap() + 1_000;
        e.runner_calls[1].end_us = Some(e.runner_calls[1].start_us + 20_000);
        e.runner_calls.push(again);
        let v = judge(&e);
        assert!(v.passed(), "{:?}", v.failures());
        assert_eq!(v.reruns, 1);
    }

    #[test]
    fn two_turns_of_one_person_at_once_fail() {
        let mut e = clean_run();
        e.runner_calls[1].start_us = e.runner_calls[0].start_us + 5_000;
        let f = only_kind(&judge(&e), Kind::OverlappingTurns);
        assert!(f.evidence.contains("s0#1") && f.evidence.contains("s0#0"));
    }

    #[test]
    fn a_turn_called_beside_its_own_running_call_fails() {
        let mut e = clean_run();
        let mut again = e.runner_calls[0].clone();
        again.start_us += 5_000;
        e.runner_calls.push(again);
        only_kind(&judge(&e), Kind::TurnRunBesideItself);
    }

    #[test]
    fn a_reply_never_sent_fails() {
        let mut e = clean_run();
        e.sends.retain(|s| s.text != "s1#0");
        let f = only_kind(&judge(&e), Kind::ReplyNeverSent);
        assert!(f.evidence.contains("s1#0") && f.evidence.contains("turn done"));
    }

    #[test]
    fn a_message_with_no_turn_fails_twice_over() {
        let mut e = clean_run();
        e.turns.retain(|t| t.provider_message_id != "SM0x1");
        e.sends.retain(|s| s.text != "s0#1");
        e.outbound_logged.retain(|t| t != "echo: s0#1");
        let v = judge(&e);
        assert_eq!(v.count(Kind::NoTurn), 1);
        assert_eq!(v.count(Kind::ReplyNeverSent), 1);
        assert!(
            v.findings[&Kind::ReplyNeverSent][0]
                .evidence
                .contains("turn missing")
        );
    }

    #[test]
    fn missing_and_doubled_log_rows_fail_per_message() {
        let mut e = clean_run();
        e.outbound_logged.retain(|t| t != "echo: s1#1");
        e.outbound_logged.push("echo: s0#0".into());
        e.inbound_logged.retain(|id| id != "SM1x0");
        let v = judge(&e);
        assert_eq!(v.count(Kind::NoOutboundLogRow), 1);
        assert_eq!(v.count(Kind::OutboundLoggedTwice), 1);
        assert_eq!(v.count(Kind::NoInboundLogRow), 1);
        assert!(
            v.findings[&Kind::NoOutboundLogRow][0]
                .evidence
                .contains("s1#1")
        );
        assert!(
            v.findings[&Kind::OutboundLoggedTwice][0]
                .evidence
                .contains("s0#0")
        );
    }

    #[test]
    fn an_unsettled_pipeline_fails() {
        let mut e = clean_run();
        e.settled = false;
        only_kind(&judge(&e), Kind::NotSettled);
    }

    #[test]
    fn a_dead_letter_fails_with_its_reason() {
        let mut e = clean_run();
        e.dead_letters = vec![DeadLetterNote {
            seq: 7,
            stage: "dispatch".into(),
            error: "gave up after 5 deliveries: runner down".into(),
        }];
        let f = only_kind(&judge(&e), Kind::DeadLetter);
        assert!(f.evidence.contains("#7") && f.evidence.contains("runner down"));
    }

    #[test]
    fn an_unreadable_dead_letter_list_fails() {
        let mut e = clean_run();
        e.dead_letters_unreadable = Some("stream not found".into());
        only_kind(&judge(&e), Kind::DeadLettersUnreadable);
    }

    #[test]
    fn a_chat_prompt_must_name_the_chat_user() {
        let mut e = clean_run();
        let call = e
            .runner_calls
            .iter_mut()
            .find(|c| c.text == "s3#1")
            .unwrap();
        // The same sender number as a phone is someone else.
        call.person = Channel::Twilio.person(3);
        let f = only_kind(&judge(&e), Kind::WrongPersonInPrompt);
        assert!(f.evidence.contains("user:load-3"), "{}", f.evidence);
    }

    #[test]
    fn a_prompt_naming_another_person_fails() {
        let mut e = clean_run();
        e.runner_calls[2].person = Channel::Twilio.person(0);
        let f = only_kind(&judge(&e), Kind::WrongPersonInPrompt);
        assert!(f.evidence.contains("s1#0"));
    }

    #[test]
    fn a_server_that_did_not_come_back_fails() {
        let mut e = clean_run();
        e.crashes.push(ServerCrash {
            server: "pg".into(),
            at_us: 1,
            back_us: 2,
            recovered: false,
        });
        only_kind(&judge(&e), Kind::ServerDidNotRecover);
    }

    #[test]
    fn evidence_survives_a_round_trip_through_its_file() {
        let mut e = clean_run();
        e.dead_letters_unreadable = Some("unreadable".into());
        let back: Evidence = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(judge(&back).failures(), judge(&e).failures());
    }

    #[test]
    fn the_user_agent_names_the_sending_process() {
        let ua = switchboard_channels::user_agent();
        assert_eq!(
            crate::load::fakes::pid_of_user_agent(&ua),
            Some(std::process::id()),
            "{ua}"
        );
        assert_eq!(
            crate::load::fakes::pid_of_user_agent("python-requests/2"),
            None
        );
    }
}
