//! Links a person proves: "link my phone +61…" in chat (or through the API) texts a one-time
//! code to that number; the code texted back from it, or typed where it was asked for, within
//! its lifetime records the link, with its audit row. Nothing links on a claim alone.
//!
//! Identify answers these messages itself: the answer becomes the message's `outbound_text`,
//! so the turn is answered without the agent, in its place among the session's replies, on the
//! channel the person used (and logged both ways). The code goes out as a message Switchboard
//! starts to the claimed number (an `InboundMessage` on `in.sms` with the code as its
//! `outbound_text`), through the delivery ledger like any reply.
//!
//! Which way the link goes: a number nobody's directory or lookup knows (`phone:+61…`) becomes
//! the claimant's; a number the directory gives someone makes the claimant (when identify made
//! their id from a channel: `user:ana`) that person, since whoever holds the phone can already
//! text as them. A number that is someone else's and a claimant the directory knows are left
//! to an operator (`switchboard people link`).
//!
//! A code proves one claim: while one person's code to a number works, nobody else is sent one
//! to it (the phone's holder never has two people's codes to tell apart), a new code differs
//! from every working code of the number and of the claimant, and a code given back completes
//! the one claim whose code it is (compared in constant time), never another one waiting. The
//! code SMS is the operator's template (`sms_template`) with the code and its lifetime: nothing
//! the claimant chose (their name) is ever texted to the number, nor told to it once linked.
//!
//! Limits: a code lives `code_ttl_s`; a claim survives `max_wrong_codes` wrong codes; a person
//! may ask for, and a number be sent, `codes_per_hour` codes an hour; at most
//! `max_codes_per_hour` codes go out an hour in all, and `max_codes_per_hour_by_prefix` to the
//! numbers of a prefix. Every decision is written with what it did in one transaction (under
//! the links' write lock, so replicas count alike), keyed by the message, so a redelivered
//! message gets the same answer and neither a second code nor a second wrong try.
use sqlx::{PgPool, Postgres, Transaction};
use switchboard_kit::config::{ContactKind, LinkProofConfig, SmsSender};
use switchboard_kit::proto::{InboundMessage, Person};
use uuid::Uuid;

use crate::links::{IdentityLinks, LinkError, Request};
use crate::{IdentityError, IdentityResolver, contact_of, normalize_phone};

mod ask;
mod code;

pub use ask::{Ask, parse};
pub use code::CODE_DIGITS;
use code::{new_code, same_code};

/// What came of a message that asked for a code or gave one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofOutcome {
    CodeSent,
    NotAPhone,
    AlreadyYours,
    /// The number is someone else's (or the link would break the links' rules).
    Taken,
    TooManyCodes,
    /// Another person's code to the number still works: none is sent for this one.
    PhoneBusy,
    /// The codes sent in the last hour, in all or to the number's prefix, are at their cap.
    CodesCapped,
    NoSmsProvider,
    Linked,
    WrongCode,
    /// A wrong code that was a claim's last try.
    UsedUp,
    Expired,
}

impl ProofOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ProofOutcome::CodeSent => "code_sent",
            ProofOutcome::NotAPhone => "not_a_phone",
            ProofOutcome::AlreadyYours => "already_yours",
            ProofOutcome::Taken => "taken",
            ProofOutcome::TooManyCodes => "too_many_codes",
            ProofOutcome::PhoneBusy => "phone_busy",
            ProofOutcome::CodesCapped => "codes_capped",
            ProofOutcome::NoSmsProvider => "no_sms_provider",
            ProofOutcome::Linked => "linked",
            ProofOutcome::WrongCode => "wrong_code",
            ProofOutcome::UsedUp => "used_up",
            ProofOutcome::Expired => "expired",
        }
    }
}

/// The code to text, as a message Switchboard starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeMessage {
    /// The claim's id, also the message's.
    pub id: Uuid,
    pub phone: String,
    pub text: String,
}

/// What Switchboard answers the person, and the code to text, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub outcome: ProofOutcome,
    pub text: String,
    pub code: Option<CodeMessage>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    #[error("link proofs: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("link proofs: {0}")]
    Link(#[from] LinkError),
    #[error("stored proof answer {0:?} is of no known outcome")]
    Corrupt(String),
}

/// A claim waiting for its code (or settled).
#[derive(Debug)]
struct Claim {
    id: Uuid,
    claimant_id: String,
    claimant_name: String,
    phone: String,
    code: String,
    live: bool,
}

