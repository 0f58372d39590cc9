//! Who certainly met the down runner at a dispatcher, and so must have been told.
//!
//! A dispatcher records when it first takes a turn up (`turns.picked_at`, set once, in the
//! statement that leases the session's call slot for it). A turn picked up at least
//! [`PICKUP_GRACE_US`] before the runner was back, and first called after it, spent the outage
//! at a dispatcher (a live one, or one killed holding it), so its person must have been told:
//! the product's account of the people it did not tell is that their turn reached a dispatcher
//! only after the runner was back. (A message joined into another turn's call is never picked
//! up itself: the head of its call is.)
//!
//! A dispatcher SIGKILLed while it held the turn tells nobody; the turn's redelivery reaches
//! a dispatcher again only after `ack_wait`. So when the evidence names the process that picked
//! the turn up (`turns.picked_by`) and that process was killed before the turn's first call, the
//! turn's time at a live dispatcher ends at the kill: it must have been told only if it was
//! picked up [`PICKUP_GRACE_US`] before the earlier of the kill and the runner's return. (Only
//! the first pickup is recorded: how long the redelivery then waited at another dispatcher is
//! not judged.)
//!
//! Time while Postgres was down does not count either: a dispatcher cannot take a turn up then,
//! nor learn that a lease the crash cut off was taken (its answer lost with the connection), so
//! the turn can neither meet the runner nor wait on it until the database is back.
//!
//! Evidence recorded before turns carried their pickup is judged by the rule it was recorded
//! under: a turn opened (else a message accepted) [`super::TOLD_GRACE_US`] or more before the
//! runner was back.
use std::collections::{BTreeMap, HashMap, HashSet};

use super::{
    AcceptedMessage, Evidence, Kill, Kind, ServerCrash, TOLD_GRACE_US, TurnRow, Verdict, secs,
};
use crate::channels::Channel;
use crate::observers::RunnerOutage;

/// A turn a dispatcher took up this long before the runner was back had time to meet it down
/// (a call refused, or a breaker already open) and wait; one taken up later may have been
/// called just after the runner came back without ever meeting it.
pub const PICKUP_GRACE_US: u64 = 1_000_000;

/// Since when a turn was at a dispatcher (or, in older evidence, in the pipeline).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Since {
    PickedUp(u64),
    /// Evidence without pickups: when the session stage opened the turn.
    Opened(u64),
    /// Evidence without the turn's times: when the gateway accepted the message.
    Accepted(u64),
}

impl Since {
    fn at(self) -> u64 {
        match self {
            Since::PickedUp(t) | Since::Opened(t) | Since::Accepted(t) => t,
        }
    }

    fn grace(self) -> u64 {
        match self {
            Since::PickedUp(_) => PICKUP_GRACE_US,
            Since::Opened(_) | Since::Accepted(_) => TOLD_GRACE_US,
        }
    }

    fn describe(self) -> String {
        match self {
            Since::PickedUp(t) => format!("picked up by a dispatcher at {}", secs(t)),
            Since::Opened(t) => format!("its turn opened at {} (no pickup recorded)", secs(t)),
            Since::Accepted(t) => format!("accepted at {} (no turn times recorded)", secs(t)),
        }
    }
}

/// A person who must have been told: their first message that waited at a dispatcher.
pub(super) struct MustTell<'a> {
    pub message: &'a AcceptedMessage,
    pub since: Since,
    pub first_call_us: u64,
}

