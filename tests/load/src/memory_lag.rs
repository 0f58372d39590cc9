//! The memory workers in the bench: `embed`, `categorise` and `summary` run beside the reply
//! path in scenarios 1 and 2 (`bench --memory-workers on`, the default), and how far behind
//! each of them is gets sampled every second during and after the load ([`LagSampler`]).
//!
//! The chat model (labels, summaries) is the chaos run's fake ([`MemoryModel`], an
//! OpenAI-compatible HTTP server in the harness, like the fake runner): a real deployment's
//! model is a third party too. The embedder is the product's default, the local MiniLM in the
//! embed worker's process (`--memory-embedder local`), or the fake model's bag-of-words vectors
//! (`fake`), which show what the pipeline costs without the model's CPU.
//!
//! Lag of a stage, per sample: its durable consumer's pending + unacknowledged messages, the
//! rows still to do, and the age of the oldest one:
//! - embed: the oldest logged message without a vector under the configured model (the
//!   product's own measure, `sb_embed_lag_seconds`: [`switchboard_memory::index::lag`]);
//! - categorise: the oldest reply (not a notice) without a label;
//! - summary: summaries are due only once a conversation is quiet for `[summary] idle_gap_s`,
//!   so its age is how long the most overdue quiet conversation has waited past that gap (0
//!   during a load that keeps every conversation busy).
//!
//! The verdict on these ([`judge`]): see `docs/bench-memory-workers.md`.
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use switchboard_kit::Topology;
use switchboard_kit::config::Config;
use switchboard_kit::memory_config::EmbeddingConfig;

use super::bench_verdict::{Check, Outcome, Quantile, ScenarioMeasured};
use super::canary::Canaries;
use super::chaos_check::MEMORY_STAGES;
use super::memory_run::MemoryModel;
use super::report::PlotLagLine;
use super::stack::Stack;

/// Whether scenarios 1 and 2 run the memory workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryWorkers {
    On,
    Off,
}

/// Where the embed worker's vectors come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Embedder {
    /// The product's default: all-MiniLM-L6-v2 in the worker's process
    /// (`SB_EMBEDDING__MODEL_DIR` names its files).
    Local,
    /// The fake model's bag-of-words vectors over HTTP (no model CPU).
    Fake,
    /// The static model (`[embedding] provider = "static"`, WordLlama's table, in process).
    Static,
}

impl Embedder {
    pub fn as_str(self) -> &'static str {
        match self {
            Embedder::Local => "local all-MiniLM-L6-v2 (the product's default)",
            Embedder::Fake => "fake model (bag-of-words over HTTP)",
            Embedder::Static => "static wordllama-l2-supercat-256 (in process)",
        }
    }
}

/// The memory workers' worker names, in start order.
pub const WORKERS: [&str; 3] = MEMORY_STAGES;

/// The fake chat model of one scenario, and the embedder.
pub struct MemorySide {
    model: MemoryModel,
    embedder: Embedder,
}

impl MemorySide {
    pub async fn start(embedder: Embedder) -> Self {
        Self {
            model: MemoryModel::start(Canaries::random()).await,
            embedder,
        }
    }

    /// `[llm]` at the fake model, summaries within seconds of a conversation going quiet (as in
    /// a chaos run), and `[embedding]` as chosen: the local one with the files `stack` fetched,
    /// as `make run` configures it.
    pub fn configure(&self, c: &mut Config, stack: &Stack) {
        let mut product_default: EmbeddingConfig = c.embedding.clone();
        self.model.configure(c);
        match self.embedder {
            Embedder::Local => {
                switchboard_e2e::local_embedder_from(&mut product_default, |var| stack.var(var));
                c.embedding = product_default;
            }
            Embedder::Static => {
                switchboard_e2e::static_embedder_from(&mut product_default, |var| stack.var(var));
                c.embedding = product_default;
            }
            Embedder::Fake => {}
        }
    }
}

