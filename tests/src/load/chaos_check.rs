//! The chaos run's verdict, as a pure function of what the run recorded.
//!
//! A run collects its [`Evidence`] (what the load generator got accepted, every call the fake
//! runner received, every SMS the fake Twilio accepted, the database's turns, log rows and
//! delivery ledger, every kill and server crash, the dead letters) and writes it next to its
//! report; [`judge`] turns it into a [`Verdict`]. Keeping the two apart lets the checker itself be
//! tested on recorded evidence: each kind of broken promise must make it fail, with the evidence.
//!
//! What fails a run (each a kind of [`Finding`]):
//! - a message the gateway never accepted, an accepted one with no turn or no inbound log row;
//! - a reply never sent, a reply sent to anyone but the person who wrote, a reply without
//!   exactly one outbound log row;
//! - a runner call (first or repeated) for a turn of a person after a call for a later turn of
//!   theirs, by the session's turn number or by the person's own order; an SMS (first or
//!   re-sent) after a later reply of the same person;
//! - two different turns of one person at the runner at once; a turn called again while an
//!   earlier call of it still ran;
//! - a reply sent twice outside the documented window: the re-send is explained only when the
//!   deliver process that made the previous send (its `User-Agent` names it) was SIGKILLed
//!   within its lease of that send and before the re-send, and the ledger never recorded the
//!   previous send;
//! - any dead letter, a dead-letter list that could not be read, a pipeline that did not settle.
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::fakes::{CallRecord, SendRecord};
use super::{parse_text, sender_phone};

