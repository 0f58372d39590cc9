//! Telegram, Slack and WhatsApp judged like the SMS providers; a reply on Telegram or WhatsApp
//! that the ledger recorded failed because its deliverer died mid-send is "failed, recorded",
//! and only with that evidence ([`no_log`](super::no_log)).
use super::outage_tests::{NOTICE, outage_run};
use super::tests::{DELIVER_PID, add_person, clean_run, kill_deliverer, only_kind};
use super::*;
use crate::channels::Channel;
use crate::message_text;
use crate::observers::SendRecord;

/// The senders [`with_platforms`] adds after [`clean_run`]'s five.
const TELEGRAM: usize = 5;
const SLACK: usize = 6;
const WHATSAPP: usize = 7;

/// [`clean_run`] with a person on each of Telegram, Slack and WhatsApp, everything answered.
fn with_platforms() -> Evidence {
    let mut e = clean_run();
    add_person(&mut e, TELEGRAM, Channel::Telegram);
    add_person(&mut e, SLACK, Channel::Slack);
    add_person(&mut e, WHATSAPP, Channel::WhatsApp);
    e
}

/// The reply to `sender`'s second message never reached its provider: its deliverer began the
/// attempt 1 s after the message was accepted and never recorded its outcome; the ledger
/// recorded it failed with the deliver stage's reason, and the stage dead-lettered it.
fn reply_failed_unrecorded(e: &mut Evidence, sender: usize) -> (String, u64) {
    let text = message_text(sender, 1);
    let accepted_us = e
        .accepted
        .iter()
        .find(|a| (a.sender, a.index) == (sender, 1))
        .unwrap()
        .accepted_us;
    e.sends.retain(|s| s.text != text);
    let reply_id = format!("reply-{sender}-1");
    let started = accepted_us + 1_000_000;
    let row = e
        .ledger
        .iter_mut()
        .find(|l| l.reply_id == reply_id)
        .unwrap();
    row.status = "failed".into();
    row.provider_message_ids.clear();
    row.last_error = Some(
        "gave up after 8 deliveries: could not read the provider's message log to learn \
         whether part 1 of 1 already went out, so it was not sent again"
            .into(),
    );
    row.attempt_started_us = Some(started);
    e.dead_letters.push(DeadLetterNote {
        seq: 40 + sender as u64,
        stage: "deliver".into(),
        error: "gave up after 8 deliveries".into(),
        reply_id: Some(reply_id.clone()),
    });
    (reply_id, started)
}

#[test]
fn a_clean_run_on_every_channel_passes() {
    let v = judge(&with_platforms());
    assert!(v.passed(), "{:?}", v.failures());
    for c in [Channel::Telegram, Channel::Slack, Channel::WhatsApp] {
        let t = &v.channels[&c];
        assert_eq!((t.accepted, t.answered, t.lost), (2, 2, 0), "{c:?}");
    }
    assert_eq!(v.distinct_replies_sent, 12);
}

#[test]
fn a_reply_failed_by_a_deliverers_death_on_telegram_or_whatsapp_is_failed_recorded() {
    for sender in [TELEGRAM, WHATSAPP] {
        let mut e = with_platforms();
        let (reply_id, started) = reply_failed_unrecorded(&mut e, sender);
        kill_deliverer(&mut e.kills, started + 300, DELIVER_PID);
        let v = judge(&e);
        assert!(v.passed(), "{sender}: {:?}", v.failures());
        let channel = e
            .accepted
            .iter()
            .find(|a| a.sender == sender)
            .unwrap()
            .channel;
        let t = &v.channels[&channel];
        assert_eq!(
            (t.answered, t.failed_recorded, t.lost),
            (1, 1, 0),
            "{channel:?}"
        );
        let f = &v.failed_recorded[0];
        assert_eq!(
            (f.reply_id.as_str(), f.dead_letter),
            (reply_id.as_str(), Some(40 + sender as u64))
        );
        let line = f.described();
        for part in [
            format!("the reply to s{sender}#1"),
            "deliver-4242 killed at".to_string(),
            "not sent again".to_string(),
            "dead letter #4".to_string(),
        ] {
            assert!(line.contains(&part), "{part:?} in {line}");
        }
    }
}

