//! Outbound delivery: the reply goes out on the channel the person used, once.
//!
//! The ledger (`deliveries`) makes redelivered replies harmless: a reply marked `sent` is not
//! sent again, a reply being sent is leased by one deliverer, and long replies remember how many
//! parts went out. A part the provider accepted is recorded before anything else happens; if the
//! database is down, the write is retried for most of the lease (past that, the next attempt
//! finds the part's outcome unknown, as after a crash).
//!
//! Providers' send APIs take no idempotency key, so one window is left that the ledger alone
//! cannot close: a deliverer that dies after the provider accepted a part and before the ledger
//! recorded it. So the ledger also records, before each send, which part is being attempted and
//! since when. A claimer that finds an attempt at the part it is to send, with no record of the
//! outcome, does not know whether that part went out, and asks the provider's own message log
//! ([`Egress::find_sent`](switchboard_channels::Egress::find_sent)) for a message with the
//! same recipient, sender and text created since the attempt started (less a few seconds of
//! clock skew), leaving out the ones this reply's earlier parts or the session's earlier replies
//! already recorded as theirs:
//!
//! - found: the part is recorded as sent with the provider's id, and the reply goes on with the
//!   next part;
//! - not found: the part is sent (the recorded start still covers this attempt);
//! - the log cannot be read (provider down, or slower than a quarter of the lease): the part is
//!   not sent blind. The attempt fails like a send to a provider that is down and is retried
//!   with backoff; if the log stays unreadable past the stage's failure budget, the reply ends
//!   like any other that kept failing: recorded `failed`, announced as `delivery.failed`, and
//!   dead-lettered with the reason "could not read …'s message log …". The operator then knows
//!   the part may or may not have reached the person; nothing is silent.
//!
//! What is left: a part the provider accepted but does not list the way it was sent (Twilio
//! lists by the day a message left its queue, so one still queued there may not be listed yet;
//! a provider that rewrote the text, or sent it from a fallback sender) is not found and is
//! sent again, as before. Rows written before the attempt was recorded carry no attempt and are
//! sent again after a crash, as before.
mod batch;
mod exports;
mod ledger;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::future::join_all;
use switchboard_kit::config::Config;
use switchboard_kit::exports::ExportLink;
use switchboard_kit::proto::{DeliveryFailed, HEARTBEAT_OK_KIND, Reply, ReplyDelivered};
use switchboard_kit::startup::{App, Task};
use switchboard_kit::{Attempt, BatchStage, Hold, Outcome, Output, StageError, Topology};
use switchboard_kit::{Registration, Source, StageSpec};
use tracing::Instrument as _;
use uuid::Uuid;

pub use ledger::{Claim, DeliveryLedger, PartAttempt};
pub use switchboard_channels::Senders;
use switchboard_channels::{Channels, Egress, Mailbox, MailboxEgress, OutboundPart, SendError};

#[derive(Debug, thiserror::Error)]
pub enum DeliverError {
    #[error("reply is malformed: {0}")]
    Malformed(&'static str),
    #[error("no sender for provider {0:?}")]
    NoSender(String),
    #[error("delivery ledger: {0}")]
    Database(#[from] sqlx::Error),
    /// An earlier attempt at the part may have reached the provider, and its log could not
    /// say: the part is not sent blind.
    #[error(
        "could not read {provider}'s message log to learn whether part {part} of {parts} \
         already went out, so it was not sent again"
    )]
    Unconfirmed {
        provider: String,
        part: usize,
        parts: usize,
        source: SendError,
    },
    #[error("the ledger changed under this deliverer (its lease ended); the reply is retried")]
    LostLease,
}