impl Claim {
    /// The claimant as people read them: their name, else their id.
    fn who(&self) -> &str {
        if self.claimant_name.is_empty() {
            &self.claimant_id
        } else {
            &self.claimant_name
        }
    }
}

/// Which way a proved link goes.
enum Plan {
    AlreadyYours,
    Taken,
    Link { from: String, to: String },
}

pub struct LinkProofs {
    db: PgPool,
    links: IdentityLinks,
    config: LinkProofConfig,
    default_region: String,
    /// Who texts the codes; none: no SMS provider is set up.
    sms: Option<SmsSender>,
    /// Proofs wait for each other here, not on the links' lock: a waiter there holds a pool
    /// connection, and the holder reads through the pool ([`Self::plan`]).
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl LinkProofs {
    pub fn new(
        db: PgPool,
        links: IdentityLinks,
        config: LinkProofConfig,
        default_region: String,
        sms: Option<SmsSender>,
    ) -> Self {
        Self {
            db,
            links,
            config,
            default_region,
            sms,
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    }

    /// Switchboard's answer to `inbound` (from `person`, resolved and links followed) when it
    /// asks for a code or gives one; `None` when it is the agent's to answer (a code nobody
    /// waits for, a number asked for from the phone itself).
    pub async fn answer(
        &self,
        resolver: &IdentityResolver,
        inbound: &InboundMessage,
        person: &Person,
        ask: Ask,
    ) -> Result<Option<Answer>, ProofError> {
        let Ok(message) = inbound.id.parse::<Uuid>() else {
            return Ok(None);
        };
        let from_phone = ContactKind::of_channel(&inbound.channel) == ContactKind::Phone;
        // Whose claims a code is for: the number it was texted from, or the person who asked.
        let waiting_for = match (&ask, from_phone) {
            // A phone cannot vouch for another number by asking from itself.
            (Ask::LinkPhone(_), true) => return Ok(None),
            (Ask::LinkPhone(_), false) => None,
            (Ask::Code(_), true) => Some(Waiting::Phone(
                normalize_phone(&inbound.sender, &self.default_region)
                    .map_err(IdentityError::from)?,
            )),
            (Ask::Code(_), false) => Some(Waiting::Claimant(person.person_id.clone())),
        };
        if let Some(w) = &waiting_for
            && !self.any_recent_claim(w).await?
        {
            return Ok(None);
        }
        // One writer of links and claims at a time: a proof checks and links in one go.
        let _turn = self.one_at_a_time.lock().await;
        let mut tx = self.links.begin().await?;
        if let Some(stored) = self.stored_answer(&mut tx, message).await? {
            return Ok(Some(stored));
        }
        let answer = match (ask, waiting_for) {
            (Ask::LinkPhone(number), _) => Some(
                self.request(&mut tx, resolver, message, person, &number)
                    .await?,
            ),
            (Ask::Code(code), Some(waiting)) => {
                self.confirm(&mut tx, resolver, &waiting, &code, &inbound.channel)
                    .await?
            }
            (Ask::Code(_), None) => None,
        };
        let Some(answer) = answer else {
            return Ok(None);
        };
        sqlx::query!(
            "INSERT INTO switchboard.link_proof_answers (message_id, claim_id, outcome, answer)
             VALUES ($1, $2, $3, $4)",
            message,
            answer.code.as_ref().map(|c| c.id),
            answer.outcome.as_str(),
            answer.text,
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        metrics::counter!("sb_identity_link_proofs_total", "outcome" => answer.outcome.as_str())
            .increment(1);
        tracing::info!(outcome = answer.outcome.as_str(), "link proof");
        Ok(Some(answer))
    }

    /// The message Switchboard starts to text `code`, answering `asked` (whose agent sends it).
    pub fn code_inbound(&self, code: &CodeMessage, asked: &InboundMessage) -> InboundMessage {
        // No provider (switched off since the code was asked for): deliver refuses it visibly.
        let sms = self.sms.clone().unwrap_or_default();
        InboundMessage {
            id: code.id.to_string(),
            channel: "sms".into(),
            provider: sms.provider,
            sender: code.phone.clone(),
            recipient: sms.from,
            // Not the clock: a redelivered request must rebuild the same message.
            received_at_ms: asked.received_at_ms,
            correlation_id: code.id.to_string(),
            agent: asked.agent.clone(),
            outbound_text: code.text.clone(),
            ..Default::default()
        }
    }

    async fn any_recent_claim(&self, waiting: &Waiting) -> Result<bool, sqlx::Error> {
        let pending = ClaimStatus::Pending;
        match waiting {
            Waiting::Phone(phone) => {
                sqlx::query_scalar!(
                    r#"SELECT EXISTS (SELECT 1 FROM switchboard.link_claims
                                       WHERE phone = $1 AND status = $2
                                         AND created_at > now() - interval '1 day') AS "any!""#,
                    phone,
                    pending as ClaimStatus,
                )
                .fetch_one(&self.db)
                .await
            }
            Waiting::Claimant(claimant) => {
                sqlx::query_scalar!(
                    r#"SELECT EXISTS (SELECT 1 FROM switchboard.link_claims
                                       WHERE claimant_id = $1 AND status = $2
                                         AND created_at > now() - interval '1 day') AS "any!""#,
                    claimant,
                    pending as ClaimStatus,
                )
                .fetch_one(&self.db)
                .await
            }
        }
    }

    async fn stored_answer(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        message: Uuid,
    ) -> Result<Option<Answer>, ProofError> {
        let row = sqlx::query!(
            "SELECT claim_id, outcome, answer FROM switchboard.link_proof_answers
              WHERE message_id = $1",
            message,
        )
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let (claim, outcome, text) = (row.claim_id, row.outcome, row.answer);
        let outcome = ALL_OUTCOMES
            .into_iter()
            .find(|o| o.as_str() == outcome)
            .ok_or(ProofError::Corrupt(outcome))?;
        let code = match claim {
            Some(id) => {
                let claim = sqlx::query_as!(
                    Claim,
                    r#"SELECT id, claimant_id, claimant_name, phone, code,
                              expires_at > now() AS "live!"
                         FROM switchboard.link_claims WHERE id = $1"#,
                    id,
                )
                .fetch_one(&mut **tx)
                .await?;
                Some(self.code_message(&claim))
            }
            None => None,
        };
        Ok(Some(Answer {
            outcome,
            text,
            code,
        }))
    }

    async fn request(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        resolver: &IdentityResolver,
        message: Uuid,
        person: &Person,
        number: &str,
    ) -> Result<Answer, ProofError> {
        let Ok(phone) = normalize_phone(number, &self.default_region) else {
            return Ok(said(
                ProofOutcome::NotAPhone,
                format!(
                    "{number} is not a phone number I can text. Write it with its country code, \
                     e.g. +61 412 345 678."
                ),
            ));
        };
        if self.sms.is_none() {
            return Ok(said(
                ProofOutcome::NoSmsProvider,
                "Linking a phone needs an SMS provider, and none is set up here. An operator \
                 can link it (switchboard people link)."
                    .into(),
            ));
        }
        match self.plan(resolver, &phone, &person.person_id).await? {
            Plan::AlreadyYours => return Ok(already_yours(&phone)),
            Plan::Taken => return Ok(taken(&phone)),
            Plan::Link { .. } => {}
        }
        let recent = sqlx::query!(
            r#"SELECT count(*) FILTER (WHERE claimant_id = $1) AS "by_person!",
                      count(*) FILTER (WHERE phone = $2) AS "to_phone!"
                 FROM switchboard.link_claims
                WHERE (claimant_id = $1 OR phone = $2)
                  AND created_at > now() - interval '1 hour'"#,
            person.person_id,
            phone,
        )
        .fetch_one(&mut **tx)
        .await?;
        if recent.by_person.max(recent.to_phone) >= i64::from(self.config.codes_per_hour) {
            return Ok(said(
                ProofOutcome::TooManyCodes,
                "Too many codes were asked for in the last hour. Try again later.".into(),
            ));
        }
        // The phone's holder must never have two people's codes to tell apart.
        let someone_elses = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM switchboard.link_claims
                               WHERE phone = $1 AND claimant_id <> $2 AND status = $3
                                 AND expires_at > now()) AS "busy!""#,
            phone,
            person.person_id,
            ClaimStatus::Pending as ClaimStatus,
        )
        .fetch_one(&mut **tx)
        .await?;
        if someone_elses {
            return Ok(said(
                ProofOutcome::PhoneBusy,
                format!(
                    "Someone else was just sent a code for {phone}. Try again in {}.",
                    self.lifetime()
                ),
            ));
        }
        if let Some(cap) = self.cap_reached(tx, &phone).await? {
            metrics::counter!("sb_identity_link_codes_capped_total", "cap" => cap).increment(1);
            tracing::warn!(cap, "link codes at their hourly cap: none sent");
            return Ok(said(
                ProofOutcome::CodesCapped,
                "Too many codes are being sent right now. Try again later.".into(),
            ));
        }
        // A new code replaces the one asked for before.
        sqlx::query!(
            "UPDATE switchboard.link_claims SET status = $3, settled_at = now()
              WHERE claimant_id = $1 AND phone = $2 AND status = $4",
            person.person_id,
            phone,
            ClaimStatus::Superseded as ClaimStatus,
            ClaimStatus::Pending as ClaimStatus,
        )
        .execute(&mut **tx)
        .await?;
        let code = self.unused_code(tx, &phone, &person.person_id).await?;
        let claim = sqlx::query_as!(
            Claim,
            r#"INSERT INTO switchboard.link_claims
                   (id, requested_by, claimant_id, claimant_name, phone, code, expires_at)
               VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))
               RETURNING id, claimant_id, claimant_name, phone, code, true AS "live!""#,
            Uuid::now_v7(),
            message,
            person.person_id,
            person.name,
            phone,
            code,
            self.config.code_ttl_s as f64,
        )
        .fetch_one(&mut **tx)
        .await?;
        Ok(Answer {
            outcome: ProofOutcome::CodeSent,
            text: format!(
                "I sent a code to {phone}. Text it back from that phone, or type it here, \
                 within {}.",
                self.lifetime()
            ),
            code: Some(self.code_message(&claim)),
        })
    }

    async fn confirm(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        resolver: &IdentityResolver,
        waiting: &Waiting,
        code: &str,
        channel: &str,
    ) -> Result<Option<Answer>, ProofError> {
        let pending = ClaimStatus::Pending;
        let claims = match waiting {
            Waiting::Phone(phone) => {
                sqlx::query_as!(
                    Claim,
                    r#"SELECT id, claimant_id, claimant_name, phone, code,
                              expires_at > now() AS "live!"
                         FROM switchboard.link_claims
                        WHERE phone = $1 AND status = $2
                          AND created_at > now() - interval '1 day'
                        ORDER BY created_at DESC FOR UPDATE"#,
                    phone,
                    pending as ClaimStatus,
                )
                .fetch_all(&mut **tx)
                .await?
            }
            Waiting::Claimant(claimant) => {
                sqlx::query_as!(
                    Claim,
                    r#"SELECT id, claimant_id, claimant_name, phone, code,
                              expires_at > now() AS "live!"
                         FROM switchboard.link_claims
                        WHERE claimant_id = $1 AND status = $2
                          AND created_at > now() - interval '1 day'
                        ORDER BY created_at DESC FOR UPDATE"#,
                    claimant,
                    pending as ClaimStatus,
                )
                .fetch_all(&mut **tx)
                .await?
            }
        };
        let live: Vec<&Claim> = claims.iter().filter(|c| c.live).collect();
        if live.is_empty() {
            return Ok(claims.first().map(|c| {
                said(
                    ProofOutcome::Expired,
                    format!(
                        "That code has expired. Ask for a new one: link my phone {}",
                        c.phone
                    ),
                )
            }));
        }
        // Every live claim compared, each in constant time: the answer's timing says nothing
        // of which code, or how much of one, was right.
        let matching: Vec<&Claim> = live
            .iter()
            .copied()
            .filter(|c| same_code(&c.code, code))
            .collect();
        let claim = match matching.as_slice() {
            [] => return self.wrong_code(tx, &live).await.map(Some),
            [claim] => *claim,
            // Codes are made unique among working ones; claims from before that (or written by
            // hand) that share a code cannot tell whose it is: it completes none of them.
            several => return self.void(tx, several).await.map(Some),
        };
        let answer = match self
            .plan(resolver, &claim.phone, &claim.claimant_id)
            .await?
        {
            Plan::AlreadyYours => already_yours(&claim.phone),
            Plan::Taken => taken(&claim.phone),
            Plan::Link { from, to } => {
                let how = if matches!(waiting, Waiting::Phone(_)) {
                    "texted back from it".to_string()
                } else {
                    format!("typed on {channel}")
                };
                let reason = format!("proved: a code sent to {} was {how}", claim.phone);
                let request = Request {
                    from: &from,
                    to: &to,
                    actor: &claim.claimant_id,
                    reason: &reason,
                };
                // Texted back, the answer goes to the phone: the claimant's own words (their
                // name) are not Switchboard's to text to it.
                let whom = match waiting {
                    Waiting::Phone(_) => "the account that asked for the code",
                    Waiting::Claimant(_) => claim.who(),
                };
                match self.links.link_in(tx, request).await {
                    Ok(_) => said(
                        ProofOutcome::Linked,
                        format!(
                            "Linked: {} and {whom} are one person here now, and the \
                             conversation goes on across both.",
                            claim.phone,
                        ),
                    ),
                    Err(LinkError::Database(e)) => return Err(e.into()),
                    // A cycle or a chain too long: as good as someone else's.
                    Err(e) => {
                        tracing::info!(error = %e, "a proved link breaks the links' rules");
                        taken(&claim.phone)
                    }
                }
            }
        };
        let status = if answer.outcome == ProofOutcome::Taken {
            ClaimStatus::UsedUp
        } else {
            ClaimStatus::Linked
        };
        sqlx::query!(
            "UPDATE switchboard.link_claims SET status = $2, settled_at = now() WHERE id = $1",
            claim.id,
            status as ClaimStatus,
        )
        .execute(&mut **tx)
        .await?;
        Ok(Some(answer))
    }

    /// A wrong code counts against every live claim it could have been for.
    async fn wrong_code(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        live: &[&Claim],
    ) -> Result<Answer, ProofError> {
        let ids: Vec<Uuid> = live.iter().map(|c| c.id).collect();
        let left = sqlx::query!(
            r#"UPDATE switchboard.link_claims
                  SET wrong_codes = wrong_codes + 1,
                      status = CASE WHEN wrong_codes + 1 > $2 THEN $3 ELSE status END,
                      settled_at = CASE WHEN wrong_codes + 1 > $2 THEN now() END
                WHERE id = ANY($1)
                RETURNING $2 - wrong_codes AS "tries!", phone"#,
            &ids,
            self.config.max_wrong_codes as i32,
            ClaimStatus::UsedUp as ClaimStatus,
        )
        .fetch_all(&mut **tx)
        .await?;
        let (tries, phone) = left
            .into_iter()
            .map(|l| (l.tries, l.phone))
            .max()
            .unwrap_or_default();
        Ok(if tries >= 0 {
            said(
                ProofOutcome::WrongCode,
                format!(
                    "That code is not right. {} more {} before it stops working.",
                    tries + 1,
                    if tries == 0 { "try" } else { "tries" }
                ),
            )
        } else {
            said(
                ProofOutcome::UsedUp,
                format!(
                    "That code is not right, and that was the last try. Ask for a new one: \
                     link my phone {phone}"
                ),
            )
        })
    }

    /// Which way linking `phone` and `claimant` goes, as things stand.
    async fn plan(
        &self,
        resolver: &IdentityResolver,
        phone: &str,
        claimant: &str,
    ) -> Result<Plan, ProofError> {
        let phone_id = resolver
            .resolve_address("sms", phone, None)
            .await?
            .person_id;
        let phone_person = self.links.canonical(&phone_id).await?;
        let claimant = self.links.canonical(claimant).await?;
        if phone_person == claimant {
            return Ok(Plan::AlreadyYours);
        }
        if phone_id == phone_person && phone_id.starts_with("phone:") {
            return Ok(Plan::Link {
                from: phone_id,
                to: claimant,
            });
        }
        let in_directory = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM switchboard.people WHERE person_id = $1) AS "known!""#,
            claimant,
        )
        .fetch_one(&self.db)
        .await?;
        Ok(if contact_of(&claimant).is_some() && !in_directory {
            Plan::Link {
                from: claimant,
                to: phone_person,
            }
        } else {
            Plan::Taken
        })
    }

    /// The code SMS: the operator's template, with the code and its lifetime and nothing else.
    fn code_message(&self, claim: &Claim) -> CodeMessage {
        CodeMessage {
            id: claim.id,
            phone: claim.phone.clone(),
            text: self
                .config
                .sms_template
                .replace("{lifetime}", &self.lifetime())
                .replace("{code}", &claim.code),
        }
    }

    /// Which hourly cap on codes sent (`"global"`, `"prefix"`) a code to `phone` would break.
    async fn cap_reached(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        phone: &str,
    ) -> Result<Option<&'static str>, sqlx::Error> {
        // Every claim is one code sent (a redelivered request finds its claim, sends none).
        let sent_since = |prefix: &str| {
            sqlx::query_scalar!(
                r#"SELECT count(*) AS "sent!" FROM switchboard.link_claims
                    WHERE created_at > now() - interval '1 hour' AND starts_with(phone, $1)"#,
                prefix.to_string(),
            )
        };
        let global = self.config.max_codes_per_hour;
        if global > 0 && sent_since("").fetch_one(&mut **tx).await? >= i64::from(global) {
            return Ok(Some("global"));
        }
        for (prefix, &cap) in &self.config.max_codes_per_hour_by_prefix {
            if phone.starts_with(prefix.as_str())
                && sent_since(prefix).fetch_one(&mut **tx).await? >= i64::from(cap)
            {
                return Ok(Some("prefix"));
            }
        }
        Ok(None)
    }

    /// A fresh code that no working claim to `phone` or of `claimant` has: a code given back
    /// then names one claim.
    async fn unused_code(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        phone: &str,
        claimant: &str,
    ) -> Result<String, sqlx::Error> {
        let in_use = sqlx::query_scalar!(
            "SELECT code FROM switchboard.link_claims
              WHERE (phone = $1 OR claimant_id = $2) AND status = $3 AND expires_at > now()",
            phone,
            claimant,
            ClaimStatus::Pending as ClaimStatus,
        )
        .fetch_all(&mut **tx)
        .await?;
        // A handful of working codes among a million: the first draw is almost always free.
        Ok(std::iter::repeat_with(new_code)
            .find(|c| !in_use.contains(c))
            .expect("an endless supply of codes"))
    }

    /// A code several claims share completes none: each of them is over.
    async fn void(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        claims: &[&Claim],
    ) -> Result<Answer, ProofError> {
        let ids: Vec<Uuid> = claims.iter().map(|c| c.id).collect();
        sqlx::query!(
            "UPDATE switchboard.link_claims SET status = $2, settled_at = now()
              WHERE id = ANY($1)",
            &ids,
            ClaimStatus::UsedUp as ClaimStatus,
        )
        .execute(&mut **tx)
        .await?;
        tracing::warn!(
            claims = ids.len(),
            "a code several claims share links nothing"
        );
        Ok(said(
            ProofOutcome::UsedUp,
            "That code was sent for more than one request, so it links nothing. Ask for a new \
             one."
                .into(),
        ))
    }

    fn lifetime(&self) -> String {
        let s = self.config.code_ttl_s;
        match s {
            1 => "a second".into(),
            60 => "a minute".into(),
            s if s % 60 == 0 => format!("{} minutes", s / 60),
            s => format!("{s} seconds"),
        }
    }
}

