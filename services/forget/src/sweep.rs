//! The forget-sweep stage: the stream half of an erasure job ([`crate::job`]).
//!
//! Its input names only the job; the row says what names the person. The message is stored
//! before the erasure's transaction commits, so the stage first waits for that transaction to
//! be over (the transaction holds the job's lock): no row then means it rolled back, and the
//! message is dropped.
//!
//! Then it sweeps the work, events and dead-letter streams ([`crate::streams`]), leaving the
//! messages a stage has in hand (deleting one would hide from the stage's consumer that its
//! handler is still at work), and records each stream's last sequence at that sweep (its mark)
//! with the counts in the job (`sweeping`). A handler that read the person's data before the
//! commit (an embedding under way, an agent's answer on its way back) may publish after that
//! sweep, and what it publishes would name them for good; so the stage waits until every
//! stage has finished each message its stream held at the mark (the runtime acks a message
//! only once its outputs are published), then sweeps what was left and what came after the
//! marks. A handler that starts after the commit finds the rows gone and the tombstone there
//! (each stage checks it), so it names no one. Then it publishes `person.forgotten` (a reader
//! told of the erasure sees no event naming them after) and marks the job `done`.
//!
//! Every step is safe to run again, and the input is acked only at the end: a worker that dies
//! midway leaves the message to a redelivery, which goes on from the job's row (the first
//! sweep's marks are kept; `person.forgotten` is deduplicated by the job). Deletes that keep
//! failing end the job `failed`, with them listed, and nothing is announced.
//!
//! Waiting is [`StageError::Defer`]: parked, not a failure, bounded by the stage's `max_wait`
//! (then a dead letter says which stage was still busy; replaying it finishes the job).
use std::time::Duration;

use async_nats::jetstream;
use prost::Message as _;
use sqlx::PgPool;
use switchboard_kit::proto::{ForgetSweep, PersonForgotten, StreamMark};
use switchboard_kit::startup::{App, Task};
use switchboard_kit::{
    Attempt, Outcome, Registration, Source, Stage, StageError, StageSpec, Topology,
};
use uuid::Uuid;

use crate::job::{self, JobStatus};
use crate::streams::{self, Names, SweepError};

/// How often a waiting last step asks the stages' consumers again.
const RECHECK: Duration = Duration::from_millis(500);

pub struct ForgetSweepStage {
    db: PgPool,
    js: jetstream::Context,
    topology: Topology,
}

impl ForgetSweepStage {
    pub fn new(db: PgPool, js: jetstream::Context, topology: Topology) -> Self {
        Self { db, js, topology }
    }

    /// The first stage consumer still handling something its stream held at `marks`, if any.
    async fn busy(&self, marks: &[StreamMark]) -> Result<Option<String>, SweepError> {
        for stream in [self.topology.work_stream(), self.topology.events_stream()] {
            let Some(mark) = marks.iter().find(|m| m.stream == stream) else {
                continue;
            };
            if mark.last_sequence == 0 {
                continue;
            }
            let consumers = streams::stage_consumers(&self.js, &stream).await?;
            if let Some(busy) = consumers.into_iter().find(|c| {
                c.name != Self::SPEC.name && !c.progress.finished_through(mark.last_sequence)
            }) {
                return Ok(Some(busy.name));
            }
        }
        Ok(None)
    }
}

impl Stage for ForgetSweepStage {
    type Input = ForgetSweep;
    // A turn in flight for the person may take as long as their agent does.
    const SPEC: StageSpec = StageSpec::new("forget-sweep", Source::Work("forget"))
        .max_wait(Duration::from_secs(6 * 3600));

