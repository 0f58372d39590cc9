//! `make bench`: how fast the real pipeline is on this machine, what a turn costs, and whether
//! that meets the targets in `tests/bench-targets.toml` (printed with the results; the process
//! exits 1 when one is missed, or not run).
//!
//! Brings up its own stack (`bench`: NATS 16222, its monitor port 17222, Postgres 17432, every
//! port below Linux's ephemeral range; fsync on), runs every worker as its own process, fakes
//! the runner and Twilio as HTTP servers in this process, and posts Twilio-signed SMS through
//! the gateway. Scenarios, with the parameters the targets file names (the flags override them
//! for a shorter try, which then fails as not measuring what the target says):
//!
//! 1. max throughput: instant runner, closed loop (each sender one turn in flight);
//! 2. half load: open loop at half of scenario 1's turns/s, instant runner: overhead;
//! 3. in flight: open loop at 950 msg/s with a 10 s runner (about 9,500 calls in flight),
//!    measured for 60 s after a warm-up: overhead and whole-stack memory. No sender waits for
//!    a reply, so none gives up waiting and sends again.
//!
//! plus the floor (the same durable I/O per turn with no logic, `load::floor`), run like
//! scenario 1: a window as long, the same sessions, Postgres pool size (per stage) and
//! partitions, on a fresh database as every scenario.
//!
//! What a turn costs is counted for the pipeline and the floor alike, from just before the load
//! until the last turn completed and every database connection closed: commits and rows
//! written from `pg_stat_database` of the run's database, publishes from the `last_sequence` of
//! the run's streams. The floor counts its statements itself; the pipeline's are counted only
//! with `--count-statements`, by a proxy between the workers and Postgres that counts the
//! protocol's `Query` and `Execute` messages (it costs time, so a run with it measures I/O, not
//! speed; the floor then goes through one too).
//!
//! The verdict (`load::bench_verdict`) fails on a missed target and, in any scenario, on a
//! message never accepted or never answered, a double, an order violation, an overlap or a
//! dead letter; latency percentiles count the unanswered messages as `> window`.
//! `bench --judge <results.json>` judges a recorded run again. Results (`results.json`,
//! `bench.png`, worker logs and configs) go to `bench-results/<timestamp>/`.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use switchboard_load::bench_verdict::{
    self, Check, Findings, FloorMeasured, IoCounts, MachineSeen, Measured, Outcome, Overhead,
    ScenarioMeasured, Targets,
};
use switchboard_load::floor::{self, FloorOptions, FloorResult};
use switchboard_load::loadgen::{LoadGen, LoadStats, round_robin};
use switchboard_load::memory_lag::{
    self, Embedder, LagRun, LagSampler, LagSource, MemoryMeasured, MemorySide, MemoryWorkers,
};
use switchboard_load::memory_run;
use switchboard_load::observers::{LoadRunner, LoadTwilio, RunnerStats, SendStats};
use switchboard_load::pipeline::{self, Knobs, Pipeline};
use switchboard_load::procs::{self, CpuSnapshot, MemoryPeaks, MemorySampler};
use switchboard_load::report::{self, PlotSeries};
use switchboard_load::stack::{Stack, repo_dir};
use switchboard_load::statement_profile;
use switchboard_load::table_writes;
use switchboard_load::{message_text, now_us};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "bench",
    about = "Switchboard throughput, overhead and cost per turn, judged against tests/bench-targets.toml"
)]
struct Args {
    /// Scenarios to run (1: max throughput and the floor, 2: half load, 3: in flight). The
    /// targets of those not run are missed: a partial run tries scenarios out, and fails.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    scenarios: Vec<u8>,
    /// The targets and the machine they apply to.
    #[arg(long)]
    targets: Option<PathBuf>,
    /// Judge a recorded run (its results.json) against the targets, run nothing.
    #[arg(long)]
    judge: Option<PathBuf>,
    /// Measured seconds of scenario 1 and of the floor (default: the targets file's).
    #[arg(long)]
    secs: Option<u64>,
    /// Measured seconds of scenario 2 (default: the targets file's).
    #[arg(long)]
    half_secs: Option<u64>,
    /// Measured seconds of scenario 3 (default: the targets file's).
    #[arg(long)]
    in_flight_secs: Option<u64>,
    /// Skip the floor (its target is then missed, as not run).
    #[arg(long)]
    no_floor: bool,
    /// Warm-up seconds before measuring (scenarios 1 and 2, and the floor).
    #[arg(long, default_value_t = 5)]
    warmup: u64,
    /// Scenario 1 and the floor: senders (sessions), each with one turn in flight.
    #[arg(long, default_value_t = 1000)]
    senders: usize,
    /// Scenario 2: offered rate, messages/s (default: half of scenario 1's turns/s).
    #[arg(long)]
    half_rate: Option<f64>,
    /// Scenario 2: senders the load is spread over.
    #[arg(long, default_value_t = 2000)]
    half_senders: usize,
    /// Scenario 3: offered rate, messages/s (default: the targets file's).
    #[arg(long)]
    in_flight_rate: Option<f64>,
    /// Scenario 3: runner latency, ms (default: the targets file's).
    #[arg(long)]
    in_flight_runner_ms: Option<u64>,
    /// Scenario 3: senders, round-robin; each sends every senders/rate seconds, which must
    /// exceed the runner latency for the calls to be in flight at once rather than queued.
    #[arg(long, default_value_t = 10_000)]
    in_flight_senders: usize,
    /// Scenario 3: warm-up seconds (default: the runner latency + 10 s).
    #[arg(long)]
    in_flight_warmup: Option<u64>,
    /// runtime.batch
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// runtime.concurrency
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// agents[].concurrency (scenarios 1 and 2)
    #[arg(long, default_value_t = 256)]
    agent_concurrency: usize,
    /// runtime.turn_partitions (the floor's too)
    #[arg(long, default_value_t = 32)]
    partitions: u32,
    /// HTTP posts in flight at most (load generator).
    #[arg(long, default_value_t = 512)]
    max_posts: usize,
    /// Postgres connections per worker process and per floor stage (0: the product's default,
    /// runtime.concurrency between 4 and 8, as in switchboard_kit::startup).
    #[arg(long, default_value_t = 0)]
    db_pool: u32,
    /// Count the pipeline's SQL statements through a proxy (slows the run: I/O, not speed).
    #[arg(long)]
    count_statements: bool,
    #[arg(long, default_value = "bench")]
    stack_name: String,
    #[arg(long, default_value_t = 16222)]
    nats_port: u16,
    #[arg(long, default_value_t = 17432)]
    pg_port: u16,
    /// Run the product as one process (`switchboard up`) instead of one process per worker.
    /// The targets are for one process per worker; this reports the figure beside them.
    #[arg(long)]
    one_process: bool,
    /// Scenarios 1 and 2: run the memory workers (embed, categorise, summary) beside the reply
    /// path, sample their lag every second, and run scenario 2 again without them to compare
    /// (docs/bench-memory-workers.md). Off: their targets are not run.
    #[arg(long, value_enum, default_value = "on")]
    memory_workers: MemoryWorkers,
    /// The embedder of recall and the memory workers: `fake` (vectors over HTTP from the
    /// harness, answering at once: an embedding service, as a deployment at the targets' rate
    /// runs one; the speed figures leave model inference off the stack's cores) or `local`
    /// (the product's default, MiniLM in the worker processes; SB_EMBEDDING__MODEL_DIR names
    /// its files: what the local model costs is measured by `make bench-embed` and the memory
    /// bench).
    #[arg(long, value_enum, default_value = "fake")]
    memory_embedder: Embedder,
    /// Turn recall off in every scenario (`[recall] enabled = false`): what recall costs the
    /// reply path. The workers take their configuration from the file the bench writes, never
    /// from `SB_*` variables, so this is the way to change it.
    #[arg(long)]
    no_recall: bool,
    /// How long after scenarios 1 and 2 to wait for the memory workers to catch up (default:
    /// the targets file's max_catch_up_s).
    #[arg(long)]
    catch_up_secs: Option<u64>,
    /// One stage's batch size, `<stage>=<n>` (repeatable; `[stages.<stage>] batch`): with
    /// `session=1` and `deliver=1` those stages take one message at a time, as before they
    /// were batch stages, for a back-to-back comparison in one build.
    #[arg(long, value_parser = stage_batch)]
    stage_batch: Vec<(String, usize)>,
    /// Leave the stack running afterwards.
    #[arg(long)]
    keep_stack: bool,
    /// More Postgres settings for the bench's stack, one `name = value` a line (as
    /// `SB_STACK_PG_CONF`), e.g. `log_min_duration_statement = 0` to profile by statement
    /// (which slows the run: a profile, not a measurement).
    #[arg(long, default_value = "")]
    pg_conf: String,
    /// Profile Postgres by worker and statement (its log, `statements.txt` in each
    /// scenario's folder; slows the run: a profile, not a measurement).
    #[arg(long)]
    profile_statements: bool,
    /// Where results go (a timestamped folder is made inside).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Before counting a pipeline's I/O, how long its startup's statistics may take to reach
/// `pg_stat_database` (an idle backend flushes after `PGSTAT_IDLE_INTERVAL`, 10 s).
const STATS_SETTLE: Duration = Duration::from_secs(11);

/// How long after the load the replies may take, beyond the runner's latency.
const DRAIN: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Serialize)]
struct Cpu {
    /// Worker processes, CPU seconds during the measured window.
    workers: BTreeMap<String, f64>,
    workers_total_s: f64,
    nats_s: f64,
    postgres_s: f64,
    /// Load generator and fakes (this process): not part of the pipeline.
    harness_s: f64,
    /// Worker CPU per completed turn, ms.
    workers_ms_per_turn: f64,
    /// Workers + NATS + Postgres per turn, ms.
    stack_ms_per_turn: f64,
    harness_ms_per_turn: f64,
}

