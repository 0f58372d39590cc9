//! Takeovers: an operator steps into a person's conversation with an agent, and hands it back.
//!
//! The state lives in `switchboard.takeovers`, one open row a session at most, so it holds
//! across restarts and every gateway and dispatcher replica alike:
//! - [`take_over`] opens it (journal `takeover`). From then on dispatch holds the session's
//!   turns instead of calling the agent (done, no reply, `turns.held_by`, journal `held`).
//! - The operator's replies are turns with a given answer, published by the gateway like a
//!   message the agent starts: they keep their place after the replies before them and are
//!   sent once through the delivery ledger ([`record_reply`]: journal `operator_reply`).
//! - [`hand_back`] ends it (journal `handback`). When a turn it held came after the operator's
//!   last reply, the person is waiting: the hand-back draws one turn input for the agent
//!   (`handback_input`), which the gateway publishes and marks ([`mark_published`]).
//! - The next prompt of the session tells the agent what was said meanwhile ([`briefing`]);
//!   the commit of that turn marks the takeover briefed.
//!
//! A hold and a hand-back never cross: the hold takes the open row `FOR SHARE`, the hand-back
//! updates it, so a turn is either held before the hand-back counts what it held, or finds
//! the takeover ended and goes to the agent.
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::arrival::{ArrivalCounter, ArrivalError};
use crate::config::SessionScope;
use crate::proto::{InboundMessage, Person, SessionHandedBack, SessionTakenOver};
use crate::runtime::{Output, Runtime};
use crate::status::{SessionEventKind, SessionStatus};

/// `scheduled` on the turn input a hand-back gives the agent.
pub const HANDBACK_INPUT: &str = "handback";

/// The instruction a hand-back's turn carries (the prompt says it is Switchboard's).
pub const HANDBACK_TEXT: &str = "The operator handed this conversation back to you. Answer what \
the person wrote after the operator's last reply (the end of the handover above).";

/// The most messages of a takeover the next prompt retells (the latest ones).
pub const BRIEFING_MESSAGES: i64 = 40;

/// One takeover, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Takeover {
    pub id: Uuid,
    pub session_id: Uuid,
    pub taken_by: String,
    pub started_at: DateTime<Utc>,
    pub last_reply_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub ended_by: Option<String>,
    /// The turn input the hand-back gave the agent (none: nothing was left unanswered).
    pub handback_input: Option<Uuid>,
    pub handback_published_at: Option<DateTime<Utc>>,
}

/// What [`take_over`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakenOver {
    /// Taken now, by the caller.
    Now(Takeover),
    /// The caller had it already: unchanged.
    Already(Takeover),
    /// Someone else has it.
    HeldByOther(Takeover),
    NoSuchSession,
    /// Terminated sessions take no more turns: there is nothing to take.
    Terminated,
    /// A session everyone who writes to the agent shares (`session.scope = "main"`): an
    /// operator's reply would go to one of many people.
    Shared,
}

/// What [`hand_back`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandedBack {
    /// Ended now; `held` turns were held meanwhile.
    Now {
        takeover: Takeover,
        held: i64,
    },
    /// Ended before (by whoever it says): unchanged.
    Before(Takeover),
    /// The session was never taken over.
    NotTaken,
    NoSuchSession,
}

/// The session as a takeover needs it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SessionParty {
    pub id: Uuid,
    pub person_id: String,
    pub person_type: String,
    pub agent_name: String,
    pub agent_identity: String,
    pub scope_key: String,
    pub status: SessionStatus,
}

impl SessionParty {
    pub fn shared(&self) -> bool {
        self.scope_key == SessionScope::Main.key(&self.agent_name, "", "", "", "")
    }
}

/// The session `id`'s person and agent.
pub async fn party(db: &PgPool, id: Uuid) -> Result<Option<SessionParty>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, person_id, person_type, agent_name, agent_identity, scope_key, status
           FROM switchboard.sessions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await
}

const COLUMNS: &str = "id, session_id, taken_by, started_at, last_reply_at, ended_at, ended_by, \
                       handback_input, handback_published_at";

/// The session's open takeover.
pub async fn open(db: &PgPool, session: Uuid) -> Result<Option<Takeover>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM switchboard.takeovers WHERE session_id = $1 AND ended_at IS NULL"
    ))
    .bind(session)
    .fetch_optional(db)
    .await
}

