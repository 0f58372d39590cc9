//! `make chaos`: 20,000 turns across 2,000 sessions (25% writing by Twilio, 12.5% each by
//! TextMagic, chat, the API, Telegram, Slack and WhatsApp) while worker processes are
//! SIGKILLed every 2 s on a seeded schedule (every kind at least twice; restarted at once), and
//! NATS and Postgres are each SIGKILLed once and come back by crash recovery; a quarter of the
//! SMS, chat and API people talk to an agent with `queue_mode = "collect"`, and the runner goes
//! down for 20 s mid-load (503, then connections refused). Then every accepted message is
//! accounted for; exits non-zero on any finding (see `switchboard_load::chaos_check`).
//! Report, evidence and worker logs go to `bench-results/chaos-<timestamp>/`.
use std::time::Duration;

use clap::Parser;
use switchboard_load::chaos::{self, ChaosOptions};
use switchboard_load::chaos_check;
use switchboard_load::stack::repo_dir;

#[derive(Parser, Debug)]
#[command(
    name = "chaos",
    about = "Switchboard under worker kills and server restarts"
)]
struct Args {
    #[arg(long, default_value_t = 2_000)]
    sessions: usize,
    #[arg(long, default_value_t = 10)]
    per_session: u32,
    /// Messages per second offered to the gateway.
    #[arg(long, default_value_t = 400.0)]
    rate: f64,
    /// Senders whose messages interleave (one sender's messages come group/rate s apart).
    #[arg(long, default_value_t = 50)]
    group: usize,
    /// Seed of the kill schedule (default: random; printed, so a run can be repeated).
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds between SIGKILLs.
    #[arg(long, default_value_t = 2.0)]
    kill_every: f64,
    /// Second of the run at which NATS is SIGKILLed (negative: never).
    #[arg(long, default_value_t = 15.0, allow_hyphen_values = true)]
    crash_nats_at: f64,
    /// Second of the run at which Postgres is SIGKILLed (negative: never).
    #[arg(long, default_value_t = 32.0, allow_hyphen_values = true)]
    crash_pg_at: f64,
    /// Second of the run at which the runner goes down (negative: never).
    #[arg(long, default_value_t = 18.0, allow_hyphen_values = true)]
    runner_down_at: f64,
    /// Seconds the runner stays down (the first --runner-503-for of them answering 503, the
    /// rest refusing connections).
    #[arg(long, default_value_t = 20.0)]
    runner_down_for: f64,
    #[arg(long, default_value_t = 3.0)]
    runner_503_for: f64,
    /// Runner latency, ms.
    #[arg(long, default_value_t = 20)]
    runner_ms: u64,
    /// Dispatch replicas.
    #[arg(long, default_value_t = 2)]
    dispatchers: usize,
    /// Deliver replicas.
    #[arg(long, default_value_t = 2)]
    deliverers: usize,
    /// Seconds to wait for the last replies after the load.
    #[arg(long, default_value_t = 180)]
    drain: u64,
    /// NATS as a JetStream cluster of this many nodes (3: `make chaos CLUSTER=3`): streams at
    /// R3, and instead of --crash-nats-at, nodes SIGKILLed one at a time (the work stream's
    /// leader twice, a follower once) and started again.
    #[arg(long, default_value_t = 1)]
    cluster: usize,
    /// NATS fsyncs every JetStream write (`sync_interval: always`; `make chaos NATS_SYNC=always`).
    #[arg(long)]
    nats_sync_always: bool,
    /// A rolling upgrade instead of faults (`make upgrade-drill`): 60 msg/s over 600 people
    /// for 100 s while every worker is replaced in turn by SIGTERM; the load arguments and
    /// fault times above are not used.
    #[arg(long)]
    rolling_upgrade: bool,
    /// Run nothing: judge a recorded run's `chaos-evidence.json` again and print the verdict.
    #[arg(long, value_name = "EVIDENCE")]
    judge: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    if let Some(path) = &a.judge {
        let evidence: chaos_check::Evidence = serde_json::from_slice(&std::fs::read(path)?)
            .map_err(|e| {
                anyhow::anyhow!("{} is not a chaos run's evidence: {e}", path.display())
            })?;
        let verdict = chaos_check::judge(&evidence);
        let report = chaos::ChaosReport {
            accepted: evidence.accepted.len() as u64,
            kills: evidence.kills.clone(),
            crashes: evidence.crashes.clone(),
            verdict,
            ..Default::default()
        };
        report.print();
        return finish(&report);
    }
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
    let dir = repo_dir()
        .join("bench-results")
        .join(format!("chaos-{stamp}"));
    let at = |s: f64| (s >= 0.0).then(|| Duration::from_secs_f64(s));
    let mut o = ChaosOptions::full(dir.clone());
    o.sessions = a.sessions;
    o.per_session = a.per_session;
    o.rate = a.rate;
    o.group = a.group;
    if let Some(seed) = a.seed {
        o.seed = seed;
    }
    o.kill_every = Duration::from_secs_f64(a.kill_every);
    o.crash_nats_at = at(a.crash_nats_at);
    o.crash_pg_at = at(a.crash_pg_at);
    o.runner_delay = Duration::from_millis(a.runner_ms);
    o.runner_down_at = at(a.runner_down_at);
    o.runner_down_for = Duration::from_secs_f64(a.runner_down_for);
    o.runner_503_for = Duration::from_secs_f64(a.runner_503_for);
    o.drain_timeout = Duration::from_secs(a.drain);
    for (name, n) in &mut o.replicas {
        match *name {
            "dispatch" => *n = a.dispatchers,
            "deliver" => *n = a.deliverers,
            _ => {}
        }
    }
    let o = if a.rolling_upgrade {
        let mut r = ChaosOptions::rolling_upgrade(dir.clone());
        r.seed = o.seed;
        r.replicas = o.replicas;
        r
    } else {
        o
    };
    let mut o = o.on_cluster(a.cluster);
    o.nats_sync_always = a.nats_sync_always;
    if o.cluster > 1 {
        println!(
            "chaos: NATS is a cluster of {} nodes, streams at R{}; node kills at {:?}",
            o.cluster,
            o.cluster,
            o.node_kills
                .iter()
                .map(|k| format!("{:?} ({:?})", k.at, k.role))
                .collect::<Vec<_>>()
        );
    }
    let cluster = o.cluster;
    let workers: usize = o.replicas.iter().map(|(_, n)| n).sum();
    println!(
        "chaos: {} sessions x {} messages at {} msg/s ({} people talk to the collect agent); seed {} (repeat with --seed {}); {}; logs in {}",
        o.sessions,
        o.per_session,
        o.rate,
        (0..o.sessions).filter(|s| o.mix.collects(*s)).count(),
        o.seed,
        o.seed,
        if o.rolling {
            "a rolling upgrade: every worker replaced in turn by SIGTERM, no faults".to_string()
        } else {
            format!(
                "SIGKILL a worker every {}s; SIGKILL NATS at {:?}, Postgres at {:?}; runner down at {:?} for {:?}",
                a.kill_every, o.crash_nats_at, o.crash_pg_at, o.runner_down_at, o.runner_down_for
            )
        },
        dir.display()
    );
    let report = chaos::run(o).await?;
    report.print();
    println!("report: {}", dir.join("chaos-report.json").display());
    // A cluster run that killed fewer nodes than planned proved less than it says.
    let node_kills = report
        .crashes
        .iter()
        .filter(|c| c.server.starts_with("nats-"))
        .count();
    if cluster > 1 && node_kills < 3 {
        println!("chaos: FAILED: {node_kills} NATS node kills, 3 planned");
        std::process::exit(1);
    }
    // A rolling upgrade replaces every worker, each by its own drain.
    if a.rolling_upgrade {
        let unclean: Vec<_> = report.replacements.iter().filter(|r| !r.clean).collect();
        if report.replacements.len() < workers || !unclean.is_empty() {
            println!(
                "chaos: FAILED: {} workers replaced, {} of them not drained within the grace",
                report.replacements.len(),
                unclean.len()
            );
            std::process::exit(1);
        }
    }
    finish(&report)
}

fn finish(report: &chaos::ChaosReport) -> anyhow::Result<()> {
    let failures = report.failures();
    if failures.is_empty() {
        println!("chaos: PASSED (nothing lost or doubled on any channel, in order, no overlap)");
        Ok(())
    } else {
        println!("chaos: FAILED: {}", failures.join("; "));
        std::process::exit(1);
    }
}