/// What a scenario showed beyond the verdict's inputs.
#[derive(Debug, Clone, Serialize)]
struct ScenarioDetail {
    id: u8,
    name: String,
    cpu: Cpu,
    /// VmHWM of each worker process, MB.
    peak_rss_mb: BTreeMap<String, f64>,
    memory: MemoryPeaks,
    knobs: Knobs,
    gateway: LoadStats,
    runner: RunnerStats,
    twilio: SendStats,
    /// Request sent → Twilio received, minus runner time (includes ingest).
    overhead_from_sent: Overhead,
    throughput_per_s: Vec<f64>,
    /// Every stage consumed and acked everything after the drain.
    settled: bool,
    /// Every backend of the run's database closed before its counters were read.
    io_counted_after_disconnect: bool,
    /// Lines in the worker logs (RUST_LOG=warn: warnings and errors), and the first few.
    worker_log_lines: u64,
    worker_log_examples: Vec<String>,
    /// The memory workers ran beside the reply path (the memory scenario's runs of 1 and 2).
    memory_workers: bool,
    /// The reply path configured as the memory runs are (embedder, summary model), without
    /// the memory workers: the scenario's own run, which the memory run is compared with.
    without_memory: bool,
    /// The memory stages' lag, sampled every second (every run of scenarios 1 and 2 while the
    /// memory workers are on).
    memory_lag: Option<LagRun>,
    /// /proc/loadavg (1, 5, 15 min) when the load started and when the window ended: the
    /// machine may be shared.
    load_average_before: Option<[f64; 3]>,
    load_average_after: Option<[f64; 3]>,
    #[serde(skip)]
    overhead_us: Vec<u64>,
}

/// What a run has of the memory half.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Memory {
    /// No embedder, no memory workers (`--memory-workers off`, scenario 3).
    Off,
    /// Configured as the memory scenario's run is (embedder, summary model), its memory
    /// workers not started: the reply path that run is compared with.
    Configured,
    /// The memory scenario's run: the memory workers beside the reply path, their lag sampled.
    Workers,
}

enum Mode {
    Closed,
    Open { rate: f64 },
}

struct Spec {
    id: u8,
    name: &'static str,
    mode: Mode,
    senders: usize,
    runner_delay: Duration,
    warmup: Duration,
    duration: Duration,
    knobs: Knobs,
    memory: Memory,
    /// How long to wait for the memory workers to catch up after the load.
    catch_up: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = now_us();
    let targets_path = args
        .targets
        .clone()
        .unwrap_or_else(|| repo_dir().join("tests/bench-targets.toml"));
    let targets = Targets::load(&targets_path)?;
    if let Some(recorded) = &args.judge {
        let text = std::fs::read_to_string(recorded)
            .with_context(|| format!("reading {}", recorded.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)?;
        let measured: Measured = serde_json::from_value(
            json.get("measured")
                .cloned()
                .context("no \"measured\" in the file")?,
        )?;
        println!("judging {}", recorded.display());
        let checks = bench_verdict::judge(&targets, &measured);
        let passed = print_verdict(&targets, &targets_path, &measured, &checks);
        std::process::exit(if passed { 0 } else { 1 });
    }

    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| repo_dir().join("bench-results"))
        .join(&stamp);
    std::fs::create_dir_all(&out)?;
    println!("bench: results in {}", out.display());
    println!(
        "bench: targets from {} (for {})",
        targets_path.display(),
        targets.machine.description
    );

