//! Joined replies (queue mode `collect`) as the turns record them.
use super::index::Index;
use super::{Kind, Verdict};
use crate::parse_answers;

/// A joined reply is committed at its last message's turn; the others record the join.
pub(super) fn judge(ix: &Index, v: &mut Verdict) {
    let Index {
        sends_of,
        stored_of,
        ..
    } = ix;
    let turn_of_key = |key: (usize, u32)| ix.turn_of_key(key);
    let mut groups: Vec<&str> = sends_of
        .keys()
        .chain(stored_of.keys())
        .copied()
        .filter(|t| parse_answers(t).is_some_and(|a| a.len() > 1))
        .collect();
    groups.sort();
    groups.dedup();
    for text in groups {
        let answers = parse_answers(text).unwrap_or_default();
        let Some(&last) = answers.last() else {
            continue;
        };
        let Some(last_turn) = turn_of_key(last) else {
            continue;
        };
        let mut wrong = Vec::new();
        if last_turn.reply_id.is_none() {
            wrong.push(format!(
                "its last message's turn {} holds no reply",
                last_turn.seq
            ));
        }
        for &key in &answers[..answers.len() - 1] {
            let (s, i) = key;
            match turn_of_key(key) {
                Some(t) if t.joined_into == Some(last_turn.seq) && t.reply_id.is_none() => {}
                Some(t) => wrong.push(format!(
                    "s{s}#{i}'s turn {} says joined into {:?}, reply {:?}",
                    t.seq, t.joined_into, t.reply_id
                )),
                None => {}
            }
        }
        if !wrong.is_empty() {
            v.add(
                Kind::JoinNotRecorded,
                format!("the reply {text:?}: {}", wrong.join("; ")),
            );
        }
    }
}
