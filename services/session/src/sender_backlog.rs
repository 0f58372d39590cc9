//! Whether a sender's earlier message is still on its way to the session stage.
//!
//! The gap timeout is for a number that will never come: a gateway died between numbering a
//! message and publishing it. Under a backlog a predecessor that was published can take longer
//! than that to get here (a crashed identify worker's message comes back after `ack_wait`,
//! behind minutes of other work), and giving up on it then answers the person out of order.
//! So before a waiting message skips its predecessor, the stage looks for it: up to the session
//! stage a message's subject names its sender ([`Topology::inbound_from`],
//! [`Topology::identified_from`]), and the work stream keeps a message until the one stage that
//! reads its subject acks it. A predecessor published and not yet placed (or passed) is there.
//!
//! The look reads the inbound subject before the identified one: identify publishes a message's
//! identified copy before it acks the inbound one, so a message cannot slip between the two
//! reads unseen. Reads go to the stream's leader (the message-get API), not to a replica that
//! may lag.
use async_nats::jetstream::{self, stream::RawMessageErrorKind};
use prost::Message as _;
use switchboard_kit::Topology;
use switchboard_kit::proto::{IdentifiedMessage, InboundMessage};

/// Messages of one sender read per subject before the look stops and answers "on its way"
/// (a sender with that many messages in flight is not one whose predecessor is lost).
const MAX_READS: usize = 256;

/// Looks for a sender's messages on the work stream.
#[derive(Clone)]
pub struct SenderBacklog {
    js: jetstream::Context,
    topology: Topology,
}

/// A message's place among its sender's: (epoch, number).
type Place = (i64, i64);

/// Whether `other` is a predecessor of `mine` that has not had its turn: same epoch, an
/// earlier number, and past the cursor (a number at or behind the cursor was placed already; a
/// copy of it still on the stream is a retry, not the missing one).
pub(crate) fn is_missing_predecessor(cursor: Place, mine: Place, other: Place) -> bool {
    other.0 == mine.0 && other.1 < mine.1 && (other.0 != cursor.0 || other.1 > cursor.1)
}

impl SenderBacklog {
    pub fn new(js: jetstream::Context, topology: Topology) -> Self {
        Self { js, topology }
    }

    /// Whether a predecessor of `inbound` that has not had its turn (the sender's cursor is
    /// `cursor`) is on the work stream. When the stream cannot be read the answer is yes: the
    /// message waits and the stage looks again later, rather than skip on a guess.
    pub async fn holds_predecessor(&self, inbound: &InboundMessage, cursor: Place) -> bool {
        let mine = (
            inbound.arrival_epoch,
            i64::try_from(inbound.arrival_seq).unwrap_or(i64::MAX),
        );
        let subjects = [
            (
                self.topology
                    .inbound_from(&inbound.channel, &inbound.sender),
                false,
            ),
            (
                self.topology
                    .identified_from(&inbound.channel, &inbound.sender),
                true,
            ),
        ];
        for (subject, identified) in subjects {
            match self.find(&subject, identified, cursor, mine).await {
                Ok(false) => {}
                Ok(true) => return true,
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        correlation_id = %inbound.correlation_id,
                        "could not look for the sender's earlier message on the work stream; waiting for it"
                    );
                    return true;
                }
            }
        }
        false
    }

    async fn find(
        &self,
        subject: &str,
        identified: bool,
        cursor: Place,
        mine: Place,
    ) -> Result<bool, String> {
        let stream = self
            .js
            .get_stream_no_info(self.topology.work_stream())
            .await
            .map_err(|e| e.to_string())?;
        let mut from = 1;
        for _ in 0..MAX_READS {
            let found = stream
                .raw_message_builder()
                .sequence(from)
                .next_by_subject(subject.to_string())
                .send()
                .await;
            let message = match found {
                Ok(m) => m,
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => return Ok(false),
                Err(e) => return Err(e.to_string()),
            };
            from = message.sequence + 1;
            let inbound = if identified {
                IdentifiedMessage::decode(message.payload)
                    .ok()
                    .and_then(|m| m.inbound)
            } else {
                InboundMessage::decode(message.payload).ok()
            };
            // Not ours to judge: whatever cannot be read is not the predecessor we look for.
            let Some(other) = inbound else { continue };
            let place = (
                other.arrival_epoch,
                i64::try_from(other.arrival_seq).unwrap_or(i64::MAX),
            );
            if other.arrival_seq > 0 && is_missing_predecessor(cursor, mine, place) {
                return Ok(true);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::is_missing_predecessor;

    #[test]
    fn only_an_unplaced_earlier_number_of_the_same_epoch_is_a_missing_predecessor() {
        let cursor = (7, 3);
        let mine = (7, 6);
        assert!(is_missing_predecessor(cursor, mine, (7, 4)));
        assert!(is_missing_predecessor(cursor, mine, (7, 5)));
        assert!(!is_missing_predecessor(cursor, mine, (7, 3)), "placed");
        assert!(!is_missing_predecessor(cursor, mine, (7, 1)), "placed");
        assert!(!is_missing_predecessor(cursor, mine, (7, 6)), "itself");
        assert!(!is_missing_predecessor(cursor, mine, (7, 8)), "a later one");
        assert!(
            !is_missing_predecessor(cursor, mine, (5, 4)),
            "an old epoch"
        );
        // A sender whose counter started over: nothing of the new epoch is placed yet.
        assert!(is_missing_predecessor((5, 9), (9, 3), (9, 1)));
        assert!(!is_missing_predecessor((5, 9), (9, 3), (5, 10)));
    }
}
