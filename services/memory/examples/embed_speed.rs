//! Messages/s of the local (candle) embedder on a file of texts, one per line, at the batch
//! sizes given; writes each run's vectors (little-endian f32, row-major) beside `--out` so they
//! can be compared with sentence-transformers'. Used for docs/embedding-runtime.md:
//!
//! ```text
//! RAYON_NUM_THREADS=2 target/release/examples/embed_speed <model_dir> <texts.txt> <out_prefix> 1 16 64
//! ```
use std::io::Write;
use std::time::Instant;

use switchboard_kit::memory_config::EmbeddingConfig;
use switchboard_memory::embed::{Embedder, local::LocalEmbedder};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        return Err("usage: embed_speed <model_dir> <texts.txt> <out_prefix> <batch>...".into());
    }
    let texts: Vec<String> = std::fs::read_to_string(&args[2])?
        .lines()
        .map(|l| l.replace("\\n", "\n"))
        .collect();
    for batch in &args[4..] {
        let batch: usize = batch.parse()?;
        let config = EmbeddingConfig {
            model_dir: args[1].clone(),
            batch,
            ..Default::default()
        };
        let embedder = LocalEmbedder::new(&config)?;
        // Warm-up: the first pass pays for page faults and allocations.
        embedder.embed(&texts[..texts.len().min(64)]).await?;
        let started = Instant::now();
        let cpu_started = cpu_seconds();
        // The worker hands the embedder one batch at a time, so the sort by length only
        // happens inside a batch: call it per batch as the worker does.
        let mut vectors = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(batch) {
            vectors.extend(embedder.embed(chunk).await?);
        }
        let secs = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu_started;
        println!(
            "{{\"runtime\": \"candle\", \"batch\": {batch}, \"texts\": {}, \"seconds\": {secs:.3}, \
             \"msgs_per_s\": {:.1}, \"cpu_seconds\": {cpu:.3}, \"msgs_per_cpu_s\": {:.1}}}",
            texts.len(),
            texts.len() as f64 / secs,
            texts.len() as f64 / cpu
        );
        let mut out = std::fs::File::create(format!("{}_b{batch}.f32", args[3]))?;
        for v in &vectors {
            for x in v {
                out.write_all(&x.to_le_bytes())?;
            }
        }
    }
    Ok(())
}

/// The process's user + system CPU time (/proc/self/stat, in clock ticks of 1/100 s on Linux):
/// on a shared machine messages per CPU-second compare runtimes more steadily than wall time.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces, so split after its ')').
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (tick(11) + tick(12)) / 100.0
}
