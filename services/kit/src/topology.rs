//! The whole data path in one place: streams, subjects and consumers.
//!
//! ```text
//!  gateway ──► {p}.in.<channel> ──► identify ──► {p}.identified ──► session ──► {p}.turn.<partition>
//!                                                                                 │        │
//!                                                                      log-inbound ◄┘    dispatch
//!                                                                                          │
//!                                         deliver ◄── {p}.reply ──► log-outbound ◄─────────┘
//!  every stage ──► {p}.events.<name> (public, replayable)      failures ──► {p}.dlq.<stage>
//! ```
//!
//! Beside the streams, the `<P>_ARRIVALS` key-value bucket holds one counter per sender: the
//! gateway numbers each sender's messages in the order it accepted them and the session stage
//! places them in that order ([`crate::arrival`]).
//!
//! `{p}` is the subject prefix (`sb` in production). Work subjects live in one stream with
//! Interest retention: a message stays until every consumer that wants it has acked it, so the
//! turn subject feeds both the dispatcher and the inbound log, and the reply subject both the
//! outbound log and delivery. `apply` creates or updates everything idempotently.
use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, stream};

use crate::config::RuntimeConfig;

/// The durable consumers, one per stage. Replicas of a stage share its consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StageName {
    Identify,
    Session,
    Dispatch,
    LogInbound,
    LogOutbound,
    Deliver,
}

impl StageName {
    pub const ALL: [StageName; 6] = [
        StageName::Identify,
        StageName::Session,
        StageName::Dispatch,
        StageName::LogInbound,
        StageName::LogOutbound,
        StageName::Deliver,
    ];

    /// The durable consumer name, also used in metrics, dedupe ids and dead-letter subjects.
    pub fn as_str(self) -> &'static str {
        match self {
            StageName::Identify => "identify",
            StageName::Session => "session",
            StageName::Dispatch => "dispatch",
            StageName::LogInbound => "log-inbound",
            StageName::LogOutbound => "log-outbound",
            StageName::Deliver => "deliver",
        }
    }

    pub fn parse(s: &str) -> Option<StageName> {
        Self::ALL.into_iter().find(|n| n.as_str() == s)
    }
}

impl std::fmt::Display for StageName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Subject and stream names under one prefix.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    partitions: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("creating or updating stream {stream}: {source}")]
    Stream {
        stream: String,
        source: async_nats::jetstream::context::CreateStreamError,
    },
    #[error("creating or updating consumer {consumer}: {source}")]
    Consumer {
        consumer: String,
        source: async_nats::jetstream::stream::ConsumerError,
    },
    #[error("creating or updating key-value bucket {bucket}: {source}")]
    Bucket {
        bucket: String,
        source: async_nats::jetstream::context::CreateKeyValueError,
    },
    #[error("looking up stream {stream}: {source}")]
    GetStream {
        stream: String,
        source: async_nats::jetstream::context::GetStreamError,
    },
}