/// One sample of one stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LagPoint {
    /// Seconds since the scenario's load started.
    pub at_s: f64,
    /// The stage's consumer: pending + unacknowledged messages (`None`: not readable).
    pub backlog: Option<u64>,
    /// Rows still to do (messages to embed, replies to label, overdue conversations).
    pub waiting: Option<i64>,
    /// Age of the oldest of them, seconds (0: none waits).
    pub age_s: Option<f64>,
}

/// One stage's samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageLag {
    pub stage: String,
    pub points: Vec<LagPoint>,
}

/// The lag series of one scenario, with the moments that judge it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LagRun {
    pub stages: Vec<StageLag>,
    /// The measured window, seconds since the load started.
    pub window_start_s: f64,
    pub window_end_s: f64,
    /// How long after the window's end the lag was sampled (drain, settle and the wait for
    /// the workers to catch up).
    pub catch_up_waited_s: f64,
}

impl LagRun {
    /// Per stage: the age at the window's middle and end, and when (seconds after the
    /// window's end) it was caught up for good (`None`: not within the wait).
    pub fn summary(&self) -> Vec<StageLagSummary> {
        let mid = (self.window_start_s + self.window_end_s) / 2.0;
        self.stages
            .iter()
            .map(|s| {
                let at = |t: f64| {
                    s.points
                        .iter()
                        .rfind(|p| p.at_s <= t)
                        .copied()
                        .unwrap_or_default()
                };
                let (m, e) = (at(mid), at(self.window_end_s));
                let done = |p: &LagPoint| {
                    p.backlog == Some(0) && p.waiting == Some(0) && p.age_s == Some(0.0)
                };
                // Caught up: from this sample on, every sample is done.
                let after: Vec<&LagPoint> = s
                    .points
                    .iter()
                    .filter(|p| p.at_s >= self.window_end_s)
                    .collect();
                let first_done_for_good = after.iter().rposition(|p| !done(p)).map_or(0, |i| i + 1);
                let caught_up_after_s = after
                    .get(first_done_for_good)
                    .map(|p| p.at_s - self.window_end_s);
                StageLagSummary {
                    stage: s.stage.clone(),
                    mid_window_age_s: m.age_s,
                    end_window_age_s: e.age_s,
                    mid_window_backlog: m.backlog,
                    end_window_backlog: e.backlog,
                    end_window_waiting: e.waiting,
                    caught_up_after_s,
                    waited_s: self.catch_up_waited_s,
                }
            })
            .collect()
    }
}

impl LagRun {
    /// One plot line per stage (age over time), named `<run>: <stage>`.
    pub fn plot_lines(&self, run: &str) -> Vec<PlotLagLine> {
        self.stages
            .iter()
            .map(|s| PlotLagLine {
                name: format!("{run}: {}", s.stage),
                points: s
                    .points
                    .iter()
                    .filter_map(|p| p.age_s.map(|a| (p.at_s, a)))
                    .collect(),
            })
            .collect()
    }
}

/// The memory lines of a scenario's results: whether the workers ran, the load average around
/// the run, and each stage's lag.
pub fn print(
    workers_on: bool,
    lag: Option<&LagRun>,
    load_before: Option<[f64; 3]>,
    load_after: Option<[f64; 3]>,
) {
    let la =
        |v: Option<[f64; 3]>| v.map_or("?".into(), |[a, b, c]| format!("{a:.2} {b:.2} {c:.2}"));
    println!(
        "    memory workers: {}; load average {} before, {} at the window's end",
        if workers_on { "on" } else { "off" },
        la(load_before),
        la(load_after)
    );
    let Some(lag) = lag else { return };
    let opt = |v: Option<f64>| v.map_or("?".into(), |v| format!("{v:.1} s"));
    let n = |v: Option<u64>| v.map_or("?".into(), |b| b.to_string());
    for s in lag.summary() {
        println!(
            "    lag {}: oldest unprocessed {} at mid-window, {} at the end ({} → {} on its consumer, {} rows waiting); caught up {}",
            s.stage,
            opt(s.mid_window_age_s),
            opt(s.end_window_age_s),
            n(s.mid_window_backlog),
            n(s.end_window_backlog),
            s.end_window_waiting.map_or("?".into(), |b| b.to_string()),
            match s.caught_up_after_s {
                Some(c) => format!("{c:.1} s after the window"),
                None if workers_on => format!("not within {:.0} s", s.waited_s),
                None => "never (no workers)".into(),
            }
        );
    }
}