    let stack = {
        let (n, np, pp) = (args.stack_name.clone(), args.nats_port, args.pg_port);
        let mut conf = args.pg_conf.clone();
        if args.profile_statements {
            conf = format!("{conf}\n{}", statement_profile::PG_CONF);
        }
        tokio::task::spawn_blocking(move || Stack::up_tuned(&n, np, pp, false, &conf)).await??
    };
    println!(
        "bench: stack '{}' up ({}, Postgres with fsync on)",
        stack.name,
        switchboard_kit::endpoint::redact_url(&stack.nats_url)
    );
    let result = run_all(&args, &targets, &stack, &out).await;
    if !args.keep_stack {
        stack.down();
    }
    let (measured, details, floor_result) = result?;

    print_results(&measured, &details, floor_result.as_ref());
    let checks = bench_verdict::judge(&targets, &measured);
    let passed = print_verdict(&targets, &targets_path, &measured, &checks);

    let json = serde_json::json!({
        "targets_file": targets_path,
        "targets": targets,
        "measured": measured,
        "checks": checks,
        "passed": passed,
        "details": {"scenarios": details, "floor": floor_result},
    });
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::copy(&targets_path, out.join("bench-targets.toml"))?;
    let series: Vec<PlotSeries> = details
        .iter()
        .map(|d| PlotSeries {
            name: format!("scenario {}: {}", d.id, d.name),
            throughput: d
                .throughput_per_s
                .iter()
                .enumerate()
                .map(|(i, v)| (i as f64, *v))
                .collect(),
            // The in-flight overheads (up to seconds) would flatten the others' curves.
            overhead_us: if d.id == 3 {
                Vec::new()
            } else {
                d.overhead_us.clone()
            },
            unanswered: measured_of(&measured, d).map_or(0, |s| s.overhead.unanswered),
        })
        .collect();
    if !series.is_empty() {
        let lag = lag_lines(&details);
        report::plot(&out.join("bench.png"), "Switchboard bench", &series, &lag)?;
    }
    println!(
        "\nwrote {} and {}",
        out.join("results.json").display(),
        out.join("bench.png").display()
    );
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}

/// What a scenario's run measured (the memory scenario's runs of 1 and 2 apart).
fn measured_of<'a>(m: &'a Measured, d: &ScenarioDetail) -> Option<&'a ScenarioMeasured> {
    if d.memory_workers {
        let w = m.memory_workers.as_ref()?;
        return match d.id {
            1 => w.max_throughput_with.as_ref(),
            _ => w.half_load_with.as_ref(),
        };
    }
    scenario_of(m, d.id)
}

/// One plot line per memory stage and run that sampled lag.
fn lag_lines(details: &[ScenarioDetail]) -> Vec<report::PlotLagLine> {
    let run = |d: &ScenarioDetail| {
        let with = if d.memory_workers {
            " with the memory workers"
        } else {
            " without them"
        };
        format!("scenario {}{with}", d.id)
    };
    details
        .iter()
        .filter_map(|d| d.memory_lag.as_ref().map(|l| l.plot_lines(&run(d))))
        .flatten()
        .collect()
}

fn scenario_of(m: &Measured, id: u8) -> Option<&ScenarioMeasured> {
    match id {
        1 => m.max_throughput.as_ref(),
        2 => m.half_load.as_ref(),
        3 => m.in_flight.as_ref(),
        _ => None,
    }
}

/// Postgres connections per worker process (and per floor stage).
fn db_pool(args: &Args) -> u32 {
    switchboard_kit::config::RuntimeConfig {
        db_pool_size: args.db_pool,
        concurrency: args.concurrency,
        ..Default::default()
    }
    .pool_size()
}

fn stage_batch(s: &str) -> Result<(String, usize), String> {
    let (stage, n) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected <stage>=<batch size>"))?;
    let n: usize = n.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if n == 0 {
        return Err(format!("{s:?}: a batch holds at least one message"));
    }
    Ok((stage.to_string(), n))
}

fn knobs(args: &Args) -> Knobs {
    Knobs {
        batch: args.batch,
        concurrency: args.concurrency,
        agent_concurrency: args.agent_concurrency,
        dispatch_concurrency: args.concurrency,
        partitions: args.partitions,
        db_pool_size: db_pool(args),
        ..Knobs::default()
    }
}

fn machine() -> MachineSeen {
    let mem_kb: f64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0.0);
    MachineSeen {
        cores: cores(),
        memory_gib: mem_kb / 1024.0 / 1024.0,
        os: std::env::consts::OS.into(),
        arch: std::env::consts::ARCH.into(),
        release_build: !cfg!(debug_assertions),
    }
}

type RunAll = (Measured, Vec<ScenarioDetail>, Option<FloorResult>);