impl Topology {
    pub fn new(prefix: impl Into<String>, partitions: u32) -> Self {
        Self {
            prefix: prefix.into(),
            partitions: partitions.max(1),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn stream_name(&self, kind: &str) -> String {
        let p: String = self
            .prefix
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect();
        format!("{p}_{kind}")
    }

    pub fn work_stream(&self) -> String {
        self.stream_name("WORK")
    }
    pub fn events_stream(&self) -> String {
        self.stream_name("EVENTS")
    }
    pub fn dlq_stream(&self) -> String {
        self.stream_name("DLQ")
    }
    /// Key-value bucket of per-sender arrival counters (see [`crate::arrival`]).
    pub fn arrivals_bucket(&self) -> String {
        self.stream_name("ARRIVALS")
    }

    /// `sb.in.<channel>`: normalised inbound messages from the gateway.
    pub fn inbound(&self, channel: &str) -> String {
        format!("{}.in.{channel}", self.prefix)
    }
    /// `sb.identified`: inbound messages with the resolved person.
    pub fn identified(&self) -> String {
        format!("{}.identified", self.prefix)
    }
    /// `sb.turn.<partition>`: turns, partitioned by session.
    pub fn turn(&self, session_id: &uuid::Uuid) -> String {
        format!("{}.turn.{}", self.prefix, self.partition_of(session_id))
    }
    pub fn partitions(&self) -> u32 {
        self.partitions
    }
    /// Stable partition of a session: a hash of its id, so every replica agrees.
    pub fn partition_of(&self, session_id: &uuid::Uuid) -> u32 {
        let v = session_id.as_u128();
        ((v ^ (v >> 64)) as u64 % self.partitions as u64) as u32
    }
    /// `sb.reply`: agents' replies, for the log and for delivery.
    pub fn reply(&self) -> String {
        format!("{}.reply", self.prefix)
    }
    /// `sb.events.<name>`: the public event stream (`message.logged`, `reply.delivered`, ...).
    pub fn event(&self, name: &str) -> String {
        format!("{}.events.{name}", self.prefix)
    }
    /// `sb.dlq.<stage>`: dead letters.
    pub fn dead_letter(&self, stage: StageName) -> String {
        format!("{}.dlq.{}", self.prefix, stage.as_str())
    }

    /// What each stage's consumer reads.
    pub fn filter_subject(&self, stage: StageName) -> String {
        match stage {
            StageName::Identify => format!("{}.in.>", self.prefix),
            StageName::Session => self.identified(),
            StageName::Dispatch | StageName::LogInbound => format!("{}.turn.>", self.prefix),
            StageName::LogOutbound | StageName::Deliver => self.reply(),
        }
    }

    pub fn stream_configs(&self, rt: &RuntimeConfig) -> Vec<stream::Config> {
        let p = &self.prefix;
        vec![
            stream::Config {
                name: self.work_stream(),
                description: Some(
                    "Switchboard work subjects (one durable consumer per stage)".into(),
                ),
                subjects: vec![
                    format!("{p}.in.>"),
                    format!("{p}.identified"),
                    format!("{p}.turn.>"),
                    format!("{p}.reply"),
                ],
                retention: stream::RetentionPolicy::Interest,
                storage: stream::StorageType::File,
                duplicate_window: Duration::from_secs(rt.duplicate_window_s),
                ..Default::default()
            },
            stream::Config {
                name: self.events_stream(),
                description: Some("Switchboard public events, replayable by anyone".into()),
                subjects: vec![format!("{p}.events.>")],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                max_age: Duration::from_secs(rt.events_max_age_days * 24 * 3600),
                duplicate_window: Duration::from_secs(rt.duplicate_window_s),
                ..Default::default()
            },
            stream::Config {
                name: self.dlq_stream(),
                description: Some("Switchboard dead letters: stage, error, payload".into()),
                subjects: vec![format!("{p}.dlq.>")],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                max_age: Duration::from_secs(30 * 24 * 3600),
                duplicate_window: Duration::from_secs(rt.duplicate_window_s),
                ..Default::default()
            },
        ]
    }

    pub fn consumer_config(&self, stage: StageName, rt: &RuntimeConfig) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: Some(stage.as_str().to_string()),
            description: Some(format!("Switchboard stage {stage}")),
            filter_subject: self.filter_subject(stage),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_millis(rt.ack_wait_ms),
            // The runtime counts deliveries itself and dead-letters (with the reason) when a
            // message has had enough, including messages whose handler crashed the process.
            max_deliver: -1,
            max_ack_pending: rt.max_ack_pending,
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        }
    }

    /// The arrivals bucket: one value per key (a sender's counter), keys expire when their
    /// sender has been idle for `arrival_counter_idle_days`.
    pub fn arrivals_bucket_config(&self, rt: &RuntimeConfig) -> kv::Config {
        kv::Config {
            bucket: self.arrivals_bucket(),
            description: "Switchboard per-sender arrival counters (gateway → session order)".into(),
            history: 1,
            max_age: Duration::from_secs(rt.arrival_counter_idle_days * 24 * 3600),
            storage: stream::StorageType::File,
            ..Default::default()
        }
    }

    /// Create or update every stream and consumer. Safe to run at every start, from any replica.
    pub async fn apply(
        &self,
        js: &jetstream::Context,
        rt: &RuntimeConfig,
    ) -> Result<(), TopologyError> {
        for cfg in self.stream_configs(rt) {
            let name = cfg.name.clone();
            js.create_or_update_stream(cfg)
                .await
                .map_err(|source| TopologyError::Stream {
                    stream: name,
                    source,
                })?;
        }
        let bucket = self.arrivals_bucket();
        js.create_or_update_key_value(self.arrivals_bucket_config(rt))
            .await
            .map_err(|source| TopologyError::Bucket { bucket, source })?;
        let work =
            js.get_stream(self.work_stream())
                .await
                .map_err(|source| TopologyError::GetStream {
                    stream: self.work_stream(),
                    source,
                })?;
        for stage in StageName::ALL {
            work.create_consumer(self.consumer_config(stage, rt))
                .await
                .map_err(|source| TopologyError::Consumer {
                    consumer: stage.to_string(),
                    source,
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_reads_a_subject_of_the_work_stream() {
        let t = Topology::new("sb", 8);
        let cfg = &t.stream_configs(&RuntimeConfig::default())[0];
        for stage in StageName::ALL {
            let filter = t.filter_subject(stage);
            assert!(
                cfg.subjects.iter().any(|s| s == &filter),
                "{stage} reads {filter}, not in the work stream"
            );
        }
    }

    #[test]
    fn a_session_always_maps_to_the_same_partition() {
        let t = Topology::new("sb", 32);
        let id = uuid::Uuid::now_v7();
        assert_eq!(t.turn(&id), t.turn(&id));
        assert!(t.partition_of(&id) < 32);
    }

    #[test]
    fn stream_names_are_derived_from_the_prefix() {
        let t = Topology::new("t-1a.b", 1);
        assert_eq!(t.work_stream(), "T_1A_B_WORK");
    }
}
