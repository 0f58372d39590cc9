//! A stage's handler slots, and the progress acks that keep a message ours while it is
//! handled or parked.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures::future::join_all;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Wake;
use crate::shutdown::Shutdown;

/// A handler slot of the stage's semaphore: held while the handler runs, given back while
/// the message waits.
pub(super) struct Slots {
    pub held: Option<OwnedSemaphorePermit>,
    /// A parked message's place among those resumed (see `resume`), held with its slot.
    pub resumed: Option<OwnedSemaphorePermit>,
    pub semaphore: Arc<Semaphore>,
    /// How many parked messages may hold or wait for a slot at once (half the slots).
    pub resume: Arc<Semaphore>,
    pub shutdown: Shutdown,
    pub ack_wait: Duration,
}

impl Slots {
    /// Slots of the same semaphore, holding none: for a message that settles apart from its
    /// batch (it takes a slot again only to run its handler after a wait).
    pub fn unheld(&self) -> Slots {
        Slots {
            held: None,
            resumed: None,
            semaphore: self.semaphore.clone(),
            resume: self.resume.clone(),
            shutdown: self.shutdown.clone(),
            ack_wait: self.ack_wait,
        }
    }

    /// Park a waiting message for `delay`, or until `wake` fires: its slot given back, progress
    /// acks keeping it ours, then a slot taken again. False if shutdown came first: the message
    /// was handed back to the stream (JetStream counts that as a delivery).
    pub async fn park(
        &mut self,
        msg: &jetstream::Message,
        delay: Duration,
        wake: Option<Wake>,
    ) -> bool {
        self.held = None;
        self.resumed = None;
        // The handler may have run for up to a third of `ack_wait` since its last progress ack.
        let _ = msg.ack_with(AckKind::Progress).await;
        let this = [msg];
        let woken = async {
            match wake {
                Some(wake) => wake.fired().await,
                None => std::future::pending().await,
            }
        };
        let wait = async {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = woken => {}
            }
        };
        let slept = tokio::select! {
            _ = with_progress(&this, self.ack_wait, wait) => true,
            _ = self.shutdown.wait() => false,
        };
        // Progress acks go on while it queues: with every slot busy the wait can be long.
        let slot = async {
            let resumed = self.resume.clone().acquire_owned().await;
            let held = self.semaphore.clone().acquire_owned().await;
            (resumed, held)
        };
        let resumed = slept
            && tokio::select! {
                (r, p) = with_progress(&this, self.ack_wait, slot) => {
                    self.resumed = Some(r.expect("semaphore never closed"));
                    self.held = Some(p.expect("semaphore never closed"));
                    true
                }
                _ = self.shutdown.wait() => false,
            };
        if !resumed {
            let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
        }
        resumed
    }
}

/// Run `fut`, telling the server every third of `ack_wait` that `msgs` are still being worked
/// on, so they are not redelivered meanwhile.
pub(super) async fn with_progress<T>(
    msgs: &[&jetstream::Message],
    ack_wait: Duration,
    fut: impl Future<Output = T>,
) -> T {
    tokio::pin!(fut);
    let mut ticker = tokio::time::interval((ack_wait / 3).max(Duration::from_millis(100)));
    ticker.tick().await;
    loop {
        tokio::select! {
            r = &mut fut => break r,
            _ = ticker.tick() => {
                join_all(msgs.iter().map(|m| m.ack_with(AckKind::Progress))).await;
            }
        }
    }
}
