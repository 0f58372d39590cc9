//! The memory verdict: a clean run passes; each way memory can leak, be lost or be doubled,
//! recorded as a run would record it, fails it with its evidence.
use super::*;
use crate::canary::{Canaries, PromptCanaries};
use crate::observers::CallRecord;
use crate::returning::Returned;
use crate::{message_text, sender_phone};

const SALT: u64 = 99;
const T0: i64 = 1_790_000_000_000;

/// A UUIDv7-shaped id minted at `T0 + ms` (text order is id order).
fn id(ms: i64, n: u32) -> String {
    format!(
        "{:08x}-{:04x}-7000-8000-{n:012x}",
        (T0 + ms) >> 16,
        (T0 + ms) & 0xffff
    )
}

fn key(sender: usize) -> String {
    format!("reggie:person:external:phone:+1415200000{sender}")
}

/// Two people, one exchange each (message and reply), embedded, labelled and announced once,
/// summarised once; each runner prompt carries its own person's canary, the second also their
/// summary.
fn clean_memory_run() -> Evidence {
    let c = Canaries::new(SALT);
    let mut e = Evidence {
        settled: true,
        ..Default::default()
    };
    let mut m = MemoryEvidence {
        canaries: c,
        embedding_model: "fake".into(),
        caught_up: true,
        ..Default::default()
    };
    for sender in 0..2usize {
        let text = message_text(sender, 0);
        let sent = c.mark(sender, &text);
        let (inbound, reply) = (id(sender as i64 * 100, 1), id(sender as i64 * 100 + 50, 2));
        for (msg, direction) in [(&inbound, "inbound"), (&reply, "outbound")] {
            m.messages.push(LoggedMessage {
                id: msg.clone(),
                memory_key: key(sender),
                person_id: format!("p{sender}"),
                direction: direction.into(),
                logged_ms: T0 + sender as i64 * 100 + 60,
                summary_version: Some(1),
                canaries: if direction == "inbound" {
                    vec![c.of(sender)]
                } else {
                    Vec::new()
                },
                ..Default::default()
            });
            m.vectors.push(VectorRow {
                message_id: msg.clone(),
                model: "fake".into(),
                person_id: format!("p{sender}"),
            });
        }
        m.categories.push(CategoryRow {
            outbound_id: reply.clone(),
            inbound_id: Some(inbound.clone()),
            person_id: format!("p{sender}"),
            label: "casual_chat".into(),
        });
        m.categorised_events.push(reply.clone());
        m.summaries.push(SummaryRow {
            memory_key: key(sender),
            version: 1,
            last_message: Some(reply.clone()),
            messages_covered: 2,
            canaries: vec![c.of(sender)],
        });
        m.summarised.push(SummarisedEntry {
            memory_key: key(sender),
            session_id: format!("s{sender}"),
            version: 1,
            last_message: reply.clone(),
            merged: 2,
            covered: 2,
            at_ms: T0 + 10_000,
        });
        m.model_prompts.push(ModelPrompt {
            purpose: "summary".into(),
            canaries: vec![c.of(sender)],
        });
        let prompt = format!(
            "summary: {}\n<<<MSG-x\n{sent}\nMSG-x>>>",
            if sender == 1 { c.of(1) } else { String::new() }
        );
        e.runner_calls.push(CallRecord {
            person: format!("phone:{}", sender_phone(sender)),
            text: text.clone(),
            canaries: PromptCanaries::of_prompt(&prompt, &[sent.as_str()]),
            ..Default::default()
        });
    }
    e.memory = Some(m);
    e
}

fn memory(e: &mut Evidence) -> &mut MemoryEvidence {
    e.memory.as_mut().unwrap()
}

#[test]
fn a_clean_memory_run_passes_and_counts_what_it_checked() {
    let v = judge(&clean_memory_run());
    assert!(v.passed(), "{:?}", v.findings);
    let t = v.memory.unwrap();
    assert_eq!((t.prompts, t.prompts_with_memory), (2, 1));
    assert_eq!((t.messages, t.embedded_once), (4, 4));
    assert_eq!((t.exchanges, t.categorised_once), (2, 2));
    assert_eq!((t.summary_versions, t.messages_summarised), (2, 4));
}

#[test]
fn a_prompt_carrying_another_persons_canary_fails_the_run() {
    let mut e = clean_memory_run();
    let c = Canaries::new(SALT);
    let own = c.mark(0, "s0#0");
    let leaked = format!("recall: {}\n<<<MSG-x\n{own}\nMSG-x>>>", c.mark(1, "s1#0"));
    e.runner_calls[0].canaries = PromptCanaries::of_prompt(&leaked, &[own.as_str()]);
    let v = judge(&e);
    assert_eq!(v.count(Kind::ForeignCanary), 1, "{:?}", v.findings);
    assert!(
        v.findings[&Kind::ForeignCanary][0]
            .evidence
            .contains(&c.of(1))
    );

    let mut e = clean_memory_run();
    memory(&mut e).model_prompts[0].canaries.push(c.of(1));
    memory(&mut e).summaries[0].canaries.push(c.of(1));
    let v = judge(&e);
    for kind in [Kind::ModelPromptMixed, Kind::SummaryOfAnotherPerson] {
        assert_eq!(v.count(kind), 1, "{kind:?}: {:?}", v.findings);
    }

    let mut e = clean_memory_run();
    memory(&mut e).messages[0].canaries.push(c.of(1));
    assert_eq!(judge(&e).count(Kind::KeyMixesPeople), 1);
}

