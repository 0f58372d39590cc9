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

/// What a lag statement reads: the oldest waiting message's age, and how many wait.
#[derive(sqlx::FromRow)]
struct LagRow {
    seconds: Option<f64>,
    waiting: i64,
}

/// Seconds the index under `model` is behind for `scope`, and how many messages wait.
pub async fn lag(db: &PgPool, model: &str, scope: LagScope<'_>) -> Result<IndexLag, sqlx::Error> {
    lag_excluding(db, model, scope, &[]).await
}

/// [`lag`] over the messages not in `exclude` (recall: the message being answered and what the
/// engine session holds are not waited for, so they do not make the index look behind).
///
/// When the marks are for `model` (the steady state: [`ensure_marks`]), the waiting messages are
/// the entries of the partial index `message_marks_unembedded`, a handful whatever the log's size.
/// Otherwise (no embedding worker of that model has started yet) every message is looked up
/// among the vectors: exact, and slow on a large log. Everyone's lag is two statements, not one
/// with both branches: Postgres plans the slow branch in parallel and starts its workers
/// (~10 ms) even when a one-time filter then skips it (seen in the memory bench at 1M). A
/// person's lag is one statement in the steady state (the marks for `model`), by the partial
/// index of the person's unembedded messages.
pub async fn lag_excluding(
    db: &PgPool,
    model: &str,
    scope: LagScope<'_>,
    exclude: &[uuid::Uuid],
) -> Result<IndexLag, sqlx::Error> {
    let lag = match scope {
        // A person's lag (every recall asks for it): statements of their own with
        // `person_id = $2`, since a "$2 IS NULL OR person_id = $2" filter keeps a generic plan
        // from using the person's indexes.
        LagScope::Person {
            person_id,
            agent_identity,
        } => {
            // When the marks are for `model` (the steady state), the person's unmarked messages
            // are read by the partial index `message_marks_person_unembedded`: a handful, where
            // reading the person's log took a heavy person's recall 2.2 ms at 1M. Whether they
            // are is read in the same statement, so that costs no round trip; the mark has to
            // be a plain condition for the partial index to serve it, and the other case is a
            // statement of its own: in one statement with it, Postgres started parallel
            // workers (~28 ms) for the branch a one-time filter then skipped.
            let marked = sqlx::query!(
                r#"SELECT (SELECT EXISTS (SELECT 1 FROM switchboard.embedding_marks
                                           WHERE model = $1)) AS "marked!",
                          extract(epoch FROM now() - min(k.created_at))::float8 AS "seconds?",
                          count(*) AS "waiting!"
                     FROM switchboard.message_marks k
                    WHERE (SELECT EXISTS (SELECT 1 FROM switchboard.embedding_marks
                                           WHERE model = $1))
                      AND k.person_id = $2 AND ($3::text IS NULL OR k.agent_identity = $3)
                      AND k.embedded_model IS NULL AND k.conversation
                      AND NOT (k.message_id = ANY($4::uuid[]))"#,
                model,
                person_id,
                agent_identity,
                exclude,
            )
            .fetch_one(db)
            .await?;
            if marked.marked {
                LagRow {
                    seconds: marked.seconds,
                    waiting: marked.waiting,
                }
            } else {
                // No worker of `model` has marked yet: each of the person's messages is looked
                // up among the vectors (a person's messages are few).
                sqlx::query_as!(
                    LagRow,
                    r#"SELECT extract(epoch FROM now() - min(m.created_at))::float8 AS "seconds?",
                              count(*) AS "waiting!"
                         FROM switchboard.messages m
                        WHERE m.person_id = $2 AND ($3::text IS NULL OR m.agent_identity = $3)
                          AND m.conversation
                          AND NOT (m.id = ANY($4::uuid[]))
                          AND NOT EXISTS (SELECT 1 FROM switchboard.message_vectors v
                                           WHERE v.message_id = m.id AND v.model = $1)"#,
                    model,
                    person_id,
                    agent_identity,
                    exclude,
                )
                .fetch_one(db)
                .await?
            }
        }
        LagScope::Everyone => {
            if marked_model(db).await?.as_deref() == Some(model) {
                sqlx::query_as::<_, LagRow>(
                    "SELECT extract(epoch FROM now() - min(k.created_at))::float8 AS seconds,
                            count(*) AS waiting
                       FROM switchboard.message_marks k
                      WHERE k.embedded_model IS NULL AND k.conversation
                        AND NOT (k.message_id = ANY($1::uuid[]))",
                )
                .bind(exclude)
                // Planned each time, so the partial index of unembedded messages is used once
                // the log has grown past what a plan cached on an empty log assumed.
                .persistent(false)
                .fetch_one(db)
                .await?
            } else {
                sqlx::query_as!(
                    LagRow,
                    r#"SELECT extract(epoch FROM now() - min(m.created_at))::float8 AS "seconds?",
                              count(*) AS "waiting!"
                         FROM switchboard.messages m
                        WHERE NOT EXISTS (SELECT 1 FROM switchboard.message_vectors v
                                           WHERE v.message_id = m.id AND v.model = $1)
                          AND m.conversation
                          AND NOT (m.id = ANY($2::uuid[]))"#,
                    model,
                    exclude,
                )
                .fetch_one(db)
                .await?
            }
        }
    };
    Ok(IndexLag {
        seconds: lag.seconds.unwrap_or(0.0).max(0.0),
        messages_waiting: lag.waiting,
    })
}

