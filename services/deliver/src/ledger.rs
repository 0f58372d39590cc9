//! The delivery ledger (`switchboard.deliveries`): one row per reply, leased to the deliverer
//! sending it, recording each part the provider accepted and the attempt at the next one, so a
//! redelivered reply is never sent twice (see the crate's documentation for the one window it
//! leaves).
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use switchboard_kit::proto::Reply;
use switchboard_kit::retry::{self, Backoff};
use switchboard_kit::status::{DeliveryStatus, TurnStatus};
use uuid::Uuid;

/// What the ledger says of the part a claim resumes at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartAttempt {
    /// The claim itself recorded that the attempt starts now: nobody tried the part before.
    Started,
    /// Nobody tried the part yet, and the ledger does not say so: record it before sending.
    NotStarted,
    /// An earlier attempt at the part started at this time, and nothing says whether the
    /// provider took it.
    Uncertain(DateTime<Utc>),
}

/// Where a reply stands in the ledger.
pub enum Claim {
    /// This deliverer holds the lease; `parts_sent` parts already went out.
    Send {
        parts_sent: usize,
        ids: Vec<String>,
        /// Whether the next part was tried before.
        attempt: PartAttempt,
    },
    AlreadySent(Vec<String>),
    AlreadyFailed(String),
    /// Recorded as not to be sent.
    Skipped,
    /// Another deliverer holds the lease (or held it and died): try again once it ends.
    Busy {
        retry_in: Duration,
    },
}

/// A reply to claim: what its ledger row is made of.
pub(crate) struct ClaimRequest {
    pub id: Uuid,
    pub session: Uuid,
    pub channel: String,
    pub provider: String,
    pub recipient: String,
    pub parts: i32,
    /// How long the claim holds the reply (its channel's lease).
    pub lease: Duration,
}

impl ClaimRequest {
    pub(crate) fn of(reply: &Reply, id: Uuid, parts: usize, lease: Duration) -> Self {
        Self {
            id,
            session: reply.session_id.parse().unwrap_or_default(),
            channel: reply.channel.clone(),
            provider: reply.provider.clone(),
            recipient: reply.recipient.clone(),
            parts: parts as i32,
            lease,
        }
    }
}

/// A row [`DeliveryLedger::lease_all`] leased.
#[derive(sqlx::FromRow)]
struct Leased {
    reply_id: Uuid,
    #[sqlx(flatten)]
    row: LeasedRow,
}

/// A reply's previous turn and its delivery, as [`DeliveryLedger::unsettled_among`] reads them.
#[derive(sqlx::FromRow)]
struct Predecessor {
    i: i32,
    turn: Option<TurnStatus>,
    delivery: Option<DeliveryStatus>,
}

/// The ledger row a claim took, as [`DeliveryLedger::claim`] reads it back.
#[derive(sqlx::FromRow)]
pub(crate) struct LeasedRow {
    parts_sent: i32,
    provider_message_ids: Vec<String>,
    attempts: i32,
    /// The part an attempt was recorded at, and when it started.
    attempt_part: Option<i32>,
    attempt_started_at: Option<DateTime<Utc>>,
}

/// Where a reply stands, as [`DeliveryLedger::current`] reads it.
struct CurrentRow {
    status: DeliveryStatus,
    provider_message_ids: Vec<String>,
    last_error: Option<String>,
    /// How long the lease still holds (0 when it ended), in seconds.
    lease_left_s: Option<f64>,
}

impl LeasedRow {
    /// The claim a leased row gives: the parts already sent, and whether the next one was
    /// tried before.
    pub(crate) fn into_claim(self) -> Claim {
        let parts_sent = self.parts_sent;
        // Only the claim that inserted the row has `attempts = 1`; any other found the
        // attempt already there, recorded by someone before it.
        let attempt = match self.attempt_started_at {
            Some(at) if self.attempt_part == Some(parts_sent) && self.attempts > 1 => {
                PartAttempt::Uncertain(at)
            }
            Some(_) if self.attempt_part == Some(parts_sent) => PartAttempt::Started,
            _ => PartAttempt::NotStarted,
        };
        Claim::Send {
            parts_sent: parts_sent as usize,
            ids: self.provider_message_ids,
            attempt,
        }
    }
}