/// Who must have been told, by sender: for each, the first message (in acceptance order) that
/// was at a dispatcher long enough before the runner was back, and first called after it.
/// `first_calls`: each message text's first answered runner call.
pub(super) fn who_must_be_told<'a>(
    e: &Evidence,
    accepted: &[&'a AcceptedMessage],
    first_calls: &HashMap<&str, u64>,
    o: &RunnerOutage,
) -> BTreeMap<usize, MustTell<'a>> {
    let turns: HashMap<&str, &TurnRow> = e
        .turns
        .iter()
        .map(|t| (t.provider_message_id.as_str(), t))
        .collect();
    let pickups_recorded = e.turns.iter().any(|t| t.picked_us.is_some());
    let mut must = BTreeMap::new();
    for a in accepted {
        let text = crate::message_text(a.sender, a.index);
        let Some(&first_call_us) = first_calls.get(text.as_str()) else {
            continue;
        };
        if first_call_us < o.back_us {
            continue;
        }
        let turn = turns.get(a.sid.as_str());
        // Until when the turn was at a live dispatcher while the runner was down.
        let live_until = turn
            .and_then(|t| Some((t.picked_us?, t.picked_by_pid?)))
            .and_then(|(picked, pid)| {
                e.kills
                    .iter()
                    .filter(|k| k.kind == "dispatch" && k.pid == pid)
                    .map(|k| k.at_us)
                    .find(|&at| at >= picked && at <= first_call_us)
            })
            .map_or(o.back_us, |killed| killed.min(o.back_us));
        let since = if pickups_recorded {
            match turn.and_then(|t| t.picked_us) {
                Some(t) => Since::PickedUp(t),
                None => continue,
            }
        } else {
            match turn.and_then(|t| t.opened_us) {
                Some(t) => Since::Opened(t),
                None => Since::Accepted(a.accepted_us),
            }
        };
        // While Postgres was down a dispatcher could not take the turn up nor learn that it
        // had (a lease whose answer the crash lost): that time is not time it met the runner.
        let at_dispatcher = match since {
            Since::PickedUp(t) => time_up(t, live_until, &e.crashes),
            _ => live_until.saturating_sub(since.at()),
        };
        if live_until >= since.at() && at_dispatcher >= since.grace() {
            must.entry(a.sender).or_insert(MustTell {
                message: a,
                since,
                first_call_us,
            });
        }
    }
    must
}

/// How much of `from..until` Postgres was up (the crashes of `pg` taken out).
fn time_up(from: u64, until: u64, crashes: &[ServerCrash]) -> u64 {
    let mut up = until.saturating_sub(from);
    for c in crashes.iter().filter(|c| c.server == "pg") {
        let (a, b) = (c.at_us.max(from), c.back_us.min(until));
        up = up.saturating_sub(b.saturating_sub(a));
    }
    up
}

