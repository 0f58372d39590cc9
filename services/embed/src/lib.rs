//! The embedding worker: every logged message, in or out, gets one vector under the configured
//! model (`switchboard.message_vectors`), announced as `message.embedded`.
//!
//! A [`BatchStage`] on the public `message.logged` events: per pull, the texts are read with one
//! query, embedded in chunks of `[embedding] batch`, and written with one statement that skips
//! what is already there, so a redelivered batch doubles nothing. A message with no row (erased
//! by `forget`, or an id that names nothing) is acked without output and counted in
//! `sb_embed_skipped_total{reason}`. `sb_embed_lag_seconds` says how far behind the index is.
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use switchboard_kit::memory_config::EmbeddingConfig;
use switchboard_kit::proto::{MessageEmbedded, MessageLogged};
use switchboard_kit::startup::{App, Task};
use switchboard_kit::{Attempt, BatchStage, Outcome, Output, StageError, Topology};
use switchboard_kit::{Registration, Source, StageSpec};
use switchboard_memory::embed::{self, EmbedError, Embedder};
use switchboard_memory::index::{self, LagScope};
use uuid::Uuid;

pub mod vector_index;

pub use vector_index::{Kept, keep_index};

/// How often the vector index is checked against the vectors it indexes.
const KEEP_INDEX_EVERY: Duration = Duration::from_secs(60);
/// How often the lag gauge is refreshed.
const LAG_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum EmbedStageError {
    #[error(transparent)]
    Embedder(#[from] EmbedError),
    #[error("the embedder answered {got} vectors for {asked} texts")]
    WrongCount { asked: usize, got: usize },
    #[error("the embedder answered a vector of {got} dimensions, its model has {expected}")]
    WrongDimensions { expected: usize, got: usize },
    #[error("message vectors: {0}")]
    Database(#[from] sqlx::Error),
}

impl EmbedStageError {
    fn into_stage(self) -> StageError {
        match &self {
            EmbedStageError::Embedder(e) if !e.is_transient() => StageError::permanent(self),
            _ => StageError::transient(self),
        }
    }
}

/// Why a `message.logged` event gets no vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skipped {
    /// The id is not a UUID.
    BadId,
    /// No such row: erased (`forget`) or never written.
    NoRow,
}

impl Skipped {
    pub fn as_str(self) -> &'static str {
        match self {
            Skipped::BadId => "bad_id",
            Skipped::NoRow => "no_row",
        }
    }

    fn count(self) {
        metrics::counter!("sb_embed_skipped_total", "reason" => self.as_str()).increment(1);
    }
}

/// A logged message read back for embedding.
#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    text: String,
    person_id: String,
    agent_identity: String,
    session_id: Uuid,
    /// Dimensions of its vector under the model, if it has one already (a redelivery).
    embedded: Option<i32>,
    /// Dimensions of the vector recall computed for it ([`switchboard_memory::handoff`]), if
    /// one was handed over: stored as it is, not embedded again.
    handed: Option<i32>,
}

pub struct EmbedStage {
    db: PgPool,
    topology: Topology,
    /// The configured embedder, or why it cannot be used (every message is then refused with
    /// that reason, until the configuration changes).
    embedder: Result<Arc<dyn Embedder>, String>,
    batch: usize,
}

impl EmbedStage {
    pub fn new(
        db: PgPool,
        topology: Topology,
        embedder: Result<Arc<dyn Embedder>, EmbedError>,
        config: &EmbeddingConfig,
    ) -> Self {
        Self {
            db,
            topology,
            embedder: embedder.map_err(|e| e.to_string()),
            batch: config.batch.max(1),
        }
    }

