//! What the summary worker reads and writes: the summary row of a memory key, the messages it
//! does not cover yet (every engine variant's and channel's, in id order), and the
//! compare-and-set write with its journal entries.
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use switchboard_kit::status::SessionEventKind;
use uuid::Uuid;

/// The summary of a memory key as it was read (version 0 and empty when there is none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Current {
    /// Whether a row exists (a version-0 row may: written before summaries had versions).
    pub exists: bool,
    pub text: String,
    /// `model` or `extractive`.
    pub method: String,
    pub version: i64,
    pub first_message: Option<Uuid>,
    pub last_message: Option<Uuid>,
    pub messages_covered: i64,
}

/// A message not covered by the summary yet.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Message {
    pub id: Uuid,
    pub direction: String,
    pub channel: String,
    pub agent_name: String,
    pub message: String,
    pub created_at: DateTime<Utc>,
}

/// A new summary to write over `read`.
#[derive(Debug, Clone)]
pub struct NewSummary<'a> {
    pub memory_key: &'a str,
    pub person_id: &'a str,
    pub agent_identity: &'a str,
    pub text: &'a str,
    pub method: &'a str,
    pub first_message: Uuid,
    pub last_message: Uuid,
    pub merged: i64,
}

/// What a write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// This write made `version`, covering `covered` messages in all.
    Version {
        version: i64,
        first: Uuid,
        covered: i64,
    },
    /// Another replica wrote first (the version moved on): nothing was written.
    LostRace,
}

/// summary, method, version, first and last message, messages covered.
type SummaryRow = (String, String, i64, Option<Uuid>, Option<Uuid>, i64);

pub async fn current(db: &PgPool, memory_key: &str) -> Result<Current, sqlx::Error> {
    let row: Option<SummaryRow> = sqlx::query_as(
        "SELECT summary, method, version, first_message_in_summary, last_message_in_summary,
                messages_covered
           FROM switchboard.summaries WHERE memory_key = $1",
    )
    .bind(memory_key)
    .fetch_optional(db)
    .await?;
    Ok(row
        .map(
            |(text, method, version, first_message, last_message, messages_covered)| Current {
                exists: true,
                text,
                method,
                version,
                first_message,
                last_message,
                messages_covered,
            },
        )
        .unwrap_or_default())
}

