//! The sweeper: every `[summary] sweep_every_s`, each summary worker finds the conversations
//! that went quiet with messages their summary does not cover, and asks for their summary. So a
//! summary happens even if the person never writes again. Every replica sweeps; the items they
//! publish for the same newest unsummarised message and summary version carry the same dedupe
//! id, so JetStream keeps one.
use std::time::Duration;

use sqlx::PgPool;
use switchboard_kit::memory_config::SummaryConfig;
use switchboard_kit::proto::SummaryDue;
use switchboard_kit::runtime::Runtime;
use switchboard_kit::{Output, Topology};

use crate::{Reason, due_id, store};

/// Quiet conversations asked for at most per sweep (the rest at the next).
const PER_SWEEP: i64 = 500;

pub struct Sweeper {
    db: PgPool,
    runtime: Runtime,
    topology: Topology,
    config: SummaryConfig,
}

impl Sweeper {
    pub fn new(db: PgPool, runtime: Runtime, topology: Topology, config: SummaryConfig) -> Self {
        Self {
            db,
            runtime,
            topology,
            config,
        }
    }

    /// Sweep for as long as the future runs.
    pub async fn run(&self) {
        let every = Duration::from_secs(self.config.sweep_every_s.max(1));
        loop {
            match self.sweep().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(conversations = n, "asked for summaries"),
                // Tried again at the next sweep.
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "summary sweep failed"),
            }
            tokio::time::sleep(every).await;
        }
    }

    /// One sweep: the number of summaries asked for.
    pub async fn sweep(&self) -> anyhow::Result<usize> {
        let quiet = store::quiet(&self.db, self.config.idle_gap_s, PER_SWEEP).await?;
        for q in &quiet {
            let due = SummaryDue {
                memory_key: q.memory_key.clone(),
                person_id: q.person_id.clone(),
                agent_identity: q.agent_identity.clone(),
                reason: Reason::Idle.as_str().into(),
            };
            let out = Output::new(
                self.topology.summary_due(),
                due_id(&q.memory_key, &q.newest, q.version),
                &due,
            );
            self.runtime.publish("summary", &out).await?;
        }
        Ok(quiet.len())
    }
}