async fn run_all(args: &Args, t: &Targets, stack: &Stack, out: &Path) -> anyhow::Result<RunAll> {
    let mut measured = Measured {
        machine: machine(),
        ..Default::default()
    };
    let mut details = Vec::new();
    let mut floor_result = None;
    let warmup = Duration::from_secs(args.warmup);
    let memory_on = args.memory_workers == MemoryWorkers::On;
    // Scenarios 1 and 2 themselves: the reply path, configured as their memory runs are.
    let reply_path = if memory_on {
        Memory::Configured
    } else {
        Memory::Off
    };
    let catch_up = Duration::from_secs(
        args.catch_up_secs
            .unwrap_or(t.memory_workers.max_catch_up_s.ceil() as u64),
    );
    if memory_on {
        println!(
            "bench: scenarios 1 and 2 measure the reply path; each runs again with the memory \
             workers (the memory scenario), embedder: {}",
            args.memory_embedder.as_str()
        );
    }

    if args.scenarios.contains(&1) {
        let spec = Spec {
            id: 1,
            name: "max throughput (instant runner, closed loop)",
            mode: Mode::Closed,
            senders: args.senders,
            runner_delay: Duration::from_millis(t.max_throughput.runner_ms),
            warmup,
            duration: Duration::from_secs(args.secs.unwrap_or(t.max_throughput.window_s)),
            knobs: knobs(args),
            memory: reply_path,
            catch_up,
        };
        let (m, d) = run_scenario(stack, &spec, args, out).await?;
        measured.max_throughput = Some(m);
        details.push(d);
        if memory_on {
            // The memory scenario: the same run with the memory workers beside the reply path,
            // their lag sampled.
            let spec = Spec {
                name: "max throughput with the memory workers",
                memory: Memory::Workers,
                ..spec
            };
            let (m, d) = run_scenario(stack, &spec, args, out).await?;
            let w = measured
                .memory_workers
                .get_or_insert_with(|| memory_measured(args));
            if let Some(lag) = &d.memory_lag {
                w.max_throughput_lag = lag.summary();
            }
            w.max_throughput_with = Some(m);
            details.push(d);
        }
        if !args.no_floor {
            let f = run_floor(stack, args, spec.duration).await?;
            measured.floor = Some(FloorMeasured {
                sessions: f.sessions,
                planned_window_s: f.planned_window_s,
                window_s: f.window_s,
                db_pool: f.pool,
                partitions: f.partitions,
                turns_in_window: f.turns,
                turns_per_s: f.turns_per_s,
                io: f.io.clone(),
            });
            floor_result = Some(f);
        }
    }
    if args.scenarios.contains(&2) {
        let rate = args.half_rate.unwrap_or_else(|| {
            measured
                .max_throughput
                .as_ref()
                .map(|r| (r.turns_per_s * t.half_load.share_of_max).max(1.0))
                .unwrap_or(1000.0)
        });
        let spec = Spec {
            id: 2,
            name: "half load (open loop): overhead",
            mode: Mode::Open { rate },
            senders: args.half_senders,
            runner_delay: Duration::ZERO,
            warmup,
            duration: Duration::from_secs(args.half_secs.unwrap_or(t.half_load.window_s)),
            knobs: knobs(args),
            memory: reply_path,
            catch_up,
        };
        let (m, d) = run_scenario(stack, &spec, args, out).await?;
        measured.half_load = Some(m);
        details.push(d);
        if memory_on {
            // The same run (rate, senders, window) with the memory workers beside it.
            let spec = Spec {
                name: "half load (open loop) with the memory workers",
                memory: Memory::Workers,
                ..spec
            };
            let (m, d) = run_scenario(stack, &spec, args, out).await?;
            measured
                .memory_workers
                .get_or_insert_with(|| memory_measured(args))
                .half_load_with = Some(m);
            details.push(d);
        }
    }
    if args.scenarios.contains(&3) {
        let runner =
            Duration::from_millis(args.in_flight_runner_ms.unwrap_or(t.in_flight.runner_ms));
        let rate = args.in_flight_rate.unwrap_or(t.in_flight.rate_per_s);
        let senders = args.in_flight_senders;
        // Room for every call in flight (rate × runner) and then some.
        let in_flight = senders + senders / 5;
        let spec = Spec {
            id: 3,
            name: "in flight (open loop, slow runner)",
            mode: Mode::Open { rate },
            senders,
            runner_delay: runner,
            // Ramp-up: the calls in flight build up over one runner latency.
            warmup: args
                .in_flight_warmup
                .map(Duration::from_secs)
                .unwrap_or(runner + Duration::from_secs(10)),
            duration: Duration::from_secs(args.in_flight_secs.unwrap_or(t.in_flight.window_s)),
            knobs: Knobs {
                runner_timeout_s: runner.as_secs() + 30,
                dispatch_concurrency: in_flight,
                agent_concurrency: in_flight,
                max_ack_pending: (in_flight as i64 * 2).max(20_000),
                ..knobs(args)
            },
            memory: Memory::Off,
            catch_up,
        };
        let (m, d) = run_scenario(stack, &spec, args, out).await?;
        measured.in_flight = Some(m);
        details.push(d);
    }
    Ok((measured, details, floor_result))
}

fn memory_measured(args: &Args) -> MemoryMeasured {
    MemoryMeasured {
        embedder: args.memory_embedder.as_str().into(),
        ..Default::default()
    }
}

fn print_results(m: &Measured, details: &[ScenarioDetail], floor: Option<&FloorResult>) {
    println!();
    println!("==== results ====");
    for d in details {
        let Some(r) = measured_of(m, d) else {
            continue;
        };
        println!(
            "scenario {} - {} ({}): {:.0} turns/s over {:.1} s ({} turns); accepted {} ({} in the window), unanswered {}",
            d.id,
            d.name,
            r.load,
            r.turns_per_s,
            r.window_s,
            r.turns_in_window,
            r.accepted,
            r.accepted_in_window,
            r.unanswered.count
        );
        println!("    overhead: {}", r.overhead);
        println!(
            "    runner calls at once in the window: {:.0} on average, {} at most",
            r.runner_in_flight_mean, r.runner_in_flight_max
        );
        println!(
            "    CPU per turn: workers {:.3} ms, + NATS + Postgres {:.3} ms, harness {:.3} ms; workers {:?}",
            d.cpu.workers_ms_per_turn,
            d.cpu.stack_ms_per_turn,
            d.cpu.harness_ms_per_turn,
            d.cpu
                .workers
                .iter()
                .map(|(k, v)| format!("{k} {v:.1}s"))
                .collect::<Vec<_>>()
        );
        println!(
            "    CPU seconds in window: workers {:.1}, NATS {:.1}, Postgres {:.1}, harness {:.1} (of {:.0} available on {} cores)",
            d.cpu.workers_total_s,
            d.cpu.nats_s,
            d.cpu.postgres_s,
            d.cpu.harness_s,
            r.window_s * cores() as f64,
            cores()
        );
        println!(
            "    whole stack peak (workers RSS + NATS RSS + Postgres PSS): {:.0} MB (workers {:.0}, NATS {:.0}, Postgres {:.0}); harness {:.0} MB",
            d.memory.stack_mb,
            d.memory.workers_mb,
            d.memory.nats_mb,
            d.memory.postgres_mb,
            d.memory.harness_mb
        );
        println!("    per turn: {}", r.io.per_turn());
        if let Some(tables) = r.io.tables_per_turn() {
            println!("    rows written per turn, by table: {tables}");
        }
        println!(
            "    gateway: {} accepted, {} non-200 {:?}, {} errors, {} given up, {} not sent; Twilio {} sends, {} doubles; dead letters {}",
            d.gateway.accepted,
            d.gateway.rejected,
            d.gateway.statuses,
            d.gateway.errors,
            d.gateway.gave_up,
            d.gateway.not_sent,
            d.twilio.total,
            d.twilio.doubles,
            r.dead_letters.count
        );
        memory_lag::print(
            d.memory_workers,
            d.memory_lag.as_ref(),
            d.load_average_before,
            d.load_average_after,
        );
        if d.worker_log_lines > 0 {
            println!(
                "    worker logs: {} lines of warnings and errors, first: {}",
                d.worker_log_lines,
                d.worker_log_examples.first().map_or("", String::as_str)
            );
        }
    }
    if let (Some(f), Some(s)) = (floor, &m.max_throughput) {
        println!(
            "floor (sessions {}, Postgres pool {} per stage, {} partitions): {:.0} turns/s over {:.1} s ({} turns); pipeline ÷ floor {:.1}%{}",
            f.sessions,
            f.pool,
            f.partitions,
            f.turns_per_s,
            f.window_s,
            f.turns,
            100.0 * s.turns_per_s / f.turns_per_s.max(1e-9),
            if f.drained {
                ""
            } else {
                " (turns still in flight when counting ended)"
            }
        );
        println!(
            "    CPU per turn: floor process {:.3} ms, + NATS + Postgres {:.3} ms",
            f.cpu_ms_per_turn, f.cpu_ms_per_turn_with_stack
        );
        println!("    per turn: {}", f.io.per_turn());
    }
}

