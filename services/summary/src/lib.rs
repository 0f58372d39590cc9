//! The summary worker: once a person + agent identity has gone quiet (or a reset or an engine
//! switch asks), the summary of their memory key takes in every message it does not cover yet,
//! across all the identity's engine variants and channels, in order. Every sibling session
//! reads it (dispatch puts it in the prompt and `summary.md`).
//!
//! - [`sweep`]: each worker process finds quiet conversations and publishes `SummaryDue` on
//!   `{p}.events.summary.due`, with a dedupe id of (memory key, newest unsummarised message,
//!   summary version), so replicas publishing the same item make one message, and once a run
//!   has written a version the next sweep's item is a new one.
//! - [`SummaryStage`] (`summary`): merges the messages no version has merged yet
//!   (`message_marks.summary_version` NULL, so one logged late with an old id is merged by the next
//!   version) with the configured model, or extractively when none is, and writes with
//!   compare-and-set on the version, marking exactly the merged messages in the same
//!   transaction: a replica that lost the race writes nothing, so no message is summarised
//!   twice.
//! - A summary is never lost or emptied: when the model fails, times out, answers garbage,
//!   nothing, or over the cap, the old summary stays, the messages stay unsummarised, and the
//!   item waits and is tried again (a dead letter with the reason only after `max_wait`).
use std::time::Duration;

use sqlx::PgPool;
use switchboard_kit::memory_config::SummaryConfig;
use switchboard_kit::proto::{SessionSummarised, SummaryDue};
use switchboard_kit::retry::Backoff;
use switchboard_kit::startup::{App, Task};
use switchboard_kit::{Attempt, Output, Stage, StageError, Topology};
use switchboard_kit::{Registration, Source, StageSpec};
use switchboard_memory::ChatModel;

pub mod merge;
pub mod store;
pub mod sweep;

use merge::MergeError;
use store::{NewSummary, Written};

/// Messages logged less than this long ago are left for a later run (see `handle`): so that
/// a message logged a moment late is still merged in its place. One logged later still is
/// merged by the next version (it stays unsummarised until then).
pub const LOG_SETTLE: Duration = Duration::from_secs(10);

/// Why a summary was asked for (`SummaryDue.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The conversation went quiet (the sweeper).
    Idle,
    /// The session started a fresh engine session.
    Reset,
    /// A session of another engine variant of the identity opened.
    EngineSwitch,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Idle => "idle",
            Reason::Reset => "reset",
            Reason::EngineSwitch => "engine_switch",
        }
    }
}

/// The dedupe id of a due item ([`SummaryDue::dedupe_id`]).
pub fn due_id(memory_key: &str, newest: &uuid::Uuid, version: i64) -> String {
    SummaryDue::dedupe_id(memory_key, newest, version)
}

#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("summary item has no memory key")]
    NoMemoryKey,
    #[error("summary store: {0}")]
    Database(#[from] sqlx::Error),
}

/// The summary stage: `{p}.events.summary.due` → `switchboard.summaries` + `session.summarised`.
pub struct SummaryStage {
    db: PgPool,
    topology: Topology,
    config: SummaryConfig,
    model: Option<ChatModel>,
    /// How long a refused model answer waits before the item is tried again (grows).
    retry: Backoff,
}

impl SummaryStage {
    pub fn new(
        db: PgPool,
        topology: Topology,
        config: SummaryConfig,
        model: Option<ChatModel>,
        retry: Backoff,
    ) -> Self {
        Self {
            db,
            topology,
            config,
            model,
            retry,
        }
    }

    /// The `session.summarised` event of a version (the same id for the same version, so a
    /// repeat is dropped).
    fn event(&self, due: &SummaryDue, e: SessionSummarised) -> Output {
        Output::new(
            self.topology.event("session.summarised"),
            format!("{}:v{}", due.memory_key, e.version),
            &e,
        )
    }
}

impl Stage for SummaryStage {
    type Input = SummaryDue;
    // A model outage is waited out (not counted as failures) for up to 6 h, then the item
    // is dead-lettered with the model's last reason; the sweeper asks again later anyway.
    const SPEC: StageSpec = StageSpec::new("summary", Source::Events("summary.due"))
        .concurrency(4)
        .max_wait(Duration::from_secs(6 * 3600));

