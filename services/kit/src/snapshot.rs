//! JetStream stream snapshots: the server's snapshot and restore API (`$JS.API.STREAM.SNAPSHOT`,
//! `$JS.API.STREAM.RESTORE`), which async-nats does not wrap. A snapshot holds the stream's
//! messages and its consumers with their ack state, so a restored stream carries on where it
//! was: what was waiting is delivered, what was acked is not.
//!
//! The wire protocol, as nats-server speaks it (2.10 to 2.12): the server streams the snapshot
//! (an S2-compressed tar) in chunks to a subject we subscribe to first; each chunk with a reply
//! subject is acknowledged by an empty message there (flow control: the server stops after a
//! few seconds without acks); an empty message ends it, with no status or 204 on success. A
//! restore sends the chunks as requests to the subject the server names (an empty reply for
//! each is success), then an empty request, answered with the restored stream's info.
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// Bytes per chunk the server sends; within every server's bounds (1 KiB to 1 MiB).
const SNAPSHOT_CHUNK: usize = 128 * 1024;
/// Bytes per chunk we send back on restore (below the default 1 MiB max payload).
const RESTORE_CHUNK: usize = 64 * 1024;
/// The server gives up on a snapshot after a few seconds without our ack; we give up on it
/// after this long without a chunk.
const CHUNK_WAIT: Duration = Duration::from_secs(30);
/// The restore's last answer comes when the server has rebuilt the stream.
const RESTORE_FINISH: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("stream {stream}: {what}: {reason}")]
    Nats {
        stream: String,
        what: &'static str,
        reason: String,
    },
    #[error("stream {stream}: the server refused to {what}: {reason}")]
    Refused {
        stream: String,
        what: &'static str,
        reason: String,
    },
    #[error("stream {stream}: no chunk of the snapshot for {0:?}", CHUNK_WAIT)]
    Stalled { stream: String },
    #[error("stream {stream}: writing or reading the snapshot: {source}")]
    Io {
        stream: String,
        #[source]
        source: std::io::Error,
    },
}

/// What a snapshot says about its stream: its configuration and state when it was taken (the
/// server's own JSON, kept as is: a restore hands it back unchanged but for the replicas).
pub type StreamMeta = Value;

/// Write a snapshot of `stream` (messages and consumers) to `out`; its configuration and
/// state. `client` must be allowed to publish to `$JS.API.>` and `$JS.SNAPSHOT.>`.
pub async fn snapshot_stream(
    client: &async_nats::Client,
    stream: &str,
    out: &mut (impl AsyncWrite + Unpin),
) -> Result<StreamMeta, SnapshotError> {
    let nats = |what: &'static str| {
        move |e: &dyn std::fmt::Display| SnapshotError::Nats {
            stream: stream.to_string(),
            what,
            reason: e.to_string(),
        }
    };
    let io = |source| SnapshotError::Io {
        stream: stream.to_string(),
        source,
    };
    // Subscribed before asking: the server sends the first chunk right after its answer.
    let inbox = client.new_inbox();
    let mut chunks = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| nats("subscribe")(&e))?;
    let request = json!({ "deliver_subject": inbox, "chunk_size": SNAPSHOT_CHUNK });
    let answer = api(
        client,
        stream,
        "take a snapshot",
        format!("$JS.API.STREAM.SNAPSHOT.{stream}"),
        &request,
    )
    .await?;
    let meta = json!({ "config": answer["config"], "state": answer["state"] });
    loop {
        let chunk = match tokio::time::timeout(CHUNK_WAIT, chunks.next()).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => return Err(nats("read the snapshot")(&"the subscription ended")),
            Err(_) => {
                return Err(SnapshotError::Stalled {
                    stream: stream.to_string(),
                });
            }
        };
        if chunk.payload.is_empty() {
            // The end: no status (older servers, or all in one chunk) or 204 is success.
            match chunk.status {
                None => break,
                Some(s) if s.as_u16() == 204 => break,
                Some(s) => {
                    return Err(SnapshotError::Refused {
                        stream: stream.to_string(),
                        what: "finish the snapshot",
                        reason: format!("{} {}", s.as_u16(), chunk.description.unwrap_or_default()),
                    });
                }
            }
        }
        // Acknowledged before it is written: the server's window keeps moving.
        if let Some(reply) = chunk.reply {
            client
                .publish(reply, Bytes::new())
                .await
                .map_err(|e| nats("acknowledge a chunk")(&e))?;
        }
        out.write_all(&chunk.payload).await.map_err(io)?;
    }
    let _ = chunks.unsubscribe().await;
    out.flush().await.map_err(io)?;
    Ok(meta)
}

