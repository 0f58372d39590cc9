//! The categorisation worker: every reply logged completes an exchange (the person's message and
//! the reply that answers it: same session and correlation id; an agent-started message is an
//! exchange of its own), which gets one of the `[categorise] labels`. With `[llm]` configured
//! the chat model picks it (an answer outside the set is stored as `other`, with what the model
//! said); otherwise the label whose description is nearest to the exchange by embedding.
//!
//! The label is stored once per exchange (`exchange_categories`, keyed by the reply) and on both
//! messages (`messages.category`) in one transaction, then announced as `exchange.categorised`.
//! A redelivered event finds the stored label and announces it again under the same dedupe id,
//! so a crash between the commit and the publish loses nothing and doubles nothing.
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use switchboard_kit::memory_config::EmbeddingConfig;
use switchboard_kit::proto::{ExchangeCategorised, MessageLogged};
use switchboard_kit::startup::App;
use switchboard_kit::{Attempt, Outcome, Output, Registration, Source, Stage, StageError};
use switchboard_kit::{StageSpec, Topology};
use switchboard_memory::categories::{LabelSet, LabelSetError, exchange_text};
use switchboard_memory::{ChatError, ChatModel, EmbedError, Embedder};
use tokio::sync::OnceCell;
use uuid::Uuid;

/// The inbound message of an exchange is logged by another stage; a reply that finds none is
/// given this long (from when it was logged) for it to appear before it is taken as an
/// agent-started message, an exchange of its own.
const INBOUND_GRACE: Duration = Duration::from_secs(3);
/// How often the inbound message is looked for again within the grace.
const INBOUND_RECHECK: Duration = Duration::from_millis(300);

#[derive(Debug, thiserror::Error)]
pub enum CategoriseError {
    #[error("event is malformed: {0}")]
    Malformed(String),
    /// Neither a chat model nor an embedder can label: nothing changes until the configuration
    /// does (the dead letter can be replayed then).
    #[error("no way to label exchanges: [llm] is not configured and {0}")]
    NoLabeller(String),
    #[error("[categorise] labels: {0}")]
    Labels(#[from] LabelSetError),
    #[error("the chat model failed: {0}")]
    Model(#[from] ChatError),
    #[error("the embedder failed: {0}")]
    Embed(#[from] EmbedError),
    #[error("categories: {0}")]
    Database(#[from] sqlx::Error),
}

impl CategoriseError {
    fn into_stage(self) -> StageError {
        match self {
            // A model or an embedder that fails now may answer later; so may the database.
            CategoriseError::Model(_)
            | CategoriseError::Embed(_)
            | CategoriseError::Database(_) => StageError::transient(self),
            CategoriseError::Malformed(_)
            | CategoriseError::NoLabeller(_)
            | CategoriseError::Labels(_) => StageError::permanent(self),
        }
    }
}

/// Who picks the label.
enum Labeller {
    /// The configured chat model, told the labels and their descriptions.
    Model(ChatModel),
    /// The label whose description is nearest by embedding; the labels' vectors are computed
    /// on first use, once per process.
    Nearest {
        embedder: Arc<dyn Embedder>,
        label_vectors: OnceCell<Vec<Vec<f32>>>,
    },
    /// Neither is usable: why.
    Unusable(String),
}

/// What labelled an exchange (`exchange_categories.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelSource {
    Model,
    Embedding,
}

impl LabelSource {
    pub fn as_str(self) -> &'static str {
        match self {
            LabelSource::Model => "model",
            LabelSource::Embedding => "embedding",
        }
    }
}

/// A label chosen for an exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chosen {
    label: String,
    source: LabelSource,
    raw_label: Option<String>,
}

pub struct CategoriseStage {
    db: PgPool,
    topology: Topology,
    labels: Result<LabelSet, LabelSetError>,
    labeller: Labeller,
}

impl CategoriseStage {
    /// The stage as `[llm]`, `[embedding]` and `[categorise]` configure it. A configuration
    /// that cannot label is not an error here: each exchange is dead-lettered with the reason
    /// (and can be replayed once the configuration is fixed).
    pub fn new(
        db: PgPool,
        topology: Topology,
        llm: &switchboard_kit::memory_config::LlmConfig,
        embedding: &EmbeddingConfig,
        labels: &switchboard_kit::memory_config::CategoriseConfig,
    ) -> Self {
        let labeller = match ChatModel::from_config(llm) {
            Some(model) => Labeller::Model(model),
            None => match switchboard_memory::embed::from_config(embedding) {
                Ok(embedder) => Labeller::Nearest {
                    embedder,
                    label_vectors: OnceCell::new(),
                },
                Err(e) => Labeller::Unusable(format!("the embedder is not usable ({e})")),
            },
        };
        // Listed at 0 from the start, so a dashboard sees the series before the first one.
        metrics::counter!("sb_categorise_outside_label_set_total").increment(0);
        let labels = LabelSet::new(&labels.labels);
        if let Err(e) = &labels {
            tracing::error!(error = %e, "categorise: the label set is not valid");
        }
        if let Labeller::Unusable(why) = &labeller {
            tracing::error!(why, "categorise: exchanges cannot be labelled");
        }
        Self {
            db,
            topology,
            labels,
            labeller,
        }
    }

