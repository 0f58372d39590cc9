//! The session stage over what one pull brought: the turns of many senders opened by set-based
//! statements in one transaction (one commit per batch instead of one per message).
//!
//! The batch places only what it can place without changing a single message's rules: at most
//! one message per sender, per session and per provider id (a second one would need the first
//! one's outcome). Everything else (a message that must wait for its sender's earlier one, one
//! that cannot be routed, the second message of a session) goes through the one-message path,
//! [`SessionStore::open_turn`], after the batch: same statements, same waits.
//!
//! Locks are taken in one order by every transaction that takes more than one: the people's
//! erasure locks (shared, sorted), the senders' arrival cursors (sorted by channel and sender),
//! then the sessions (sorted by scope key and agent). A one-message transaction takes one of
//! each in the same order, so batches and single messages never wait on each other in a cycle.
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use switchboard_kit::config::AgentConfig;
use switchboard_kit::lifecycle::{ResetPolicy, reset_command};
use switchboard_kit::proto::{IdentifiedMessage, InboundMessage, Person};
use switchboard_kit::status::{ResetReason, SessionEventKind};
use uuid::Uuid;

use crate::{
    Opened, OpenedTurn, Placement, SessionError, SessionStore, arrival_seq, place_arrival,
};

/// A message ready to be placed: everything the statements need, worked out before they run.
pub(crate) struct Placing<'a> {
    pub msg: &'a IdentifiedMessage,
    pub inbound: &'a InboundMessage,
    pub person: &'a Person,
    pub agent: &'a AgentConfig,
    pub inbound_id: Uuid,
    pub scope_key: String,
    /// The person + identity's key (summary, memory), shared by the identity's variants.
    pub memory_key: String,
    /// The dedupe key of the turn: the provider's message id, else the message id.
    pub provider_id: String,
    pub policy: ResetPolicy,
    pub person_spoke: bool,
    pub received: DateTime<Utc>,
    /// It has waited longer than the gap timeout for its sender's earlier message.
    pub overdue: bool,
}

impl Placing<'_> {
    /// The keys no two messages of one batch may share. One message per person, too: whether
    /// a person was forgotten after their message was received is read for the batch by
    /// person.
    fn keys(&self) -> [String; 4] {
        let sender = if self.inbound.arrival_seq > 0 {
            format!(
                "sender\u{0}{}\u{0}{}",
                self.inbound.channel, self.inbound.sender
            )
        } else {
            // Unnumbered messages never wait for each other; the session key below still keeps
            // two of one session apart.
            format!("unnumbered\u{0}{}", self.inbound_id)
        };
        [
            sender,
            format!("session\u{0}{}\u{0}{}", self.scope_key, self.agent.name),
            format!(
                "provider\u{0}{}\u{0}{}",
                self.inbound.channel, self.provider_id
            ),
            format!("person\u{0}{}", self.person.person_id),
        ]
    }
}

/// One column of a set-based statement: `f` of each message of `batch` that `of` names.
fn column<T>(batch: &[Placing<'_>], of: &[usize], f: impl Fn(&Placing<'_>) -> T) -> Vec<T> {
    of.iter().map(|&i| f(&batch[i])).collect()
}

