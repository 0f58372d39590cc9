//! The run as a whole: no dead letter (but a deliverer's of a reply failed as its channel
//! promises, [`no_log`](super::no_log)), a readable dead-letter list, a pipeline that settled,
//! every crashed server back.
use super::{Evidence, Kind, Verdict, secs};

/// Dead letters, the dead-letter list, settling, and the servers crashed.
pub(super) fn judge(e: &Evidence, v: &mut Verdict) {
    for d in &e.dead_letters {
        // A product that gave such a reply up after the stage's retries dead-lettered it: for
        // one failed as its channel promises, that letter is part of its recorded failure.
        let recorded = v
            .failed_recorded
            .iter_mut()
            .find(|f| d.stage == "deliver" && d.reply_id.as_deref() == Some(f.reply_id.as_str()));
        if let Some(f) = recorded {
            f.dead_letter = Some(d.seq);
            continue;
        }
        v.add(
            Kind::DeadLetter,
            format!("dead letter #{} from {}: {}", d.seq, d.stage, d.error),
        );
    }
    if let Some(why) = &e.dead_letters_unreadable {
        v.add(
            Kind::DeadLettersUnreadable,
            format!("listing dead letters failed: {why}"),
        );
    }
    if !e.settled {
        v.add(
            Kind::NotSettled,
            "consumers still had pending or unacknowledged messages at the end".into(),
        );
    }
    for c in &e.crashes {
        if !c.recovered {
            v.add(
                Kind::ServerDidNotRecover,
                format!(
                    "{} crashed at {} and did not come back",
                    c.server,
                    secs(c.at_us)
                ),
            );
        }
    }
}