    /// Read the rows, embed those without a vector, write them; the rows found, by id.
    async fn embed_rows(
        &self,
        embedder: &dyn Embedder,
        ids: &[Uuid],
    ) -> Result<Vec<Row>, EmbedStageError> {
        let mut rows: Vec<Row> = sqlx::query_as(
            "SELECT m.id, m.message AS text, m.person_id, m.agent_identity, m.session_id,
                    v.dimensions AS embedded, h.dimensions AS handed
               FROM switchboard.messages m
               LEFT JOIN switchboard.message_vectors v
                      ON v.message_id = m.id AND v.model = $2
               LEFT JOIN switchboard.handed_vectors h
                      ON h.message_id = m.id AND h.model = $2
              WHERE m.id = ANY($1)",
        )
        .bind(ids)
        .bind(embedder.model())
        // Planned for each batch: a plan cached while the log was nearly empty (a fresh
        // database, before Postgres first analyzes it) reads every message for good.
        .persistent(false)
        .fetch_all(&self.db)
        .await?;

        let todo: Vec<&Row> = rows.iter().filter(|r| r.embedded.is_none()).collect();
        if todo.is_empty() {
            if rows.iter().any(|r| r.handed.is_some()) {
                // Embedded before recall's vector came (a redelivery, a slow dispatcher).
                take_handed(&self.db, &ids_of(&rows)).await?;
            }
            return Ok(rows);
        }
        let dimensions = store(&self.db, embedder, &todo, self.batch, &ids_of(&rows)).await?;
        for row in &mut rows {
            row.embedded.get_or_insert(dimensions);
        }
        // Someone forgotten while their messages were being embedded (the model's first load
        // alone takes a second) is not announced: the erasure's sweep of the streams may have
        // run already, and an event published after it would name them for good. What was
        // written is the erasure's (it deletes the vectors with the messages).
        let people: Vec<_> = rows
            .iter()
            .map(|r| {
                let received = switchboard_kit::forgotten::id_time(&r.id.to_string());
                (r.person_id.clone(), received)
            })
            .collect();
        let forgotten = switchboard_kit::forgotten::forgotten_among(&self.db, &people).await?;
        if !forgotten.is_empty() {
            rows.retain(|r| {
                let gone = forgotten.contains(&r.person_id);
                if gone {
                    switchboard_kit::forgotten::dropped("embed", "message.embedded");
                }
                !gone
            });
        }
        Ok(rows)
    }

    fn embedded_event(&self, model: &str, row: &Row, correlation_id: &str) -> Output {
        let event = MessageEmbedded {
            message_id: row.id.to_string(),
            session_id: row.session_id.to_string(),
            person_id: row.person_id.clone(),
            agent_identity: row.agent_identity.clone(),
            model: model.to_string(),
            dimensions: row.embedded.unwrap_or_default(),
            embedded_at_ms: switchboard_kit::now_ms(),
        };
        let output = Output::new(
            self.topology.event("message.embedded"),
            format!("{}:{model}", row.id),
            &event,
        );
        if correlation_id.is_empty() {
            output
        } else {
            output.correlated(correlation_id)
        }
    }
}

impl BatchStage for EmbedStage {
    type Input = MessageLogged;
    const SPEC: StageSpec = StageSpec::new("embed", Source::Events("message.logged"));

    async fn handle_batch(
        &self,
        logged: Vec<MessageLogged>,
        _attempts: &[Attempt],
    ) -> Vec<Outcome> {
        let embedder = match &self.embedder {
            Ok(e) => e.clone(),
            Err(why) => {
                return logged
                    .iter()
                    .map(|_| Err(StageError::permanent(anyhow::anyhow!("{why}"))))
                    .collect();
            }
        };
        let ids: Vec<Option<Uuid>> = logged.iter().map(|l| l.message_id.parse().ok()).collect();
        let wanted: Vec<Uuid> = ids.iter().flatten().copied().collect();
        let rows = if wanted.is_empty() {
            Ok(Vec::new())
        } else {
            self.embed_rows(embedder.as_ref(), &wanted).await
        };
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                // The whole batch shares the read, the embedding and the write.
                let permanent = matches!(&e, EmbedStageError::Embedder(x) if !x.is_transient());
                let why = e.to_string();
                let mut first = Some(e);
                return logged
                    .iter()
                    .map(|_| {
                        Err(match first.take() {
                            Some(e) => e.into_stage(),
                            None if permanent => StageError::permanent(anyhow::anyhow!("{why}")),
                            None => StageError::transient(anyhow::anyhow!("{why}")),
                        })
                    })
                    .collect();
            }
        };
        logged
            .iter()
            .zip(ids)
            .map(|(l, id)| {
                let Some(id) = id else {
                    Skipped::BadId.count();
                    tracing::warn!(message_id = %l.message_id, "message.logged names no message id: skipped");
                    return Ok(Vec::new());
                };
                match rows.iter().find(|r| r.id == id) {
                    Some(row) => Ok(vec![self.embedded_event(
                        embedder.model(),
                        row,
                        &l.correlation_id,
                    )]),
                    None => {
                        Skipped::NoRow.count();
                        tracing::info!(%id, "no such message (erased?): nothing to embed");
                        Ok(Vec::new())
                    }
                }
            })
            .collect()
    }
}