#[test]
fn slack_reads_its_history_so_a_reply_it_never_got_is_lost_whatever_the_ledger_says() {
    let mut e = with_platforms();
    let (_, started) = reply_failed_unrecorded(&mut e, SLACK);
    kill_deliverer(&mut e.kills, started + 300, DELIVER_PID);
    let v = judge(&e);
    assert_eq!(
        v.findings.keys().copied().collect::<Vec<_>>(),
        vec![Kind::ReplyNeverSent, Kind::DeadLetter]
    );
    assert!(
        v.findings[&Kind::ReplyNeverSent][0]
            .evidence
            .contains("no slack reply at the provider; ledger: failed")
    );
    assert_eq!(v.channels[&Channel::Slack].lost, 1);
    assert!(v.failed_recorded.is_empty());
}

#[test]
fn a_failed_reply_with_no_deliverer_killed_during_its_attempt_is_lost() {
    let mut e = with_platforms();
    let (_, started) = reply_failed_unrecorded(&mut e, TELEGRAM);
    // Killed before the attempt began, and long after its lease.
    kill_deliverer(&mut e.kills, started - 2_000_000, DELIVER_PID);
    kill_deliverer(&mut e.kills, started + 60_000_000, DELIVER_PID);
    // A dispatcher's kill explains nothing here.
    super::tests::kill_dispatcher(&mut e.kills, started + 300);
    let v = judge(&e);
    let lost = &v.findings[&Kind::ReplyNeverSent][0].evidence;
    assert!(
        lost.contains("s5#1") && lost.contains("an attempt of unknown outcome"),
        "{lost}"
    );
    assert_eq!(
        v.count(Kind::DeadLetter),
        1,
        "its dead letter is no longer excused"
    );
    assert_eq!(v.channels[&Channel::Telegram].lost, 1);
}

#[test]
fn a_reply_failed_for_another_reason_or_never_attempted_is_lost() {
    // Refused for good by WhatsApp: no attempt of unknown outcome.
    let mut e = with_platforms();
    let (reply_id, started) = reply_failed_unrecorded(&mut e, WHATSAPP);
    kill_deliverer(&mut e.kills, started + 300, DELIVER_PID);
    let row = e
        .ledger
        .iter_mut()
        .find(|l| l.reply_id == reply_id)
        .unwrap();
    row.attempt_started_us = None;
    row.last_error = Some("WhatsApp HTTP 400: (131026) Message undeliverable".into());
    let v = judge(&e);
    assert_eq!(v.count(Kind::ReplyNeverSent), 1);
    assert_eq!(v.channels[&Channel::WhatsApp].lost, 1);
    // No ledger row at all: nothing was recorded failed.
    let mut e = with_platforms();
    let (reply_id, started) = reply_failed_unrecorded(&mut e, WHATSAPP);
    kill_deliverer(&mut e.kills, started + 300, DELIVER_PID);
    e.ledger.retain(|l| l.reply_id != reply_id);
    let v = judge(&e);
    assert_eq!(v.count(Kind::ReplyNeverSent), 1);
}

#[test]
fn a_reply_sent_twice_on_telegram_is_a_double_even_when_a_kill_explains_it() {
    let mut e = with_platforms();
    let text = message_text(TELEGRAM, 1);
    let first = e.sends.iter().find(|s| s.text == text).unwrap().clone();
    e.ledger
        .iter_mut()
        .find(|l| l.reply_id == "reply-5-1")
        .unwrap()
        .provider_message_ids = vec!["1001".into()];
    kill_deliverer(&mut e.kills, first.at_us + 500, DELIVER_PID);
    e.sends.push(SendRecord {
        at_us: first.at_us + 46_000_000,
        sid: "1001".into(),
        sender_pid: Some(DELIVER_PID + 1),
        ..first
    });
    let v = judge(&e);
    only_kind(&v, Kind::DoubleInWindow);
    assert_eq!(v.channels[&Channel::Telegram].doubled, 1);
}

