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
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use super::memory_lag::{MemoryMeasured, MemoryWorkersTarget};

/// Examples kept per kind of finding.
pub const EXAMPLES: usize = 10;

/// How an unanswered message's latency is shown.
pub const BEYOND_WINDOW: &str = "> window";

// ---- targets -------------------------------------------------------------------------------

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

// ---- what a run measured -------------------------------------------------------------------

/// Everything the verdict needs; plain data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub machine: MachineSeen,
    pub max_throughput: Option<ScenarioMeasured>,
    pub floor: Option<FloorMeasured>,
    pub half_load: Option<ScenarioMeasured>,
    pub in_flight: Option<ScenarioMeasured>,
    /// Scenarios 1 and 2 with the memory workers (absent in a run from before they were).
    #[serde(default)]
    pub memory_workers: Option<MemoryMeasured>,
}

/// The machine the run ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineSeen {
    pub cores: usize,
    pub memory_gib: f64,
    pub os: String,
    pub arch: String,
    pub release_build: bool,
}

impl fmt::Display for MachineSeen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cores, {:.1} GiB, {} {}, {} build",
            self.cores,
            self.memory_gib,
            self.os,
            self.arch,
            if self.release_build {
                "release"
            } else {
                "debug"
            }
        )
    }
}

/// Findings of one kind: how many, and the first few as evidence.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Findings {
    pub count: u64,
    pub examples: Vec<String>,
}

impl Findings {
    /// `count` findings, of which `examples` are kept (at most [`EXAMPLES`]).
    pub fn new(count: u64, examples: impl IntoIterator<Item = String>) -> Self {
        Self {
            count,
            examples: examples.into_iter().take(EXAMPLES).collect(),
        }
    }

    fn evidence(&self) -> Vec<String> {
        let mut e = self.examples.clone();
        let more = self.count.saturating_sub(e.len() as u64);
        if more > 0 {
            e.push(format!("... and {more} more"));
        }
        e
    }
}

/// One scenario of the pipeline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScenarioMeasured {
    /// The load in words (e.g. `open loop, 950 msg/s over 10000 senders`).
    pub load: String,
    pub senders: usize,
    /// Open loop: the rate asked for, messages/s.
    pub offered_rate_per_s: Option<f64>,
    pub runner_ms: u64,
    pub warmup_s: f64,
    /// The window the run was asked to measure, s.
    pub planned_window_s: u64,
    /// The window it measured, s.
    pub window_s: f64,
    /// Postgres connections per worker process, and turn partitions.
    pub db_pool: u32,
    pub partitions: u32,
    /// Messages accepted by the gateway over the whole run, and in the window.
    pub accepted: u64,
    pub accepted_in_window: u64,
    /// Replies that reached Twilio in the window.
    pub turns_in_window: u64,
    pub turns_per_s: f64,
    /// Gateway accepted → Twilio received, minus runner time, of the messages accepted in the
    /// window (unanswered ones included as `> window`).
    pub overhead: Overhead,
    /// Workers (RSS) + NATS (RSS) + Postgres (PSS of all its processes), peak, MB.
    pub stack_rss_mb: f64,
    /// Runner calls at once in the window: mean and most.
    pub runner_in_flight_mean: f64,
    pub runner_in_flight_max: u64,
    /// Messages posted and never accepted (the sender gave up).
    pub never_accepted: Findings,
    /// Messages accepted (whole run) with no reply by the end of the drain.
    pub unanswered: Findings,
    /// Replies that reached Twilio more than once.
    pub doubles: Findings,
    /// Turns called more than once at the runner.
    pub repeated_calls: Findings,
    /// A person's turn at the runner (by arrival or by turn number) or SMS after a later one.
    pub order_violations: Findings,
    /// Two turns of one person at the runner at once.
    pub overlaps: Findings,
    pub dead_letters: Findings,
    pub io: IoCounts,
}

/// The floor, measured like scenario 1.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FloorMeasured {
    pub sessions: usize,
    pub planned_window_s: u64,
    pub window_s: f64,
    /// Postgres connections per stage (each worker process of the pipeline has its own pool
    /// of this size), and turn partitions.
    pub db_pool: u32,
    pub partitions: u32,
    pub turns_in_window: u64,
    pub turns_per_s: f64,
    pub io: IoCounts,
}

