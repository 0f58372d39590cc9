//! Each broken promise, recorded as a run would record it, must fail the verdict with its
//! evidence; a clean run, with the re-runs a killed dispatcher allows, passes.
use super::*;
use crate::channels::{Channel, ClientReply};
use crate::observers::{CallRecord, SendRecord};
use crate::{message_text, sender_phone};

pub(super) const DELIVER_PID: u32 = 4242;

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
pub(super) fn clean_run() -> Evidence {
    let mut e = Evidence {
        settled: true,
        ..Default::default()
    };
    for (sender, channel) in PEOPLE.into_iter().enumerate() {
        add_person(&mut e, sender, channel);
    }
    e
}

/// Sender `sender` on `channel`: two messages, each answered once, in order, 0.1 s after the
/// message before (anyone's).
pub(super) fn add_person(e: &mut Evidence, sender: usize, channel: Channel) {
    let mut t = 1_000_000 + e.accepted.len() as u64 * 100_000;
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
            collect: false,
        });
        e.turns.push(TurnRow {
            provider_message_id: sid.clone(),
            status: "done".into(),
            seq: index as i64 + 1,
            reply_id: Some(reply_id.clone()),
            joined_into: None,
            opened_us: Some(t + 500),
            picked_us: None,
            picked_by_pid: None,
        });
        e.inbound_logged.push(sid.clone());
        e.runner_calls.push(CallRecord {
            start_us: t + 1_000,
            end_us: Some(t + 21_000),
            person: channel.person(sender),
            text: text.clone(),
            seq: Some(index as i64 + 1),
            idempotency_key: format!("turn-{sender}-{index}"),
            ..Default::default()
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
                    kind: "reply".into(),
                });
                e.client_replies.push(ClientReply {
                    channel,
                    sender,
                    seq,
                    reply_id: reply_id.clone(),
                    text: text.clone(),
                    at_us: t + 40_000,
                    ..Default::default()
                });
            }
        }
        e.ledger.push(LedgerRow {
            reply_id,
            status: "sent".into(),
            provider_message_ids: vec![provider_sid],
            ..Default::default()
        });
        t += 100_000;
    }
}

pub(super) fn only_kind(v: &Verdict, kind: Kind) -> Finding {
    assert!(!v.passed(), "the verdict must fail");
    assert_eq!(
        v.findings.keys().copied().collect::<Vec<_>>(),
        vec![kind],
        "only {kind:?} is wrong here: {:?}",
        v.failures()
    );
    v.findings[&kind][0].clone()
}

/// A dispatcher SIGKILLed at `at_us` (what lets a turn be called again).
pub(super) fn kill_dispatcher(kills: &mut Vec<Kill>, at_us: u64) {
    kills.push(Kill {
        at_us,
        kind: "dispatch".into(),
        target: "dispatch-1".into(),
        pid: 777,
    });
}

/// `pid`, a deliverer, SIGKILLed at `at_us`.
pub(super) fn kill_deliverer(kills: &mut Vec<Kill>, at_us: u64, pid: u32) {
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
        ..Default::default()
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
    // Explained (its dispatcher died), and out of order all the same.
    kill_dispatcher(&mut e.kills, e.runner_calls[0].start_us + 5_000);
    let v = judge(&e);
    let f = only_kind(&v, Kind::RunnerOrder);
    assert!(f.evidence.contains("s0#0"), "{}", f.evidence);
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
    // Its dispatcher died; the call it made still ran when the turn was called again.
    kill_dispatcher(&mut e.kills, e.runner_calls[0].start_us + 1_000);
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
        ..Default::default()
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
        crate::observers::pid_of_user_agent(&ua),
        Some(std::process::id()),
        "{ua}"
    );
    assert_eq!(
        crate::observers::pid_of_user_agent("python-requests/2"),
        None
    );
}

/// [`clean_run`] with sender 1 taken over after their first message: the second was held for
/// the operator, never called at the runner, and answered by the operator (whose reply is the
/// echo the agent would have sent, so the usual checks judge it).
fn taken_over() -> (Evidence, CallRecord) {
    let mut e = clean_run();
    let held = e
        .runner_calls
        .iter()
        .find(|c| c.text == "s1#1")
        .unwrap()
        .clone();
    e.runner_calls.retain(|c| c.text != "s1#1");
    e.takeover = Some(TakeoverRecord {
        sender: 1,
        sent_after: vec!["s1#1".into()],
        held: vec!["s1#1".into()],
        agent_answers: false,
    });
    (e, held)
}

#[test]
fn a_takeover_that_kept_its_messages_from_the_agent_passes() {
    let v = judge(&taken_over().0);
    assert!(v.passed(), "{:?}", v.failures());
}

#[test]
fn a_message_held_for_the_operator_that_reached_the_agent_fails() {
    let (mut e, call) = taken_over();
    e.runner_calls.push(call);
    let f = only_kind(&judge(&e), Kind::Takeover);
    assert!(
        f.evidence
            .contains("s1#1, held for the operator, reached the agent")
    );
}

#[test]
fn a_takeover_that_held_nothing_or_left_the_agent_an_answer_fails() {
    let (mut e, _) = taken_over();
    e.takeover.as_mut().unwrap().held.clear();
    let f = only_kind(&judge(&e), Kind::Takeover);
    assert!(f.evidence.contains("held no message"), "{}", f.evidence);
    let (mut e, _) = taken_over();
    e.takeover.as_mut().unwrap().agent_answers = true;
    only_kind(&judge(&e), Kind::Takeover);
}
