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
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use switchboard_channels::{Egress, OutboundPart};
use switchboard_kit::proto::{HEARTBEAT_OK_KIND, Reply};
use switchboard_kit::{Attempt, Outcome, StageError};
use uuid::Uuid;

use crate::ledger::{Claim, ClaimRequest, DeliveryLedger, PartAttempt};
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
        // A reply with files goes alone: its links are signed, its text may change.
        if !reply.exports.is_empty() {
            return None;
        }
        let sender = self.senders.get(&reply.provider).cloned()?;
        // A channel with a session window goes alone: its parts need the person's last message.
        if sender.session_window().is_some() {
            return None;
        }
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
        // settled go with the batch (a notice marked to go ahead of them asks nothing: seq 0).
        let asked: Vec<(Uuid, i64)> = taken
            .iter()
            .map(|t| {
                let seq = if t.reply.ahead_of_earlier_replies {
                    0
                } else {
                    t.reply.seq
                };
                (t.session, seq)
            })
            .collect();
        let unsettled = self.ledger.unsettled_among(&asked).await?;
        let mut i = 0;
        taken.retain(|_| {
            i += 1;
            !unsettled.contains(&(i - 1))
        });
        if taken.is_empty() {
            return Ok(Vec::new());
        }

        let wanted: Vec<ClaimRequest> = taken
            .iter()
            .map(|t| ClaimRequest::of(t.reply, t.id, t.parts.len(), t.ledger.lease))
            .collect();
        let mut leased = self.ledger.lease_all(&wanted).await?;
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
                    (&t.parts, &[]),
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
        let ids: Vec<(Uuid, String)> = sent.iter().map(|(t, sid)| (t.id, sid.clone())).collect();
        let recorded = self.ledger.record_sent_together(&ids, until).await;
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
