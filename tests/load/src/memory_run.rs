//! The memory half of a chaos run: the model the memory workers talk to, how they are
//! configured, the wait for them to catch up after the drain, and what they left behind
//! ([`MemoryEvidence`], judged by `chaos_check`'s memory verdict).
//!
//! The workers talk to a [`FakeModel`] (a real OpenAI-compatible HTTP server in the harness):
//! embeddings are its deterministic bag-of-words vectors, labels are `casual_chat`, and a
//! summary is `MODEL SUMMARY:` followed by the canaries of everything it was given, so that
//! whoever's words a summary merged travel on into every prompt that carries it. Their CPU goes
//! to the pipeline, not to a local model on a small machine.
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer;
use futures::StreamExt as _;
use switchboard_kit::config::Config;
use switchboard_kit::memory_config::{EmbeddingConfig, LlmConfig};
use switchboard_kit::proto::ExchangeCategorised;
use switchboard_memory::index::LagScope;

use super::canary::{self, Canaries};
use super::chaos_check::{
    CategoryRow, LoggedMessage, MEMORY_STAGES, MemoryEvidence, ModelPrompt, SummarisedEntry,
    SummaryRow, VectorRow,
};
use super::pipeline::Pipeline;
use super::returning::Returned;
use switchboard_fakes::{FakeAnswer, FakeModel};

/// The fake embedding model's name and size.
pub const EMBEDDING_MODEL: &str = "chaos-bag-of-words";
pub const DIMENSIONS: usize = 32;
/// `[summary] idle_gap_s` and `sweep_every_s` of a chaos run: summaries during the load, and
/// soon after it. The gap is just over the summary stage's 10 s wait for fresh messages to be
/// logged (`switchboard_summary::LOG_SETTLE`): with a shorter gap, a run that stops at a fresh
/// message publishes no follow-up and the sweeper's next ask for the same newest message is
/// dropped as a duplicate for `duplicate_window_s` (see the commit that set this).
pub const IDLE_GAP_S: u64 = 11;
pub const SWEEP_EVERY_S: u64 = 1;

/// The model of a run, and the canaries its people's messages carry.
pub struct MemoryModel {
    pub model: FakeModel,
    pub canaries: Canaries,
    /// Every prompt the model got, as its canaries (a digest: the prompts themselves are not
    /// kept here).
    prompts: Arc<Mutex<Vec<ModelPrompt>>>,
}

impl MemoryModel {
    pub async fn start(canaries: Canaries) -> Self {
        let model = FakeModel::start(DIMENSIONS).await;
        let prompts: Arc<Mutex<Vec<ModelPrompt>>> = Arc::default();
        let seen = prompts.clone();
        model.answer_with(move |call| {
            let labelling = call.system.contains("label");
            let mut tokens: Vec<String> = Vec::new();
            for t in canary::find(&call.user) {
                if !tokens.iter().any(|k| k == t) {
                    tokens.push(t.to_string());
                }
            }
            seen.lock().unwrap().push(ModelPrompt {
                purpose: if labelling { "label" } else { "summary" }.into(),
                canaries: tokens.clone(),
            });
            FakeAnswer::Text(if labelling {
                "casual_chat".into()
            } else if tokens.is_empty() {
                "MODEL SUMMARY: nothing of note.".into()
            } else {
                format!("MODEL SUMMARY: {}", tokens.join(" "))
            })
        });
        Self {
            model,
            canaries,
            prompts,
        }
    }

    /// Point `[llm]` and `[embedding]` at the fake, and make summaries come within seconds.
    pub fn configure(&self, c: &mut Config) {
        c.llm = LlmConfig {
            base_url: self.model.url.clone(),
            model: "chaos-chat".into(),
            timeout_s: 10,
            ..Default::default()
        };
        c.embedding = EmbeddingConfig {
            timeout_s: 10,
            ..self.model.embedding_config(EMBEDDING_MODEL)
        };
        c.summary.idle_gap_s = IDLE_GAP_S;
        c.summary.sweep_every_s = SWEEP_EVERY_S;
    }

    fn prompts(&self) -> Vec<ModelPrompt> {
        self.prompts.lock().unwrap().clone()
    }
}

/// What is still to do for the memory workers, for the wait and its messages.
#[derive(Debug, Default, PartialEq, Eq)]
struct Outstanding {
    unembedded: i64,
    uncategorised: i64,
    unsummarised_keys: i64,
    /// Pending and unacknowledged messages of the memory consumers.
    backlog: u64,
}