/// Restore `stream` from a snapshot (`meta` as [`snapshot_stream`] returned it, `input` its
/// bytes) with `replicas` replicas. The stream must not exist.
pub async fn restore_stream(
    client: &async_nats::Client,
    stream: &str,
    meta: &StreamMeta,
    replicas: usize,
    input: &mut (impl AsyncRead + Unpin),
) -> Result<(), SnapshotError> {
    let nats = |what: &'static str| {
        move |e: &dyn std::fmt::Display| SnapshotError::Nats {
            stream: stream.to_string(),
            what,
            reason: e.to_string(),
        }
    };
    let mut request = meta.clone();
    // The stream's replicas are this deployment's (a cluster's backup restored on one node).
    request["config"]["num_replicas"] = json!(replicas.max(1));
    let answer = api(
        client,
        stream,
        "start a restore",
        format!("$JS.API.STREAM.RESTORE.{stream}"),
        &request,
    )
    .await?;
    let deliver = answer["deliver_subject"]
        .as_str()
        .ok_or_else(|| nats("start a restore")(&"the answer names no deliver_subject"))?
        .to_string();
    let mut buf = vec![0u8; RESTORE_CHUNK];
    loop {
        let n = read_full(input, &mut buf)
            .await
            .map_err(|source| SnapshotError::Io {
                stream: stream.to_string(),
                source,
            })?;
        if n == 0 {
            break;
        }
        let ack = client
            .request(deliver.clone(), Bytes::copy_from_slice(&buf[..n]))
            .await
            .map_err(|e| nats("send a chunk")(&e))?;
        if !ack.payload.is_empty() {
            return Err(SnapshotError::Refused {
                stream: stream.to_string(),
                what: "take a chunk",
                reason: String::from_utf8_lossy(&ack.payload).into_owned(),
            });
        }
    }
    let done = client
        .send_request(
            deliver,
            async_nats::Request::new()
                .payload(Bytes::new())
                .timeout(Some(RESTORE_FINISH)),
        )
        .await
        .map_err(|e| nats("finish the restore")(&e))?;
    refused_if_error(stream, "restore", &done.payload)?;
    Ok(())
}

/// One JetStream API call; its JSON answer, or the server's error.
async fn api(
    client: &async_nats::Client,
    stream: &str,
    what: &'static str,
    subject: String,
    request: &Value,
) -> Result<Value, SnapshotError> {
    let body = serde_json::to_vec(request).expect("JSON serializes");
    let answer = client
        .request(subject, body.into())
        .await
        .map_err(|e| SnapshotError::Nats {
            stream: stream.to_string(),
            what,
            reason: e.to_string(),
        })?;
    refused_if_error(stream, what, &answer.payload)
}

fn refused_if_error(
    stream: &str,
    what: &'static str,
    payload: &[u8],
) -> Result<Value, SnapshotError> {
    let refused = |reason: String| SnapshotError::Refused {
        stream: stream.to_string(),
        what,
        reason,
    };
    let value: Value = serde_json::from_slice(payload)
        .map_err(|_| refused(String::from_utf8_lossy(payload).into_owned()))?;
    if let Some(error) = value.get("error") {
        let reason = error["description"]
            .as_str()
            .map_or_else(|| error.to_string(), str::to_string);
        return Err(refused(reason));
    }
    Ok(value)
}

/// Fill `buf` unless the input ends first; the bytes read.
async fn read_full(input: &mut (impl AsyncRead + Unpin), buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = input.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}