/// When the person `reply` goes to last wrote on its channel: the message it answers, when
/// that is the person's own (its UUIDv7 says when it came in, even before the log has it; an
/// agent-started message carries no provider id), or their latest inbound message in the log.
async fn last_inbound(
    db: &sqlx::PgPool,
    reply: &Reply,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
    let answered = Some(reply)
        .filter(|r| !r.provider_message_id.is_empty())
        .and_then(|r| r.in_reply_to.parse::<Uuid>().ok())
        .and_then(|id| id.get_timestamp())
        .and_then(|t| {
            let (secs, nanos) = t.to_unix();
            chrono::DateTime::from_timestamp(i64::try_from(secs).ok()?, nanos)
        });
    let person = reply
        .person
        .as_ref()
        .map(|p| p.person_id.as_str())
        .unwrap_or("");
    // Checked at run time: a read the message log's index (person, id) serves.
    let logged: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT created_at FROM switchboard.messages
          WHERE direction = 'inbound' AND person_id = $1 AND channel = $2
          ORDER BY id DESC LIMIT 1",
    )
    .bind(person)
    .bind(&reply.channel)
    .fetch_optional(db)
    .await?;
    Ok(answered.max(logged))
}

/// The longest a provider's "retry after" is waited for at once (a longer one is asked again
/// after this).
const MAX_THROTTLE_WAIT: Duration = Duration::from_secs(600);

pub struct DeliverStage {
    ledger: DeliveryLedger,
    senders: Senders,
    topology: Topology,
    /// Signs the links of the files a reply carries (`exports/`), loaded on first use.
    links: exports::LinkSigner,
}

/// How long a reply waits in its handler slot for the previous reply of its session before it
/// is parked (slot given back; waits cost no delivery, so this need not outlast the previous
/// reply's retries). Short: while a backlog of later replies waits after an outage, their slots
/// are what the earlier replies need.
const ORDER_HOLD: Duration = Duration::from_secs(1);
const ORDER_POLL: Duration = Duration::from_millis(50);
/// How long a parked reply sleeps before it looks again.
const ORDER_RETRY: Duration = Duration::from_millis(250);

impl DeliverStage {
    pub fn new(ledger: DeliveryLedger, senders: Senders, topology: Topology) -> Self {
        let links = exports::LinkSigner::new(ledger.db.clone(), &Config::default());
        Self {
            ledger,
            senders,
            topology,
            links,
        }
    }

    /// The same stage signing file links as `config` says (`gateway.public_url`, the
    /// replicas' shared secret).
    pub fn with_links_of(self, config: &Config) -> Self {
        Self {
            links: exports::LinkSigner::new(self.ledger.db.clone(), config),
            ..self
        }
    }

    /// How long a reply to `sender` is held while being sent: the channel's own lease, at most
    /// the ledger's (tests shorten it).
    fn lease_for(&self, sender: &dyn Egress) -> Duration {
        self.ledger.lease.min(sender.lease())
    }

    /// Replies of one session go out in turn order: wait until the previous one is settled.
    async fn wait_for_predecessor(&self, session: Uuid, seq: i64) -> Result<(), StageError> {
        let hold = Hold {
            poll: ORDER_POLL,
            hold: ORDER_HOLD,
            retry: ORDER_RETRY,
        };
        hold.until(
            || format!("reply {seq} waits for the reply to turn {}", seq - 1),
            || async {
                self.ledger
                    .predecessor_settled(session, seq)
                    .await
                    .map_err(|e| StageError::transient(DeliverError::Database(e)))
            },
        )
        .await
    }

    /// The provider's id of the message its log holds for this part, sent by an attempt that
    /// started at `since`; none if the log holds no such message. Messages this reply's
    /// earlier parts (`own`) or the session's earlier replies recorded are not this part's,
    /// however alike their texts. Bounded to a quarter of the lease, so the part is still sent
    /// (if it must be) well inside it.
    async fn already_sent(
        &self,
        sender: &dyn Egress,
        reply: &Reply,
        part: OutboundPart<'_>,
        since: DateTime<Utc>,
        own: &[String],
    ) -> Result<Option<String>, SendError> {
        let budget = self.lease_for(sender) / 4;
        let mut found = tokio::time::timeout(budget, sender.find_sent(part, since))
            .await
            .map_err(|_| {
                SendError::Unavailable(format!("the log did not answer within {budget:?}"))
            })??;
        found.retain(|sid| !own.contains(sid));
        if found.is_empty() {
            return Ok(None);
        }
        if let Ok(session) = reply.session_id.parse::<Uuid>() {
            let theirs = self
                .ledger
                .recorded_by_earlier_replies(session, reply.seq, &found)
                .await
                .map_err(|e| SendError::Unavailable(format!("delivery ledger: {e}")))?;
            found.retain(|sid| !theirs.contains(sid));
        }
        Ok(found.into_iter().next())
    }