    async fn choose(&self, labels: &LabelSet, text: &str) -> Result<Chosen, CategoriseError> {
        match &self.labeller {
            Labeller::Model(model) => {
                let answer = model.complete(&labels.system_prompt(), text).await?;
                let resolved = labels.resolve(&answer);
                Ok(Chosen {
                    label: resolved.label,
                    source: LabelSource::Model,
                    raw_label: resolved.raw_label,
                })
            }
            Labeller::Nearest {
                embedder,
                label_vectors,
            } => {
                let label_vectors = label_vectors
                    .get_or_try_init(|| async { embedder.embed(&labels.descriptions()).await })
                    .await?;
                let mut v = embedder.embed(&[text.to_string()]).await?;
                let v = v
                    .pop()
                    .ok_or_else(|| EmbedError::Failed("the embedder answered no vector".into()))?;
                Ok(Chosen {
                    label: labels.nearest(&v, label_vectors).to_string(),
                    source: LabelSource::Embedding,
                    raw_label: None,
                })
            }
            Labeller::Unusable(why) => Err(CategoriseError::NoLabeller(why.clone())),
        }
    }

    async fn categorise(&self, e: &MessageLogged) -> Result<Vec<Output>, StageError> {
        let err = CategoriseError::into_stage;
        match e.direction.as_str() {
            // The exchange is complete, and labelled, when its reply is logged; an inbound
            // message logged after its reply was labelled (its log was late: a crash, a
            // redelivery) joins the label then.
            "inbound" => return self.join_late_inbound(e).await.map_err(err),
            "outbound" => {}
            other => {
                return Err(err(CategoriseError::Malformed(format!(
                    "direction {other:?}"
                ))));
            }
        }
        let outbound_id: Uuid = e.message_id.parse().map_err(|_| {
            err(CategoriseError::Malformed(format!(
                "message id {:?}",
                e.message_id
            )))
        })?;
        let session_id: Uuid = e.session_id.parse().map_err(|_| {
            err(CategoriseError::Malformed(format!(
                "session id {:?}",
                e.session_id
            )))
        })?;
        if let Some(stored) = self.stored(outbound_id).await.map_err(err)? {
            return Ok(vec![self.event(e, &stored)]);
        }
        let reply = sqlx::query!(
            r#"SELECT message, metadata->>'kind' AS "kind?" FROM switchboard.messages
                WHERE id = $1"#,
            outbound_id,
        )
        .fetch_optional(&self.db)
        .await
        .map_err(|e| err(e.into()))?;
        let Some((reply_text, kind)) = reply.map(|r| (r.message, r.kind)) else {
            // The row is gone since it was logged (the person was forgotten): nothing to label.
            tracing::info!(message_id = %outbound_id, "categorise: the reply is no longer stored");
            metrics::counter!("sb_categorise_skipped_total", "reason" => "reply_gone").increment(1);
            return Ok(Vec::new());
        };
        if matches!(kind.as_deref(), Some("notice" | "heartbeat_ok")) {
            // What Switchboard said while the turn waited is not the agent's answer (the
            // exchange is labelled when the answer is logged), and a heartbeat's "nothing
            // needs attention" was never sent to anyone.
            return Ok(Vec::new());
        }
        let inbound: Option<(Uuid, String)> = sqlx::query!(
            "SELECT id, message FROM switchboard.messages
              WHERE session_id = $1 AND correlation_id = $2 AND direction = 'inbound'
              ORDER BY id DESC LIMIT 1",
            session_id,
            e.correlation_id,
        )
        .fetch_optional(&self.db)
        .await
        .map_err(|e| err(e.into()))?
        .map(|m| (m.id, m.message));
        let logged_ms_ago = switchboard_kit::now_ms() - e.logged_at_ms;
        if inbound.is_none()
            && !e.correlation_id.is_empty()
            && logged_ms_ago < INBOUND_GRACE.as_millis() as i64
        {
            return Err(StageError::Defer(
                INBOUND_RECHECK,
                "the message the reply answers to be logged".into(),
            ));
        }
        let labels = self
            .labels
            .as_ref()
            .map_err(|e| err(CategoriseError::Labels(e.clone())))?;
        let text = exchange_text(inbound.as_ref().map(|(_, t)| t.as_str()), &reply_text);
        let chosen = self.choose(labels, &text).await.map_err(err)?;
        let (stored, inserted) = self
            .store(
                e,
                outbound_id,
                session_id,
                inbound.map(|(id, _)| id),
                &chosen,
            )
            .await
            .map_err(err)?;
        if inserted {
            metrics::counter!(
                "sb_categorise_exchanges_total",
                "label" => stored.label.clone(),
                "source" => stored.source.as_str()
            )
            .increment(1);
            if stored.raw_label.is_some() {
                metrics::counter!("sb_categorise_outside_label_set_total").increment(1);
                tracing::info!(
                    raw_label = stored.raw_label.as_deref().unwrap_or_default(),
                    "categorise: the model answered a label outside the set; stored as other"
                );
            }
        }
        Ok(vec![self.event(e, &stored)])
    }