/// Make the marks (`message_marks.embedded_model`) be for `model`: when they are for another model
/// (or none yet), mark every message again by whether it has a vector under `model`, in one
/// transaction holding the marks' row, so that no concurrent [`mark_embedded`] is lost. Run by
/// the embedding worker and `switchboard reembed` before they embed; a no-op in the steady
/// state, a pass over the whole log after a change of model. Whether it marked again.
pub async fn ensure_marks(db: &PgPool, model: &str) -> Result<bool, sqlx::Error> {
    let mut tx = db.begin().await?;
    // The row is created if missing, then held: concurrent callers queue here.
    sqlx::query!(
        "INSERT INTO switchboard.embedding_marks (model) VALUES ('') ON CONFLICT (id) DO NOTHING",
    )
    .execute(&mut *tx)
    .await?;
    let marked = sqlx::query_scalar!("SELECT model FROM switchboard.embedding_marks FOR UPDATE")
        .fetch_one(&mut *tx)
        .await?;
    if marked == model {
        tx.commit().await?;
        return Ok(false);
    }
    // Unmark what has no vector under `model`, then mark what has.
    sqlx::query!(
        "UPDATE switchboard.message_marks k SET embedded_model = NULL
          WHERE k.embedded_model IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM switchboard.message_vectors v
                             WHERE v.message_id = k.message_id AND v.model = $1)",
        model,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE switchboard.message_marks k SET embedded_model = $1
           FROM switchboard.message_vectors v
          WHERE v.message_id = k.message_id AND v.model = $1
            AND k.embedded_model IS DISTINCT FROM $1",
        model,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE switchboard.embedding_marks SET model = $1, marked_at = now()",
        model,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// The model the marks are for: the model of the embedding worker that last started here (`None`:
/// no embedding worker has started on this database).
pub async fn marked_model(db: &PgPool) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!("SELECT model FROM switchboard.embedding_marks")
        .fetch_optional(db)
        .await
}

/// Mark `ids` as having a vector under `model`, in the transaction that wrote the vectors, if
/// the marks are for `model` (a worker still running an older model leaves them alone). The
/// marks' row is read `FOR SHARE`, so a concurrent [`ensure_marks`] either sees these vectors
/// or runs first and is then seen here. Call it before anything else in the transaction locks
/// message rows (the order [`ensure_marks`] takes: the marks' row, then the messages).
pub async fn mark_embedded(
    tx: &mut sqlx::PgConnection,
    model: &str,
    ids: &[uuid::Uuid],
) -> Result<(), sqlx::Error> {
    let marked = sqlx::query_scalar!("SELECT model FROM switchboard.embedding_marks FOR SHARE")
        .fetch_optional(&mut *tx)
        .await?;
    if marked.as_deref() != Some(model) {
        return Ok(());
    }
    sqlx::query!(
        "UPDATE switchboard.message_marks SET embedded_model = $1
          WHERE message_id = ANY($2) AND embedded_model IS DISTINCT FROM $1",
        model,
        ids,
    )
    // Planned for each batch: a plan cached while the log was nearly empty reads it whole.
    .persistent(false)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// How far behind the index is.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct IndexLag {
    /// Age of the oldest message not embedded yet (0: none waits).
    pub seconds: f64,
    pub messages_waiting: i64,
}
