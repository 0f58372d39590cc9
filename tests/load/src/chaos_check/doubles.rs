//! Replies delivered once: a provider's message (SMS, Telegram, Slack, WhatsApp) sent once (a
//! re-send is a double, explained or not), a chat or API reply stored as one mailbox entry and
//! handed to its client once.
use std::collections::{BTreeMap, HashSet};

use super::index::Index;
use super::{Double, Evidence, Kind, MailboxRow, Verdict, secs};
use crate::channels::{Channel, ClientReply};
use crate::parse_answers;

/// How much later than the sender's death the fake provider may record a request the sender
/// had already put on the wire (measured: up to 33 ms under chaos load).
pub(super) const SEND_RECORD_LAG_US: u64 = 2_000_000;

/// The deliverer's lease (`switchboard_deliver::DELIVERY_LEASE`): a live sender records its
/// send well within it.
const DELIVERY_LEASE_US: u64 = switchboard_deliver::DELIVERY_LEASE.as_micros() as u64;

/// The text of a reply's last message (a joined reply's is the one it is committed at).
fn last_answer(text: &str) -> Option<(usize, u32)> {
    parse_answers(text).and_then(|a| a.last().copied())
}

/// Every reply delivered more than once: SMS re-sends ([`Double`]s), mailbox entries stored
/// twice, replies handed to a client twice.
pub(super) fn judge(e: &Evidence, ix: &Index, v: &mut Verdict) {
    let Index {
        sends_of,
        stored_of,
        client_replies,
        ledger,
        channel_of,
        ..
    } = ix;
    let turn_of_key = |key: (usize, u32)| ix.turn_of_key(key);
    // Every SMS re-send is a double. It is explained (the report says so) only by a kill of
    // the process that made the previous send, between the two sends, with the previous send
    // absent from the ledger; since deliverers look such a send up in the provider's log, even
    // an explained one is a finding.
    for (text, sends) in sends_of {
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
    for r in client_replies {
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
}
