//! The NATS half of forgetting a person: the stored messages of the work, events and dead-letter
//! streams that name them are deleted by sequence, their senders' arrival counters purged, and
//! `person.forgotten` published.
//!
//! A payload names the person when, decoded by its `Sb-Type` header (else by its subject), it
//! carries one of their session ids or message ids, or one of their person ids (theirs or one
//! linked into it) or (channel, sender) on a message received before the erasure (a message
//! they send afterwards is a new conversation and stays). A dead letter is judged by the
//! payload it keeps. A payload of a type this build does not know is judged by its bytes
//! (protobuf keeps strings as they are).
//!
//! A delete that fails is tried again ([`DELETE_TRIES`]); one that still fails is not hidden: it
//! is a [`Failure`] of the job, which then ends `failed`, not `done`.
use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, message::PublishMessage};
use futures::StreamExt as _;
use prost::{Message as _, Name};
use switchboard_kit::Topology;
use switchboard_kit::arrival::sender_key;
use switchboard_kit::proto::{
    DeadLetter, DeliveryFailed, ExchangeCategorised, ForgetSweep, IdentifiedMessage,
    InboundMessage, MessageEmbedded, MessageLogged, MessageReceived, Person, PersonForgotten,
    Reply, ReplyDelivered, SessionCreated, SessionReset, SessionSummarised, StreamMark, Turn,
};
use switchboard_kit::runtime::HEADER_TYPE;
use switchboard_kit::topology::{existing_stream, is_stage_consumer};
use uuid::Uuid;

use crate::job::Failure;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("stream {stream}: {reason}")]
    Stream { stream: String, reason: String },
    #[error("arrival counters: {0}")]
    Arrivals(String),
    #[error("publishing {subject}: {reason}")]
    Publish { subject: String, reason: String },
}

/// How many times a stored message's delete is tried before it is reported as failed.
pub const DELETE_TRIES: u32 = 3;

/// What names the person.
#[derive(Debug, Clone, Default)]
pub struct Names {
    pub person_id: String,
    /// The ids linked into the person, whose history was theirs.
    pub linked: HashSet<String>,
    pub sessions: HashSet<String>,
    pub messages: HashSet<String>,
    /// (channel, sender address) of their messages.
    pub senders: BTreeSet<(String, String)>,
    /// The erasure's time (ms): what the person or their address alone names is theirs to
    /// erase only if it is from before.
    pub before_ms: i64,
}

impl Names {
    /// What the job's pending `ForgetSweep` says names them.
    pub fn from_sweep(job: &ForgetSweep) -> Self {
        Names {
            person_id: job.person_id.clone(),
            linked: job.linked_person_ids.iter().cloned().collect(),
            sessions: job.session_ids.iter().cloned().collect(),
            messages: job.message_ids.iter().cloned().collect(),
            senders: job
                .senders
                .iter()
                .map(|s| (s.channel.clone(), s.address.clone()))
                .collect(),
            before_ms: job.forgotten_at_ms,
        }
    }

    /// Whether `id` is one of their person ids.
    fn is_theirs(&self, id: &str) -> bool {
        id == self.person_id || self.linked.contains(id)
    }

    fn person_before(&self, p: Option<&Person>, at_ms: i64) -> bool {
        p.is_some_and(|p| self.is_theirs(&p.person_id)) && at_ms <= self.before_ms
    }

    fn inbound(&self, i: &InboundMessage) -> bool {
        let before = i.received_at_ms <= self.before_ms;
        self.messages.contains(&i.id)
            || self.person_before(i.asserted.as_ref(), i.received_at_ms)
            || (before
                && self
                    .senders
                    .contains(&(i.channel.clone(), i.sender.clone())))
    }

    fn identified(&self, m: &IdentifiedMessage) -> bool {
        let received = m.inbound.as_ref().map_or(0, |i| i.received_at_ms);
        m.inbound.as_ref().is_some_and(|i| self.inbound(i))
            || self.person_before(m.person.as_ref(), received)
    }

