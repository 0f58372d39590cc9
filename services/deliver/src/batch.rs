//! The deliver stage over what one pull brought (issue 41): the replies of different sessions
//! claimed in one statement, sent at once, and recorded in one statement, so a batch of
//! one-part replies costs two commits instead of two each.
//!
//! The batch takes only the replies whose whole delivery is the common case: decodable, to a
//! provider this deliverer sends to, a reply to be sent (not a heartbeat's "nothing to
//! report"), at most one per session and per person, its session's previous reply settled.
//! Once claimed, a reply of one part that nobody tried before is sent and recorded with the
//! batch; any other claimed reply goes on alone exactly as [`DeliverStage::after_claim`] does
//! for a single one. A reply the batch does not take goes through the one-reply path,
//! [`DeliverStage::deliver_one`], after the batch: same ledger, same waits.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use switchboard_channels::{Egress, OutboundPart};
use switchboard_kit::proto::{HEARTBEAT_OK_KIND, Reply};
use switchboard_kit::retry::{self, Backoff};
use switchboard_kit::status::{DeliveryStatus, TurnStatus};
use switchboard_kit::{Attempt, Outcome, StageError};
use uuid::Uuid;

use crate::ledger::{Claim, DeliveryLedger, LeasedRow, PartAttempt};
use crate::{DeliverError, DeliverStage};

/// A reply the batch may take, with what its delivery needs.
struct Taken<'a> {
    index: usize,
    reply: &'a Reply,
    id: Uuid,
    session: Uuid,
    sender: Arc<dyn Egress>,
    parts: Vec<String>,
    ledger: DeliveryLedger,
}

/// A row the batch's claim leased.
#[derive(sqlx::FromRow)]
struct Leased {
    reply_id: Uuid,
    #[sqlx(flatten)]
    row: LeasedRow,
}

#[derive(sqlx::FromRow)]
struct Predecessor {
    i: i32,
    turn: Option<TurnStatus>,
    delivery: Option<DeliveryStatus>,
}

