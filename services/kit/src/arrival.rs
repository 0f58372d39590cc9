//! Arrival order: each sender's messages numbered in the order the gateway accepted them.
//!
//! Stages between the gateway and the session run messages concurrently and a crashed worker's
//! message comes back only after `ack_wait`, so a person's second message can overtake the first.
//! The gateway therefore numbers every sender's messages before it publishes them (1, 2, 3, …
//! per channel address) and the session stage places a message only once its predecessor is
//! placed (see `switchboard-session`).
//!
//! The counter is a JetStream key-value bucket (one key per sender, compare-and-set on the key's
//! revision), so any number of gateway replicas agree without Postgres on the ingress path. A key
//! idle for longer than the bucket's max age expires; the next message starts a new *epoch*
//! (the creation time) at 1, and the session stage treats a newer epoch as a fresh start.
//!
//! A provider retry of one of the sender's latest messages (same provider id) gets that
//! message's number again, so a retry after a gateway crash or a failed publish leaves no gap,
//! even when the sender wrote again in between. A number can still be lost (a gateway dies
//! between counting and publishing and the provider never retries); the session stage stops
//! waiting for it after `session.arrival_gap_timeout_ms`.
//!
//! An agent's wake-up is numbered too, when it fires ([`ArrivalCounter::number_input`]): it is
//! not the person's message, but it comes after every message they sent before it fired, and
//! it must not be answered before those that are still on their way.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use tokio::sync::OnceCell;

use crate::topology::Topology;

/// A message's place among its sender's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// When the sender's counter was (re)created, ms since the Unix epoch.
    pub epoch: i64,
    /// 1 for the sender's first message in the epoch.
    pub seq: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ArrivalError {
    #[error("arrival counter bucket unavailable: {0}")]
    Bucket(String),
    #[error("reading the arrival counter: {0}")]
    Read(#[from] kv::EntryError),
    #[error("updating the arrival counter: {0}")]
    Write(String),
    #[error("arrival counter still contended after {0} attempts")]
    Contended(usize),
}

/// How many compare-and-set rounds one message may take. Each lost round means another
/// gateway counted a message of the same sender in between, so this is never reached in
/// practice; it bounds the loop.
const MAX_ATTEMPTS: usize = 32;

/// The bucket's key for a sender: the channel and a digest of the address, so phone numbers do
/// not show up in subject names (monitoring, logs) and every address is a valid key.
pub fn sender_key(channel: &str, sender: &str) -> String {
    let hex = sender_token(channel, sender);
    let channel: String = channel
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("{channel}.{hex}")
}

pub use crate::topology::sender_token;

/// How many of a sender's latest messages keep their number for a provider retry.
const RECENT: usize = 8;

/// What a key holds (JSON): the epoch, the last number given, and the provider ids of the
/// sender's latest messages with their numbers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct CounterValue {
    epoch: i64,
    seq: u64,
    /// Newest first, at most [`RECENT`].
    recent: Vec<(String, u64)>,
    /// The sender's messages in the current minute, for the per-sender rate limit (kept in the
    /// same key so limiting costs no extra write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window: Option<RateWindow>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct RateWindow {
    /// Start of the minute, ms since the Unix epoch.
    start_ms: i64,
    count: u32,
    /// Whether the sender was already told they are limited in this minute.
    told: bool,
}

/// The rate limit's window.
const WINDOW_MS: i64 = 60_000;

/// Whether a sender's message may go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Numbered: publish it.
    Accepted(Arrival),
    /// Over `per_minute` in this minute: not numbered. `first` is true for exactly one limited
    /// message per sender and minute (across gateway replicas): the one whose sender is told.
    Limited {
        first: bool,
        retry_after: std::time::Duration,
    },
}

impl CounterValue {
    /// The window `now_ms` falls in, carried over from this value if it is the same minute.
    fn window_at(&self, now_ms: i64) -> RateWindow {
        let start_ms = now_ms - now_ms.rem_euclid(WINDOW_MS);
        match self.window {
            Some(w) if w.start_ms == start_ms => w,
            _ => RateWindow {
                start_ms,
                count: 0,
                told: false,
            },
        }
    }
}

