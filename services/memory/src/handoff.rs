//! One inference per message: the vector recall computes for what a person just said is that
//! message's own vector when the turn answers that one message and embedded its whole text.
//! Recall hands it to the embedding worker through `switchboard.handed_vectors`, and the worker
//! stores it as the message's vector instead of embedding the text a second time.
//!
//! A hand-off is best effort: one not made (the database busy, the message embedded already, no
//! embedding worker of that model ever started here) costs the worker an inference, nothing
//! else. Like the message log, it takes the person's erasure lock and is not written for a
//! person forgotten since the message came; an erasure deletes their hand-offs with their
//! vectors (`forget`); what no worker takes (none running) is deleted after [`UNCLAIMED_AFTER`].
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use switchboard_kit::coalesce::Coalescer;
use uuid::Uuid;

/// A hand-off no embedding worker took within this long is deleted (the worker takes one
/// within its lag; a deployment without the worker would otherwise keep every turn's vector).
pub const UNCLAIMED_AFTER: Duration = Duration::from_secs(300);
/// How often the hand-offs nobody took are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Most hand-offs written by one statement.
const MAX_BATCH: usize = 256;

/// One message's vector, as recall computed it.
#[derive(Debug, Clone)]
pub struct HandedVector {
    pub message_id: Uuid,
    pub person_id: String,
    pub agent_identity: String,
    pub model: String,
    pub dimensions: usize,
    /// The vector as `pg_vector` text.
    pub vector: String,
}

impl HandedVector {
    /// What recall embedded for the one message it answers, handed over as that message's.
    pub fn of(
        v: crate::recall::MessageVector,
        person_id: &str,
        agent_identity: &str,
        model: &str,
    ) -> Self {
        Self {
            message_id: v.message_id,
            person_id: person_id.to_string(),
            agent_identity: agent_identity.to_string(),
            model: model.to_string(),
            dimensions: v.dimensions,
            vector: v.vector,
        }
    }
}

/// Writes recall's vectors for the embedding worker, many turns' in one statement.
pub struct VectorHandOff {
    writes: Coalescer<HandedVector, ()>,
}

impl VectorHandOff {
    pub fn new(db: PgPool) -> Self {
        let last_sweep = std::sync::Arc::new(Mutex::new(Instant::now()));
        let writes = Coalescer::new(MAX_BATCH, 1, move |handed: Vec<HandedVector>| {
            let (db, last_sweep) = (db.clone(), last_sweep.clone());
            async move {
                if let Err(e) = write_all(&db, &handed).await {
                    metrics::counter!("sb_vector_handoffs_total", "outcome" => "failed")
                        .increment(handed.len() as u64);
                    tracing::debug!(error = %e, "vectors not handed to the embedding worker");
                }
                let due = {
                    let mut last = last_sweep.lock().unwrap_or_else(|p| p.into_inner());
                    let due = last.elapsed() >= SWEEP_EVERY;
                    if due {
                        *last = Instant::now();
                    }
                    due
                };
                if due && let Err(e) = sweep_unclaimed(&db, UNCLAIMED_AFTER).await {
                    tracing::debug!(error = %e, "unclaimed vector hand-offs not swept");
                }
                vec![(); handed.len()]
            }
        });
        Self { writes }
    }

    /// Hand `vector` over, in the background: the turn does not wait for it.
    pub fn hand(self: &std::sync::Arc<Self>, vector: HandedVector) {
        let this = self.clone();
        tokio::spawn(async move {
            let _ = this.writes.call(vector).await;
        });
    }
}

/// Write the hand-offs the embedding worker of their model can take: not for a message that has
/// its vector already, nor for a person forgotten since the message came (its id is a UUIDv7
/// made when it was received).
pub async fn write_all(db: &PgPool, handed: &[HandedVector]) -> Result<u64, sqlx::Error> {
    if handed.is_empty() {
        return Ok(0);
    }
    let mut tx = db.begin().await?;
    let mut people: Vec<String> = handed.iter().map(|h| h.person_id.clone()).collect();
    people.sort();
    people.dedup();
    switchboard_kit::forgotten::lock_shared_all(&mut *tx, &people).await?;
    let col = |f: fn(&HandedVector) -> String| handed.iter().map(f).collect::<Vec<_>>();
    let received: Vec<DateTime<Utc>> = handed
        .iter()
        .map(|h| switchboard_kit::forgotten::id_time(&h.message_id.to_string()))
        .collect();
    let written = sqlx::query(
        "INSERT INTO switchboard.handed_vectors
            (message_id, model, person_id, agent_identity, dimensions, embedding)
         SELECT h.id, h.model, h.person_id, h.agent_identity, h.dimensions, h.embedding::vector
           FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[], $6::text[],
                       $7::timestamptz[])
                AS h(id, model, person_id, agent_identity, dimensions, embedding, received)
          WHERE EXISTS (SELECT 1 FROM switchboard.embedding_marks k WHERE k.model = h.model)
            AND NOT EXISTS (SELECT 1 FROM switchboard.message_marks k
                             WHERE k.message_id = h.id AND k.embedded_model = h.model)
            AND NOT EXISTS (SELECT 1 FROM switchboard.forgotten_people f
                             WHERE f.person_sha256 = sha256(convert_to(h.person_id, 'UTF8'))
                               AND f.forgotten_at > h.received)
         ON CONFLICT DO NOTHING",
    )
    .bind(handed.iter().map(|h| h.message_id).collect::<Vec<_>>())
    .bind(col(|h| h.model.clone()))
    .bind(col(|h| h.person_id.clone()))
    .bind(col(|h| h.agent_identity.clone()))
    .bind(
        handed
            .iter()
            .map(|h| h.dimensions as i32)
            .collect::<Vec<_>>(),
    )
    .bind(col(|h| h.vector.clone()))
    .bind(&received)
    // Planned for each batch: a plan cached while the log was nearly empty reads it whole.
    .persistent(false)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    metrics::counter!("sb_vector_handoffs_total", "outcome" => "handed").increment(written);
    Ok(written)
}

/// Delete the hand-offs older than `age` (no embedding worker took them); how many.
pub async fn sweep_unclaimed(db: &PgPool, age: Duration) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "DELETE FROM switchboard.handed_vectors
          WHERE created_at < now() - make_interval(secs => $1)",
    )
    .bind(age.as_secs_f64())
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}
