//! `switchboard tail`: follow the public event stream as JSON lines, one event a line, from
//! now, from a time or from a stream sequence. Each event is decoded from its protobuf (by its
//! `Sb-Type` header, against the `proto/` schemas compiled into the binary) into protobuf's
//! JSON mapping with the `.proto` field names, so a script reads the same fields an analytics
//! client decodes.
use anyhow::Context as _;
use async_nats::jetstream::{self, consumer};
use chrono::{DateTime, Utc};
use clap::Args;
use futures::StreamExt as _;
use switchboard_kit::Config;
use switchboard_kit::runtime::HEADER_TYPE;
use switchboard_kit::topology::Topology;

use crate::proto_json::{ProtoJson, base64};

#[derive(Args)]
pub struct TailArgs {
    /// Where to start: `now` (the default: only new events), `all`, an RFC 3339 time, or a
    /// stream sequence (as a line's `seq` gives it: resume after the last line you kept with
    /// its `seq` + 1).
    #[arg(long, default_value = "now", value_parser = parse_from)]
    pub from: Start,
    /// Only these events (repeatable): `message.logged`, `exchange.categorised`, …
    #[arg(long = "event")]
    pub events: Vec<String>,
    /// Stop after this many events (default: follow until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Start {
    Now,
    All,
    Time(DateTime<Utc>),
    Sequence(u64),
}

pub fn parse_from(s: &str) -> Result<Start, String> {
    match s {
        "now" => Ok(Start::Now),
        "all" => Ok(Start::All),
        _ => {
            if let Ok(seq) = s.parse::<u64>() {
                return if seq == 0 {
                    Err("stream sequences start at 1".into())
                } else {
                    Ok(Start::Sequence(seq))
                };
            }
            DateTime::parse_from_rfc3339(s)
                .map(|t| Start::Time(t.with_timezone(&Utc)))
                .map_err(|_| "`now`, `all`, an RFC 3339 time or a stream sequence".into())
        }
    }
}

impl Start {
    pub fn deliver_policy(self) -> consumer::DeliverPolicy {
        match self {
            Start::Now => consumer::DeliverPolicy::New,
            Start::All => consumer::DeliverPolicy::All,
            Start::Time(t) => consumer::DeliverPolicy::ByStartTime {
                start_time: time::OffsetDateTime::from_unix_timestamp_nanos(
                    t.timestamp_nanos_opt().unwrap_or_default().into(),
                )
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
            },
            Start::Sequence(seq) => consumer::DeliverPolicy::ByStartSequence {
                start_sequence: seq,
            },
        }
    }
}

/// One event as a line.
#[derive(serde::Serialize)]
struct Line<'a> {
    seq: u64,
    subject: &'a str,
    /// The event's name: its subject after `<prefix>.events.`.
    event: &'a str,
    /// The protobuf message type (`switchboard.v1.MessageLogged`).
    #[serde(rename = "type")]
    message_type: &'a str,
    /// When the stream stored it.
    at: DateTime<Utc>,
    /// The event's fields; `null` if its type is not one the binary knows (a newer
    /// producer's), with the payload in `payload_base64`.
    data: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
}

pub async fn run(config: Config, args: TailArgs) -> anyhow::Result<()> {
    let decoder = ProtoJson::new()?;
    let nats = switchboard_kit::endpoint::nats_connect(
        &config.nats_url,
        async_nats::ConnectOptions::new().name("switchboard-tail"),
    )
    .await?;
    let js = jetstream::new(nats);
    let topology = Topology::new(&config.subject_prefix, config.runtime.turn_partitions);
    let stream_name = topology.events_stream();
    let stream = js
        .get_stream(&stream_name)
        .await
        .with_context(|| format!("the events stream {stream_name} (has the product run?)"))?;
    let prefix = format!("{}.events.", config.subject_prefix);
    let filter_subjects = args.events.iter().map(|e| format!("{prefix}{e}")).collect();
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: args.from.deliver_policy(),
            filter_subjects,
            ..Default::default()
        })
        .await
        .context("follow the events stream")?;
    let mut messages = consumer.messages().await?;
    let mut printed = 0u64;
    let mut out = std::io::stdout().lock();
    while args.count.is_none_or(|n| printed < n) {
        let Some(next) = messages.next().await else {
            break;
        };
        let msg = next.context("reading the events stream")?;
        let info = msg.info().map_err(|e| anyhow::anyhow!("{e}"))?;
        let (seq, at) = (info.stream_sequence, info.published);
        let message_type = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(HEADER_TYPE))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        let (data, payload_base64) = match decoder.decode(&message_type, &msg.payload) {
            Some(data) => (data, None),
            None => (serde_json::Value::Null, Some(base64(&msg.payload))),
        };
        let subject = msg.subject.as_str();
        let line = Line {
            seq,
            subject,
            event: subject.strip_prefix(&prefix).unwrap_or(subject),
            message_type: &message_type,
            at: DateTime::from_timestamp_nanos(at.unix_timestamp_nanos() as i64),
            data,
            payload_base64,
        };
        use std::io::Write as _;
        serde_json::to_writer(&mut out, &line)?;
        out.write_all(b"\n")?;
        out.flush()?;
        printed += 1;
    }
    Ok(())
}