impl CounterValue {
    fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("a counter serialises"))
    }

    fn decode(b: &[u8]) -> Option<Self> {
        serde_json::from_slice(b).ok()
    }

    /// The number `provider_id` already has, if it is one of the sender's latest messages.
    fn number_of(&self, provider_id: &str) -> Option<u64> {
        if provider_id.is_empty() {
            return None;
        }
        self.recent
            .iter()
            .find(|(id, _)| id == provider_id)
            .map(|(_, n)| *n)
    }

    /// The value after counting `provider_id`, given the current one (if any). A counter
    /// that cannot go on (none yet, or at the end of `u64`) starts a new epoch at 1.
    /// `counted`: whether the message counts toward the sender's per-minute limit (one the
    /// sender did not write, an agent's wake-up, does not).
    fn next(
        current: Option<&CounterValue>,
        provider_id: &str,
        now_ms: i64,
        counted: bool,
    ) -> CounterValue {
        let (epoch, seq, mut recent) = match current.and_then(|c| Some((c, c.seq.checked_add(1)?)))
        {
            Some((c, seq)) => (c.epoch, seq, c.recent.clone()),
            None => (now_ms, 1, Vec::new()),
        };
        recent.insert(0, (provider_id.to_string(), seq));
        recent.truncate(RECENT);
        let mut window = current.map_or(
            RateWindow {
                start_ms: now_ms - now_ms.rem_euclid(WINDOW_MS),
                count: 0,
                told: false,
            },
            |c| c.window_at(now_ms),
        );
        if counted {
            window.count = window.count.saturating_add(1);
        }
        CounterValue {
            epoch,
            seq,
            recent,
            window: Some(window),
        }
    }
}

/// Numbers each sender's messages; shared by every ingress of a process.
#[derive(Clone)]
pub struct ArrivalCounter {
    js: jetstream::Context,
    bucket: String,
    store: std::sync::Arc<OnceCell<kv::Store>>,
}

impl ArrivalCounter {
    pub fn new(js: jetstream::Context, topology: &Topology) -> Self {
        Self {
            js,
            bucket: topology.arrivals_bucket(),
            store: Default::default(),
        }
    }

    async fn store(&self) -> Result<&kv::Store, ArrivalError> {
        self.store
            .get_or_try_init(|| async {
                self.js
                    .get_key_value(&self.bucket)
                    .await
                    .map_err(|e| ArrivalError::Bucket(e.to_string()))
            })
            .await
    }

    /// The arrival of the message `provider_id` from `sender` on `channel`: the sender's next
    /// number, or the same number again for a retry of one of the latest messages (whatever the
    /// count); [`Admission::Limited`] when the sender already sent `per_minute` messages this
    /// minute (0: no limit).
    pub async fn admit(
        &self,
        channel: &str,
        sender: &str,
        provider_id: &str,
        per_minute: u32,
    ) -> Result<Admission, ArrivalError> {
        self.count(channel, sender, provider_id, Some(per_minute))
            .await
    }

    /// Place an input the sender did not write (an agent's wake-up, `provider_id` its own key)
    /// among the sender's messages: after every one the gateway numbered before it, so the
    /// session stage gives it its turn only once those have theirs. Never limited, and not
    /// counted toward the sender's per-minute limit. A retry with the same `provider_id` gets
    /// the same number, as a provider's retry does.
    pub async fn number_input(
        &self,
        channel: &str,
        sender: &str,
        provider_id: &str,
    ) -> Result<Arrival, ArrivalError> {
        match self.count(channel, sender, provider_id, None).await? {
            Admission::Accepted(arrival) => Ok(arrival),
            Admission::Limited { .. } => unreachable!("an uncounted input is never limited"),
        }
    }

