//! The whole data path in one place: streams, subjects and consumers.
//!
//! ```text
//!  gateway ──► {p}.in.<channel>.<sender> ──► identify ──► {p}.identified.<channel>.<sender> ──► session ──► {p}.turn.<partition>
//!                                                                                 │        │
//!                                                                      log-inbound ◄┘    dispatch
//!                                                                                          │
//!                                         deliver ◄── {p}.reply ──► log-outbound ◄─────────┘
//!  every stage ──► {p}.events.<name> (public, replayable)      failures ──► {p}.dlq.<stage>
//!  an erasure job (`switchboard forget`) ──► {p}.forget ──► forget-sweep (worker `forget`: sweeps the streams)
//!  deliver (chat, API) ──► mailbox table + {p}.mailbox.<channel> (core NATS) ──► gateways ──► sockets
//! ```
//!
//! Beside the streams, the `<P>_ARRIVALS` key-value bucket holds one counter per sender: the
//! gateway numbers each sender's messages in the order it accepted them and the session stage
//! places them in that order ([`crate::arrival`]). Up to the session stage a message's subject
//! names its sender (a digest, [`sender_token`]), so the session stage can see
//! whether a sender's earlier message is still on its way before it gives up waiting for it.
//!
//! `{p}` is the subject prefix (`sb` in production). Work subjects live in one stream with
//! Interest retention: a message stays until every consumer that wants it has acked it, so the
//! turn subject feeds both the dispatcher and the inbound log, and the reply subject both the
//! outbound log and delivery. `apply` creates or updates everything idempotently.
use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, stream};

