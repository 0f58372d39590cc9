//! The verdict: each target's [`Outcome`] as a [`Check`], how a check is printed, and which
//! checks a run missed.
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Measured, Targets, judge};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Met,
    Missed,
    /// The scenario was not run: a miss, the target not shown met.
    NotRun,
}

/// One target checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub scenario: String,
    pub target: String,
    pub measured: String,
    pub outcome: Outcome,
    /// What shows a miss: message texts, example lines.
    pub evidence: Vec<String>,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.outcome {
            Outcome::Met => "met",
            Outcome::Missed => "MISSED",
            Outcome::NotRun => "NOT RUN",
        };
        write!(
            f,
            "[{tag}] {}: {}: measured {}",
            self.scenario, self.target, self.measured
        )?;
        for e in &self.evidence {
            write!(f, "\n        {e}")?;
        }
        Ok(())
    }
}

pub const MAX_THROUGHPUT: &str = "max throughput";
pub const FLOOR: &str = "pipeline ÷ floor";
pub const HALF_LOAD: &str = "half load";
pub const IN_FLIGHT: &str = "in flight";

/// The targets missed, those not run included. Empty: the run passed.
pub fn verdict(t: &Targets, m: &Measured) -> Vec<Check> {
    missed(&judge(t, m)).into_iter().cloned().collect()
}

/// The checks a run missed, a target not run among them: it passed when there are none.
pub fn missed(checks: &[Check]) -> Vec<&Check> {
    checks
        .iter()
        .filter(|c| c.outcome != Outcome::Met)
        .collect()
}

/// The scenarios of the targets not run, once each, in the order checked.
pub fn not_run(checks: &[Check]) -> Vec<&str> {
    let mut scenarios: Vec<&str> = Vec::new();
    for c in checks.iter().filter(|c| c.outcome == Outcome::NotRun) {
        if !scenarios.contains(&c.scenario.as_str()) {
            scenarios.push(&c.scenario);
        }
    }
    scenarios
}
