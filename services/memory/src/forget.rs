//! Forgetting a person completely (`switchboard forget`, `DELETE /api/v1/people/<id>`).
//!
//! [`forget`] erases, in one database transaction that holds the person's erasure lock
//! ([`switchboard_kit::forgotten`]), every row that names them or one of their sessions:
//!
//! | kind (key of `removed`) | table | found by |
//! |---|---|---|
//! | `exchange_categories` | `exchange_categories` | person, their sessions, their messages |
//! | `message_vectors` | `message_vectors` | person, their messages |
//! | `api_requests` | `api_requests` | the correlation ids of their messages |
//! | `mailbox` | `mailbox` | their sessions, their replies, their addresses |
//! | `deliveries` | `deliveries` | their sessions, their replies |
//! | `link_proof_answers` | `link_proof_answers` | their messages, their claims |
//! | `link_claims` | `link_claims` | claimant, their messages |
//! | `messages` | `messages` | person, their sessions |
//! | `summaries`, `memories` | `summaries`, `memories` | person, their sessions' memory keys |
//! | `session_events`, `turns`, `sessions` | the session tables | their sessions |
//! | `chat_uploads` | `chat_uploads` | owner: the person or one of their addresses |
//! | `arrival_cursors` | `arrival_cursors` | sender: one of their addresses |
//! | `identity_links`, `identity_link_audit` | the link tables | either end is the person |
//! | `contact_points`, `people` | the directory | the person |
//! | `api_keys` | `api_keys` | owner: the person or one of their addresses |
//!
//! Their addresses are their contact points and the senders their inbound messages came from.
//! Tables that hold nothing personal: `schedule_fires` (a schedule, a time, a count of people),
//! `dispatchers` (dispatch processes), `_sqlx_migrations`; `forgotten_people` names the person
//! by a SHA-256 of their id only. Then, still inside the transaction (a failure rolls it back and
//! the erasure can simply be run again), the workspace folder of each of their sessions
//! (`sessions.workspace_path`, which holds the attachments their uploads were copied to).
//!
//! After the commit, the stored messages of the work, events and dead-letter streams that name
//! them ([`crate::forget_streams`]) and their senders' arrival counters are deleted, the
//! tombstone gets the final counts, and the last step is queued ([`crate::forget_sweep`]): it
//! sweeps what handlers already at work publish late, then publishes `person.forgotten`.
//!
//! Not reached: a runner's own run folders (`state_dir/runs/`, on the runner's host, which this
//! process may not see), and sessions a shared scope (`session.scope` other than `person`)
//! gives to several people, which stay while others' messages are in them.
use std::collections::{BTreeMap, BTreeSet};

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, Transaction};
use switchboard_kit::Topology;
use switchboard_kit::forgotten;
use uuid::Uuid;

use crate::forget_streams::{self, Names};

#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    #[error("a person id is needed")]
    NoPerson,
    #[error("no person {0:?} is known: nothing names them")]
    Unknown(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("removing the workspace {path}: {source}")]
    Workspace {
        path: String,
        source: std::io::Error,
    },
    /// The rows are erased (the tombstone stops late writes); the streams were not swept
    /// completely. Running the erasure again finishes it.
    #[error("the person's rows are erased, but the streams were not swept: {0}")]
    Streams(String),
}

/// What an erasure removed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Forgotten {
    pub person_id: String,
    pub forgotten_at: DateTime<Utc>,
    /// Per kind (a table, `workspaces`, `stream_messages`, `dead_letters`, `arrival_keys`):
    /// how many were removed. Every kind is listed, with 0 when there was none.
    pub removed: BTreeMap<String, i64>,
}

impl Forgotten {
    /// Everything removed, all kinds together.
    pub fn total(&self) -> i64 {
        self.removed.values().sum()
    }
}

