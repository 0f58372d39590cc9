//! The runner's outage, as a session lives it: while the agent's runner is down (the
//! [`crate::breaker`] says so, or the call just found it), the session's turn gives its call
//! slot back and waits for the runner, the session says `waiting`, and the person is told
//! once per outage.
//!
//! In a session everyone shares (scope `main`) the turns queued behind the waiting one may be
//! other people's: each person whose turn waits there is told once per outage, under a notice
//! id of their own derived from the outage's ([`notice_for`]), so telling the head turn's
//! person and then their own queued turn is still one message.
use std::time::Duration;

use switchboard_kit::proto::Turn;
use switchboard_kit::status::{
    SessionEventKind, SessionStatus, runner_down_notice_id, waiting_key,
};
use switchboard_kit::{Attempt, Wake};
use uuid::Uuid;

use crate::journal::Journal;
use crate::lease::CallLease;
use crate::{DispatchError, TurnDispatcher};

/// The id of the notice telling a person of the outage `outage` (the session's
/// `waiting_notice`): the outage's own in a private session, and in a shared one, `person`'s
/// own within it.
pub(crate) fn notice_for(outage: Uuid, person: Option<&str>) -> Uuid {
    match person {
        Some(person) => Uuid::new_v5(&outage, format!("person:{person}").as_bytes()),
        None => outage,
    }
}

/// The person a turn is for.
fn person_of(turn: &Turn) -> &str {
    turn.message
        .as_ref()
        .and_then(|m| m.person.as_ref())
        .map_or("", |p| p.person_id.as_str())
}

impl TurnDispatcher {
    /// The turn waits for its agent's runner to come back (for `after`, or until `recovery`):
    /// the call slot is given back, the session says `waiting`, and the person is told, once
    /// per outage (the notice's id is kept until the session's next answer, so telling again
    /// is the same message).
    pub(crate) async fn wait_for_runner(
        &self,
        turn: &Turn,
        lease: &mut CallLease,
        after: Duration,
        recovery: Wake,
        attempt: &Attempt,
    ) -> DispatchError {
        let (session, call) = (lease.session, lease.call);
        let fresh = runner_down_notice_id(session, turn.seq);
        let person = lease.found.shared.then(|| person_of(turn));
        let marking = async {
            let mut tx = self.db.begin().await?;
            let marked = sqlx::query!(
                r#"UPDATE switchboard.sessions
                      SET running_call = NULL, running_by = NULL, running_until = NULL,
                          status = $4, waiting_since = COALESCE(waiting_since, now()),
                          waiting_notice = COALESCE(waiting_notice, $3)
                    WHERE id = $1 AND running_call = $2
                   RETURNING waiting_notice AS "notice!", waiting_notice = $3 AS "fresh!""#,
                session,
                call,
                fresh,
                SessionStatus::Waiting as SessionStatus,
            )
            .fetch_optional(&mut *tx)
            .await?
            .map(|m| (m.notice, m.fresh));
            // Journalled once per telling: per outage, and in a shared session per person.
            let marked = match marked {
                Some((outage, fresh)) if fresh || person.is_some() => {
                    let notice = notice_for(outage, person);
                    let written =
                        Journal::write(&mut tx, &[waiting_entry(session, turn, notice)]).await?;
                    Some((notice, written > 0))
                }
                other => other,
            };
            tx.commit().await?;
            // A dispatcher killed here recorded the wait and never told the person: the
            // turn's redelivery tells them (tests/tests/ordered_dispatch.rs).
            switchboard_kit::failpoint::crash_at("dispatch.wait_recorded");
            Ok::<_, sqlx::Error>(marked)
        };
        // A database that went down refuses connections, and the pool keeps trying until its
        // acquire timeout: the person is not kept waiting for that.
        let Some(marked) = self.database.unless_unreachable(marking).await else {
            return self.told_unrecorded(turn, lease, after, recovery);
        };
        let marked = match marked {
            Ok(marked) => marked,
            Err(e) if switchboard_kit::db::is_outage(&e) => {
                tracing::warn!(%session, error = %e, "could not mark the session waiting");
                return self.told_unrecorded(turn, lease, after, recovery);
            }
            Err(e) => {
                // Not waiting and nobody told: the turn is tried again soon (a database error
                // is transient), not once the runner is back, so that its person is told as
                // soon as the database can record it. The slot is given back by `finish`.
                tracing::warn!(%session, error = %e, "could not mark the session waiting");
                return DispatchError::Database(e);
            }
        };
        // Cleared by the statement above (or taken over by another call before it).
        lease.cleared();
        self.wakers.wake(session);
        let notice = match marked {
            // Told when the outage began for this session, or again after a redelivery (the
            // first telling may not have been published): the same notice either way.
            Some((notice, first)) if first || attempt.waits == 0 => {
                let text = self.config.runner_down_notice.clone();
                vec![self.notice_output(turn, session, notice, text, true)]
            }
            _ => Vec::new(),
        };
        metrics::counter!("sb_dispatch_turns_waiting_for_runner_total").increment(1);
        DispatchError::RunnerDown {
            after,
            notice,
            recovery,
            unrecorded: false,
        }
    }

