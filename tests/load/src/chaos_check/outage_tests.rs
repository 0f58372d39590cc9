//! The runner's outage: every person whose turn waited on it is told once, on their channel,
//! and nobody else is.
use super::tests::{DELIVER_PID, clean_run, only_kind};
use super::*;
use crate::channels::{Channel, ClientReply};
use crate::observers::{RefusedCall, RunnerOutage, SendRecord};
use crate::{message_text, sender_phone};

pub(super) const NOTICE: &str =
    "Your message is safe with us: the assistant is briefly unavailable.";

/// [`clean_run`] with the runner down from 2 s (503 until 3 s) to 10 s: the second
/// messages of senders 0 (Twilio), 3 (chat) and 4 (API) were accepted before and answered
/// after it; each was recorded waiting and told once, on their channel. Sender 0's turn
/// was refused by the runner at 2.1 s.
/// The turn of `sender`'s message `index` in recorded evidence.
pub(super) fn turn_of(e: &mut Evidence, sender: usize, index: u32) -> &mut TurnRow {
    let sid = e
        .accepted
        .iter()
        .find(|a| (a.sender, a.index) == (sender, index))
        .expect("the message was accepted")
        .sid
        .clone();
    e.turns
        .iter_mut()
        .find(|t| t.provider_message_id == sid)
        .expect("the message has a turn")
}

pub(super) fn outage_run() -> Evidence {
    let mut e = clean_run();
    e.notice_text = NOTICE.into();
    e.runner_outage = Some(RunnerOutage {
        unavailable_us: 2_000_000,
        refusing_us: 3_000_000,
        back_us: 10_000_000,
    });
    for (sender, channel) in [(0, Channel::Twilio), (3, Channel::Chat), (4, Channel::Api)] {
        let text = message_text(sender, 1);
        let call = e.runner_calls.iter_mut().find(|c| c.text == text).unwrap();
        call.start_us = 10_500_000;
        call.end_us = Some(10_520_000);
        let notice_id = format!("notice-{sender}");
        e.waiting.push(WaitingRow {
            person: channel.person(sender),
            notice_id: notice_id.clone(),
            seq: 2,
            at_us: 3_500_000,
        });
        match channel {
            Channel::Twilio => {
                e.sends.iter_mut().find(|s| s.text == text).unwrap().at_us = 10_600_000;
                e.sends.push(SendRecord {
                    channel,
                    at_us: 3_600_000,
                    to: channel.address(sender),
                    text: NOTICE.into(),
                    sid: format!("SMnotice{sender}"),
                    sender_pid: Some(DELIVER_PID),
                });
            }
            _ => {
                let seq = e.mailbox.len() as i64 + 100;
                e.mailbox.push(MailboxRow {
                    seq,
                    reply_id: notice_id.clone(),
                    part: 0,
                    channel: channel.mailbox_channel().unwrap().into(),
                    address: channel.address(sender),
                    text: NOTICE.into(),
                    kind: "notice".into(),
                });
                e.client_replies.push(ClientReply {
                    channel,
                    sender,
                    seq,
                    reply_id: notice_id,
                    text: NOTICE.into(),
                    at_us: 3_700_000,
                    notice: true,
                    ..Default::default()
                });
            }
        }
    }
    e.refused_calls.push(RefusedCall {
        at_us: 2_100_000,
        person: Channel::Twilio.person(0),
        texts: vec!["s0#1".into()],
    });
    e
}

#[test]
fn an_outage_that_told_each_waiting_person_once_passes_and_notices_are_no_replies() {
    let v = judge(&outage_run());
    assert!(v.passed(), "{:?}", v.findings);
    let o = v.outage.clone().unwrap();
    assert_eq!(
        (
            o.waits_recorded,
            o.people_told,
            o.waited_messages,
            o.refused_calls
        ),
        (3, 3, 3, 1)
    );
    for c in [Channel::Twilio, Channel::Chat, Channel::Api] {
        assert_eq!(v.channels[&c].told, 1, "{c:?}");
        assert_eq!(v.channels[&c].doubled, 0, "a notice is not a reply: {c:?}");
    }
    assert_eq!(v.distinct_replies_sent, 6, "the notice SMS is not a reply");
}