/// Erase `person_id` everywhere (see the module doc); the last step announces it. A person
/// nothing names is [`ForgetError::Unknown`], and nothing is written.
pub async fn forget(
    db: &PgPool,
    js: &jetstream::Context,
    topology: &Topology,
    person_id: &str,
) -> Result<Forgotten, ForgetError> {
    if person_id.trim().is_empty() {
        return Err(ForgetError::NoPerson);
    }
    let mut tx = db.begin().await?;
    forgotten::lock_exclusive(&mut *tx, person_id).await?;
    // Taken after the lock: anything received before it is theirs to erase or drop.
    let forgotten_at: DateTime<Utc> = sqlx::query_scalar!(r#"SELECT clock_timestamp() AS "now!""#)
        .fetch_one(&mut *tx)
        .await?;
    let found = Found::load(&mut tx, person_id).await?;
    if !found.seen {
        tx.rollback().await?;
        return Err(ForgetError::Unknown(person_id.to_string()));
    }
    let mut removed = erase_rows(&mut tx, person_id, &found).await?;
    let senders = removed_senders(&mut tx, &found).await?;
    removed.insert("arrival_cursors".into(), senders.len() as i64);
    removed.insert(
        "workspaces".into(),
        remove_workspaces(&found.workspaces).await?,
    );
    sqlx::query!(
        "INSERT INTO switchboard.forgotten_people (person_sha256, forgotten_at, removed)
         VALUES (sha256(convert_to($1, 'UTF8')), $2, $3)
         ON CONFLICT (person_sha256)
            DO UPDATE SET forgotten_at = EXCLUDED.forgotten_at, removed = EXCLUDED.removed",
        person_id,
        forgotten_at,
        serde_json::to_value(&removed).unwrap_or_default(),
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;

    let mut all_senders: BTreeSet<(String, String)> = found.senders.clone();
    all_senders.extend(senders);
    let names = Names {
        person_id: person_id.to_string(),
        sessions: found.sessions.iter().map(Uuid::to_string).collect(),
        messages: found.messages.iter().map(Uuid::to_string).collect(),
        senders: all_senders.clone(),
        before_ms: forgotten_at.timestamp_millis(),
    };
    // Handlers that read their data before the commit hold messages at or below the marks;
    // what they publish after this sweep, the last step sweeps once they are done.
    let streams = |e: forget_streams::SweepError| ForgetError::Streams(e.to_string());
    let (swept, marks) = forget_streams::sweep(js, topology, &names)
        .await
        .map_err(streams)?;
    removed.insert("stream_messages".into(), swept.stream_messages);
    removed.insert("dead_letters".into(), swept.dead_letters);
    let keys = forget_streams::purge_arrival_keys(js, topology, &all_senders)
        .await
        .map_err(streams)?;
    removed.insert("arrival_keys".into(), keys);
    sqlx::query!(
        "UPDATE switchboard.forgotten_people SET removed = $2
          WHERE person_sha256 = sha256(convert_to($1, 'UTF8'))",
        person_id,
        serde_json::to_value(&removed).unwrap_or_default(),
    )
    .execute(db)
    .await?;
    // The last step sweeps what came late, then announces `person.forgotten`: a reader told
    // of the erasure sees no event naming them after it.
    let job = names.to_sweep(marks, removed.clone().into_iter().collect());
    forget_streams::queue_last_sweep(js, topology, &job)
        .await
        .map_err(streams)?;
    metrics::counter!("sb_people_forgotten_total").increment(1);
    tracing::info!(
        total = removed.values().sum::<i64>(),
        "a person was forgotten"
    );
    Ok(Forgotten {
        person_id: person_id.to_string(),
        forgotten_at,
        removed,
    })
}

/// What names the person, read under the erasure lock.
struct Found {
    seen: bool,
    sessions: Vec<Uuid>,
    workspaces: BTreeSet<String>,
    messages: Vec<Uuid>,
    /// Their contact point addresses and the senders of their inbound messages.
    addresses: Vec<String>,
    /// (channel, sender) of their inbound messages.
    senders: BTreeSet<(String, String)>,
}

impl Found {
    async fn load(tx: &mut Transaction<'_, Postgres>, person: &str) -> sqlx::Result<Self> {
        let sessions = sqlx::query!(
            "SELECT id, workspace_path FROM switchboard.sessions WHERE person_id = $1",
            person,
        )
        .fetch_all(&mut **tx)
        .await?;
        let ids: Vec<Uuid> = sessions.iter().map(|s| s.id).collect();
        let messages = sqlx::query_scalar!(
            "SELECT id FROM switchboard.messages WHERE person_id = $1 OR session_id = ANY($2)",
            person,
            &ids,
        )
        .fetch_all(&mut **tx)
        .await?;
        let senders: Vec<(String, String)> = sqlx::query!(
            r#"SELECT DISTINCT channel, metadata->>'sender' AS "sender!" FROM switchboard.messages
                WHERE id = ANY($1) AND direction = 'inbound' AND metadata->>'sender' <> ''"#,
            &messages,
        )
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(|s| (s.channel, s.sender))
        .collect();
        let mut addresses = sqlx::query_scalar!(
            "SELECT address FROM switchboard.contact_points WHERE person_id = $1",
            person,
        )
        .fetch_all(&mut **tx)
        .await?;
        addresses.extend(senders.iter().map(|s| s.1.clone()));
        addresses.sort();
        addresses.dedup();
        let named_elsewhere = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM switchboard.people WHERE person_id = $1)
                 OR EXISTS (SELECT 1 FROM switchboard.identity_links
                             WHERE from_person_id = $1 OR to_person_id = $1)
                 OR EXISTS (SELECT 1 FROM switchboard.identity_link_audit
                             WHERE from_person_id = $1 OR to_person_id = $1)
                 OR EXISTS (SELECT 1 FROM switchboard.summaries WHERE person_id = $1)
                 OR EXISTS (SELECT 1 FROM switchboard.memories WHERE person_id = $1)
                 OR EXISTS (SELECT 1 FROM switchboard.message_vectors WHERE person_id = $1)
                 OR EXISTS (SELECT 1 FROM switchboard.link_claims WHERE claimant_id = $1)
                 AS "named!""#,
            person,
        )
        .fetch_one(&mut **tx)
        .await?;
        Ok(Self {
            seen: named_elsewhere
                || !sessions.is_empty()
                || !messages.is_empty()
                || !addresses.is_empty(),
            workspaces: sessions
                .iter()
                .filter_map(|s| s.workspace_path.clone())
                .collect(),
            sessions: ids,
            messages,
            addresses,
            senders: senders.into_iter().collect(),
        })
    }
}