#[test]
fn a_telegram_notice_failed_by_a_deliverers_death_is_recorded_not_untold() {
    // The Twilio person of the outage run moves to Telegram: told by a Telegram message.
    let untold_on_telegram = || {
        let mut e = outage_run();
        add_person(&mut e, TELEGRAM, Channel::Telegram);
        let call = e
            .runner_calls
            .iter_mut()
            .find(|c| c.text == message_text(TELEGRAM, 1))
            .unwrap();
        call.start_us = 10_500_000;
        call.end_us = Some(10_520_000);
        let reply = e
            .sends
            .iter_mut()
            .find(|s| s.text == message_text(TELEGRAM, 1));
        reply.unwrap().at_us = 10_600_000;
        e.waiting.push(WaitingRow {
            person: Channel::Telegram.person(TELEGRAM),
            notice_id: "notice-5".into(),
            seq: 2,
            at_us: 3_500_000,
        });
        e.ledger.push(LedgerRow {
            reply_id: "notice-5".into(),
            status: "failed".into(),
            last_error: Some("gave up after 8 deliveries: … not sent again".into()),
            attempt_started_us: Some(3_600_000),
            ..Default::default()
        });
        e
    };
    let mut e = untold_on_telegram();
    kill_deliverer(&mut e.kills, 3_600_500, DELIVER_PID);
    let v = judge(&e);
    assert!(v.passed(), "{:?}", v.failures());
    assert_eq!(v.failed_recorded.len(), 1);
    assert!(v.failed_recorded[0].what.contains("notice of turn 2"));
    assert_eq!(v.channels[&Channel::Telegram].told, 0);
    assert_eq!(
        v.channels[&Channel::Telegram].failed_recorded,
        0,
        "messages only"
    );
    // With no deliverer killed during the notice's attempt, they were never told.
    let v = judge(&untold_on_telegram());
    assert_eq!(
        v.findings.keys().copied().collect::<Vec<_>>(),
        vec![Kind::NoticeNotReceived, Kind::NotTold]
    );
    let f = &v.findings[&Kind::NoticeNotReceived][0].evidence;
    assert!(
        f.contains("telegram:900000005") && f.contains("ledger: failed"),
        "{f}"
    );
    // Told by Telegram: counted as told, as an SMS notice is.
    let mut e = untold_on_telegram();
    e.ledger.retain(|l| l.reply_id != "notice-5");
    e.sends.push(SendRecord {
        channel: Channel::Telegram,
        at_us: 3_700_000,
        to: Channel::Telegram.address(TELEGRAM),
        text: NOTICE.into(),
        sid: "2001".into(),
        sender_pid: Some(DELIVER_PID),
    });
    let v = judge(&e);
    assert!(v.passed(), "{:?}", v.failures());
    assert_eq!(v.channels[&Channel::Telegram].told, 1);
}

#[test]
fn a_reply_telegram_took_before_its_deliverer_died_is_answered_and_its_failure_recorded() {
    // As chaos-20261207-200547 recorded it: the part reached the provider, its deliverer died
    // before the ledger said so, the next one could not ask, the reply ended failed and was
    // dead-lettered.
    let recorded_after_the_send = || {
        let mut e = with_platforms();
        let text = message_text(TELEGRAM, 1);
        let sent = e.sends.iter().find(|s| s.text == text).unwrap().clone();
        let (_, started) = reply_failed_unrecorded(&mut e, TELEGRAM);
        e.sends.push(SendRecord {
            at_us: started + 2_000,
            ..sent
        });
        (e, started)
    };
    let (mut e, started) = recorded_after_the_send();
    kill_deliverer(&mut e.kills, started + 3_000, DELIVER_PID);
    let v = judge(&e);
    assert!(v.passed(), "{:?}", v.failures());
    let t = &v.channels[&Channel::Telegram];
    assert_eq!((t.answered, t.failed_recorded, t.lost), (2, 0, 0));
    let f = &v.failed_recorded[0];
    assert!(f.delivered && f.dead_letter == Some(45), "{f:?}");
    assert!(f.described().contains("the provider had taken it, once"));
    // With no deliverer killed during its attempt, its dead letter stands.
    let (e, _) = recorded_after_the_send();
    let v = judge(&e);
    let f = only_kind(&v, Kind::DeadLetter);
    assert!(f.evidence.contains("#45"), "{}", f.evidence);
}
