//! How the runtime settles a message it is done with, as data: the outcomes it counts, why it
//! gives one up (what a stage's give-up hook is told), and the dead letter's dedupe id.
use std::time::Duration;

/// Every outcome a stage's messages are counted under (`sb_stage_messages_total{stage,outcome}`).
/// All are registered at 0 when a stage starts, so a dashboard sees each series before it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageOutcome {
    /// Handled; its outputs published and the input acked.
    Ok,
    /// Failed (or its outputs could not be published): back to the stream after a delay.
    Retried,
    /// Waiting for another worker (a predecessor, a lease): parked in the process.
    Deferred,
    /// Waiting out an outage of something outside Switchboard (the agent's runner).
    WaitingOutage,
    /// Given up on and stored on `sb.dlq.<stage>`.
    DeadLettered,
}

impl MessageOutcome {
    pub const ALL: [MessageOutcome; 5] = [
        MessageOutcome::Ok,
        MessageOutcome::Retried,
        MessageOutcome::Deferred,
        MessageOutcome::WaitingOutage,
        MessageOutcome::DeadLettered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MessageOutcome::Ok => "ok",
            MessageOutcome::Retried => "retried",
            MessageOutcome::Deferred => "deferred",
            MessageOutcome::WaitingOutage => "waiting_outage",
            MessageOutcome::DeadLettered => "dead_lettered",
        }
    }

    pub(crate) fn count(self, stage: &'static str, n: u64) {
        metrics::counter!("sb_stage_messages_total", "stage" => stage, "outcome" => self.as_str())
            .increment(n);
    }
}

/// Why the runtime gives a message up: what the stage's give-up hook is told, typed so a stage
/// can act on the cause (the error its handler returned) rather than on the reason's wording.
/// Its text (`Display`) is the dead letter's reason.
#[derive(Debug)]
pub enum GiveUp {
    /// The handler answered that retrying cannot help ([`crate::StageError::Permanent`]): its
    /// error, as the handler made it (a stage may downcast it to its own error type).
    Rejected(anyhow::Error),
    /// The failure budget is used up: delivery `deliveries` (`max_deliver`) failed too.
    OutOfDeliveries {
        deliveries: u64,
        error: anyhow::Error,
    },
    /// Delivered more than `max` times without its handler finishing: it may be crashing the
    /// process, so it is not run again.
    Crashing { delivered: u64, max: u64 },
    /// It waited for `what` longer than `runtime.max_wait_ms` (`max`).
    WaitedTooLong {
        what: String,
        waited: Duration,
        max: Duration,
    },
}

impl GiveUp {
    /// The handler's error, when it was an error that gave the message up.
    pub fn error(&self) -> Option<&anyhow::Error> {
        match self {
            GiveUp::Rejected(error) | GiveUp::OutOfDeliveries { error, .. } => Some(error),
            GiveUp::Crashing { .. } | GiveUp::WaitedTooLong { .. } => None,
        }
    }
}

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GiveUp::Rejected(error) => write!(f, "{error:#}"),
            GiveUp::OutOfDeliveries { deliveries, error } => {
                write!(f, "gave up after {deliveries} deliveries: {error:#}")
            }
            GiveUp::Crashing { delivered, max } => write!(
                f,
                "delivered {delivered} times without success (max {max}); the handler may be \
                 crashing the process"
            ),
            GiveUp::WaitedTooLong { what, waited, max } => write!(
                f,
                "waited too long for {what}: {:.0} s (max {:.0} s)",
                waited.as_secs_f64(),
                max.as_secs_f64()
            ),
        }
    }
}

/// The dedupe id of `stage`'s dead letter of the message at `stream_sequence`: stable for a
/// known sequence, so a dead letter published again for the same message (its ack was lost) is
/// dropped by JetStream; unique when the sequence is unknown (0: the message's metadata could
/// not be read), so two such letters are never taken for one.
pub(crate) fn dead_letter_id(stage: &str, stream_sequence: u64) -> String {
    if stream_sequence == 0 {
        format!("{stage}:unknown:{}", uuid::Uuid::now_v7())
    } else {
        format!("{stage}:{stream_sequence}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_of_a_known_message_keeps_one_id_and_unknown_ones_never_share_one() {
        assert_eq!(dead_letter_id("dispatch", 42), "dispatch:42");
        assert_eq!(
            dead_letter_id("dispatch", 42),
            dead_letter_id("dispatch", 42)
        );
        let (a, b) = (dead_letter_id("dispatch", 0), dead_letter_id("dispatch", 0));
        assert_ne!(a, b, "the second would be dropped as a duplicate");
        assert!(a.starts_with("dispatch:"), "{a}");
    }

    #[test]
    fn every_outcome_has_its_own_series_name() {
        let names: std::collections::HashSet<_> =
            MessageOutcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(names.len(), MessageOutcome::ALL.len());
    }

    #[test]
    fn a_give_up_reads_as_the_dead_letters_reason() {
        let rejected = GiveUp::Rejected(anyhow::anyhow!("no agent named \"x\""));
        assert_eq!(rejected.to_string(), "no agent named \"x\"");
        assert!(rejected.error().is_some());
        let waited = GiveUp::WaitedTooLong {
            what: "turn 2".into(),
            waited: Duration::from_secs(31),
            max: Duration::from_secs(30),
        };
        assert_eq!(
            waited.to_string(),
            "waited too long for turn 2: 31 s (max 30 s)"
        );
        assert!(waited.error().is_none());
    }
}