    /// [`Self::already_sent`] for `part`, the next of `parts_total` (the ones before it went
    /// out as `own`), counted and logged. A log that cannot be read now releases the reply and
    /// fails the attempt: the part is not sent blind. A provider with no log to read at all
    /// (its `find_sent` answers `Rejected`) can never say: the reply ends now, not after the
    /// stage's retries.
    async fn look_up(
        &self,
        sender: &dyn Egress,
        part: OutboundPart<'_>,
        id: Uuid,
        parts_total: usize,
        own: &[String],
        since: DateTime<Utc>,
    ) -> Result<LookedUp, StageError> {
        let (reply, index) = (part.reply, part.index);
        let provider = &reply.provider;
        match self.already_sent(sender, reply, part, since, own).await {
            Ok(Some(sid)) => {
                reconciled(provider, "found");
                tracing::info!(reply_id = %id, part = index, provider_id = %sid, "the provider's log has the part an earlier attempt sent: not sending it again");
                Ok(LookedUp::Sent(sid))
            }
            Ok(None) => {
                reconciled(provider, "not_found");
                tracing::info!(reply_id = %id, part = index, "the provider's log does not have the part an earlier attempt may have sent: sending it");
                Ok(LookedUp::NotSent)
            }
            Err(SendError::Rejected(why)) => {
                reconciled(provider, "unknowable");
                tracing::warn!(reply_id = %id, part = index, %why, "the provider keeps no log: the part an earlier attempt may have sent is not sent again");
                Ok(LookedUp::Unknowable(format!(
                    "part {} of {parts_total} may have reached {provider} before its deliverer \
                     stopped, and {provider} cannot say: not sent again ({why})",
                    index + 1
                )))
            }
            Err(source) => {
                reconciled(provider, "unreadable");
                tracing::warn!(reply_id = %id, part = index, error = %source, "the provider's log cannot say whether an earlier attempt sent the part: not sending it blind");
                let _ = self.ledger.release(id, &source.to_string(), false).await;
                Err(StageError::transient(DeliverError::Unconfirmed {
                    provider: provider.clone(),
                    part: index + 1,
                    parts: parts_total,
                    source,
                }))
            }
        }
    }

    fn delivered(&self, reply: &Reply, ids: Vec<String>) -> Output {
        let event = ReplyDelivered {
            reply_id: reply.id.clone(),
            session_id: reply.session_id.clone(),
            channel: reply.channel.clone(),
            provider: reply.provider.clone(),
            provider_message_ids: ids,
            correlation_id: reply.correlation_id.clone(),
            delivered_at_ms: switchboard_kit::now_ms(),
        };
        Output::new(
            self.topology.event("reply.delivered"),
            reply.id.clone(),
            &event,
        )
        .correlated(reply.correlation_id.clone())
    }

    fn failed(&self, reply: &Reply, error: String) -> Output {
        let event = DeliveryFailed {
            reply_id: reply.id.clone(),
            session_id: reply.session_id.clone(),
            channel: reply.channel.clone(),
            provider: reply.provider.clone(),
            error,
            correlation_id: reply.correlation_id.clone(),
            failed_at_ms: switchboard_kit::now_ms(),
        };
        Output::new(
            self.topology.event("delivery.failed"),
            reply.id.clone(),
            &event,
        )
        .correlated(reply.correlation_id.clone())
    }
}