    async fn handle(&self, due: SummaryDue, attempt: &Attempt) -> Result<Vec<Output>, StageError> {
        if due.memory_key.is_empty() {
            return Err(StageError::permanent(SummaryError::NoMemoryKey));
        }
        let transient = |e: sqlx::Error| StageError::transient(SummaryError::Database(e));
        let read = store::current(&self.db, &due.memory_key)
            .await
            .map_err(transient)?;
        let limit = i64::try_from(self.config.max_messages.max(1)).unwrap_or(i64::MAX);
        let mut messages = store::unsummarised(&self.db, &due.memory_key, limit)
            .await
            .map_err(transient)?;
        if messages.is_empty() {
            // Nothing new: another replica or an earlier item did it. After a crash between
            // the write and its event, the event goes out now (its id drops a repeat).
            if attempt.delivered > 1 && read.version > 0 {
                return Ok(vec![self.event(&due, summarised(&due, &read, 0))]);
            }
            return Ok(Vec::new());
        }
        let fetched = messages.len();
        // Stop before the first message logged too recently: one logged a moment later with
        // an older id (its turn's log stage lagging) is then merged in its place. (One logged
        // later still is merged by the next version.)
        let now = chrono::Utc::now();
        let settled = messages
            .iter()
            .position(|m| (now - m.created_at).to_std().unwrap_or_default() < LOG_SETTLE)
            .unwrap_or(fetched);
        if settled == 0 {
            return Err(StageError::Defer(
                LOG_SETTLE,
                "the newest messages to be logged".into(),
            ));
        }
        messages.truncate(settled);
        if let Some(model) = &self.model {
            let budget = model.max_prompt_chars().saturating_sub(
                merge::system_prompt(self.config.max_summary_chars)
                    .chars()
                    .count(),
            );
            let n = merge::fitting(&read.text, &messages, budget);
            messages.truncate(n);
        }
        let merged = messages.len() as i64;
        let covered_after = (read.messages_covered + merged).max(0) as u64;
        let (text, method) = match merge::merge(
            self.model.as_ref(),
            &read.text,
            &messages,
            covered_after,
            self.config.max_summary_chars,
        )
        .await
        {
            Ok(done) => done,
            Err(e) => return Err(self.refused(&due, e, attempt)),
        };
        let ids: Vec<uuid::Uuid> = messages.iter().map(|m| m.id).collect();
        let written = store::write(
            &self.db,
            &read,
            &NewSummary {
                memory_key: &due.memory_key,
                person_id: &due.person_id,
                agent_identity: &due.agent_identity,
                text: &text,
                method: method.as_str(),
                merged: &ids,
            },
        )
        .await
        .map_err(transient)?;
        let Written::Version {
            version,
            first,
            last,
            covered,
        } = written
        else {
            metrics::counter!("sb_summary_lost_races_total").increment(1);
            tracing::info!(memory_key = %due.memory_key, "another replica summarised first");
            return Ok(Vec::new());
        };
        metrics::counter!("sb_summaries_written_total", "method" => method.as_str()).increment(1);
        let after = store::Current {
            exists: true,
            text,
            method: method.as_str().to_string(),
            version,
            first_message: Some(first),
            last_message: Some(last),
            messages_covered: covered,
        };
        let mut out = vec![self.event(&due, summarised(&due, &after, merged))];
        if fetched as i64 == limit || messages.len() < fetched {
            // Capped (by `max_messages` or the prompt) or stopped at a message logged too
            // recently: the rest goes in a run of its own (a new id, made from the version
            // just written), at once or once they have settled (that run defers until then).
            out.push(Output::new(
                self.topology.summary_due(),
                format!("{}:after:v{version}", due.memory_key),
                &due,
            ));
        }
        Ok(out)
    }
}

impl SummaryStage {
    /// A refused merge: the old summary stays, nothing is marked summarised; the item waits
    /// (growing delays) and is tried again, up to the stage's `max_wait`.
    fn refused(&self, due: &SummaryDue, e: MergeError, attempt: &Attempt) -> StageError {
        metrics::counter!("sb_summary_refused_total").increment(1);
        tracing::warn!(
            memory_key = %due.memory_key,
            error = %e,
            "the summary was not rewritten; the messages stay unsummarised and are tried again"
        );
        let after = self.retry.jittered(u64::from(attempt.waits) + 1);
        StageError::Defer(after, format!("a summary the model would write: {e}"))
    }
}

fn summarised(due: &SummaryDue, s: &store::Current, merged: i64) -> SessionSummarised {
    let id = |u: Option<uuid::Uuid>| u.map(|u| u.to_string()).unwrap_or_default();
    SessionSummarised {
        memory_key: due.memory_key.clone(),
        person_id: due.person_id.clone(),
        agent_identity: due.agent_identity.clone(),
        version: s.version,
        first_message_id: id(s.first_message),
        last_message_id: id(s.last_message),
        messages_merged: merged,
        messages_covered: s.messages_covered,
        method: s.method.clone(),
        summarised_at_ms: switchboard_kit::now_ms(),
    }
}

/// The summary stage, as the product lists it.
pub const STAGE: Registration = Registration {
    spec: SummaryStage::SPEC,
    worker: "summary",
    start: task,
};

fn task(app: &App) -> Task {
    let c = &app.config;
    let opts = app.stage_options(&SummaryStage::SPEC);
    let stage = SummaryStage::new(
        app.db.clone(),
        app.topology.clone(),
        c.summary.clone(),
        ChatModel::from_config(&c.llm),
        opts.retry,
    );
    let run = app.stage_task(stage);
    let sweeper = sweep::Sweeper::new(
        app.db.clone(),
        app.runtime(),
        app.topology.clone(),
        c.summary.clone(),
    );
    // The sweeper runs beside the stage, until the stage has drained.
    Box::pin(async move {
        tokio::select! {
            r = run => r,
            _ = sweeper.run() => unreachable!("the sweeper never returns"),
        }
    })
}
