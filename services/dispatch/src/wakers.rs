//! Turns waiting in this process for their session's cursor to move or its call slot to be
//! freed (parked by the runtime, without a handler slot), woken the moment this process does
//! either, or the session watch sees another replica do it.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

#[derive(Default, Clone)]
pub(crate) struct Wakers(Arc<std::sync::Mutex<HashMap<Uuid, watch::Sender<u64>>>>);

impl Wakers {
    /// Register before checking the session, so a change between the check and the wait
    /// still wakes the turn.
    pub fn wait_on(&self, session: Uuid) -> WaitingTurn {
        let rx = self
            .0
            .lock()
            .unwrap()
            .entry(session)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        WaitingTurn {
            wakers: self.clone(),
            session,
            rx: Some(rx),
        }
    }

    pub fn wake(&self, session: Uuid) {
        if let Some(tx) = self.0.lock().unwrap().get(&session) {
            tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    fn waited_on(&self) -> Vec<Uuid> {
        self.0.lock().unwrap().keys().copied().collect()
    }

    /// Watch the sessions this process's turns wait on, with one query every `tick` for all
    /// of them, and wake a session's waiting turns when its cursor, its call slot or the
    /// slot's holder's liveness changed (or when first seen, as it may have changed before
    /// the watch saw it). A turn waiting behind a predecessor run by another replica learns
    /// of it here; one run by this process wakes it at once. So thousands of waiting turns
    /// cost one statement per tick, not one each. `db`: a pool the turns cannot use up.
    pub async fn watch_sessions(&self, db: &PgPool, tick: Duration) {
        type Seen = (i64, Option<Uuid>, bool);
        let mut seen: HashMap<Uuid, Seen> = HashMap::new();
        loop {
            tokio::time::sleep(tick).await;
            let waited_on = self.waited_on();
            if waited_on.is_empty() {
                seen.clear();
                continue;
            }
            let rows = match sqlx::query!(
                r#"SELECT s.id, s.last_seq, s.running_call,
                          (s.running_call IS NULL OR s.running_until < now()
                           OR NOT EXISTS (SELECT 1 FROM switchboard.dispatchers d
                                           WHERE d.id = s.running_by AND d.alive_until > now()))
                            AS "free!"
                     FROM switchboard.sessions s WHERE s.id = ANY($1)"#,
                &waited_on,
            )
            .fetch_all(db)
            .await
            {
                Ok(rows) => rows,
                Err(e) => {
                    // The waiting turns still re-check when their hold ends.
                    tracing::warn!(error = %e, "watching the waited-on sessions failed");
                    continue;
                }
            };
            let mut now = HashMap::with_capacity(rows.len());
            for row in rows {
                let state = (row.last_seq, row.running_call, row.free);
                if seen.get(&row.id) != Some(&state) {
                    self.wake(row.id);
                }
                now.insert(row.id, state);
            }
            seen = now;
        }
    }
}

/// One waiting turn's registration; the session's entry goes when its last waiter does.
pub(crate) struct WaitingTurn {
    wakers: Wakers,
    session: Uuid,
    rx: Option<watch::Receiver<u64>>,
}

impl WaitingTurn {
    /// Resolves at the session's first wake after the registration.
    pub async fn woken(mut self) {
        if let Some(rx) = self.rx.as_mut() {
            // The sender stays while a receiver does: an error cannot happen here.
            let _ = rx.changed().await;
        }
    }
}

impl Drop for WaitingTurn {
    fn drop(&mut self) {
        let mut map = self.wakers.0.lock().unwrap();
        drop(self.rx.take());
        if map
            .get(&self.session)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            map.remove(&self.session);
        }
    }
}
