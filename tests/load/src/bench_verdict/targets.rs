//! The targets and the machine they apply to: `tests/bench-targets.toml`.
use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::{MachineSeen, MemoryWorkersTarget};

/// `tests/bench-targets.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    pub machine: Machine,
    pub max_throughput: MaxThroughputTarget,
    pub floor: FloorTarget,
    pub half_load: HalfLoadTarget,
    pub in_flight: InFlightTarget,
    pub memory_workers: MemoryWorkersTarget,
}

/// The machine the targets apply to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    /// In words, as printed with the results.
    pub description: String,
    pub cores: usize,
    pub memory_gib: f64,
    /// `std::env::consts::OS` / `ARCH`.
    pub os: String,
    pub arch: String,
    pub release_build: bool,
}

/// Scenario 1: instant runner, closed loop (each sender one turn in flight).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxThroughputTarget {
    pub runner_ms: u64,
    pub window_s: u64,
    pub min_turns_per_s: f64,
}

/// The floor (the same durable I/O per turn, no logic), measured like scenario 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloorTarget {
    /// Scenario 1's turns/s ÷ the floor's, at least.
    pub min_pipeline_share: f64,
    /// What both scenario 1 and the floor run with: Postgres connections per worker process
    /// (per stage for the floor), turn partitions, and sessions (each one turn in flight).
    pub db_pool: u32,
    pub partitions: u32,
    pub sessions: usize,
}

/// Scenario 2: open loop at a share of scenario 1's throughput, instant runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HalfLoadTarget {
    /// Offered rate ÷ scenario 1's turns/s.
    pub share_of_max: f64,
    pub window_s: u64,
    pub max_overhead_p50_ms: f64,
    pub max_overhead_p99_ms: f64,
}

/// Scenario 3: open loop with a slow runner, so that many calls are in flight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InFlightTarget {
    pub rate_per_s: f64,
    pub runner_ms: u64,
    pub window_s: u64,
    pub max_overhead_p99_ms: f64,
    pub max_stack_rss_mb: f64,
}

impl Targets {
    pub fn parse(text: &str) -> anyhow::Result<Targets> {
        toml::from_str(text).context("reading the bench targets")
    }

    pub fn load(path: &Path) -> anyhow::Result<Targets> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in {}", path.display()))
    }
}

/// Where the machine differs from the one the targets are for (a note, not a failure: the
/// targets say what this design must do on that machine).
pub fn machine_differences(t: &Machine, seen: &MachineSeen) -> Vec<String> {
    let mut d = Vec::new();
    if t.cores != seen.cores {
        d.push(format!("{} cores, not {}", seen.cores, t.cores));
    }
    if (seen.memory_gib - t.memory_gib).abs() > 0.1 * t.memory_gib {
        d.push(format!(
            "{:.1} GiB, not {} GiB",
            seen.memory_gib, t.memory_gib
        ));
    }
    if t.os != seen.os || t.arch != seen.arch {
        d.push(format!(
            "{} {}, not {} {}",
            seen.os, seen.arch, t.os, t.arch
        ));
    }
    if t.release_build != seen.release_build {
        d.push(format!(
            "a {} build",
            if seen.release_build {
                "release"
            } else {
                "debug"
            }
        ));
    }
    d
}
