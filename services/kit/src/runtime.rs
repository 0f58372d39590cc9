//! The worker runtime: the only code that talks to JetStream on behalf of a stage.
//!
//! A stage is a plain handler from one decoded input to the outputs it wants published. The
//! runtime pulls in batches, runs handlers with bounded concurrency, sends progress acks while a
//! handler runs long, publishes outputs with dedupe ids (`Nats-Msg-Id`) and only then acks the
//! input. Failures are retried with a growing delay or dead-lettered with their reason.
//!
//! Waiting is not failing. A handler that must wait for another worker (a predecessor not done,
//! a lease held) answers [`StageError::Defer`]; the runtime parks the message in this process:
//! it gives the handler slot back, keeps the message from being redelivered with progress acks,
//! and runs the handler again after the delay. So only handler errors and crashes count
//! toward `max_deliver` (JetStream's delivery count); a wait ends in a dead letter only after
//! `runtime.max_wait_ms` of waiting in a running process, "waited too long for …".
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer, message::PublishMessage};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::join_all;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::config::RuntimeConfig;
use crate::proto::DeadLetter;
use crate::retry::Backoff;
use crate::shutdown::Shutdown;
use crate::stage::{StageOptions, StageSpec};
use crate::topology::Topology;

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

/// A worker's logic. Implementations know nothing of NATS.
pub trait Stage: Send + Sync + 'static {
    type Input: prost::Message + Default + Send + Sync + 'static;
    /// The stage's declaration: its name, what it reads, its knobs.
    const SPEC: StageSpec;

    fn handle(
        &self,
        input: Self::Input,
        attempt: &Attempt,
    ) -> impl Future<Output = Result<Vec<Output>, StageError>> + Send;

    /// Runs before the runtime dead-letters a decodable input, on every path that does so: the
    /// handler's permanent error, a failure budget used up, a message that kept crashing its
    /// worker (whose handler never finished). The stage records what the rest of the system
    /// must know (a turn failed, a delivery failed) and may return outputs (an event) that are
    /// published before the dead letter. [`StageError::Defer`] here waits and runs the step
    /// again; any other error retries the whole message later: nothing is dead-lettered until
    /// the give-up step has run.
    fn give_up(
        &self,
        input: &Self::Input,
        attempt: &Attempt,
        reason: &str,
    ) -> impl Future<Output = Result<Vec<Output>, StageError>> + Send {
        let _ = (input, attempt, reason);
        async { Ok(Vec::new()) }
    }
}

/// JetStream plus the names of things: what every stage task needs.
#[derive(Clone)]
pub struct Runtime {
    pub js: jetstream::Context,
    pub topology: Topology,
    pub config: RuntimeConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("stage {stage}: consumer unavailable: {reason}")]
    Consumer { stage: &'static str, reason: String },
}

impl Runtime {
    pub fn new(js: jetstream::Context, topology: Topology, config: RuntimeConfig) -> Self {
        Self {
            js,
            topology,
            config,
        }
    }

