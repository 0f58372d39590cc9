//! Requests of many concurrent tasks joined into one round trip (a group commit): each task
//! awaits its own answer as if it made the call alone, while one driver runs whatever has
//! queued up as one batch. No timer: while `lanes` batches are in flight the next requests
//! wait in the queue, so a batch grows with the load and a lone request goes at once.
//!
//! The batch function answers each request in the order given (one answer per request); how a
//! failed batch is answered (every request the error, or each run again alone) is its own
//! choice, since only it knows whether the requests can fail one by one.
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use tokio::sync::{Semaphore, mpsc, oneshot};

type BatchFn<Req, Resp> =
    dyn Fn(Vec<Req>) -> Pin<Box<dyn Future<Output = Vec<Resp>> + Send>> + Send + Sync;

/// The batch's driver went away before answering (its batch function panicked, or the
/// process is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the batch this request joined was not answered")]
pub struct Unanswered;

pub struct Coalescer<Req, Resp> {
    /// Started on first use, so a coalescer can be built outside a runtime.
    queue: OnceLock<mpsc::UnboundedSender<(Req, oneshot::Sender<Resp>)>>,
    run: Arc<BatchFn<Req, Resp>>,
    max_batch: usize,
    lanes: usize,
}

impl<Req: Send + 'static, Resp: Send + 'static> Coalescer<Req, Resp> {
    /// Batches of at most `max_batch` requests, at most `lanes` of them in flight at once.
    pub fn new<F, Fut>(max_batch: usize, lanes: usize, run: F) -> Self
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Resp>> + Send + 'static,
    {
        Self {
            queue: OnceLock::new(),
            run: Arc::new(move |batch| Box::pin(run(batch))),
            max_batch: max_batch.max(1),
            lanes: lanes.max(1),
        }
    }

    /// The answer to `request`, run in a batch with whatever else is waiting.
    pub async fn call(&self, request: Req) -> Result<Resp, Unanswered> {
        let (tx, rx) = oneshot::channel();
        self.queue
            .get_or_init(|| self.start())
            .send((request, tx))
            .map_err(|_| Unanswered)?;
        rx.await.map_err(|_| Unanswered)
    }

    fn start(&self) -> mpsc::UnboundedSender<(Req, oneshot::Sender<Resp>)> {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Req, oneshot::Sender<Resp>)>();
        let (run, max_batch) = (self.run.clone(), self.max_batch);
        let lanes = Arc::new(Semaphore::new(self.lanes));
        tokio::spawn(async move {
            loop {
                // A lane first: while every lane is busy, requests gather into the next batch.
                let lane = lanes.clone().acquire_owned().await.expect("never closed");
                let Some(first) = rx.recv().await else { return };
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match rx.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let run = run.clone();
                tokio::spawn(async move {
                    let (requests, answer_to): (Vec<Req>, Vec<_>) = batch.into_iter().unzip();
                    let answers = run(requests).await;
                    debug_assert_eq!(answers.len(), answer_to.len());
                    for (answer, to) in answers.into_iter().zip(answer_to) {
                        // The caller may have gone (its turn was cancelled): nothing to tell.
                        let _ = to.send(answer);
                    }
                    drop(lane);
                });
            }
        });
        tx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    #[tokio::test]
    async fn each_caller_gets_its_own_answer_and_concurrent_calls_share_a_batch() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let doubler = Arc::new(Coalescer::new(64, 1, move |batch: Vec<u32>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(batch.len());
                // Slow enough that the other callers queue behind the first batch.
                tokio::time::sleep(Duration::from_millis(20)).await;
                batch.into_iter().map(|n| n * 2).collect::<Vec<_>>()
            }
        }));
        let calls: Vec<_> = (0..50u32)
            .map(|n| {
                let doubler = doubler.clone();
                tokio::spawn(async move { (n, doubler.call(n).await.unwrap()) })
            })
            .collect();
        for call in calls {
            let (n, doubled) = call.await.unwrap();
            assert_eq!(doubled, n * 2);
        }
        let sizes = sizes.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 50);
        assert!(
            sizes.len() < 50 && sizes.iter().any(|&s| s > 1),
            "50 concurrent calls ran one at a time: {sizes:?}"
        );
    }

    #[tokio::test]
    async fn a_batch_never_exceeds_its_bound() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let echo = Arc::new(Coalescer::new(4, 1, move |batch: Vec<u32>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(batch.len());
                tokio::time::sleep(Duration::from_millis(5)).await;
                batch
            }
        }));
        let calls: Vec<_> = (0..20u32)
            .map(|n| {
                let echo = echo.clone();
                tokio::spawn(async move { echo.call(n).await.unwrap() })
            })
            .collect();
        for (n, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.unwrap(), n as u32);
        }
        assert!(sizes.lock().unwrap().iter().all(|&s| s <= 4));
    }

    #[tokio::test]
    async fn a_panicking_batch_answers_unanswered_not_a_hang() {
        let broken = Coalescer::new(8, 1, |_batch: Vec<u32>| async {
            panic!("the batch function failed");
            #[allow(unreachable_code)]
            Vec::<u32>::new()
        });
        assert!(broken.call(1).await.is_err());
        // The driver lives on: the lane of the panicked batch was given back.
        assert!(broken.call(2).await.is_err());
    }
}