/// Prints the targets with the checks; returns whether the run passed.
fn print_verdict(t: &Targets, path: &Path, m: &Measured, checks: &[Check]) -> bool {
    println!();
    println!("==== targets ({}) ====", path.display());
    println!("for: {}", t.machine.description);
    println!("this run: {}", m.machine);
    let differences = bench_verdict::machine_differences(&t.machine, &m.machine);
    if !differences.is_empty() {
        println!(
            "note: not the machine the targets are for ({}); the verdict below still applies the targets",
            differences.join(", ")
        );
    }
    for c in checks {
        println!("  {c}");
    }
    let missed = bench_verdict::missed(checks).len();
    let not_run = checks
        .iter()
        .filter(|c| c.outcome == Outcome::NotRun)
        .count();
    println!();
    if missed > 0 {
        let partial = if not_run > 0 {
            format!(
                " ({not_run} of them not run, so not shown to be met: {})",
                bench_verdict::not_run(checks).join(", ")
            )
        } else {
            String::new()
        };
        println!(
            "verdict: FAILED, {missed} of {} checks missed{partial}",
            checks.len()
        );
    } else {
        println!("verdict: PASSED, all {} checks met", checks.len());
    }
    missed == 0
}

fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

async fn run_scenario(
    stack: &Stack,
    spec: &Spec,
    args: &Args,
    out: &Path,
) -> anyhow::Result<(ScenarioMeasured, ScenarioDetail)> {
    println!("\n---- scenario {}: {} ----", spec.id, spec.name);
    let with_workers = spec.memory == Memory::Workers;
    let tag = if with_workers { "m" } else { "" };
    let dir = out.join(format!(
        "scenario-{}{}",
        spec.id,
        if with_workers { "-with-memory" } else { "" }
    ));
    let runner = LoadRunner::start(spec.runner_delay).await;
    runner.record_timing(true);
    let twilio = LoadTwilio::start(pipeline::ACCOUNT_SID, pipeline::AUTH_TOKEN).await;
    let run = format!("bench{}x{tag}", spec.id);
    let mut config =
        pipeline::config_for_run(stack, &run, &runner.url, &twilio, &spec.knobs).await?;
    if args.no_recall {
        config.recall.enabled = false;
    }
    for (stage, batch) in &args.stage_batch {
        config.stages.entry(stage.clone()).or_default().batch = Some(*batch);
    }
    // The reply path's run is configured as the one with the memory workers.
    let sample_lag = spec.memory != Memory::Off;
    // The fake chat model answers until the memory workers have caught up.
    let memory_side = if sample_lag {
        let m = MemorySide::start(args.memory_embedder).await;
        m.configure(&mut config, stack);
        Some(m)
    } else {
        None
    };
    let database = floor::database_name(&config.database_url)?;
    let counter = if args.count_statements {
        let c = StatementCounter::start(&config.database_url).await?;
        config.database_url = c.url.clone().into();
        Some(c)
    } else {
        None
    };
    // Dispatch starts last: its topology settings (max_ack_pending follows runtime.concurrency)
    // are the ones that stay.
    let per_worker = [
        "gateway", "identify", "session", "log", "deliver", "dispatch",
    ];
    let mut order: Vec<&str> = if args.one_process {
        vec!["up"]
    } else {
        per_worker.to_vec()
    };
    if with_workers && !args.one_process {
        order.extend(memory_lag::WORKERS);
    }
    let mut pipeline = Pipeline::start(&dir, config, &order, |_, _| {})
        .await
        .context("starting the pipeline")?;
    let pids = pipeline.workers.pids();
    println!(
        "workers up: {}",
        pids.iter()
            .map(|(l, p)| format!("{l} (pid {p})"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let (nats_pid, pg_pid) = (stack.nats_pid(), stack.postgres_pid());
    let topology = pipeline.topology.clone();
    let streams = [
        topology.work_stream(),
        topology.events_stream(),
        topology.dlq_stream(),
        format!("KV_{}", topology.arrivals_bucket()),
    ];

    // Counting starts once the startup's statistics have reached pg_stat_database. The
    // tables are read on a connection of their own before the database's counters (and after
    // them at the end), so the reads are not counted.
    tokio::time::sleep(STATS_SETTLE).await;
    let run_db = table_writes::url_of_database(&stack.database_url, &database)?;
    let tables_before = table_writes::read(&run_db).await?;
    let pg_before = floor::pg_counters(&stack.database_url, &database).await?;
    let seq_before = floor::stream_sequences(&pipeline.js, &streams).await;
    let statements_before = counter.as_ref().map(StatementCounter::count);
    let log_before = args
        .profile_statements
        .then(|| stack.postgres_log())
        .flatten()
        .map(|log| statement_profile::LogMark::now(&log));

    let load = LoadGen::new(pipeline.gateway.clone(), twilio.clone(), args.max_posts)
        .with_retry_for(Duration::from_secs(10));
    let start = Instant::now();
    let start_us = now_us();
    let until = start + spec.warmup + spec.duration;
    let load_average_before = memory_lag::load_average();
    let lag_sampler = sample_lag.then(|| {
        LagSampler::start(
            LagSource {
                db: pipeline.db.clone(),
                js: pipeline.js.clone(),
                topology: pipeline.topology.clone(),
                embedding_model: pipeline.config.embedding.model.clone(),
                idle_gap_s: pipeline.config.summary.idle_gap_s,
            },
            start,
        )
    });
    let senders = spec.senders;
    let (load_desc, offered) = match spec.mode {
        Mode::Closed => (format!("closed loop, {senders} senders"), None),
        Mode::Open { rate } => (
            format!("open loop, {rate:.0} msg/s over {senders} senders"),
            Some(rate),
        ),
    };
    println!(
        "load: {load_desc}, runner {:?}, warm-up {:?}, measured {:?}",
        spec.runner_delay, spec.warmup, spec.duration
    );
    let load_task = {
        let load = load.clone();
        let reply_wait = spec.runner_delay + Duration::from_secs(30);
        match spec.mode {
            Mode::Closed => tokio::spawn(async move {
                load.closed_loop(senders, until, reply_wait).await;
            }),
            Mode::Open { rate } => tokio::spawn(async move {
                load.open_loop(senders, rate, until, round_robin(senders))
                    .await;
            }),
        }
    };
    let sampler = MemorySampler::start(pids.iter().map(|(_, p)| *p).collect(), nats_pid, pg_pid);

    let total = (spec.warmup + spec.duration).as_secs();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} s  {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("scenario {}", spec.id));
    let mut cpu_before = None;
    let mut warm_us = start_us;
    let mut last = (0u64, Instant::now());
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if cpu_before.is_none() && start.elapsed() >= spec.warmup {
            cpu_before = Some(CpuSnapshot::take(&pids, nats_pid, pg_pid));
            warm_us = now_us();
        }
        let done = twilio.distinct();
        if last.1.elapsed() >= Duration::from_secs(1) {
            let rate = (done - last.0) as f64 / last.1.elapsed().as_secs_f64();
            last = (done, Instant::now());
            bar.set_message(format!(
                "{rate:.0} turns/s now, {done} replies, {} accepted{}",
                load.accepted_count(),
                if start.elapsed() < spec.warmup {
                    " (warm-up)"
                } else {
                    ""
                }
            ));
        }
        bar.set_position(start.elapsed().as_secs().min(total));
    }
    let cpu_after = CpuSnapshot::take(&pids, nats_pid, pg_pid);
    let end_us = now_us();
    let load_average_after = memory_lag::load_average();
    bar.finish_and_clear();
    let peak_rss_mb = pids
        .iter()
        .map(|(l, p)| {
            (
                l.clone(),
                procs::peak_rss_kb(*p).unwrap_or(0) as f64 / 1024.0,
            )
        })
        .collect();
    let memory = sampler.stop();
    load.stop();

    // Drain: wait for the reply to every message accepted in the run.
    let drain_until = Instant::now() + spec.runner_delay + DRAIN;
    loop {
        let accepted = load.accepted();
        let waiting = accepted
            .iter()
            .filter(|a| {
                twilio
                    .arrivals_of(&message_text(a.sender, a.index))
                    .is_empty()
            })
            .count();
        if (waiting == 0 && load_task.is_finished()) || Instant::now() >= drain_until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    load_task.abort();
    let accepted = load.accepted();
    // The stages behind the reply (the outbound log) finish too: the I/O counted is all of it.
    let settled = pipeline.settle(Duration::from_secs(15)).await;
    // The memory workers catch up (their I/O then counts with the turns': what a turn costs),
    // within `catch_up` of the window's end, as the target counts it (the drain and settle
    // are part of that time).
    if with_workers {
        let since_end = Duration::from_micros(now_us().saturating_sub(end_us));
        let (caught_up, _) = memory_run::wait_caught_up(
            &mut pipeline,
            spec.catch_up.saturating_sub(since_end),
            &|e| eprintln!("bench: {e}"),
        )
        .await?;
        if caught_up {
            // One more sample, so the series shows it.
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        println!(
            "memory workers caught up: {caught_up} ({:.1} s after the window)",
            now_us().saturating_sub(end_us) as f64 / 1e6
        );
    }
    let memory_lag = lag_sampler.map(|s| {
        let since = |us: u64| us.saturating_sub(start_us) as f64 / 1e6;
        LagRun {
            stages: s.stop(),
            window_start_s: since(warm_us),
            window_end_s: since(end_us),
            catch_up_waited_s: since(now_us()) - since(end_us),
        }
    });
    drop(memory_side);
    let seq_after = floor::stream_sequences(&pipeline.js, &streams).await;
    // Read from the dead-letter stream itself: a list that cannot be read is a finding, never
    // "no dead letters".
    let dlq_read = switchboard_kit::dlq::list(
        &pipeline.js,
        &pipeline.topology,
        None,
        bench_verdict::EXAMPLES,
    )
    .await;
    let turns_total = twilio.distinct();
    let statements = counter
        .as_ref()
        .zip(statements_before)
        .map(|(c, b)| c.count() - b);
    pipeline.stop().await;
    let disconnected =
        floor::wait_for_no_backends(&stack.database_url, &database, Duration::from_secs(15)).await;
    let pg_after = floor::pg_counters(&stack.database_url, &database).await?;
    let tables_after = table_writes::read(&run_db).await?;
    if let Some(before) = &log_before {
        let after = statement_profile::LogMark::now(&stack.postgres_log().unwrap_or_default());
        let profile =
            statement_profile::profile(&before.read_to(&after)?, "switchboard-", turns_total);
        std::fs::write(dir.join("statements.txt"), profile.render(40))?;
        println!("{}", profile.render(15));
    }
    let counted_by = match &counter {
        Some(c) if c.encrypted() => {
            "not counted: the connections were encrypted, the proxy could not read them".into()
        }
        Some(_) => "counted by a proxy, BEGIN and COMMIT included".into(),
        None => "the pipeline's are counted with --count-statements".into(),
    };
    let statements = statements.filter(|_| !counter.as_ref().is_some_and(|c| c.encrypted()));
    let io = IoCounts {
        tables: table_writes::growth(&tables_before, &tables_after),
        ..floor::io_counts(
            turns_total,
            (&pg_before, &seq_before),
            (&pg_after, &seq_after),
            statements,
            counted_by,
        )
    };

    // Latency of the messages accepted in the window; the unanswered ones count as > window.
    let mut overhead_us = Vec::new();
    let mut from_sent_us = Vec::new();
    let mut unanswered_in_window = 0;
    let mut in_window = 0;
    let mut unanswered = Vec::new();
    for a in &accepted {
        let text = message_text(a.sender, a.index);
        let arrived = twilio.arrivals_of(&text).first().copied();
        let windowed = a.accepted_us >= warm_us && a.accepted_us < end_us;
        in_window += u64::from(windowed);
        match arrived {
            None => {
                unanswered.push((a.accepted_us, text));
                unanswered_in_window += u64::from(windowed);
            }
            Some(at) if windowed => {
                let runner_us = runner.time_of(&text).unwrap_or(0);
                overhead_us.push(at.saturating_sub(a.accepted_us).saturating_sub(runner_us));
                from_sent_us.push(at.saturating_sub(a.sent_us).saturating_sub(runner_us));
            }
            Some(_) => {}
        }
    }
    unanswered.sort();
    let at = |us: u64| (us.saturating_sub(start_us)) as f64 / 1e6;
    let unanswered = Findings::new(
        unanswered.len() as u64,
        unanswered
            .iter()
            .map(|(us, text)| format!("{text} (accepted {:.3} s into the scenario)", at(*us))),
    );
    let never_accepted = {
        let v = load.given_up();
        Findings::new(v.len() as u64, v.iter().map(|(s, i)| message_text(*s, *i)))
    };
    let doubles = {
        let mut v = twilio.doubled();
        v.sort();
        Findings::new(
            v.iter().map(|(_, t)| t.len() as u64 - 1).sum(),
            v.iter()
                .map(|(text, t)| format!("{text} delivered {} times", t.len())),
        )
    };
    let calls = runner.calls();
    let repeated_calls = {
        let mut per_text: HashMap<&str, u64> = HashMap::new();
        for c in &calls {
            *per_text.entry(c.text.as_str()).or_default() += 1;
        }
        let mut v: Vec<(&str, u64)> = per_text.into_iter().filter(|(_, n)| *n > 1).collect();
        v.sort();
        Findings::new(
            v.iter().map(|(_, n)| n - 1).sum(),
            v.iter().map(|(t, n)| format!("{t} called {n} times")),
        )
    };
    let runner_stats = runner.stats();
    let twilio_stats = twilio.stats();
    let evidence = |prefixes: &[&str]| -> Vec<String> {
        runner_stats
            .evidence
            .iter()
            .chain(&twilio_stats.evidence)
            .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
            .cloned()
            .collect()
    };
    let order_violations = Findings::new(
        runner_stats.order_violations + runner_stats.seq_violations + twilio_stats.order_violations,
        evidence(&["runner arrival order", "runner seq order", "sms order"]),
    );
    let overlaps = Findings::new(runner_stats.overlaps, evidence(&["overlap"]));
    let dead_letters = match dlq_read {
        Ok(letters) => {
            let stored = seq_after
                .get(&topology.dlq_stream())
                .copied()
                .unwrap_or(0)
                .saturating_sub(seq_before.get(&topology.dlq_stream()).copied().unwrap_or(0));
            Findings::new(
                stored.max(letters.len() as u64),
                letters.into_iter().map(|d| {
                    format!(
                        "{}: {} (subject {}, delivery {})",
                        d.letter.stage, d.letter.error, d.letter.subject, d.letter.delivery_count
                    )
                }),
            )
        }
        Err(e) => Findings::new(1, [format!("the dead letters could not be read: {e}")]),
    };
    let (in_flight_mean, in_flight_max) = report::concurrency(
        &calls
            .iter()
            .map(|c| (c.start_us, c.end_us))
            .collect::<Vec<_>>(),
        warm_us,
        end_us,
    );

    let arrivals = twilio.arrival_times();
    let turns_in_window = arrivals
        .iter()
        .filter(|t| **t >= warm_us && **t < end_us)
        .count() as u64;
    let window_s = (end_us - warm_us) as f64 / 1e6;
    let cpu = cpu_before.unwrap_or_default().delta(&cpu_after);
    let per_turn = |s: f64| s * 1000.0 / turns_in_window.max(1) as f64;
    let cpu = Cpu {
        workers_total_s: cpu.workers_total(),
        nats_s: cpu.nats,
        postgres_s: cpu.postgres,
        harness_s: cpu.harness,
        workers_ms_per_turn: per_turn(cpu.workers_total()),
        stack_ms_per_turn: per_turn(cpu.workers_total() + cpu.nats + cpu.postgres),
        harness_ms_per_turn: per_turn(cpu.harness),
        workers: cpu.workers,
    };
    let (worker_log_lines, worker_log_examples) = worker_log(&dir.join("logs"));
    let measured = ScenarioMeasured {
        load: load_desc,
        senders,
        offered_rate_per_s: offered,
        runner_ms: spec.runner_delay.as_millis() as u64,
        warmup_s: spec.warmup.as_secs_f64(),
        planned_window_s: spec.duration.as_secs(),
        window_s,
        db_pool: spec.knobs.db_pool_size,
        partitions: spec.knobs.partitions,
        accepted: accepted.len() as u64,
        accepted_in_window: in_window,
        turns_in_window,
        turns_per_s: turns_in_window as f64 / window_s.max(1e-9),
        overhead: bench_verdict::overhead(&overhead_us, unanswered_in_window),
        stack_rss_mb: memory.stack_mb,
        runner_in_flight_mean: in_flight_mean,
        runner_in_flight_max: in_flight_max,
        never_accepted,
        unanswered,
        doubles,
        repeated_calls,
        order_violations,
        overlaps,
        dead_letters,
        io,
    };
    let detail = ScenarioDetail {
        id: spec.id,
        name: spec.name.into(),
        cpu,
        peak_rss_mb,
        memory,
        knobs: spec.knobs.clone(),
        gateway: load.stats(),
        runner: runner_stats,
        twilio: twilio_stats,
        overhead_from_sent: bench_verdict::overhead(&from_sent_us, unanswered_in_window),
        throughput_per_s: report::per_second(&arrivals, start_us, end_us)
            .into_iter()
            .map(|(_, v)| v)
            .collect(),
        settled,
        io_counted_after_disconnect: disconnected,
        worker_log_lines,
        worker_log_examples,
        memory_workers: with_workers,
        without_memory: spec.memory == Memory::Configured,
        memory_lag,
        load_average_before,
        load_average_after,
        overhead_us,
    };
    println!(
        "scenario {}: {:.0} turns/s, overhead p50 {} p99 {}, {} unanswered, workers CPU {:.3} ms/turn, stack peak {:.0} MB",
        spec.id,
        measured.turns_per_s,
        measured.overhead.p50,
        measured.overhead.p99,
        measured.unanswered.count,
        detail.cpu.workers_ms_per_turn,
        detail.memory.stack_mb
    );
    Ok((measured, detail))
}

/// Lines in a run's worker logs, and the first few (shortened).
fn worker_log(dir: &Path) -> (u64, Vec<String>) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    let (mut n, mut examples) = (0u64, Vec::new());
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        let name = f.file_name().map(|s| s.to_string_lossy().into_owned());
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            n += 1;
            if examples.len() < 5 {
                let short: String = line.chars().take(300).collect();
                examples.push(format!("{}: {short}", name.as_deref().unwrap_or("?")));
            }
        }
    }
    (n, examples)
}