    fn event_person(&self, person_id: &str, at_ms: i64) -> bool {
        self.is_theirs(person_id) && at_ms <= self.before_ms
    }

    /// Whether a payload of type `ty` (a protobuf full name) on `subject` names the person.
    pub fn payload(&self, ty: &str, subject: &str, bytes: &[u8]) -> bool {
        let s = |id: &str| self.sessions.contains(id);
        let m = |id: &str| self.messages.contains(id);
        macro_rules! decode {
            ($t:ty) => {
                match <$t>::decode(bytes) {
                    Ok(v) => v,
                    // Not what its header says: judged by its bytes.
                    Err(_) => return self.raw(bytes),
                }
            };
        }
        match ty {
            t if t == InboundMessage::full_name() => self.inbound(&decode!(InboundMessage)),
            t if t == IdentifiedMessage::full_name() => {
                self.identified(&decode!(IdentifiedMessage))
            }
            t if t == Turn::full_name() => {
                let turn = decode!(Turn);
                s(&turn.session_id) || turn.message.as_ref().is_some_and(|m| self.identified(m))
            }
            t if t == Reply::full_name() => {
                let r = decode!(Reply);
                let received = switchboard_kit::forgotten::id_time(&r.in_reply_to);
                s(&r.session_id)
                    || m(&r.id)
                    || m(&r.in_reply_to)
                    || self.person_before(r.person.as_ref(), received.timestamp_millis())
            }
            t if t == DeadLetter::full_name() => {
                let d = decode!(DeadLetter);
                self.payload(&d.message_type, &d.subject, &d.payload)
            }
            t if t == MessageReceived::full_name() => m(&decode!(MessageReceived).message_id),
            t if t == SessionCreated::full_name() => {
                let e = decode!(SessionCreated);
                s(&e.session_id) || self.event_person(&e.person_id, e.created_at_ms)
            }
            t if t == SessionReset::full_name() => {
                let e = decode!(SessionReset);
                s(&e.session_id) || self.event_person(&e.person_id, e.reset_at_ms)
            }
            t if t == MessageLogged::full_name() => {
                let e = decode!(MessageLogged);
                m(&e.message_id)
                    || s(&e.session_id)
                    || self.event_person(&e.person_id, e.logged_at_ms)
            }
            t if t == ReplyDelivered::full_name() => {
                let e = decode!(ReplyDelivered);
                m(&e.reply_id) || s(&e.session_id)
            }
            t if t == DeliveryFailed::full_name() => {
                let e = decode!(DeliveryFailed);
                m(&e.reply_id) || s(&e.session_id)
            }
            t if t == SessionSummarised::full_name() => {
                let e = decode!(SessionSummarised);
                self.event_person(&e.person_id, e.summarised_at_ms)
            }
            t if t == MessageEmbedded::full_name() => {
                let e = decode!(MessageEmbedded);
                m(&e.message_id)
                    || s(&e.session_id)
                    || self.event_person(&e.person_id, e.embedded_at_ms)
            }
            t if t == ExchangeCategorised::full_name() => {
                let e = decode!(ExchangeCategorised);
                m(&e.inbound_message_id)
                    || m(&e.outbound_message_id)
                    || s(&e.session_id)
                    || self.event_person(&e.person_id, e.categorised_at_ms)
            }
            // The announcement itself is how others learn to erase their copies; the last
            // step's job is removed by its own ack.
            t if t == PersonForgotten::full_name() || t == ForgetSweep::full_name() => false,
            "" => match type_of_subject(subject) {
                Some(t) => self.payload(&t, subject, bytes),
                None => self.raw(bytes),
            },
            _ => self.raw(bytes),
        }
    }

    /// A payload of an unknown type: whether its bytes hold one of the ids.
    fn raw(&self, bytes: &[u8]) -> bool {
        let has = |needle: &str| {
            !needle.is_empty() && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
        };
        has(&self.person_id)
            || self.linked.iter().any(|id| has(id))
            || self.sessions.iter().any(|id| has(id))
            || self.messages.iter().any(|id| has(id))
    }
}

