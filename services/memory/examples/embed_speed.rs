//! Messages/s of the local embedder on a file of texts, one per line, at the batch sizes given,
//! on the runtime given (`onnx`: ONNX Runtime, the default's, from `SB_EMBEDDING__ONNX_RUNTIME`
//! and `SB_EMBEDDING__ONNX_MODEL`, `RAYON_NUM_THREADS` threads; `candle`); writes each run's
//! vectors (little-endian f32, row-major) to `<out_prefix>_b<batch>.f32` so they can be compared
//! with sentence-transformers'. `static` runs the static model (`[embedding] provider =
//! "static"`) from the folder given in place of `<model_dir>` (`SB_EMBEDDING__STATIC_DIR`). Used by `make bench` (tests/embed_bench/run.sh) and for
//! docs/embedding-runtime.md:
//!
//! ```text
//! RAYON_NUM_THREADS=2 target/release/examples/embed_speed onnx <model_dir> <texts.txt> <out_prefix> 1 16 64
//! ```
use std::io::Write;
use std::time::Instant;

use switchboard_kit::memory_config::{
    EmbeddingConfig, EmbeddingProvider, LocalRuntime, STATIC_EMBEDDING_DIMENSIONS,
    STATIC_EMBEDDING_MODEL,
};
use switchboard_memory::embed;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        return Err(
            "usage: embed_speed onnx|candle|static <model_dir> <texts.txt> <out_prefix> <batch>..."
                .into(),
        );
    }
    let (name, args) = (args[1].clone(), &args[1..]);
    let runtime = match name.as_str() {
        "onnx" => LocalRuntime::Onnx,
        "candle" | "static" => LocalRuntime::Candle,
        other => return Err(format!("unknown runtime {other:?}: onnx, candle or static").into()),
    };
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let texts: Vec<String> = std::fs::read_to_string(&args[2])?
        .lines()
        .map(|l| l.replace("\\n", "\n"))
        .collect();
    for batch in &args[4..] {
        let batch: usize = batch.parse()?;
        let mut config = EmbeddingConfig {
            model_dir: args[1].clone(),
            batch,
            runtime,
            onnx_runtime: var("SB_EMBEDDING__ONNX_RUNTIME"),
            onnx_model: var("SB_EMBEDDING__ONNX_MODEL"),
            threads: var("RAYON_NUM_THREADS").parse().unwrap_or(0),
            ..Default::default()
        };
        if name == "static" {
            config.provider = EmbeddingProvider::Static;
            config.model = STATIC_EMBEDDING_MODEL.into();
            config.dimensions = STATIC_EMBEDDING_DIMENSIONS;
            config.static_dir = args[1].clone();
        }
        let embedder = embed::from_config(&config)?;
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
        let n = texts.len() as f64;
        let round = |x: f64| (x * 10.0).round() / 10.0;
        println!(
            "{}",
            serde_json::json!({
                "runtime": name,
                "serving": embedder.runtime(),
                "model": embedder.model(),
                "batch": batch,
                "texts": texts.len(),
                "seconds": secs,
                "msgs_per_s": round(n / secs),
                "cpu_seconds": cpu,
                "msgs_per_cpu_s": round(n / cpu),
            })
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