impl DeliverStage {
    /// One reply alone: the forgotten check, its turn in the session's order, the claim, then
    /// [`Self::after_claim`].
    pub async fn deliver_one(&self, reply: Reply, _attempt: &Attempt) -> Outcome {
        let id: Uuid = reply
            .id
            .parse()
            .map_err(|_| StageError::permanent(DeliverError::Malformed("reply id")))?;
        // A reply to a person forgotten since their message arrived is not sent.
        let person = reply.person.as_ref().map_or("", |p| p.person_id.as_str());
        let received = switchboard_kit::forgotten::id_time(&reply.in_reply_to);
        if switchboard_kit::forgotten::received_before(&self.ledger.db, person, received)
            .await
            .map_err(|e| StageError::transient(DeliverError::Database(e)))?
        {
            switchboard_kit::forgotten::dropped("deliver", "reply");
            return Ok(Vec::new());
        }
        let Some(sender) = self.senders.get(&reply.provider).cloned() else {
            return Err(StageError::permanent(DeliverError::NoSender(
                reply.provider.clone(),
            )));
        };
        switchboard_kit::trace::record_session(&reply.session_id);
        let ledger = self.ledger.with_lease(self.lease_for(sender.as_ref()));
        if let Ok(session) = reply.session_id.parse::<Uuid>()
            && !reply.ahead_of_earlier_replies
        {
            self.wait_for_predecessor(session, reply.seq).await?;
        }
        let transient = |e: sqlx::Error| StageError::transient(DeliverError::Database(e));
        if reply.kind == HEARTBEAT_OK_KIND {
            // Logged (log-outbound), not sent: the agent had nothing to report.
            ledger.skip(&reply, id).await.map_err(transient)?;
            metrics::counter!("sb_delivery_skipped_total", "kind" => HEARTBEAT_OK_KIND)
                .increment(1);
            return Ok(Vec::new());
        }
        let outgoing = self
            .links
            .outgoing(&reply, sender.as_ref())
            .await
            .map_err(transient)?;
        let parts = outgoing.parts;
        let lease_taken = Instant::now();
        let claim = ledger
            .claim(&reply, id, parts.len())
            .await
            .map_err(transient)?;
        self.after_claim(
            &reply,
            id,
            sender.as_ref(),
            &ledger,
            (&parts, &outgoing.attachments),
            claim,
            lease_taken,
        )
        .await
    }

