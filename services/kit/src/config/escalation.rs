//! `[escalation]`: which labels of the categoriser ask for a person to step in.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct EscalationConfig {
    /// An exchange labelled with one of these (`[categorise] labels` names) raises an
    /// escalation: `session.escalated`, the console's queue, `sb_escalations_raised_total`.
    /// Empty: nothing escalates.
    pub labels: Vec<String>,
}

impl Default for EscalationConfig {
    fn default() -> Self {
        Self {
            labels: vec!["escalation".into(), "incident_report".into()],
        }
    }
}