use crate::config::RuntimeConfig;
use crate::stage::{Source, StageSpec};

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
    #[error("stage {stage} reads {subject}, which no stream holds")]
    NoStream { stage: String, subject: String },
    #[error("two stages are named {0}")]
    DuplicateStage(String),
    #[error("listing the consumers of {stream}: {reason}")]
    ListConsumers { stream: String, reason: String },
    #[error("deleting consumer {consumer}: {source}")]
    DeleteConsumer {
        consumer: String,
        source: async_nats::jetstream::stream::ConsumerError,
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

    /// `sb.in.<channel>`: normalised inbound messages that name no sender of their own (a
    /// schedule's); a person's messages go on [`Topology::inbound_from`].
    pub fn inbound(&self, channel: &str) -> String {
        format!("{}.in.{channel}", self.prefix)
    }
    /// `sb.in.<channel>.<sender>`: a sender's messages from the gateway (the sender as a digest,
    /// [`sender_token`]).
    pub fn inbound_from(&self, channel: &str, sender: &str) -> String {
        format!(
            "{}.{}",
            self.inbound(channel),
            sender_token(channel, sender)
        )
    }
    /// `sb.identified.<channel>.<sender>`: a sender's messages with the resolved person.
    pub fn identified_from(&self, channel: &str, sender: &str) -> String {
        format!(
            "{}.identified.{channel}.{}",
            self.prefix,
            sender_token(channel, sender)
        )
    }
    /// `sb.identified`: where versions before the sender's subjects published identified
    /// messages; the session stage still reads it, so none published there is stranded by an
    /// upgrade.
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
    /// `sb.events.summary.due`: a person + identity whose summary should take in their newest
    /// messages. On the events stream (the summary stage's own durable consumer), not the work
    /// stream: the NATS users the stack grants publish only the work subjects listed in
    /// `stream_configs`, each already read by other stages.
    pub fn summary_due(&self) -> String {
        self.event("summary.due")
    }
    /// `sb.forget`: an erasure job's stream half, for the forget-sweep stage (on the work
    /// stream: gone once acked; it names only the job).
    pub fn forget_sweep(&self) -> String {
        format!("{}.forget", self.prefix)
    }
    /// `sb.events.<name>`: the public event stream (`message.logged`, `reply.delivered`, ...).
    pub fn event(&self, name: &str) -> String {
        format!("{}.events.{name}", self.prefix)
    }
    /// `sb.mailbox`: core NATS (no stream) announcements of replies stored for chat sockets and
    /// API callers, followed by every gateway as `sb.mailbox.>`. The table is the durable copy;
    /// see `switchboard_channels::mailbox`.
    pub fn mailbox(&self) -> String {
        format!("{}.mailbox", self.prefix)
    }
    /// `sb.dlq.<stage>`: dead letters.
    pub fn dead_letter(&self, stage: &str) -> String {
        format!("{}.dlq.{stage}", self.prefix)
    }

    /// The full subject filter of a stage's consumer.
    pub fn filter_subject(&self, source: Source) -> String {
        match source {
            Source::Work(s) => format!("{}.{s}", self.prefix),
            Source::Events(s) => self.event(s),
        }
    }

    /// Every subject a stage's consumer reads when it reads more than one (else empty).
    pub fn filter_subjects(&self, stage: &StageSpec) -> Vec<String> {
        match stage.also_reads {
            None => Vec::new(),
            Some(old) => vec![
                self.filter_subject(stage.reads),
                self.filter_subject(Source::Work(old)),
            ],
        }
    }

    /// The stream a stage's consumer lives on.
    pub fn stream_of(&self, source: Source) -> String {
        match source {
            Source::Work(_) => self.work_stream(),
            Source::Events(_) => self.events_stream(),
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
                    format!("{p}.identified.>"),
                    format!("{p}.turn.>"),
                    format!("{p}.reply"),
                    format!("{p}.forget"),
                ],
                retention: stream::RetentionPolicy::Interest,
                storage: stream::StorageType::File,
                duplicate_window: Duration::from_secs(rt.duplicate_window_s),
                num_replicas: rt.stream_replicas,
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
                num_replicas: rt.stream_replicas,
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
                num_replicas: rt.stream_replicas,
                ..Default::default()
            },
        ]
    }

    pub fn consumer_config(&self, stage: &StageSpec, rt: &RuntimeConfig) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: Some(stage.name.to_string()),
            description: Some(format!("{STAGE_CONSUMER}{}", stage.name)),
            // A stage that also reads an older subject filters on both (a consumer has either
            // one filter or a list).
            filter_subject: match stage.also_reads {
                None => self.filter_subject(stage.reads),
                Some(_) => String::new(),
            },
            filter_subjects: self.filter_subjects(stage),
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
            num_replicas: rt.stream_replicas,
            ..Default::default()
        }
    }

    /// Check `stages` against the streams: unique names, each reading a subject its stream
    /// holds (a consumer whose filter no stream subject covers would never get a message).
    pub fn check(&self, stages: &[StageSpec], rt: &RuntimeConfig) -> Result<(), TopologyError> {
        let streams = self.stream_configs(rt);
        let mut seen = std::collections::HashSet::new();
        for stage in stages {
            if !seen.insert(stage.name) {
                return Err(TopologyError::DuplicateStage(stage.name.into()));
            }
            let stream = self.stream_of(stage.reads);
            let old = stage
                .also_reads
                .map(|o| self.filter_subject(Source::Work(o)));
            for subject in std::iter::once(self.filter_subject(stage.reads)).chain(old) {
                let held = streams
                    .iter()
                    .filter(|c| c.name == stream)
                    .flat_map(|c| c.subjects.iter())
                    .any(|s| subject_covers(s, &subject));
                if !held {
                    return Err(TopologyError::NoStream {
                        stage: stage.name.into(),
                        subject,
                    });
                }
            }
        }
        Ok(())
    }

    /// Create or update every stream, the arrivals bucket and the consumers of `stages`. Safe to
    /// run at every start, from any replica. Every process that publishes work runs it with the
    /// whole list: the work stream keeps a message only for consumers that exist when it is
    /// published.
    pub async fn apply(
        &self,
        js: &jetstream::Context,
        rt: &RuntimeConfig,
        stages: &[StageSpec],
    ) -> Result<(), TopologyError> {
        self.check(stages, rt)?;
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
        for stage in stages {
            let name = self.stream_of(stage.reads);
            let stream = js
                .get_stream(&name)
                .await
                .map_err(|source| TopologyError::GetStream {
                    stream: name,
                    source,
                })?;
            stream
                .create_consumer(self.consumer_config(stage, rt))
                .await
                .map_err(|source| TopologyError::Consumer {
                    consumer: stage.name.to_string(),
                    source,
                })?;
        }
        for stray in self.strays(js, stages).await? {
            tracing::warn!(
                consumer = %stray,
                stream = %self.work_stream(),
                "a durable consumer of the work stream belongs to no stage: the stream keeps \
                 every message it reads until it is deleted (switchboard streams prune)"
            );
        }
        Ok(())
    }

    /// Durable consumers of the work stream that belong to no stage of `stages` (a stage
    /// renamed or removed). The work stream keeps a message until every consumer reading its
    /// subject acked it, so a stray one makes it keep them forever.
    pub async fn strays(
        &self,
        js: &jetstream::Context,
        stages: &[StageSpec],
    ) -> Result<Vec<String>, TopologyError> {
        use futures::TryStreamExt as _;
        let stream = self.work_stream();
        let list_err = |reason: String| TopologyError::ListConsumers {
            stream: stream.clone(),
            reason,
        };
        let work = js
            .get_stream(&stream)
            .await
            .map_err(|e| list_err(e.to_string()))?;
        let infos: Vec<consumer::Info> = work
            .consumers()
            .try_collect()
            .await
            .map_err(|e| list_err(e.to_string()))?;
        Ok(infos
            .into_iter()
            .filter_map(|i| i.config.durable_name)
            .filter(|name| !stages.iter().any(|s| s.name == name))
            .collect())
    }

    /// Delete the work stream's stray consumers (see [`Topology::strays`]); returns their names.
    pub async fn prune(
        &self,
        js: &jetstream::Context,
        stages: &[StageSpec],
    ) -> Result<Vec<String>, TopologyError> {
        let strays = self.strays(js, stages).await?;
        let work =
            js.get_stream(self.work_stream())
                .await
                .map_err(|source| TopologyError::GetStream {
                    stream: self.work_stream(),
                    source,
                })?;
        for name in &strays {
            work.delete_consumer(name)
                .await
                .map_err(|source| TopologyError::DeleteConsumer {
                    consumer: name.clone(),
                    source,
                })?;
        }
        Ok(strays)
    }
}

