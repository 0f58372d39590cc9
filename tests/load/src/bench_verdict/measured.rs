//! What a run measured: plain data the bench fills in (and writes to `results.json`).
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{EXAMPLES, MemoryMeasured, Overhead};

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

    pub(super) fn evidence(&self) -> Vec<String> {
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
    /// Rows written by table (`schema.table`), over the same span.
    #[serde(default)]
    pub tables: BTreeMap<String, crate::table_writes::TableWrites>,
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

    /// One line: rows written per turn by table, when they were counted.
    pub fn tables_per_turn(&self) -> Option<String> {
        (!self.tables.is_empty()).then(|| crate::table_writes::per_turn(&self.tables, self.turns))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