/// Split a batch into the messages placed together (at most one per sender, session and
/// provider id: the first in the batch's order) and the indexes of the rest.
pub(crate) fn split_batch<'a>(
    all: Vec<(usize, Placing<'a>)>,
) -> (Vec<(usize, Placing<'a>)>, Vec<usize>) {
    let mut taken = HashSet::new();
    let mut together = Vec::with_capacity(all.len());
    let mut alone = Vec::new();
    for (i, p) in all {
        let keys = p.keys();
        if keys.iter().any(|k| taken.contains(k)) {
            alone.push(i);
        } else {
            taken.extend(keys);
            together.push((i, p));
        }
    }
    (together, alone)
}

#[derive(sqlx::FromRow)]
struct CursorRow {
    channel: String,
    sender: String,
    epoch: i64,
    last_seq: i64,
    /// Made by this statement (no sender row before it).
    inserted: bool,
}

#[derive(sqlx::FromRow)]
struct SessionRow {
    id: Uuid,
    scope_key: String,
    agent_name: String,
    /// Before this message.
    last_message_at: Option<DateTime<Utc>>,
    workspace_path: Option<String>,
    /// The message's place in the session.
    seq: i64,
}

#[derive(sqlx::FromRow)]
struct PlacedRow {
    session_id: Uuid,
    seq: i64,
    inbound_id: Uuid,
    reset: Option<String>,
    channel: String,
    provider_message_id: String,
}

impl SessionStore {
    /// [`SessionStore::open_turn`] for every message of `batch` at once (no two share a sender,
    /// a session or a provider id: [`split_batch`]), in one transaction: one outcome per
    /// message, in order. A statement that fails fails the whole batch (nothing written).
    pub(crate) async fn open_turns(
        &self,
        batch: &[Placing<'_>],
    ) -> Result<Vec<Opened>, SessionError> {
        let n = batch.len();
        let mut opened: Vec<Option<Opened>> = (0..n).map(|_| None).collect();
        let mut tx = self.db.begin().await?;

        // Erasures: a person forgotten after their message was received is not written.
        let mut people: Vec<String> = batch
            .iter()
            .map(|p| p.person.person_id.clone())
            .filter(|id| !id.is_empty())
            .collect();
        people.sort();
        people.dedup();
        switchboard_kit::forgotten::lock_shared_all(&mut *tx, &people).await?;
        let received: Vec<(String, DateTime<Utc>)> = batch
            .iter()
            .filter(|p| !p.person.person_id.is_empty())
            .map(|p| (p.person.person_id.clone(), p.received))
            .collect();
        let forgotten = switchboard_kit::forgotten::forgotten_among(&mut *tx, &received).await?;
        for (i, p) in batch.iter().enumerate() {
            if forgotten.contains(&p.person.person_id) {
                opened[i] = Some(Opened::Forgotten);
            }
        }

        self.take_arrivals(&mut tx, batch, &mut opened).await?;

        // The messages that go on; a retry of one placed before keeps its turn (and moves no
        // session: the unique provider id refuses a concurrent second placing, which fails the
        // batch and sends each message down the one-message path).
        let going: Vec<usize> = (0..n).filter(|&i| opened[i].is_none()).collect();
        if going.is_empty() {
            tx.commit().await?;
            return Ok(opened.into_iter().map(Option::unwrap).collect());
        }
        let placed: Vec<PlacedRow> = sqlx::query_as(
            "SELECT t.session_id, t.seq, t.inbound_id, t.reset, t.channel, t.provider_message_id
               FROM switchboard.turns t
               JOIN unnest($1::text[], $2::text[]) AS u(channel, provider_message_id)
                 ON t.channel = u.channel AND t.provider_message_id = u.provider_message_id",
        )
        .bind(column(batch, &going, |p| p.inbound.channel.clone()))
        .bind(column(batch, &going, |p| p.provider_id.clone()))
        // Planned for each batch's own arrays: a plan cached while `turns` was nearly empty
        // would scan every turn for good (docs/data-path-cost.md, "Plans cached on empty tables").
        .persistent(false)
        .fetch_all(&mut *tx)
        .await?;
        let placed: HashMap<(String, String), PlacedRow> = placed
            .into_iter()
            .map(|r| ((r.channel.clone(), r.provider_message_id.clone()), r))
            .collect();
        let mut fresh = Vec::with_capacity(going.len());
        for i in going {
            let p = &batch[i];
            match placed.get(&(p.inbound.channel.clone(), p.provider_id.clone())) {
                Some(r) => {
                    opened[i] = Some(Opened::Turn(OpenedTurn {
                        session_id: r.session_id,
                        seq: r.seq,
                        inbound_id: r.inbound_id,
                        scope_key: p.scope_key.clone(),
                        memory_key: p.memory_key.clone(),
                        reset: r.reset.as_deref().and_then(ResetReason::parse),
                    }))
                }
                None => fresh.push(i),
            }
        }
        if fresh.is_empty() {
            tx.commit().await?;
            return Ok(opened.into_iter().map(Option::unwrap).collect());
        }

        // Each new message's session, found or made, locked in key order and moved on in the
        // same statement: its next seq taken, the person's activity noted. What a reset is
        // decided by is the session as it was before (`OLD`).
        let sessions: Vec<SessionRow> = self.take_sessions(&mut tx, batch, &fresh).await?;
        let by_key: HashMap<(String, String), SessionRow> = sessions
            .into_iter()
            .map(|r| ((r.scope_key.clone(), r.agent_name.clone()), r))
            .collect();
        let mut new = Vec::with_capacity(fresh.len());
        for i in fresh {
            let p = &batch[i];
            let session = by_key
                .get(&(p.scope_key.clone(), p.agent.name.clone()))
                .ok_or(SessionError::Incomplete("session row"))?;
            // Only the person's own messages reset a session or count as its activity.
            let reset = if !p.person_spoke {
                None
            } else if p.policy.commands && reset_command(&p.inbound.text).is_some() {
                Some(ResetReason::Command)
            } else {
                p.policy.due(session.last_message_at, p.received)
            };
            if session.workspace_path.is_none() && !self.workspace.root.is_empty() {
                self.make_workspace(&mut tx, session.id, &p.memory_key)
                    .await?;
            }
            new.push((i, session.id, session.seq, reset));
        }
        self.write_turns(&mut tx, batch, &new).await?;
        for (i, session_id, seq, reset) in new {
            let p = &batch[i];
            opened[i] = Some(Opened::Turn(OpenedTurn {
                session_id,
                seq,
                inbound_id: p.inbound_id,
                scope_key: p.scope_key.clone(),
                memory_key: p.memory_key.clone(),
                reset,
            }));
        }
        tx.commit().await?;
        Ok(opened
            .into_iter()
            .map(|o| o.expect("every message of the batch has an outcome"))
            .collect())
    }

    /// Lock the numbered senders' arrival cursors (in channel and sender order) and move each
    /// to its message when that message is the sender's next; a message that must wait is
    /// marked [`Opened::Waiting`], and a cursor made only for it is removed again (as the
    /// one-message path's rollback would).
    async fn take_arrivals(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        batch: &[Placing<'_>],
        opened: &mut [Option<Opened>],
    ) -> Result<(), SessionError> {
        let numbered: Vec<usize> = (0..batch.len())
            .filter(|&i| opened[i].is_none() && batch[i].inbound.arrival_seq > 0)
            .collect();
        if numbered.is_empty() {
            return Ok(());
        }
        let cursors: Vec<CursorRow> = sqlx::query_as(
            "INSERT INTO switchboard.arrival_cursors (channel, sender, epoch, last_seq)
             SELECT channel, sender, epoch, 0
               FROM unnest($1::text[], $2::text[], $3::int8[]) AS u(channel, sender, epoch)
              ORDER BY channel, sender
             ON CONFLICT (channel, sender) DO UPDATE SET updated_at = now()
             RETURNING channel, sender, epoch, last_seq, (xmax = 0) AS inserted",
        )
        .bind(column(batch, &numbered, |p| p.inbound.channel.clone()))
        .bind(column(batch, &numbered, |p| p.inbound.sender.clone()))
        .bind(column(batch, &numbered, |p| p.inbound.arrival_epoch))
        .fetch_all(&mut **tx)
        .await?;
        let cursors: HashMap<(String, String), CursorRow> = cursors
            .into_iter()
            .map(|c| ((c.channel.clone(), c.sender.clone()), c))
            .collect();
        let (mut moves, mut unmade) = (Vec::new(), Vec::new());
        for i in numbered {
            let inbound = batch[i].inbound;
            let cursor = cursors
                .get(&(inbound.channel.clone(), inbound.sender.clone()))
                .ok_or(SessionError::Incomplete("arrival cursor"))?;
            let seq = arrival_seq(inbound);
            let at = (cursor.epoch, cursor.last_seq);
            let placement = place_arrival(at, inbound.arrival_epoch, seq, batch[i].overdue);
            crate::arrival::count_placement(inbound, placement, seq, at.1);
            match placement {
                Placement::Wait => {
                    opened[i] = Some(Opened::Waiting);
                    if cursor.inserted {
                        unmade.push(i);
                    }
                }
                Placement::Late => {}
                Placement::Next | Placement::SkipGap => moves.push(i),
            }
        }
        if !unmade.is_empty() {
            sqlx::query(
                "DELETE FROM switchboard.arrival_cursors a
                  USING unnest($1::text[], $2::text[]) AS u(channel, sender)
                  WHERE a.channel = u.channel AND a.sender = u.sender",
            )
            .bind(column(batch, &unmade, |p| p.inbound.channel.clone()))
            .bind(column(batch, &unmade, |p| p.inbound.sender.clone()))
            .persistent(false)
            .execute(&mut **tx)
            .await?;
        }
        if !moves.is_empty() {
            sqlx::query(
                "UPDATE switchboard.arrival_cursors a SET epoch = u.epoch, last_seq = u.seq
                   FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[])
                        AS u(channel, sender, epoch, seq)
                  WHERE a.channel = u.channel AND a.sender = u.sender",
            )
            .bind(column(batch, &moves, |p| p.inbound.channel.clone()))
            .bind(column(batch, &moves, |p| p.inbound.sender.clone()))
            .bind(column(batch, &moves, |p| p.inbound.arrival_epoch))
            .bind(column(batch, &moves, |p| arrival_seq(p.inbound)))
            // As the placed turns' lookup: a plan cached on an empty table scans it whole.
            .persistent(false)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    /// The sessions of `fresh` (indexes into `batch`), made where there is none yet, each
    /// locked in key order and moved on by one message in one statement: `seq` is the message's
    /// place, `last_message_at` what the session had before (a message the agent started does
    /// not count as the person's activity).
    async fn take_sessions(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        batch: &[Placing<'_>],
        fresh: &[usize],
    ) -> Result<Vec<SessionRow>, SessionError> {
        let ids: Vec<Uuid> = fresh.iter().map(|_| Uuid::now_v7()).collect();
        let spoke_at: Vec<Option<DateTime<Utc>>> =
            column(batch, fresh, |p| p.person_spoke.then_some(p.received));
        let rows = sqlx::query_as(
            "INSERT INTO switchboard.sessions
                (id, person_type, person_id, agent_identity, agent_name, engine_type, channel,
                 scope_key, memory_key, last_message_at, next_seq)
             SELECT *, 2 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                                     $6::text[], $7::text[], $8::text[], $9::text[],
                                     $10::timestamptz[])
                 AS u(id, person_type, person_id, agent_identity, agent_name, engine_type,
                      channel, scope_key, memory_key, spoke_at)
              ORDER BY scope_key, agent_name
             ON CONFLICT (scope_key, agent_name) DO UPDATE
                SET next_seq = sessions.next_seq + 1, updated_at = now(),
                    last_message_at = GREATEST(sessions.last_message_at,
                                               EXCLUDED.last_message_at)
             RETURNING id, scope_key, agent_name, OLD.last_message_at AS last_message_at,
                       workspace_path, NEW.next_seq - 1 AS seq",
        )
        .bind(&ids)
        .bind(column(batch, fresh, |p| p.person.person_type.clone()))
        .bind(column(batch, fresh, |p| p.person.person_id.clone()))
        .bind(column(batch, fresh, |p| p.agent.identity.clone()))
        .bind(column(batch, fresh, |p| p.agent.name.clone()))
        .bind(column(batch, fresh, |p| p.agent.engine.clone()))
        .bind(column(batch, fresh, |p| p.inbound.channel.clone()))
        .bind(column(batch, fresh, |p| p.scope_key.clone()))
        .bind(column(batch, fresh, |p| p.memory_key.clone()))
        .bind(&spoke_at)
        .fetch_all(&mut **tx)
        .await?;
        Ok(rows)
    }

    /// Write the new turns with their journal entries, in one statement. `new`: (message index,
    /// session, seq, reset).
    async fn write_turns(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        batch: &[Placing<'_>],
        new: &[(usize, Uuid, i64, Option<ResetReason>)],
    ) -> Result<(), SessionError> {
        let sessions: Vec<Uuid> = new.iter().map(|&(_, s, ..)| s).collect();
        let seq_col: Vec<i64> = new.iter().map(|&(_, _, seq, _)| seq).collect();
        let entries: Vec<String> = new
            .iter()
            .map(|&(i, _, _, reset)| {
                let inbound = batch[i].inbound;
                serde_json::json!({
                    "message_id": inbound.id,
                    "channel": inbound.channel,
                    "provider": inbound.provider,
                    "agent_started": !batch[i].person_spoke,
                    "reset": reset.map(ResetReason::as_str),
                })
                .to_string()
            })
            .collect();
        // An agent that joins waiting messages reads them from the turn's payload.
        let payloads: Vec<Option<Vec<u8>>> = new
            .iter()
            .map(|&(i, ..)| {
                let p = &batch[i];
                p.agent
                    .queue_mode
                    .joins()
                    .then(|| prost::Message::encode_to_vec(p.msg))
            })
            .collect();
        sqlx::query(
            "WITH turn AS (
                INSERT INTO switchboard.turns
                    (session_id, seq, inbound_id, channel, provider_message_id, reset, payload)
                SELECT * FROM unnest($1::uuid[], $2::int8[], $3::uuid[], $4::text[], $5::text[],
                                     $6::text[], $7::bytea[]))
             INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
             SELECT u.id, u.session_id, $9::text || ':' || u.session_id || ':' || u.seq, $9,
                    u.seq, u.detail::jsonb
               FROM unnest($8::uuid[], $1::uuid[], $2::int8[], $10::text[])
                    AS u(id, session_id, seq, detail)",
        )
        .bind(&sessions)
        .bind(&seq_col)
        .bind(
            new.iter()
                .map(|&(i, ..)| batch[i].inbound_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            new.iter()
                .map(|&(i, ..)| batch[i].inbound.channel.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            new.iter()
                .map(|&(i, ..)| batch[i].provider_id.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            new.iter()
                .map(|&(.., r)| r.map(|r| r.as_str().to_string()))
                .collect::<Vec<_>>(),
        )
        .bind(&payloads)
        .bind(new.iter().map(|_| Uuid::now_v7()).collect::<Vec<_>>())
        .bind(SessionEventKind::MessageIn)
        .bind(&entries)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}
