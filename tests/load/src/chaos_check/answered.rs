//! Every accepted message answered, once: a turn, one inbound log row, a reply that reached its
//! far end (the provider, or the chat or API client), one outbound log row.
use super::index::Index;
use super::{Kind, Verdict, secs};

/// Every accepted message: a turn, one inbound row, a reply that reached its far end (its
/// own, or the one it was joined into), one outbound row answering it.
pub(super) fn judge(ix: &Index, v: &mut Verdict) {
    let Index {
        accepted,
        turn_of,
        inbound_rows,
        outbound_rows,
        sent_for,
        stored_for,
        received_for,
        ..
    } = ix;
    for a in accepted {
        let text = crate::message_text(a.sender, a.index);
        let turn = turn_of.get(a.sid.as_str());
        let status = turn.map_or("missing", |t| t.status.as_str());
        let replies = match a.channel.mailbox_channel() {
            None => sent_for.get(&text),
            Some(_) => stored_for.get(&text),
        };
        let lost = match a.channel.mailbox_channel() {
            None => replies.is_none().then(|| {
                (
                    Kind::ReplyNeverSent,
                    format!("no {} SMS reply", a.channel.name()),
                )
            }),
            Some(_) if replies.is_none() => Some((
                Kind::ReplyNeverSent,
                format!("no {} reply in the mailbox", a.channel.name()),
            )),
            Some(_) => (!received_for.contains(&text)).then(|| {
                (
                    Kind::ReplyNotReceived,
                    format!(
                        "its reply is in the mailbox; the {} client never got it",
                        a.channel.name()
                    ),
                )
            }),
        };
        let tally = v.channels.entry(a.channel).or_default();
        tally.accepted += 1;
        match &lost {
            Some(_) => tally.lost += 1,
            None => tally.answered += 1,
        }
        if let Some(replies) = replies.filter(|r| r.len() > 1) {
            tally.doubled += 1;
            let mut replies = replies.clone();
            replies.sort();
            v.add(
                Kind::AnsweredTwice,
                format!(
                    "{text} ({}) is answered by {} replies: {}",
                    a.sid,
                    replies.len(),
                    replies
                        .iter()
                        .map(|r| format!("{r:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        if let Some((kind, what)) = lost {
            v.add(
                kind,
                format!(
                    "{text} ({}) accepted at {}: {what} (turn {status})",
                    a.sid,
                    secs(a.accepted_us)
                ),
            );
        }
        if turn.is_none() {
            v.add(
                Kind::NoTurn,
                format!(
                    "{text} ({}) accepted at {} has no turn",
                    a.sid,
                    secs(a.accepted_us)
                ),
            );
        }
        match inbound_rows.get(a.sid.as_str()).copied().unwrap_or(0) {
            0 => v.add(
                Kind::NoInboundLogRow,
                format!("{text} ({}) has no inbound log row", a.sid),
            ),
            1 => {}
            n => v.add(
                Kind::InboundLoggedTwice,
                format!("{text} ({}) has {n} inbound log rows", a.sid),
            ),
        }
        if turn.is_some_and(|t| t.status == "done") {
            match outbound_rows.get(&text).copied().unwrap_or(0) {
                0 => v.add(
                    Kind::NoOutboundLogRow,
                    format!("the reply to {text} has no outbound log row"),
                ),
                1 => {}
                n => v.add(
                    Kind::OutboundLoggedTwice,
                    format!("the reply to {text} has {n} outbound log rows"),
                ),
            }
        }
    }
}