/// Delete every row that names the person, in an order the foreign keys allow; how many rows
/// went, by table. Each statement binds what it needs of: the person, their session ids,
/// their message ids, their addresses.
async fn erase_rows(
    tx: &mut Transaction<'_, Postgres>,
    person: &str,
    found: &Found,
) -> sqlx::Result<BTreeMap<String, i64>> {
    let (sessions, messages, addresses) = (&found.sessions, &found.messages, &found.addresses);
    let mut removed = BTreeMap::new();
    macro_rules! erase {
        ($table:literal, $query:expr) => {
            let done = $query.execute(&mut **tx).await?;
            removed.insert($table.to_string(), done.rows_affected() as i64);
        };
    }
    erase!(
        "exchange_categories",
        sqlx::query!(
            "DELETE FROM switchboard.exchange_categories WHERE person_id = $1
                OR session_id = ANY($2) OR outbound_id = ANY($3) OR inbound_id = ANY($3)",
            person,
            sessions,
            messages,
        )
    );
    erase!(
        "message_vectors",
        sqlx::query!(
            "DELETE FROM switchboard.message_vectors WHERE person_id = $1 OR message_id = ANY($2)",
            person,
            messages,
        )
    );
    erase!(
        "api_requests",
        sqlx::query!(
            "DELETE FROM switchboard.api_requests WHERE correlation_id IN
                (SELECT correlation_id FROM switchboard.messages WHERE id = ANY($1))",
            messages,
        )
    );
    erase!(
        "mailbox",
        sqlx::query!(
            "DELETE FROM switchboard.mailbox
              WHERE session_id = ANY($1) OR reply_id = ANY($2) OR address = ANY($3)",
            sessions,
            messages,
            addresses,
        )
    );
    erase!(
        "deliveries",
        sqlx::query!(
            "DELETE FROM switchboard.deliveries WHERE session_id = ANY($1) OR reply_id = ANY($2)",
            sessions,
            messages,
        )
    );
    erase!(
        "link_proof_answers",
        sqlx::query!(
            "DELETE FROM switchboard.link_proof_answers WHERE message_id = ANY($2)
                OR claim_id IN (SELECT id FROM switchboard.link_claims
                                 WHERE claimant_id = $1 OR requested_by = ANY($2)
                                    OR id = ANY($2))",
            person,
            messages,
        )
    );
    erase!(
        "link_claims",
        sqlx::query!(
            "DELETE FROM switchboard.link_claims
              WHERE claimant_id = $1 OR requested_by = ANY($2) OR id = ANY($2)",
            person,
            messages,
        )
    );
    erase!(
        "messages",
        sqlx::query!(
            "DELETE FROM switchboard.messages WHERE id = ANY($1)",
            messages,
        )
    );
    erase!(
        "summaries",
        sqlx::query!(
            "DELETE FROM switchboard.summaries WHERE person_id = $1 OR memory_key IN
                (SELECT memory_key FROM switchboard.sessions WHERE id = ANY($2))",
            person,
            sessions,
        )
    );
    // Keyed by person, never by session scope: a person's memory is theirs alone.
    erase!(
        "memories",
        sqlx::query!(
            "DELETE FROM switchboard.memories WHERE person_id = $1",
            person,
        )
    );
    erase!(
        "session_events",
        sqlx::query!(
            "DELETE FROM switchboard.session_events WHERE session_id = ANY($1)",
            sessions,
        )
    );
    erase!(
        "turns",
        sqlx::query!(
            "DELETE FROM switchboard.turns WHERE session_id = ANY($1)",
            sessions,
        )
    );
    erase!(
        "sessions",
        sqlx::query!(
            "DELETE FROM switchboard.sessions WHERE id = ANY($1)",
            sessions,
        )
    );
    erase!(
        "chat_uploads",
        sqlx::query!(
            "DELETE FROM switchboard.chat_uploads WHERE owner = $1 OR owner = ANY($2)",
            person,
            addresses,
        )
    );
    erase!(
        "identity_links",
        sqlx::query!(
            "DELETE FROM switchboard.identity_links WHERE from_person_id = $1 OR to_person_id = $1",
            person,
        )
    );
    erase!(
        "identity_link_audit",
        sqlx::query!(
            "DELETE FROM switchboard.identity_link_audit
              WHERE from_person_id = $1 OR to_person_id = $1",
            person,
        )
    );
    erase!(
        "contact_points",
        sqlx::query!(
            "DELETE FROM switchboard.contact_points WHERE person_id = $1",
            person,
        )
    );
    erase!(
        "api_keys",
        sqlx::query!(
            "DELETE FROM switchboard.api_keys WHERE owner = $1 OR owner = ANY($2)",
            person,
            addresses,
        )
    );
    erase!(
        "people",
        sqlx::query!(
            "DELETE FROM switchboard.people WHERE person_id = $1",
            person,
        )
    );
    Ok(removed)
}

/// Delete the arrival cursors of their addresses; the (channel, sender) pairs they held, whose
/// counters in the arrivals bucket go too.
async fn removed_senders(
    tx: &mut Transaction<'_, Postgres>,
    found: &Found,
) -> sqlx::Result<BTreeSet<(String, String)>> {
    let rows = sqlx::query!(
        "DELETE FROM switchboard.arrival_cursors WHERE sender = ANY($1) RETURNING channel, sender",
        &found.addresses,
    )
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows.into_iter().map(|r| (r.channel, r.sender)).collect())
}

/// Remove each workspace folder; how many there were.
async fn remove_workspaces(paths: &BTreeSet<String>) -> Result<i64, ForgetError> {
    let mut removed = 0;
    for path in paths {
        match tokio::fs::remove_dir_all(path).await {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ForgetError::Workspace {
                    path: path.clone(),
                    source,
                });
            }
        }
    }
    Ok(removed)
}