    /// The label already stored for the exchange this reply completes.
    /// Attach `e` (an inbound message) to the exchange labelled without it because it was
    /// logged after the reply's grace: the label names the message it answers in the end.
    async fn join_late_inbound(&self, e: &MessageLogged) -> Result<Vec<Output>, CategoriseError> {
        let (Ok(inbound_id), Ok(session_id)) =
            (e.message_id.parse::<Uuid>(), e.session_id.parse::<Uuid>())
        else {
            return Err(CategoriseError::Malformed(format!(
                "message id {:?} / session id {:?}",
                e.message_id, e.session_id
            )));
        };
        if e.correlation_id.is_empty() {
            return Ok(Vec::new());
        }
        let joined = sqlx::query!(
            "WITH joined AS (
                 UPDATE switchboard.exchange_categories c SET inbound_id = $1
                   FROM switchboard.messages o
                  WHERE c.session_id = $2 AND c.inbound_id IS NULL AND o.id = c.outbound_id
                    AND o.direction = 'outbound' AND o.correlation_id = $3
                 RETURNING c.label)
             UPDATE switchboard.messages SET category = (SELECT min(label) FROM joined)
              WHERE id = $1 AND EXISTS (SELECT 1 FROM joined)",
            inbound_id,
            session_id,
            e.correlation_id,
        )
        .execute(&self.db)
        .await?
        .rows_affected();
        if joined > 0 {
            metrics::counter!("sb_categorise_late_inbound_joined_total").increment(1);
        }
        Ok(Vec::new())
    }

    async fn stored(&self, outbound_id: Uuid) -> Result<Option<Stored>, CategoriseError> {
        let row = sqlx::query!(
            "SELECT inbound_id, label, source, raw_label
               FROM switchboard.exchange_categories WHERE outbound_id = $1",
            outbound_id,
        )
        .fetch_optional(&self.db)
        .await?;
        Ok(row.map(|r| Stored {
            inbound_id: r.inbound_id,
            label: r.label,
            source: if r.source == "model" {
                LabelSource::Model
            } else {
                LabelSource::Embedding
            },
            raw_label: r.raw_label,
        }))
    }