    /// `per_minute`: the limit the message is counted toward (0: none); `None`: not counted.
    async fn count(
        &self,
        channel: &str,
        sender: &str,
        provider_id: &str,
        per_minute: Option<u32>,
    ) -> Result<Admission, ArrivalError> {
        let store = self.store().await?;
        let key = sender_key(channel, sender);
        for _ in 0..MAX_ATTEMPTS {
            let entry = store.entry(key.as_str()).await?;
            let (current, revision) = match &entry {
                Some(e) if e.operation == kv::Operation::Put => {
                    (CounterValue::decode(&e.value), e.revision)
                }
                // Deleted or purged by an operator: start over on top of the marker.
                Some(e) => (None, e.revision),
                None => (None, 0),
            };
            if let Some(c) = &current
                && let Some(seq) = c.number_of(provider_id)
            {
                return Ok(Admission::Accepted(Arrival {
                    epoch: c.epoch,
                    seq,
                }));
            }
            let now_ms = crate::now_ms();
            if let Some(c) = &current
                && let Some(per_minute) = per_minute.filter(|&n| n > 0)
                && c.window_at(now_ms).count >= per_minute
            {
                let mut window = c.window_at(now_ms);
                let retry_after = std::time::Duration::from_millis(
                    (window.start_ms + WINDOW_MS - now_ms).max(0) as u64,
                );
                if window.told {
                    return Ok(Admission::Limited {
                        first: false,
                        retry_after,
                    });
                }
                // Only the replica whose write lands tells the sender.
                window.told = true;
                let told = CounterValue {
                    window: Some(window),
                    ..c.clone()
                };
                match store.update(key.as_str(), told.encode(), revision).await {
                    Ok(_) => {
                        return Ok(Admission::Limited {
                            first: true,
                            retry_after,
                        });
                    }
                    Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                    Err(e) => return Err(ArrivalError::Write(e.to_string())),
                }
            }
            let next =
                CounterValue::next(current.as_ref(), provider_id, now_ms, per_minute.is_some());
            match store.update(key.as_str(), next.encode(), revision).await {
                Ok(_) => {
                    return Ok(Admission::Accepted(Arrival {
                        epoch: next.epoch,
                        seq: next.seq,
                    }));
                }
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(ArrivalError::Write(e.to_string())),
            }
        }
        Err(ArrivalError::Contended(MAX_ATTEMPTS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_keys_are_valid_kv_keys_and_distinct_per_channel() {
        let a = sender_key("sms", "+15551234567");
        let b = sender_key("admin_chat", "+15551234567");
        assert_ne!(a, b);
        assert!(a.starts_with("sms."));
        assert!(
            !a.contains("1555"),
            "the address is not readable in the key"
        );
        for k in [&a, &b, &sender_key("we.ird ch*", "x")] {
            assert!(
                k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_'),
                "{k}"
            );
        }
    }

    #[test]
    fn counting_starts_an_epoch_then_increments_within_it() {
        let first = CounterValue::next(None, "SM1", 1_000, true);
        assert_eq!((first.epoch, first.seq), (1_000, 1));
        let second = CounterValue::next(Some(&first), "SM2", 9_999, true);
        assert_eq!((second.epoch, second.seq), (1_000, 2));
        assert_eq!(CounterValue::decode(&second.encode()), Some(second));
    }

    #[test]
    fn a_retry_of_a_recent_message_finds_its_number_an_old_one_does_not() {
        let mut v = CounterValue::next(None, "SM1", 1, true);
        for i in 2..=RECENT as u64 + 1 {
            v = CounterValue::next(Some(&v), &format!("SM{i}"), 1, true);
        }
        assert_eq!(v.number_of("SM2"), Some(2));
        assert_eq!(
            v.number_of(&format!("SM{}", RECENT + 1)),
            Some(RECENT as u64 + 1)
        );
        assert_eq!(
            v.number_of("SM1"),
            None,
            "only the latest {RECENT} are kept"
        );
        assert_eq!(v.number_of(""), None);
    }

    #[test]
    fn a_counter_at_the_end_of_its_range_starts_a_new_epoch() {
        let full = CounterValue {
            epoch: 5,
            seq: u64::MAX,
            recent: vec![],
            window: None,
        };
        let next = CounterValue::next(Some(&full), "SMx", 77, true);
        assert_eq!((next.epoch, next.seq), (77, 1));
    }

    #[test]
    fn the_window_counts_a_senders_messages_per_minute_and_a_new_minute_starts_over() {
        let mut v = CounterValue::next(None, "SM1", 60_000 * 10 + 5, true);
        v = CounterValue::next(Some(&v), "SM2", 60_000 * 10 + 59_999, true);
        assert_eq!(v.window_at(60_000 * 10 + 59_999).count, 2);
        assert_eq!(v.window_at(60_000 * 11).count, 0, "a new minute");
        let later = CounterValue::next(Some(&v), "SM3", 60_000 * 11 + 1, true);
        assert_eq!(later.window.unwrap().count, 1);
        assert!(!later.window.unwrap().told);
        // A value written before the window existed still reads.
        let old = br#"{"epoch":1,"seq":3,"recent":[["SM3",3]]}"#;
        assert_eq!(CounterValue::decode(old).unwrap().window, None);
    }

    #[test]
    fn an_input_the_sender_did_not_write_is_numbered_but_not_counted_toward_their_limit() {
        let v = CounterValue::next(None, "SM1", 60_000 * 10 + 5, true);
        let woke = CounterValue::next(Some(&v), "wakeup:1", 60_000 * 10 + 6, false);
        assert_eq!((woke.epoch, woke.seq), (v.epoch, 2), "numbered after SM1");
        assert_eq!(
            woke.number_of("wakeup:1"),
            Some(2),
            "a retry finds its number"
        );
        assert_eq!(woke.window_at(60_000 * 10 + 7).count, 1, "only SM1 counts");
    }

    #[test]
    fn a_garbled_value_reads_as_no_counter() {
        assert_eq!(CounterValue::decode(b"not a counter"), None);
        assert_eq!(CounterValue::decode(&[0xff, 0xfe]), None);
    }
}