    /// Publish one output and wait for JetStream's ack (so it is durable).
    pub async fn publish(&self, stage: &str, out: &Output) -> Result<(), anyhow::Error> {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_TYPE, out.message_type.as_str());
        if let Some(c) = &out.correlation_id {
            headers.insert(HEADER_CORRELATION, c.as_str());
        }
        let msg = PublishMessage::build()
            .payload(out.payload.clone())
            .headers(headers)
            .message_id(format!("{stage}/{}", out.dedupe_id));
        let ack = self.js.send_publish(out.subject.clone(), msg).await?;
        ack.await?;
        Ok(())
    }

    async fn publish_all(&self, stage: &str, outputs: &[Output]) -> Result<(), anyhow::Error> {
        let results = join_all(outputs.iter().map(|o| self.publish(stage, o))).await;
        results.into_iter().collect()
    }

    /// Runs `stage` until `shutdown`, then drains in-flight work (bounded by the grace period).
    pub async fn run_stage<S: Stage>(
        self,
        stage: Arc<S>,
        opts: StageOptions,
        shutdown: Shutdown,
    ) -> Result<(), RuntimeError> {
        let name = S::SPEC.name;
        let consumer_err = |reason: String| RuntimeError::Consumer {
            stage: name,
            reason,
        };
        let stream = self
            .js
            .get_stream(self.topology.stream_of(S::SPEC.reads))
            .await
            .map_err(|e| consumer_err(e.to_string()))?;
        let consumer: consumer::PullConsumer = stream
            .get_consumer(name)
            .await
            .map_err(|e| consumer_err(e.to_string()))?;
        let ack_wait = Duration::from_millis(self.config.ack_wait_ms);
        let expires = (ack_wait / 2).clamp(Duration::from_millis(500), Duration::from_secs(10));

        let lag = tokio::spawn(report_lag(consumer.clone(), name));
        let sem = Arc::new(Semaphore::new(opts.concurrency));
        let mut tasks = JoinSet::new();
        let this = Arc::new(self);
        tracing::info!(stage = %name, concurrency = opts.concurrency, "stage started");

        'outer: while !shutdown.is_triggered() {
            let mut messages = match consumer
                .stream()
                .max_messages_per_batch(opts.batch)
                .expires(expires)
                .messages()
                .await
            {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(stage = %name, error = %e, "pull failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        _ = shutdown.wait() => break,
                    }
                }
            };
            loop {
                let permit = tokio::select! {
                    p = sem.clone().acquire_owned() => p.expect("semaphore never closed"),
                    _ = shutdown.wait() => break 'outer,
                };
                let next = tokio::select! {
                    m = messages.next() => m,
                    _ = shutdown.wait() => break 'outer,
                };
                match next {
                    Some(Ok(msg)) => {
                        let this = this.clone();
                        let stage = stage.clone();
                        let opts = opts.clone();
                        let slots = Slots {
                            held: Some(permit),
                            semaphore: sem.clone(),
                            shutdown: shutdown.clone(),
                            ack_wait,
                        };
                        tasks.spawn(async move {
                            this.process(stage.as_ref(), msg, &opts, slots).await;
                        });
                    }
                    Some(Err(e)) => {
                        // Missed heartbeats, reconnects: the pull stream recovers by itself.
                        tracing::debug!(stage = %name, error = %e, "pull stream error");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    None => continue 'outer,
                }
                while tasks.try_join_next().is_some() {}
            }
        }

        // Drain: no more pulls; let in-flight handlers finish. Anything still running after the
        // grace period is abandoned unacked and comes back to another replica after ack_wait.
        lag.abort();
        let grace = Duration::from_millis(this.config.shutdown_grace_ms);
        while tasks.try_join_next().is_some() {}
        let in_flight = tasks.len();
        if in_flight > 0 {
            tracing::info!(stage = %name, in_flight, "draining");
        }
        if tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            tracing::warn!(stage = %name, left = tasks.len(), "grace period over; abandoning");
            tasks.abort_all();
        }
        // Acks are buffered by the client: push them out before the process may exit.
        if let Err(e) = this.js.client().flush().await {
            tracing::warn!(stage = %name, error = %e, "flushing acks failed");
        }
        tracing::info!(stage = %name, "stage stopped");
        Ok(())
    }

    async fn process<S: Stage>(
        &self,
        stage: &S,
        msg: jetstream::Message,
        opts: &StageOptions,
        mut slots: Slots,
    ) {
        let name = S::SPEC.name;
        let (delivered, stream_sequence) = match msg.info() {
            Ok(i) => (i.delivered.max(1) as u64, i.stream_sequence),
            Err(_) => (1, 0),
        };
        let correlation_id = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(HEADER_CORRELATION))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        let mut attempt = Attempt {
            subject: msg.subject.to_string(),
            delivered,
            stream_sequence,
            correlation_id,
            waits: 0,
            waited: Duration::ZERO,
        };
        let span = tracing::info_span!(
            "stage",
            stage = %name,
            correlation_id = %attempt.correlation_id,
            seq = stream_sequence,
            delivered
        );
        async {
            if delivered > opts.max_deliver {
                // The handler never finished the earlier deliveries: it may be crashing the
                // process. Do not run it again.
                let why = format!(
                    "delivered {delivered} times without success (max {}); \
                     the handler may be crashing the process",
                    opts.max_deliver
                );
                self.give_up(stage, &msg, &attempt, &why, opts, &mut slots)
                    .await;
                return;
            }
            let first_run = Instant::now();
            loop {
                // Decoded for each run rather than cloned: a re-run (after a wait) is the rare case.
                let input = match <S::Input as prost::Message>::decode(msg.payload.clone()) {
                    Ok(i) => i,
                    Err(e) => {
                        let why = format!("undecodable payload: {e}");
                        self.dead_letter(name, &msg, &attempt, &why).await;
                        return;
                    }
                };
                let started = Instant::now();
                let result =
                    with_progress(&msg, slots.ack_wait, stage.handle(input, &attempt)).await;
                metrics::histogram!("sb_stage_handler_seconds", "stage" => name)
                    .record(started.elapsed().as_secs_f64());
                let result = result.map_err(|e| waits_for_capacity(e, attempt.waits));

                match result {
                    Ok(outputs) => {
                        if let Err(e) = self.publish_all(name, &outputs).await {
                            tracing::warn!(error = %e, "publishing outputs failed; will retry");
                            self.retry(name, &msg, &attempt, opts).await;
                            return;
                        }
                        match msg.ack().await {
                            Ok(()) => count(name, "ok"),
                            Err(e) => {
                                tracing::warn!(error = %e, "ack failed; input will be redelivered")
                            }
                        }
                        return;
                    }
                    Err(StageError::Permanent(e)) => {
                        let why = format!("{e:#}");
                        self.give_up(stage, &msg, &attempt, &why, opts, &mut slots)
                            .await;
                        return;
                    }
                    Err(StageError::Transient(e)) => {
                        tracing::warn!(error = %format!("{e:#}"), "handler failed");
                        if delivered >= opts.max_deliver {
                            let why = format!("gave up after {delivered} deliveries: {e:#}");
                            self.give_up(stage, &msg, &attempt, &why, opts, &mut slots)
                                .await;
                        } else {
                            self.retry(name, &msg, &attempt, opts).await;
                        }
                        return;
                    }
                    Err(StageError::Defer(after, why)) => {
                        let waited = first_run.elapsed();
                        if waited >= opts.max_wait {
                            let why = format!(
                                "waited too long for {why}: {:.0} s (max {:.0} s)",
                                waited.as_secs_f64(),
                                opts.max_wait.as_secs_f64()
                            );
                            self.give_up(stage, &msg, &attempt, &why, opts, &mut slots)
                                .await;
                            return;
                        }
                        tracing::debug!(%why, "waiting");
                        count(name, "deferred");
                        if !slots.park(&msg, after).await {
                            return;
                        }
                        attempt.waits += 1;
                        attempt.waited = first_run.elapsed();
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn retry(
        &self,
        name: &'static str,
        msg: &jetstream::Message,
        attempt: &Attempt,
        opts: &StageOptions,
    ) {
        count(name, "retried");
        let delay = opts.retry.delay(attempt.delivered);
        let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
    }

    /// The stage's give-up step, its outputs, then the dead letter. If the step or its outputs
    /// fail, the message is retried later instead: it is never dead-lettered without them.
    async fn give_up<S: Stage>(
        &self,
        stage: &S,
        msg: &jetstream::Message,
        attempt: &Attempt,
        why: &str,
        opts: &StageOptions,
        slots: &mut Slots,
    ) {
        let name = S::SPEC.name;
        // Decoded again rather than kept: giving up is rare, cloning every input is not.
        let Ok(input) = <S::Input as prost::Message>::decode(msg.payload.clone()) else {
            self.dead_letter(name, msg, attempt, why).await;
            return;
        };
        let outputs = loop {
            match with_progress(msg, slots.ack_wait, stage.give_up(&input, attempt, why)).await {
                Ok(outputs) => break outputs,
                // The step must wait (a live call may still answer the turn): the decision to
                // give up stands, so wait here and run the step again, not the handler.
                Err(StageError::Defer(after, wait_why)) => {
                    tracing::debug!(why = %wait_why, "give-up step waiting");
                    if !slots.park(msg, after).await {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the give-up step failed; will retry the message");
                    self.retry(name, msg, attempt, opts).await;
                    return;
                }
            }
        };
        if let Err(e) = self.publish_all(name, &outputs).await {
            tracing::warn!(error = %e, "publishing the give-up outputs failed; will retry");
            self.retry(name, msg, attempt, opts).await;
            return;
        }
        self.dead_letter(name, msg, attempt, why).await;
    }

    /// Store the message with its reason on `sb.dlq.<stage>`, then terminate it. If the dead
    /// letter cannot be stored, the message is nak'ed instead: nothing is dropped.
    async fn dead_letter(
        &self,
        name: &'static str,
        msg: &jetstream::Message,
        attempt: &Attempt,
        why: &str,
    ) {
        tracing::error!(error = %why, "dead-lettering");
        let letter = DeadLetter {
            stage: name.to_string(),
            subject: attempt.subject.clone(),
            error: why.to_string(),
            delivery_count: attempt.delivered,
            payload: msg.payload.to_vec(),
            message_type: msg
                .headers
                .as_ref()
                .and_then(|h| h.get(HEADER_TYPE))
                .map(|v| v.as_str().to_string())
                .unwrap_or_default(),
            correlation_id: attempt.correlation_id.clone(),
            failed_at_ms: crate::now_ms(),
            stream_sequence: attempt.stream_sequence,
        };
        let mut out = Output::new(
            self.topology.dead_letter(name),
            format!("{name}:{}", attempt.stream_sequence),
            &letter,
        );
        if !attempt.correlation_id.is_empty() {
            out = out.correlated(attempt.correlation_id.clone());
        }
        match self.publish("dlq", &out).await {
            Ok(()) => {
                count(name, "dead_lettered");
                let _ = msg.ack_with(AckKind::Term).await;
            }
            Err(e) => {
                tracing::error!(error = %e, "could not store dead letter; will retry");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
                    .await;
            }
        }
    }
}

/// A handler that got no database connection within the pool's timeout waited for capacity
/// the whole process shares (under overload, every connection busy): that is a wait, not the
/// message's failure, so it is parked like one instead of using up its deliveries.
fn waits_for_capacity(e: StageError, waits: u32) -> StageError {
    match e {
        StageError::Transient(e) if is_pool_timeout(&e) => StageError::Defer(
            Backoff::new(Duration::from_millis(250), Duration::from_secs(5))
                .delay(u64::from(waits) + 1),
            "a database connection (the pool was busy)".into(),
        ),
        other => other,
    }
}

fn is_pool_timeout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::PoolTimedOut)
        )
    })
}

