//! Collect: a joined call answers each of its messages once, in the person's order, and the
//! turns table records the join.
use super::tests::{clean_run, kill_dispatcher, only_kind};
use super::*;
use crate::channels::Channel;
use crate::observers::CallRecord;

/// [`clean_run`] with Twilio sender 1 talking to the collect agent: its two messages were
/// one runner call and one reply, committed at the second turn, the first recording the
/// join.
pub(super) fn joined_run() -> Evidence {
    let mut e = clean_run();
    for a in e.accepted.iter_mut().filter(|a| a.sender == 1) {
        a.collect = true;
    }
    let i = e
        .runner_calls
        .iter()
        .position(|c| c.text == "s1#0")
        .unwrap();
    e.runner_calls[i].texts = vec!["s1#0".into(), "s1#1".into()];
    e.runner_calls[i].agent = "reggie_collect".into();
    e.runner_calls.retain(|c| c.text != "s1#1");
    e.sends.retain(|s| s.text != "s1#0");
    let joined = e.sends.iter_mut().find(|s| s.text == "s1#1").unwrap();
    joined.text = "s1#0 s1#1".into();
    let t = e
        .turns
        .iter_mut()
        .find(|t| t.provider_message_id == "SM1x0")
        .unwrap();
    t.reply_id = None;
    t.joined_into = Some(2);
    e.turns
        .iter_mut()
        .find(|t| t.provider_message_id == "SM1x1")
        .unwrap()
        .joined_into = Some(2);
    e.ledger.retain(|l| l.reply_id != "reply-1-0");
    e.outbound_logged
        .retain(|t| t != "echo: s1#0" && t != "echo: s1#1");
    e.outbound_logged.push("echo: s1#0 s1#1".into());
    e
}

#[test]
fn a_joined_call_answered_once_for_both_messages_passes_and_is_counted() {
    let v = judge(&joined_run());
    assert!(v.passed(), "{:?}", v.failures());
    assert_eq!((v.joined_calls, v.joined_messages), (1, 2));
    assert_eq!(v.collect_people, 1);
    assert_eq!(
        v.distinct_turns_called, 10,
        "every message reached the runner"
    );
    assert_eq!(
        v.channels[&Channel::Twilio],
        ChannelTally {
            accepted: 4,
            answered: 4,
            ..Default::default()
        }
    );
}

#[test]
fn a_joined_api_reply_listed_under_each_message_it_answers_is_no_double() {
    let mut e = clean_run();
    // API sender 4's two messages were joined: one reply, listed under both messages.
    for a in e.accepted.iter_mut().filter(|a| a.sender == 4) {
        a.collect = true;
    }
    let i = e
        .runner_calls
        .iter()
        .position(|c| c.text == "s4#0")
        .unwrap();
    e.runner_calls[i].texts = vec!["s4#0".into(), "s4#1".into()];
    e.runner_calls.retain(|c| c.text != "s4#1");
    e.mailbox.retain(|m| m.text != "s4#0");
    e.mailbox
        .iter_mut()
        .find(|m| m.text == "s4#1")
        .unwrap()
        .text = "s4#0 s4#1".into();
    e.client_replies.retain(|r| r.text != "s4#0");
    let joined = e
        .client_replies
        .iter_mut()
        .find(|r| r.text == "s4#1")
        .unwrap();
    joined.text = "s4#0 s4#1".into();
    joined.listed_under = "corr-4-1".into();
    let mut under_first = joined.clone();
    under_first.listed_under = "corr-4-0".into();
    e.client_replies.push(under_first.clone());
    let t = e
        .turns
        .iter_mut()
        .find(|t| t.provider_message_id == "SM4x0")
        .unwrap();
    (t.reply_id, t.joined_into) = (None, Some(2));
    e.outbound_logged
        .retain(|t| t != "echo: s4#0" && t != "echo: s4#1");
    e.outbound_logged.push("echo: s4#0 s4#1".into());
    let v = judge(&e);
    assert!(v.passed(), "{:?}", v.findings);
    // Listed twice under the same message: handed twice.
    e.client_replies.push(under_first);
    let f = only_kind(&judge(&e), Kind::ReceivedTwice);
    assert!(f.evidence.contains("load-4"), "{}", f.evidence);
}

#[test]
fn collect_people_with_no_joined_call_prove_nothing_and_fail() {
    let mut e = clean_run();
    e.accepted[2].collect = true;
    let f = only_kind(&judge(&e), Kind::NothingJoined);
    assert!(f.evidence.contains("1 people"), "{}", f.evidence);
}