    /// Store the label once per exchange, on the exchange and both its messages, in one
    /// transaction; what is stored (another replica's label, when it was first) and whether
    /// this call stored it.
    async fn store(
        &self,
        e: &MessageLogged,
        outbound_id: Uuid,
        session_id: Uuid,
        inbound_id: Option<Uuid>,
        chosen: &Chosen,
    ) -> Result<(Stored, bool), CategoriseError> {
        let mut tx = self.db.begin().await?;
        let inserted = sqlx::query!(
            "INSERT INTO switchboard.exchange_categories
                (outbound_id, inbound_id, session_id, person_id, agent_identity, channel, label,
                 source, raw_label)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT DO NOTHING",
            outbound_id,
            inbound_id,
            session_id,
            e.person_id,
            e.agent_identity,
            e.channel,
            chosen.label,
            chosen.source.as_str(),
            chosen.raw_label,
        )
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !inserted {
            tx.rollback().await?;
            let stored = self.stored(outbound_id).await?.ok_or_else(|| {
                // The row was there a moment ago and is gone: erased meanwhile.
                CategoriseError::Malformed("the exchange was erased while labelled".into())
            })?;
            return Ok((stored, false));
        }
        sqlx::query!(
            "UPDATE switchboard.messages SET category = $1 WHERE id = $2 OR id = $3",
            chosen.label,
            outbound_id,
            inbound_id,
        )
        // Planned each time: a plan cached while the log was nearly empty scans it whole.
        .persistent(false)
        .execute(&mut *tx)
        .await?;
        let mut inbound_id = inbound_id;
        if inbound_id.is_none() && !e.correlation_id.is_empty() {
            // Logged since it was looked for: its own event may have found no label to join.
            inbound_id = sqlx::query_scalar!(
                "WITH late AS (
                     SELECT id FROM switchboard.messages
                      WHERE session_id = $2 AND correlation_id = $3 AND direction = 'inbound'
                      ORDER BY id DESC LIMIT 1),
                 joined AS (
                     UPDATE switchboard.exchange_categories SET inbound_id = (SELECT id FROM late)
                      WHERE outbound_id = $1 AND EXISTS (SELECT 1 FROM late)
                     RETURNING inbound_id)
                 UPDATE switchboard.messages SET category = $4
                  WHERE id = (SELECT inbound_id FROM joined) RETURNING id",
                outbound_id,
                session_id,
                e.correlation_id,
                chosen.label,
            )
            .fetch_optional(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok((
            Stored {
                inbound_id,
                label: chosen.label.clone(),
                source: chosen.source,
                raw_label: chosen.raw_label.clone(),
            },
            true,
        ))
    }

    fn event(&self, e: &MessageLogged, stored: &Stored) -> Output {
        let event = ExchangeCategorised {
            inbound_message_id: stored
                .inbound_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            outbound_message_id: e.message_id.clone(),
            session_id: e.session_id.clone(),
            person_id: e.person_id.clone(),
            agent_identity: e.agent_identity.clone(),
            channel: e.channel.clone(),
            label: stored.label.clone(),
            source: stored.source.as_str().into(),
            categorised_at_ms: switchboard_kit::now_ms(),
        };
        Output::new(
            self.topology.event("exchange.categorised"),
            e.message_id.clone(),
            &event,
        )
        .correlated(e.correlation_id.clone())
    }
}

/// An exchange's stored label.
#[derive(Debug, Clone)]
struct Stored {
    inbound_id: Option<Uuid>,
    label: String,
    source: LabelSource,
    raw_label: Option<String>,
}

impl Stage for CategoriseStage {
    type Input = MessageLogged;
    const SPEC: StageSpec = StageSpec::new("categorise", Source::Events("message.logged"));

    async fn handle(&self, event: MessageLogged, _attempt: &Attempt) -> Outcome {
        self.categorise(&event).await
    }
}

/// The categorisation worker, as the product lists it (`switchboard worker categorise`).
pub const STAGE: Registration = Registration {
    spec: CategoriseStage::SPEC,
    worker: "categorise",
    start: |app: &App| {
        app.stage_task(CategoriseStage::new(
            app.db.clone(),
            app.topology.clone(),
            &app.config.llm,
            &app.config.embedding,
            &app.config.categorise,
        ))
    },
};
