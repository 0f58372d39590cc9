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
use switchboard_kit::{Attempt, BatchStage, Outcome, Output, Registration, Source, StageError};
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

    /// The chat model's label for one exchange text.
    async fn ask_model(
        model: &ChatModel,
        labels: &LabelSet,
        text: &str,
    ) -> Result<Chosen, CategoriseError> {
        let answer = model.complete(&labels.system_prompt(), text).await?;
        let resolved = labels.resolve(&answer);
        Ok(Chosen {
            label: resolved.label,
            source: LabelSource::Model,
            raw_label: resolved.raw_label,
        })
    }

    /// The labels of one batch of `message.logged` events: one outcome per event, in order.
    /// Every read and the write are one statement each for the whole batch, and the labels
    /// of the batch are stored in one transaction (the reply path's stages do the same).
    async fn categorise_all(&self, events: &[MessageLogged]) -> Vec<Outcome> {
        let err = CategoriseError::into_stage;
        let mut outcomes: Vec<Option<Outcome>> = (0..events.len()).map(|_| None).collect();
        // An exchange is complete, and labelled, when its reply is logged; an inbound message
        // logged after its reply was labelled (its log was late: a crash, a redelivery) joins
        // the label then.
        let mut late_inbound = Vec::new();
        let mut replies = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let ids = (e.message_id.parse::<Uuid>(), e.session_id.parse::<Uuid>());
            match (e.direction.as_str(), ids) {
                ("inbound" | "outbound", (Err(_), _) | (_, Err(_))) => {
                    outcomes[i] = Some(Err(err(CategoriseError::Malformed(format!(
                        "message id {:?} / session id {:?}",
                        e.message_id, e.session_id
                    )))));
                }
                ("inbound", (Ok(id), Ok(session))) => {
                    outcomes[i] = Some(Ok(Vec::new()));
                    if !e.correlation_id.is_empty() {
                        late_inbound.push((id, session, e.correlation_id.clone()));
                    }
                }
                ("outbound", (Ok(id), Ok(session))) => replies.push(Exchange {
                    at: i,
                    outbound_id: id,
                    session_id: session,
                    inbound: None,
                    text: String::new(),
                }),
                (other, _) => {
                    outcomes[i] = Some(Err(err(CategoriseError::Malformed(format!(
                        "direction {other:?}"
                    )))));
                }
            }
        }
        if let Err(e) = self.join_late_inbound(&late_inbound).await {
            // Only these inputs wrote anything; the replies go on.
            let why = e.to_string();
            for (i, ev) in events.iter().enumerate() {
                if ev.direction == "inbound" && matches!(outcomes[i], Some(Ok(_))) {
                    outcomes[i] = Some(Err(StageError::transient(anyhow::anyhow!("{why}"))));
                }
            }
        }
        // Where the replies are: `label_replies` consumes its list as it decides.
        let reply_at: Vec<usize> = replies.iter().map(|x| x.at).collect();
        if !replies.is_empty()
            && let Err(e) = self
                .label_replies(events, &mut replies, &mut outcomes)
                .await
        {
            let why = e.to_string();
            let permanent = matches!(
                &e,
                CategoriseError::Malformed(_)
                    | CategoriseError::NoLabeller(_)
                    | CategoriseError::Labels(_)
            );
            for &at in &reply_at {
                outcomes[at].get_or_insert_with(|| {
                    if permanent {
                        Err(StageError::permanent(anyhow::anyhow!("{why}")))
                    } else {
                        Err(StageError::transient(anyhow::anyhow!("{why}")))
                    }
                });
            }
        }
        // Every path above decides; an event left undecided is retried, never acked unlabelled.
        outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(StageError::transient(anyhow::anyhow!(
                        "categorise decided nothing for this event"
                    )))
                })
            })
            .collect()
    }

    /// Label the batch's replies: each decided one gets its outcome in `outcomes`; an error
    /// is the whole rest's (a read or the write failed).
    async fn label_replies(
        &self,
        events: &[MessageLogged],
        replies: &mut Vec<Exchange>,
        outcomes: &mut [Option<Outcome>],
    ) -> Result<(), CategoriseError> {
        let ids: Vec<Uuid> = replies.iter().map(|x| x.outbound_id).collect();
        // Labelled already (a redelivery): announced again under the same dedupe id.
        let stored = self.stored(&ids).await?;
        replies.retain(|x| match stored.get(&x.outbound_id) {
            Some(s) => {
                outcomes[x.at] = Some(Ok(vec![self.event(&events[x.at], s)]));
                false
            }
            None => true,
        });
        if replies.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = replies.iter().map(|x| x.outbound_id).collect();
        let texts: std::collections::HashMap<Uuid, (String, Option<String>)> =
            sqlx::query_as::<_, (Uuid, String, Option<String>)>(
                "SELECT id, message, metadata->>'kind' FROM switchboard.messages
                  WHERE id = ANY($1)",
            )
            .bind(&ids)
            // Planned for each batch: a generic plan cached while the log was nearly empty
            // (and never analyzed) reads it whole (tests/tests/table_growth.rs).
            .persistent(false)
            .fetch_all(&self.db)
            .await?
            .into_iter()
            .map(|(id, message, kind)| (id, (message, kind)))
            .collect();
        replies.retain_mut(|x| match texts.get(&x.outbound_id) {
            None => {
                // The row is gone since it was logged (the person was forgotten): nothing
                // to label.
                tracing::info!(message_id = %x.outbound_id, "categorise: the reply is no longer stored");
                metrics::counter!("sb_categorise_skipped_total", "reason" => "reply_gone")
                    .increment(1);
                outcomes[x.at] = Some(Ok(Vec::new()));
                false
            }
            // What Switchboard said while the turn waited is not the agent's answer (the
            // exchange is labelled when the answer is logged), and a heartbeat's "nothing
            // needs attention" was never sent to anyone.
            Some((_, Some(kind))) if matches!(kind.as_str(), "notice" | "heartbeat_ok") => {
                outcomes[x.at] = Some(Ok(Vec::new()));
                false
            }
            Some((text, _)) => {
                x.text = text.clone();
                true
            }
        });
        if replies.is_empty() {
            return Ok(());
        }
        let sessions: Vec<Uuid> = replies.iter().map(|x| x.session_id).collect();
        let correlations: Vec<String> = replies
            .iter()
            .map(|x| events[x.at].correlation_id.clone())
            .collect();
        let inbound: Vec<(i64, Uuid, String)> = sqlx::query_as(
            "SELECT a.n, m.id, m.message
               FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS a(session_id, correlation_id, n)
               CROSS JOIN LATERAL (
                   SELECT id, message FROM switchboard.messages
                    WHERE session_id = a.session_id AND correlation_id = a.correlation_id
                      AND direction = 'inbound'
                    ORDER BY id DESC LIMIT 1) m",
        )
        .bind(&sessions)
        .bind(&correlations)
        // Planned for each batch's own arrays: a plan cached while the log was nearly empty
        // scans it whole.
        .persistent(false)
        .fetch_all(&self.db)
        .await?;
        for (n, id, message) in inbound {
            if let Some(x) = replies.get_mut(n as usize - 1) {
                x.inbound = Some((id, message));
            }
        }
        let now = switchboard_kit::now_ms();
        replies.retain(|x| {
            let e = &events[x.at];
            let waiting = x.inbound.is_none()
                && !e.correlation_id.is_empty()
                && now - e.logged_at_ms < INBOUND_GRACE.as_millis() as i64;
            if waiting {
                outcomes[x.at] = Some(Err(StageError::Defer(
                    INBOUND_RECHECK,
                    "the message the reply answers to be logged".into(),
                )));
            }
            !waiting
        });
        if replies.is_empty() {
            return Ok(());
        }
        let labels = self
            .labels
            .as_ref()
            .map_err(|e| CategoriseError::Labels(e.clone()))?;
        let exchange_texts: Vec<String> = replies
            .iter()
            .map(|x| exchange_text(x.inbound.as_ref().map(|(_, t)| t.as_str()), &x.text))
            .collect();
        let chosen = self.choose_all(labels, &exchange_texts).await;
        let mut labelled = Vec::new();
        for (x, chosen) in replies.drain(..).zip(chosen) {
            match chosen {
                Ok(chosen) => labelled.push((x, chosen)),
                Err(e) => outcomes[x.at] = Some(Err(e.into_stage())),
            }
        }
        if labelled.is_empty() {
            return Ok(());
        }
        let stored = self.store(events, &labelled).await?;
        for (x, _) in &labelled {
            let Some((stored, inserted)) = stored.get(&x.outbound_id) else {
                // Stored by another replica and erased since: nothing is left to announce.
                outcomes[x.at] = Some(Err(err_malformed("the exchange was erased while labelled")));
                continue;
            };
            if *inserted {
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
            outcomes[x.at] = Some(Ok(vec![self.event(&events[x.at], stored)]));
        }
        Ok(())
    }

    /// The label of each exchange text: the embedder's in one call; the chat model's one
    /// request per text, all at once.
    async fn choose_all(
        &self,
        labels: &LabelSet,
        texts: &[String],
    ) -> Vec<Result<Chosen, CategoriseError>> {
        match &self.labeller {
            Labeller::Nearest {
                embedder,
                label_vectors,
            } => {
                let vectors = async {
                    let label_vectors = label_vectors
                        .get_or_try_init(|| async { embedder.embed(&labels.descriptions()).await })
                        .await?;
                    let vectors = embedder.embed(texts).await?;
                    if vectors.len() != texts.len() {
                        return Err(EmbedError::Failed(format!(
                            "the embedder answered {} vectors for {} texts",
                            vectors.len(),
                            texts.len()
                        )));
                    }
                    Ok((label_vectors, vectors))
                }
                .await;
                match vectors {
                    Ok((label_vectors, vectors)) => vectors
                        .iter()
                        .map(|v| {
                            Ok(Chosen {
                                label: labels.nearest(v, label_vectors).to_string(),
                                source: LabelSource::Embedding,
                                raw_label: None,
                            })
                        })
                        .collect(),
                    Err(e) => {
                        let why = e.to_string();
                        let transient = e.is_transient();
                        texts
                            .iter()
                            .map(|_| {
                                Err(CategoriseError::Embed(if transient {
                                    EmbedError::Failed(why.clone())
                                } else {
                                    EmbedError::Unusable(why.clone())
                                }))
                            })
                            .collect()
                    }
                }
            }
            Labeller::Model(model) => {
                futures::future::join_all(texts.iter().map(|t| Self::ask_model(model, labels, t)))
                    .await
            }
            Labeller::Unusable(why) => texts
                .iter()
                .map(|_| Err(CategoriseError::NoLabeller(why.clone())))
                .collect(),
        }
    }

    /// Attach each inbound message (id, session, correlation) to the exchange labelled without
    /// it because it was logged after the reply's grace: the label names the message it answers
    /// in the end. One statement for the batch.
    async fn join_late_inbound(
        &self,
        inbound: &[(Uuid, Uuid, String)],
    ) -> Result<(), CategoriseError> {
        if inbound.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = inbound.iter().map(|i| i.0).collect();
        let sessions: Vec<Uuid> = inbound.iter().map(|i| i.1).collect();
        let correlations: Vec<String> = inbound.iter().map(|i| i.2.clone()).collect();
        let joined = sqlx::query!(
            "WITH input AS (
                 SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[])
                     AS i(inbound_id, session_id, correlation_id)),
             joined AS (
                 UPDATE switchboard.exchange_categories c SET inbound_id = i.inbound_id
                   FROM input i, switchboard.messages o
                  WHERE c.session_id = i.session_id AND c.inbound_id IS NULL
                    AND o.id = c.outbound_id AND o.direction = 'outbound'
                    AND o.correlation_id = i.correlation_id
                 RETURNING c.inbound_id, c.label)
             UPDATE switchboard.messages m SET category = j.label
               FROM (SELECT inbound_id, min(label) AS label FROM joined GROUP BY inbound_id) j
              WHERE m.id = j.inbound_id",
            &ids,
            &sessions,
            &correlations,
        )
        .persistent(false)
        .execute(&self.db)
        .await?
        .rows_affected();
        if joined > 0 {
            metrics::counter!("sb_categorise_late_inbound_joined_total").increment(joined);
        }
        Ok(())
    }

    /// The labels already stored for the exchanges these replies complete.
    async fn stored(
        &self,
        outbound_ids: &[Uuid],
    ) -> Result<std::collections::HashMap<Uuid, Stored>, CategoriseError> {
        let rows = sqlx::query!(
            "SELECT outbound_id, inbound_id, label, source, raw_label
               FROM switchboard.exchange_categories WHERE outbound_id = ANY($1)",
            outbound_ids,
        )
        .fetch_all(&self.db)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.outbound_id,
                    Stored {
                        inbound_id: r.inbound_id,
                        label: r.label,
                        source: if r.source == "model" {
                            LabelSource::Model
                        } else {
                            LabelSource::Embedding
                        },
                        raw_label: r.raw_label,
                    },
                )
            })
            .collect())
    }

    /// Store each exchange's label once, on the exchange and both its messages, all in one
    /// transaction; per reply, what is stored (another replica's label, when it was first) and
    /// whether this call stored it. A reply missing from the answer was stored by another
    /// replica and erased since.
    async fn store(
        &self,
        events: &[MessageLogged],
        labelled: &[(Exchange, Chosen)],
    ) -> Result<std::collections::HashMap<Uuid, (Stored, bool)>, CategoriseError> {
        let column = |f: &dyn Fn(&Exchange, &Chosen, &MessageLogged) -> String| -> Vec<String> {
            labelled
                .iter()
                .map(|(x, c)| f(x, c, &events[x.at]))
                .collect()
        };
        let outbound: Vec<Uuid> = labelled.iter().map(|(x, _)| x.outbound_id).collect();
        let inbound: Vec<Option<Uuid>> = labelled
            .iter()
            .map(|(x, _)| x.inbound.as_ref().map(|(id, _)| *id))
            .collect();
        let sessions: Vec<Uuid> = labelled.iter().map(|(x, _)| x.session_id).collect();
        let raw: Vec<Option<String>> = labelled.iter().map(|(_, c)| c.raw_label.clone()).collect();
        let mut tx = self.db.begin().await?;
        let inserted: Vec<Uuid> = sqlx::query_scalar!(
            r#"INSERT INTO switchboard.exchange_categories
                   (outbound_id, inbound_id, session_id, person_id, agent_identity, channel, label,
                    source, raw_label)
               SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[],
                                    $6::text[], $7::text[], $8::text[], $9::text[])
               ON CONFLICT DO NOTHING
               RETURNING outbound_id"#,
            &outbound,
            &inbound as &[Option<Uuid>],
            &sessions,
            &column(&|_, _, e| e.person_id.clone()),
            &column(&|_, _, e| e.agent_identity.clone()),
            &column(&|_, _, e| e.channel.clone()),
            &column(&|_, c, _| c.label.clone()),
            &column(&|_, c, _| c.source.as_str().to_string()),
            &raw as &[Option<String>],
        )
        .fetch_all(&mut *tx)
        .await?;
        let inserted: std::collections::HashSet<Uuid> = inserted.into_iter().collect();
        // The label on both messages of each exchange stored now.
        let (mut ids, mut id_labels) = (Vec::new(), Vec::new());
        for (x, c) in labelled
            .iter()
            .filter(|(x, _)| inserted.contains(&x.outbound_id))
        {
            ids.push(x.outbound_id);
            id_labels.push(c.label.clone());
            if let Some((id, _)) = &x.inbound {
                ids.push(*id);
                id_labels.push(c.label.clone());
            }
        }
        sqlx::query!(
            "UPDATE switchboard.messages m SET category = u.label
               FROM unnest($1::uuid[], $2::text[]) AS u(id, label)
              WHERE m.id = u.id",
            &ids,
            &id_labels,
        )
        .persistent(false)
        .execute(&mut *tx)
        .await?;
        let mut found_late = std::collections::HashMap::new();
        for (x, c) in labelled.iter().filter(|(x, _)| {
            inserted.contains(&x.outbound_id)
                && x.inbound.is_none()
                && !events[x.at].correlation_id.is_empty()
        }) {
            // Logged since it was looked for: its own event may have found no label to join.
            let late = sqlx::query_scalar!(
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
                x.outbound_id,
                x.session_id,
                events[x.at].correlation_id,
                c.label,
            )
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(id) = late {
                found_late.insert(x.outbound_id, id);
            }
        }
        tx.commit().await?;
        // Those another replica stored first: what it stored.
        let theirs: Vec<Uuid> = outbound
            .iter()
            .filter(|id| !inserted.contains(id))
            .copied()
            .collect();
        let mut out = std::collections::HashMap::new();
        if !theirs.is_empty() {
            for (id, stored) in self.stored(&theirs).await? {
                out.insert(id, (stored, false));
            }
        }
        for (x, c) in labelled
            .iter()
            .filter(|(x, _)| inserted.contains(&x.outbound_id))
        {
            let inbound_id = x
                .inbound
                .as_ref()
                .map(|(id, _)| *id)
                .or_else(|| found_late.get(&x.outbound_id).copied());
            out.insert(
                x.outbound_id,
                (
                    Stored {
                        inbound_id,
                        label: c.label.clone(),
                        source: c.source,
                        raw_label: c.raw_label.clone(),
                    },
                    true,
                ),
            );
        }
        Ok(out)
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

/// A reply of the batch on its way to a label: where its event is in the batch, and what the
/// exchange is made of.
struct Exchange {
    at: usize,
    outbound_id: Uuid,
    session_id: Uuid,
    /// The message it answers (id, text), when found.
    inbound: Option<(Uuid, String)>,
    /// The reply's text.
    text: String,
}

fn err_malformed(why: &str) -> StageError {
    CategoriseError::Malformed(why.into()).into_stage()
}

impl BatchStage for CategoriseStage {
    type Input = MessageLogged;
    const SPEC: StageSpec = StageSpec::new("categorise", Source::Events("message.logged"));

    async fn handle_batch(
        &self,
        events: Vec<MessageLogged>,
        _attempts: &[Attempt],
    ) -> Vec<Outcome> {
        self.categorise_all(&events).await
    }
}

/// The categorisation worker, as the product lists it (`switchboard worker categorise`).
pub const STAGE: Registration = Registration {
    spec: CategoriseStage::SPEC,
    worker: "categorise",
    start: |app: &App| {
        app.batch_stage_task(CategoriseStage::new(
            app.db.clone(),
            app.topology.clone(),
            &app.config.llm,
            &app.config.embedding,
            &app.config.categorise,
        ))
    },
};