    /// What a claim of the ledger's row leads to: the outcome recorded before, a wait for the
    /// deliverer holding the reply, or the parts not yet sent, each sent and recorded in turn.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn after_claim(
        &self,
        reply: &Reply,
        id: Uuid,
        sender: &dyn Egress,
        ledger: &DeliveryLedger,
        (parts, attachments): (&[String], &[Vec<ExportLink>]),
        claim: Claim,
        mut lease_taken: Instant,
    ) -> Outcome {
        let transient = |e: sqlx::Error| StageError::transient(DeliverError::Database(e));
        let provider = reply.provider.clone();
        let (mut sent, mut ids, attempt) = match claim {
            Claim::AlreadySent(ids) => return Ok(vec![self.delivered(reply, ids)]),
            Claim::AlreadyFailed(error) => return Ok(vec![self.failed(reply, error)]),
            Claim::Skipped => return Ok(Vec::new()),
            // Come back when the lease ends, so a deliverer that died mid-send does not use up
            // this reply's deliveries; one that is alive will have finished by then.
            Claim::Busy { retry_in } => {
                return Err(StageError::Defer(
                    retry_in + Duration::from_millis(250),
                    "another deliverer holds this reply".into(),
                ));
            }
            Claim::Send {
                parts_sent,
                ids,
                attempt,
            } => (parts_sent, ids, attempt),
        };
        if parts.is_empty() {
            let error = "the agent's reply was empty".to_string();
            ledger.finish(id, Some(&error)).await.map_err(transient)?;
            return Ok(vec![self.failed(reply, error)]);
        }
        // Whether the ledger already says `sent` (the last part's write sets it).
        if sent == parts.len() {
            // Every part went out and was recorded, but not the status: a row written by a
            // release from before the last part's write also set it.
            ledger.finish(id, None).await.map_err(transient)?;
        }
        // When the person last wrote, for a channel that answers freely only for a while.
        let last_inbound = if sender.session_window().is_some() {
            last_inbound(&self.ledger.db, reply)
                .await
                .map_err(transient)?
        } else {
            None
        };
        // The files go with the part the channel's style put them on.
        let part_at = |index: usize| {
            let part =
                OutboundPart::new(reply, index, &parts[index]).with_last_inbound(last_inbound);
            match attachments.get(index) {
                Some(files) => part.with_attachments(files),
                None => part,
            }
        };
        // The provider's id of the next part when its log shows an earlier attempt sent it.
        let mut found = None;
        if sent < parts.len() {
            match attempt {
                PartAttempt::Started => {}
                PartAttempt::NotStarted => {
                    if !ledger.attempt_started(id, sent).await.map_err(transient)? {
                        return Err(StageError::transient(DeliverError::LostLease));
                    }
                }
                PartAttempt::Uncertain(since) => {
                    match self
                        .look_up(sender, part_at(sent), id, parts.len(), &ids, since)
                        .await?
                    {
                        LookedUp::Sent(sid) => found = Some(sid),
                        LookedUp::NotSent => {}
                        LookedUp::Unknowable(why) => {
                            return self
                                .send_failed(reply, id, ledger, SendError::Rejected(why))
                                .await;
                        }
                    }
                }
            }
        }
        while sent < parts.len() {
            let outcome = match found.take() {
                Some(sid) => Ok(sid),
                None => {
                    // The provider's send, a client span in the turn's trace.
                    let span = tracing::info_span!(
                        "provider_send",
                        otel.name = %format_args!("send {provider}"),
                        otel.kind = "client",
                        provider = %provider,
                        part = sent,
                    );
                    sender.send(part_at(sent)).instrument(span).await
                }
            };
            match outcome {
                Ok(sid) => {
                    let last = sent + 1 == parts.len();
                    // Keep a margin before the lease ends, so no other deliverer takes the
                    // reply over while this one still tries to record its send.
                    let until = lease_taken + ledger.lease * 3 / 4;
                    ledger
                        .record_part_sent(id, &sid, sent, last, until)
                        .await
                        .map_err(transient)?;
                    lease_taken = Instant::now();
                    ids.push(sid);
                    sent += 1;
                }
                Err(e) => return self.send_failed(reply, id, ledger, e).await,
            }
        }
        metrics::counter!("sb_delivery_sent_total", "provider" => provider).increment(1);
        Ok(vec![self.delivered(reply, ids)])
    }

    /// A send the provider did not take: refused for good (recorded failed, announced), or
    /// not now (the reply released for the next attempt after the stage's backoff).
    pub(crate) async fn send_failed(
        &self,
        reply: &Reply,
        id: Uuid,
        ledger: &DeliveryLedger,
        error: SendError,
    ) -> Outcome {
        let provider = reply.provider.clone();
        let transient = |e: sqlx::Error| StageError::transient(DeliverError::Database(e));
        match error {
            SendError::Rejected(error) => {
                tracing::warn!(reply_id = %id, %error, "delivery failed for good");
                ledger.finish(id, Some(&error)).await.map_err(transient)?;
                metrics::counter!("sb_delivery_failed_total", "provider" => provider).increment(1);
                Ok(vec![self.failed(reply, error)])
            }
            e => {
                // Unavailable, or throttled (429): the next attempt may take over at once,
                // after the stage's backoff. The attempt counts, so a provider that never
                // lets up ends in `delivery.failed` (recorded by `give_up`), never in a
                // reply waiting forever. A 429 says the part was refused; any other failure
                // (a 5xx, a time-out) leaves it uncertain, for the next attempt to look up.
                let throttled = matches!(e, SendError::Throttled { .. });
                if throttled {
                    metrics::counter!("sb_delivery_throttled_total", "provider" => provider)
                        .increment(1);
                }
                let _ = ledger.release(id, &e.to_string(), throttled).await;
                if let SendError::Throttled {
                    retry_after: Some(after),
                    ..
                } = &e
                {
                    // The provider said when to come back (Telegram's `retry_after`, a
                    // `Retry-After`): that wait, not the stage's backoff, and not a failed
                    // attempt; a provider that never lets up still ends in `delivery.failed`
                    // once the reply has waited `runtime.max_wait_ms`.
                    return Err(StageError::Defer(
                        (*after).clamp(Duration::from_millis(250), MAX_THROTTLE_WAIT),
                        e.to_string(),
                    ));
                }
                Err(StageError::transient(e))
            }
        }
    }
}

