//! Erasure jobs (`switchboard.erasure_jobs`): one per erasure, written in the erasure's own
//! transaction and finished by the forget-sweep stage ([`crate::sweep`]). What an operator
//! polls (`GET /api/v1/erasures/<id>`, `switchboard forget`).
//!
//! The row names the person only by the SHA-256 of their id (as the tombstone does); what the
//! stage needs to find their stream messages (`pending`) is cleared once the job is done.
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};
use switchboard_kit::proto::StreamMark;
use uuid::Uuid;

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// The rows are erased (committed); the streams' copies are not swept yet.
    Erasing,
    /// Swept once; waiting for stages still at work on what they read before the erasure, then
    /// sweeping what they published late.
    Sweeping,
    /// Everything is erased and `person.forgotten` was published.
    Done,
    /// Some deletes kept failing (see the job's failures): running the erasure again retries.
    Failed,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Erasing => "erasing",
            JobStatus::Sweeping => "sweeping",
            JobStatus::Done => "done",
            JobStatus::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "erasing" => JobStatus::Erasing,
            "sweeping" => JobStatus::Sweeping,
            "done" => JobStatus::Done,
            // The table's CHECK allows nothing else.
            _ => JobStatus::Failed,
        }
    }

    /// Whether the job is over (done or failed).
    pub fn is_final(self) -> bool {
        matches!(self, JobStatus::Done | JobStatus::Failed)
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A delete that kept failing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Failure {
    /// What was not deleted: `stream_message`, `dead_letter`.
    pub what: String,
    /// Where: `<stream> #<sequence>`.
    #[serde(rename = "where")]
    pub place: String,
    pub error: String,
}

/// An erasure job, as it is polled.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ErasureJob {
    pub job_id: Uuid,
    pub status: JobStatus,
    /// Per kind (a table, `workspaces`, `stream_messages`, `dead_letters`, `arrival_keys`,
    /// `arrival_cursors`): how many were removed so far. Every kind is listed.
    pub removed: BTreeMap<String, i64>,
    /// Everything removed so far, all kinds together.
    pub total: i64,
    pub failures: Vec<Failure>,
    /// When the erasure committed.
    pub forgotten_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl ErasureJob {
    /// Where the job is polled over HTTP.
    pub fn status_url(&self) -> String {
        format!("/api/v1/erasures/{}", self.job_id)
    }
}

struct Row {
    id: Uuid,
    status: String,
    removed: serde_json::Value,
    failures: serde_json::Value,
    forgotten_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

impl From<Row> for ErasureJob {
    fn from(r: Row) -> Self {
        let removed: BTreeMap<String, i64> = serde_json::from_value(r.removed).unwrap_or_default();
        ErasureJob {
            job_id: r.id,
            status: JobStatus::parse(&r.status),
            total: removed.values().sum(),
            removed,
            failures: serde_json::from_value(r.failures).unwrap_or_default(),
            forgotten_at: r.forgotten_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
            finished_at: r.finished_at,
        }
    }
}

/// The job `id`, if there is one.
pub async fn load<'e>(db: impl PgExecutor<'e>, id: Uuid) -> sqlx::Result<Option<ErasureJob>> {
    let row = sqlx::query_as!(
        Row,
        "SELECT id, status, removed, failures, forgotten_at, created_at, updated_at, finished_at
           FROM switchboard.erasure_jobs WHERE id = $1",
        id,
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(ErasureJob::from))
}

/// The newest job of `person_id`, if they were ever erased.
pub async fn latest_of<'e>(
    db: impl PgExecutor<'e>,
    person_id: &str,
) -> sqlx::Result<Option<ErasureJob>> {
    let row = sqlx::query_as!(
        Row,
        "SELECT id, status, removed, failures, forgotten_at, created_at, updated_at, finished_at
           FROM switchboard.erasure_jobs
          WHERE person_sha256 = sha256(convert_to($1, 'UTF8'))
          ORDER BY created_at DESC LIMIT 1",
        person_id,
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(ErasureJob::from))
}

// The advisory lock key of a job, held by the transaction that creates it (its work message is
// published before that commits): `hashtextextended('sb-erasure-job:' || id, 0)`.

/// Take job `id`'s lock for the rest of the transaction that creates it.
pub(crate) async fn lock<'e>(db: impl PgExecutor<'e>, id: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('sb-erasure-job:' || $1::text, 0))",
        id.to_string(),
    )
    .execute(db)
    .await?;
    Ok(())
}

/// A new job, in the erasure's transaction: status `erasing`.
pub(crate) async fn insert<'e>(
    db: impl PgExecutor<'e>,
    id: Uuid,
    person_id: &str,
    removed: &BTreeMap<String, i64>,
    pending: &[u8],
    requested_by: &str,
    forgotten_at: DateTime<Utc>,
) -> sqlx::Result<ErasureJob> {
    let row = sqlx::query_as!(
        Row,
        "INSERT INTO switchboard.erasure_jobs
            (id, person_sha256, status, removed, pending, requested_by, forgotten_at)
         VALUES ($1, sha256(convert_to($2, 'UTF8')), 'erasing', $3, $4, $5, $6)
         RETURNING id, status, removed, failures, forgotten_at, created_at, updated_at,
                   finished_at",
        id,
        person_id,
        serde_json::to_value(removed).unwrap_or_default(),
        pending,
        requested_by,
        forgotten_at,
    )
    .fetch_one(db)
    .await?;
    Ok(row.into())
}

