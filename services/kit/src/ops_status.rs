//! How the running product is doing, from what NATS and Postgres know (no worker needs to
//! answer): per stage its consumer's backlog, the messages in hand, redeliveries, pull requests
//! waiting (a sign of live replicas) and dead letters; the streams' sizes; live dispatchers;
//! sessions waiting out a runner's outage, per agent. `switchboard status` prints it; the ops
//! console shows it.
use std::collections::BTreeMap;

use async_nats::jetstream;
use futures::StreamExt as _;
use serde::Serialize;
use sqlx::PgPool;

use crate::Registration;
use crate::config::RuntimeConfig;
use crate::status::SessionStatus;
use crate::topology::{Topology, existing_stream};

#[derive(Debug, thiserror::Error)]
pub enum OpsStatusError {
    #[error("nats: {0}")]
    Nats(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

fn nats(e: impl std::fmt::Display) -> OpsStatusError {
    OpsStatusError::Nats(e.to_string())
}

#[derive(Debug, Serialize)]
pub struct Status {
    pub stages: Vec<StageStatus>,
    pub streams: Vec<StreamStatus>,
    /// Dispatch processes whose heartbeat is current.
    pub dispatchers_alive: i64,
    /// Sessions whose turns wait for their agent's runner to come back, per agent.
    pub waiting_for_runner: BTreeMap<String, i64>,
}

#[derive(Debug, Serialize)]
pub struct StageStatus {
    pub stage: &'static str,
    pub worker: &'static str,
    pub stream: String,
    /// Its durable consumer; absent if it was never made (`streams apply` has not run).
    #[serde(flatten)]
    pub consumer: Option<ConsumerStatus>,
    pub dead_letters: usize,
}

#[derive(Debug, Serialize)]
pub struct ConsumerStatus {
    /// Messages not yet delivered to any replica (the lag).
    pub pending: u64,
    /// Delivered and not yet acked: being handled, or parked (a turn waiting its turn).
    pub in_hand: usize,
    pub redelivered: usize,
    /// Pull requests waiting: replicas of the stage asking for work.
    pub pulling: usize,
}

#[derive(Debug, Serialize)]
pub struct StreamStatus {
    pub name: String,
    pub messages: u64,
    pub bytes: u64,
}

pub async fn status(
    js: &jetstream::Context,
    db: &PgPool,
    topology: &Topology,
    runtime: &RuntimeConfig,
    stages: &[Registration],
) -> Result<Status, OpsStatusError> {
    // One listing per stream: its size, its consumers, and (the DLQ) its count per subject.
    let mut streams = Vec::new();
    let mut consumers = BTreeMap::new();
    let mut per_subject = BTreeMap::new();
    for config in topology.stream_configs(runtime) {
        let Some(mut stream) = existing_stream(js, &config.name).await.map_err(nats)? else {
            continue;
        };
        let state = stream.info().await.map_err(nats)?.state.clone();
        streams.push(StreamStatus {
            name: config.name.clone(),
            messages: state.messages,
            bytes: state.bytes,
        });
        let mut listed = stream.consumers();
        while let Some(info) = listed.next().await {
            let info = info.map_err(nats)?;
            consumers.insert((config.name.clone(), info.name.clone()), info);
        }
        if config.name == topology.dlq_stream() {
            let mut subjects = stream.info_with_subjects(">").await.map_err(nats)?;
            while let Some(entry) = subjects.next().await {
                let (subject, count) = entry.map_err(nats)?;
                per_subject.insert(subject, count);
            }
        }
    }
    let stages = stages
        .iter()
        .map(|r| {
            let stream = topology.stream_of(r.spec.reads);
            let consumer = consumers
                .get(&(stream.clone(), r.spec.name.to_string()))
                .map(|i| ConsumerStatus {
                    pending: i.num_pending,
                    in_hand: i.num_ack_pending,
                    redelivered: i.num_redelivered,
                    pulling: i.num_waiting,
                });
            StageStatus {
                stage: r.spec.name,
                worker: r.worker,
                stream,
                consumer,
                dead_letters: per_subject
                    .get(&topology.dead_letter(r.spec.name))
                    .copied()
                    .unwrap_or(0),
            }
        })
        .collect();
    let dispatchers_alive = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM switchboard.dispatchers WHERE alive_until > now()"#
    )
    .fetch_one(db)
    .await?;
    let waiting_for_runner = sqlx::query!(
        r#"SELECT agent_name AS "agent!", count(*) AS "n!" FROM switchboard.sessions
            WHERE status = $1 GROUP BY agent_name"#,
        SessionStatus::Waiting as SessionStatus,
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| (r.agent, r.n))
    .collect();
    Ok(Status {
        stages,
        streams,
        dispatchers_alive,
        waiting_for_runner,
    })
}