impl Outstanding {
    fn none(&self) -> bool {
        *self == Self::default()
    }
}

async fn outstanding(p: &Pipeline) -> anyhow::Result<Outstanding> {
    let model = &p.config.embedding.model;
    let unembedded = switchboard_memory::index::lag(&p.db, model, LagScope::Everyone)
        .await?
        .messages_waiting;
    let uncategorised: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.messages m
          WHERE m.direction = 'outbound'
            AND coalesce(m.metadata->>'kind', '') NOT IN ('notice', 'heartbeat_ok')
            AND NOT EXISTS (SELECT 1 FROM switchboard.exchange_categories c
                             WHERE c.outbound_id = m.id)",
    )
    .fetch_one(&p.db)
    .await?;
    // Marked per message (`summary_version`), as the summary worker selects: a message logged
    // late with an old id is still to do.
    let unsummarised_keys: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT s.memory_key)
           FROM switchboard.message_marks k JOIN switchboard.sessions s ON s.id = k.session_id
          WHERE k.summary_version IS NULL AND k.conversation",
    )
    .fetch_one(&p.db)
    .await?;
    let stream = p.js.get_stream(p.topology.events_stream()).await?;
    let mut backlog = 0;
    for stage in MEMORY_STAGES {
        let mut c: consumer::PullConsumer = stream
            .get_consumer(stage)
            .await
            .map_err(|e| anyhow::anyhow!("consumer {stage}: {e}"))?;
        let info = c.info().await?;
        backlog += info.num_pending + info.num_ack_pending as u64;
    }
    Ok(Outstanding {
        unembedded,
        uncategorised,
        unsummarised_keys,
        backlog,
    })
}