    async fn handle(&self, work: ForgetSweep, _attempt: &Attempt) -> Outcome {
        let id: Uuid = work.job_id.parse().map_err(|_| {
            StageError::permanent(anyhow::anyhow!(
                "a forget sweep without an erasure job (job_id {:?})",
                work.job_id
            ))
        })?;
        let Some(state) = job::work(&self.db, id)
            .await
            .map_err(StageError::transient)?
        else {
            tracing::info!(job = %id, "an erasure rolled back: nothing to sweep");
            return Ok(Vec::new());
        };
        if state.status.is_final() {
            return Ok(Vec::new());
        }
        let pending = state
            .pending
            .as_deref()
            .map(ForgetSweep::decode)
            .transpose()
            .map_err(|e| StageError::permanent(anyhow::anyhow!("job {id}: {e}")))?
            .ok_or_else(|| StageError::permanent(anyhow::anyhow!("job {id} names no one")))?;
        let names = Names::from_sweep(&pending);
        let (mut removed, mut failures) = (state.removed, state.failures);
        let marks = match state.marks {
            Some(marks) => marks,
            None => {
                let (swept, marks) = streams::sweep(&self.js, &self.topology, &names)
                    .await
                    .map_err(StageError::transient)?;
                let senders = names.senders.clone();
                let keys = streams::purge_arrival_keys(&self.js, &self.topology, &senders)
                    .await
                    .map_err(StageError::transient)?;
                *removed.entry("stream_messages".into()).or_default() += swept.stream_messages;
                *removed.entry("dead_letters".into()).or_default() += swept.dead_letters;
                *removed.entry("arrival_keys".into()).or_default() += keys;
                failures.extend(swept.failures);
                job::swept_once(&self.db, id, &marks, &removed, &failures)
                    .await
                    .map_err(StageError::transient)?;
                switchboard_kit::failpoint::crash_at("forget.swept_once");
                marks
            }
        };
        match self.busy(&marks).await {
            Ok(None) => {}
            Ok(Some(stage)) => {
                return Err(StageError::Defer(
                    RECHECK,
                    format!("{stage} to finish what it held when the person was forgotten"),
                ));
            }
            Err(e) => return Err(StageError::transient(e)),
        }
        let swept = streams::sweep_after(&self.js, &self.topology, &names, &marks)
            .await
            .map_err(StageError::transient)?;
        let late = swept.stream_messages + swept.dead_letters;
        metrics::counter!("sb_forget_late_swept_total").increment(late as u64);
        if late > 0 {
            tracing::info!(
                stream_messages = swept.stream_messages,
                dead_letters = swept.dead_letters,
                "messages published while a person was being forgotten were swept"
            );
        }
        *removed.entry("stream_messages".into()).or_default() += swept.stream_messages;
        *removed.entry("dead_letters".into()).or_default() += swept.dead_letters;
        failures.extend(swept.failures);
        if failures.is_empty() {
            let event = PersonForgotten {
                person_id: pending.person_id.clone(),
                removed: removed.clone().into_iter().collect(),
                forgotten_at_ms: pending.forgotten_at_ms,
            };
            streams::announce(&self.js, &self.topology, &event)
                .await
                .map_err(StageError::transient)?;
            switchboard_kit::failpoint::crash_at("forget.announced");
        }
        let status = job::finish(&self.db, id, &removed, &failures)
            .await
            .map_err(StageError::transient)?;
        if status == JobStatus::Failed {
            metrics::counter!("sb_forget_failed_total").increment(1);
            tracing::error!(
                job = %id,
                failures = failures.len(),
                "an erasure left stored messages it could not delete: the job failed"
            );
        }
        Ok(Vec::new())
    }
}

pub const STAGE: Registration = Registration {
    spec: ForgetSweepStage::SPEC,
    // Its own worker: erasures are rare, and slow to wait for; no other stage waits on it.
    worker: "forget",
    start: task,
};

fn task(app: &App) -> Task {
    app.stage_task(ForgetSweepStage::new(
        app.db.clone(),
        app.js.clone(),
        app.topology.clone(),
    ))
}
#[cfg(test)]
mod tests {
    use crate::streams::Progress;

    fn consumer(ack_floor: u64, delivered: u64, in_hand: usize, undelivered: u64) -> Progress {
        Progress {
            ack_floor,
            delivered,
            in_hand,
            undelivered,
        }
    }

    #[test]
    fn a_consumer_is_done_with_the_mark_once_nothing_at_or_below_it_is_unacked() {
        // Acked past the mark.
        assert!(consumer(12, 14, 1, 0).finished_through(10));
        // Everything delivered is acked, nothing waits.
        assert!(consumer(8, 8, 0, 0).finished_through(10));
        // Delivered past the mark, all acked.
        assert!(consumer(11, 11, 0, 3).finished_through(10));
        // A message at or below the mark still being handled.
        assert!(!consumer(8, 10, 1, 0).finished_through(10));
        // Nothing in hand, but messages not yet delivered (maybe below the mark).
        assert!(!consumer(8, 8, 0, 2).finished_through(10));
    }
}