/// A failed job made to run again (its stream sweep from the start): status `erasing`, no
/// failures. The caller queues its work message. None when the job is not `failed`.
pub(crate) async fn retry(db: &PgPool, id: Uuid) -> sqlx::Result<Option<ErasureJob>> {
    let row = sqlx::query_as!(
        Row,
        "UPDATE switchboard.erasure_jobs
            SET status = 'erasing', failures = '[]', marks = NULL, finished_at = NULL,
                updated_at = now()
          WHERE id = $1 AND status = 'failed' AND pending IS NOT NULL
         RETURNING id, status, removed, failures, forgotten_at, created_at, updated_at,
                   finished_at",
        id,
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(ErasureJob::from))
}

/// What the stage works from.
pub(crate) struct Work {
    pub status: JobStatus,
    pub removed: BTreeMap<String, i64>,
    pub failures: Vec<Failure>,
    /// The first sweep's marks, once it is done.
    pub marks: Option<Vec<StreamMark>>,
    /// The encoded `ForgetSweep` naming the person (None once done).
    pub pending: Option<Vec<u8>>,
}

/// Job `id` as the stage reads it, once the transaction that created it is over (it holds the
/// job's lock until then): None when that transaction rolled back (or there never was one).
pub(crate) async fn work(db: &PgPool, id: Uuid) -> sqlx::Result<Option<Work>> {
    let mut tx = db.begin().await?;
    sqlx::query!(
        "SELECT pg_advisory_xact_lock_shared(hashtextextended('sb-erasure-job:' || $1::text, 0))",
        id.to_string(),
    )
    .execute(&mut *tx)
    .await?;
    let row = sqlx::query!(
        "SELECT status, removed, failures, marks, pending FROM switchboard.erasure_jobs
          WHERE id = $1",
        id,
    )
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(row.map(|r| Work {
        status: JobStatus::parse(&r.status),
        removed: serde_json::from_value(r.removed).unwrap_or_default(),
        failures: serde_json::from_value(r.failures).unwrap_or_default(),
        marks: r.marks.map(marks_from_json),
        pending: r.pending,
    }))
}

/// The first sweep is done: status `sweeping`, with its marks, counts and failures.
pub(crate) async fn swept_once(
    db: &PgPool,
    id: Uuid,
    marks: &[StreamMark],
    removed: &BTreeMap<String, i64>,
    failures: &[Failure],
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE switchboard.erasure_jobs
            SET status = 'sweeping', marks = $2, removed = $3, failures = $4, updated_at = now()
          WHERE id = $1",
        id,
        marks_to_json(marks),
        serde_json::to_value(removed).unwrap_or_default(),
        serde_json::to_value(failures).unwrap_or_default(),
    )
    .execute(db)
    .await?;
    Ok(())
}

/// The job is over: `done` (what names the person is dropped from the row) or `failed` (kept,
/// for a retry). The tombstone gets the final counts.
pub(crate) async fn finish(
    db: &PgPool,
    id: Uuid,
    removed: &BTreeMap<String, i64>,
    failures: &[Failure],
) -> sqlx::Result<JobStatus> {
    let status = if failures.is_empty() {
        JobStatus::Done
    } else {
        JobStatus::Failed
    };
    let removed = serde_json::to_value(removed).unwrap_or_default();
    let mut tx = db.begin().await?;
    sqlx::query!(
        "UPDATE switchboard.erasure_jobs
            SET status = $2, removed = $3, failures = $4, updated_at = now(),
                finished_at = now(),
                pending = CASE WHEN $2 = 'done' THEN NULL ELSE pending END
          WHERE id = $1",
        id,
        status.as_str(),
        removed,
        serde_json::to_value(failures).unwrap_or_default(),
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE switchboard.forgotten_people f SET removed = $2
           FROM switchboard.erasure_jobs j
          WHERE j.id = $1 AND f.person_sha256 = j.person_sha256",
        id,
        removed,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(status)
}

fn marks_to_json(marks: &[StreamMark]) -> serde_json::Value {
    marks
        .iter()
        .map(|m| {
            serde_json::json!({
                "stream": m.stream,
                "last_sequence": m.last_sequence,
                "left_from": m.left_from,
            })
        })
        .collect()
}

fn marks_from_json(v: serde_json::Value) -> Vec<StreamMark> {
    v.as_array()
        .map(|marks| {
            marks
                .iter()
                .map(|m| StreamMark {
                    stream: m["stream"].as_str().unwrap_or_default().to_string(),
                    last_sequence: m["last_sequence"].as_u64().unwrap_or(0),
                    left_from: m["left_from"].as_u64().unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_survive_the_row() {
        let marks = vec![StreamMark {
            stream: "SB_WORK".into(),
            last_sequence: 41,
            left_from: 7,
        }];
        assert_eq!(marks_from_json(marks_to_json(&marks)), marks);
    }
}