/// The session's latest takeover, open or ended.
pub async fn latest(db: &PgPool, session: Uuid) -> Result<Option<Takeover>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM switchboard.takeovers WHERE session_id = $1
          ORDER BY started_at DESC, id DESC LIMIT 1"
    ))
    .bind(session)
    .fetch_optional(db)
    .await
}

async fn journal(
    tx: &mut Transaction<'_, Postgres>,
    session: Uuid,
    key: String,
    kind: SessionEventKind,
    detail: serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO switchboard.session_events (id, session_id, key, kind, detail)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (key) DO NOTHING",
    )
    .bind(Uuid::now_v7())
    .bind(session)
    .bind(key)
    .bind(kind)
    .bind(detail)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Take session `session` over as `by` (an operator's login or an API key's owner).
pub async fn take_over(db: &PgPool, session: Uuid, by: &str) -> Result<TakenOver, sqlx::Error> {
    let Some(party) = party(db, session).await? else {
        return Ok(TakenOver::NoSuchSession);
    };
    if party.status == SessionStatus::Terminated {
        return Ok(TakenOver::Terminated);
    }
    if party.shared() {
        return Ok(TakenOver::Shared);
    }
    // Twice at most: a takeover handed back between the insert and the look finds none open.
    let mut attempts = 0;
    let (mut tx, taken) = loop {
        attempts += 1;
        let mut tx = db.begin().await?;
        let taken: Option<Takeover> = sqlx::query_as(&format!(
            "INSERT INTO switchboard.takeovers (id, session_id, taken_by) VALUES ($1, $2, $3)
             ON CONFLICT (session_id) WHERE ended_at IS NULL DO NOTHING
             RETURNING {COLUMNS}"
        ))
        .bind(Uuid::now_v7())
        .bind(session)
        .bind(by)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(taken) = taken {
            break (tx, taken);
        }
        tx.rollback().await?;
        match open(db, session).await? {
            Some(t) if t.taken_by == by => return Ok(TakenOver::Already(t)),
            Some(t) => return Ok(TakenOver::HeldByOther(t)),
            None if attempts < 2 => continue,
            // Taken and handed back again while we looked: whoever had it last is named.
            None => {
                return Ok(match latest(db, session).await? {
                    Some(t) => TakenOver::HeldByOther(t),
                    None => TakenOver::NoSuchSession,
                });
            }
        }
    };
    journal(
        &mut tx,
        session,
        format!("takeover:{}", taken.id),
        SessionEventKind::Takeover,
        serde_json::json!({"takeover_id": taken.id, "by": by}),
    )
    .await?;
    tx.commit().await?;
    Ok(TakenOver::Now(taken))
}

/// The operator `by` replied during `takeover` with message `message` (once per message).
pub async fn record_reply(
    db: &PgPool,
    takeover: &Takeover,
    by: &str,
    message: Uuid,
) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    sqlx::query("UPDATE switchboard.takeovers SET last_reply_at = now() WHERE id = $1")
        .bind(takeover.id)
        .execute(&mut *tx)
        .await?;
    journal(
        &mut tx,
        takeover.session_id,
        format!("operator_reply:{message}"),
        SessionEventKind::OperatorReply,
        serde_json::json!({"takeover_id": takeover.id, "by": by, "message_id": message}),
    )
    .await?;
    tx.commit().await
}