/// What the verdict reads of one stage's lag.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageLagSummary {
    pub stage: String,
    pub mid_window_age_s: Option<f64>,
    pub end_window_age_s: Option<f64>,
    pub mid_window_backlog: Option<u64>,
    pub end_window_backlog: Option<u64>,
    pub end_window_waiting: Option<i64>,
    /// Seconds after the window's end until the stage was done for good.
    pub caught_up_after_s: Option<f64>,
    pub waited_s: f64,
}

/// Samples every stage's lag every second until stopped.
pub struct LagSampler {
    points: Arc<Mutex<Vec<Vec<LagPoint>>>>,
    task: tokio::task::JoinHandle<()>,
}

/// What a sampler reads from.
pub struct LagSource {
    pub db: PgPool,
    pub js: jetstream::Context,
    pub topology: Topology,
    pub embedding_model: String,
    pub idle_gap_s: u64,
}

impl LagSampler {
    /// Start sampling; `at_s` of each point counts from `start`.
    pub fn start(src: LagSource, start: Instant) -> Self {
        let points: Arc<Mutex<Vec<Vec<LagPoint>>>> =
            Arc::new(Mutex::new(vec![Vec::new(); WORKERS.len()]));
        let task = tokio::spawn({
            let points = points.clone();
            async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let sample = sample(&src, start).await;
                    let mut all = points.lock().unwrap();
                    for (series, p) in all.iter_mut().zip(sample) {
                        series.push(p);
                    }
                }
            }
        });
        Self { points, task }
    }

    /// The newest sample of every stage, all done (no backlog, nothing waiting).
    pub fn all_done(&self) -> bool {
        let all = self.points.lock().unwrap();
        all.iter().all(|s| {
            s.last().is_some_and(|p| {
                p.backlog == Some(0) && p.waiting == Some(0) && p.age_s == Some(0.0)
            })
        })
    }

    pub fn stop(self) -> Vec<StageLag> {
        self.task.abort();
        let all = self.points.lock().unwrap().clone();
        WORKERS
            .iter()
            .zip(all)
            .map(|(stage, points)| StageLag {
                stage: stage.to_string(),
                points,
            })
            .collect()
    }
}