/// The floor with scenario 1's sessions, pool size, partitions and window.
async fn run_floor(stack: &Stack, args: &Args, duration: Duration) -> anyhow::Result<FloorResult> {
    println!("\n---- floor: the same durable I/O per turn, no logic ----");
    let mut database_url = stack.fresh_database("floor").await?;
    // With --count-statements the pipeline went through a proxy: so does the floor.
    let counter = if args.count_statements {
        let c = StatementCounter::start(&database_url).await?;
        database_url = c.url.clone();
        Some(c)
    } else {
        None
    };
    let opts = FloorOptions {
        nats_url: stack.nats_url.clone(),
        database_url,
        admin_url: stack.database_url.clone(),
        prefix: format!("floor{}", &uuid::Uuid::new_v4().simple().to_string()[..6]),
        sessions: args.senders,
        duration,
        warmup: Duration::from_secs(args.warmup),
        batch: args.batch,
        concurrency: args.concurrency,
        pool: db_pool(args),
        partitions: args.partitions,
        nats_pid: stack.nats_pid(),
        postgres_pid: stack.postgres_pid(),
    };
    let bar = ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(200));
    let b = bar.clone();
    let result = floor::run(&opts, move |n| b.set_message(format!("floor: {n} turns"))).await?;
    bar.finish_and_clear();
    println!(
        "floor: {:.0} turns/s ({} turns in {:.1} s)",
        result.turns_per_s, result.turns, result.window_s
    );
    if let Some(c) = counter {
        println!(
            "floor: statements counted by the floor {}, by the proxy {} (cross-check)",
            result.io.statements.unwrap_or(0),
            c.count()
        );
    }
    Ok(result)
}

