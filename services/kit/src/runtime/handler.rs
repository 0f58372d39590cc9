//! What a stage's handler sees and answers: the input's [`Attempt`], the [`Output`]s to
//! publish, and the [`StageError`] that says how to retry, park (`Defer`, `Wait` with a
//! [`Wake`]), or give up; the [`Stage`] and [`BatchStage`] traits a worker implements.
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::join_all;

use crate::settle::GiveUp;
use crate::stage::StageSpec;

/// Header carrying the protobuf message type of the payload.
pub const HEADER_TYPE: &str = "Sb-Type";
/// Header carrying the correlation id, from ingress to attempt.
pub const HEADER_CORRELATION: &str = "Sb-Correlation-Id";

/// One attempt at handling a message: what the handler knows about it (its subject, which
/// delivery this is, where it sits in the stream). Nothing here is NATS-specific.
#[derive(Debug, Clone, Default)]
pub struct Attempt {
    pub subject: String,
    /// 1 on the first delivery; grows only with failures and crashes, never with waits.
    pub delivered: u64,
    pub stream_sequence: u64,
    pub correlation_id: String,
    /// Waits this delivery went through (each a [`StageError::Defer`]); 0 on the first run.
    pub waits: u32,
    /// How long this delivery has waited so far: from its first run to this one. A message
    /// redelivered after a crash starts again from zero, so a process's downtime never counts.
    pub waited: Duration,
}

/// A message a handler wants published.
#[derive(Debug, Clone)]
pub struct Output {
    pub subject: String,
    /// Stable for a given input, so a redelivered input republishes the same id and JetStream
    /// drops the duplicate. The runtime prefixes it with the stage name.
    pub dedupe_id: String,
    pub message_type: String,
    pub payload: Bytes,
    pub correlation_id: Option<String>,
}

impl Output {
    pub fn new<M: prost::Message + prost::Name>(
        subject: String,
        dedupe_id: impl Into<String>,
        message: &M,
    ) -> Self {
        Self {
            subject,
            dedupe_id: dedupe_id.into(),
            message_type: M::full_name(),
            payload: Bytes::from(message.encode_to_vec()),
            correlation_id: None,
        }
    }

    pub fn correlated(mut self, correlation_id: impl Into<String>) -> Self {
        self.correlation_id = Some(correlation_id.into());
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// Worth retrying (database or runner down, timeout): nak with a growing delay, dead-letter
    /// after `max_deliver` deliveries.
    #[error("transient: {0:#}")]
    Transient(anyhow::Error),
    /// Retrying cannot help (invalid input, unknown agent): dead-letter now.
    #[error("permanent: {0:#}")]
    Permanent(anyhow::Error),
    /// Not yet: run again after this delay (e.g. a turn waiting for its predecessor). The
    /// message is parked in this process; the wait does not count as a failure.
    #[error("deferred: {1}")]
    Defer(Duration, String),
    /// Waiting out an outage of something outside Switchboard (the agent's runner is down):
    /// parked like [`StageError::Defer`], but for as long as the outage lasts (not bounded by
    /// `runtime.max_wait_ms`: how old a message may get is the stage's own rule), and
    /// `outputs` (a notice to the person, say) are published first; if that fails the message
    /// goes back to the stream, and its redelivery (`Attempt::waits` 0) makes them again.
    /// `wake`, if any, ends the wait early (the outage is over).
    #[error("waiting out an outage: {why}")]
    Outage {
        after: Duration,
        why: String,
        outputs: Vec<Output>,
        wake: Option<Wake>,
    },
    /// Not yet, and something in this process will say when (a session's cursor moved): parked
    /// like [`StageError::Defer`], without a handler slot, until `wake` fires or `at_most` has
    /// passed, then run again. With `outage`, the time does not count toward
    /// `runtime.max_wait_ms` (as with [`StageError::Outage`]).
    #[error("waiting: {why}")]
    Wait {
        at_most: Duration,
        why: String,
        outage: bool,
        wake: Wake,
    },
}

/// A wait a handler asked for, as the runtime parks the message.
pub(crate) struct Parking {
    pub after: Duration,
    pub why: String,
    pub wake: Option<Wake>,
    /// Not counted toward `max_wait`.
    pub outage: bool,
    /// Published before the message is parked.
    pub outputs: Vec<Output>,
}

impl StageError {
    /// The wait this answer asks for; the error itself if it is a failure.
    pub(crate) fn parking(self) -> Result<Parking, StageError> {
        match self {
            StageError::Defer(after, why) => Ok(Parking {
                after,
                why,
                wake: None,
                outage: false,
                outputs: Vec::new(),
            }),
            StageError::Outage {
                after,
                why,
                outputs,
                wake,
            } => Ok(Parking {
                after,
                why,
                wake,
                outage: true,
                outputs,
            }),
            StageError::Wait {
                at_most,
                why,
                outage,
                wake,
            } => Ok(Parking {
                after: at_most,
                why,
                wake: Some(wake),
                outage,
                outputs: Vec::new(),
            }),
            failure => Err(failure),
        }
    }
}

/// What ends a parked message's wait early: a future that resolves when retrying may succeed.
/// (In a mutex only so that outcomes stay `Sync`; it is awaited once, by the runtime.)
pub struct Wake(std::sync::Mutex<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Wake {
    pub fn new(fut: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(std::sync::Mutex::new(Box::pin(fut)))
    }

    /// Resolves when the wait may end.
    pub async fn fired(self) {
        let fut = self.0.into_inner().unwrap_or_else(|e| e.into_inner());
        fut.await
    }
}

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Wake")
    }
}