/// The payload type a subject carries when the message has no `Sb-Type` header.
fn type_of_subject(subject: &str) -> Option<String> {
    let mut parts = subject.splitn(3, '.');
    let _prefix = parts.next()?;
    let kind = parts.next()?;
    let rest = parts.next().unwrap_or("");
    let name = match (kind, rest) {
        ("in", _) => InboundMessage::full_name(),
        ("identified", _) => IdentifiedMessage::full_name(),
        ("turn", _) => Turn::full_name(),
        ("reply", _) => Reply::full_name(),
        ("forget", _) => ForgetSweep::full_name(),
        ("dlq", _) => DeadLetter::full_name(),
        ("events", "message.received") => MessageReceived::full_name(),
        ("events", "session.created") => SessionCreated::full_name(),
        ("events", "session.reset") => SessionReset::full_name(),
        ("events", "message.logged") => MessageLogged::full_name(),
        ("events", "reply.delivered") => ReplyDelivered::full_name(),
        ("events", "delivery.failed") => DeliveryFailed::full_name(),
        ("events", "session.summarised") => SessionSummarised::full_name(),
        ("events", "message.embedded") => MessageEmbedded::full_name(),
        ("events", "exchange.categorised") => ExchangeCategorised::full_name(),
        ("events", "person.forgotten") => PersonForgotten::full_name(),
        _ => return None,
    };
    Some(name)
}

/// What the sweep deleted, and what it could not.
#[derive(Debug, Clone, Default)]
pub struct Swept {
    /// From the work and events streams.
    pub stream_messages: i64,
    pub dead_letters: i64,
    /// Deletes that still failed after [`DELETE_TRIES`] tries.
    pub failures: Vec<Failure>,
}

/// Where a stage's consumer is in its stream (from its `consumer::Info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Every message at or below this stream sequence is acked.
    pub ack_floor: u64,
    /// The last stream sequence delivered.
    pub delivered: u64,
    /// Delivered, not yet acked.
    pub in_hand: usize,
    /// Matching messages not yet delivered.
    pub undelivered: u64,
}

impl Progress {
    fn of(info: &consumer::Info) -> Self {
        Self {
            ack_floor: info.ack_floor.stream_sequence,
            delivered: info.delivered.stream_sequence,
            in_hand: info.num_ack_pending,
            undelivered: info.num_pending,
        }
    }

    /// Whether the consumer has finished (acked or terminated) every message at or below
    /// `mark`. Conservative: a filtered consumer whose ack floor lags below `mark` while it
    /// works on a later message counts as busy until that one is done.
    pub fn finished_through(&self, mark: u64) -> bool {
        self.ack_floor >= mark
            || (self.in_hand == 0 && (self.undelivered == 0 || self.delivered >= mark))
    }

    /// Whether message `seq` may be in the consumer's hand (delivered, not known to be acked).
    fn may_hold(&self, seq: u64) -> bool {
        self.ack_floor < seq && seq <= self.delivered
    }
}

/// A stage's consumer of one stream: its name, filters (none: all of the stream) and progress.
#[derive(Debug, Clone)]
pub struct StageConsumer {
    pub name: String,
    pub filters: Vec<String>,
    pub progress: Progress,
}

/// The stages' consumers of stream `name` (none if the stream was never made). Readers of the
/// events stream that are not stages (analytics) are left out: an erasure does not wait for
/// them.
pub async fn stage_consumers(
    js: &jetstream::Context,
    name: &str,
) -> Result<Vec<StageConsumer>, SweepError> {
    let err = |reason: String| SweepError::Stream {
        stream: name.to_string(),
        reason,
    };
    let Some(stream) = existing_stream(js, name)
        .await
        .map_err(|e| err(e.to_string()))?
    else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    let mut consumers = stream.consumers();
    while let Some(info) = consumers.next().await {
        let info = info.map_err(|e| err(e.to_string()))?;
        if is_stage_consumer(&info.config) {
            found.push(StageConsumer {
                name: info.name.clone(),
                filters: std::iter::once(info.config.filter_subject.clone())
                    .filter(|f| !f.is_empty())
                    .chain(info.config.filter_subjects.iter().cloned())
                    .collect(),
                progress: Progress::of(&info),
            });
        }
    }
    Ok(found)
}

