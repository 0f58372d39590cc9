//! Reading and replaying dead letters (`switchboard dlq`).
use async_nats::jetstream::{self, message::PublishMessage};
use prost::Message as _;

use crate::proto::DeadLetter;
use crate::runtime::{HEADER_CORRELATION, HEADER_TYPE};
use crate::topology::Topology;

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error("NATS: {0}")]
    Nats(String),
    #[error("dead letter {0} not found")]
    NotFound(u64),
    #[error("dead letter {seq} is not a DeadLetter payload: {source}")]
    Decode {
        seq: u64,
        source: prost::DecodeError,
    },
}

fn nats(e: impl std::fmt::Display) -> DlqError {
    DlqError::Nats(e.to_string())
}

/// One stored dead letter with its sequence in the DLQ stream (the id to replay it by).
#[derive(Debug, Clone)]
pub struct StoredDeadLetter {
    pub seq: u64,
    pub letter: DeadLetter,
}

/// A dead letter as `switchboard dlq list --json` and the ops console show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeadLetterView<'a> {
    pub seq: u64,
    pub stage: &'a str,
    pub subject: &'a str,
    #[serde(rename = "type")]
    pub message_type: &'a str,
    pub error: &'a str,
    pub deliveries: u64,
    pub failed_at: Option<chrono::DateTime<chrono::Utc>>,
    pub correlation_id: &'a str,
    /// Where the message was in its own stream.
    pub stream_sequence: u64,
}

impl<'a> From<&'a StoredDeadLetter> for DeadLetterView<'a> {
    fn from(d: &'a StoredDeadLetter) -> Self {
        let l = &d.letter;
        Self {
            seq: d.seq,
            stage: &l.stage,
            subject: &l.subject,
            message_type: &l.message_type,
            error: &l.error,
            deliveries: l.delivery_count,
            failed_at: chrono::DateTime::from_timestamp_millis(l.failed_at_ms),
            correlation_id: &l.correlation_id,
            stream_sequence: l.stream_sequence,
        }
    }
}

/// Which dead letters a listing or a bulk replay takes (each filter, when given, must hold).
#[derive(Debug, Clone, Default)]
pub struct DlqFilter {
    /// The stage that gave up on it.
    pub stage: Option<String>,
    /// Given up on at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Its error contains this text (case-insensitive).
    pub error_contains: Option<String>,
}

impl DlqFilter {
    pub fn stage(stage: Option<&str>) -> Self {
        Self {
            stage: stage.map(str::to_string),
            ..Self::default()
        }
    }

    pub fn matches(&self, letter: &DeadLetter) -> bool {
        self.stage.as_ref().is_none_or(|s| *s == letter.stage)
            && self.since_ms.is_none_or(|t| letter.failed_at_ms >= t)
            && self
                .error_contains
                .as_ref()
                .is_none_or(|text| letter.error.to_lowercase().contains(&text.to_lowercase()))
    }
}

/// Dead letters in stream order, optionally only one stage's.
pub async fn list(
    js: &jetstream::Context,
    topology: &Topology,
    stage: Option<&str>,
    limit: usize,
) -> Result<Vec<StoredDeadLetter>, DlqError> {
    list_matching(js, topology, &DlqFilter::stage(stage), limit).await
}

/// Up to `limit` dead letters that match `filter`, in stream order.
pub async fn list_matching(
    js: &jetstream::Context,
    topology: &Topology,
    filter: &DlqFilter,
    limit: usize,
) -> Result<Vec<StoredDeadLetter>, DlqError> {
    let mut stream = js.get_stream(topology.dlq_stream()).await.map_err(nats)?;
    let info = stream.info().await.map_err(nats)?;
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);
    let mut out = Vec::new();
    if info.state.messages == 0 {
        return Ok(out);
    }
    for seq in first..=last {
        if out.len() >= limit {
            break;
        }
        // None: deleted or expired.
        if let Some(stored) = read(&stream, seq).await?
            && filter.matches(&stored.letter)
        {
            out.push(stored);
        }
    }
    Ok(out)
}

/// Dead letter `seq`.
pub async fn get(
    js: &jetstream::Context,
    topology: &Topology,
    seq: u64,
) -> Result<StoredDeadLetter, DlqError> {
    let stream = js.get_stream(topology.dlq_stream()).await.map_err(nats)?;
    read(&stream, seq).await?.ok_or(DlqError::NotFound(seq))
}

/// Dead letter `seq` of the DLQ stream; `None` if it is not there (deleted or expired).
async fn read(
    stream: &jetstream::stream::Stream,
    seq: u64,
) -> Result<Option<StoredDeadLetter>, DlqError> {
    let Ok(raw) = stream.get_raw_message(seq).await else {
        return Ok(None);
    };
    let letter = DeadLetter::decode(raw.payload.clone())
        .map_err(|source| DlqError::Decode { seq, source })?;
    Ok(Some(StoredDeadLetter { seq, letter }))
}

/// Publish the original payload again on its original subject, then delete the dead letter.
/// The replay gets a fresh dedupe id, so it is processed even inside the dedupe window.
pub async fn replay(
    js: &jetstream::Context,
    topology: &Topology,
    seq: u64,
) -> Result<DeadLetter, DlqError> {
    let stream = js.get_stream(topology.dlq_stream()).await.map_err(nats)?;
    let letter = read(&stream, seq)
        .await?
        .ok_or(DlqError::NotFound(seq))?
        .letter;
    let mut headers = async_nats::HeaderMap::new();
    if !letter.message_type.is_empty() {
        headers.insert(HEADER_TYPE, letter.message_type.as_str());
    }
    if !letter.correlation_id.is_empty() {
        headers.insert(HEADER_CORRELATION, letter.correlation_id.as_str());
    }
    let msg = PublishMessage::build()
        .payload(letter.payload.clone().into())
        .headers(headers)
        .message_id(format!(
            "replay/{}/{seq}/{}",
            letter.stage,
            uuid::Uuid::now_v7()
        ));
    js.send_publish(letter.subject.clone(), msg)
        .await
        .map_err(nats)?
        .await
        .map_err(nats)?;
    stream.delete_message(seq).await.map_err(nats)?;
    Ok(letter)
}
