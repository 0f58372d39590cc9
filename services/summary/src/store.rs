//! What the summary worker reads and writes: the summary row of a memory key, the messages it
//! has not merged yet (every engine variant's and channel's, in id order: those whose
//! `message_marks.summary_version` is NULL), and the compare-and-set write that marks the messages it
//! merged, with its journal entries.
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
#[derive(Debug, Clone)]
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
    /// Exactly the messages this version merges (it marks them with its version).
    pub merged: &'a [Uuid],
}

/// What a write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// This write made `version`, covering `covered` messages in all, from `first` to `last`
    /// (the least and greatest message id any version merged).
    Version {
        version: i64,
        first: Uuid,
        last: Uuid,
        covered: i64,
    },
    /// Another replica wrote first (the version moved on): nothing was written.
    LostRace,
}

pub async fn current(db: &PgPool, memory_key: &str) -> Result<Current, sqlx::Error> {
    let row = sqlx::query!(
        "SELECT summary, method, version, first_message_in_summary, last_message_in_summary,
                messages_covered
           FROM switchboard.summaries WHERE memory_key = $1",
        memory_key,
    )
    .fetch_optional(db)
    .await?;
    Ok(row
        .map(|r| Current {
            exists: true,
            text: r.summary,
            method: r.method,
            version: r.version,
            first_message: r.first_message_in_summary,
            last_message: r.last_message_in_summary,
            messages_covered: r.messages_covered,
        })
        .unwrap_or_default())
}

/// The conversation messages of `memory_key` no version has merged yet, oldest id first, at
/// most `limit`: also those logged after a newer message was summarised (their ids are minted
/// at the gateway, long before a lagging log writes them).
pub async fn unsummarised(
    db: &PgPool,
    memory_key: &str,
    limit: i64,
) -> Result<Vec<Message>, sqlx::Error> {
    sqlx::query_as!(
        Message,
        "SELECT m.id, m.direction, m.channel, m.agent_name, m.message, m.created_at
           FROM switchboard.message_marks k
           JOIN switchboard.sessions s ON s.id = k.session_id
           JOIN switchboard.messages m ON m.id = k.message_id
          WHERE s.memory_key = $1 AND k.summary_version IS NULL AND k.conversation
          ORDER BY k.message_id
          LIMIT $2",
        memory_key,
        limit,
    )
    .fetch_all(db)
    .await
}