/// Whether one of `consumers` may have message (`seq`, `subject`) in hand.
fn in_hand(consumers: &[StageConsumer], seq: u64, subject: &str) -> bool {
    consumers.iter().any(|c| {
        (c.filters.is_empty()
            || c.filters
                .iter()
                .any(|f| switchboard_kit::topology::subject_covers(f, subject)))
            && c.progress.may_hold(seq)
    })
}

/// The first sweep, right after the erasure's commit: delete every stored message of the
/// work, events and dead-letter streams that names them, but those a stage may have in hand
/// (deleting one would hide from its consumer that the handler is still at work, and what the
/// handler publishes would escape the last step). Returns what it deleted and the marks for
/// the last step: each stream's last sequence, and the first message it left.
pub async fn sweep(
    js: &jetstream::Context,
    topology: &Topology,
    names: &Names,
) -> Result<(Swept, Vec<StreamMark>), SweepError> {
    sweep_streams(js, topology, names, |_| 1, true).await
}

/// The last step's sweep, once every stage is done with what it had at the `marks`: each
/// stream from the first message the first sweep left (else from after its mark).
pub async fn sweep_after(
    js: &jetstream::Context,
    topology: &Topology,
    names: &Names,
    marks: &[StreamMark],
) -> Result<Swept, SweepError> {
    let from = |stream: &str| {
        marks.iter().find(|m| m.stream == stream).map_or(1, |m| {
            if m.left_from > 0 {
                m.left_from
            } else {
                m.last_sequence + 1
            }
        })
    };
    Ok(sweep_streams(js, topology, names, from, false).await?.0)
}

/// Sweep the work, events and dead-letter streams, each from `from(stream)`; with
/// `leave_in_hand`, leaving what a stage may hold.
async fn sweep_streams(
    js: &jetstream::Context,
    topology: &Topology,
    names: &Names,
    from: impl Fn(&str) -> u64,
    leave_in_hand: bool,
) -> Result<(Swept, Vec<StreamMark>), SweepError> {
    let mut swept = Swept::default();
    let mut marks = Vec::new();
    let dlq = topology.dlq_stream();
    for stream in [
        topology.work_stream(),
        topology.events_stream(),
        dlq.clone(),
    ] {
        // No stage reads the dead letters.
        let consumers = if leave_in_hand && stream != dlq {
            stage_consumers(js, &stream).await?
        } else {
            Vec::new()
        };
        let read = sweep_stream(js, &stream, names, from(&stream), &consumers).await?;
        let what = if stream == dlq {
            swept.dead_letters += read.deleted;
            "dead_letter"
        } else {
            swept.stream_messages += read.deleted;
            "stream_message"
        };
        swept
            .failures
            .extend(read.failed.into_iter().map(|(seq, error)| Failure {
                what: what.to_string(),
                place: format!("{stream} #{seq}"),
                error,
            }));
        marks.push(StreamMark {
            stream,
            last_sequence: read.last_sequence,
            left_from: read.left_from,
        });
    }
    Ok((swept, marks))
}

/// What one stream's sweep did.
#[derive(Debug, Clone, Default)]
struct StreamSwept {
    deleted: i64,
    /// (sequence, error) of the deletes that kept failing.
    failed: Vec<(u64, String)>,
    /// The stream's last sequence when the sweep began.
    last_sequence: u64,
    /// The first message naming the person that was left (a stage had it in hand); 0: none.
    left_from: u64,
}

/// How long the sweep waits for the next stored message before taking the stream as read (the
/// messages it expected were removed meanwhile: acked on the work stream, or expired).
const QUIET: Duration = Duration::from_secs(3);

