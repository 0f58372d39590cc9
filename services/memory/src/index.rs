//! How far behind the vector index is: what search answers and recall blocks report, and what
//! `sb_embed_lag_seconds` shows. Lag is the age of the oldest logged message that has no vector
//! under the current model yet (0 when every message has one). What is not conversation (the
//! flush's silent answer, a heartbeat's "nothing needs attention": [`crate::NOT_CONVERSATION`])
//! is never embedded, so it never counts as waiting.
use sqlx::PgPool;

/// Whose messages the lag is measured over: everyone's (search across people) or one person +
/// agent identity's (recall, a filtered search).
#[derive(Debug, Clone, Copy)]
pub enum LagScope<'a> {
    Everyone,
    Person {
        person_id: &'a str,
        agent_identity: Option<&'a str>,
    },
}

/// Seconds the index under `model` is behind for `scope`, and how many messages wait.
pub async fn lag(db: &PgPool, model: &str, scope: LagScope<'_>) -> Result<IndexLag, sqlx::Error> {
    lag_excluding(db, model, scope, &[]).await
}

/// [`lag`] over the messages not in `exclude` (recall: the message being answered and what the
/// engine session holds are not waited for, so they do not make the index look behind).
pub async fn lag_excluding(
    db: &PgPool,
    model: &str,
    scope: LagScope<'_>,
    exclude: &[uuid::Uuid],
) -> Result<IndexLag, sqlx::Error> {
    let (person, identity) = match scope {
        LagScope::Everyone => (None, None),
        LagScope::Person {
            person_id,
            agent_identity,
        } => (Some(person_id), agent_identity),
    };
    let (seconds, waiting): (Option<f64>, i64) = sqlx::query_as(
        "SELECT extract(epoch FROM now() - min(m.created_at))::float8, count(*)
           FROM switchboard.messages m
          WHERE ($2::text IS NULL OR m.person_id = $2)
            AND ($3::text IS NULL OR m.agent_identity = $3)
            AND NOT (m.id = ANY($4::uuid[]))
            AND NOT (coalesce(m.metadata->>'kind', '') = ANY($5::text[]))
            AND NOT EXISTS (SELECT 1 FROM switchboard.message_vectors v
                             WHERE v.message_id = m.id AND v.model = $1)",
    )
    .bind(model)
    .bind(person)
    .bind(identity)
    .bind(exclude)
    .bind(crate::NOT_CONVERSATION)
    .fetch_one(db)
    .await?;
    Ok(IndexLag {
        seconds: seconds.unwrap_or(0.0).max(0.0),
        messages_waiting: waiting,
    })
}

/// How far behind the index is.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct IndexLag {
    /// Age of the oldest message not embedded yet (0: none waits).
    pub seconds: f64,
    pub messages_waiting: i64,
}