// ---- counting statements on the wire --------------------------------------------------------

/// A TCP proxy in front of Postgres that counts the statements its clients send: the wire
/// protocol's `Query` (simple protocol, e.g. `BEGIN`) and `Execute` (extended protocol)
/// messages. Every byte passes on unchanged.
struct StatementCounter {
    /// The database URL with the proxy's address.
    url: String,
    statements: Arc<AtomicU64>,
    /// A client negotiated encryption: what followed could not be counted.
    encrypted: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl StatementCounter {
    async fn start(database_url: &str) -> anyhow::Result<Self> {
        let mut url = reqwest::Url::parse(database_url).context("a Postgres URL")?;
        let upstream = format!(
            "{}:{}",
            url.host_str().context("no host in the Postgres URL")?,
            url.port().unwrap_or(5432)
        );
        let listener = switchboard_kit::net::bind("127.0.0.1:0").await?;
        url.set_host(Some("127.0.0.1"))?;
        url.set_port(Some(listener.local_addr()?.port()))
            .map_err(|()| anyhow::anyhow!("cannot set the port of the Postgres URL"))?;
        let statements = Arc::new(AtomicU64::new(0));
        let encrypted = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (statements, encrypted) = (statements.clone(), encrypted.clone());
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (upstream, statements, encrypted) =
                        (upstream.clone(), statements.clone(), encrypted.clone());
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(&upstream).await else {
                            return;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let _ = relay(client, server, &statements, &encrypted).await;
                    });
                }
            }
        });
        Ok(Self {
            url: url.to_string(),
            statements,
            encrypted,
            task,
        })
    }

    fn count(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    fn encrypted(&self) -> bool {
        self.encrypted.load(Ordering::Relaxed)
    }
}

