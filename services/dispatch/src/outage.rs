//! The runner's outage, as a session lives it: while the agent's runner is down (the
//! [`crate::breaker`] says so, or the call just found it), the session's turn gives its call
//! slot back and waits for the runner, the session says `waiting`, and the person is told
//! once per outage.
use std::time::Duration;

use switchboard_kit::proto::Turn;
use switchboard_kit::status::{
    SessionEventKind, SessionStatus, runner_down_notice_id, waiting_key,
};
use switchboard_kit::{Attempt, Wake};

use crate::journal::Journal;
use crate::lease::CallLease;
use crate::{DispatchError, TurnDispatcher};

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
            if let Some((notice, true)) = marked {
                let entry = Journal::new(
                    session,
                    waiting_key(session, notice),
                    SessionEventKind::Waiting,
                    turn.seq,
                    serde_json::json!({ "notice_id": notice }),
                );
                Journal::write(&mut tx, &[entry]).await?;
            }
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
        let notice = runner_down_notice_id(session, turn.seq);
        let text = self.config.runner_down_notice.clone();
        DispatchError::RunnerDown {
            after,
            notice: vec![self.notice_output(turn, session, notice, text, true)],
            recovery,
            unrecorded: true,
        }
    }
}