/// One message the gateway accepted (answered 200).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AcceptedMessage {
    pub sender: usize,
    pub index: u32,
    /// The provider message id (`MessageSid`).
    pub sid: String,
    pub accepted_us: u64,
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
    pub sends: Vec<SendRecord>,
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
    ReplyToWrongNumber,
    NoOutboundLogRow,
    OutboundLoggedTwice,
    WrongPersonInPrompt,
    RunnerOrder,
    SmsOrder,
    OverlappingTurns,
    TurnRunBesideItself,
    DoubleOutsideWindow,
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
            Kind::ReplyToWrongNumber => "replies sent to someone other than the sender",
            Kind::NoOutboundLogRow => "replies with no outbound log row",
            Kind::OutboundLoggedTwice => "replies logged outbound more than once",
            Kind::WrongPersonInPrompt => "runner calls whose prompt names another person",
            Kind::RunnerOrder => "runner calls out of the person's order",
            Kind::SmsOrder => "SMS out of the person's order",
            Kind::OverlappingTurns => "turns of one person at the runner at once",
            Kind::TurnRunBesideItself => "turns called again while an earlier call of them ran",
            Kind::DoubleOutsideWindow => "replies sent again outside the documented window",
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

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Verdict {
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

/// The person id the identify stage gives an unknown phone number.
pub fn expected_person(sender: usize) -> String {
    format!("phone:{}", sender_phone(sender))
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
    let mut sends_of: HashMap<&str, Vec<&SendRecord>> = HashMap::new();
    for s in &e.sends {
        sends_of.entry(s.text.as_str()).or_default().push(s);
    }
    v.distinct_replies_sent = sends_of.len() as u64;

    // Every accepted message: a turn, one inbound row, a reply, one outbound row.
    for a in &accepted {
        let text = super::message_text(a.sender, a.index);
        let turn = turn_of.get(a.sid.as_str());
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
        if !sends_of.contains_key(text.as_str()) {
            let status = turn.map_or("missing", |t| t.status.as_str());
            v.add(
                Kind::ReplyNeverSent,
                format!(
                    "{text} ({}) accepted at {}: no SMS reply (turn {status})",
                    a.sid,
                    secs(a.accepted_us)
                ),
            );
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

    judge_runner_calls(e, &mut v);

    // Every send: to the sender, in the sender's order (re-sends included).
    let mut per_recipient: HashMap<&str, (u32, i64, &str)> = HashMap::new();
    for s in &e.sends {
        let Some((sender, index)) = parse_text(&s.text) else {
            v.add(
                Kind::ReplyToWrongNumber,
                format!(
                    "an SMS to {} at {} answers no message of the run: {:?}",
                    s.to,
                    secs(s.at_us),
                    s.text
                ),
            );
            continue;
        };
        let owner = sender_phone(sender);
        if s.to != owner {
            v.add(
                Kind::ReplyToWrongNumber,
                format!(
                    "the reply to {} (from {owner}) went to {} at {}",
                    s.text,
                    s.to,
                    secs(s.at_us)
                ),
            );
            continue;
        }
        let seq = seq_of_text(&s.text).unwrap_or(-1);
        if let Some((max_index, max_seq, max_text)) = per_recipient.get(s.to.as_str()).copied()
            && (index < max_index || (seq >= 0 && seq < max_seq))
        {
            v.add(
                Kind::SmsOrder,
                format!(
                    "{} got {} (turn {seq}) at {} after {max_text} (turn {max_seq})",
                    s.to,
                    s.text,
                    secs(s.at_us)
                ),
            );
        }
        let entry = per_recipient
            .entry(s.to.as_str())
            .or_insert((index, seq, s.text.as_str()));
        if (index, seq) > (entry.0, entry.1) {
            *entry = (index, seq, s.text.as_str());
        }
    }

    // Every re-send: explained only by a kill of the process that made the previous send,
    // between the two sends, with the previous send absent from the ledger.
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
            if d.explained_by.is_none() {
                v.add(
                    Kind::DoubleOutsideWindow,
                    format!(
                        "the reply to {text} was sent at {} by pid {:?} and again at {} by pid {:?}; {}",
                        secs(d.previous_at_us),
                        d.previous_pid,
                        secs(d.resent_at_us),
                        d.resent_pid,
                        if ledger_recorded_previous {
                            "the ledger had recorded the first send"
                        } else {
                            "no kill of the first sender in between"
                        }
                    ),
                );
            }
            v.doubles.push(d);
        }
    }
    v.doubles.sort_by_key(|d| d.resent_at_us);

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

/// Order, overlap and identity at the runner, over every call (re-runs included).
fn judge_runner_calls(e: &Evidence, v: &mut Verdict) {
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
        let person = expected_person(sender);
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
    //! evidence; a clean run, with the re-sends and re-runs the documented window allows, passes.
    use super::*;
    use crate::load::message_text;

    const DELIVER_PID: u32 = 4242;

    /// A clean run: two people, two messages each, each answered once, in order.
    fn clean_run() -> Evidence {
        let mut e = Evidence {
            settled: true,
            ..Default::default()
        };
        let mut t = 1_000_000;
        for sender in 0..2usize {
            for index in 0..2u32 {
                let text = message_text(sender, index);
                let sid = format!("SM{sender}x{index}");
                let reply_id = format!("reply-{sender}-{index}");
                let provider_sid = format!("SMout{sender}x{index}");
                e.accepted.push(AcceptedMessage {
                    sender,
                    index,
                    sid: sid.clone(),
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
                    person: expected_person(sender),
                    text: text.clone(),
                    seq: Some(index as i64 + 1),
                    idempotency_key: format!("turn-{sender}-{index}"),
                });
                e.outbound_logged.push(format!("echo: {text}"));
                e.sends.push(SendRecord {
                    at_us: t + 30_000,
                    to: sender_phone(sender),
                    text: text.clone(),
                    sid: provider_sid.clone(),
                    sender_pid: Some(DELIVER_PID),
                });
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
    fn a_clean_run_passes() {
        let v = judge(&clean_run());
        assert!(v.passed(), "{:?}", v.failures());
        assert_eq!(v.distinct_turns_called, 4);
        assert_eq!(v.distinct_replies_sent, 4);
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
    fn a_double_whose_sender_was_killed_before_the_ledger_recorded_it_is_in_the_window() {
        let mut e = clean_run();
        // The ledger never recorded the first send; its sender was killed right after it.
        let first_sid = e.sends[3].sid.clone();
        e.ledger[3].provider_message_ids = vec!["SMresent".into()];
        assert_ne!(first_sid, "SMresent");
        resend(&mut e, 46_000_000, DELIVER_PID + 1);
        kill_deliverer(&mut e.kills, e.sends[3].at_us + 500, DELIVER_PID);
        let v = judge(&e);
        assert!(v.passed(), "{:?}", v.failures());
        assert_eq!(v.doubles_in_window(), 1);
        assert_eq!(
            v.doubles[0].explained_by.as_ref().map(|k| k.pid),
            Some(DELIVER_PID)
        );
    }

    #[test]
    fn a_send_recorded_just_after_its_senders_kill_is_in_the_window() {
        // The request was on the wire when the process died; the fake recorded it 30 ms later.
        let mut e = clean_run();
        e.ledger[3].provider_message_ids = vec!["SMresent".into()];
        resend(&mut e, 46_000_000, DELIVER_PID + 1);
        kill_deliverer(&mut e.kills, e.sends[3].at_us - 30_000, DELIVER_PID);
        let v = judge(&e);
        assert!(v.passed(), "{:?}", v.failures());
        assert_eq!(v.doubles_in_window(), 1);
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
        // s0#0 is sent again after s0#1 went out (its sender was killed: the double itself is
        // in the window, the order is not).
        e.ledger[0].provider_message_ids = vec![];
        let mut again = e.sends[0].clone();
        again.at_us = e.sends[1].at_us + 1_000;
        again.sid = "SMagain".into();
        e.sends.push(again);
        kill_deliverer(&mut e.kills, e.sends[0].at_us + 10, DELIVER_PID);
        let v = judge(&e);
        let f = only_kind(&v, Kind::SmsOrder);
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
    fn a_prompt_naming_another_person_fails() {
        let mut e = clean_run();
        e.runner_calls[2].person = expected_person(0);
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