/// Embed `rows` (in chunks of `batch` texts) and write their vectors with one statement that
/// skips any already there; the vectors' dimensions.
async fn store(
    db: &PgPool,
    embedder: &dyn Embedder,
    rows: &[&Row],
    batch: usize,
    read: &[Uuid],
) -> Result<i32, EmbedStageError> {
    let dimensions = embedder.dimensions();
    // What recall handed over with the right length is stored as it is (one inference a
    // message); the rest is embedded here.
    let is_handed = |r: &Row| r.handed == Some(dimensions as i32);
    let handed = rows.iter().filter(|r| is_handed(r)).count();
    let texts: Vec<String> = rows
        .iter()
        .filter(|r| !is_handed(r))
        .map(|r| r.text.clone())
        .collect();
    let mut vectors = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(batch.max(1)) {
        let got = embedder.embed(chunk).await?;
        if got.len() != chunk.len() {
            return Err(EmbedStageError::WrongCount {
                asked: chunk.len(),
                got: got.len(),
            });
        }
        vectors.extend(got);
    }
    if let Some(v) = vectors.iter().find(|v| v.len() != dimensions) {
        return Err(EmbedStageError::WrongDimensions {
            expected: dimensions,
            got: v.len(),
        });
    }
    metrics::counter!("sb_embed_vectors_total", "source" => "handed").increment(handed as u64);
    metrics::counter!("sb_embed_vectors_total", "source" => "embedded")
        .increment(texts.len() as u64);
    // One vector per row, in order: what was embedded here, or none where the hand-off has it.
    let mut embedded = vectors.iter();
    let embeddings: Vec<Option<String>> = rows
        .iter()
        .map(|r| {
            if is_handed(r) {
                None
            } else {
                embedded.next().map(|v| embed::pg_vector(v))
            }
        })
        .collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let people: Vec<String> = rows.iter().map(|r| r.person_id.clone()).collect();
    let identities: Vec<String> = rows.iter().map(|r| r.agent_identity.clone()).collect();
    let mut tx = db.begin().await?;
    // The marks first (their lock order), then the vectors, committed together.
    index::mark_embedded(&mut tx, embedder.model(), &ids).await?;
    // The vectors go as text (pgvector's `[x,y,…]` form) and are cast in the statement: no
    // `vector` value crosses the protocol, so the statement is checked like any other. A handed
    // vector is copied in the statement; the person and identity are the log's either way.
    sqlx::query!(
        "INSERT INTO switchboard.message_vectors
            (message_id, model, person_id, agent_identity, dimensions, embedding)
         SELECT u.id, $2, u.person_id, u.agent_identity, $3,
                coalesce(u.embedding::vector, h.embedding)
           FROM unnest($1::uuid[], $4::text[], $5::text[], $6::text[])
                AS u(id, person_id, agent_identity, embedding)
           LEFT JOIN switchboard.handed_vectors h ON h.message_id = u.id AND h.model = $2
          WHERE u.embedding IS NOT NULL OR h.embedding IS NOT NULL
         ON CONFLICT DO NOTHING",
        &ids,
        embedder.model(),
        dimensions as i32,
        &people,
        &identities,
        &embeddings as &[Option<String>],
    )
    // Planned for each batch: the hand-offs' table is near empty one moment and holds a
    // backlog the next.
    .persistent(false)
    .execute(&mut *tx)
    .await?;
    // Every hand-off of what was read is done with: taken, or the message had its vector.
    take_handed(&mut *tx, read).await?;
    tx.commit().await?;
    Ok(dimensions as i32)
}

fn ids_of(rows: &[Row]) -> Vec<Uuid> {
    rows.iter().map(|r| r.id).collect()
}

/// Delete the hand-offs of `ids` (of every model: each message's vector is written once).
async fn take_handed<'e>(db: impl sqlx::PgExecutor<'e>, ids: &[Uuid]) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "DELETE FROM switchboard.handed_vectors WHERE message_id = ANY($1)",
        ids
    )
    // Planned for each batch: the table is near empty one moment and holds a backlog the next.
    .persistent(false)
    .execute(db)
    .await?;
    Ok(())
}

/// Messages that have no vector under `model` yet (what `switchboard reembed` has left to do):
/// the index lag's count, by its one rule ([`switchboard_memory::index::lag`]).
pub async fn missing(db: &PgPool, model: &str) -> Result<i64, sqlx::Error> {
    Ok(
        switchboard_memory::index::lag(db, model, switchboard_memory::index::LagScope::Everyone)
            .await?
            .messages_waiting,
    )
}