/// The messages of `memory_key` after `after` (all when `None`), oldest first, at most `limit`.
pub async fn unsummarised(
    db: &PgPool,
    memory_key: &str,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<Message>, sqlx::Error> {
    sqlx::query_as(
        "SELECT m.id, m.direction, m.channel, m.agent_name, m.message, m.created_at
           FROM switchboard.messages m
           JOIN switchboard.sessions s ON s.id = m.session_id
          WHERE s.memory_key = $1 AND ($2::uuid IS NULL OR m.id > $2)
            AND NOT (coalesce(m.metadata->>'kind', '') = ANY($4::text[]))
          ORDER BY m.id
          LIMIT $3",
    )
    .bind(memory_key)
    .bind(after)
    .bind(limit)
    .bind(switchboard_memory::NOT_CONVERSATION)
    .fetch_all(db)
    .await
}

/// Write `new` over what was read, if nobody else did since (compare-and-set on the version),
/// with one journal entry in each session of the memory key, in one transaction.
pub async fn write(
    db: &PgPool,
    read: &Current,
    new: &NewSummary<'_>,
) -> Result<Written, sqlx::Error> {
    let mut tx = db.begin().await?;
    let written: Option<(i64, Uuid, i64)> = if read.exists {
        sqlx::query_as(
            "UPDATE switchboard.summaries
                SET summary = $2, version = version + 1,
                    first_message_in_summary = coalesce(first_message_in_summary, $3),
                    last_message_in_summary = $4, messages_covered = messages_covered + $5,
                    method = $6, updated_at = now()
              WHERE memory_key = $1 AND version = $7
          RETURNING version, first_message_in_summary, messages_covered",
        )
        .bind(new.memory_key)
        .bind(new.text)
        .bind(new.first_message)
        .bind(new.last_message)
        .bind(new.merged)
        .bind(new.method)
        .bind(read.version)
        .fetch_optional(&mut *tx)
        .await?
    } else {
        sqlx::query_as(
            "INSERT INTO switchboard.summaries
                (memory_key, agent_identity, person_id, summary, version, first_message_in_summary,
                 last_message_in_summary, messages_covered, method, updated_at, created_at)
             VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $8, now(), now())
             ON CONFLICT (memory_key) DO NOTHING
          RETURNING version, first_message_in_summary, messages_covered",
        )
        .bind(new.memory_key)
        .bind(new.agent_identity)
        .bind(new.person_id)
        .bind(new.text)
        .bind(new.first_message)
        .bind(new.last_message)
        .bind(new.merged)
        .bind(new.method)
        .fetch_optional(&mut *tx)
        .await?
    };
    let Some((version, first, covered)) = written else {
        tx.rollback().await?;
        return Ok(Written::LostRace);
    };
    let sessions: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM switchboard.sessions WHERE memory_key = $1")
            .bind(new.memory_key)
            .fetch_all(&mut *tx)
            .await?;
    let ids: Vec<Uuid> = sessions.iter().map(|_| Uuid::now_v7()).collect();
    let detail = serde_json::json!({
        "version": version,
        "method": new.method,
        "messages_merged": new.merged,
        "messages_covered": covered,
        "first_message_id": first,
        "last_message_id": new.last_message,
    });
    // One entry per session and version: the key makes a repeated write impossible anyway.
    sqlx::query(
        "INSERT INTO switchboard.session_events (id, session_id, key, kind, detail)
         SELECT e.id, e.session_id, 'summarised:' || e.session_id || ':' || $3, $4, $5
           FROM unnest($1::uuid[], $2::uuid[]) AS e(id, session_id)
         ON CONFLICT (key) DO NOTHING",
    )
    .bind(&ids)
    .bind(&sessions)
    .bind(version)
    .bind(SessionEventKind::Summarised)
    .bind(detail)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Written::Version {
        version,
        first,
        covered,
    })
}

/// A memory key whose conversation went quiet with messages its summary does not cover.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Quiet {
    pub memory_key: String,
    pub person_id: String,
    pub agent_identity: String,
    /// Its newest message (not covered: the due item's dedupe id is made from it).
    pub newest: Uuid,
}

/// Memory keys whose newest message is older than `idle_gap_s` and newer than their summary,
/// at most `limit` of them, the longest quiet first.
pub async fn quiet(db: &PgPool, idle_gap_s: u64, limit: i64) -> Result<Vec<Quiet>, sqlx::Error> {
    sqlx::query_as(
        "WITH keys AS (
             SELECT memory_key, min(person_id) AS person_id,
                    min(agent_identity) AS agent_identity, array_agg(id) AS sessions
               FROM switchboard.sessions GROUP BY memory_key)
         SELECT k.memory_key, k.person_id, k.agent_identity, n.id AS newest
           FROM keys k
           LEFT JOIN switchboard.summaries y ON y.memory_key = k.memory_key
           CROSS JOIN LATERAL (
                SELECT m.id, m.created_at FROM switchboard.messages m
                 WHERE m.session_id = ANY (k.sessions)
                   AND NOT (coalesce(m.metadata->>'kind', '') = ANY($3::text[]))
                 ORDER BY m.id DESC LIMIT 1) n
          WHERE (y.last_message_in_summary IS NULL OR n.id > y.last_message_in_summary)
            AND n.created_at < now() - $1 * interval '1 second'
          ORDER BY n.created_at
          LIMIT $2",
    )
    .bind(idle_gap_s as f64)
    .bind(limit)
    .bind(switchboard_memory::NOT_CONVERSATION)
    .fetch_all(db)
    .await
}