impl StageError {
    pub fn transient(e: impl Into<anyhow::Error>) -> Self {
        Self::Transient(e.into())
    }
    pub fn permanent(e: impl Into<anyhow::Error>) -> Self {
        Self::Permanent(e.into())
    }
}

/// How a handler waits in place for something another worker will do (a predecessor placed,
/// a previous reply sent): poll every `poll` for at most `hold`, then hand the message back
/// with [`StageError::Defer`] after `retry`, so a long wait does not pin a handler slot.
#[derive(Debug, Clone, Copy)]
pub struct Hold {
    pub poll: Duration,
    pub hold: Duration,
    pub retry: Duration,
}

impl Hold {
    /// Ok once `ready` answers true; `Defer(retry, why())` when the hold is over first.
    pub async fn until<F, Fut>(
        &self,
        why: impl FnOnce() -> String,
        mut ready: F,
    ) -> Result<(), StageError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<bool, StageError>>,
    {
        let deadline = Instant::now() + self.hold;
        loop {
            if ready().await? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StageError::Defer(self.retry, why()));
            }
            tokio::time::sleep(self.poll).await;
        }
    }
}

/// What a handler decided for one input: outputs to publish, or why not.
pub type Outcome = Result<Vec<Output>, StageError>;

/// A worker's logic, one message at a time. Implementations know nothing of NATS.
pub trait Stage: Send + Sync + 'static {
    type Input: prost::Message + prost::Name + Default + Send + Sync + 'static;
    /// The stage's declaration: its name, what it reads, its knobs.
    const SPEC: StageSpec;

    fn handle(&self, input: Self::Input, attempt: &Attempt)
    -> impl Future<Output = Outcome> + Send;

    /// Runs before the runtime dead-letters a decodable input, on every path that does so: the
    /// handler's permanent error, a failure budget used up, a message that kept crashing its
    /// worker (whose handler never finished). The stage records what the rest of the system
    /// must know (a turn failed, a delivery failed) and may return outputs (an event) that are
    /// published before the dead letter. [`StageError::Defer`] here waits and runs the step
    /// again; any other error retries the whole message later: nothing is dead-lettered until
    /// the give-up step has run.
    ///
    /// `cause` says why (its text is the dead letter's reason); a stage that acts on it matches
    /// the cause, or downcasts its error to the stage's own type, never reads its wording.
    fn give_up(
        &self,
        input: &Self::Input,
        attempt: &Attempt,
        cause: &GiveUp,
    ) -> impl Future<Output = Outcome> + Send {
        let _ = (input, attempt, cause);
        async { Ok(Vec::new()) }
    }
}

/// A worker's logic over what one pull brought, all at once: for set-based writes (one
/// statement per table and one commit for the batch). The runtime never waits for a batch to
/// fill: a lone message is handled alone, at once.
///
/// Each input still has its own fate: its outcome decides whether it is acked, retried, parked
/// or dead-lettered, exactly as for a [`Stage`]. An undecodable input is dead-lettered before
/// the handler sees the batch; and when every input of a batch fails with a transient error (a
/// statement one of them broke), the runtime runs each again alone, so one bad message fails
/// alone, never its neighbours.
pub trait BatchStage: Send + Sync + 'static {
    type Input: prost::Message + prost::Name + Default + Send + Sync + 'static;
    const SPEC: StageSpec;

    /// One outcome per input, in the inputs' order. `attempts[i]` belongs to `inputs[i]`.
    fn handle_batch(
        &self,
        inputs: Vec<Self::Input>,
        attempts: &[Attempt],
    ) -> impl Future<Output = Vec<Outcome>> + Send;

    /// As [`Stage::give_up`], for one input of the batch.
    fn give_up(
        &self,
        input: &Self::Input,
        attempt: &Attempt,
        cause: &GiveUp,
    ) -> impl Future<Output = Outcome> + Send {
        let _ = (input, attempt, cause);
        async { Ok(Vec::new()) }
    }
}

/// A [`Stage`] seen as a batch stage whose batches hold one message, so the runtime has one
/// path for both.
pub(crate) struct PerMessage<S>(pub Arc<S>);

impl<S: Stage> BatchStage for PerMessage<S> {
    type Input = S::Input;
    const SPEC: StageSpec = S::SPEC;

    async fn handle_batch(&self, inputs: Vec<S::Input>, attempts: &[Attempt]) -> Vec<Outcome> {
        join_all(
            inputs
                .into_iter()
                .zip(attempts)
                .map(|(input, attempt)| self.0.handle(input, attempt)),
        )
        .await
    }

    fn give_up(
        &self,
        input: &S::Input,
        attempt: &Attempt,
        cause: &GiveUp,
    ) -> impl Future<Output = Outcome> + Send {
        self.0.give_up(input, attempt, cause)
    }
}
