//! The evidence looked up once for the checks: the messages accepted (once each), their turns,
//! log rows and replies, by message and by reply text.
use std::collections::{HashMap, HashSet};

use super::{AcceptedMessage, Evidence, LedgerRow, MailboxRow, TurnRow};
use crate::channels::{Channel, ClientReply};
use crate::observers::SendRecord;
use crate::parse_answers;

/// What [`judge`](super::judge) looks messages, turns and replies up by, built once from the
/// evidence.
pub(super) struct Index<'a> {
    /// What was accepted, once per message (the load generator may record a retried accept).
    pub(super) accepted: Vec<&'a AcceptedMessage>,
    /// Each sender's channel.
    pub(super) channel_of: HashMap<usize, Channel>,
    /// The senders who talk to the `collect` agent.
    pub(super) collects: HashSet<usize>,
    /// Turns by their provider message id.
    pub(super) turn_of: HashMap<&'a str, &'a TurnRow>,
    /// Provider message ids by (sender, index).
    sid_of: HashMap<(usize, u32), &'a str>,
    /// The delivery ledger by reply id.
    pub(super) ledger: HashMap<&'a str, &'a LedgerRow>,
    /// Inbound log rows per provider message id.
    pub(super) inbound_rows: HashMap<&'a str, usize>,
    /// Outbound log rows, by each message they answer.
    pub(super) outbound_rows: HashMap<String, usize>,
    /// Where each reply arrived, by its whole text (a reply delivered twice has the same):
    /// the providers' (notices apart), mailbox entries (notices apart).
    pub(super) sends_of: HashMap<&'a str, Vec<&'a SendRecord>>,
    pub(super) stored_of: HashMap<&'a str, Vec<&'a MailboxRow>>,
    /// Replies their clients got (notices apart).
    pub(super) client_replies: Vec<&'a ClientReply>,
    /// And by each message they answer: the distinct reply texts that answer it.
    pub(super) sent_for: HashMap<String, Vec<&'a str>>,
    pub(super) stored_for: HashMap<String, Vec<&'a str>>,
    pub(super) received_for: HashSet<String>,
}

impl<'a> Index<'a> {
    pub(super) fn new(e: &'a Evidence) -> Self {
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
        let turn_of: HashMap<&str, &TurnRow> = e
            .turns
            .iter()
            .map(|t| (t.provider_message_id.as_str(), t))
            .collect();
        let sid_of: HashMap<(usize, u32), &str> = accepted
            .iter()
            .map(|a| ((a.sender, a.index), a.sid.as_str()))
            .collect();
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
                *outbound_rows.entry(crate::message_text(s, i)).or_default() += 1;
            }
        }
        // Where each reply arrived, by its whole text (a reply delivered twice has the same).
        let mut sends_of: HashMap<&str, Vec<&SendRecord>> = HashMap::new();
        for s in e.sends.iter().filter(|s| !e.is_notice_sms(s)) {
            sends_of.entry(s.text.as_str()).or_default().push(s);
        }
        let mut stored_of: HashMap<&str, Vec<&MailboxRow>> = HashMap::new();
        for m in e.mailbox.iter().filter(|m| !m.is_notice()) {
            stored_of.entry(m.text.as_str()).or_default().push(m);
        }
        let client_replies: Vec<&ClientReply> =
            e.client_replies.iter().filter(|r| !r.notice).collect();
        // And by each message they answer: the distinct reply texts that answer it.
        let mut sent_for: HashMap<String, Vec<&str>> = HashMap::new();
        for text in sends_of.keys() {
            for (s, i) in parse_answers(text).unwrap_or_default() {
                sent_for
                    .entry(crate::message_text(s, i))
                    .or_default()
                    .push(text);
            }
        }
        let mut stored_for: HashMap<String, Vec<&str>> = HashMap::new();
        for text in stored_of.keys() {
            for (s, i) in parse_answers(text).unwrap_or_default() {
                stored_for
                    .entry(crate::message_text(s, i))
                    .or_default()
                    .push(text);
            }
        }
        let mut received_for: HashSet<String> = HashSet::new();
        for r in &client_replies {
            for (s, i) in parse_answers(&r.text).unwrap_or_default() {
                received_for.insert(crate::message_text(s, i));
            }
        }
        Index {
            accepted,
            channel_of,
            collects,
            turn_of,
            sid_of,
            ledger,
            inbound_rows,
            outbound_rows,
            sends_of,
            stored_of,
            client_replies,
            sent_for,
            stored_for,
            received_for,
        }
    }

    /// The turn of message `key` (sender, index).
    pub(super) fn turn_of_key(&self, key: (usize, u32)) -> Option<&'a TurnRow> {
        self.turn_of.get(self.sid_of.get(&key)?).copied()
    }

    /// The turn number of message `key` (sender, index).
    pub(super) fn seq_of_key(&self, key: (usize, u32)) -> Option<i64> {
        Some(self.turn_of_key(key)?.seq)
    }
}

/// Each sender's channel, from what the gateway accepted.
fn channels_of(e: &Evidence) -> HashMap<usize, Channel> {
    e.accepted.iter().map(|a| (a.sender, a.channel)).collect()
}