/// A handler slot of the stage's semaphore: held while the handler runs, given back while
/// the message waits.
struct Slots {
    held: Option<OwnedSemaphorePermit>,
    semaphore: Arc<Semaphore>,
    shutdown: Shutdown,
    ack_wait: Duration,
}

impl Slots {
    /// Park a waiting message for `delay`: its slot given back, progress acks keeping it ours,
    /// then a slot taken again. False if shutdown came first: the message was handed back
    /// to the stream (JetStream counts that as a delivery).
    async fn park(&mut self, msg: &jetstream::Message, delay: Duration) -> bool {
        self.held = None;
        // The handler may have run for up to a third of `ack_wait` since its last progress ack.
        let _ = msg.ack_with(AckKind::Progress).await;
        let slept = tokio::select! {
            _ = with_progress(msg, self.ack_wait, tokio::time::sleep(delay)) => true,
            _ = self.shutdown.wait() => false,
        };
        let resumed = slept
            && tokio::select! {
                p = self.semaphore.clone().acquire_owned() => {
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

/// Run `fut`, telling the server every third of `ack_wait` that the message is still being
/// worked on, so it is not redelivered meanwhile.
async fn with_progress<T>(
    msg: &jetstream::Message,
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
                let _ = msg.ack_with(AckKind::Progress).await;
            }
        }
    }
}

fn count(stage: &'static str, outcome: &'static str) {
    metrics::counter!("sb_stage_messages_total", "stage" => stage, "outcome" => outcome)
        .increment(1);
}

async fn report_lag(mut consumer: consumer::PullConsumer, name: &'static str) {
    loop {
        if let Ok(info) = consumer.info().await {
            metrics::gauge!("sb_consumer_pending", "stage" => name).set(info.num_pending as f64);
            metrics::gauge!("sb_consumer_ack_pending", "stage" => name)
                .set(info.num_ack_pending as f64);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum StoreError {
        #[error("session store: {0}")]
        Database(#[from] sqlx::Error),
    }

    #[test]
    fn a_busy_connection_pool_is_a_wait_and_other_database_errors_are_failures() {
        let busy = StageError::transient(StoreError::from(sqlx::Error::PoolTimedOut));
        match waits_for_capacity(busy, 0) {
            StageError::Defer(after, why) => {
                assert_eq!(after, Duration::from_millis(250));
                assert!(why.contains("database connection"), "{why}");
            }
            other => panic!("not a wait: {other:?}"),
        }
        let down = StageError::transient(StoreError::from(sqlx::Error::PoolClosed));
        assert!(matches!(
            waits_for_capacity(down, 0),
            StageError::Transient(_)
        ));
        let wrong = StageError::permanent(StoreError::from(sqlx::Error::PoolTimedOut));
        assert!(matches!(
            waits_for_capacity(wrong, 0),
            StageError::Permanent(_)
        ));
    }

    #[test]
    fn failed_messages_back_off_by_the_configured_policy() {
        let rt = RuntimeConfig {
            retry_base_ms: 100,
            retry_max_ms: 1000,
            ..Default::default()
        };
        let spec = StageSpec::new("s", crate::stage::Source::Work("reply"));
        let p = StageOptions::resolve(&spec, &rt, None).retry;
        assert_eq!(p.delay(1), Duration::from_millis(100));
        assert_eq!(p.delay(10), Duration::from_millis(1000));
    }
}
