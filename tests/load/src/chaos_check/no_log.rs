//! Replies on a channel whose provider keeps no log a sender can read (Telegram's Bot API,
//! WhatsApp's Cloud API: [`Channel::keeps_no_log`]). A deliverer records in the ledger that it
//! starts a part, then sends it, then records it sent; one SIGKILLed in between leaves the
//! part's outcome unknown, and the next deliverer, with no log to ask (`find_sent` answers
//! that it cannot), does not send it again: the reply ends in `delivery.failed` with the reason
//! (services/deliver; until 59b4f76 only after the stage's retries, with a dead letter, which
//! the verdict then shows with the failure). The person may or may not have it; never twice.
//!
//! Such a reply is "failed, recorded", counted apart with its evidence, not lost, only when
//! the evidence shows exactly that: its ledger row `failed` with a reason and the attempt whose
//! outcome it never recorded, and a deliverer SIGKILLed after that attempt began and within its
//! lease (alive, it would have recorded the outcome in time). A failed reply without that
//! kill, or on any other channel, is lost; a Slack reply is looked up in its history like an
//! SMS in its provider's list, so it must be sent exactly once.
use super::{Evidence, FailedRecorded, LedgerRow, secs};
use crate::channels::Channel;

/// The deliverer's lease (`switchboard_deliver::DELIVERY_LEASE`): a live sender records its
/// part's outcome within it.
const DELIVERY_LEASE_US: u64 = switchboard_deliver::DELIVERY_LEASE.as_micros() as u64;

/// The database's and the harness's clocks are read apart (the ledger's times are moved onto
/// the harness's by one offset taken at the end): this much either way is the same moment.
const CLOCK_SLACK_US: u64 = 100_000;

fn ledger_row<'a>(e: &'a Evidence, reply_id: &str) -> Option<&'a LedgerRow> {
    e.ledger.iter().find(|l| l.reply_id == reply_id)
}

/// Reply (or notice) `reply_id` on `channel`, described as `what`, as "failed, recorded": the
/// channel keeps no log, its ledger row is `failed` with a reason and an attempt of unknown
/// outcome, and a deliverer was SIGKILLed during that attempt. `None` otherwise. `delivered`:
/// the provider took it (before the deliverer died).
pub(super) fn recorded_failure(
    e: &Evidence,
    channel: Channel,
    reply_id: &str,
    what: String,
    delivered: bool,
) -> Option<FailedRecorded> {
    if !channel.keeps_no_log() {
        return None;
    }
    let row = ledger_row(e, reply_id).filter(|l| l.status == "failed")?;
    let reason = row.last_error.clone().filter(|r| !r.trim().is_empty())?;
    let started = row.attempt_started_us?;
    let killed =
        e.kills.iter().filter(|k| k.kind == "deliver").find(|k| {
            k.at_us + CLOCK_SLACK_US >= started && k.at_us <= started + DELIVERY_LEASE_US
        })?;
    Some(FailedRecorded {
        channel,
        what,
        reply_id: reply_id.to_string(),
        reason,
        attempt_started_us: started,
        killed: killed.clone(),
        delivered,
        dead_letter: None,
    })
}

/// What the ledger says of a reply that did not arrive, for a finding's evidence: its status,
/// reason and unrecorded attempt (empty without a row).
pub(super) fn ledger_says(e: &Evidence, reply_id: &str) -> String {
    match ledger_row(e, reply_id) {
        None => String::new(),
        Some(l) => format!(
            "; ledger: {}{}{}",
            l.status,
            l.last_error
                .as_deref()
                .map(|r| format!(" ({r:?})"))
                .unwrap_or_default(),
            l.attempt_started_us
                .map(|t| format!(", an attempt of unknown outcome from {}", secs(t)))
                .unwrap_or_default(),
        ),
    }
}

impl FailedRecorded {
    /// One line of the report.
    pub fn described(&self) -> String {
        format!(
            "{} ({}): reply {} failed, recorded: its attempt began at {}, {}; {}; {:?}{}",
            self.what,
            self.channel.name(),
            self.reply_id,
            secs(self.attempt_started_us),
            self.killed.described(),
            if self.delivered {
                "the provider had taken it, once"
            } else {
                "the provider never took it"
            },
            self.reason,
            self.dead_letter
                .map(|seq| format!("; dead letter #{seq}"))
                .unwrap_or_default()
        )
    }
}