/// I/O counted over a run (from just before the load to after the last turn completed), on
/// the run's own database and streams. Divided by `turns` it is the I/O per turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IoCounts {
    /// Turns completed in the counted span.
    pub turns: u64,
    /// `pg_stat_database` of the run's database: transactions committed (read-only ones
    /// included), rolled back, rows inserted, updated, deleted.
    pub commits: u64,
    pub rollbacks: u64,
    pub rows_inserted: u64,
    pub rows_updated: u64,
    pub rows_deleted: u64,
    /// SQL statements sent (`BEGIN` and `COMMIT` included), if counted.
    pub statements: Option<u64>,
    /// Who counted the statements, or why they were not counted.
    pub statements_counted_by: String,
    /// Messages stored per stream (`last_sequence` delta): publishes, less the ones JetStream
    /// dropped as duplicates. Key-value buckets are streams named `KV_<bucket>`.
    pub stream_messages: BTreeMap<String, u64>,
}

impl IoCounts {
    fn per(&self, n: u64) -> f64 {
        n as f64 / self.turns.max(1) as f64
    }

    /// Publishes per turn (work, events and dead-letter streams; key-value writes apart).
    pub fn publishes(&self) -> u64 {
        self.stream_messages
            .iter()
            .filter(|(k, _)| !k.starts_with("KV_"))
            .map(|(_, v)| v)
            .sum()
    }

    pub fn kv_writes(&self) -> u64 {
        self.stream_messages
            .iter()
            .filter(|(k, _)| k.starts_with("KV_"))
            .map(|(_, v)| v)
            .sum()
    }

    /// One line: the I/O per turn.
    pub fn per_turn(&self) -> String {
        let streams: Vec<String> = self
            .stream_messages
            .iter()
            .filter(|(k, _)| !k.starts_with("KV_"))
            .map(|(k, v)| {
                let kind = k.rsplit('_').next().unwrap_or(k);
                format!("{kind} {:.2}", self.per(*v))
            })
            .collect();
        let statements = match self.statements {
            Some(n) => format!(
                "{:.2} statements ({})",
                self.per(n),
                self.statements_counted_by
            ),
            None => format!("statements: not counted ({})", self.statements_counted_by),
        };
        format!(
            "{:.2} commits (read-only transactions included), {:.2} rollbacks, {:.2} rows written ({:.2} inserted, {:.2} updated, {:.2} deleted), {statements}, {:.2} publishes ({}), {:.2} key-value writes; over {} turns",
            self.per(self.commits),
            self.per(self.rollbacks),
            self.per(self.rows_inserted + self.rows_updated + self.rows_deleted),
            self.per(self.rows_inserted),
            self.per(self.rows_updated),
            self.per(self.rows_deleted),
            self.per(self.publishes()),
            streams.join(", "),
            self.per(self.kv_writes()),
            self.turns
        )
    }
}

// ---- latency percentiles, unanswered included ----------------------------------------------

/// One latency percentile.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Quantile {
    /// Milliseconds.
    Ms(f64),
    /// Falls on a message that was never answered: longer than the run waited.
    BeyondWindow,
    /// No message was measured.
    #[default]
    NoData,
}

impl Quantile {
    /// At most `limit_ms` (an unanswered or missing value never is).
    pub fn at_most(self, limit_ms: f64) -> bool {
        matches!(self, Quantile::Ms(v) if v <= limit_ms)
    }
}

impl fmt::Display for Quantile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quantile::Ms(v) => write!(f, "{v:.2} ms"),
            Quantile::BeyondWindow => f.write_str(BEYOND_WINDOW),
            Quantile::NoData => f.write_str("no data"),
        }
    }
}

impl Serialize for Quantile {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Quantile::Ms(v) => s.serialize_f64(*v),
            Quantile::BeyondWindow => s.serialize_str(BEYOND_WINDOW),
            Quantile::NoData => s.serialize_none(),
        }
    }
}

impl<'de> Deserialize<'de> for Quantile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Ms(f64),
            Text(String),
        }
        match Option::<Raw>::deserialize(d)? {
            None => Ok(Quantile::NoData),
            Some(Raw::Ms(v)) => Ok(Quantile::Ms(v)),
            Some(Raw::Text(t)) if t == BEYOND_WINDOW => Ok(Quantile::BeyondWindow),
            Some(Raw::Text(t)) => Err(serde::de::Error::custom(format!(
                "a latency is milliseconds or {BEYOND_WINDOW:?}, not {t:?}"
            ))),
        }
    }
}

/// Latency percentiles over answered and unanswered messages.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    pub answered: u64,
    pub unanswered: u64,
    /// Mean of the answered ones only (unanswered have no value).
    pub mean_answered_ms: Option<f64>,
    pub p50: Quantile,
    pub p95: Quantile,
    pub p99: Quantile,
    pub p999: Quantile,
    pub max: Quantile,
}

