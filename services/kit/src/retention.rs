//! Retention: rows nothing waits for any more are deleted once they are older than
//! `[retention]` says (0 keeps them forever), so `api_requests`, `mailbox` and `link_claims`
//! do not grow for ever.
//!
//! - `api_requests`: deleted `api_requests_days` after they were accepted, unless their
//!   message's turn is still open. One whose message never got a turn (refused by the rate
//!   limit, and the row's delete failed; or lost) is first marked expired
//!   (`expired_at`) after `api_pending_expiry_s`, so it ends instead of reading `pending`.
//! - `mailbox`: entries a gateway pushed to a socket after `mailbox_days`; the others (the
//!   person away, API replies that are polled) after `mailbox_unpushed_days`.
//! - `link_claims`: settled or expired claims after `link_claims_days`, with the proof answers
//!   of that age (a message that old is redelivered no more). A pending claim whose code still
//!   works is kept, whatever its age.
//!
//! Every identify worker sweeps every `sweep_every_s` ([`run`]). Each statement takes at most
//! `batch` rows, `FOR UPDATE SKIP LOCKED`, so replicas sweeping at once share the rows instead
//! of waiting for each other, and a repeated delete of the same rows is a no-op.
use std::time::Duration;

use sqlx::PgPool;

use crate::config::RetentionConfig;

/// Statements of one kind a sweep runs at most (each of `batch` rows); the rest waits for the
/// next sweep, so one sweep after a long outage does not run for ever.
const MAX_BATCHES: u32 = 100;

/// What one sweep did, by table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub api_requests_expired: u64,
    pub api_requests_deleted: u64,
    pub mailbox_deleted: u64,
    pub link_proof_answers_deleted: u64,
    pub link_claims_deleted: u64,
}

/// Sweep every `sweep_every_s` for as long as the future runs.
pub async fn run(db: PgPool, config: RetentionConfig) {
    let every = Duration::from_secs(config.sweep_every_s.max(1));
    loop {
        match sweep(&db, &config).await {
            Ok(swept) if swept == Swept::default() => {}
            Ok(swept) => tracing::info!(?swept, "retention sweep"),
            // Tried again at the next sweep.
            Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
        }
        tokio::time::sleep(every).await;
    }
}

/// One sweep, now.
pub async fn sweep(db: &PgPool, config: &RetentionConfig) -> Result<Swept, sqlx::Error> {
    let batch = i64::from(config.batch.max(1));
    let mut swept = Swept::default();
    if config.api_pending_expiry_s > 0 {
        let secs = config.api_pending_expiry_s as f64;
        swept.api_requests_expired = batches(batch, "api_requests_expired", || async move {
            sqlx::query!(
                r#"UPDATE switchboard.api_requests SET expired_at = now()
                    WHERE correlation_id IN (
                          SELECT r.correlation_id FROM switchboard.api_requests r
                           WHERE r.expired_at IS NULL
                             AND r.created_at < now() - make_interval(secs => $1)
                             AND NOT EXISTS (
                                 SELECT 1 FROM switchboard.turns t
                                  WHERE t.inbound_id = (CASE WHEN r.correlation_id
                                            ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}$'
                                            THEN r.correlation_id::uuid END))
                           ORDER BY r.created_at
                           LIMIT $2 FOR UPDATE SKIP LOCKED)"#,
                secs,
                batch,
            )
            .execute(db)
            .await
        })
        .await?;
    }
    if let Some(days) = days(config.api_requests_days) {
        swept.api_requests_deleted = batches(batch, "api_requests", || async move {
            sqlx::query!(
                r#"DELETE FROM switchboard.api_requests
                    WHERE correlation_id IN (
                          SELECT r.correlation_id FROM switchboard.api_requests r
                           WHERE r.created_at < now() - make_interval(days => $1)
                             -- A message still in its turn: its caller still waits.
                             AND NOT EXISTS (
                                 SELECT 1 FROM switchboard.turns t
                                  WHERE t.status = 'open'
                                    AND t.inbound_id = (CASE WHEN r.correlation_id
                                            ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}$'
                                            THEN r.correlation_id::uuid END))
                           ORDER BY r.created_at
                           LIMIT $2 FOR UPDATE SKIP LOCKED)"#,
                days,
                batch,
            )
            .execute(db)
            .await
        })
        .await?;
    }
    // Rows pushed to a socket and rows never pushed each have their own window.
    for (pushed, window) in [
        (true, config.mailbox_days),
        (false, config.mailbox_unpushed_days),
    ] {
        let Some(days) = days(window) else { continue };
        swept.mailbox_deleted += batches(batch, "mailbox", || async move {
            sqlx::query!(
                "DELETE FROM switchboard.mailbox
                  WHERE seq IN (
                        SELECT seq FROM switchboard.mailbox
                         WHERE created_at < now() - make_interval(days => $1)
                           AND (pushed_at IS NOT NULL) = $3
                         ORDER BY created_at
                         LIMIT $2 FOR UPDATE SKIP LOCKED)",
                days,
                batch,
                pushed,
            )
            .execute(db)
            .await
        })
        .await?;
    }
    if let Some(days) = days(config.link_claims_days) {
        // The answers first: they name the claims.
        swept.link_proof_answers_deleted = batches(batch, "link_proof_answers", || async move {
            sqlx::query!(
                "DELETE FROM switchboard.link_proof_answers
                  WHERE message_id IN (
                        SELECT a.message_id FROM switchboard.link_proof_answers a
                          LEFT JOIN switchboard.link_claims c ON c.id = a.claim_id
                         WHERE a.at < now() - make_interval(days => $1)
                           -- The request's answer stays while its claim's code still works.
                           AND (c.id IS NULL OR c.status <> 'pending' OR c.expires_at < now())
                         ORDER BY a.at
                         LIMIT $2 FOR UPDATE OF a SKIP LOCKED)",
                days,
                batch,
            )
            .execute(db)
            .await
        })
        .await?;
        swept.link_claims_deleted = batches(batch, "link_claims", || async move {
            sqlx::query!(
                "DELETE FROM switchboard.link_claims
                  WHERE id IN (
                        SELECT c.id FROM switchboard.link_claims c
                         WHERE c.created_at < now() - make_interval(days => $1)
                           AND (c.status <> 'pending' OR c.expires_at < now())
                           AND NOT EXISTS (SELECT 1 FROM switchboard.link_proof_answers a
                                            WHERE a.claim_id = c.id)
                         ORDER BY c.created_at
                         LIMIT $2 FOR UPDATE SKIP LOCKED)",
                days,
                batch,
            )
            .execute(db)
            .await
        })
        .await?;
    }
    Ok(swept)
}

/// `days` as the statements take it; `None` for 0 (kept forever).
fn days(days: u32) -> Option<i32> {
    (days > 0).then(|| i32::try_from(days).unwrap_or(i32::MAX))
}

/// Run `statement` until it touches fewer than `batch` rows (or [`MAX_BATCHES`] times); the
/// rows touched, also counted in `sb_retention_rows_total{table}`.
async fn batches<F, Fut>(batch: i64, table: &'static str, statement: F) -> Result<u64, sqlx::Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<sqlx::postgres::PgQueryResult, sqlx::Error>>,
{
    let mut total = 0;
    for _ in 0..MAX_BATCHES {
        let n = statement().await?.rows_affected();
        total += n;
        if n < batch as u64 {
            break;
        }
    }
    if total > 0 {
        metrics::counter!("sb_retention_rows_total", "table" => table).increment(total);
    }
    Ok(total)
}