#[test]
fn a_person_told_twice_fails() {
    // A second notice SMS (another notice, or the same one sent again).
    let mut e = outage_run();
    let again = e.sends.iter().find(|s| s.text == NOTICE).unwrap().clone();
    e.sends.push(SendRecord {
        at_us: 11_000_000,
        sid: "SMnotice-again".into(),
        ..again
    });
    let f = only_kind(&judge(&e), Kind::ToldTwice);
    assert!(f.evidence.contains("2 notice messages"), "{}", f.evidence);
    // A chat notice frame pushed twice.
    let mut e = outage_run();
    let again = e
        .client_replies
        .iter()
        .find(|r| r.notice && r.channel == Channel::Chat)
        .unwrap()
        .clone();
    e.client_replies.push(again);
    let f = only_kind(&judge(&e), Kind::ToldTwice);
    assert!(f.evidence.contains("user:load-3"), "{}", f.evidence);
    // The API listing a notice under two messages; two waits recorded for one person.
    let mut e = outage_run();
    let again = e
        .client_replies
        .iter()
        .find(|r| r.notice && r.channel == Channel::Api)
        .unwrap()
        .clone();
    e.client_replies.push(again);
    let mut second = e.waiting[0].clone();
    second.notice_id = "notice-0b".into();
    second.at_us = 12_000_000;
    e.waiting.push(second);
    let v = judge(&e);
    assert_eq!(v.count(Kind::ToldTwice), 2, "{:?}", v.findings);
    assert!(
        v.findings[&Kind::ToldTwice]
            .iter()
            .any(|f| f.evidence.contains("2 waits recorded"))
    );
}

#[test]
fn a_recorded_wait_its_person_was_not_told_of_fails() {
    for channel in [Channel::Twilio, Channel::Chat, Channel::Api] {
        let mut e = outage_run();
        e.sends
            .retain(|s| !(s.text == NOTICE && s.channel == channel));
        e.client_replies
            .retain(|r| !(r.notice && r.channel == channel));
        let v = judge(&e);
        // Their message waited out the outage too: they were never told at all.
        assert_eq!(
            v.findings.keys().copied().collect::<Vec<_>>(),
            vec![Kind::NoticeNotReceived, Kind::NotTold],
            "{channel:?}: {:?}",
            v.findings
        );
        assert_eq!(v.channels[&channel].told, 0);
    }
}

#[test]
fn a_person_whose_message_waited_out_the_outage_and_was_never_told_fails() {
    // Evidence recorded before turns carried their pickup (see `waited` for the rule on
    // pickups): judged from when the turn opened. The product recorded no wait for sender 3 (chat) and told them nothing, though their
    // message, accepted 8 s before the runner was back, was first called after it.
    let mut e = outage_run();
    let person = Channel::Chat.person(3);
    e.waiting.retain(|w| w.person != person);
    e.client_replies
        .retain(|r| !(r.notice && r.channel == Channel::Chat));
    e.mailbox
        .retain(|m| !(m.is_notice() && m.reply_id == "notice-3"));
    let f = only_kind(&judge(&e), Kind::NotTold);
    assert!(
        f.evidence.contains(&person) && f.evidence.contains("never told"),
        "{}",
        f.evidence
    );
    assert_eq!(judge(&outage_run()).outage.unwrap().people_waited, 3);
    // Its turn opened less than 5 s before the runner was back (the message held up on
    // the way): it may not have met the outage in time to wait, and no finding is made.
    let mut e = outage_run();
    e.waiting.retain(|w| w.person != person);
    e.client_replies
        .retain(|r| !(r.notice && r.channel == Channel::Chat));
    e.mailbox
        .retain(|m| !(m.is_notice() && m.reply_id == "notice-3"));
    let turn = turn_of(&mut e, 3, 1);
    turn.opened_us = Some(6_000_000);
    let v = judge(&e);
    assert!(v.passed(), "{:?}", v.findings);
    // Without the turn's time (older evidence), from acceptance: the finding stands.
    turn_of(&mut e, 3, 1).opened_us = None;
    only_kind(&judge(&e), Kind::NotTold);
}