/// A finding for everyone who must have been told and was not, with what happened between
/// their turn's pickup and its first call (a dispatcher's kill, a server down), to read it by.
pub(super) fn judge_not_told(
    e: &Evidence,
    must: &BTreeMap<usize, MustTell>,
    told: &HashSet<usize>,
    channel_of: &HashMap<usize, Channel>,
    o: &RunnerOutage,
    v: &mut Verdict,
) {
    for (sender, m) in must {
        if told.contains(sender) {
            continue;
        }
        let channel = channel_of.get(sender).copied().unwrap_or_default();
        let (from, to) = (m.since.at(), m.first_call_us);
        let mut between: Vec<String> = e
            .kills
            .iter()
            .filter(|k| k.kind == "dispatch" && k.at_us >= from && k.at_us <= to)
            .map(Kill::described)
            .collect();
        between.extend(
            e.crashes
                .iter()
                .filter(|c| c.at_us <= to && c.back_us >= from)
                .map(ServerCrash::described),
        );
        v.add(
            Kind::NotTold,
            format!(
                "{} ({}): message #{} accepted at {}, {}, {} before the runner was back at {}, \
                 first called at {}; they were never told (in between: {})",
                channel.person(*sender),
                channel.name(),
                m.message.index,
                secs(m.message.accepted_us),
                m.since.describe(),
                secs(o.back_us.saturating_sub(from)),
                secs(o.back_us),
                secs(to),
                if between.is_empty() {
                    "no dispatcher killed, no server down".to_string()
                } else {
                    between.join(", ")
                }
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    //! A person whose turn met the down runner at a dispatcher is told; one whose turn reached a
    //! dispatcher only as the runner came back need not be.
    use super::super::outage_tests::{outage_run, turn_of};
    use super::super::tests::only_kind;
    use super::super::{Kill, judge};
    use super::*;

    /// [`outage_run`] with each turn picked up 0.2 ms after it opened, and chat sender 3 never
    /// told: no wait recorded, no notice. Its second message's turn is picked up at `picked_us`
    /// (the runner was back at 10 s; the message first called at 10.5 s).
    fn untold_chat_person(picked_us: u64) -> Evidence {
        let mut e = outage_run();
        for t in &mut e.turns {
            t.picked_us = t.opened_us.map(|at| at + 200);
        }
        let person = Channel::Chat.person(3);
        e.waiting.retain(|w| w.person != person);
        e.client_replies
            .retain(|r| !(r.notice && r.channel == Channel::Chat));
        e.mailbox.retain(|m| m.reply_id != "notice-3");
        let turn = turn_of(&mut e, 3, 1);
        turn.picked_us = Some(picked_us);
        e
    }

    #[test]
    fn a_turn_picked_up_2s_before_the_runner_was_back_whose_person_was_never_told_fails() {
        let mut e = untold_chat_person(8_000_000);
        e.kills.push(Kill {
            at_us: 9_000_000,
            kind: "dispatch".into(),
            target: "dispatch-0".into(),
            pid: 77,
        });
        let v = judge(&e);
        let f = only_kind(&v, Kind::NotTold);
        for part in [
            "user:load-3 (chat): message #1",
            "picked up by a dispatcher at 8.000s, 2.000s before the runner was back at 10.000s",
            "first called at 10.500s",
            "in between: dispatch-0 killed at 9.000s",
        ] {
            assert!(f.evidence.contains(part), "{part:?} in {}", f.evidence);
        }
        assert_eq!(v.outage.unwrap().people_waited, 3);
    }

    #[test]
    fn a_turn_picked_up_half_a_second_before_the_runner_was_back_need_not_be_told() {
        // Its turn opened 8.3 s before the runner was back (the rule for older evidence would
        // have wanted them told), but reached a dispatcher only as it came back.
        let v = judge(&untold_chat_person(9_500_000));
        assert!(v.passed(), "{:?}", v.findings);
        assert_eq!(v.outage.unwrap().people_waited, 2);
    }

    #[test]
    fn a_turn_whose_dispatcher_was_killed_just_after_picking_it_up_need_not_be_told() {
        // Picked up 2 s before the runner was back by dispatcher pid 77, which was killed 0.3 s
        // later: it spent 0.3 s at a live dispatcher, and its redelivery came after.
        let mut e = untold_chat_person(8_000_000);
        turn_of(&mut e, 3, 1).picked_by_pid = Some(77);
        let killed = |pid| Kill {
            at_us: 8_300_000,
            kind: "dispatch".into(),
            target: format!("dispatch-{pid}"),
            pid,
        };
        e.kills.push(killed(77));
        let v = judge(&e);
        assert!(v.passed(), "{:?}", v.findings);
        // The other dispatcher killed instead: the one holding the turn lived, and should have
        // told them.
        e.kills = vec![killed(78)];
        let v = judge(&e);
        only_kind(&v, Kind::NotTold);
        // Its own dispatcher killed, but only after it had held the turn 1.2 s.
        e.kills = vec![Kill {
            at_us: 9_200_000,
            ..killed(77)
        }];
        let v = judge(&e);
        only_kind(&v, Kind::NotTold);
    }

    #[test]
    fn time_while_postgres_was_down_is_not_time_at_a_dispatcher() {
        // As chaos-20261207-132457 recorded it: picked up 2 s before the runner was back as
        // Postgres went down (the lease's answer lost), Postgres back 1.6 s later, the
        // dispatcher killed 0.3 s after that: 0.3 s it could have met the runner.
        let mut e = untold_chat_person(8_000_000);
        turn_of(&mut e, 3, 1).picked_by_pid = Some(77);
        e.kills.push(Kill {
            at_us: 9_900_000,
            kind: "dispatch".into(),
            target: "dispatch-77".into(),
            pid: 77,
        });
        e.crashes.push(ServerCrash {
            server: "pg".into(),
            at_us: 7_900_000,
            back_us: 9_600_000,
            recovered: true,
        });
        let v = judge(&e);
        assert!(v.passed(), "{:?}", v.findings);
        // Postgres back 1 s earlier: 1.3 s at a live dispatcher with a database, untold.
        e.crashes[0].back_us = 8_600_000;
        let v = judge(&e);
        let f = only_kind(&v, Kind::NotTold);
        assert!(
            f.evidence.contains("pg down from 7.900s to 8.600s"),
            "{}",
            f.evidence
        );
        // NATS down instead: that does not stop a dispatcher holding the turn.
        e.crashes[0].server = "nats".into();
        e.crashes[0].back_us = 9_600_000;
        only_kind(&judge(&e), Kind::NotTold);
    }

    #[test]
    fn a_person_told_passes_whenever_their_turn_was_picked_up() {
        let mut e = outage_run();
        for t in &mut e.turns {
            t.picked_us = t.opened_us.map(|at| at + 200);
        }
        let v = judge(&e);
        assert!(v.passed(), "{:?}", v.findings);
        assert_eq!(v.outage.unwrap().people_waited, 3);
    }
}