    /// The turn waits for the runner, and the database cannot record it: the person is told
    /// anyway (a dispatcher killed before the database is back would otherwise tell nobody,
    /// and its leases hold the session for its liveness, by when the runner may be back).
    /// The notice carries the wait to the message log, which records it; its id is the one
    /// recording the wait later keeps, so telling again then is the same message. The turn
    /// tries again after `after`; the slot is given back in the background.
    pub(crate) fn told_unrecorded(
        &self,
        turn: &Turn,
        lease: &mut CallLease,
        after: Duration,
        recovery: Wake,
    ) -> DispatchError {
        let session = lease.session;
        lease.database_unreachable();
        tracing::warn!(%session, "the database is unreachable: telling the person the turn waits for the runner without recording it");
        metrics::counter!("sb_dispatch_waits_told_unrecorded_total").increment(1);
        // The id recording the wait later gives this outage (unless one was recorded before).
        let person = lease.found.shared.then(|| person_of(turn));
        let notice = notice_for(runner_down_notice_id(session, turn.seq), person);
        let text = self.config.runner_down_notice.clone();
        DispatchError::RunnerDown {
            after,
            notice: vec![self.notice_output(turn, session, notice, text, true)],
            recovery,
            unrecorded: true,
        }
    }

    /// A turn queued behind one that waits for the runner (the session's outage `outage`),
    /// in a session everyone shares: its person is told once per outage, and it waits as the
    /// turn ahead does, until the session moves. A delivery that parked before tells again
    /// only if the first telling may not have gone out (its entry was written by a delivery
    /// that then died), under the same id: sent once.
    pub(crate) async fn tell_queued_of_outage(
        &self,
        turn: &Turn,
        session: Uuid,
        person_id: &str,
        outage: Uuid,
        wake: Wake,
        attempt: &Attempt,
    ) -> DispatchError {
        let notice = notice_for(outage, Some(person_id));
        let written = async {
            let mut tx = self.db.begin().await?;
            let written = Journal::write(&mut tx, &[waiting_entry(session, turn, notice)]).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(written)
        };
        let written = match written.await {
            Ok(written) => written,
            Err(e) => return DispatchError::Database(e),
        };
        let notice = if written == 0 && attempt.waits > 0 {
            Vec::new()
        } else {
            metrics::counter!("sb_dispatch_queued_told_of_outage_total").increment(1);
            let text = self.config.runner_down_notice.clone();
            // Not after the answers of the turns ahead of it (other people's, waiting too).
            vec![self.notice_ahead_output(turn, session, notice, text)]
        };
        DispatchError::RunnerDown {
            after: Duration::from_millis(self.config.hold_timeout_ms),
            notice,
            recovery: wake,
            unrecorded: false,
        }
    }
}

/// The journal's `waiting` entry of a telling: which notice told whom (in a session everyone
/// shares, not necessarily the session's first person).
fn waiting_entry(session: Uuid, turn: &Turn, notice: Uuid) -> Journal {
    Journal::new(
        session,
        waiting_key(session, notice),
        SessionEventKind::Waiting,
        turn.seq,
        serde_json::json!({ "notice_id": notice, "person_id": person_of(turn) }),
    )
}
