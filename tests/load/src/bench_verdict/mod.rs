//! The bench's verdict, as a pure function of what a run measured.
//!
//! - [`Targets`]: the targets and the machine they apply to, read from
//!   `tests/bench-targets.toml` ([`Targets::load`]).
//! - [`Measured`]: plain data the bench fills in (and writes to `results.json`, so
//!   `bench --judge <results.json>` judges a recorded run again).
//! - [`judge`] checks every target (met, missed, or not run); [`verdict`] keeps the misses,
//!   and a target not run is a miss: a run that did not measure a target has not shown it met
//!   (`bench --scenarios 2` is for trying a scenario out, and fails naming the others).
//!
//! Besides the numeric targets, every scenario fails on any message never accepted, any
//! accepted message never answered, any reply sent twice, any turn called twice at the runner,
//! any order violation or overlap of one person's turns, and any dead letter. A scenario run
//! with other parameters than the targets name (a shorter window, another rate) fails too: its
//! numbers do not measure what the target says.
//!
//! Latency percentiles count every message accepted in the window: the unanswered ones as
//! slower than any answered one, shown as `> window` ([`overhead`]), so a scenario in which
//! most messages are never answered cannot report a good p50 from the few that were.

mod checks;
mod latency;
mod measured;
mod outcome;
mod targets;

pub use super::memory_lag::{MemoryMeasured, MemoryWorkersTarget};
pub use checks::judge;
pub use latency::{Overhead, Quantile, overhead};
pub use measured::{Findings, FloorMeasured, IoCounts, MachineSeen, Measured, ScenarioMeasured};
pub use outcome::{
    Check, FLOOR, HALF_LOAD, IN_FLIGHT, MAX_THROUGHPUT, Outcome, missed, not_run, verdict,
};
pub use targets::{
    FloorTarget, HalfLoadTarget, InFlightTarget, Machine, MaxThroughputTarget, Targets,
    machine_differences,
};

/// Examples kept per kind of finding.
pub const EXAMPLES: usize = 10;

/// How an unanswered message's latency is shown.
pub const BEYOND_WINDOW: &str = "> window";

#[cfg(test)]
mod tests;