impl Drop for StatementCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One client connection: the startup (untyped messages) passed on as they come, then the
/// typed messages counted as they stream through; the server's answers copied back.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    statements: &AtomicU64,
    encrypted: &AtomicBool,
) -> std::io::Result<()> {
    const SSL_REQUEST: u32 = 80_877_103;
    const GSSENC_REQUEST: u32 = 80_877_104;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    loop {
        let len = cr.read_u32().await?;
        let mut body = vec![0u8; (len as usize).saturating_sub(4)];
        cr.read_exact(&mut body).await?;
        sw.write_u32(len).await?;
        sw.write_all(&body).await?;
        let code = body
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        if matches!(code, Some(SSL_REQUEST | GSSENC_REQUEST)) {
            let answer = sr.read_u8().await?;
            cw.write_u8(answer).await?;
            if answer != b'N' {
                encrypted.store(true, Ordering::Relaxed);
                let _ = tokio::join!(
                    tokio::io::copy(&mut cr, &mut sw),
                    tokio::io::copy(&mut sr, &mut cw)
                );
                return Ok(());
            }
            continue;
        }
        break; // the startup message (or a cancel request)
    }
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        let _ = cw.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    let (mut header, mut header_len, mut body_left) = ([0u8; 5], 0usize, 0usize);
    loop {
        let n = cr.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let mut i = 0;
        while i < n {
            if body_left > 0 {
                let k = body_left.min(n - i);
                body_left -= k;
                i += k;
                continue;
            }
            header[header_len] = buf[i];
            header_len += 1;
            i += 1;
            if header_len == 5 {
                if matches!(header[0], b'Q' | b'E') {
                    statements.fetch_add(1, Ordering::Relaxed);
                }
                let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
                body_left = (len as usize).saturating_sub(4);
                header_len = 0;
            }
        }
        sw.write_all(&buf[..n]).await?;
    }
    let _ = sw.shutdown().await;
    let _ = down.await;
    Ok(())
}
