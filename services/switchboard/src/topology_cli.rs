//! `switchboard stages` and `switchboard streams apply|prune`: the data path as this
//! configuration runs it (each stage, what it reads and the knobs it runs with), and the
//! streams and consumers made to match it. `--json` for scripts.
use clap::Subcommand;
use serde::Serialize;
use switchboard::stages;
use switchboard_kit::startup::App;
use switchboard_kit::{Config, StageOptions, Topology};

#[derive(Subcommand)]
pub enum StreamsCommand {
    /// Create or update every stream and consumer (idempotent).
    Apply {
        /// `{"streams": [...]}`.
        #[arg(long)]
        json: bool,
    },
    /// Delete durable consumers of the work stream that belong to no stage (a stage renamed or
    /// removed): the work stream keeps every message such a consumer reads. Run it once no
    /// process of the old version runs.
    Prune {
        /// `{"stream", "deleted": [...]}`.
        #[arg(long)]
        json: bool,
    },
}

/// A stage as `stages` lists it.
#[derive(Serialize)]
struct StageRow {
    stage: &'static str,
    worker: &'static str,
    stream: String,
    reads: String,
    concurrency: usize,
    batch: usize,
    max_deliver: u64,
    max_wait_s: u64,
    linger_ms: u128,
}

pub fn list_stages(config: &Config, json: bool) -> anyhow::Result<()> {
    switchboard_kit::startup::check_overrides(config, stages::ALL)?;
    let topology = Topology::new(&config.subject_prefix, config.runtime.turn_partitions);
    let rows: Vec<StageRow> = stages::ALL
        .iter()
        .map(|r| {
            let o = StageOptions::resolve(&r.spec, &config.runtime, config.stages.get(r.spec.name));
            StageRow {
                stage: r.spec.name,
                worker: r.worker,
                stream: topology.stream_of(r.spec.reads),
                reads: topology.filter_subject(r.spec.reads),
                concurrency: o.concurrency,
                batch: o.batch,
                max_deliver: o.max_deliver,
                max_wait_s: o.max_wait.as_secs(),
                linger_ms: o.linger.as_millis(),
            }
        })
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<14} {:<10} {:<12} {:<24} {:>5} {:>5} {:>8} {:>8} {:>9}",
        "stage", "worker", "stream", "reads", "conc", "batch", "deliver", "wait_s", "linger_ms"
    );
    for r in rows {
        println!(
            "{:<14} {:<10} {:<12} {:<24} {:>5} {:>5} {:>8} {:>8} {:>9}",
            r.stage,
            r.worker,
            r.stream,
            r.reads,
            r.concurrency,
            r.batch,
            r.max_deliver,
            r.max_wait_s,
            r.linger_ms
        );
    }
    Ok(())
}

pub async fn streams(config: Config, command: StreamsCommand) -> anyhow::Result<()> {
    let app = App::connect(config, "cli").await?;
    let specs: Vec<_> = stages::ALL.iter().map(|r| r.spec).collect();
    let t = &app.topology;
    match command {
        StreamsCommand::Apply { json } => {
            switchboard_kit::startup::check_overrides(&app.config, stages::ALL)?;
            t.apply(&app.js, &app.config.runtime, &specs).await?;
            let streams = [t.work_stream(), t.events_stream(), t.dlq_stream()];
            if json {
                println!("{}", serde_json::json!({ "streams": streams }));
            } else {
                println!("applied streams {} and their consumers", streams.join(", "));
            }
        }
        StreamsCommand::Prune { json } => {
            let pruned = t.prune(&app.js, &specs).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "stream": t.work_stream(), "deleted": pruned })
                );
                return Ok(());
            }
            if pruned.is_empty() {
                println!("no stray consumers on {}", t.work_stream());
            }
            for name in pruned {
                println!("deleted consumer {name} from {}", t.work_stream());
            }
        }
    }
    Ok(())
}