/// Delete the messages of stream `name` from sequence `from` on that name the person, but
/// those one of `consumers` may have in hand.
async fn sweep_stream(
    js: &jetstream::Context,
    name: &str,
    names: &Names,
    from: u64,
    consumers: &[StageConsumer],
) -> Result<StreamSwept, SweepError> {
    let err = |reason: String| SweepError::Stream {
        stream: name.to_string(),
        reason,
    };
    // Never made: nothing stored.
    let Some(mut stream) = existing_stream(js, name)
        .await
        .map_err(|e| err(e.to_string()))?
    else {
        return Ok(StreamSwept::default());
    };
    let info = stream.info().await.map_err(|e| err(e.to_string()))?;
    let last = info.state.last_sequence;
    let mut swept = StreamSwept {
        last_sequence: last,
        ..Default::default()
    };
    if info.state.messages == 0 || last < from {
        return Ok(swept);
    }
    let interest = info.config.retention == jetstream::stream::RetentionPolicy::Interest;
    let mut messages = Reader::open(&stream, from.max(1), interest)
        .await
        .map_err(err)?;
    while let Some((seq, subject, ty, payload)) = messages.next(&stream).await.map_err(err)? {
        if seq > last {
            break;
        }
        if names.payload(&ty, &subject, &payload) {
            if in_hand(consumers, seq, &subject) {
                if swept.left_from == 0 {
                    swept.left_from = seq;
                }
            } else {
                match delete(&stream, seq).await {
                    Ok(true) => swept.deleted += 1,
                    Ok(false) => {}
                    Err(e) => swept.failed.push((seq, e)),
                }
            }
        }
        if seq >= last {
            break;
        }
    }
    Ok(swept)
}

/// Delete message `seq` of `stream`, trying [`DELETE_TRIES`] times: whether it was there.
/// Already gone (acked by every stage meanwhile, or expired) is as good as deleted.
async fn delete(stream: &jetstream::stream::Stream, seq: u64) -> Result<bool, String> {
    let mut tries = 0;
    loop {
        tries += 1;
        match stream.delete_message(seq).await {
            Ok(deleted) => return Ok(deleted),
            Err(e) if gone(&e) => return Ok(false),
            Err(e) if tries >= DELETE_TRIES => return Err(e.to_string()),
            Err(e) => {
                tracing::warn!(seq, error = %e, "deleting a stored message failed; trying again");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(tries))).await;
            }
        }
    }
}

/// Whether a delete failed only because the message is no longer stored.
fn gone(e: &jetstream::stream::DeleteMessageError) -> bool {
    matches!(
        e.kind(),
        jetstream::stream::DeleteMessageErrorKind::JetStream(j)
            if j.error_code() == jetstream::ErrorCode::NO_MESSAGE_FOUND
    )
}

/// Reads a stream's stored messages in order from a sequence on.
enum Reader {
    /// An ordered consumer: one pass without acks, gone when dropped. Not on a stream with
    /// Interest retention: while it lives it is one more consumer interested in every new
    /// message there, which would stay stored after the stages acked it.
    Ordered(Box<consumer::pull::Ordered>),
    /// Message by message (the work stream, which holds only what is not done yet).
    ByGet { next: u64 },
}

type Stored = (u64, String, String, bytes::Bytes);

impl Reader {
    async fn open(
        stream: &jetstream::stream::Stream,
        from: u64,
        interest: bool,
    ) -> Result<Self, String> {
        if interest {
            return Ok(Reader::ByGet { next: from });
        }
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: if from <= 1 {
                    consumer::DeliverPolicy::All
                } else {
                    consumer::DeliverPolicy::ByStartSequence {
                        start_sequence: from,
                    }
                },
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let messages = consumer.messages().await.map_err(|e| e.to_string())?;
        Ok(Reader::Ordered(Box::new(messages)))
    }