/// What the provider's log says of a part an earlier attempt may have sent.
enum LookedUp {
    /// It went out: its id.
    Sent(String),
    /// It did not: send it.
    NotSent,
    /// It can never be known (the provider keeps no log a business can read): the reply ends
    /// failed with this reason, the part not sent again.
    Unknowable(String),
}

impl BatchStage for DeliverStage {
    type Input = Reply;
    const SPEC: StageSpec = StageSpec::new("deliver", Source::Work("reply"));

    /// Replies of different sessions claimed, sent and recorded together ([`batch`]); the
    /// rest one at a time as before.
    async fn handle_batch(&self, replies: Vec<Reply>, attempts: &[Attempt]) -> Vec<Outcome> {
        if replies.len() < 2 {
            return join_all(
                replies
                    .into_iter()
                    .zip(attempts)
                    .map(|(r, a)| self.deliver_one(r, a)),
            )
            .await;
        }
        self.deliver_batch(replies, attempts).await
    }

    /// A reply given up on is recorded as failed (so the session's next replies go out) and
    /// announced as `delivery.failed`, on every path: provider down past the failure budget,
    /// or a reply that kept crashing its deliverer.
    async fn give_up(
        &self,
        reply: &Reply,
        _attempt: &Attempt,
        cause: &switchboard_kit::GiveUp,
    ) -> Result<Vec<Output>, StageError> {
        let reason = cause.to_string();
        let Ok(id) = reply.id.parse::<Uuid>() else {
            return Ok(Vec::new());
        };
        let claim = self
            .ledger
            .give_up(reply, id, &reason)
            .await
            .map_err(|e| StageError::transient(DeliverError::Database(e)))?;
        match claim {
            Claim::AlreadySent(ids) => Ok(vec![self.delivered(reply, ids)]),
            Claim::Skipped => Ok(Vec::new()),
            Claim::AlreadyFailed(error) => {
                metrics::counter!("sb_delivery_failed_total", "provider" => reply.provider.clone())
                    .increment(1);
                Ok(vec![self.failed(reply, error)])
            }
            // Another attempt holds the lease: give up once it has ended.
            Claim::Busy { .. } | Claim::Send { .. } => Err(StageError::Defer(
                Duration::from_secs(1),
                "another deliverer holds this reply".into(),
            )),
        }
    }
}

/// Counts look-ups in a provider's log by what they found: `found` (a double avoided),
/// `not_found` (the part is sent), `unreadable` (it is not, and the reply is retried).
fn reconciled(provider: &str, outcome: &'static str) {
    metrics::counter!("sb_delivery_reconciled_total", "provider" => provider.to_string(), "outcome" => outcome)
        .increment(1);
}

/// How long a deliverer holds a reply while sending it (renewed after each part); a crashed
/// deliverer's reply is picked up again after this: the longest channel's
/// [`Egress::lease`] (a provider over HTTP); the mailbox's is shorter.
pub const DELIVERY_LEASE: Duration = switchboard_channels::SEND_LEASE;

/// The deliver stage, as the product lists it.
pub const STAGE: Registration = Registration {
    spec: DeliverStage::SPEC,
    worker: "deliver",
    start: task,
};

/// Providers whose replies go to the mailbox (clients of ours, not a provider's API).
pub const MAILBOX_PROVIDERS: [&str; 2] = [
    switchboard_channels::chat::PROVIDER,
    switchboard_channels::api::PROVIDER,
];

/// Every sender: the providers' APIs from the configuration, and the mailbox.
pub fn senders(app: &App) -> Senders {
    let mailbox = Arc::new(MailboxEgress(Mailbox::new(
        app.db.clone(),
        app.nats.clone(),
        app.topology.mailbox(),
    )));
    MAILBOX_PROVIDERS.into_iter().fold(
        Channels::of(app).senders(&app.config),
        |senders, provider| senders.with(provider, mailbox.clone()),
    )
}

fn task(app: &App) -> Task {
    let stage = DeliverStage::new(
        DeliveryLedger::new(app.db.clone(), DELIVERY_LEASE),
        senders(app),
        app.topology.clone(),
    )
    .with_links_of(&app.config);
    app.batch_stage_task(stage)
}