/// Whose claims a code may be for.
enum Waiting {
    /// Texted from this number (E.164).
    Phone(String),
    /// Typed by this person, where they asked.
    Claimant(String),
}

/// A link claim (`switchboard.link_claims.status`): `pending` until its code is proved
/// (`linked`, or `used_up` when the number turned out to be someone else's), it ran out of
/// tries (`used_up`), or a newer code replaced it (`superseded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
enum ClaimStatus {
    Pending,
    Linked,
    UsedUp,
    Superseded,
}

const ALL_OUTCOMES: [ProofOutcome; 12] = [
    ProofOutcome::CodeSent,
    ProofOutcome::NotAPhone,
    ProofOutcome::AlreadyYours,
    ProofOutcome::Taken,
    ProofOutcome::TooManyCodes,
    ProofOutcome::PhoneBusy,
    ProofOutcome::CodesCapped,
    ProofOutcome::NoSmsProvider,
    ProofOutcome::Linked,
    ProofOutcome::WrongCode,
    ProofOutcome::UsedUp,
    ProofOutcome::Expired,
];

fn said(outcome: ProofOutcome, text: String) -> Answer {
    Answer {
        outcome,
        text,
        code: None,
    }
}

fn already_yours(phone: &str) -> Answer {
    said(
        ProofOutcome::AlreadyYours,
        format!("{phone} is already linked to you."),
    )
}

fn taken(phone: &str) -> Answer {
    said(
        ProofOutcome::Taken,
        format!(
            "{phone} belongs to someone else here, so it cannot be linked by code. An operator \
             can link it (switchboard people link)."
        ),
    )
}