/// One sample of every stage, in [`WORKERS`] order; what cannot be read is `None`.
async fn sample(src: &LagSource, start: Instant) -> Vec<LagPoint> {
    let at_s = start.elapsed().as_secs_f64();
    let backlogs = backlogs(src).await;
    let embed = switchboard_memory::index::lag(
        &src.db,
        &src.embedding_model,
        switchboard_memory::index::LagScope::Everyone,
    )
    .await
    .inspect_err(|e| eprintln!("lag sample: embed: {e}"))
    .ok()
    .map(|l| (l.seconds, l.messages_waiting));
    let categorise: Option<(f64, i64)> = sqlx::query_as(
        "SELECT coalesce(extract(epoch FROM now() - min(m.created_at))::float8, 0), count(*)
           FROM switchboard.messages m
          WHERE m.direction = 'outbound'
            AND coalesce(m.metadata->>'kind', '') NOT IN ('notice', 'heartbeat_ok')
            AND NOT EXISTS (SELECT 1 FROM switchboard.exchange_categories c
                             WHERE c.outbound_id = m.id)",
    )
    .fetch_one(&src.db)
    .await
    .inspect_err(|e| eprintln!("lag sample: categorise: {e}"))
    .ok();
    // A memory key is due once its newest unsummarised message is idle_gap_s old; its age is
    // how long it has waited past that.
    let summary: Option<(f64, i64)> = sqlx::query_as(
        "SELECT coalesce(max(extract(epoch FROM now() - k.newest)::float8 - $1), 0), count(*)
           FROM (SELECT s.memory_key, max(k.created_at) AS newest
                   FROM switchboard.message_marks k
                   JOIN switchboard.sessions s ON s.id = k.session_id
                  WHERE k.summary_version IS NULL AND k.conversation
                  GROUP BY s.memory_key) k
          WHERE k.newest < now() - make_interval(secs => $1)",
    )
    .bind(src.idle_gap_s as f64)
    .fetch_one(&src.db)
    .await
    .inspect_err(|e| eprintln!("lag sample: summary: {e}"))
    .ok();
    [embed, categorise, summary]
        .into_iter()
        .zip(backlogs)
        .map(|(rows, backlog)| LagPoint {
            at_s,
            backlog,
            waiting: rows.map(|r| r.1),
            age_s: rows.map(|r| r.0.max(0.0)),
        })
        .collect()
}

async fn backlogs(src: &LagSource) -> Vec<Option<u64>> {
    let stream = src.js.get_stream(src.topology.events_stream()).await.ok();
    let mut out = Vec::new();
    for stage in WORKERS {
        let n = match &stream {
            Some(s) => match s.get_consumer::<consumer::pull::Config>(stage).await {
                Ok(mut c) => c
                    .info()
                    .await
                    .ok()
                    .map(|i| i.num_pending + i.num_ack_pending as u64),
                Err(_) => None,
            },
            None => None,
        };
        out.push(n);
    }
    out
}

// ---- targets and verdict -------------------------------------------------------------------

/// `[memory_workers]` of `tests/bench-targets.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryWorkersTarget {
    /// Lag bounded under scenario 1's load: per stage, the age of the oldest unprocessed
    /// message at the window's end exceeds the age at its middle by at most this.
    pub max_lag_growth_s: f64,
    /// ... and every stage is caught up at most this long after the window's end.
    pub max_catch_up_s: f64,
    /// Scenario 2's overhead (p50 and p99) with the memory workers ÷ the same run without.
    pub max_overhead_ratio: f64,
}

/// What the memory verdict reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryMeasured {
    /// The embedder of the run (empty: memory workers off).
    pub embedder: String,
    /// Scenario 1 run again with the memory workers: its lag per stage.
    pub max_throughput_lag: Vec<StageLagSummary>,
    /// That run's own figures (scenario 1 itself measures the reply path alone).
    #[serde(default)]
    pub max_throughput_with: Option<ScenarioMeasured>,
    /// Scenario 2 run again, the same way, with the memory workers.
    #[serde(default)]
    pub half_load_with: Option<ScenarioMeasured>,
}

pub const MEMORY: &str = "memory workers";

fn check(target: String, measured: String, outcome: Outcome, evidence: Vec<String>) -> Check {
    Check {
        scenario: MEMORY.into(),
        target,
        measured,
        outcome,
        evidence,
    }
}

fn secs(v: Option<f64>) -> String {
    v.map_or("not readable".into(), |s| format!("{s:.1} s"))
}