/// Wait (at most `timeout`) until every message is embedded, every exchange labelled, every
/// memory key summarised up to its newest message and the memory consumers are empty, three
/// checks in a row; workers that exit are started again meanwhile. Whether they caught up,
/// and how long it took.
pub async fn wait_caught_up(
    p: &mut Pipeline,
    timeout: Duration,
    event: &(impl Fn(String) + ?Sized),
) -> anyhow::Result<(bool, Duration)> {
    let started = Instant::now();
    let mut quiet = 0;
    let mut told = Duration::ZERO;
    while started.elapsed() < timeout {
        for label in p.workers.restart_exited()? {
            event(format!("{label} exited by itself; restarted"));
        }
        let left = outstanding(p).await;
        quiet = match &left {
            Ok(o) if o.none() => quiet + 1,
            _ => 0,
        };
        let left = match left {
            Ok(o) => format!("{o:?}"),
            Err(e) => format!("not readable: {e:#}"),
        };
        if quiet >= 3 {
            return Ok((true, started.elapsed()));
        }
        if quiet == 0 && started.elapsed() >= told + Duration::from_secs(5) {
            told = started.elapsed();
            event(format!(
                "memory catching up for {:.0} s: {left}",
                told.as_secs_f64()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok((false, started.elapsed()))
}

/// A logged message as [`collect`] reads it.
#[derive(sqlx::FromRow)]
struct MessageRead {
    id: String,
    memory_key: String,
    person_id: String,
    direction: String,
    kind: Option<String>,
    message: String,
    logged_ms: i64,
    summary_version: Option<i64>,
    operator: bool,
}

/// A `summarised` journal entry as [`collect`] reads it.
#[derive(sqlx::FromRow)]
struct SummarisedRead {
    memory_key: String,
    session_id: String,
    version: Option<i64>,
    last_message: String,
    merged: Option<i64>,
    covered: Option<i64>,
    at_ms: i64,
}

/// What the memory workers left, read in one snapshot of the database, the
/// `exchange.categorised` events on the stream, and the model's prompts.
pub async fn collect(
    p: &Pipeline,
    model: &MemoryModel,
    caught_up: bool,
    waited: Duration,
    returned: Vec<Returned>,
) -> anyhow::Result<MemoryEvidence> {
    let mut tx = p.db.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await?;
    let messages = sqlx::query_as::<_, MessageRead>(
        "SELECT m.id::text AS id, coalesce(s.memory_key, '') AS memory_key, m.person_id,
                m.direction, m.metadata->>'kind' AS kind, m.message,
                m.metadata ? 'operator' AS operator,
                (extract(epoch FROM m.created_at) * 1000)::bigint AS logged_ms, k.summary_version
           FROM switchboard.messages m LEFT JOIN switchboard.sessions s ON s.id = m.session_id
           LEFT JOIN switchboard.message_marks k ON k.message_id = m.id",
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| LoggedMessage {
        canaries: canary::find(&r.message)
            .into_iter()
            .map(String::from)
            .collect(),
        id: r.id,
        memory_key: r.memory_key,
        person_id: r.person_id,
        direction: r.direction,
        kind: r.kind,
        logged_ms: r.logged_ms,
        summary_version: r.summary_version,
        operator: r.operator,
    })
    .collect();
    let vectors = sqlx::query_as::<_, (String, String, String)>(
        "SELECT message_id::text, model, person_id FROM switchboard.message_vectors",
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|(message_id, model, person_id)| VectorRow {
        message_id,
        model,
        person_id,
    })
    .collect();
    let categories = sqlx::query_as::<_, (String, Option<String>, String, String)>(
        "SELECT outbound_id::text, inbound_id::text, person_id, label
           FROM switchboard.exchange_categories",
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|(outbound_id, inbound_id, person_id, label)| CategoryRow {
        outbound_id,
        inbound_id,
        person_id,
        label,
    })
    .collect();
    let summaries = sqlx::query_as::<_, (String, i64, Option<String>, i64, String)>(
        "SELECT memory_key, version, last_message_in_summary::text, messages_covered, summary
           FROM switchboard.summaries",
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(
        |(memory_key, version, last_message, messages_covered, text)| SummaryRow {
            memory_key,
            version,
            last_message,
            messages_covered,
            canaries: canary::find(&text).into_iter().map(String::from).collect(),
        },
    )
    .collect();
    let summarised = sqlx::query_as::<_, SummarisedRead>(
        "SELECT s.memory_key, e.session_id::text AS session_id,
                (e.detail->>'version')::bigint AS version,
                coalesce(e.detail->>'last_message_id', '') AS last_message,
                (e.detail->>'messages_merged')::bigint AS merged,
                (e.detail->>'messages_covered')::bigint AS covered,
                (extract(epoch FROM e.at) * 1000)::bigint AS at_ms
           FROM switchboard.session_events e JOIN switchboard.sessions s ON s.id = e.session_id
          WHERE e.kind = $1",
    )
    .bind(switchboard_kit::status::SessionEventKind::Summarised)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| SummarisedEntry {
        memory_key: r.memory_key,
        session_id: r.session_id,
        version: r.version.unwrap_or(-1),
        last_message: r.last_message,
        merged: r.merged.unwrap_or(-1),
        covered: r.covered.unwrap_or(-1),
        at_ms: r.at_ms,
    })
    .collect();
    tx.commit().await?;
    let (categorised_events, events_unreadable) = match categorised_events(p).await {
        Ok(ids) => (ids, None),
        Err(e) => (Vec::new(), Some(format!("{e:#}"))),
    };
    Ok(MemoryEvidence {
        canaries: model.canaries,
        embedding_model: p.config.embedding.model.clone(),
        messages,
        vectors,
        categories,
        categorised_events,
        events_unreadable,
        summaries,
        summarised,
        model_prompts: model.prompts(),
        caught_up,
        waited_s: waited.as_secs_f64(),
        returned,
    })
}

/// The outbound message id of every `exchange.categorised` event on the stream.
async fn categorised_events(p: &Pipeline) -> anyhow::Result<Vec<String>> {
    let stream = p.js.get_stream(p.topology.events_stream()).await?;
    let subject = p.topology.event("exchange.categorised");
    let mut reader = stream
        .create_consumer(consumer::pull::Config {
            filter_subject: subject,
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await?;
    let mut left = reader.info().await?.num_pending;
    let mut messages = reader.messages().await?;
    let mut ids = Vec::new();
    while left > 0 {
        let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(5), messages.next()).await
        else {
            anyhow::bail!("{left} exchange.categorised events could not be read");
        };
        let m = m.map_err(|e| anyhow::anyhow!("{e}"))?;
        let e = <ExchangeCategorised as prost::Message>::decode(m.payload.clone())?;
        ids.push(e.outbound_message_id);
        left -= 1;
    }
    Ok(ids)
}