#[test]
fn a_followup_agent_joining_messages_fails() {
    let mut e = joined_run();
    for a in &mut e.accepted {
        a.collect = false;
    }
    let f = only_kind(&judge(&e), Kind::JoinedUnderFollowup);
    assert!(f.evidence.contains("s1#0"), "{}", f.evidence);
}

#[test]
fn a_joined_call_out_of_the_order_sent_fails() {
    let mut e = joined_run();
    let c = e
        .runner_calls
        .iter_mut()
        .find(|c| c.texts.len() == 2)
        .unwrap();
    c.texts.reverse();
    c.text = c.texts[0].clone();
    c.seq = Some(1);
    let v = judge(&e);
    assert_eq!(v.count(Kind::JoinedOutOfOrder), 1, "{:?}", v.failures());
    assert!(
        v.findings[&Kind::JoinedOutOfOrder][0]
            .evidence
            .contains("not in the order sent")
    );
}

#[test]
fn a_join_the_turns_table_does_not_record_fails() {
    let mut e = joined_run();
    let t = e
        .turns
        .iter_mut()
        .find(|t| t.provider_message_id == "SM1x0")
        .unwrap();
    t.joined_into = None;
    let f = only_kind(&judge(&e), Kind::JoinNotRecorded);
    assert!(f.evidence.contains("s1#0's turn 1"), "{}", f.evidence);
}

#[test]
fn a_message_answered_alone_and_again_in_a_joined_reply_is_answered_twice() {
    let mut e = joined_run();
    // s1#0 also got a reply of its own, before the joined one.
    let mut alone = e
        .sends
        .iter()
        .find(|s| s.text == "s1#0 s1#1")
        .unwrap()
        .clone();
    alone.text = "s1#0".into();
    alone.at_us -= 10_000;
    alone.sid = "SMalone".into();
    let at = e.sends.iter().position(|s| s.text == "s1#0 s1#1").unwrap();
    e.sends.insert(at, alone);
    let v = judge(&e);
    let f = only_kind(&v, Kind::AnsweredTwice);
    assert!(
        f.evidence.contains("s1#0") && f.evidence.contains("2 replies"),
        "{}",
        f.evidence
    );
    assert_eq!(v.channels[&Channel::Twilio].doubled, 1);
    assert_eq!(v.channels[&Channel::Twilio].lost, 0);
}

#[test]
fn a_joined_call_carrying_another_persons_message_fails() {
    let mut e = joined_run();
    let c = e
        .runner_calls
        .iter_mut()
        .find(|c| c.texts.len() == 2)
        .unwrap();
    c.texts.push("s0#1".into());
    let v = judge(&e);
    assert!(
        v.count(Kind::WrongPersonInPrompt) >= 1,
        "{:?}",
        v.failures()
    );
    assert!(
        v.findings[&Kind::WrongPersonInPrompt][0]
            .evidence
            .contains("also carries \"s0#1\"")
    );
}

#[test]
fn a_joined_reply_with_one_outbound_row_per_message_and_not_two() {
    let mut e = joined_run();
    e.outbound_logged.push("echo: s1#1".into());
    let f = only_kind(&judge(&e), Kind::OutboundLoggedTwice);
    assert!(f.evidence.contains("s1#1"), "{}", f.evidence);
}

#[test]
fn a_joined_call_run_again_in_order_passes_and_a_later_turn_before_it_fails() {
    let mut e = joined_run();
    let first = e
        .runner_calls
        .iter()
        .find(|c| c.texts.len() == 2)
        .unwrap()
        .clone();
    let mut again = first.clone();
    again.start_us = first.end_us.unwrap() + 5_000;
    again.end_us = Some(again.start_us + 20_000);
    e.runner_calls.push(again.clone());
    kill_dispatcher(&mut e.kills, first.start_us + 1_000);
    let v = judge(&e);
    assert!(v.passed(), "{:?}", v.failures());
    assert_eq!((v.reruns, v.joined_calls), (1, 1));

    // Run again after a later message of the same person was called.
    let mut later = joined_run();
    later.runner_calls.push(CallRecord {
        start_us: first.end_us.unwrap() + 1_000,
        end_us: Some(first.end_us.unwrap() + 2_000),
        person: first.person.clone(),
        text: "s1#2".into(),
        seq: Some(3),
        ..Default::default()
    });
    later.runner_calls.push(again);
    let v = judge(&later);
    assert!(
        v.findings[&Kind::RunnerOrder]
            .iter()
            .any(|f| f.evidence.contains("s1#0 (turn 1)") && f.evidence.contains("s1#2")),
        "{:?}",
        v.findings
    );
}