/// The memory targets checked: lag bounded in scenario 1's run with the memory workers (per
/// stage), and scenario 2's overhead with the memory workers within the ratio of scenario 2
/// itself (`half_load`: the reply path without them).
pub fn judge(
    t: &MemoryWorkersTarget,
    m: Option<&MemoryMeasured>,
    half_load: Option<&ScenarioMeasured>,
) -> Vec<Check> {
    let mut out = Vec::new();
    let growth = |stage: &str| {
        format!(
            "{stage} lag bounded under max throughput: age of the oldest unprocessed at the window's end ≤ at its middle + {} s",
            t.max_lag_growth_s
        )
    };
    let catch_up =
        |stage: &str| format!("{stage} caught up ≤ {} s after the load", t.max_catch_up_s);
    let lag = m.map(|m| &m.max_throughput_lag).filter(|l| !l.is_empty());
    match lag {
        None => {
            for stage in WORKERS {
                out.push(check(growth(stage), "-".into(), Outcome::NotRun, vec![]));
                out.push(check(catch_up(stage), "-".into(), Outcome::NotRun, vec![]));
            }
        }
        Some(lag) => {
            for s in lag {
                let met = matches!(
                    (s.mid_window_age_s, s.end_window_age_s),
                    (Some(mid), Some(end)) if end <= mid + t.max_lag_growth_s
                );
                out.push(check(
                    growth(&s.stage),
                    format!(
                        "{} at the middle, {} at the end ({} → {} messages on its consumer)",
                        secs(s.mid_window_age_s),
                        secs(s.end_window_age_s),
                        s.mid_window_backlog.map_or("?".into(), |b| b.to_string()),
                        s.end_window_backlog.map_or("?".into(), |b| b.to_string()),
                    ),
                    if met { Outcome::Met } else { Outcome::Missed },
                    vec![],
                ));
                let met = s.caught_up_after_s.is_some_and(|c| c <= t.max_catch_up_s);
                out.push(check(
                    catch_up(&s.stage),
                    match s.caught_up_after_s {
                        Some(c) => format!("{c:.1} s"),
                        None => format!(
                            "not within the {:.0} s sampled after the window ({} rows were waiting at its end)",
                            s.waited_s,
                            s.end_window_waiting.map_or("?".into(), |w| w.to_string())
                        ),
                    },
                    if met { Outcome::Met } else { Outcome::Missed },
                    vec![],
                ));
            }
        }
    }
    let ratio_target = |q: &str| {
        format!(
            "half load overhead {q} with memory workers ≤ {:.0}% of without",
            t.max_overhead_ratio * 100.0
        )
    };
    let with = m.and_then(|m| m.half_load_with.as_ref());
    match (with, half_load) {
        (Some(on), Some(off)) => {
            for (q, a, b) in [
                ("p50", on.overhead.p50, off.overhead.p50),
                ("p99", on.overhead.p99, off.overhead.p99),
            ] {
                let (measured, met) = match (a, b) {
                    (Quantile::Ms(a), Quantile::Ms(b)) if b > 0.0 => (
                        format!("{:.0}% ({a:.2} ms with ÷ {b:.2} ms without)", 100.0 * a / b),
                        a <= b * t.max_overhead_ratio,
                    ),
                    (a, b) => (format!("{a} with, {b} without"), false),
                };
                out.push(check(
                    ratio_target(q),
                    measured,
                    if met { Outcome::Met } else { Outcome::Missed },
                    vec![],
                ));
            }
        }
        _ => {
            for q in ["p50", "p99"] {
                out.push(check(ratio_target(q), "-".into(), Outcome::NotRun, vec![]));
            }
        }
    }
    out
}