/// How [`Topology::consumer_config`] describes a stage's durable consumer: what tells the
/// product's stages from other readers of the same stream (analytics).
const STAGE_CONSUMER: &str = "Switchboard stage ";

/// Whether a consumer is one of the product's stages (see [`STAGE_CONSUMER`]).
pub fn is_stage_consumer(config: &consumer::Config) -> bool {
    config
        .description
        .as_deref()
        .is_some_and(|d| d.starts_with(STAGE_CONSUMER))
}

/// Stream `name`, or None if it was never made (`streams apply` has not run).
pub async fn existing_stream(
    js: &jetstream::Context,
    name: &str,
) -> Result<Option<jetstream::stream::Stream>, jetstream::context::GetStreamError> {
    match js.get_stream(name).await {
        Ok(stream) => Ok(Some(stream)),
        Err(e)
            if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Whether stream subject `pattern` covers every subject `filter` can match (NATS wildcards:
/// `*` one token, `>` the rest).
pub fn subject_covers(pattern: &str, filter: &str) -> bool {
    let (mut p, mut f) = (pattern.split('.'), filter.split('.'));
    loop {
        match (p.next(), f.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(ft)) if ft != ">" => {}
            (Some(pt), Some(ft)) if pt == ft => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// A sender as one subject token: a digest of the channel and address (the same for every
/// process), so a sender's messages can be found on the work stream by subject
/// ([`crate::topology::Topology::inbound_from`]) without the address showing in subject names.
pub fn sender_token(channel: &str, sender: &str) -> String {
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::new()
        .chain_update(channel.as_bytes())
        .chain_update([0u8])
        .chain_update(sender.as_bytes())
        .finalize();
    hex::encode(&digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_reading_a_subject_no_stream_holds_is_refused() {
        let t = Topology::new("sb", 8);
        let rt = RuntimeConfig::default();
        let good = [
            StageSpec::new("a", Source::Work("turn.>")),
            StageSpec::new("b", Source::Work("reply")),
            StageSpec::new("c", Source::Events("message.logged")),
            StageSpec::new("d", Source::Events(">")),
        ];
        t.check(&good, &rt).expect("all held");
        let stray = [StageSpec::new("x", Source::Work("replies"))];
        assert!(matches!(
            t.check(&stray, &rt),
            Err(TopologyError::NoStream { .. })
        ));
        let event_on_work = [StageSpec::new("y", Source::Work("events.message.logged"))];
        assert!(t.check(&event_on_work, &rt).is_err());
        let twice = [good[0], StageSpec::new("a", Source::Work("reply"))];
        assert!(matches!(
            t.check(&twice, &rt),
            Err(TopologyError::DuplicateStage(_))
        ));
    }

    #[test]
    fn wildcards_cover_what_they_match() {
        assert!(subject_covers("sb.in.>", "sb.in.sms"));
        assert!(subject_covers("sb.in.>", "sb.in.>"));
        assert!(subject_covers("sb.turn.*", "sb.turn.3"));
        assert!(!subject_covers("sb.turn.*", "sb.turn.>"));
        assert!(!subject_covers("sb.reply", "sb.reply.x"));
        assert!(!subject_covers("sb.in.>", "sb.in"));
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
