//! Every accepted message answered, once: a turn, one inbound log row, a reply that reached its
//! far end (the provider, or the chat or API client), or on a channel without a log one the
//! ledger recorded failed as [`no_log`](super::no_log) allows, one outbound log row.
use super::index::Index;
use super::{Evidence, Kind, Verdict, no_log, secs};

/// Every accepted message: a turn, one inbound row, a reply that reached its far end (its
/// own, or the one it was joined into) or failed as its channel promises, one outbound row
/// answering it.
pub(super) fn judge(e: &Evidence, ix: &Index, v: &mut Verdict) {
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
        let reply_id = turn.and_then(|t| t.reply_id.as_deref()).unwrap_or_default();
        // Recorded failed whether or not the provider took the part first: its dead letter
        // is excused either way, and only one the provider never took is not answered.
        let what = format!("the reply to {text}");
        let failed = no_log::recorded_failure(e, a.channel, reply_id, what, replies.is_some());
        let lost = match a.channel.mailbox_channel() {
            None if failed.is_some() => None,
            None => replies.is_none().then(|| {
                (
                    Kind::ReplyNeverSent,
                    format!(
                        "no {} reply at the provider{}",
                        a.channel.name(),
                        no_log::ledger_says(e, reply_id)
                    ),
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
        match (&lost, &failed) {
            (Some(_), _) => tally.lost += 1,
            (None, Some(f)) if !f.delivered => tally.failed_recorded += 1,
            (None, _) => tally.answered += 1,
        }
        v.failed_recorded.extend(failed);
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
