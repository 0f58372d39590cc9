//! The escalation worker: an exchange the categoriser labelled with one of `[escalation]
//! labels` (by default `escalation` and `incident_report`) asks for a person to step in. It
//! follows `exchange.categorised`, raises the escalation once per (reply, label) with its
//! journal entry ([`store::raise`]), announces `session.escalated`, and counts it
//! (`sb_escalations_raised_total{label}`). The console lists open ones first; an operator
//! acknowledges them (`POST /api/v1/escalations/{id}/acknowledge`).
use std::collections::BTreeSet;

use switchboard_kit::proto::{ExchangeCategorised, SessionEscalated};
use switchboard_kit::startup::App;
use switchboard_kit::topology::Topology;
use switchboard_kit::{
    Attempt, Outcome, Output, Registration, Source, Stage, StageError, StageSpec,
};
use uuid::Uuid;

pub mod store;

pub use store::{Escalation, NewEscalation, QueuedEscalation, Raised};

#[derive(Debug, thiserror::Error)]
pub enum EscalateError {
    #[error("event is malformed: {0}")]
    Malformed(String),
    #[error("escalations: {0}")]
    Database(#[from] sqlx::Error),
}

impl From<EscalateError> for StageError {
    fn from(e: EscalateError) -> Self {
        match e {
            EscalateError::Malformed(_) => StageError::permanent(e),
            EscalateError::Database(_) => StageError::transient(e),
        }
    }
}

pub struct EscalateStage {
    db: sqlx::PgPool,
    topology: Topology,
    labels: BTreeSet<String>,
}

impl EscalateStage {
    pub fn new(db: sqlx::PgPool, topology: Topology, labels: &[String]) -> Self {
        for label in labels {
            // Listed from the start, at 0: a dashboard sees the series before the first one.
            metrics::counter!("sb_escalations_raised_total", "label" => label.clone()).increment(0);
        }
        Self {
            db,
            topology,
            labels: labels.iter().cloned().collect(),
        }
    }

    /// The labelled exchange as an escalation to raise, when its label is one.
    pub fn escalation_of(
        &self,
        event: &ExchangeCategorised,
    ) -> Result<Option<NewEscalation>, EscalateError> {
        if !self.labels.contains(&event.label) {
            return Ok(None);
        }
        let id = |what: &str, v: &str| {
            v.parse::<Uuid>()
                .map_err(|_| EscalateError::Malformed(format!("{what} {v:?} is not a UUID")))
        };
        Ok(Some(NewEscalation {
            session_id: id("session_id", &event.session_id)?,
            person_id: event.person_id.clone(),
            agent_identity: event.agent_identity.clone(),
            channel: event.channel.clone(),
            label: event.label.clone(),
            inbound_message_id: match event.inbound_message_id.as_str() {
                "" => None,
                v => Some(id("inbound_message_id", v)?),
            },
            outbound_message_id: id("outbound_message_id", &event.outbound_message_id)?,
        }))
    }

    fn event(&self, e: &Escalation) -> Output {
        let event = SessionEscalated {
            escalation_id: e.id.to_string(),
            session_id: e.session_id.to_string(),
            person_id: e.person_id.clone(),
            agent_identity: e.agent_identity.clone(),
            channel: e.channel.clone(),
            label: e.label.clone(),
            inbound_message_id: e
                .inbound_message_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            outbound_message_id: e.outbound_message_id.to_string(),
            raised_at_ms: e.raised_at.timestamp_millis(),
        };
        Output::new(
            self.topology.event("session.escalated"),
            format!("escalated:{}", e.id),
            &event,
        )
    }
}

impl Stage for EscalateStage {
    type Input = ExchangeCategorised;
    const SPEC: StageSpec = StageSpec::new("escalate", Source::Events("exchange.categorised"));

    async fn handle(&self, event: ExchangeCategorised, _attempt: &Attempt) -> Outcome {
        let Some(new) = self.escalation_of(&event)? else {
            return Ok(vec![]);
        };
        let raised = store::raise(&self.db, &new)
            .await
            .map_err(EscalateError::from)?;
        match raised {
            Raised::New(e) => {
                metrics::counter!("sb_escalations_raised_total", "label" => e.label.clone())
                    .increment(1);
                tracing::info!(escalation = %e.id, session = %e.session_id, label = %e.label,
                    "escalation raised");
                Ok(vec![self.event(&e)])
            }
            // Raised by an earlier delivery, which may have stopped before its event went out:
            // the event again, under the same id (the stream drops a duplicate).
            Raised::Before(e) => Ok(vec![self.event(&e)]),
            Raised::SessionGone => Ok(vec![]),
        }
    }
}

/// The escalation worker, as the product lists it (`switchboard worker escalate`).
pub const STAGE: Registration = Registration {
    spec: EscalateStage::SPEC,
    worker: "escalate",
    start: |app: &App| {
        app.stage_task(EscalateStage::new(
            app.db.clone(),
            app.topology.clone(),
            &app.config.escalation.labels,
        ))
    },
};
