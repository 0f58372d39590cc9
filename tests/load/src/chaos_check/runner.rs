//! The runner's calls (re-runs included): each person's turns in their order, one at a time,
//! joined only in order and only under `collect`, each call naming only its person; a turn
//! called again only as [`reruns`] allows.
use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Evidence, Kind, Verdict, reruns, secs};
use crate::channels::Channel;
use crate::observers::CallRecord;
use crate::parse_text;

/// One runner call as the order checks see it: the person's messages it carried.
struct CallView<'a> {
    call: &'a CallRecord,
    /// (index, text) of every message, in the prompt's order.
    messages: Vec<(u32, &'a str)>,
    /// The turn numbers it spans (the first from the prompt; joined ones follow it).
    seqs: (i64, i64),
}

impl CallView<'_> {
    fn head(&self) -> (u32, &str) {
        self.messages[0]
    }

    fn max_index(&self) -> u32 {
        self.messages.iter().map(|(i, _)| *i).max().unwrap_or(0)
    }
}

/// Order, overlap, joins and identity at the runner, over every call (re-runs included).
pub(super) fn judge_runner_calls(
    e: &Evidence,
    channel_of: &HashMap<usize, Channel>,
    collects: &HashSet<usize>,
    v: &mut Verdict,
) {
    let mut by_sender: BTreeMap<usize, Vec<&CallRecord>> = BTreeMap::new();
    for c in &e.runner_calls {
        match parse_text(c.messages()[0]) {
            Some((sender, _)) => by_sender.entry(sender).or_default().push(c),
            None => v.add(
                Kind::WrongPersonInPrompt,
                format!(
                    "a runner call at {} carries no message of the run: {:?}",
                    secs(c.start_us),
                    c.text
                ),
            ),
        }
    }
    let mut distinct: HashSet<&str> = HashSet::new();
    let mut groups: HashSet<Vec<&str>> = HashSet::new();
    for (sender, mut calls) in by_sender {
        calls.sort_by_key(|c| c.start_us);
        let person = channel_of
            .get(&sender)
            .copied()
            .unwrap_or_default()
            .person(sender);
        let mut views: Vec<CallView> = Vec::new();
        for c in calls {
            let mut messages = Vec::new();
            for text in c.messages() {
                match parse_text(text) {
                    Some((s, i)) if s == sender => messages.push((i, text)),
                    _ => v.add(
                        Kind::WrongPersonInPrompt,
                        format!(
                            "the call for {} at {} ({person}) also carries {text:?}",
                            c.text,
                            secs(c.start_us)
                        ),
                    ),
                }
            }
            let first = c.seq.unwrap_or(-1);
            let seqs = (first, first + messages.len().max(1) as i64 - 1);
            views.push(CallView {
                call: c,
                messages,
                seqs,
            });
        }
        let mut heads: HashSet<&str> = HashSet::new();
        for (i, cv) in views.iter().enumerate() {
            let c = cv.call;
            let (index, head_text) = cv.head();
            let seq = cv.seqs.0;
            if c.person != person {
                v.add(
                    Kind::WrongPersonInPrompt,
                    format!(
                        "the call for {} at {} names person {:?}, not {person}",
                        c.text,
                        secs(c.start_us),
                        c.person
                    ),
                );
            }
            distinct.extend(cv.messages.iter().map(|(_, t)| *t));
            if !heads.insert(head_text) {
                v.reruns += 1;
                if let Some(first) = views[..i].iter().find(|f| f.head().1 == head_text) {
                    reruns::judge_rerun(e, &person, first.call, c, v);
                }
            }
            if cv.messages.len() > 1 {
                let texts: Vec<&str> = cv.messages.iter().map(|(_, t)| *t).collect();
                if groups.insert(texts.clone()) {
                    v.joined_calls += 1;
                    v.joined_messages += texts.len() as u64;
                }
                if !cv.messages.windows(2).all(|w| w[0].0 < w[1].0) {
                    v.add(
                        Kind::JoinedOutOfOrder,
                        format!(
                            "{person}: the call at {} joins {texts:?}, not in the order sent",
                            secs(c.start_us)
                        ),
                    );
                }
                if !collects.contains(&sender) {
                    v.add(
                        Kind::JoinedUnderFollowup,
                        format!(
                            "{person} talks to a followup agent ({:?}), yet the call at {} \
                             joins {texts:?}",
                            c.agent,
                            secs(c.start_us)
                        ),
                    );
                }
            }
            // A call that carried a later message of the person, before this one (and is
            // not this same turn called again), ran ahead of it.
            if let Some(ahead) = views[..i].iter().find(|earlier| {
                earlier.head().1 != head_text
                    && (earlier.max_index() > index || (seq >= 0 && earlier.seqs.1 > seq))
            }) {
                let ahead_texts: Vec<&str> = ahead.messages.iter().map(|(_, t)| *t).collect();
                v.add(
                    Kind::RunnerOrder,
                    format!(
                        "{person}: {head_text} (turn {seq}) called at {} after {} (turn {}, called {})",
                        secs(c.start_us),
                        ahead_texts.join(" "),
                        ahead.seqs.1,
                        secs(ahead.call.start_us)
                    ),
                );
            }
            // Calls that began earlier and had not ended when this one began.
            for earlier in &views[..i] {
                if earlier.call.end_us.is_none_or(|end| end > c.start_us) {
                    let (kind, what) = if earlier.head().1 == head_text {
                        (Kind::TurnRunBesideItself, "its own earlier call")
                    } else {
                        (Kind::OverlappingTurns, "another turn")
                    };
                    v.add(
                        kind,
                        format!(
                            "{person}: {head_text} began at {} while {what} ({}, begun {}) still ran",
                            secs(c.start_us),
                            earlier.head().1,
                            secs(earlier.call.start_us)
                        ),
                    );
                }
            }
        }
    }
    v.distinct_turns_called = distinct.len() as u64;
    if !collects.is_empty() && v.joined_calls == 0 {
        v.add(
            Kind::NothingJoined,
            format!(
                "{} people talk to the collect agent, yet no runner call joined two messages: \
                 the run shows nothing about collect",
                collects.len()
            ),
        );
    }
}