/// Write `new` over what was read, if nobody else did since (compare-and-set on the version),
/// mark the messages it merged with its version, and add one journal entry in each session of
/// the memory key, in one transaction.
pub async fn write(
    db: &PgPool,
    read: &Current,
    new: &NewSummary<'_>,
) -> Result<Written, sqlx::Error> {
    let (Some(&first_merged), Some(&last_merged)) =
        (new.merged.iter().min(), new.merged.iter().max())
    else {
        return Ok(Written::LostRace);
    };
    let merged = new.merged.len() as i64;
    let mut tx = db.begin().await?;
    // Least and greatest: a message logged late may be older than what was merged before.
    let written: Option<(i64, Uuid, Uuid, i64)> = if read.exists {
        sqlx::query!(
            r#"UPDATE switchboard.summaries
                SET summary = $2, version = version + 1,
                    first_message_in_summary = least(first_message_in_summary, $3),
                    last_message_in_summary = greatest(last_message_in_summary, $4),
                    messages_covered = messages_covered + $5,
                    method = $6, updated_at = now()
              WHERE memory_key = $1 AND version = $7
          RETURNING version, first_message_in_summary AS "first!",
                    last_message_in_summary AS "last!", messages_covered"#,
            new.memory_key,
            new.text,
            first_merged,
            last_merged,
            merged,
            new.method,
            read.version,
        )
        .fetch_optional(&mut *tx)
        .await?
        .map(|w| (w.version, w.first, w.last, w.messages_covered))
    } else {
        sqlx::query!(
            r#"INSERT INTO switchboard.summaries
                (memory_key, agent_identity, person_id, summary, version, first_message_in_summary,
                 last_message_in_summary, messages_covered, method, updated_at, created_at)
             VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $8, now(), now())
             ON CONFLICT (memory_key) DO NOTHING
          RETURNING version, first_message_in_summary AS "first!",
                    last_message_in_summary AS "last!", messages_covered"#,
            new.memory_key,
            new.agent_identity,
            new.person_id,
            new.text,
            first_merged,
            last_merged,
            merged,
            new.method,
        )
        .fetch_optional(&mut *tx)
        .await?
        .map(|w| (w.version, w.first, w.last, w.messages_covered))
    };
    let Some((version, first, last, covered)) = written else {
        tx.rollback().await?;
        return Ok(Written::LostRace);
    };
    // Exactly the merged messages carry this version (the compare-and-set above makes this
    // the only writer of the key's marks until commit).
    sqlx::query!(
        "UPDATE switchboard.message_marks SET summary_version = $2
          WHERE message_id = ANY($1::uuid[]) AND summary_version IS NULL",
        new.merged,
        version,
    )
    .execute(&mut *tx)
    .await?;
    // What is not conversation is never merged: marked too, up to this version's last
    // message, so that the unsummarised index does not keep it for ever.
    sqlx::query!(
        "UPDATE switchboard.message_marks k SET summary_version = $2
           FROM switchboard.sessions s
          WHERE s.id = k.session_id AND s.memory_key = $1 AND k.summary_version IS NULL
            AND k.message_id <= $3 AND NOT k.conversation",
        new.memory_key,
        version,
        last_merged,
    )
    .execute(&mut *tx)
    .await?;
    let sessions = sqlx::query_scalar!(
        "SELECT id FROM switchboard.sessions WHERE memory_key = $1",
        new.memory_key,
    )
    .fetch_all(&mut *tx)
    .await?;
    let ids: Vec<Uuid> = sessions.iter().map(|_| Uuid::now_v7()).collect();
    let detail = serde_json::json!({
        "version": version,
        "method": new.method,
        "messages_merged": merged,
        "messages_covered": covered,
        "first_message_id": first,
        "last_message_id": last,
        // This version's own messages (a late-logged one may be older than earlier versions').
        "first_merged_id": first_merged,
        "last_merged_id": last_merged,
    });
    // One entry per session and version: the key makes a repeated write impossible anyway.
    sqlx::query!(
        "INSERT INTO switchboard.session_events (id, session_id, key, kind, detail)
         SELECT e.id, e.session_id, $4::text || ':' || e.session_id || ':' || $3::bigint, $4, $5
           FROM unnest($1::uuid[], $2::uuid[]) AS e(id, session_id)
         ON CONFLICT (key) DO NOTHING",
        &ids,
        &sessions,
        version,
        SessionEventKind::Summarised as SessionEventKind,
        detail,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Written::Version {
        version,
        first,
        last,
        covered,
    })
}

/// A memory key whose conversation went quiet with messages no summary version merged yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quiet {
    pub memory_key: String,
    pub person_id: String,
    pub agent_identity: String,
    /// Its newest unsummarised message, by id (the due item's dedupe id is made from it).
    pub newest: Uuid,
    /// The version of its summary (0 when none): in the dedupe id too, so that once a run has
    /// written a version, the next sweep's item is a new one.
    pub version: i64,
}

/// Memory keys with unsummarised conversation messages, the newest of them (by log time)
/// older than `idle_gap_s`, at most `limit` of them, the longest quiet first.
pub async fn quiet(db: &PgPool, idle_gap_s: u64, limit: i64) -> Result<Vec<Quiet>, sqlx::Error> {
    sqlx::query_as!(
        Quiet,
        r#"SELECT s.memory_key, min(s.person_id) AS "person_id!",
                min(s.agent_identity) AS "agent_identity!",
                (array_agg(k.message_id ORDER BY k.message_id DESC))[1] AS "newest!",
                coalesce(max(y.version), 0) AS "version!"
           FROM switchboard.message_marks k
           JOIN switchboard.sessions s ON s.id = k.session_id
           LEFT JOIN switchboard.summaries y ON y.memory_key = s.memory_key
          WHERE k.summary_version IS NULL AND k.conversation
          GROUP BY s.memory_key
         HAVING max(k.created_at) < now() - $1 * interval '1 second'
          ORDER BY max(k.created_at)
          LIMIT $2"#,
        idle_gap_s as f64,
        limit,
    )
    .fetch_all(db)
    .await
}
