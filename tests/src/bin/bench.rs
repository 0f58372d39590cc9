//! `make bench`: how fast the real pipeline is on this machine, and what it costs.
//!
//! Brings up its own stack (`bench`, NATS 36222, Postgres 37432, fsync on), runs every worker
//! as its own process, fakes the runner and Twilio as HTTP servers in this process, and posts
//! Twilio-signed SMS through the gateway. Scenarios:
//!
//! 1. max throughput: instant runner, closed loop (each sender one turn in flight);
//! 2. half that load, open loop: pipeline overhead percentiles;
//! 3. 10,000 sessions in flight with a 10 s runner: turns/s and whole-stack memory.
//!
//! plus the floor (the same durable I/O per turn, no logic) to compare scenario 1 with.
//! Results (JSON, PNG, worker logs and configs) go to `bench-results/<timestamp>/`.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use switchboard_e2e::load::fakes::{LoadRunner, LoadTwilio, RunnerStats, TwilioStats};
use switchboard_e2e::load::floor::{self, FloorOptions, FloorResult};
use switchboard_e2e::load::loadgen::{LoadGen, LoadStats, round_robin};
use switchboard_e2e::load::pipeline::{self, Knobs, Pipeline};
use switchboard_e2e::load::procs::{self, CpuSnapshot, MemoryPeaks, MemorySampler};
use switchboard_e2e::load::report::{self, Percentiles, PlotSeries};
use switchboard_e2e::load::stack::{Stack, repo_dir};
use switchboard_e2e::load::{message_text, now_us};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "bench",
    about = "Switchboard throughput, overhead and cost per turn"
)]
struct Args {
    /// Scenarios to run (1: max throughput, 2: half load overhead, 3: 10k sessions, slow runner).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    scenarios: Vec<u8>,
    /// Measured seconds of scenario 1 (after the warm-up).
    #[arg(long, default_value_t = 60)]
    max_duration: u64,
    /// Measured seconds of scenario 2.
    #[arg(long, default_value_t = 30)]
    half_duration: u64,
    /// Measured seconds of scenario 3.
    #[arg(long, default_value_t = 60)]
    sessions_duration: u64,
    /// Measured seconds of the floor (0: skip it).
    #[arg(long, default_value_t = 30)]
    floor_duration: u64,
    /// Warm-up seconds before measuring (scenarios 1 and 2, and the floor).
    #[arg(long, default_value_t = 5)]
    warmup: u64,
    /// Scenario 1: senders, each with one turn in flight.
    #[arg(long, default_value_t = 1000)]
    senders: usize,
    /// Scenario 2: offered rate, messages/s (default: half of scenario 1's turns/s, else 1000).
    #[arg(long)]
    half_rate: Option<f64>,
    /// Scenario 2: senders the load is spread over.
    #[arg(long, default_value_t = 2000)]
    half_senders: usize,
    /// Scenario 3: sessions in flight.
    #[arg(long, default_value_t = 10_000)]
    sessions: usize,
    /// Scenario 3: runner latency, ms.
    #[arg(long, default_value_t = 10_000)]
    slow_runner_ms: u64,
    /// runtime.batch
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// runtime.concurrency (scenarios 1 and 2)
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// agents[].concurrency (scenarios 1 and 2)
    #[arg(long, default_value_t = 256)]
    agent_concurrency: usize,
    /// runtime.turn_partitions
    #[arg(long, default_value_t = 32)]
    partitions: u32,
    /// HTTP posts in flight at most (load generator).
    #[arg(long, default_value_t = 512)]
    max_posts: usize,
    /// Postgres connections per worker process (0: the product's default, from --concurrency).
    #[arg(long, default_value_t = 0)]
    db_pool: u32,
    #[arg(long, default_value = "bench")]
    stack_name: String,
    #[arg(long, default_value_t = 36222)]
    nats_port: u16,
    #[arg(long, default_value_t = 37432)]
    pg_port: u16,
    /// Leave the stack running afterwards.
    #[arg(long)]
    keep_stack: bool,
    /// Where results go (a timestamped folder is made inside).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
struct Cpu {
    /// Worker processes, CPU seconds during the measured window.
    workers: std::collections::BTreeMap<String, f64>,
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

#[derive(Debug, Clone, Serialize)]
struct ScenarioResult {
    id: u8,
    name: String,
    load: String,
    runner_delay_ms: u64,
    warmup_s: u64,
    window_s: f64,
    offered_rate: Option<f64>,
    accepted_in_window: u64,
    turns_in_window: u64,
    turns_per_s: f64,
    /// Gateway accepted (200 received) → Twilio received, minus runner time.
    overhead: Percentiles,
    /// Request sent → Twilio received, minus runner time (includes ingest).
    overhead_from_sent: Percentiles,
    /// Accepted in the window but no reply seen by the end of the drain.
    unanswered: u64,
    cpu: Cpu,
    /// VmHWM of each worker process, MB.
    peak_rss_mb: std::collections::BTreeMap<String, f64>,
    memory: MemoryPeaks,
    knobs: Knobs,
    gateway: LoadStats,
    runner: RunnerStats,
    twilio: TwilioStats,
    throughput_per_s: Vec<f64>,
    #[serde(skip)]
    overhead_us: Vec<u64>,
}

enum Mode {
    Closed { senders: usize },
    Open { senders: usize, rate: f64 },
}

struct Spec {
    id: u8,
    name: &'static str,
    mode: Mode,
    runner_delay: Duration,
    warmup: Duration,
    duration: Duration,
    knobs: Knobs,
    /// Dispatch's runtime and agent concurrency, when they differ from the others'.
    dispatch_concurrency: Option<usize>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = now_us();
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| repo_dir().join("bench-results"))
        .join(&stamp);
    std::fs::create_dir_all(&out)?;
    println!("bench: results in {}", out.display());