/// Hand session `session` back to its agent, as `by`.
pub async fn hand_back(db: &PgPool, session: Uuid, by: &str) -> Result<HandedBack, sqlx::Error> {
    let mut tx = db.begin().await?;
    // Waits for a hold in flight (it has the row FOR SHARE); a hold after this finds it ended.
    let ended: Option<Takeover> = sqlx::query_as(&format!(
        "UPDATE switchboard.takeovers SET ended_at = now(), ended_by = $2
          WHERE session_id = $1 AND ended_at IS NULL
         RETURNING {COLUMNS}"
    ))
    .bind(session)
    .bind(by)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(mut ended) = ended else {
        tx.rollback().await?;
        if party(db, session).await?.is_none() {
            return Ok(HandedBack::NoSuchSession);
        }
        return Ok(match latest(db, session).await? {
            Some(t) => HandedBack::Before(t),
            None => HandedBack::NotTaken,
        });
    };
    // The turns it held, and whether any came after the operator's last reply: then the person
    // waits for an answer, and the agent gets one turn to give it.
    let (held, unanswered): (i64, bool) = sqlx::query_as(
        "SELECT count(*), coalesce(bool_or(created_at > $2), false)
           FROM switchboard.turns WHERE held_by = $1",
    )
    .bind(ended.id)
    .bind(ended.last_reply_at.unwrap_or(ended.started_at))
    .fetch_one(&mut *tx)
    .await?;
    if unanswered {
        let input = Uuid::now_v7();
        sqlx::query("UPDATE switchboard.takeovers SET handback_input = $2 WHERE id = $1")
            .bind(ended.id)
            .bind(input)
            .execute(&mut *tx)
            .await?;
        ended.handback_input = Some(input);
    }
    journal(
        &mut tx,
        session,
        format!("handback:{}", ended.id),
        SessionEventKind::Handback,
        serde_json::json!({
            "takeover_id": ended.id, "by": by, "held": held, "agent_answers": unanswered,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(HandedBack::Now {
        takeover: ended,
        held,
    })
}

/// The hand-back's turn input of `takeover` was published.
pub async fn mark_published(db: &PgPool, takeover: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE switchboard.takeovers SET handback_published_at = now()
          WHERE id = $1 AND handback_published_at IS NULL",
    )
    .bind(takeover)
    .execute(db)
    .await?;
    Ok(())
}

/// Hand-backs whose turn input was drawn and not marked published `after` it ended (the
/// gateway that ended them died before publishing): published again, once (the session stage
/// knows the input by its provider message id).
pub async fn unpublished(
    db: &PgPool,
    older_than: std::time::Duration,
    limit: i64,
) -> Result<Vec<Takeover>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM switchboard.takeovers
          WHERE handback_input IS NOT NULL AND handback_published_at IS NULL
            AND ended_at < now() - $1 * interval '1 millisecond'
          ORDER BY ended_at LIMIT $2"
    ))
    .bind(older_than.as_millis() as f64)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// What sending as the operator or publishing a hand-back's turn ran into.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("the session is gone")]
    NoSession,
    /// Nothing to answer on: the person never wrote in this session.
    #[error("the person has not written in this session yet")]
    NoChannel,
    #[error("numbering among the person's messages: {0}")]
    Arrival(#[from] ArrivalError),
    #[error("publishing: {0}")]
    Publish(#[source] anyhow::Error),
}

/// The way back to the session's person: their latest message in it.
#[derive(Debug, sqlx::FromRow)]
struct Route {
    channel: String,
    provider: String,
    sender: String,
    recipient: Option<String>,
}

async fn route_of(db: &PgPool, session: Uuid) -> Result<Route, PublishError> {
    let route: Option<Route> = sqlx::query_as(
        "SELECT channel, metadata->>'provider' AS provider, metadata->>'sender' AS sender,
                metadata->>'recipient' AS recipient
           FROM switchboard.messages
          WHERE session_id = $1 AND direction = 'inbound'
            AND metadata ? 'sender' AND metadata ? 'provider'
          ORDER BY id DESC LIMIT 1",
    )
    .bind(session)
    .fetch_optional(db)
    .await?;
    route.ok_or(PublishError::NoChannel)
}

/// What an input from the session's person carries besides its address and number.
struct FromPerson {
    /// Its id (and correlation id).
    id: Uuid,
    /// Its provider message id: the session stage keeps one turn of it however often it is
    /// published (a re-publish may get another number).
    key: String,
    text: String,
    outbound_text: String,
    operator: String,
    scheduled: String,
}

/// Publish `input` as the session's person's, from their address on the channel they last wrote
/// on in it, numbered after what they sent before it (as a wake-up's input), so its turn comes
/// after theirs. The channel it went on.
async fn publish_from_person(
    db: &PgPool,
    runtime: &Runtime,
    arrivals: &ArrivalCounter,
    session: Uuid,
    input: FromPerson,
) -> Result<String, PublishError> {
    let party = party(db, session).await?.ok_or(PublishError::NoSession)?;
    let route = route_of(db, session).await?;
    let arrival = arrivals
        .number_input(&route.channel, &route.sender, &input.key)
        .await?;
    let message = InboundMessage {
        id: input.id.to_string(),
        channel: route.channel.clone(),
        provider: route.provider,
        sender: route.sender,
        recipient: route.recipient.unwrap_or_default(),
        text: input.text,
        provider_message_id: input.key.clone(),
        arrival_seq: arrival.seq,
        arrival_epoch: arrival.epoch,
        received_at_ms: crate::now_ms(),
        correlation_id: input.id.to_string(),
        agent: party.agent_name,
        scheduled: input.scheduled,
        asserted: Some(Person {
            person_id: party.person_id,
            person_type: party.person_type,
            ..Default::default()
        }),
        outbound_text: input.outbound_text,
        operator: input.operator,
        ..Default::default()
    };
    let output = Output::new(
        runtime
            .topology
            .inbound_from(&message.channel, &message.sender),
        format!("{}:{}.{}", input.key, arrival.epoch, arrival.seq),
        &message,
    )
    .correlated(message.correlation_id.clone());
    runtime
        .publish("takeover", &output)
        .await
        .map_err(PublishError::Publish)?;
    Ok(route.channel)
}

/// Send `text` to the takeover's person as `by`'s reply `message`: a turn whose answer is given
/// (like a message the agent starts), so the delivery ledger sends it once, numbered among the
/// person's messages so the operator's replies go out in the order they were written.
/// Journalled once. Returns the channel it goes on.
pub async fn send_as_operator(
    db: &PgPool,
    runtime: &Runtime,
    arrivals: &ArrivalCounter,
    takeover: &Takeover,
    by: &str,
    message: Uuid,
    text: String,
) -> Result<String, PublishError> {
    record_reply(db, takeover, by, message).await?;
    let input = FromPerson {
        id: message,
        key: format!("operator:{message}"),
        text: String::new(),
        outbound_text: text,
        operator: by.to_string(),
        scheduled: String::new(),
    };
    publish_from_person(db, runtime, arrivals, takeover.session_id, input).await
}

/// Publish the agent's turn of a hand-back that left the person's last messages unanswered
/// (nothing when it left none), and mark it published.
pub async fn publish_handback(
    db: &PgPool,
    runtime: &Runtime,
    arrivals: &ArrivalCounter,
    takeover: &Takeover,
) -> Result<(), PublishError> {
    let Some(id) = takeover.handback_input else {
        return Ok(());
    };
    let input = FromPerson {
        id,
        key: format!("handback:{}", takeover.id),
        text: HANDBACK_TEXT.to_string(),
        outbound_text: String::new(),
        operator: String::new(),
        scheduled: HANDBACK_INPUT.to_string(),
    };
    publish_from_person(db, runtime, arrivals, takeover.session_id, input).await?;
    mark_published(db, takeover.id).await?;
    Ok(())
}

/// What a takeover owes once taken, published again (each once) when the take is repeated, so
/// a caller whose first answer was lost gets them out: the public event, and the person's
/// notice (`[escalation] takeover_notice`) when one is configured.
pub async fn publish_taken(
    db: &PgPool,
    runtime: &Runtime,
    arrivals: &ArrivalCounter,
    takeover: &Takeover,
    notice: &str,
) -> Result<(), PublishError> {
    announce_taken(db, runtime, takeover).await?;
    let notice = notice.trim();
    if !notice.is_empty() {
        let message = Uuid::new_v5(&takeover.id, b"takeover-notice");
        let by = takeover.taken_by.as_str();
        send_as_operator(db, runtime, arrivals, takeover, by, message, notice.into()).await?;
    }
    Ok(())
}

/// Announce on the public stream that `takeover` began (`session.taken_over`), once however
/// often it is announced (its id is the dedupe id): a caller that lost the first answer and asks
/// again announces it again.
async fn announce_taken(
    db: &PgPool,
    runtime: &Runtime,
    takeover: &Takeover,
) -> Result<(), PublishError> {
    let party = party(db, takeover.session_id)
        .await?
        .ok_or(PublishError::NoSession)?;
    let event = SessionTakenOver {
        takeover_id: takeover.id.to_string(),
        session_id: takeover.session_id.to_string(),
        person_id: party.person_id,
        agent_name: party.agent_name,
        agent_identity: party.agent_identity,
        taken_by: takeover.taken_by.clone(),
        taken_at_ms: takeover.started_at.timestamp_millis(),
    };
    let name = "session.taken_over";
    let out = Output::new(
        runtime.topology.event(name),
        format!("{name}:{}", takeover.id),
        &event,
    );
    runtime
        .publish("takeover", &out)
        .await
        .map_err(PublishError::Publish)
}

/// Announce that `takeover` ended (`session.handed_back`), once however often it is announced.
pub async fn announce_handed_back(
    db: &PgPool,
    runtime: &Runtime,
    takeover: &Takeover,
) -> Result<(), PublishError> {
    let party = party(db, takeover.session_id)
        .await?
        .ok_or(PublishError::NoSession)?;
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.turns WHERE held_by = $1")
        .bind(takeover.id)
        .fetch_one(db)
        .await?;
    let event = SessionHandedBack {
        takeover_id: takeover.id.to_string(),
        session_id: takeover.session_id.to_string(),
        person_id: party.person_id,
        agent_name: party.agent_name,
        agent_identity: party.agent_identity,
        handed_back_by: takeover.ended_by.clone().unwrap_or_default(),
        held,
        agent_answers: takeover.handback_input.is_some(),
        taken_at_ms: takeover.started_at.timestamp_millis(),
        handed_back_at_ms: takeover.ended_at.map_or(0, |t| t.timestamp_millis()),
    };
    let name = "session.handed_back";
    let out = Output::new(
        runtime.topology.event(name),
        format!("{name}:{}", takeover.id),
        &event,
    );
    runtime
        .publish("takeover", &out)
        .await
        .map_err(PublishError::Publish)
}

/// What the next prompt retells of the takeovers the agent was not told of yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Briefing {
    /// One line a message, oldest first, per takeover.
    pub text: String,
    /// The latest end among them: the commit marks every takeover ended by then briefed.
    pub through: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct Ended {
    taken_by: String,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
    ended_by: String,
}

#[derive(sqlx::FromRow)]
struct Said {
    direction: String,
    message: String,
    operator: Option<String>,
}

/// The first (`last`: the last) UUIDv7 of millisecond `at`: message ids are UUIDv7 drawn when
/// the message was taken (in) or answered (out), so a range of them is a span of time however
/// late the log wrote them.
fn v7_bound(at: DateTime<Utc>, last: bool) -> Uuid {
    let ms = at.timestamp_millis().max(0) as u64;
    let mut bytes = if last { [0xFF; 16] } else { [0; 16] };
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    Uuid::from_bytes(bytes)
}

/// What was said in session `session` while operators had it, for the takeovers that ended
/// and were not told to the agent yet (none: `None`).
pub async fn briefing(db: &PgPool, session: Uuid) -> Result<Option<Briefing>, sqlx::Error> {
    let ended: Vec<Ended> = sqlx::query_as(
        "SELECT taken_by, started_at, ended_at, coalesce(ended_by, '') AS ended_by
           FROM switchboard.takeovers
          WHERE session_id = $1 AND ended_at IS NOT NULL AND briefed_at IS NULL
          ORDER BY started_at",
    )
    .bind(session)
    .fetch_all(db)
    .await?;
    let Some(through) = ended.iter().map(|t| t.ended_at).max() else {
        return Ok(None);
    };
    let at = |t: DateTime<Utc>| t.format("%Y-%m-%d %H:%M UTC").to_string();
    let mut text = String::new();
    for t in &ended {
        text.push_str(&format!(
            "{} had the conversation from {} to {} (handed back by {}); you were not called.\n",
            t.taken_by,
            at(t.started_at),
            at(t.ended_at),
            t.ended_by,
        ));
        // The latest ones, oldest first.
        let said: Vec<Said> = sqlx::query_as(
            "SELECT direction, message, operator FROM (
                 SELECT id, direction, message, metadata->>'operator' AS operator
                   FROM switchboard.messages
                  WHERE session_id = $1 AND id >= $2 AND id <= $3
                  ORDER BY id DESC LIMIT $4) last
              ORDER BY id",
        )
        .bind(session)
        .bind(v7_bound(t.started_at, false))
        .bind(v7_bound(t.ended_at, true))
        .bind(BRIEFING_MESSAGES)
        .fetch_all(db)
        .await?;
        for line in said {
            let who = match (line.direction.as_str(), line.operator) {
                ("inbound", _) => "person".to_string(),
                (_, Some(op)) => format!("operator {op}"),
                _ => "you".to_string(),
            };
            text.push_str(&format!("{who}: {}\n", line.message));
        }
    }
    Ok(Some(Briefing { text, through }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_of_time_bounds_the_uuidv7_drawn_in_it() {
        let at = DateTime::from_timestamp_millis(1_795_000_000_123).unwrap();
        let drawn = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_795_000_000,
            123_456_789,
        ));
        assert!(v7_bound(at, false) <= drawn && drawn <= v7_bound(at, true));
        let later = DateTime::from_timestamp_millis(1_795_000_000_124).unwrap();
        assert!(drawn < v7_bound(later, false));
    }
}