/// `/proc/loadavg`'s 1, 5 and 15 minute figures (the machine is shared: they go with the
/// results).
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(at_s: f64, backlog: u64, age_s: f64) -> LagPoint {
        LagPoint {
            at_s,
            backlog: Some(backlog),
            waiting: Some(backlog as i64),
            age_s: Some(age_s),
        }
    }

    fn run(points: Vec<LagPoint>) -> LagRun {
        LagRun {
            stages: vec![StageLag {
                stage: "embed".into(),
                points,
            }],
            window_start_s: 0.0,
            window_end_s: 10.0,
            catch_up_waited_s: 10.0,
        }
    }

    fn target() -> MemoryWorkersTarget {
        MemoryWorkersTarget {
            max_lag_growth_s: 5.0,
            max_catch_up_s: 60.0,
            max_overhead_ratio: 1.1,
        }
    }

    #[test]
    fn a_growing_lag_and_no_catch_up_are_both_missed() {
        // The age grows a second a second and never comes back down.
        let r = run((0..20)
            .map(|i| point(i as f64, 100 * i, i as f64))
            .collect());
        let s = r.summary();
        assert_eq!(s[0].mid_window_age_s, Some(5.0));
        assert_eq!(s[0].end_window_age_s, Some(10.0));
        assert_eq!(s[0].caught_up_after_s, None);
        let m = MemoryMeasured {
            embedder: "x".into(),
            max_throughput_lag: s,
            max_throughput_with: None,
            half_load_with: None,
        };
        let c = judge(
            &MemoryWorkersTarget {
                max_lag_growth_s: 4.0,
                ..target()
            },
            Some(&m),
            None,
        );
        assert_eq!(c[0].outcome, Outcome::Missed, "{}", c[0]);
        assert_eq!(c[1].outcome, Outcome::Missed, "{}", c[1]);
        assert!(c[1].measured.contains("not within"), "{}", c[1]);
        // No run without the memory workers: the overhead ratio is not shown met.
        assert!(c[2..].iter().all(|c| c.outcome == Outcome::NotRun));
    }

    #[test]
    fn a_steady_lag_that_drains_after_the_load_is_met_with_its_catch_up_time() {
        let mut p: Vec<LagPoint> = (0..=10).map(|i| point(i as f64, 50, 1.5)).collect();
        p.push(point(11.0, 20, 1.0));
        // Done once, busy again (a late batch), then done for good at 14 s.
        p.push(point(12.0, 0, 0.0));
        p.push(point(13.0, 5, 0.5));
        p.push(point(14.0, 0, 0.0));
        p.push(point(15.0, 0, 0.0));
        let s = run(p).summary();
        assert_eq!(s[0].caught_up_after_s, Some(4.0));
        let m = MemoryMeasured {
            embedder: "x".into(),
            max_throughput_lag: s,
            max_throughput_with: None,
            half_load_with: None,
        };
        let c = judge(&target(), Some(&m), None);
        assert_eq!(c[0].outcome, Outcome::Met, "{}", c[0]);
        assert_eq!(c[1].outcome, Outcome::Met, "{}", c[1]);
    }

    #[test]
    fn overhead_with_the_memory_workers_is_judged_against_the_run_without() {
        let with = |p50: f64, p99: f64| ScenarioMeasured {
            overhead: super::super::bench_verdict::Overhead {
                p50: Quantile::Ms(p50),
                p99: Quantile::Ms(p99),
                ..Default::default()
            },
            ..Default::default()
        };
        let m = MemoryMeasured {
            embedder: "x".into(),
            max_throughput_lag: Vec::new(),
            max_throughput_with: None,
            half_load_with: Some(with(2.1, 12.0)),
        };
        // Scenario 2 itself is the run without them.
        let c = judge(&target(), Some(&m), Some(&with(2.0, 10.0)));
        let p50 = c.iter().find(|c| c.target.contains("p50")).unwrap();
        let p99 = c.iter().find(|c| c.target.contains("p99")).unwrap();
        assert_eq!(p50.outcome, Outcome::Met, "{p50}");
        assert_eq!(p99.outcome, Outcome::Missed, "{p99}");
        assert!(p99.measured.contains("120%"), "{p99}");
        // The lag was not measured: not shown met.
        assert!(
            c.iter()
                .filter(|c| c.target.contains("lag") || c.target.contains("caught up"))
                .all(|c| c.outcome == Outcome::NotRun)
        );
    }

    #[test]
    fn memory_workers_off_shows_nothing_met() {
        let c = judge(&target(), None, None);
        assert_eq!(c.len(), 8);
        assert!(c.iter().all(|c| c.outcome == Outcome::NotRun));
    }
}
