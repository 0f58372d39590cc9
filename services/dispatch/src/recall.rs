//! Recall for a turn's prompt: the person's earlier messages with this agent identity that
//! bear on what they just said, found by `switchboard_memory::recall` and recorded in the
//! session's journal with the reply. Recall never fails a turn: when it cannot be had (the
//! database, the embedder), the turn goes on without it and the journal says why.
use std::sync::Arc;

use sqlx::PgPool;
use switchboard_kit::config::Config;
use switchboard_kit::memory_config::{EmbeddingConfig, RecallConfig};
use switchboard_kit::proto::Turn;
use switchboard_memory::embed::{self, EmbedError, Embedder};
use switchboard_memory::handoff::{HandedVector, VectorHandOff};
use switchboard_memory::recall::{RecallReads, RecallRequest, recall_grouped};
use uuid::Uuid;

/// What one turn recalled: the prompt's block and the journal's record of it.
pub(crate) struct Recalled {
    /// The block's body (`None`: nothing to show, e.g. a first conversation).
    pub block: Option<String>,
    pub detail: serde_json::Value,
}

pub(crate) struct Recaller {
    /// Recall's reads, grouped with the other turns' (the ranking stays per turn).
    reads: RecallReads,
    config: RecallConfig,
    embedding: EmbeddingConfig,
    /// The answered message's vector, for the embedding worker (one inference a message).
    handoff: Arc<VectorHandOff>,
}

impl Recaller {
    pub fn new(db: PgPool, config: &Config) -> Self {
        Self {
            reads: RecallReads::new(db.clone()),
            handoff: Arc::new(VectorHandOff::new(db)),
            config: config.recall.clone(),
            embedding: config.embedding.clone(),
        }
    }

    /// What the turns `group` (one call's messages, in order) recall of `person_id`'s history
    /// with `identity`. `held_by`: the session and the engine session the call resumes (its
    /// turns are in the agent's context already); `None` for a fresh engine session.
    pub async fn for_call(
        &self,
        group: &[Turn],
        person_id: &str,
        identity: &str,
        held_by: Option<(Uuid, &str)>,
    ) -> Option<Recalled> {
        if !self.config.enabled || person_id.is_empty() {
            return None;
        }
        let mut text = String::new();
        let mut answering = Vec::new();
        // The person's messages the query is made of, with their texts.
        let mut spoken: Vec<(Uuid, &str)> = Vec::new();
        for t in group {
            let Some(inbound) = t.message.as_ref().and_then(|m| m.inbound.as_ref()) else {
                continue;
            };
            // A scheduled instruction or heartbeat is not the person speaking.
            if !inbound.scheduled.is_empty() {
                continue;
            }
            if let Ok(id) = inbound.id.parse::<Uuid>() {
                answering.push(id);
                spoken.push((id, &inbound.text));
            }
            text.push_str(&inbound.text);
            text.push('\n');
        }
        let embedder: Result<Arc<dyn Embedder>, EmbedError> = embed::shared(&self.embedding).await;
        let req = RecallRequest {
            person_id,
            agent_identity: identity,
            text: &text,
            held_by,
            answering,
            message: match spoken.as_slice() {
                [(id, said)] => Some((*id, *said)),
                _ => None,
            },
        };
        match recall_grouped(
            &self.reads,
            embedder.as_deref(),
            &self.embedding.model,
            &self.config,
            &req,
        )
        .await
        {
            Ok(Some(mut r)) => {
                metrics::counter!("sb_recall_total", "outcome" => "recalled").increment(1);
                if let Some(v) = r.message_vector.take() {
                    let model = &self.embedding.model;
                    self.handoff
                        .hand(HandedVector::of(v, person_id, identity, model));
                }
                metrics::histogram!("sb_recall_messages").record(r.hits.len() as f64);
                Some(Recalled {
                    block: r.render(self.config.max_chars),
                    detail: r.journal_detail(),
                })
            }
            Ok(None) => None,
            Err(e) => {
                metrics::counter!("sb_recall_total", "outcome" => "failed").increment(1);
                tracing::warn!(person = person_id, error = %e, "recall failed; the turn goes on without it");
                Some(Recalled {
                    block: None,
                    detail: serde_json::json!({ "error": e.to_string() }),
                })
            }
        }
    }
}
