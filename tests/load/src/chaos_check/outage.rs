//! The runner's outage: who was told it was down, who could have waited, who certainly
//! waited (the `chaos_check` module's docs say what is checked; [`waited`] who certainly
//! waited at a dispatcher).
use std::collections::{BTreeMap, HashMap, HashSet};

use super::{
    AcceptedMessage, Evidence, Kind, OutageTally, Verdict, WaitingRow, no_log, secs, waited,
};
use crate::channels::Channel;

/// A message handed in this little after the runner was back may still have met the outage
/// (the gateway publishes it before its 200 reaches the client).
pub const NOTICE_SLACK_US: u64 = 1_000_000;

/// A call refused (503) at least this long before the runner was back leaves the turn time
/// to meet an open breaker and wait (the breaker opens after `dispatch.breaker_failures`
/// down answers; a killed dispatcher's turn is redelivered within `ack_wait`).
pub const NOTICE_GRACE_US: u64 = 5_000_000;

/// In evidence recorded before turns carried their pickup ([`waited`]): a message whose turn
/// was opened at least this long before the runner was back, and which was first called after
/// it, is taken to have reached a dispatcher while the runner was down, so its person must
/// have been told.
pub const TOLD_GRACE_US: u64 = 5_000_000;

/// Who was told the runner was down, who could have waited, who certainly waited (see the
/// `chaos_check` module's docs).
pub(super) fn judge_notices(
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
        /// A provider's messages (SMS, Telegram, Slack, WhatsApp).
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
                "{} message at {}",
                s.channel.name(),
                secs(s.at_us)
            )),
            None => stray.push(format!(
                "a notice by {} to {} at {}",
                s.channel.name(),
                s.to,
                secs(s.at_us)
            )),
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
            // A message is in the product from the earlier of its acceptance as its client
            // saw it and its turn's opening: a chat socket's or API caller's acceptance can
            // reach the client seconds after the turn was opened (a gateway far behind).
            let opened: HashMap<&str, u64> = e
                .turns
                .iter()
                .filter_map(|t| Some((t.provider_message_id.as_str(), t.opened_us?)))
                .collect();
            let mut open: HashSet<usize> = HashSet::new();
            let mut waited = 0u64;
            for a in accepted {
                let since = opened
                    .get(a.sid.as_str())
                    .map_or(a.accepted_us, |&t| t.min(a.accepted_us));
                if since >= o.back_us + NOTICE_SLACK_US {
                    continue;
                }
                let text = crate::message_text(a.sender, a.index);
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
    // People whose notice failed as their channel promises ([`no_log`]): neither told nor
    // left untold.
    let mut notice_failed: HashSet<usize> = HashSet::new();
    let senders: HashSet<usize> = told.keys().chain(waits.keys()).copied().collect();
    let mut senders: Vec<usize> = senders.into_iter().collect();
    senders.sort_unstable();
    for sender in senders {
        let channel = channel_of.get(&sender).copied().unwrap_or_default();
        let person = channel.person(sender);
        let t = told.remove(&sender).unwrap_or_default();
        let w = waits.get(&sender).cloned().unwrap_or_default();
        let delivered = match channel {
            Channel::Chat => !t.frames.is_empty(),
            Channel::Api => !t.listed.is_empty(),
            _ => !t.sms.is_empty(),
        };
        if delivered {
            people_told += 1;
            v.channels.entry(channel).or_default().told += 1;
            told_people.insert(sender);
        }
        let distinct = |ids: &[String]| ids.iter().collect::<HashSet<_>>().len();
        let mut twice = Vec::new();
        if t.sms.len() > 1 {
            twice.push(format!(
                "{} notice messages ({})",
                t.sms.len(),
                t.sms.join(", ")
            ));
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
                Channel::Chat => t.frames.contains(&wait.notice_id),
                Channel::Api => t.listed.contains(&wait.notice_id),
                _ => !t.sms.is_empty(),
            };
            let what = format!("{person}'s notice of turn {}", wait.seq);
            let failed = no_log::recorded_failure(e, channel, &wait.notice_id, what, got);
            if failed.is_some() && !got {
                notice_failed.insert(sender);
            }
            // Listed with the replies failed so; the tally counts messages, not notices.
            let untold = failed.is_none() && !got;
            v.failed_recorded.extend(failed);
            if untold {
                v.add(
                    Kind::NoticeNotReceived,
                    format!(
                        "{person} ({}): the wait of turn {} recorded at {} (notice {}) was never \
                         told on their channel{}",
                        channel.name(),
                        wait.seq,
                        secs(wait.at_us),
                        wait.notice_id,
                        no_log::ledger_says(e, &wait.notice_id)
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
    let told_or_failed: HashSet<usize> = told_people.union(&notice_failed).copied().collect();
    waited::judge_not_told(e, &must_tell, &told_or_failed, channel_of, o, v);
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