#[test]
fn a_message_not_embedded_or_embedded_for_someone_else_fails_the_run() {
    let mut e = clean_memory_run();
    memory(&mut e).vectors.remove(0);
    memory(&mut e).vectors[0].person_id = "p1".into();
    let v = judge(&e);
    assert_eq!(v.count(Kind::NotEmbeddedOnce), 1, "{:?}", v.findings);
    assert_eq!(v.count(Kind::VectorOfAnotherPerson), 1, "{:?}", v.findings);
}

#[test]
fn an_exchange_unlabelled_or_announced_twice_fails_the_run() {
    let mut e = clean_memory_run();
    let twice = memory(&mut e).categorised_events[0].clone();
    memory(&mut e).categorised_events.push(twice);
    memory(&mut e).categories.remove(1);
    let v = judge(&e);
    assert_eq!(
        v.count(Kind::CategorisedEventsNotOnce),
        1,
        "{:?}",
        v.findings
    );
    assert_eq!(v.count(Kind::NotCategorisedOnce), 1, "{:?}", v.findings);

    let mut e = clean_memory_run();
    memory(&mut e).categories[0].inbound_id = None;
    assert_eq!(judge(&e).count(Kind::LabelWithoutItsMessage), 1);
}

#[test]
fn a_summary_that_passes_a_message_over_doubles_a_version_or_leaves_messages_fails_the_run() {
    // A message minted inside version 1's range but logged after it was written, and never
    // merged by a later version: left unsummarised, named.
    let mut e = clean_memory_run();
    let late = id(10, 3);
    memory(&mut e).messages.push(LoggedMessage {
        id: late.clone(),
        memory_key: key(0),
        person_id: "p0".into(),
        direction: "outbound".into(),
        kind: Some("notice".into()),
        logged_ms: T0 + 30_000,
        ..Default::default()
    });
    memory(&mut e).vectors.push(VectorRow {
        message_id: late.clone(),
        model: "fake".into(),
        person_id: "p0".into(),
    });
    let v = judge(&e);
    assert_eq!(v.count(Kind::NotSummarised), 1, "{:?}", v.findings);
    assert!(
        v.findings[&Kind::NotSummarised][0].evidence.contains(&late),
        "the finding names the message passed over: {:?}",
        v.findings
    );
    // The same message merged by a version 2 that counted it: clean.
    memory(&mut e).messages.last_mut().unwrap().summary_version = Some(2);
    memory(&mut e).summaries[0].version = 2;
    memory(&mut e).summaries[0].messages_covered = 3;
    let mut v2 = memory(&mut e).summarised[0].clone();
    (v2.version, v2.merged, v2.covered) = (2, 1, 3);
    memory(&mut e).summarised.push(v2);
    let v = judge(&e);
    assert!(v.findings.is_empty(), "{:?}", v.findings);
    // Marked by version 1, which said it merged two: merged twice or miscounted.
    memory(&mut e).messages.last_mut().unwrap().summary_version = Some(1);
    let v = judge(&e);
    assert_eq!(v.count(Kind::SummaryCoverage), 2, "{:?}", v.findings);
    // A mark of a version never written.
    memory(&mut e).messages.last_mut().unwrap().summary_version = Some(3);
    let v = judge(&e);
    assert!(
        v.findings[&Kind::SummaryCoverage]
            .iter()
            .any(|f| f.evidence.contains("carry version 3")),
        "{:?}",
        v.findings
    );

    // Version 1 written twice, differently; version 2 of the other key missing.
    let mut e = clean_memory_run();
    let mut again = memory(&mut e).summarised[0].clone();
    again.merged = 1;
    memory(&mut e).summarised.push(again);
    memory(&mut e).summaries[1].version = 2;
    let v = judge(&e);
    assert_eq!(v.count(Kind::SummaryVersions), 2, "{:?}", v.findings);

    // A message after the summary's last one, never summarised.
    let mut e = clean_memory_run();
    memory(&mut e).messages[3].summary_version = None;
    memory(&mut e).summaries[1].last_message = Some(id(100, 1));
    memory(&mut e).summaries[1].messages_covered = 1;
    memory(&mut e).summarised[1].last_message = id(100, 1);
    memory(&mut e).summarised[1].merged = 1;
    memory(&mut e).caught_up = false;
    let v = judge(&e);
    assert_eq!(v.count(Kind::NotSummarised), 1, "{:?}", v.findings);
    assert_eq!(v.count(Kind::MemoryNotCaughtUp), 1, "{:?}", v.findings);
    assert_eq!(v.memory.unwrap().messages_unsummarised, 1);
}

#[test]
fn a_person_back_after_their_summary_whose_prompt_forgot_them_fails_the_run() {
    let mut e = clean_memory_run();
    // Sender 1's prompt carries their summary; sender 0's carries nothing but the message.
    memory(&mut e).returned = [0usize, 1]
        .into_iter()
        .map(|sender| Returned {
            sender,
            index: 0,
            summarised_before: true,
            accepted: true,
            ..Default::default()
        })
        .collect();
    let v = judge(&e);
    assert_eq!(v.count(Kind::ReturnerForgotten), 1, "{:?}", v.findings);
    assert!(
        v.findings[&Kind::ReturnerForgotten][0]
            .evidence
            .contains("s0#0"),
        "{:?}",
        v.findings
    );
    let t = v.memory.unwrap();
    assert_eq!((t.returned_summarised, t.returned_remembered), (2, 1));

    // One who came back before their summary was written is not held to it.
    memory(&mut e).returned[0].summarised_before = false;
    let v = judge(&e);
    assert!(v.passed(), "{:?}", v.findings);
}
