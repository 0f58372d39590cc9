//! The erasure's transaction: every row that names the person, as one commit that also records
//! the job ([`crate::job`]) and has queued its stream half ([`crate::sweep`]).
//!
//! [`forget`] erases, in one database transaction that holds the erasure lock
//! ([`switchboard_kit::forgotten`]) of the person and of every id linked into them
//! ([`crate::scope`]), every row that names one of those ids or one of their sessions:
//!
//! | kind (key of `removed`) | table | found by |
//! |---|---|---|
//! | `exchange_categories` | `exchange_categories` | their ids, sessions, messages |
//! | `message_vectors` | `message_vectors` | their ids, messages |
//! | `handed_vectors` | `handed_vectors` (recall's vectors for the embedding worker) | their ids, messages |
//! | `api_requests` | `api_requests` | the correlation ids of their messages |
//! | `mailbox` | `mailbox` | their sessions, their replies, (channel, address) of theirs |
//! | `delivery_receipts` | `delivery_receipts` (what providers reported of their replies) | the provider ids of their replies' deliveries |
//! | `deliveries` | `deliveries` | their sessions, their replies |
//! | `link_proof_answers` | `link_proof_answers` | their messages, their claims |
//! | `link_claims` | `link_claims` | claimant, their messages |
//! | `messages` | `messages` | their ids, their sessions |
//! | `summaries`, `memories` | `summaries`, `memories` | their ids, their sessions' memory keys |
//! | `wakeups` | `wakeups` (the agent's notes to come back to them) | their ids, their sessions |
//! | `exports` | `exports` (files the agent left for them, `exports/`) | their ids, their sessions |
//! | `escalations` | `escalations` (exchanges of theirs that asked for a person) | their ids, their sessions |
//! | `takeovers` | `takeovers` (operators who stepped into their conversations) | their sessions |
//! | `session_events`, `turns`, `sessions` | the session tables | their sessions |
//! | `chat_uploads` | `chat_uploads` | owner: one of their chat logins |
//! | `arrival_cursors` | `arrival_cursors` | (channel, sender) of theirs |
//! | `identity_links`, `identity_link_audit` | the link tables | either end is one of their ids |
//! | `contact_points`, `people` | the directory | their ids |
//! | `api_keys` | `api_keys` | owner: one of their API key owner names |
//!
//! An address counts only on the channels of its kind ([`crate::scope`]): a chat login equal to
//! someone else's API key owner name erases neither the other's key nor their mailbox.
//! Tables that hold nothing personal: `schedule_fires` (a schedule, a time, a count of people),
//! `dispatchers` (dispatch processes), `_sqlx_migrations`; `forgotten_people` and
//! `erasure_jobs` name the person by a SHA-256 of their id only (the job keeps what finds
//! their stream messages until it is done). Still inside the transaction (a failure rolls it
//! back and the erasure can simply be run again), the workspace folder of each of their
//! sessions (`sessions.workspace_path`, which holds the attachments their uploads were copied
//! to) is removed, and the job's work message is published (deduplicated by the job's id), so
//! a committed erasure always has its stream half queued; the forget-sweep stage finishes it
//! (and drops the message of a transaction that rolled back).
//!
//! Not reached: a runner's own run folders (`state_dir/runs/`, on the runner's host, which this
//! process may not see), and sessions a shared scope (`session.scope` other than `person`)
//! gives to several people, which stay while others' messages are in them.
use std::collections::{BTreeMap, BTreeSet};

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use prost::Message as _;
use sqlx::{PgPool, Postgres, Transaction};
use switchboard_kit::Topology;
use switchboard_kit::config::ContactKind;
use switchboard_kit::forgotten;
use switchboard_kit::proto::{ForgetSender, ForgetSweep};
use uuid::Uuid;

use crate::job::{self, ErasureJob, JobStatus};
use crate::scope::{self, Found};
use crate::streams::{self, SweepError};

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
    /// The job's work message was not stored: nothing was committed.
    #[error("queueing the erasure's stream sweep: {0}")]
    Queue(#[from] SweepError),
}

/// The kinds of `removed` the forget-sweep stage fills in.
pub const STREAM_KINDS: &[&str] = &["stream_messages", "dead_letters", "arrival_keys"];

/// What [`forget`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Begun {
    pub person_id: String,
    /// True: this call erased them; false: they were erased before and this is that job (a
    /// failed one queued again).
    pub started: bool,
    #[serde(flatten)]
    pub job: ErasureJob,
}