#[test]
fn a_notice_to_someone_with_nothing_waiting_fails() {
    // Told, with no wait recorded (sender 1's messages were answered before the outage).
    let mut e = outage_run();
    e.sends.push(SendRecord {
        channel: Channel::Twilio,
        at_us: 4_000_000,
        to: sender_phone(1),
        text: NOTICE.into(),
        sid: "SMnotice1".into(),
        sender_pid: Some(DELIVER_PID),
    });
    let f = only_kind(&judge(&e), Kind::NoticeWithoutWait);
    assert!(f.evidence.contains("recorded no wait"), "{}", f.evidence);
    // Recorded waiting and told, with no message open during the outage.
    let mut e = outage_run();
    e.waiting.push(WaitingRow {
        person: Channel::TextMagic.person(2),
        notice_id: "notice-2".into(),
        seq: 2,
        at_us: 4_000_000,
    });
    e.sends.push(SendRecord {
        channel: Channel::TextMagic,
        at_us: 4_100_000,
        to: Channel::TextMagic.address(2),
        text: NOTICE.into(),
        sid: "60000777".into(),
        sender_pid: Some(DELIVER_PID),
    });
    let f = only_kind(&judge(&e), Kind::NoticeWithoutWait);
    assert!(f.evidence.contains("no message open"), "{}", f.evidence);
}

#[test]
fn a_chat_message_whose_acceptance_reached_its_client_late_was_open_from_its_turn() {
    // The gateway acknowledged sender 3's second message to the chat client only after the
    // runner was back, but its turn was opened during the outage: it waited, and was told.
    let mut e = outage_run();
    let sid = turn_of(&mut e, 3, 1).provider_message_id.clone();
    e.accepted
        .iter_mut()
        .find(|a| a.sid == sid)
        .expect("accepted")
        .accepted_us = 12_000_000;
    turn_of(&mut e, 3, 1).opened_us = Some(3_000_000);
    let v = judge(&e);
    assert!(v.passed(), "{:?}", v.findings);
    // With nothing but the late acceptance to go by, the notice has no wait to tell of.
    turn_of(&mut e, 3, 1).opened_us = None;
    only_kind(&judge(&e), Kind::NoticeWithoutWait);
}

#[test]
fn a_turn_the_down_runner_refused_with_no_wait_recorded_fails() {
    let mut e = outage_run();
    e.refused_calls.push(RefusedCall {
        at_us: 2_200_000,
        person: Channel::Twilio.person(1),
        texts: vec!["s1#1".into()],
    });
    let f = only_kind(&judge(&e), Kind::WaitNotRecorded);
    assert!(f.evidence.contains(&sender_phone(1)), "{}", f.evidence);
    // Refused just before the runner came back: it may have had no time to wait.
    let mut e = outage_run();
    e.refused_calls.push(RefusedCall {
        at_us: 9_000_000,
        person: Channel::Twilio.person(1),
        texts: vec!["s1#1".into()],
    });
    assert!(judge(&e).passed());
}

#[test]
fn an_outage_that_made_nothing_wait_fails() {
    let mut e = clean_run();
    e.notice_text = NOTICE.into();
    e.runner_outage = Some(RunnerOutage {
        unavailable_us: 20_000_000,
        refusing_us: 21_000_000,
        back_us: 30_000_000,
    });
    let f = only_kind(&judge(&e), Kind::OutageWaitedNothing);
    assert!(f.evidence.contains("0 waits recorded"), "{}", f.evidence);
}
