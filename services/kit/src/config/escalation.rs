//! `[escalation]`: which labels of the categoriser ask for a person to step in, and what the
//! person is told when one does (a takeover).
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct EscalationConfig {
    /// An exchange labelled with one of these (`[categorise] labels` names) raises an
    /// escalation: `session.escalated`, the console's queue, `sb_escalations_raised_total`.
    /// Empty: nothing escalates.
    pub labels: Vec<String>,
    /// Sent to the person when an operator takes their conversation over (as the operator's
    /// first reply, on their channel). Empty: they are not told.
    pub takeover_notice: String,
}

impl Default for EscalationConfig {
    fn default() -> Self {
        Self {
            labels: vec!["escalation".into(), "incident_report".into()],
            takeover_notice: String::new(),
        }
    }
}
