//! Messages of one sender placed in the order they were sent, whatever order they arrive in:
//! each carries its sender's arrival number (`arrival_seq`, in an epoch), and the session stage
//! places it only after its predecessor, waiting for it (held, then parked) at most the gap
//! timeout.
use std::time::Duration;

/// Where a numbered message stands against its sender's arrival cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The sender's next message: place it and move the cursor to it.
    Next,
    /// Its predecessor is not placed yet: wait.
    Wait,
    /// Waited longer than the gap timeout: place it, move the cursor, forget the missing ones.
    SkipGap,
    /// Behind the cursor (a predecessor given up on, or an old epoch): place it, cursor stays.
    Late,
}

/// The cursor is `(epoch, last placed number)`; `overdue` says the message has waited longer
/// than the gap timeout.
pub fn place_arrival(cursor: (i64, i64), epoch: i64, seq: i64, overdue: bool) -> Placement {
    let (cur_epoch, last) = cursor;
    let next = if epoch == cur_epoch {
        match seq.cmp(&last.saturating_add(1)) {
            std::cmp::Ordering::Equal => return Placement::Next,
            std::cmp::Ordering::Less => return Placement::Late,
            std::cmp::Ordering::Greater => false,
        }
    } else if epoch > cur_epoch {
        // The sender's counter started over (it idled out): its first message is next.
        seq == 1
    } else {
        return Placement::Late;
    };
    match (next, overdue) {
        (true, _) => Placement::Next,
        (false, true) => Placement::SkipGap,
        (false, false) => Placement::Wait,
    }
}

/// How the session stage waits for a sender's earlier message: held briefly (the usual case,
/// two messages a moment apart handled out of order), then parked by the runtime with a growing
/// delay, its handler slot free, so that waiting messages never crowd out the ones they wait
/// for.
#[derive(Debug, Clone, Copy)]
pub struct ArrivalWait {
    pub poll: Duration,
    pub hold: Duration,
    pub retry_max: Duration,
    pub gap_timeout: Duration,
}

impl ArrivalWait {
    pub fn from_config(c: &switchboard_kit::config::SessionConfig) -> Self {
        Self {
            poll: Duration::from_millis(c.arrival_poll_ms.max(1)),
            hold: Duration::from_millis(c.arrival_hold_ms),
            retry_max: Duration::from_millis(c.arrival_retry_max_ms.max(1)),
            gap_timeout: Duration::from_millis(c.arrival_gap_timeout_ms),
        }
    }

    /// Delay before a waiting message that went through `waits` waits is tried again: from
    /// the poll interval, doubling, up to `retry_max`.
    pub fn retry_after(&self, waits: u32) -> Duration {
        switchboard_kit::retry::Backoff::new(self.poll, self.retry_max).delay(u64::from(waits) + 1)
    }

    /// Whether a message that has waited this long (in a running session stage: the runtime
    /// counts a delivery's waits, and a redelivery starts again) may skip a missing
    /// predecessor.
    pub fn overdue(&self, waited: Duration) -> bool {
        waited >= self.gap_timeout
    }
}

/// Count a placement that goes ahead (late, or next after skipping a gap) and say so in the
/// log: the one-message path and the batch record placements the same way.
pub(crate) fn count_placement(
    inbound: &switchboard_kit::proto::InboundMessage,
    placement: Placement,
    seq: i64,
    after: i64,
) {
    match placement {
        Placement::Late => {
            metrics::counter!("sb_session_arrivals_late_total").increment(1);
        }
        Placement::SkipGap => {
            metrics::counter!("sb_session_arrival_gaps_skipped_total").increment(1);
            tracing::warn!(
                correlation_id = %inbound.correlation_id,
                arrival = seq,
                after,
                "gave up waiting for the sender's earlier messages"
            );
        }
        Placement::Next | Placement::Wait => {}
    }
}
