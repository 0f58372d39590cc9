//! Forgotten people: the tombstones the erasure (`switchboard_forget`) leaves in
//! `switchboard.forgotten_people`, read by every stage that writes a person's data, so work of
//! theirs still in flight when they were forgotten does not bring them back.
//!
//! A message *received* before the erasure is dropped wherever it would be written (the message
//! log, the session stage, dispatch, deliver), and the drop is counted
//! (`sb_forgotten_dropped_total{stage}`), never silent. A message received after it starts a
//! new conversation like anyone's first. The tombstone names the person by a SHA-256 of their
//! id, so no table names them once they are forgotten.
//!
//! Writers take [`lock_shared`] in the transaction that writes and check [`received_before`]
//! in it; the erasure takes the same lock exclusively, so a write either lands before the
//! erasure (and is erased with the rest) or sees the tombstone.
use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};

use crate::coalesce::Coalescer;
use uuid::Uuid;

// The advisory lock key of a person's erasure, in every statement below that takes it:
// `hashtextextended('sb-forget:' || person_id, 0)`.

/// Take the person's erasure lock shared, for the rest of the transaction: an erasure of them
/// waits for this transaction, or this one for the erasure.
pub async fn lock_shared<'e>(db: impl PgExecutor<'e>, person_id: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock_shared(hashtextextended('sb-forget:' || $1, 0))",
        person_id,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// [`lock_shared`] for several people at once (one round trip; `people` sorted and distinct).
pub async fn lock_shared_all<'e>(db: impl PgExecutor<'e>, people: &[String]) -> sqlx::Result<()> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock_shared(hashtextextended('sb-forget:' || p, 0))
           FROM unnest($1::text[]) AS p",
        people,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Take the person's erasure lock exclusively (the erasure itself), for the transaction.
pub async fn lock_exclusive<'e>(db: impl PgExecutor<'e>, person_id: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('sb-forget:' || $1, 0))",
        person_id,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Whether `person_id` was forgotten after `received`: their message then belongs to the
/// erased past and must not be written.
pub async fn received_before<'e>(
    db: impl PgExecutor<'e>,
    person_id: &str,
    received: DateTime<Utc>,
) -> sqlx::Result<bool> {
    if person_id.is_empty() {
        return Ok(false);
    }
    // Whether the person was forgotten after `received`.
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM switchboard.forgotten_people f
                           WHERE f.person_sha256 = sha256(convert_to($1, 'UTF8'))
                             AND f.forgotten_at > $2) AS "forgotten!""#,
        person_id,
        received,
    )
    .fetch_one(db)
    .await
}

/// Which of `people` (each with when their message was received) were forgotten after it: one
/// round trip for a batch (the embed worker checks its batch before it announces anything).
pub async fn forgotten_among<'e>(
    db: impl PgExecutor<'e>,
    people: &[(String, DateTime<Utc>)],
) -> sqlx::Result<std::collections::HashSet<String>> {
    if people.is_empty() {
        return Ok(Default::default());
    }
    let (ids, times): (Vec<String>, Vec<DateTime<Utc>>) = people.iter().cloned().unzip();
    let forgotten = sqlx::query_scalar!(
        r#"SELECT p.person_id AS "person_id!"
             FROM unnest($1::text[], $2::timestamptz[]) AS p(person_id, received)
            WHERE EXISTS (SELECT 1 FROM switchboard.forgotten_people f
                           WHERE f.person_sha256 = sha256(convert_to(p.person_id, 'UTF8'))
                             AND f.forgotten_at > p.received)"#,
        &ids,
        &times,
    )
    .fetch_all(db)
    .await?;
    Ok(forgotten.into_iter().collect())
}

/// [`received_before`] for many concurrent tasks (each of dispatch's turns asks twice): the
/// questions asked while one round trip is in flight are answered by the next, together.
pub struct ForgottenCheck {
    group: Coalescer<(String, DateTime<Utc>), sqlx::Result<bool>>,
}

impl ForgottenCheck {
    pub fn new(db: PgPool) -> Self {
        let group = Coalescer::new(256, 2, move |asked: Vec<(String, DateTime<Utc>)>| {
            let db = db.clone();
            async move {
                let together = forgotten_rows(&db, &asked)
                    .await
                    .map(|rows| (0..asked.len()).map(|i| rows.contains(&i)).collect());
                crate::db::answer_group(&asked, together, |i| {
                    received_before(&db, &asked[i].0, asked[i].1)
                })
                .await
            }
        });
        Self { group }
    }

    /// Whether `person_id` was forgotten after `received` ([`received_before`]).
    pub async fn received_before(
        &self,
        person_id: &str,
        received: DateTime<Utc>,
    ) -> sqlx::Result<bool> {
        if person_id.is_empty() {
            return Ok(false);
        }
        self.group
            .call((person_id.to_string(), received))
            .await
            .map_err(|_| sqlx::Error::WorkerCrashed)?
    }
}

/// Which of `asked` (by index) name a person forgotten after the time beside them.
async fn forgotten_rows(
    db: &PgPool,
    asked: &[(String, DateTime<Utc>)],
) -> sqlx::Result<std::collections::HashSet<usize>> {
    let (ids, times): (Vec<&str>, Vec<DateTime<Utc>>) =
        asked.iter().map(|(p, t)| (p.as_str(), *t)).unzip();
    let rows: Vec<i64> = sqlx::query_scalar(
        "SELECT p.n - 1
           FROM unnest($1::text[], $2::timestamptz[]) WITH ORDINALITY AS p(person_id, received, n)
          WHERE EXISTS (SELECT 1 FROM switchboard.forgotten_people f
                         WHERE f.person_sha256 = sha256(convert_to(p.person_id, 'UTF8'))
                           AND f.forgotten_at > p.received)",
    )
    .bind(&ids)
    .bind(&times)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|n| n as usize).collect())
}

/// When a message was received, from its `received_at_ms` (0: unknown, taken as now, as the
/// session stage does).
pub fn received_at(received_at_ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(received_at_ms)
        .filter(|_| received_at_ms > 0)
        .unwrap_or_else(Utc::now)
}

/// When a message id (UUIDv7, assigned at ingestion) was made; now when it is not a UUIDv7.
pub fn id_time(id: &str) -> DateTime<Utc> {
    let ms = id
        .parse::<Uuid>()
        .ok()
        .and_then(|u| u.get_timestamp())
        .map(|t| {
            let (s, n) = t.to_unix();
            (s as i64) * 1000 + (n / 1_000_000) as i64
        })
        .unwrap_or(0);
    received_at(ms)
}

/// Count work of a forgotten person dropped by `stage`, and say so in the log.
pub fn dropped(stage: &'static str, what: &str) {
    metrics::counter!("sb_forgotten_dropped_total", "stage" => stage).increment(1);
    tracing::info!(
        stage,
        what,
        "dropped work of a person forgotten after it was received"
    );
}
