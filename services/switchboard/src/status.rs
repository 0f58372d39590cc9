//! `switchboard status [--json]`: how the running product is doing, from what NATS and
//! Postgres know (no worker needs to answer): per stage its consumer's backlog, the messages in
//! hand, redeliveries, pull requests waiting (a sign of live replicas) and dead letters; the
//! streams' sizes; live dispatchers; sessions waiting out a runner's outage, per agent.
use std::collections::BTreeMap;

use async_nats::jetstream;
use futures::StreamExt as _;
use serde::Serialize;
use switchboard_kit::Registration;
use switchboard_kit::config::Config;
use switchboard_kit::startup::App;
use switchboard_kit::status::SessionStatus;

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
    /// Messages not yet delivered to any replica (the lag); None: no consumer (never applied).
    pub pending: Option<u64>,
    /// Delivered and not yet acked: being handled, or parked (a turn waiting its turn).
    pub in_hand: Option<usize>,
    pub redelivered: Option<usize>,
    /// Pull requests waiting: replicas of the stage asking for work.
    pub pulling: Option<usize>,
    pub dead_letters: usize,
}

#[derive(Debug, Serialize)]
pub struct StreamStatus {
    pub name: String,
    pub messages: u64,
    pub bytes: u64,
}

pub async fn status(app: &App, stages: &[Registration]) -> anyhow::Result<Status> {
    let topology = &app.topology;
    let dead = dead_letters_by_stage(&app.js, &topology.dlq_stream()).await?;
    let mut out = Vec::new();
    for r in stages {
        let stream = topology.stream_of(r.spec.reads);
        let info = consumer_info(&app.js, &stream, r.spec.name).await?;
        out.push(StageStatus {
            stage: r.spec.name,
            worker: r.worker,
            stream,
            pending: info.as_ref().map(|i| i.num_pending),
            in_hand: info.as_ref().map(|i| i.num_ack_pending),
            redelivered: info.as_ref().map(|i| i.num_redelivered),
            pulling: info.as_ref().map(|i| i.num_waiting),
            dead_letters: dead.get(r.spec.name).copied().unwrap_or(0),
        });
    }
    let mut streams = Vec::new();
    for name in [
        topology.work_stream(),
        topology.events_stream(),
        topology.dlq_stream(),
    ] {
        if let Some(mut s) = get_stream(&app.js, &name).await? {
            let state = s.info().await?.state.clone();
            streams.push(StreamStatus {
                name,
                messages: state.messages,
                bytes: state.bytes,
            });
        }
    }
    let dispatchers_alive = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM switchboard.dispatchers WHERE alive_until > now()"#
    )
    .fetch_one(&app.db)
    .await?;
    let waiting_for_runner = sqlx::query!(
        r#"SELECT agent_name AS "agent!", count(*) AS "n!" FROM switchboard.sessions
            WHERE status = $1 GROUP BY agent_name"#,
        SessionStatus::Waiting as SessionStatus,
    )
    .fetch_all(&app.db)
    .await?
    .into_iter()
    .map(|r| (r.agent, r.n))
    .collect();
    Ok(Status {
        stages: out,
        streams,
        dispatchers_alive,
        waiting_for_runner,
    })
}

async fn get_stream(
    js: &jetstream::Context,
    name: &str,
) -> anyhow::Result<Option<jetstream::stream::Stream>> {
    match js.get_stream(name).await {
        Ok(s) => Ok(Some(s)),
        Err(e)
            if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

async fn consumer_info(
    js: &jetstream::Context,
    stream: &str,
    name: &str,
) -> anyhow::Result<Option<jetstream::consumer::Info>> {
    let Some(stream) = get_stream(js, stream).await? else {
        return Ok(None);
    };
    match stream.consumer_info(name).await {
        Ok(info) => Ok(Some(info)),
        Err(e)
            if match e.kind() {
                jetstream::context::ConsumerInfoErrorKind::NotFound => true,
                jetstream::context::ConsumerInfoErrorKind::JetStream(j) => {
                    j.error_code() == jetstream::ErrorCode::CONSUMER_NOT_FOUND
                }
                _ => false,
            } =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Dead letters stored per stage (`{p}.dlq.<stage>`).
async fn dead_letters_by_stage(
    js: &jetstream::Context,
    dlq: &str,
) -> anyhow::Result<BTreeMap<String, usize>> {
    let mut by_stage = BTreeMap::new();
    let Some(stream) = get_stream(js, dlq).await? else {
        return Ok(by_stage);
    };
    let mut subjects = stream.info_with_subjects(">").await?;
    while let Some(entry) = subjects.next().await {
        let (subject, count) = entry?;
        if let Some(stage) = subject.rsplit('.').next() {
            *by_stage.entry(stage.to_string()).or_default() += count;
        }
    }
    Ok(by_stage)
}

/// `switchboard status`: the tables, or the JSON document with `--json`.
pub async fn run(config: Config, stages: &[Registration], json: bool) -> anyhow::Result<()> {
    let app = App::connect(config, "cli").await?;
    let s = status(&app, stages).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    let shown = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    println!(
        "{:<14} {:<10} {:<14} {:>8} {:>8} {:>11} {:>8} {:>12}",
        "stage", "worker", "stream", "pending", "in_hand", "redelivered", "pulling", "dead_letters"
    );
    for st in &s.stages {
        println!(
            "{:<14} {:<10} {:<14} {:>8} {:>8} {:>11} {:>8} {:>12}",
            st.stage,
            st.worker,
            st.stream,
            shown(st.pending),
            shown(st.in_hand.map(|v| v as u64)),
            shown(st.redelivered.map(|v| v as u64)),
            shown(st.pulling.map(|v| v as u64)),
            st.dead_letters
        );
    }
    println!();
    for st in &s.streams {
        println!(
            "stream {:<20} {:>10} messages {:>14} bytes",
            st.name, st.messages, st.bytes
        );
    }
    println!("dispatchers alive: {}", s.dispatchers_alive);
    if s.waiting_for_runner.is_empty() {
        println!("sessions waiting for a runner: none");
    }
    for (agent, n) in &s.waiting_for_runner {
        println!("sessions waiting for {agent}'s runner: {n}");
    }
    Ok(())
}