impl fmt::Display for Overhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p50 {} p95 {} p99 {} p99.9 {} max {} (n={}, {} of them unanswered)",
            self.p50,
            self.p95,
            self.p99,
            self.p999,
            self.max,
            self.answered + self.unanswered,
            self.unanswered
        )
    }
}

/// Percentiles (nearest rank) of `answered_us` latencies together with `unanswered` messages
/// counted as slower than all of them.
pub fn overhead(answered_us: &[u64], unanswered: u64) -> Overhead {
    let mut v = answered_us.to_vec();
    v.sort_unstable();
    let n = v.len() as u64 + unanswered;
    let q = |q: f64| -> Quantile {
        if n == 0 {
            return Quantile::NoData;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        match v.get(rank as usize - 1) {
            Some(us) => Quantile::Ms(*us as f64 / 1000.0),
            None => Quantile::BeyondWindow,
        }
    };
    Overhead {
        answered: v.len() as u64,
        unanswered,
        mean_answered_ms: (!v.is_empty())
            .then(|| v.iter().map(|x| *x as f64).sum::<f64>() / v.len() as f64 / 1000.0),
        p50: q(0.50),
        p95: q(0.95),
        p99: q(0.99),
        p999: q(0.999),
        max: q(1.0),
    }
}

// ---- the verdict ---------------------------------------------------------------------------

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

#[derive(Default)]
struct Checks(Vec<Check>);

impl Checks {
    fn add(&mut self, scenario: &str, target: String, measured: String, met: bool) -> &mut Check {
        self.0.push(Check {
            scenario: scenario.into(),
            target,
            measured,
            outcome: if met { Outcome::Met } else { Outcome::Missed },
            evidence: Vec::new(),
        });
        self.0.last_mut().expect("just pushed")
    }

    fn not_run(&mut self, scenario: &str, target: String) {
        self.0.push(Check {
            scenario: scenario.into(),
            target,
            measured: "-".into(),
            outcome: Outcome::NotRun,
            evidence: Vec::new(),
        });
    }

    /// The run's parameters against the target's; `(name, target, run)`.
    fn parameters(&mut self, scenario: &str, params: &[(&str, String, String)]) {
        let wanted: Vec<String> = params.iter().map(|(n, t, _)| format!("{n} {t}")).collect();
        let ran: Vec<String> = params.iter().map(|(n, _, r)| format!("{n} {r}")).collect();
        let off: Vec<String> = params
            .iter()
            .filter(|(_, t, r)| t != r)
            .map(|(n, t, r)| format!("{n}: the target is for {t}, this run had {r}"))
            .collect();
        let c = self.add(
            scenario,
            format!("run as the target defines it ({})", wanted.join(", ")),
            ran.join(", "),
            off.is_empty(),
        );
        c.evidence = off;
    }

    /// The findings every scenario must be free of.
    fn integrity(&mut self, scenario: &str, s: &ScenarioMeasured) {
        let kinds: [(&str, &Findings, String); 7] = [
            (
                "every message posted is accepted",
                &s.never_accepted,
                format!("{} never accepted", s.never_accepted.count),
            ),
            (
                "every accepted message is answered",
                &s.unanswered,
                format!(
                    "{} of {} accepted messages unanswered",
                    s.unanswered.count, s.accepted
                ),
            ),
            (
                "no reply sent twice",
                &s.doubles,
                format!("{} replies sent more than once", s.doubles.count),
            ),
            (
                "no turn called twice at the runner",
                &s.repeated_calls,
                format!("{} repeated runner calls", s.repeated_calls.count),
            ),
            (
                "each person's turns and replies in order",
                &s.order_violations,
                format!("{} order violations", s.order_violations.count),
            ),
            (
                "one turn per person at the runner at a time",
                &s.overlaps,
                format!("{} overlapping calls", s.overlaps.count),
            ),
            (
                "no dead letters",
                &s.dead_letters,
                format!("{} dead letters", s.dead_letters.count),
            ),
        ];
        for (target, findings, measured) in kinds {
            let c = self.add(scenario, target.into(), measured, findings.count == 0);
            c.evidence = findings.evidence();
        }
    }

    /// Open loop: the load was offered as asked (the load generator kept up).
    fn offered(&mut self, scenario: &str, s: &ScenarioMeasured) {
        if let Some(rate) = s.offered_rate_per_s {
            let got = s.accepted_in_window as f64 / s.window_s.max(1e-9);
            self.add(
                scenario,
                format!("the load offered: at least 95% of {rate:.0} msg/s accepted in the window"),
                format!("{got:.0} msg/s"),
                got >= 0.95 * rate,
            );
        }
    }

    fn latency(&mut self, scenario: &str, name: &str, q: Quantile, limit_ms: f64, o: &Overhead) {
        let c = self.add(
            scenario,
            format!("overhead {name} ≤ {limit_ms} ms"),
            format!("{q}"),
            q.at_most(limit_ms),
        );
        if o.unanswered > 0 {
            c.evidence.push(format!(
                "{} of {} messages accepted in the window were never answered (counted as {BEYOND_WINDOW})",
                o.unanswered,
                o.answered + o.unanswered
            ));
        }
    }
}

fn ms(v: u64) -> String {
    format!("{v} ms")
}

fn secs(v: u64) -> String {
    format!("{v} s")
}

/// Every target checked against what was measured.
pub fn judge(t: &Targets, m: &Measured) -> Vec<Check> {
    let mut c = Checks::default();

    let mt = &t.max_throughput;
    let max_target = format!("≥ {:.0} turns/s", mt.min_turns_per_s);
    match &m.max_throughput {
        None => c.not_run(MAX_THROUGHPUT, max_target),
        Some(s) => {
            c.parameters(
                MAX_THROUGHPUT,
                &[
                    ("runner", ms(mt.runner_ms), ms(s.runner_ms)),
                    ("window", secs(mt.window_s), secs(s.planned_window_s)),
                ],
            );
            c.add(
                MAX_THROUGHPUT,
                max_target,
                format!(
                    "{:.0} turns/s ({} turns in {:.1} s)",
                    s.turns_per_s, s.turns_in_window, s.window_s
                ),
                s.turns_per_s >= mt.min_turns_per_s,
            );
            c.integrity(MAX_THROUGHPUT, s);
        }
    }

    let ft = &t.floor;
    let share = ft.min_pipeline_share;
    let floor_target = format!("≥ {:.0}%", share * 100.0);
    match (&m.max_throughput, &m.floor) {
        (Some(s), Some(f)) => {
            c.parameters(
                FLOOR,
                &[
                    ("window", secs(s.planned_window_s), secs(f.planned_window_s)),
                    (
                        "Postgres pool",
                        ft.db_pool.to_string(),
                        s.db_pool.to_string(),
                    ),
                    (
                        "floor Postgres pool",
                        ft.db_pool.to_string(),
                        f.db_pool.to_string(),
                    ),
                    (
                        "partitions",
                        ft.partitions.to_string(),
                        s.partitions.to_string(),
                    ),
                    (
                        "floor partitions",
                        ft.partitions.to_string(),
                        f.partitions.to_string(),
                    ),
                    ("sessions", ft.sessions.to_string(), s.senders.to_string()),
                    (
                        "floor sessions",
                        ft.sessions.to_string(),
                        f.sessions.to_string(),
                    ),
                ],
            );
            let ratio = s.turns_per_s / f.turns_per_s.max(1e-9);
            c.add(
                FLOOR,
                floor_target,
                format!(
                    "{:.1}% ({:.0} ÷ {:.0} turns/s)",
                    ratio * 100.0,
                    s.turns_per_s,
                    f.turns_per_s
                ),
                f.turns_per_s > 0.0 && ratio >= share,
            );
        }
        _ => c.not_run(FLOOR, floor_target),
    }

    let hl = &t.half_load;
    let p50 = format!("overhead p50 ≤ {} ms", hl.max_overhead_p50_ms);
    match &m.half_load {
        None => {
            c.not_run(HALF_LOAD, p50);
            c.not_run(
                HALF_LOAD,
                format!("overhead p99 ≤ {} ms", hl.max_overhead_p99_ms),
            );
        }
        Some(s) => {
            let rate = s.offered_rate_per_s.unwrap_or(0.0);
            let wanted_rate = m
                .max_throughput
                .as_ref()
                .map(|x| (hl.share_of_max * x.turns_per_s).max(1.0));
            let rate_ok = wanted_rate.is_some_and(|w| (rate - w).abs() <= (0.01 * w).max(1.0));
            c.parameters(
                HALF_LOAD,
                &[
                    ("runner", ms(0), ms(s.runner_ms)),
                    ("window", secs(hl.window_s), secs(s.planned_window_s)),
                    (
                        "rate",
                        match wanted_rate {
                            Some(_) if rate_ok => format!("{rate:.0} msg/s"),
                            Some(w) => format!(
                                "{w:.0} msg/s ({:.0}% of max throughput)",
                                hl.share_of_max * 100.0
                            ),
                            None => format!(
                                "{:.0}% of a measured max throughput",
                                hl.share_of_max * 100.0
                            ),
                        },
                        format!("{rate:.0} msg/s"),
                    ),
                ],
            );
            c.offered(HALF_LOAD, s);
            c.latency(
                HALF_LOAD,
                "p50",
                s.overhead.p50,
                hl.max_overhead_p50_ms,
                &s.overhead,
            );
            c.latency(
                HALF_LOAD,
                "p99",
                s.overhead.p99,
                hl.max_overhead_p99_ms,
                &s.overhead,
            );
            c.integrity(HALF_LOAD, s);
        }
    }

    let inf = &t.in_flight;
    let p99 = format!("overhead p99 ≤ {} ms", inf.max_overhead_p99_ms);
    match &m.in_flight {
        None => {
            c.not_run(IN_FLIGHT, p99);
            c.not_run(
                IN_FLIGHT,
                format!("whole-stack RSS ≤ {} MB", inf.max_stack_rss_mb),
            );
        }
        Some(s) => {
            c.parameters(
                IN_FLIGHT,
                &[
                    (
                        "rate",
                        format!("{:.0} msg/s", inf.rate_per_s),
                        format!("{:.0} msg/s", s.offered_rate_per_s.unwrap_or(0.0)),
                    ),
                    ("runner", ms(inf.runner_ms), ms(s.runner_ms)),
                    ("window", secs(inf.window_s), secs(s.planned_window_s)),
                ],
            );
            c.offered(IN_FLIGHT, s);
            c.latency(
                IN_FLIGHT,
                "p99",
                s.overhead.p99,
                inf.max_overhead_p99_ms,
                &s.overhead,
            );
            c.add(
                IN_FLIGHT,
                format!("whole-stack RSS ≤ {} MB", inf.max_stack_rss_mb),
                format!("{:.0} MB", s.stack_rss_mb),
                s.stack_rss_mb <= inf.max_stack_rss_mb,
            );
            c.integrity(IN_FLIGHT, s);
        }
    }
    c.0.extend(super::memory_lag::judge(
        &t.memory_workers,
        m.memory_workers.as_ref(),
        m.half_load.as_ref(),
    ));
    c.0
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> Targets {
        Targets::parse(include_str!("../../bench-targets.toml")).expect("the targets file parses")
    }

    fn clean(
        turns_per_s: f64,
        runner_ms: u64,
        window: u64,
        rate: Option<f64>,
        latency_us: u64,
    ) -> ScenarioMeasured {
        let n = (turns_per_s * window as f64) as u64;
        ScenarioMeasured {
            load: "test".into(),
            senders: 1000,
            offered_rate_per_s: rate,
            runner_ms,
            warmup_s: 5.0,
            planned_window_s: window,
            window_s: window as f64,
            db_pool: 8,
            partitions: 32,
            accepted: n,
            accepted_in_window: n,
            turns_in_window: n,
            turns_per_s,
            overhead: overhead(&vec![latency_us; 1000], 0),
            stack_rss_mb: 400.0,
            ..Default::default()
        }
    }

    /// A run that meets every target of the targets file.
    fn passing() -> Measured {
        let t = targets();
        Measured {
            machine: MachineSeen {
                cores: 2,
                memory_gib: 24.0,
                os: "linux".into(),
                arch: "x86_64".into(),
                release_build: true,
            },
            max_throughput: Some(clean(2500.0, 0, t.max_throughput.window_s, None, 3_000)),
            floor: Some(FloorMeasured {
                sessions: 1000,
                planned_window_s: t.max_throughput.window_s,
                window_s: t.max_throughput.window_s as f64,
                db_pool: 8,
                partitions: 32,
                turns_in_window: 240_000,
                turns_per_s: 4000.0,
                io: IoCounts::default(),
            }),
            half_load: Some(clean(1250.0, 0, t.half_load.window_s, Some(1250.0), 2_000)),
            in_flight: Some(clean(
                950.0,
                t.in_flight.runner_ms,
                t.in_flight.window_s,
                Some(950.0),
                200_000,
            )),
            memory_workers: Some(MemoryMeasured {
                embedder: "test".into(),
                max_throughput_lag: ["embed", "categorise", "summary"]
                    .map(|stage| super::super::memory_lag::StageLagSummary {
                        stage: stage.into(),
                        mid_window_age_s: Some(2.0),
                        end_window_age_s: Some(2.5),
                        caught_up_after_s: Some(12.0),
                        ..Default::default()
                    })
                    .to_vec(),
                half_load_without: Some(clean(
                    1250.0,
                    0,
                    t.half_load.window_s,
                    Some(1250.0),
                    1_900,
                )),
            }),
        }
    }

    fn failure_text(f: &[Check]) -> String {
        f.iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn the_targets_file_has_the_issue_targets() {
        let t = targets();
        assert!(t.machine.description.contains("2 cores"));
        assert_eq!(t.machine.cores, 2);
        assert_eq!(t.max_throughput.min_turns_per_s, 2000.0);
        assert_eq!(t.max_throughput.window_s, 60);
        assert_eq!(t.floor.min_pipeline_share, 0.5);
        assert_eq!(t.half_load.max_overhead_p50_ms, 5.0);
        assert_eq!(t.half_load.max_overhead_p99_ms, 20.0);
        assert_eq!(t.in_flight.rate_per_s, 950.0);
        assert_eq!(t.in_flight.runner_ms, 10_000);
        assert_eq!(t.in_flight.window_s, 60);
        assert_eq!(t.in_flight.max_overhead_p99_ms, 1000.0);
        assert_eq!(t.in_flight.max_stack_rss_mb, 500.0);
        assert_eq!(t.memory_workers.max_overhead_ratio, 1.10);
    }

    #[test]
    fn all_targets_met_is_no_failure() {
        let v = verdict(&targets(), &passing());
        assert!(v.is_empty(), "{}", failure_text(&v));
        assert!(
            judge(&targets(), &passing())
                .iter()
                .all(|c| c.outcome == Outcome::Met)
        );
    }

    #[test]
    fn throughput_below_target_fails_with_both_numbers() {
        let mut m = passing();
        let s = m.max_throughput.as_mut().unwrap();
        s.turns_per_s = 323.0;
        s.turns_in_window = 19_380;
        // Half load follows max throughput.
        m.half_load.as_mut().unwrap().offered_rate_per_s = Some(161.5);
        m.half_load.as_mut().unwrap().accepted_in_window = 161 * 30 + 20;
        let v = verdict(&targets(), &m);
        let text = failure_text(&v);
        assert!(
            v.iter()
                .any(|f| f.scenario == MAX_THROUGHPUT && f.target.contains("2000")),
            "{text}"
        );
        assert!(
            text.contains("2000") && text.contains("323 turns/s"),
            "{text}"
        );
        // And the floor ratio (323 / 4000) too.
        assert!(v.iter().any(|f| f.scenario == FLOOR), "{text}");
        assert_eq!(v.len(), 2, "{text}");
    }

    #[test]
    fn one_unanswered_message_fails_every_scenario_and_names_it() {
        for pick in 0..3 {
            let mut m = passing();
            let s = match pick {
                0 => m.max_throughput.as_mut(),
                1 => m.half_load.as_mut(),
                _ => m.in_flight.as_mut(),
            }
            .unwrap();
            s.unanswered = Findings::new(1, ["s4711#3 (accepted at 12.345 s)".to_string()]);
            s.overhead = overhead(&vec![3_000; 999], 1);
            let v = verdict(&targets(), &m);
            let text = failure_text(&v);
            assert!(
                v.iter().any(|f| f.target.contains("answered")
                    && f.measured.contains("1 of")
                    && f.evidence.iter().any(|e| e.contains("s4711#3"))),
                "scenario {pick}: {text}"
            );
        }
    }

    #[test]
    fn many_unanswered_are_listed_with_their_count() {
        let mut m = passing();
        let s = m.in_flight.as_mut().unwrap();
        let texts: Vec<String> = (0..9_453).map(|i| format!("s{i}#0")).collect();
        s.unanswered = Findings::new(9_453, texts);
        let v = verdict(&targets(), &m);
        let f = v
            .iter()
            .find(|f| f.target.contains("answered"))
            .expect("fails");
        assert!(f.measured.contains("9453 of"), "{f}");
        assert_eq!(f.evidence.len(), EXAMPLES + 1);
        assert!(f.evidence[0] == "s0#0");
        assert!(f.evidence.last().unwrap().contains("9443 more"), "{f}");
    }

    #[test]
    fn a_double_or_an_order_violation_fails() {
        let mut m = passing();
        m.half_load.as_mut().unwrap().doubles =
            Findings::new(1, ["s9#2 delivered 2 times".to_string()]);
        let text = failure_text(&verdict(&targets(), &m));
        assert!(text.contains("twice") && text.contains("s9#2"), "{text}");

        let mut m = passing();
        m.max_throughput.as_mut().unwrap().order_violations = Findings::new(
            1,
            ["sms order: +14152000001 got #3 after #4, at 1.000s".to_string()],
        );
        let v = verdict(&targets(), &m);
        assert_eq!(v.len(), 1, "{}", failure_text(&v));
        assert!(v[0].to_string().contains("got #3 after #4"));

        for kind in 0..4 {
            let mut m = passing();
            let s = m.in_flight.as_mut().unwrap();
            let findings = match kind {
                0 => &mut s.overlaps,
                1 => &mut s.repeated_calls,
                2 => &mut s.dead_letters,
                _ => &mut s.never_accepted,
            };
            *findings = Findings::new(2, ["x".to_string()]);
            assert_eq!(verdict(&targets(), &m).len(), 1, "kind {kind}");
        }
    }

    #[test]
    fn latency_and_memory_targets_fail_with_the_measured_value() {
        let mut m = passing();
        m.half_load.as_mut().unwrap().overhead = overhead(&vec![15_000; 1000], 0);
        // As slow without the memory workers: only the absolute targets are missed.
        let without = m.memory_workers.as_mut().unwrap();
        without.half_load_without.as_mut().unwrap().overhead = overhead(&vec![15_000; 1000], 0);
        m.in_flight.as_mut().unwrap().stack_rss_mb = 812.0;
        let v = verdict(&targets(), &m);
        let text = failure_text(&v);
        assert!(
            text.contains("overhead p50 ≤ 5 ms: measured 15.00 ms"),
            "{text}"
        );
        assert!(text.contains("812 MB"), "{text}");
        assert_eq!(v.len(), 2, "{text}");
    }

    #[test]
    fn percentiles_count_unanswered_as_beyond_the_window() {
        // 40 answered in 1 ms, 60 never answered: the median is an unanswered message.
        let o = overhead(&[1_000; 40], 60);
        assert_eq!(o.p50, Quantile::BeyondWindow);
        assert_eq!(o.p50.to_string(), "> window");
        assert_eq!(o.max, Quantile::BeyondWindow);
        assert_eq!(o.answered, 40);
        assert_eq!(o.mean_answered_ms, Some(1.0));
        assert!(!o.p50.at_most(1e12));
        // 60 answered: the median is answered, the p99 is not.
        let o = overhead(&[1_000; 60], 40);
        assert_eq!(o.p50, Quantile::Ms(1.0));
        assert_eq!(o.p99, Quantile::BeyondWindow);
        // All answered: nearest rank.
        let v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let o = overhead(&v, 0);
        assert_eq!(o.p50, Quantile::Ms(50.0));
        assert_eq!(o.p99, Quantile::Ms(99.0));
        assert_eq!(o.max, Quantile::Ms(100.0));
        assert_eq!(overhead(&[], 0).p50, Quantile::NoData);
        // Round trip through JSON, "> window" included.
        let o = overhead(&[1_000; 40], 60);
        let json = serde_json::to_string(&o).unwrap();
        assert!(json.contains("\"p50\":\"> window\""), "{json}");
        assert_eq!(serde_json::from_str::<Overhead>(&json).unwrap(), o);
    }

    #[test]
    fn a_collapsing_scenario_cannot_pass_on_its_survivors() {
        // The survivors were quick, but most messages were never answered.
        let mut m = passing();
        let s = m.in_flight.as_mut().unwrap();
        s.overhead = overhead(&vec![100_000; 400], 600);
        s.unanswered = Findings::new(600, (0..600).map(|i| format!("s{i}#1")));
        let v = verdict(&targets(), &m);
        let p99 = v
            .iter()
            .find(|f| f.target.contains("p99"))
            .expect("p99 fails");
        assert_eq!(p99.measured, "> window");
        assert!(p99.evidence[0].contains("600 of 1000"), "{p99}");
    }

    #[test]
    fn a_run_with_other_parameters_fails() {
        let mut m = passing();
        m.max_throughput.as_mut().unwrap().planned_window_s = 5;
        m.floor.as_mut().unwrap().planned_window_s = 5;
        m.in_flight.as_mut().unwrap().offered_rate_per_s = Some(100.0);
        let v = verdict(&targets(), &m);
        let text = failure_text(&v);
        assert!(
            text.contains("window: the target is for 60 s, this run had 5 s"),
            "{text}"
        );
        assert!(
            text.contains("rate: the target is for 950 msg/s, this run had 100 msg/s"),
            "{text}"
        );
        // A floor measured over another window than the pipeline is not comparable.
        let mut m = passing();
        m.floor.as_mut().unwrap().planned_window_s = 30;
        m.floor.as_mut().unwrap().db_pool = 64;
        let text = failure_text(&verdict(&targets(), &m));
        assert!(
            text.contains("floor Postgres pool: the target is for 8, this run had 64"),
            "{text}"
        );
        assert!(
            text.contains("window: the target is for 60 s, this run had 30 s"),
            "{text}"
        );
        // Pipeline and floor alike with more connections than the targets are for: not the
        // run the targets describe, even though the two agree with each other.
        let mut m = passing();
        m.max_throughput.as_mut().unwrap().db_pool = 64;
        m.floor.as_mut().unwrap().db_pool = 64;
        let text = failure_text(&verdict(&targets(), &m));
        assert!(
            text.contains("Postgres pool: the target is for 8, this run had 64")
                && text.contains("floor Postgres pool: the target is for 8, this run had 64"),
            "{text}"
        );
    }

    #[test]
    fn an_open_loop_that_did_not_offer_its_load_fails() {
        let mut m = passing();
        m.in_flight.as_mut().unwrap().accepted_in_window = 700 * 60;
        let text = failure_text(&verdict(&targets(), &m));
        assert!(
            text.contains("the load offered") && text.contains("700 msg/s"),
            "{text}"
        );
    }

    #[test]
    fn a_target_not_run_is_a_miss_named_by_its_scenario() {
        // Only scenario 1 and the floor ran: every target of the others is missed.
        let m = Measured {
            max_throughput: passing().max_throughput,
            floor: passing().floor,
            ..Default::default()
        };
        let missed = verdict(&targets(), &m);
        // 2 half load, 2 in flight, 8 memory workers (lag and catch-up per stage, 2 ratios).
        assert_eq!(missed.len(), 12, "{}", failure_text(&missed));
        assert!(missed.iter().all(|c| c.outcome == Outcome::NotRun));
        let checks = judge(&targets(), &m);
        assert_eq!(
            not_run(&checks),
            vec![HALF_LOAD, IN_FLIGHT, super::super::memory_lag::MEMORY]
        );
        let text = failure_text(&missed);
        assert!(
            text.contains("[NOT RUN] in flight: whole-stack RSS"),
            "{text}"
        );
        // Everything run: nothing missed.
        assert!(verdict(&targets(), &passing()).is_empty());
        // Half load without a max throughput to take half of cannot be judged as passing.
        let m = Measured {
            half_load: passing().half_load,
            ..Default::default()
        };
        let text = failure_text(&verdict(&targets(), &m));
        assert!(text.contains("of a measured max throughput"), "{text}");
    }

    #[test]
    fn measured_round_trips_through_json() {
        let mut m = passing();
        m.in_flight.as_mut().unwrap().overhead = overhead(&[5; 3], 7);
        let json = serde_json::to_string_pretty(&m).unwrap();
        let back: Measured = serde_json::from_str(&json).unwrap();
        assert_eq!(back, m);
        assert_eq!(verdict(&targets(), &back), verdict(&targets(), &m));
    }

    #[test]
    fn io_per_turn_is_rendered_from_counts() {
        let io = IoCounts {
            turns: 100,
            commits: 900,
            rows_inserted: 300,
            rows_updated: 400,
            statements: None,
            statements_counted_by: "no counter".into(),
            stream_messages: [
                ("RUN_WORK".to_string(), 400u64),
                ("RUN_EVENTS".to_string(), 410),
                ("RUN_DLQ".to_string(), 0),
                ("KV_RUN_ARRIVALS".to_string(), 100),
            ]
            .into(),
            ..Default::default()
        };
        let line = io.per_turn();
        assert!(line.contains("9.00 commits"), "{line}");
        assert!(line.contains("7.00 rows written"), "{line}");
        assert!(
            line.contains("8.10 publishes (DLQ 0.00, EVENTS 4.10, WORK 4.00)"),
            "{line}"
        );
        assert!(line.contains("1.00 key-value writes"), "{line}");
        assert!(
            line.contains("statements: not counted (no counter)"),
            "{line}"
        );
    }

    #[test]
    fn machine_differences_are_named() {
        let t = targets();
        let same = passing().machine;
        assert!(machine_differences(&t.machine, &same).is_empty());
        let other = MachineSeen {
            cores: 8,
            release_build: false,
            ..same
        };
        let d = machine_differences(&t.machine, &other);
        assert_eq!(d.len(), 2, "{d:?}");
    }
}