    let stack = {
        let (n, np, pp) = (args.stack_name.clone(), args.nats_port, args.pg_port);
        tokio::task::spawn_blocking(move || Stack::up(&n, np, pp, false)).await??
    };
    println!(
        "bench: stack '{}' up ({}, Postgres with fsync on)",
        stack.name, stack.nats_url
    );
    let result = run_all(&args, &stack, &out).await;
    if !args.keep_stack {
        stack.down();
    }
    let failed = result?;
    if failed {
        std::process::exit(2);
    }
    Ok(())
}

fn knobs(args: &Args) -> Knobs {
    Knobs {
        batch: args.batch,
        concurrency: args.concurrency,
        agent_concurrency: args.agent_concurrency,
        dispatch_concurrency: args.concurrency,
        partitions: args.partitions,
        db_pool_size: args.db_pool,
        ..Knobs::default()
    }
}

/// Runs the scenarios; returns whether a run failed outright (not whether targets were met).
async fn run_all(args: &Args, stack: &Stack, out: &Path) -> anyhow::Result<bool> {
    let mut results: Vec<ScenarioResult> = Vec::new();
    let mut floor_result: Option<FloorResult> = None;
    let warmup = Duration::from_secs(args.warmup);

    if args.scenarios.contains(&1) {
        let spec = Spec {
            id: 1,
            name: "max throughput (instant runner, closed loop)",
            mode: Mode::Closed {
                senders: args.senders,
            },
            runner_delay: Duration::ZERO,
            warmup,
            duration: Duration::from_secs(args.max_duration),
            knobs: knobs(args),
            dispatch_concurrency: None,
        };
        results.push(run_scenario(stack, &spec, args, out).await?);
        if args.floor_duration > 0 {
            floor_result = Some(run_floor(stack, args).await?);
        }
    }
    if args.scenarios.contains(&2) {
        let rate = args.half_rate.unwrap_or_else(|| {
            results
                .iter()
                .find(|r| r.id == 1)
                .map(|r| (r.turns_per_s / 2.0).max(1.0))
                .unwrap_or(1000.0)
        });
        let spec = Spec {
            id: 2,
            name: "half load (open loop): overhead",
            mode: Mode::Open {
                senders: args.half_senders,
                rate,
            },
            runner_delay: Duration::ZERO,
            warmup,
            duration: Duration::from_secs(args.half_duration),
            knobs: knobs(args),
            dispatch_concurrency: None,
        };
        results.push(run_scenario(stack, &spec, args, out).await?);
    }
    if args.scenarios.contains(&3) {
        let runner = Duration::from_millis(args.slow_runner_ms);
        let in_flight = args.sessions + args.sessions / 5;
        let spec = Spec {
            id: 3,
            name: "sessions in flight, slow runner (closed loop)",
            mode: Mode::Closed {
                senders: args.sessions,
            },
            runner_delay: runner,
            // Ramp-up: every session's first turn has to go through the runner once.
            warmup: runner + Duration::from_secs(10),
            duration: Duration::from_secs(args.sessions_duration),
            knobs: Knobs {
                runner_timeout_s: runner.as_secs() + 30,
                dispatch_concurrency: in_flight,
                agent_concurrency: in_flight,
                max_ack_pending: (in_flight as i64 * 2).max(20_000),
                ..knobs(args)
            },
            dispatch_concurrency: None,
        };
        results.push(run_scenario(stack, &spec, args, out).await?);
    }

    // Report.
    let mut lines = Vec::new();
    let mut targets = Vec::new();
    let mut target = |name: String, met: bool, value: String| {
        targets.push(serde_json::json!({"target": name, "met": met, "value": value}));
        lines.push(format!(
            "  [{}] {name}: {value}",
            if met { "met" } else { "MISSED" }
        ));
    };
    println!();
    println!("==== results ====");
    for r in &results {
        println!(
            "scenario {} - {}: {:.0} turns/s over {:.0} s ({} turns); overhead p50 {:.2} ms p95 {:.2} ms p99 {:.2} ms (n={}); unanswered {}",
            r.id,
            r.name,
            r.turns_per_s,
            r.window_s,
            r.turns_in_window,
            r.overhead.p50_ms,
            r.overhead.p95_ms,
            r.overhead.p99_ms,
            r.overhead.count,
            r.unanswered
        );
        println!(
            "    CPU per turn: workers {:.3} ms, + NATS + Postgres {:.3} ms, harness {:.3} ms; workers {:?}",
            r.cpu.workers_ms_per_turn,
            r.cpu.stack_ms_per_turn,
            r.cpu.harness_ms_per_turn,
            r.cpu
                .workers
                .iter()
                .map(|(k, v)| format!("{k} {v:.1}s"))
                .collect::<Vec<_>>()
        );
        println!(
            "    CPU seconds in window: workers {:.1}, NATS {:.1}, Postgres {:.1}, harness {:.1} (of {:.0} available on {} cores)",
            r.cpu.workers_total_s,
            r.cpu.nats_s,
            r.cpu.postgres_s,
            r.cpu.harness_s,
            r.window_s * cores() as f64,
            cores()
        );
        println!(
            "    peak RSS (VmHWM) MB: {:?}",
            r.peak_rss_mb
                .iter()
                .map(|(k, v)| format!("{k} {v:.0}"))
                .collect::<Vec<_>>()
        );
        println!(
            "    whole stack peak (workers RSS + NATS RSS + Postgres PSS): {:.0} MB (workers {:.0}, NATS {:.0}, Postgres {:.0}); harness {:.0} MB",
            r.memory.stack_mb,
            r.memory.workers_mb,
            r.memory.nats_mb,
            r.memory.postgres_mb,
            r.memory.harness_mb
        );
        println!(
            "    gateway: {} accepted, {} non-200, {} errors; runner overlaps {} order violations {}; Twilio doubles {} order violations {}",
            r.gateway.accepted,
            r.gateway.rejected,
            r.gateway.errors,
            r.runner.overlaps,
            r.runner.order_violations,
            r.twilio.doubles,
            r.twilio.order_violations
        );
        match r.id {
            1 => {
                target(
                    "scenario 1: >= 2,000 turns/s".into(),
                    r.turns_per_s >= 2000.0,
                    format!("{:.0} turns/s", r.turns_per_s),
                );
                if let Some(f) = &floor_result {
                    let ratio = r.turns_per_s / f.turns_per_s.max(1e-9);
                    println!(
                        "    floor: {:.0} turns/s ({}); pipeline / floor = {:.1}%",
                        f.turns_per_s,
                        f.per_turn,
                        ratio * 100.0
                    );
                    println!(
                        "    floor CPU per turn: floor process {:.3} ms, + NATS + Postgres {:.3} ms",
                        f.cpu_ms_per_turn, f.cpu_ms_per_turn_with_stack
                    );
                    target(
                        "scenario 1: >= 50% of the floor".into(),
                        ratio >= 0.5,
                        format!(
                            "{:.1}% ({:.0} / {:.0} turns/s)",
                            ratio * 100.0,
                            r.turns_per_s,
                            f.turns_per_s
                        ),
                    );
                }
            }
            2 => {
                target(
                    "scenario 2: overhead p50 <= 3 ms".into(),
                    r.overhead.count > 0 && r.overhead.p50_ms <= 3.0,
                    format!("{:.2} ms", r.overhead.p50_ms),
                );
                target(
                    "scenario 2: overhead p99 <= 15 ms".into(),
                    r.overhead.count > 0 && r.overhead.p99_ms <= 15.0,
                    format!("{:.2} ms", r.overhead.p99_ms),
                );
            }
            3 => {
                target(
                    "scenario 3: >= 950 turns/s with a 10 s runner".into(),
                    r.turns_per_s >= 950.0,
                    format!("{:.0} turns/s", r.turns_per_s),
                );
                target(
                    "scenario 3: whole-stack RSS <= 500 MB".into(),
                    r.memory.stack_mb <= 500.0,
                    format!("{:.0} MB", r.memory.stack_mb),
                );
            }
            _ => {}
        }
    }
    println!();
    println!("targets (2-core machine):");
    for l in &lines {
        println!("{l}");
    }

    let json = serde_json::json!({
        "machine": {"cores": cores()},
        "scenarios": results,
        "floor": floor_result,
        "targets": targets,
    });
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    let series: Vec<PlotSeries> = results
        .iter()
        .map(|r| PlotSeries {
            name: format!("scenario {}: {}", r.id, r.name),
            throughput: r
                .throughput_per_s
                .iter()
                .enumerate()
                .map(|(i, v)| (i as f64, *v))
                .collect(),
            overhead_us: if r.id == 3 {
                Vec::new()
            } else {
                r.overhead_us.clone()
            },
        })
        .collect();
    if !series.is_empty() {
        report::plot(&out.join("bench.png"), "Switchboard bench", &series)?;
    }
    println!(
        "\nwrote {} and {}",
        out.join("results.json").display(),
        out.join("bench.png").display()
    );
    Ok(false)
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
) -> anyhow::Result<ScenarioResult> {
    println!("\n---- scenario {}: {} ----", spec.id, spec.name);
    let dir = out.join(format!("scenario-{}", spec.id));
    let runner = LoadRunner::start(spec.runner_delay).await;
    runner.record_timing(true);
    let twilio = LoadTwilio::start(pipeline::ACCOUNT_SID, pipeline::AUTH_TOKEN).await;
    let run = format!("bench{}x", spec.id);
    let config = pipeline::config_for_run(stack, &run, &runner.url, &twilio, &spec.knobs).await?;
    // Dispatch starts last: its topology settings (max_ack_pending follows runtime.concurrency)
    // are the ones that stay.
    let order = [
        "gateway", "identify", "session", "log", "deliver", "dispatch",
    ];
    let dispatch_concurrency = spec.dispatch_concurrency;
    let pipeline = Pipeline::start(&dir, config, &order, |name, c| {
        if name == "dispatch"
            && let Some(n) = dispatch_concurrency
        {
            c.runtime.concurrency = n;
            for a in &mut c.agents {
                a.concurrency = n;
            }
        }
    })
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

    let load = LoadGen::new(pipeline.gateway.clone(), twilio.clone(), args.max_posts)
        .with_retry_for(Duration::from_secs(10));
    let start = Instant::now();
    let start_us = now_us();
    let until = start + spec.warmup + spec.duration;
    let (load_desc, offered) = match spec.mode {
        Mode::Closed { senders } => (format!("closed loop, {senders} senders"), None),
        Mode::Open { senders, rate } => (
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
            Mode::Closed { senders } => tokio::spawn(async move {
                load.closed_loop(senders, until, reply_wait).await;
            }),
            Mode::Open { senders, rate } => tokio::spawn(async move {
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

    // Let the replies of messages accepted in the window arrive (for the overhead numbers).
    let drain_until = Instant::now() + spec.runner_delay + Duration::from_secs(15);
    let accepted = load.accepted();
    let in_window: Vec<_> = accepted
        .iter()
        .filter(|a| a.accepted_us >= warm_us && a.accepted_us < end_us)
        .collect();
    while Instant::now() < drain_until {
        if in_window.iter().all(|a| {
            !twilio
                .arrivals_of(&message_text(a.sender, a.index))
                .is_empty()
        }) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    load_task.abort();

    let mut overhead_us = Vec::new();
    let mut from_sent_us = Vec::new();
    let mut unanswered = 0;
    for a in &in_window {
        let text = message_text(a.sender, a.index);
        let Some(arrived) = twilio.arrivals_of(&text).first().copied() else {
            unanswered += 1;
            continue;
        };
        let runner_us = runner.time_of(&text).unwrap_or(0);
        overhead_us.push(
            arrived
                .saturating_sub(a.accepted_us)
                .saturating_sub(runner_us),
        );
        from_sent_us.push(arrived.saturating_sub(a.sent_us).saturating_sub(runner_us));
    }
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
    let result = ScenarioResult {
        id: spec.id,
        name: spec.name.into(),
        load: load_desc,
        runner_delay_ms: spec.runner_delay.as_millis() as u64,
        warmup_s: spec.warmup.as_secs(),
        window_s,
        offered_rate: offered,
        accepted_in_window: in_window.len() as u64,
        turns_in_window,
        turns_per_s: turns_in_window as f64 / window_s.max(1e-9),
        overhead: report::percentiles(&overhead_us),
        overhead_from_sent: report::percentiles(&from_sent_us),
        unanswered,
        cpu,
        peak_rss_mb,
        memory,
        knobs: spec.knobs.clone(),
        gateway: load.stats(),
        runner: runner.stats(),
        twilio: twilio.stats(),
        throughput_per_s: report::per_second(&arrivals, start_us, end_us)
            .into_iter()
            .map(|(_, v)| v)
            .collect(),
        overhead_us,
    };
    pipeline.stop().await;
    println!(
        "scenario {}: {:.0} turns/s, overhead p50 {:.2} ms p99 {:.2} ms, workers CPU {:.3} ms/turn, stack peak {:.0} MB",
        result.id,
        result.turns_per_s,
        result.overhead.p50_ms,
        result.overhead.p99_ms,
        result.cpu.workers_ms_per_turn,
        result.memory.stack_mb
    );
    Ok(result)
}

/// The floor with scenario 1's sessions and knobs.
async fn run_floor(stack: &Stack, args: &Args) -> anyhow::Result<FloorResult> {
    println!("\n---- floor: the same durable I/O per turn, no logic ----");
    let database_url = stack.fresh_database("floor").await?;
    let opts = FloorOptions {
        nats_url: stack.nats_url.clone(),
        database_url,
        prefix: format!("floor{}", &uuid::Uuid::new_v4().simple().to_string()[..6]),
        sessions: args.senders,
        duration: Duration::from_secs(args.floor_duration),
        warmup: Duration::from_secs(args.warmup),
        batch: args.batch,
        concurrency: args.concurrency,
        pool: 64,
        nats_pid: stack.nats_pid(),
        postgres_pid: stack.postgres_pid(),
    };
    let bar = ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(200));
    let b = bar.clone();
    let result = floor::run(&opts, move |n| b.set_message(format!("floor: {n} turns"))).await?;
    bar.finish_and_clear();
    println!(
        "floor: {:.0} turns/s ({} turns in {:.0} s)",
        result.turns_per_s, result.turns, result.window_s
    );
    Ok(result)
}