/// Embed up to `limit` of the oldest messages that have no vector under the embedder's model
/// (`switchboard reembed`, one step); how many were embedded (0: none is left). The marks must
/// be for that model ([`index::ensure_marks`], once before the first step): the waiting
/// messages are found by them, and none is found while they are for another. Resumable: what
/// it did is in the table and the marks, and the vectors of other models are left as they are.
pub async fn reembed_step(
    db: &PgPool,
    embedder: &dyn Embedder,
    limit: usize,
    batch: usize,
) -> Result<usize, EmbedStageError> {
    let rows: Vec<Row> = sqlx::query!(
        "SELECT m.id, m.message, m.person_id, m.agent_identity, m.session_id
           FROM switchboard.message_marks k
           JOIN switchboard.messages m ON m.id = k.message_id
          WHERE k.embedded_model IS NULL AND k.conversation
            AND EXISTS (SELECT 1 FROM switchboard.embedding_marks WHERE model = $1)
          ORDER BY k.created_at, k.message_id
          LIMIT $2",
        embedder.model(),
        limit as i64,
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|m| Row {
        id: m.id,
        text: m.message,
        person_id: m.person_id,
        agent_identity: m.agent_identity,
        session_id: m.session_id,
        embedded: None,
        // Back-fill embeds what it reads; a hand-off of the same message is taken with it.
        handed: None,
    })
    .collect();
    if rows.is_empty() {
        return Ok(0);
    }
    store(
        db,
        embedder,
        &rows.iter().collect::<Vec<_>>(),
        batch,
        &ids_of(&rows),
    )
    .await?;
    Ok(rows.len())
}

/// Keep the model's vector index fitting its vectors, for good: built at start if missing, and
/// again whenever the vectors have outgrown it ([`vector_index::keep_index`]).
async fn keep_index_for_good(db: PgPool, model: String, dimensions: usize) {
    loop {
        match keep_index(&db, &model, dimensions).await {
            Ok(Kept::Built { lists, rows }) => {
                tracing::info!(
                    model,
                    lists,
                    vectors = rows,
                    "built the model's vector index"
                )
            }
            Ok(Kept::AsItWas) => {}
            Err(e) => tracing::warn!(model, error = %e, "could not build the model's vector index"),
        }
        tokio::time::sleep(KEEP_INDEX_EVERY).await;
    }
}

/// Refresh `sb_embed_lag_seconds` (everyone's messages) every few seconds, for good.
async fn refresh_lag(db: PgPool, model: String) {
    loop {
        match index::lag(&db, &model, LagScope::Everyone).await {
            Ok(lag) => {
                metrics::gauge!("sb_embed_lag_seconds").set(lag.seconds);
                metrics::gauge!("sb_embed_waiting_messages").set(lag.messages_waiting as f64);
            }
            Err(e) => tracing::warn!(error = %e, "could not measure the embedding lag"),
        }
        tokio::time::sleep(LAG_EVERY).await;
    }
}

/// The embedder `[embedding]` configures, loaded off the async threads (a local model reads
/// ~90 MB).
pub async fn load_embedder(config: &EmbeddingConfig) -> Result<Arc<dyn Embedder>, EmbedError> {
    let config = config.clone();
    tokio::task::spawn_blocking(move || embed::from_config(&config))
        .await
        .map_err(|e| EmbedError::Failed(format!("loading the embedder: {e}")))?
}

fn task(app: &App) -> Task {
    let app = app.clone();
    Box::pin(async move {
        let config = app.config.embedding.clone();
        let embedder = load_embedder(&config).await;
        match &embedder {
            Ok(e) => {
                // Without the marks for this model the lag is still exact, only slower: the
                // next start (or `switchboard reembed`) tries again.
                match index::ensure_marks(&app.db, e.model()).await {
                    Ok(true) => tracing::info!(
                        model = e.model(),
                        "marked every message by whether it has a vector under the model"
                    ),
                    Ok(false) => {}
                    Err(err) => {
                        tracing::warn!(model = e.model(), error = %err, "could not mark the messages for the model")
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "the embedder cannot be used: messages are dead-lettered with the reason")
            }
        }
        let model = match &embedder {
            Ok(e) => e.model().to_string(),
            Err(_) => config.model.clone(),
        };
        let lag = tokio::spawn(refresh_lag(app.db.clone(), model));
        let keeper = embedder.as_ref().ok().map(|e| {
            tokio::spawn(keep_index_for_good(
                app.db.clone(),
                e.model().to_string(),
                e.dimensions(),
            ))
        });
        let stage = EmbedStage::new(app.db.clone(), app.topology.clone(), embedder, &config);
        let result = app.batch_stage_task(stage).await;
        lag.abort();
        if let Some(keeper) = keeper {
            keeper.abort();
        }
        result
    })
}

/// The embedding stage, as the product lists it (`switchboard worker embed`).
pub const STAGE: Registration = Registration {
    spec: EmbedStage::SPEC,
    worker: "embed",
    start: task,
};