/// Erase `person_id` (see the module doc) and queue the rest of the job: the erasure is
/// committed when this returns, its stream half under way. A person nothing names but whose
/// erasure ran before is that job (a failed one is queued again); one nothing names at all is
/// [`ForgetError::Unknown`], and nothing is written.
pub async fn forget(
    db: &PgPool,
    js: &jetstream::Context,
    topology: &Topology,
    person_id: &str,
    requested_by: &str,
) -> Result<Begun, ForgetError> {
    if person_id.trim().is_empty() {
        return Err(ForgetError::NoPerson);
    }
    let mut tx = db.begin().await?;
    forgotten::lock_exclusive(&mut *tx, person_id).await?;
    let linked = scope::linked_into(&mut tx, person_id).await?;
    for id in &linked {
        forgotten::lock_exclusive(&mut *tx, id).await?;
    }
    // Taken after the locks: anything received before is theirs to erase or drop.
    let forgotten_at: DateTime<Utc> = sqlx::query_scalar!(r#"SELECT clock_timestamp() AS "now!""#)
        .fetch_one(&mut *tx)
        .await?;
    let found = Found::load(&mut tx, person_id, linked).await?;
    if !found.seen {
        tx.rollback().await?;
        return earlier_job(db, js, topology, person_id).await;
    }
    let mut removed = erase_rows(&mut tx, &found).await?;
    let senders = removed_senders(&mut tx, &found).await?;
    removed.insert("arrival_cursors".into(), senders.len() as i64);
    removed.insert(
        "workspaces".into(),
        remove_workspaces(&found.workspaces).await?,
    );
    for kind in STREAM_KINDS {
        removed.insert(kind.to_string(), 0);
    }
    sqlx::query!(
        "INSERT INTO switchboard.forgotten_people (person_sha256, forgotten_at, removed)
         SELECT sha256(convert_to(p, 'UTF8')), $2, $3 FROM unnest($1::text[]) AS p
         ON CONFLICT (person_sha256)
            DO UPDATE SET forgotten_at = EXCLUDED.forgotten_at, removed = EXCLUDED.removed",
        &found.ids,
        forgotten_at,
        serde_json::to_value(&removed).unwrap_or_default(),
    )
    .execute(&mut *tx)
    .await?;

    let mut all_senders = found.senders.clone();
    all_senders.extend(senders);
    let pending = ForgetSweep {
        person_id: person_id.to_string(),
        linked_person_ids: found.linked.clone(),
        session_ids: found.sessions.iter().map(Uuid::to_string).collect(),
        message_ids: found.messages.iter().map(Uuid::to_string).collect(),
        senders: all_senders
            .iter()
            .map(|(channel, address)| ForgetSender {
                channel: channel.clone(),
                address: address.clone(),
            })
            .collect(),
        forgotten_at_ms: forgotten_at.timestamp_millis(),
        ..Default::default()
    };
    let id = Uuid::now_v7();
    // Held until the commit: the stage reads the job only once this transaction is over.
    job::lock(&mut *tx, id).await?;
    let job = job::insert(
        &mut *tx,
        id,
        person_id,
        &removed,
        &pending.encode_to_vec(),
        requested_by,
        forgotten_at,
    )
    .await?;
    // Stored before the commit: a process that dies after it leaves the stage its work.
    streams::queue_job(js, topology, id, &format!("forget-sweep/{id}")).await?;
    tx.commit().await?;
    metrics::counter!("sb_people_forgotten_total").increment(1);
    tracing::info!(job = %id, total = job.total, "a person's rows were erased; the streams are next");
    Ok(Begun {
        person_id: person_id.to_string(),
        started: true,
        job,
    })
}

/// A person nothing names: their earlier erasure's job, a failed one queued again.
async fn earlier_job(
    db: &PgPool,
    js: &jetstream::Context,
    topology: &Topology,
    person_id: &str,
) -> Result<Begun, ForgetError> {
    let Some(mut job) = job::latest_of(db, person_id).await? else {
        return Err(ForgetError::Unknown(person_id.to_string()));
    };
    if job.status == JobStatus::Failed
        && let Some(again) = job::retry(db, job.job_id).await?
    {
        let dedupe = format!(
            "forget-sweep/{}/{}",
            again.job_id,
            again.updated_at.timestamp_micros()
        );
        streams::queue_job(js, topology, again.job_id, &dedupe).await?;
        tracing::info!(job = %again.job_id, "a failed erasure was queued again");
        job = again;
    }
    Ok(Begun {
        person_id: person_id.to_string(),
        started: false,
        job,
    })
}

/// Delete every row that names the person, in an order the foreign keys allow; how many rows
/// went, by table. Each statement binds what it needs of: their ids, their session ids,
/// their message ids, their contact points.
async fn erase_rows(
    tx: &mut Transaction<'_, Postgres>,
    found: &Found,
) -> sqlx::Result<BTreeMap<String, i64>> {
    let (ids, sessions, messages) = (&found.ids, &found.sessions, &found.messages);
    let addresses = found.addresses();
    // The mailbox rows addressed to one of their (channel, address) pairs.
    let addressed: Vec<(String, String)> = sqlx::query!(
        "SELECT DISTINCT channel, address FROM switchboard.mailbox WHERE address = ANY($1)",
        &addresses,
    )
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|r| (r.channel, r.address))
    .collect();
    let (mailbox_channels, mailbox_addresses) = found.theirs_on_channels(addressed);
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
            "DELETE FROM switchboard.exchange_categories WHERE person_id = ANY($1)
                OR session_id = ANY($2) OR outbound_id = ANY($3) OR inbound_id = ANY($3)",
            ids,
            sessions,
            messages,
        )
    );
    erase!(
        "message_vectors",
        sqlx::query!(
            "DELETE FROM switchboard.message_vectors
              WHERE person_id = ANY($1) OR message_id = ANY($2)",
            ids,
            messages,
        )
    );
    erase!(
        "handed_vectors",
        sqlx::query!(
            "DELETE FROM switchboard.handed_vectors
              WHERE person_id = ANY($1) OR message_id = ANY($2)",
            ids,
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
              WHERE session_id = ANY($1) OR reply_id = ANY($2)
                 OR (channel, address) IN (SELECT * FROM unnest($3::text[], $4::text[]))",
            sessions,
            messages,
            &mailbox_channels,
            &mailbox_addresses,
        )
    );
    // Before the deliveries: a receipt is found by the provider ids its delivery lists.
    erase!(
        "delivery_receipts",
        sqlx::query!(
            "DELETE FROM switchboard.delivery_receipts r
              USING switchboard.deliveries d
              WHERE (d.session_id = ANY($1) OR d.reply_id = ANY($2))
                AND r.provider = d.provider
                AND r.provider_message_id = ANY(d.provider_message_ids)",
            sessions,
            messages,
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
                                 WHERE claimant_id = ANY($1) OR requested_by = ANY($2)
                                    OR id = ANY($2))",
            ids,
            messages,
        )
    );
    erase!(
        "link_claims",
        sqlx::query!(
            "DELETE FROM switchboard.link_claims
              WHERE claimant_id = ANY($1) OR requested_by = ANY($2) OR id = ANY($2)",
            ids,
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
            "DELETE FROM switchboard.summaries WHERE person_id = ANY($1) OR memory_key IN
                (SELECT memory_key FROM switchboard.sessions WHERE id = ANY($2))",
            ids,
            sessions,
        )
    );
    // Keyed by person, never by session scope: a person's memory is theirs alone.
    erase!(
        "memories",
        sqlx::query!(
            "DELETE FROM switchboard.memories WHERE person_id = ANY($1)",
            ids,
        )
    );
    // Their notes are the agent's words about them: theirs, wherever the session was.
    erase!(
        "wakeups",
        sqlx::query!(
            "DELETE FROM switchboard.wakeups WHERE person_id = ANY($1) OR session_id = ANY($2)",
            ids,
            sessions,
        )
    );
    // The files the agent left for them, and what was sent to whom: theirs, in any session.
    erase!(
        "exports",
        sqlx::query!(
            "DELETE FROM switchboard.exports WHERE person_id = ANY($1) OR session_id = ANY($2)",
            ids,
            sessions,
        )
    );
    erase!(
        "escalations",
        sqlx::query!(
            "DELETE FROM switchboard.escalations
              WHERE person_id = ANY($1) OR session_id = ANY($2)",
            ids,
            sessions,
        )
    );
    erase!(
        "takeovers",
        sqlx::query!(
            "DELETE FROM switchboard.takeovers WHERE session_id = ANY($1)",
            sessions,
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
            "DELETE FROM switchboard.chat_uploads WHERE owner = ANY($1)",
            &found.addresses_of(ContactKind::ChatUser),
        )
    );
    erase!(
        "identity_links",
        sqlx::query!(
            "DELETE FROM switchboard.identity_links
              WHERE from_person_id = ANY($1) OR to_person_id = ANY($1)",
            ids,
        )
    );
    erase!(
        "identity_link_audit",
        sqlx::query!(
            "DELETE FROM switchboard.identity_link_audit
              WHERE from_person_id = ANY($1) OR to_person_id = ANY($1)",
            ids,
        )
    );
    erase!(
        "contact_points",
        sqlx::query!(
            "DELETE FROM switchboard.contact_points WHERE person_id = ANY($1)",
            ids,
        )
    );
    erase!(
        "api_keys",
        sqlx::query!(
            "DELETE FROM switchboard.api_keys WHERE owner = ANY($1)",
            &found.addresses_of(ContactKind::ApiKeyOwner),
        )
    );
    erase!(
        "people",
        sqlx::query!(
            "DELETE FROM switchboard.people WHERE person_id = ANY($1)",
            ids,
        )
    );
    Ok(removed)
}

/// Delete the arrival cursors of their (channel, sender) pairs; the pairs, whose counters in
/// the arrivals bucket go too.
async fn removed_senders(
    tx: &mut Transaction<'_, Postgres>,
    found: &Found,
) -> sqlx::Result<BTreeSet<(String, String)>> {
    let candidates: Vec<(String, String)> = sqlx::query!(
        "SELECT channel, sender FROM switchboard.arrival_cursors WHERE sender = ANY($1)",
        &found.addresses(),
    )
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|r| (r.channel, r.sender))
    .collect();
    let (channels, senders) = found.theirs_on_channels(candidates);
    let rows = sqlx::query!(
        "DELETE FROM switchboard.arrival_cursors
          WHERE (channel, sender) IN (SELECT * FROM unnest($1::text[], $2::text[]))
         RETURNING channel, sender",
        &channels,
        &senders,
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