impl DeliverStage {
    /// [`switchboard_kit::BatchStage::handle_batch`]'s work: one outcome per reply, in order.
    pub(crate) async fn deliver_batch(
        &self,
        replies: Vec<Reply>,
        attempts: &[Attempt],
    ) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = (0..replies.len()).map(|_| None).collect();
        let mut alone = Vec::new();
        let mut taken = Vec::new();
        let mut keys = HashSet::new();
        for (index, reply) in replies.iter().enumerate() {
            match self.takeable(index, reply) {
                Some(t) => {
                    let person = reply.person.as_ref().map_or("", |p| p.person_id.as_str());
                    let mine = [
                        format!("session\u{0}{}", t.session),
                        format!("person\u{0}{person}"),
                        format!("reply\u{0}{}", t.id),
                    ];
                    if mine.iter().any(|k| keys.contains(k)) {
                        alone.push(index);
                    } else {
                        keys.extend(mine);
                        taken.push(t);
                    }
                }
                None => alone.push(index),
            }
        }
        match self.claim_batch(&mut taken, &mut outcomes).await {
            Ok(claimed) => {
                alone.extend(taken.iter().map(|t| t.index).filter(|&i| {
                    outcomes[i].is_none() && !claimed.iter().any(|(t, _)| t.index == i)
                }));
                for (i, outcome) in self.send_claimed(claimed).await {
                    outcomes[i] = Some(outcome);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, replies = taken.len(), "a batch of replies could not be claimed together; delivering them one at a time");
                alone.extend(
                    taken
                        .iter()
                        .map(|t| t.index)
                        .filter(|&i| outcomes[i].is_none()),
                );
            }
        }
        alone.sort_unstable();
        let rest = join_all(
            alone
                .iter()
                .map(|&i| self.deliver_one(replies[i].clone(), &attempts[i])),
        )
        .await;
        for (i, outcome) in alone.into_iter().zip(rest) {
            outcomes[i] = Some(outcome);
        }
        outcomes
            .into_iter()
            .map(|o| o.expect("every reply has an outcome"))
            .collect()
    }

    /// The reply as the batch takes it, or none (it goes alone).
    fn takeable<'a>(&self, index: usize, reply: &'a Reply) -> Option<Taken<'a>> {
        if reply.kind == HEARTBEAT_OK_KIND {
            return None;
        }
        let id: Uuid = reply.id.parse().ok()?;
        let session: Uuid = reply.session_id.parse().ok()?;
        let sender = self.senders.get(&reply.provider).cloned()?;
        let parts = sender.split(&reply.text);
        if parts.is_empty() {
            return None;
        }
        let ledger = self.ledger.with_lease(self.lease_for(sender.as_ref()));
        Some(Taken {
            index,
            reply,
            id,
            session,
            sender,
            parts,
            ledger,
        })
    }

    /// Drop from `taken` what must not go out now (a forgotten person's reply: settled here; a
    /// reply whose session's previous one is not settled: left for the one-reply path), then
    /// claim the rest in one statement. What the claim leased comes back with its claim; a
    /// reply it did not lease (sent, failed, leased by another deliverer) is left out.
    async fn claim_batch<'a>(
        &self,
        taken: &mut Vec<Taken<'a>>,
        outcomes: &mut [Option<Outcome>],
    ) -> Result<Vec<(Taken<'a>, Claim)>, sqlx::Error> {
        if taken.is_empty() {
            return Ok(Vec::new());
        }
        let db = &self.ledger.db;
        let people: Vec<(String, DateTime<Utc>)> = taken
            .iter()
            .filter_map(|t| {
                let person = t.reply.person.as_ref()?.person_id.clone();
                let received = switchboard_kit::forgotten::id_time(&t.reply.in_reply_to);
                (!person.is_empty()).then_some((person, received))
            })
            .collect();
        let forgotten = switchboard_kit::forgotten::forgotten_among(db, &people).await?;
        for t in taken.iter() {
            let person = t.reply.person.as_ref().map_or("", |p| p.person_id.as_str());
            if forgotten.contains(person) {
                switchboard_kit::forgotten::dropped("deliver", "reply");
                outcomes[t.index] = Some(Ok(Vec::new()));
            }
        }
        taken.retain(|t| outcomes[t.index].is_none());

        // Replies of one session go out in turn order: only those whose previous reply is
        // settled go with the batch.
        let waiting: Vec<&Taken<'_>> = taken.iter().filter(|t| t.reply.seq > 1).collect();
        if !waiting.is_empty() {
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
            .bind(waiting.iter().map(|t| t.session).collect::<Vec<_>>())
            .bind(waiting.iter().map(|t| t.reply.seq).collect::<Vec<_>>())
            .bind(waiting.iter().map(|t| t.index as i32).collect::<Vec<_>>())
            .bind(TurnStatus::Done)
            .fetch_all(db)
            .await?;
            let unsettled: HashSet<usize> = rows
                .into_iter()
                .filter(|r| {
                    let settled = r.turn.is_none()
                        || r.turn == Some(TurnStatus::Failed)
                        || r.delivery.is_some_and(DeliveryStatus::is_settled);
                    !settled
                })
                .map(|r| r.i as usize)
                .collect();
            taken.retain(|t| !unsettled.contains(&t.index));
        }
        if taken.is_empty() {
            return Ok(Vec::new());
        }

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
        .bind(taken.iter().map(|t| t.id).collect::<Vec<_>>())
        .bind(taken.iter().map(|t| t.session).collect::<Vec<_>>())
        .bind(
            taken
                .iter()
                .map(|t| t.reply.channel.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            taken
                .iter()
                .map(|t| t.reply.provider.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            taken
                .iter()
                .map(|t| t.reply.recipient.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            taken
                .iter()
                .map(|t| t.parts.len() as i32)
                .collect::<Vec<_>>(),
        )
        .bind(DeliveryStatus::Pending)
        .bind(
            taken
                .iter()
                .map(|t| t.ledger.lease.as_secs_f64())
                .collect::<Vec<_>>(),
        )
        .fetch_all(db)
        .await?;
        let mut leased: HashMap<Uuid, LeasedRow> =
            leased.into_iter().map(|r| (r.reply_id, r.row)).collect();
        let mut claimed = Vec::new();
        for t in std::mem::take(taken) {
            match leased.remove(&t.id) {
                Some(row) => claimed.push((t, row.into_claim())),
                None => taken.push(t),
            }
        }
        Ok(claimed)
    }

    /// Send what the batch claimed: one-part replies nobody tried before together (recorded in
    /// one statement), the rest one by one as after a single claim. (message index, outcome).
    async fn send_claimed(&self, claimed: Vec<(Taken<'_>, Claim)>) -> Vec<(usize, Outcome)> {
        let (simple, other): (Vec<_>, Vec<_>) = claimed.into_iter().partition(|(t, c)| {
            t.parts.len() == 1
                && matches!(
                    c,
                    Claim::Send {
                        parts_sent: 0,
                        attempt: PartAttempt::Started,
                        ..
                    }
                )
        });
        let lease_taken = Instant::now();
        let others = join_all(other.into_iter().map(|(t, claim)| async move {
            let outcome = self
                .after_claim(
                    t.reply,
                    t.id,
                    t.sender.as_ref(),
                    &t.ledger,
                    &t.parts,
                    claim,
                    lease_taken,
                )
                .await;
            (t.index, outcome)
        }));
        let simple = self.send_simple(simple, lease_taken);
        let (mut done, simple) = futures::join!(others, simple);
        done.extend(simple);
        done
    }

    /// One-part replies, each sent once, the sent ones recorded together.
    async fn send_simple(
        &self,
        simple: Vec<(Taken<'_>, Claim)>,
        lease_taken: Instant,
    ) -> Vec<(usize, Outcome)> {
        if simple.is_empty() {
            return Vec::new();
        }
        let sends = join_all(simple.iter().map(|(t, _)| async move {
            let part = OutboundPart::new(t.reply, 0, &t.parts[0]);
            let span = tracing::info_span!(
                "provider_send",
                otel.name = %format_args!("send {}", t.reply.provider),
                otel.kind = "client",
                provider = %t.reply.provider,
                part = 0,
            );
            tracing::Instrument::instrument(t.sender.send(part), span).await
        }))
        .await;
        let mut done = Vec::new();
        let mut sent: Vec<(&Taken<'_>, String)> = Vec::new();
        for ((t, _), outcome) in simple.iter().zip(sends) {
            match outcome {
                Ok(sid) => sent.push((t, sid)),
                Err(e) => done.push((t.index, self.send_failed(t.reply, t.id, &t.ledger, e).await)),
            }
        }
        if sent.is_empty() {
            return done;
        }
        // Keep a margin before the shortest lease ends, as a single reply's record does.
        let shortest = sent
            .iter()
            .map(|(t, _)| t.ledger.lease)
            .min()
            .unwrap_or_default();
        let until = lease_taken + shortest * 3 / 4;
        let recorded = record_sent_together(&self.ledger.db, &sent, until).await;
        for (t, sid) in sent {
            done.push((
                t.index,
                match &recorded {
                    Ok(()) => {
                        metrics::counter!("sb_delivery_sent_total", "provider" => t.reply.provider.clone())
                            .increment(1);
                        Ok(vec![self.delivered(t.reply, vec![sid])])
                    }
                    Err(e) => Err(StageError::transient(DeliverError::Database(
                        sqlx::Error::Protocol(format!("recording the sent reply: {e}")),
                    ))),
                },
            ));
        }
        done
    }
}

/// Record one-part replies as sent, in one statement, tried again until `until` (only this
/// process knows the provider took them). Idempotent, as [`DeliveryLedger::part_sent`].
async fn record_sent_together(
    db: &sqlx::PgPool,
    sent: &[(&Taken<'_>, String)],
    until: Instant,
) -> Result<(), sqlx::Error> {
    let ids: Vec<Uuid> = sent.iter().map(|(t, _)| t.id).collect();
    let sids: Vec<String> = sent.iter().map(|(_, s)| s.clone()).collect();
    let backoff = Backoff::new(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(2),
    );
    retry::until(until, backoff, "recording sent replies", || async {
        sqlx::query(
            "UPDATE switchboard.deliveries d
                SET parts_sent = 1, provider_message_ids = array_append(d.provider_message_ids, u.sid),
                    status = $3, last_error = NULL, leased_until = NULL, attempt_part = NULL,
                    attempt_started_at = NULL, updated_at = now()
               FROM unnest($1::uuid[], $2::text[]) AS u(reply_id, sid)
              WHERE d.reply_id = u.reply_id AND d.status = $4 AND d.parts_sent = 0",
        )
        .bind(&ids)
        .bind(&sids)
        .bind(DeliveryStatus::Sent)
        .bind(DeliveryStatus::Pending)
        .execute(db)
        .await
        .map(|_| ())
    })
    .await
}
