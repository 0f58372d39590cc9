//! Every reply delivered to the person who wrote, on their channel, in their order.
use std::collections::HashMap;

use super::index::Index;
use super::{Evidence, Kind, MailboxRow, Verdict, secs};
use crate::channels::Channel;
use crate::parse_answers;

/// Every reply delivered, providers' messages in the order the providers took them, mailbox
/// entries by
/// `seq`: to the sender, on the sender's channel, in the sender's order (re-sends included;
/// a joined reply in the place of its last message).
pub(super) fn judge(e: &Evidence, ix: &Index, v: &mut Verdict) {
    let Index { channel_of, .. } = ix;
    let seq_of_key = |key: (usize, u32)| ix.seq_of_key(key);
    let mut stored: Vec<&MailboxRow> = e.mailbox.iter().filter(|m| !m.is_notice()).collect();
    stored.sort_by_key(|m| m.seq);
    let delivered = e
        .sends
        .iter()
        .filter(|s| !e.is_notice_sms(s))
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
