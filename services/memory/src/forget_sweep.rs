//! The forget-sweep stage: the last step of erasing a person.
//!
//! [`crate::forget`] sweeps the streams right after its commit, but a handler that read the
//! person's data before the commit (an embedding under way, an agent's answer on its way back)
//! may publish after that sweep, and what it publishes would name them for good. So the first
//! sweep leaves the messages a stage has in hand (deleting one would hide from the stage's
//! consumer that its handler is still at work), and the erasure queues a [`ForgetSweep`] with
//! each stream's last sequence at that sweep (its mark) and the first message it left. This
//! stage waits until every stage has finished each message its stream held at the mark — the
//! runtime acks a message only once its outputs are published — then sweeps what was left and
//! what the streams received after the marks. A handler that starts after the commit finds the
//! rows gone and the tombstone there (each stage checks it), so it names no one. Then it
//! publishes `person.forgotten`: a reader told of the erasure sees no event naming them after.
//!
//! Waiting is [`StageError::Defer`]: parked, not a failure, bounded by the stage's `max_wait`
//! (then a dead letter says which stage was still busy; replaying it sweeps again).
use std::time::Duration;

use async_nats::jetstream;
use switchboard_kit::proto::{ForgetSweep, PersonForgotten, StreamMark};
use switchboard_kit::startup::{App, Task};
use switchboard_kit::{
    Attempt, Outcome, Registration, Source, Stage, StageError, StageSpec, Topology,
};

use crate::forget_streams::{self, Names, SweepError};

/// How often a waiting last step asks the stages' consumers again.
const RECHECK: Duration = Duration::from_millis(500);

pub struct ForgetSweepStage {
    js: jetstream::Context,
    topology: Topology,
}

impl ForgetSweepStage {
    pub fn new(js: jetstream::Context, topology: Topology) -> Self {
        Self { js, topology }
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
            let consumers = forget_streams::stage_consumers(&self.js, &stream).await?;
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

    async fn handle(&self, job: ForgetSweep, _attempt: &Attempt) -> Outcome {
        if job.person_id.is_empty() {
            return Err(StageError::permanent(anyhow::anyhow!(
                "a forget sweep names no person"
            )));
        }
        match self.busy(&job.marks).await {
            Ok(None) => {}
            Ok(Some(stage)) => {
                return Err(StageError::Defer(
                    RECHECK,
                    format!("{stage} to finish what it held when the person was forgotten"),
                ));
            }
            Err(e) => return Err(StageError::transient(e)),
        }
        let names = Names::from_sweep(&job);
        let swept = forget_streams::sweep_after(&self.js, &self.topology, &names, &job.marks)
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
        let event = PersonForgotten {
            person_id: job.person_id.clone(),
            removed: job.removed.clone(),
            forgotten_at_ms: job.forgotten_at_ms,
        };
        forget_streams::announce(&self.js, &self.topology, &event)
            .await
            .map_err(StageError::transient)?;
        Ok(Vec::new())
    }
}

pub const STAGE: Registration = Registration {
    spec: ForgetSweepStage::SPEC,
    // Rare and light: it runs in the log worker, the one that keeps the record it cleans up.
    worker: "log",
    start: task,
};

fn task(app: &App) -> Task {
    app.stage_task(ForgetSweepStage::new(app.js.clone(), app.topology.clone()))
}

#[cfg(test)]
mod tests {
    use crate::forget_streams::Progress;

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
