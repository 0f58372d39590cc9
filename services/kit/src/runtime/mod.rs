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
//! and runs the handler again after the delay, taking at most half the slots when it does (so
//! new messages, among them the ones waited for, always get pulled). Only handler errors and
//! crashes count toward `max_deliver` (JetStream's delivery count); a wait ends in a dead letter
//! only after `runtime.max_wait_ms` of waiting in a running process, "waited too long for …".
//! A handler that knows what it waits for answers [`StageError::Wait`] with a [`Wake`]: parked
//! the same way, it runs again the moment that happens, so a wait never needs to hold a slot to
//! be answered promptly.
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer, message::PublishMessage};
use futures::future::join_all;
use futures::{FutureExt as _, StreamExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::config::RuntimeConfig;
use crate::proto::DeadLetter;
use crate::retry::Backoff;
use crate::settle::{GiveUp, MessageOutcome, dead_letter_id};
use crate::shutdown::Shutdown;
use crate::stage::StageOptions;
use crate::topology::Topology;

mod handler;
mod slots;

pub(crate) use handler::PerMessage;
pub use handler::*;
use slots::{Slots, with_progress};

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

/// How long a handler's outputs are tried again in the process before its input is handed
/// back to JetStream (see [`Runtime::publish_held`]): longer than a stream leader's election.
const PUBLISH_RETRY_FOR: Duration = Duration::from_secs(30);

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
        // The output continues its input's trace (the span the caller runs in).
        if let Some(cx) = crate::trace::current() {
            headers.insert(crate::trace::TRACEPARENT, cx.traceparent.as_str());
            if let Some(state) = &cx.tracestate {
                headers.insert(crate::trace::TRACESTATE, state.as_str());
            }
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

    /// [`Runtime::publish_all`], tried again here (the input held by progress acks) for up to
    /// [`PUBLISH_RETRY_FOR`] before the caller hands the input back. A failed publish is
    /// NATS's trouble (a stream leader being elected, a node restarting), not the input's:
    /// handing the input back would spend one of its deliveries each time, and
    /// `max_deliver` deliveries give it up as a crash loop (`make chaos CLUSTER=3` lost
    /// messages so, chaos-20261127-130935). Outputs carry their dedupe ids, so a publish that
    /// landed before its ack was lost is not stored twice.
    async fn publish_held(
        &self,
        stage: &str,
        msg: &jetstream::Message,
        outputs: &[Output],
        opts: &StageOptions,
        ack_wait: Duration,
    ) -> Result<(), anyhow::Error> {
        let until = Instant::now() + PUBLISH_RETRY_FOR;
        // The input stays held (progress acks) through every try, the publish's own wait for
        // its ack included: a publish nobody answers waits for its timeout.
        let tries = async {
            let mut tries = 0;
            loop {
                let error = match self.publish_all(stage, outputs).await {
                    Ok(()) => return Ok(()),
                    Err(e) => e,
                };
                tries += 1;
                let delay = opts.retry.jittered(tries);
                if Instant::now() + delay >= until {
                    return Err(error);
                }
                tracing::debug!(error = %error, tries, "publishing outputs failed; trying again");
                tokio::time::sleep(delay).await;
            }
        };
        with_progress(&[msg], ack_wait, tries).await
    }

    /// Runs `stage` until `shutdown`, then drains in-flight work (bounded by the grace period).
    pub async fn run_stage<S: Stage>(
        self,
        stage: Arc<S>,
        opts: StageOptions,
        shutdown: Shutdown,
    ) -> Result<(), RuntimeError> {
        self.run(Arc::new(PerMessage(stage)), 1, opts, shutdown)
            .await
    }

    /// Runs a [`BatchStage`] until `shutdown`, like [`Runtime::run_stage`].
    pub async fn run_batch_stage<S: BatchStage>(
        self,
        stage: Arc<S>,
        opts: StageOptions,
        shutdown: Shutdown,
    ) -> Result<(), RuntimeError> {
        let per_call = opts.batch;
        self.run(stage, per_call, opts, shutdown).await
    }

    /// The stage loop; a handler call takes at most `per_call` messages (what a pull brought).
    async fn run<H: BatchStage>(
        self,
        handler: Arc<H>,
        per_call: usize,
        opts: StageOptions,
        shutdown: Shutdown,
    ) -> Result<(), RuntimeError> {
        let name = H::SPEC.name;
        let consumer_err = |reason: String| RuntimeError::Consumer {
            stage: name,
            reason,
        };
        let stream = self
            .js
            .get_stream(self.topology.stream_of(H::SPEC.reads))
            .await
            .map_err(|e| consumer_err(e.to_string()))?;
        let consumer: consumer::PullConsumer = stream
            .get_consumer(name)
            .await
            .map_err(|e| consumer_err(e.to_string()))?;
        let ack_wait = Duration::from_millis(self.config.ack_wait_ms);
        let expires = (ack_wait / 2).clamp(Duration::from_millis(500), Duration::from_secs(10));

        for outcome in MessageOutcome::ALL {
            outcome.count(name, 0);
        }
        metrics::counter!("sb_stage_panics_total", "stage" => name).increment(0);
        let lag = tokio::spawn(report_lag(consumer.clone(), name));
        let sem = Arc::new(Semaphore::new(opts.concurrency));
        // Parked messages take a slot again through this gate first, so at most half the slots
        // (and half the places in the slot queue) are theirs: the pull loop always gets its
        // turn. Without it, thousands of parked messages (after a database outage: every later
        // reply waiting for an earlier one that failed) queued ahead of the pull loop each time,
        // and the redelivered messages they waited for were never pulled.
        let resume = Arc::new(Semaphore::new((opts.concurrency / 2).max(1)));
        let mut tasks = JoinSet::new();
        let this = Arc::new(self);
        tracing::info!(
            stage = %name,
            concurrency = opts.concurrency,
            batch = per_call,
            "stage started"
        );

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
                let mut ended = false;
                let mut batch = match next {
                    Some(Ok(msg)) => vec![msg],
                    Some(Err(e)) => {
                        // Missed heartbeats, reconnects: the pull stream recovers by itself.
                        tracing::debug!(stage = %name, error = %e, "pull stream error");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    None => continue 'outer,
                };
                // Take what is already here, and wait for more only as long as the stage
                // lingers (by default never: a lone message goes at once).
                let filled_by = tokio::time::Instant::now() + opts.linger;
                while batch.len() < per_call {
                    let next = match messages.next().now_or_never() {
                        Some(next) => next,
                        None if opts.linger.is_zero() => break,
                        None => tokio::select! {
                            next = tokio::time::timeout_at(filled_by, messages.next()) => {
                                match next {
                                    Ok(next) => next,
                                    Err(_) => break,
                                }
                            }
                            _ = shutdown.wait() => break,
                        },
                    };
                    match next {
                        Some(Ok(msg)) => batch.push(msg),
                        Some(Err(e)) => {
                            tracing::debug!(stage = %name, error = %e, "pull stream error");
                            break;
                        }
                        None => {
                            ended = true;
                            break;
                        }
                    }
                }
                let this = this.clone();
                let handler = handler.clone();
                let opts = opts.clone();
                let slots = Slots {
                    held: Some(permit),
                    resumed: None,
                    semaphore: sem.clone(),
                    resume: resume.clone(),
                    shutdown: shutdown.clone(),
                    ack_wait,
                };
                tasks.spawn(async move {
                    this.process_batch(handler.as_ref(), batch, &opts, slots)
                        .await;
                });
                reap(name, &mut tasks);
                if ended {
                    continue 'outer;
                }
            }
        }

        // Drain: no more pulls; let in-flight handlers finish. Anything still running after the
        // grace period is abandoned unacked and comes back to another replica after ack_wait.
        lag.abort();
        let grace = Duration::from_millis(this.config.shutdown_grace_ms);
        reap(name, &mut tasks);
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

    /// Handle what one pull brought with one handler call, then settle each message by its own
    /// outcome: the successes' outputs published together and their acks awaited together, then
    /// their inputs acked; every other message retried, parked or given up on its own.
    async fn process_batch<H: BatchStage>(
        &self,
        h: &H,
        msgs: Vec<jetstream::Message>,
        opts: &StageOptions,
        mut slots: Slots,
    ) {
        let name = H::SPEC.name;
        if msgs.len() == 1 {
            let msg = msgs.into_iter().next().expect("one message");
            return self.process(h, msg, opts, slots, None).await;
        }
        let span = tracing::info_span!(
            "stage_batch",
            otel.name = %format_args!("{name} batch"),
            stage = %name,
            size = msgs.len()
        );
        async {
            let first_run = Instant::now();
            // What the handler never sees: crash loops and undecodable payloads, each alone.
            let mut ready = Vec::with_capacity(msgs.len());
            let mut inputs = Vec::with_capacity(msgs.len());
            for msg in msgs {
                let attempt = attempt_of(&msg);
                if attempt.delivered > opts.max_deliver {
                    let why = crash_loop(&attempt, opts);
                    let mut alone = slots.unheld();
                    self.give_up(h, &msg, &attempt, why, opts, &mut alone).await;
                    continue;
                }
                if let Some(why) = foreign_type::<H::Input>(&msg) {
                    self.dead_letter(name, &msg, &attempt, &why).await;
                    continue;
                }
                match <H::Input as prost::Message>::decode(msg.payload.clone()) {
                    Ok(input) => {
                        inputs.push(input);
                        ready.push((msg, attempt));
                    }
                    Err(e) => {
                        let why = format!("undecodable payload: {e}");
                        self.dead_letter(name, &msg, &attempt, &why).await;
                    }
                }
            }
            if ready.is_empty() {
                return;
            }
            // Each message keeps its own trace: a span of its own (its outputs are published
            // in it), which the batch's span links to.
            let spans: Vec<tracing::Span> = ready
                .iter()
                .map(|(msg, attempt)| {
                    if !crate::trace::enabled() {
                        return tracing::Span::none();
                    }
                    let s = message_span(name, msg, attempt);
                    crate::trace::link_to(&tracing::Span::current(), &s);
                    s
                })
                .collect();
            let attempts: Vec<Attempt> = ready.iter().map(|(_, a)| a.clone()).collect();
            let in_batch: Vec<&jetstream::Message> = ready.iter().map(|(m, _)| m).collect();
            let started = Instant::now();
            let mut outcomes =
                with_progress(&in_batch, slots.ack_wait, handle(h, inputs, &attempts)).await;
            metrics::histogram!("sb_stage_handler_seconds", "stage" => name)
                .record(started.elapsed().as_secs_f64());
            metrics::histogram!("sb_stage_batch_size", "stage" => name).record(ready.len() as f64);
            // One bad message fails alone: when the whole batch failed (a statement one input
            // broke fails them all), each input runs again by itself.
            if ready.len() > 1
                && outcomes
                    .iter()
                    .all(|o| matches!(o, Err(StageError::Transient(_))))
            {
                tracing::debug!("the whole batch failed; running each message alone");
                outcomes = join_all(ready.iter().map(|(msg, attempt)| async move {
                    match <H::Input as prost::Message>::decode(msg.payload.clone()) {
                        Ok(input) => {
                            with_progress(&[msg], slots.ack_wait, handle_one(h, input, attempt))
                                .await
                        }
                        Err(e) => Err(StageError::permanent(e)),
                    }
                }))
                .await;
            }
            // Publish every success's outputs at once and await their acks together.
            let ack_wait = slots.ack_wait;
            let published = join_all(ready.iter().zip(outcomes.iter()).zip(&spans).map(
                |(((msg, _), o), span)| async move {
                    match o {
                        Ok(outputs) => Some(
                            self.publish_held(name, msg, outputs, opts, ack_wait)
                                .instrument(span.clone())
                                .await,
                        ),
                        Err(_) => None,
                    }
                },
            ))
            .await;
            drop(spans);
            let mut acks = Vec::new();
            let mut others = Vec::new();
            for (((msg, attempt), outcome), published) in
                ready.into_iter().zip(outcomes).zip(published)
            {
                match (outcome, published) {
                    (Ok(_), Some(Ok(()))) => acks.push(msg),
                    (Ok(_), _) => {
                        tracing::warn!("publishing outputs failed; will retry");
                        self.retry(name, &msg, &attempt, opts).await;
                    }
                    (Err(e), _) => others.push((msg, e)),
                }
            }
            let acked = join_all(acks.iter().map(|m| m.ack())).await;
            for a in acked {
                match a {
                    Ok(()) => MessageOutcome::Ok.count(name, 1),
                    Err(e) => tracing::warn!(error = %e, "ack failed; input will be redelivered"),
                }
            }
            // The rest settle one by one (a wait parks without the batch's handler slot).
            slots.held = None;
            join_all(others.into_iter().map(|(msg, e)| {
                self.process(h, msg, opts, slots.unheld(), Some((first_run, Err(e))))
            }))
            .await;
        }
        .instrument(span)
        .await
    }

    /// Settle one message: run the handler (unless `ran` brings the outcome of a batch's run
    /// and when it started), publish and ack, or retry, park and run again, or give up.
    async fn process<H: BatchStage>(
        &self,
        h: &H,
        msg: jetstream::Message,
        opts: &StageOptions,
        mut slots: Slots,
        mut ran: Option<(Instant, Outcome)>,
    ) {
        let name = H::SPEC.name;
        let mut attempt = attempt_of(&msg);
        let span = message_span(name, &msg, &attempt);
        async {
            let delivered = attempt.delivered;
            if ran.is_none()
                && let Some(why) = foreign_type::<H::Input>(&msg)
            {
                self.dead_letter(name, &msg, &attempt, &why).await;
                return;
            }
            if ran.is_none() && delivered > opts.max_deliver {
                // The handler never finished the earlier deliveries: it may be crashing the
                // process. Do not run it again.
                let why = crash_loop(&attempt, opts);
                self.give_up(h, &msg, &attempt, why, opts, &mut slots).await;
                return;
            }
            let first_run = ran.as_ref().map_or_else(Instant::now, |(t, _)| *t);
            // Time parked waiting out an outage: it does not count toward `max_wait` (a turn
            // that waited for a down runner may still wait for its predecessor after).
            let mut outage = Duration::ZERO;
            loop {
                let outcome = match ran.take() {
                    Some((_, outcome)) => outcome,
                    None => {
                        // Decoded for each run rather than cloned: a re-run is the rare case.
                        let input = match <H::Input as prost::Message>::decode(msg.payload.clone())
                        {
                            Ok(i) => i,
                            Err(e) => {
                                let why = format!("undecodable payload: {e}");
                                self.dead_letter(name, &msg, &attempt, &why).await;
                                return;
                            }
                        };
                        let started = Instant::now();
                        let outcome =
                            with_progress(&[&msg], slots.ack_wait, handle_one(h, input, &attempt))
                                .await;
                        metrics::histogram!("sb_stage_handler_seconds", "stage" => name)
                            .record(started.elapsed().as_secs_f64());
                        outcome
                    }
                };
                let error = match outcome.map_err(|e| waits_for_capacity(e, attempt.waits)) {
                    Ok(outputs) => {
                        if let Err(e) = self
                            .publish_held(name, &msg, &outputs, opts, slots.ack_wait)
                            .await
                        {
                            tracing::warn!(error = %e, "publishing outputs failed; will retry");
                            self.retry(name, &msg, &attempt, opts).await;
                            return;
                        }
                        match msg.ack().await {
                            Ok(()) => MessageOutcome::Ok.count(name, 1),
                            Err(e) => {
                                tracing::warn!(error = %e, "ack failed; input will be redelivered")
                            }
                        }
                        return;
                    }
                    Err(e) => e,
                };
                let wait = match error.parking() {
                    Ok(wait) => wait,
                    Err(StageError::Permanent(e)) => {
                        let why = GiveUp::Rejected(e);
                        self.give_up(h, &msg, &attempt, why, opts, &mut slots).await;
                        return;
                    }
                    Err(e) => {
                        let e = match e {
                            StageError::Transient(e) => e,
                            other => anyhow::Error::new(other),
                        };
                        tracing::warn!(error = %format!("{e:#}"), "handler failed");
                        if delivered >= opts.max_deliver {
                            let why = GiveUp::OutOfDeliveries {
                                deliveries: delivered,
                                error: e,
                            };
                            self.give_up(h, &msg, &attempt, why, opts, &mut slots).await;
                        } else {
                            self.retry(name, &msg, &attempt, opts).await;
                        }
                        return;
                    }
                };
                if let Err(e) = self
                    .publish_held(name, &msg, &wait.outputs, opts, slots.ack_wait)
                    .await
                {
                    // Back to the stream: the redelivery makes them again.
                    tracing::warn!(error = %e, "publishing a wait's outputs failed; will retry");
                    self.retry(name, &msg, &attempt, opts).await;
                    return;
                }
                let waited = first_run.elapsed().saturating_sub(outage);
                if !wait.outage && waited >= opts.max_wait {
                    let why = GiveUp::WaitedTooLong {
                        what: wait.why,
                        waited,
                        max: opts.max_wait,
                    };
                    self.give_up(h, &msg, &attempt, why, opts, &mut slots).await;
                    return;
                }
                if wait.outage {
                    tracing::debug!(why = %wait.why, "waiting out an outage");
                    MessageOutcome::WaitingOutage.count(name, 1);
                } else {
                    tracing::debug!(why = %wait.why, "waiting");
                    MessageOutcome::Deferred.count(name, 1);
                }
                let parked = Instant::now();
                if !slots.park(&msg, wait.after, wait.wake).await {
                    return;
                }
                if wait.outage {
                    outage += parked.elapsed();
                }
                attempt.waits += 1;
                attempt.waited = first_run.elapsed();
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
        MessageOutcome::Retried.count(name, 1);
        // Jittered: a backlog that failed together (NATS or Postgres restarted) must not come
        // back together.
        let delay = opts.retry.jittered(attempt.delivered);
        let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
    }

    /// The stage's give-up step, its outputs, then the dead letter. If the step or its outputs
    /// fail, the message is retried later instead: it is never dead-lettered without them.
    async fn give_up<H: BatchStage>(
        &self,
        stage: &H,
        msg: &jetstream::Message,
        attempt: &Attempt,
        cause: GiveUp,
        opts: &StageOptions,
        slots: &mut Slots,
    ) {
        let name = H::SPEC.name;
        let why = cause.to_string();
        // Decoded again rather than kept: giving up is rare, cloning every input is not.
        let Ok(input) = <H::Input as prost::Message>::decode(msg.payload.clone()) else {
            self.dead_letter(name, msg, attempt, &why).await;
            return;
        };
        let outputs = loop {
            let step = stage.give_up(&input, attempt, &cause);
            match with_progress(&[msg], slots.ack_wait, step).await {
                Ok(outputs) => break outputs,
                // The step must wait (a live call may still answer the turn): the decision to
                // give up stands, so wait here and run the step again, not the handler.
                Err(e) => match e.parking() {
                    Ok(wait) => {
                        tracing::debug!(why = %wait.why, "give-up step waiting");
                        if !slots.park(msg, wait.after, wait.wake).await {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the give-up step failed; will retry the message");
                        self.retry(name, msg, attempt, opts).await;
                        return;
                    }
                },
            }
        };
        if let Err(e) = self
            .publish_held(name, msg, &outputs, opts, slots.ack_wait)
            .await
        {
            tracing::warn!(error = %e, "publishing the give-up outputs failed; will retry");
            self.retry(name, msg, attempt, opts).await;
            return;
        }
        self.dead_letter(name, msg, attempt, &why).await;
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
            dead_letter_id(name, attempt.stream_sequence),
            &letter,
        );
        if !attempt.correlation_id.is_empty() {
            out = out.correlated(attempt.correlation_id.clone());
        }
        match self.publish("dlq", &out).await {
            Ok(()) => {
                MessageOutcome::DeadLettered.count(name, 1);
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

/// Why a message is not the stage's to read: its `Sb-Type` header names another type than the
/// stage's input. Protobuf decodes many a foreign payload without an error (unknown fields are
/// skipped, missing ones take defaults), so without this check an event delivered onto a work
/// subject would be handled as an empty input, silently. A message without the header (one
/// published by hand) is decoded as before: every product publisher sets it.
fn foreign_type<M: prost::Name>(msg: &jetstream::Message) -> Option<String> {
    type_mismatch::<M>(msg.headers.as_ref(), msg.subject.as_str())
}

fn type_mismatch<M: prost::Name>(headers: Option<&HeaderMap>, subject: &str) -> Option<String> {
    let declared = headers?.get(HEADER_TYPE)?.as_str();
    let reads = M::full_name();
    (!declared.is_empty() && declared != reads)
        .then(|| format!("a {declared} message on {subject}; this stage reads {reads}"))
}

/// A handler that got no database connection within the pool's timeout waited for capacity
/// the whole process shares (under overload, every connection busy): that is a wait, not the
/// message's failure, so it is parked like one instead of using up its deliveries.
fn waits_for_capacity(e: StageError, waits: u32) -> StageError {
    match e {
        StageError::Transient(e) if is_pool_timeout(&e) => StageError::Defer(
            Backoff::new(Duration::from_millis(250), Duration::from_secs(5))
                .jittered(u64::from(waits) + 1),
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

/// Run the stage's handler on `inputs`: one outcome per input, whatever the stage returned (a
/// wrong count is a stage bug, and no input can be settled on it). A handler that panics fails
/// its inputs at once, as an error would (retried after the policy's delay, counted toward
/// `max_deliver`): left to the task, the panic went unreported and the message came back only
/// after `ack_wait`.
async fn handle<H: BatchStage>(h: &H, inputs: Vec<H::Input>, attempts: &[Attempt]) -> Vec<Outcome> {
    let n = inputs.len();
    let run = std::panic::AssertUnwindSafe(h.handle_batch(inputs, attempts)).catch_unwind();
    let outcomes = match run.await {
        Ok(outcomes) => outcomes,
        Err(panic) => {
            let why = panic_message(panic.as_ref());
            metrics::counter!("sb_stage_panics_total", "stage" => H::SPEC.name).increment(1);
            for a in attempts {
                tracing::error!(
                    stage = %H::SPEC.name,
                    subject = %a.subject,
                    seq = a.stream_sequence,
                    delivered = a.delivered,
                    panic = %why,
                    "the handler panicked"
                );
            }
            return (0..n)
                .map(|_| {
                    Err(StageError::Transient(anyhow::anyhow!(
                        "the handler panicked: {why}"
                    )))
                })
                .collect();
        }
    };
    if outcomes.len() == n {
        return outcomes;
    }
    let why = format!(
        "the stage returned {} outcomes for {n} inputs",
        outcomes.len()
    );
    (0..n)
        .map(|_| Err(StageError::Transient(anyhow::anyhow!("{why}"))))
        .collect()
}

/// What a panic said, when it said it with a string (as `panic!` and `expect` do).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

async fn handle_one<H: BatchStage>(h: &H, input: H::Input, attempt: &Attempt) -> Outcome {
    handle(h, vec![input], std::slice::from_ref(attempt))
        .await
        .pop()
        .expect("one outcome per input")
}

/// The span of one message's handling by one stage: in the trace the message came with
/// (its `traceparent` header), named by the stage in the exported trace.
fn message_span(stage: &'static str, msg: &jetstream::Message, attempt: &Attempt) -> tracing::Span {
    let span = tracing::info_span!(
        "stage",
        otel.name = stage,
        otel.kind = "consumer",
        stage = %stage,
        correlation_id = %attempt.correlation_id,
        seq = attempt.stream_sequence,
        delivered = attempt.delivered
    );
    if crate::trace::enabled() {
        let header = |name| {
            msg.headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str())
        };
        crate::trace::continue_from(
            &span,
            header(crate::trace::TRACEPARENT),
            header(crate::trace::TRACESTATE),
        );
    }
    span
}

/// An attempt's facts, from the message's JetStream metadata and headers.
fn attempt_of(msg: &jetstream::Message) -> Attempt {
    let (delivered, stream_sequence) = match msg.info() {
        Ok(i) => (i.delivered.max(1) as u64, i.stream_sequence),
        Err(_) => (1, 0),
    };
    Attempt {
        subject: msg.subject.to_string(),
        delivered,
        stream_sequence,
        correlation_id: msg
            .headers
            .as_ref()
            .and_then(|h| h.get(HEADER_CORRELATION))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default(),
        waits: 0,
        waited: Duration::ZERO,
    }
}

fn crash_loop(attempt: &Attempt, opts: &StageOptions) -> GiveUp {
    GiveUp::Crashing {
        delivered: attempt.delivered,
        max: opts.max_deliver,
    }
}

/// Collect the stage's finished tasks. A handler's panic is caught where it runs (see
/// `handle`); one here is the runtime's own, and its message comes back after `ack_wait`.
fn reap(stage: &'static str, tasks: &mut JoinSet<()>) {
    while let Some(done) = tasks.try_join_next() {
        if let Err(e) = done
            && e.is_panic()
        {
            metrics::counter!("sb_stage_panics_total", "stage" => stage).increment(1);
            tracing::error!(stage = %stage, error = %e, "a stage task panicked");
        }
    }
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
mod tests;