pub struct DeliveryLedger {
    pub(crate) db: PgPool,
    /// How long a claim holds the reply.
    pub(crate) lease: Duration,
}

impl DeliveryLedger {
    pub fn new(db: PgPool, lease: Duration) -> Self {
        Self { db, lease }
    }

    /// The same ledger, taking replies for `lease` (a channel's own, see [`Egress::lease`]).
    pub fn with_lease(&self, lease: Duration) -> Self {
        Self {
            db: self.db.clone(),
            lease,
        }
    }

    pub async fn claim(&self, reply: &Reply, id: Uuid, parts: usize) -> Result<Claim, sqlx::Error> {
        // The batch's statement for one reply: no row back means sent, failed, or leased by
        // someone else.
        let wanted = ClaimRequest::of(reply, id, parts, self.lease);
        if let Some(r) = self.lease_all(&[wanted]).await?.remove(&id) {
            return Ok(r.into_claim());
        }
        self.current(id).await
    }

    /// Lease every reply of `wanted` that is free to send, in one statement: create its ledger
    /// row leased to this deliverer, or take the lease of a pending row whose lease ended. A
    /// new row also records that the attempt at its first part starts now, so the common case
    /// costs no extra write; a taken-over row keeps the attempt an earlier claim recorded.
    /// The rows leased, by reply id (a reply missing was sent, failed, or is leased by another).
    pub(crate) async fn lease_all(
        &self,
        wanted: &[ClaimRequest],
    ) -> Result<HashMap<Uuid, LeasedRow>, sqlx::Error> {
        let col =
            |f: &dyn Fn(&ClaimRequest) -> String| -> Vec<String> { wanted.iter().map(f).collect() };
        let leased: Vec<Leased> = sqlx::query_as(
            "INSERT INTO switchboard.deliveries
                (reply_id, session_id, channel, provider, recipient, status, parts_total,
                 leased_until, attempts, attempt_part, attempt_started_at)
             SELECT u.reply_id, u.session_id, u.channel, u.provider, u.recipient, $7, u.parts,
                    now() + make_interval(secs => u.lease), 1, 0, now()
               FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[],
                           $6::int4[], $8::float8[])
                    AS u(reply_id, session_id, channel, provider, recipient, parts, lease)
              ORDER BY u.reply_id
             ON CONFLICT (reply_id) DO UPDATE
                SET leased_until = EXCLUDED.leased_until,
                    attempts = switchboard.deliveries.attempts + 1, updated_at = now()
              WHERE switchboard.deliveries.status = $7
                AND (switchboard.deliveries.leased_until IS NULL
                     OR switchboard.deliveries.leased_until < now())
             RETURNING reply_id, parts_sent, provider_message_ids, attempts, attempt_part,
                       attempt_started_at",
        )
        .bind(wanted.iter().map(|w| w.id).collect::<Vec<_>>())
        .bind(wanted.iter().map(|w| w.session).collect::<Vec<_>>())
        .bind(col(&|w| w.channel.clone()))
        .bind(col(&|w| w.provider.clone()))
        .bind(col(&|w| w.recipient.clone()))
        .bind(wanted.iter().map(|w| w.parts).collect::<Vec<_>>())
        .bind(DeliveryStatus::Pending)
        .bind(
            wanted
                .iter()
                .map(|w| w.lease.as_secs_f64())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&self.db)
        .await?;
        Ok(leased.into_iter().map(|r| (r.reply_id, r.row)).collect())
    }

    /// Where a reply stands, without taking its lease: sent, failed, or leased by another
    /// attempt (for how much longer).
    async fn current(&self, id: Uuid) -> Result<Claim, sqlx::Error> {
        let r = sqlx::query_as!(
            CurrentRow,
            r#"SELECT status AS "status: DeliveryStatus", provider_message_ids, last_error,
                      GREATEST(EXTRACT(EPOCH FROM leased_until - now()), 0)::float8
                        AS "lease_left_s?"
                 FROM switchboard.deliveries WHERE reply_id = $1"#,
            id,
        )
        .fetch_one(&self.db)
        .await?;
        Ok(match r.status {
            DeliveryStatus::Sent => Claim::AlreadySent(r.provider_message_ids),
            DeliveryStatus::Failed => Claim::AlreadyFailed(r.last_error.unwrap_or_default()),
            DeliveryStatus::Skipped => Claim::Skipped,
            DeliveryStatus::Pending => Claim::Busy {
                retry_in: Duration::from_secs_f64(
                    r.lease_left_s.unwrap_or(0.0).min(self.lease.as_secs_f64()),
                ),
            },
        })
    }

    /// Whether the reply to the turn before `seq` is settled (sent or failed for good), so this
    /// one may go out after it. Turns that failed have no reply and do not hold anything up;
    /// turns answered by a later turn's call (joined into it) are passed over.
    pub async fn predecessor_settled(&self, session: Uuid, seq: i64) -> Result<bool, sqlx::Error> {
        Ok(self.unsettled_among(&[(session, seq)]).await?.is_empty())
    }

    /// [`Self::predecessor_settled`] for many replies (session, seq) in one statement: the
    /// indexes in `replies` of those whose previous reply is not settled yet.
    pub(crate) async fn unsettled_among(
        &self,
        replies: &[(Uuid, i64)],
    ) -> Result<HashSet<usize>, sqlx::Error> {
        let asked: Vec<usize> = (0..replies.len()).filter(|&i| replies[i].1 > 1).collect();
        if asked.is_empty() {
            return Ok(HashSet::new());
        }
        let rows: Vec<Predecessor> = sqlx::query_as(
            "SELECT u.i, p.turn, p.delivery
               FROM unnest($1::uuid[], $2::int8[], $3::int4[]) AS u(session_id, seq, i)
               LEFT JOIN LATERAL (
                    SELECT t.status AS turn, d.status AS delivery
                      FROM switchboard.turns t
                      LEFT JOIN switchboard.deliveries d ON d.reply_id = t.reply_id
                     WHERE t.session_id = u.session_id AND t.seq < u.seq
                       AND NOT (t.status = $4 AND t.reply_id IS NULL)
                     ORDER BY t.seq DESC LIMIT 1) p ON true",
        )
        .bind(asked.iter().map(|&i| replies[i].0).collect::<Vec<_>>())
        .bind(asked.iter().map(|&i| replies[i].1).collect::<Vec<_>>())
        .bind(asked.iter().map(|&i| i as i32).collect::<Vec<_>>())
        .bind(TurnStatus::Done)
        .fetch_all(&self.db)
        .await?;
        // Turns that failed have no reply and hold nothing up; no earlier turn holds nothing up.
        Ok(rows
            .into_iter()
            .filter(|r| {
                r.turn.is_some()
                    && r.turn != Some(TurnStatus::Failed)
                    && !r.delivery.is_some_and(DeliveryStatus::is_settled)
            })
            .map(|r| r.i as usize)
            .collect())
    }

    /// Record that the attempt at part `index` (0-based) starts now, before it is handed to the
    /// provider. False if the reply is no longer where this deliverer left it (another one
    /// took over and moved on).
    pub async fn attempt_started(&self, id: Uuid, index: usize) -> Result<bool, sqlx::Error> {
        let done = sqlx::query!(
            "UPDATE switchboard.deliveries
                SET attempt_part = $2, attempt_started_at = now(), updated_at = now()
              WHERE reply_id = $1 AND status = $3 AND parts_sent = $2",
            id,
            index as i32,
            DeliveryStatus::Pending as DeliveryStatus,
        )
        .execute(&self.db)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Which of `candidates` (provider ids) the replies to the session's turns before `seq`
    /// recorded as theirs: a message in the provider's log that is one of those is not this
    /// reply's, however alike their texts.
    pub async fn recorded_by_earlier_replies(
        &self,
        session: Uuid,
        seq: i64,
        candidates: &[String],
    ) -> Result<Vec<String>, sqlx::Error> {
        // The log is only searched back to the attempt's start, so the last few replies are
        // the only ones whose messages can be in it.
        sqlx::query_scalar!(
            r#"SELECT DISTINCT sent.id AS "id!"
                 FROM switchboard.turns t
                 JOIN switchboard.deliveries d ON d.reply_id = t.reply_id
                CROSS JOIN LATERAL unnest(d.provider_message_ids) AS sent(id)
                WHERE t.session_id = $1 AND t.seq < $2 AND t.seq >= $2 - 16
                  AND sent.id = ANY($3)"#,
            session,
            seq,
            candidates,
        )
        .fetch_all(&self.db)
        .await
    }

    /// Record that part `index` (0-based) went out. The last part's write also marks the reply
    /// sent, so a reply of one part costs one write after the send; earlier parts renew the
    /// lease and record that the attempt at the next part starts now (it is sent right after).
    /// Idempotent: written again after a lost answer (the database restarted between commit
    /// and reply), it changes nothing.
    pub async fn part_sent(
        &self,
        id: Uuid,
        provider_id: &str,
        index: usize,
        last: bool,
    ) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE switchboard.deliveries
                SET parts_sent = $5 + 1,
                    provider_message_ids = array_append(provider_message_ids, $2),
                    status = CASE WHEN $4 THEN $6 ELSE status END,
                    last_error = CASE WHEN $4 THEN NULL ELSE last_error END,
                    leased_until = CASE WHEN $4 THEN NULL
                                        ELSE now() + make_interval(secs => $3) END,
                    attempt_part = CASE WHEN $4 THEN NULL ELSE $5 + 1 END,
                    attempt_started_at = CASE WHEN $4 THEN NULL ELSE now() END,
                    updated_at = now()
              WHERE reply_id = $1 AND status = $7 AND parts_sent = $5",
            id,
            provider_id,
            self.lease.as_secs_f64(),
            last,
            index as i32,
            DeliveryStatus::Sent as DeliveryStatus,
            DeliveryStatus::Pending as DeliveryStatus,
        )
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// [`Self::part_sent`], retried until it is written or `until` passes. Only this process
    /// knows the provider accepted the part: giving up on the write means the next attempt
    /// sends it again, so a database outage shorter than the lease costs no double send.
    pub async fn record_part_sent(
        &self,
        id: Uuid,
        provider_id: &str,
        index: usize,
        last: bool,
        until: Instant,
    ) -> Result<(), sqlx::Error> {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        retry::until(until, backoff, "recording a sent part", || {
            self.part_sent(id, provider_id, index, last)
        })
        .await
    }

    /// Record one-part replies (reply id, the provider's id) as sent, in one statement, tried
    /// again until `until` (only this process knows the provider took them). Idempotent, as
    /// [`Self::part_sent`].
    pub(crate) async fn record_sent_together(
        &self,
        sent: &[(Uuid, String)],
        until: Instant,
    ) -> Result<(), sqlx::Error> {
        let (ids, sids): (Vec<Uuid>, Vec<String>) = sent.iter().cloned().unzip();
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        retry::until(until, backoff, "recording sent replies", || async {
            sqlx::query(
                "UPDATE switchboard.deliveries d
                    SET parts_sent = 1,
                        provider_message_ids = array_append(d.provider_message_ids, u.sid),
                        status = $3, last_error = NULL, leased_until = NULL, attempt_part = NULL,
                        attempt_started_at = NULL, updated_at = now()
                   FROM unnest($1::uuid[], $2::text[]) AS u(reply_id, sid)
                  WHERE d.reply_id = u.reply_id AND d.status = $4 AND d.parts_sent = 0",
            )
            .bind(&ids)
            .bind(&sids)
            .bind(DeliveryStatus::Sent)
            .bind(DeliveryStatus::Pending)
            // Planned for each batch's own arrays: a plan cached while `deliveries` was nearly
            // empty would scan every delivery for good.
            .persistent(false)
            .execute(&self.db)
            .await
            .map(|_| ())
        })
        .await
    }

    /// Record a reply that is not to be sent (a heartbeat's "nothing to report"), so the
    /// session's later replies go ahead of it.
    pub async fn skip(&self, reply: &Reply, id: Uuid) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "INSERT INTO switchboard.deliveries
                (reply_id, session_id, channel, provider, recipient, status)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (reply_id) DO NOTHING",
            id,
            reply.session_id.parse::<Uuid>().unwrap_or_default(),
            reply.channel,
            reply.provider,
            reply.recipient,
            DeliveryStatus::Skipped as DeliveryStatus,
        )
        .execute(&self.db)
        .await?;
        Ok(())
    }

    pub async fn finish(&self, id: Uuid, error: Option<&str>) -> Result<(), sqlx::Error> {
        let status = if error.is_some() {
            DeliveryStatus::Failed
        } else {
            DeliveryStatus::Sent
        };
        sqlx::query!(
            "UPDATE switchboard.deliveries
                SET status = $2, last_error = $3, leased_until = NULL, updated_at = now()
              WHERE reply_id = $1",
            id,
            status as DeliveryStatus,
            error,
        )
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// Record a reply given up on as failed, so the session's later replies go ahead: a new
    /// row if no attempt claimed it, else a pending row whose lease has ended. A reply that was
    /// sent stays sent; one whose lease is held waits for that attempt.
    pub async fn give_up(
        &self,
        reply: &Reply,
        id: Uuid,
        error: &str,
    ) -> Result<Claim, sqlx::Error> {
        let session: Uuid = reply.session_id.parse().unwrap_or_default();
        let failed = sqlx::query_scalar!(
            "INSERT INTO switchboard.deliveries
                (reply_id, session_id, channel, provider, recipient, status, last_error)
             VALUES ($1, $2, $3, $4, $5, $7, $6)
             ON CONFLICT (reply_id) DO UPDATE
                SET status = EXCLUDED.status, last_error = EXCLUDED.last_error,
                    leased_until = NULL, updated_at = now()
              WHERE switchboard.deliveries.status = $8
                AND (switchboard.deliveries.leased_until IS NULL
                     OR switchboard.deliveries.leased_until < now())
             RETURNING last_error",
            id,
            session,
            reply.channel,
            reply.provider,
            reply.recipient,
            error,
            DeliveryStatus::Failed as DeliveryStatus,
            DeliveryStatus::Pending as DeliveryStatus,
        )
        .fetch_optional(&self.db)
        .await?;
        if failed.is_some() {
            return Ok(Claim::AlreadyFailed(error.to_string()));
        }
        // Sent, failed already, or leased: what `claim` would say, without taking a lease.
        self.current(id).await
    }

    /// Let another attempt take over at once. `unsent`: the provider refused the part it was
    /// given (it said slow down), so the part is known not to have gone out and the next
    /// attempt need not ask the provider's log about it.
    pub async fn release(&self, id: Uuid, error: &str, unsent: bool) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE switchboard.deliveries
                SET leased_until = NULL, last_error = $2, updated_at = now(),
                    attempt_part = CASE WHEN $3 THEN NULL ELSE attempt_part END,
                    attempt_started_at = CASE WHEN $3 THEN NULL ELSE attempt_started_at END
              WHERE reply_id = $1",
            id,
            error,
            unsent,
        )
        .execute(&self.db)
        .await?;
        Ok(())
    }
}