    /// The next stored message (sequence, subject, `Sb-Type`, payload), or None at the end.
    async fn next(&mut self, stream: &jetstream::stream::Stream) -> Result<Option<Stored>, String> {
        let type_of = |h: Option<&async_nats::HeaderMap>| {
            h.and_then(|h| h.get(HEADER_TYPE))
                .map(|v| v.as_str().to_string())
                .unwrap_or_default()
        };
        match self {
            Reader::Ordered(messages) => {
                let next = match tokio::time::timeout(QUIET, messages.next()).await {
                    Ok(Some(next)) => next.map_err(|e| e.to_string())?,
                    Ok(None) | Err(_) => return Ok(None),
                };
                let seq = next.info().map_err(|e| e.to_string())?.stream_sequence;
                let ty = type_of(next.headers.as_ref());
                Ok(Some((
                    seq,
                    next.subject.to_string(),
                    ty,
                    next.payload.clone(),
                )))
            }
            Reader::ByGet { next } => {
                let got = stream
                    .raw_message_builder()
                    .sequence(*next)
                    .next_by_subject(">")
                    .send()
                    .await;
                match got {
                    Ok(m) => {
                        *next = m.sequence + 1;
                        let ty = type_of(Some(&m.headers));
                        Ok(Some((m.sequence, m.subject.to_string(), ty, m.payload)))
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            jetstream::stream::LastRawMessageErrorKind::NoMessageFound
                        ) =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        }
    }
}

/// Purge the arrival counters of the person's senders; how many there were.
pub async fn purge_arrival_keys(
    js: &jetstream::Context,
    topology: &Topology,
    senders: &BTreeSet<(String, String)>,
) -> Result<i64, SweepError> {
    if senders.is_empty() {
        return Ok(0);
    }
    let arrivals = |e: &dyn std::fmt::Display| SweepError::Arrivals(e.to_string());
    let kv = match js.get_key_value(topology.arrivals_bucket()).await {
        Ok(kv) => kv,
        Err(_) => return Ok(0), // no bucket: no counters
    };
    let mut purged = 0;
    for (channel, sender) in senders {
        let key = sender_key(channel, sender);
        let entry = kv.entry(&key).await.map_err(|e| arrivals(&e))?;
        if entry.is_some_and(|e| e.operation == jetstream::kv::Operation::Put) {
            kv.purge(&key).await.map_err(|e| arrivals(&e))?;
            purged += 1;
        }
    }
    Ok(purged)
}

/// Queue erasure job `job_id`'s stream half ([`crate::sweep`]), deduplicated by `dedupe`. The
/// message names no one: the stage reads the job's row.
pub async fn queue_job(
    js: &jetstream::Context,
    topology: &Topology,
    job_id: Uuid,
    dedupe: &str,
) -> Result<(), SweepError> {
    let work = ForgetSweep {
        job_id: job_id.to_string(),
        ..Default::default()
    };
    publish(js, topology.forget_sweep(), &work, dedupe.to_string()).await
}

/// Publish `person.forgotten`.
pub async fn announce(
    js: &jetstream::Context,
    topology: &Topology,
    event: &PersonForgotten,
) -> Result<(), SweepError> {
    let id = format!("forget/{}/{}", event.person_id, event.forgotten_at_ms);
    publish(js, topology.event("person.forgotten"), event, id).await
}

/// Publish `payload` (typed by its `Sb-Type` header, deduplicated by `id`) and wait for the
/// stream to store it.
async fn publish<M: prost::Message + Name>(
    js: &jetstream::Context,
    subject: String,
    payload: &M,
    id: String,
) -> Result<(), SweepError> {
    let failed = |e: &dyn std::fmt::Display| SweepError::Publish {
        subject: subject.clone(),
        reason: e.to_string(),
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(HEADER_TYPE, M::full_name().as_str());
    let msg = PublishMessage::build()
        .payload(payload.encode_to_vec().into())
        .headers(headers)
        .message_id(id);
    js.send_publish(subject.clone(), msg)
        .await
        .map_err(|e| failed(&e))?
        .await
        .map_err(|e| failed(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_reading_two_subjects_may_hold_a_message_on_either() {
        // The session stage reads the sender's identified subjects and the old one beside them.
        let progress = Progress {
            ack_floor: 4,
            delivered: 9,
            in_hand: 1,
            undelivered: 0,
        };
        let session = StageConsumer {
            name: "session".into(),
            filters: vec!["sb.identified.>".into(), "sb.identified".into()],
            progress,
        };
        let dispatch = StageConsumer {
            name: "dispatch".into(),
            filters: vec!["sb.turn.>".into()],
            progress,
        };
        let both = [session.clone(), dispatch];
        assert!(in_hand(&both, 5, "sb.identified.sms.0123abcd"));
        assert!(in_hand(&both, 5, "sb.identified"));
        assert!(!in_hand(&both, 5, "sb.reply"), "nobody reads it");
        assert!(
            !in_hand(&[session], 3, "sb.identified.sms.0123abcd"),
            "acked"
        );
    }

    fn names() -> Names {
        Names {
            person_id: "staff:17".into(),
            linked: ["phone:+61400000099".to_string()].into(),
            sessions: ["0190c0de-0000-7000-8000-000000000001".to_string()].into(),
            messages: ["0190c0de-0000-7000-8000-000000000002".to_string()].into(),
            senders: [("sms".to_string(), "+61400000017".to_string())].into(),
            before_ms: 1_000,
        }
    }

    #[test]
    fn a_message_from_their_number_before_the_erasure_names_them_and_one_after_does_not() {
        let n = names();
        let mut inbound = InboundMessage {
            id: "other".into(),
            channel: "sms".into(),
            sender: "+61400000017".into(),
            received_at_ms: 999,
            ..Default::default()
        };
        let ty = InboundMessage::full_name();
        assert!(n.payload(&ty, "sb.in.sms", &inbound.encode_to_vec()));
        inbound.received_at_ms = 1_001;
        assert!(!n.payload(&ty, "sb.in.sms", &inbound.encode_to_vec()));
        inbound.sender = "+61400000018".into();
        inbound.received_at_ms = 999;
        assert!(!n.payload(&ty, "sb.in.sms", &inbound.encode_to_vec()));
    }

    #[test]
    fn a_dead_letter_is_judged_by_the_payload_it_keeps() {
        let n = names();
        let turn = Turn {
            session_id: "0190c0de-0000-7000-8000-000000000001".into(),
            ..Default::default()
        };
        let letter = DeadLetter {
            message_type: Turn::full_name(),
            subject: "sb.turn.3".into(),
            payload: turn.encode_to_vec(),
            ..Default::default()
        };
        assert!(n.payload("", "sb.dlq.dispatch", &letter.encode_to_vec()));
        let other = DeadLetter {
            payload: Turn::default().encode_to_vec(),
            ..letter
        };
        assert!(!n.payload("", "sb.dlq.dispatch", &other.encode_to_vec()));
    }

    #[test]
    fn the_last_steps_own_job_is_left_to_its_ack() {
        let n = names();
        let job = ForgetSweep {
            person_id: n.person_id.clone(),
            ..Default::default()
        };
        let ty = ForgetSweep::full_name();
        assert!(!n.payload(&ty, "sb.forget", &job.encode_to_vec()));
        // Without its header, by its subject.
        assert!(!n.payload("", "sb.forget", &job.encode_to_vec()));
    }

    #[test]
    fn the_announcement_is_kept_and_unknown_payloads_are_read_as_bytes() {
        let n = names();
        let event = PersonForgotten {
            person_id: "staff:17".into(),
            ..Default::default()
        };
        assert!(!n.payload("", "sb.events.person.forgotten", &event.encode_to_vec()));
        assert!(n.payload("x.Unknown", "sb.events.new", b"..staff:17.."));
        assert!(!n.payload("x.Unknown", "sb.events.new", b"..staff:18.."));
    }

    #[test]
    fn an_id_linked_into_the_person_names_them() {
        let n = names();
        let event = MessageLogged {
            person_id: "phone:+61400000099".into(),
            logged_at_ms: 999,
            ..Default::default()
        };
        let ty = MessageLogged::full_name();
        assert!(n.payload(&ty, "sb.events.message.logged", &event.encode_to_vec()));
        let other = MessageLogged {
            person_id: "phone:+61400000098".into(),
            ..event
        };
        assert!(!n.payload(&ty, "sb.events.message.logged", &other.encode_to_vec()));
    }
}
