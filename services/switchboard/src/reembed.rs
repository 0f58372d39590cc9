//! `switchboard reembed`: give every logged message a vector under the configured embedding
//! model (after a change of `[embedding] model`), in batches, with a progress bar. Resumable:
//! it embeds what has no vector under the model yet, so a run stopped half way goes on where it
//! stopped; the old model's vectors are left as they are (readers keep using them until the new
//! ones are complete).
use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use switchboard_kit::Config;

pub async fn run(config: Config, batch: Option<usize>, json: bool) -> anyhow::Result<()> {
    let db = switchboard_kit::db::connect(&config.database_url, 2).await?;
    let embedder = switchboard_embed::load_embedder(&config.embedding)
        .await
        .context("the configured embedder")?;
    let model = embedder.model().to_string();
    // Marked for this model first: what is left is then read off the marks' partial index.
    switchboard_memory::index::ensure_marks(&db, &model)
        .await
        .context("marking the messages for the model")?;
    let batch = batch.unwrap_or(config.embedding.batch).max(1);
    let missing = switchboard_embed::missing(&db, &model).await?;
    let bar = ProgressBar::new(missing.max(0) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {pos}/{len} messages, {per_sec}, {eta} left",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_message(format!("embedding under {model}"));
    let mut done = 0u64;
    loop {
        let n = switchboard_embed::reembed_step(&db, embedder.as_ref(), batch * 4, batch)
            .await
            .with_context(|| format!("after {done} messages (run again to go on)"))?;
        if n == 0 {
            break;
        }
        done += n as u64;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    // Another model's worker starting meanwhile marks the messages for its model again; the
    // steps then find nothing more to do. Say so rather than claim it is complete.
    let left = switchboard_embed::missing(&db, &model).await?;
    if left > 0 {
        anyhow::bail!(
            "{done} messages embedded under {model}, {left} still have no vector under it (an \
             embedding worker of another model started meanwhile?): run again"
        );
    }
    // Built (again) over the model's vectors once they are all there: its lists are learnt
    // from them.
    switchboard_embed::keep_index(&db, &model, embedder.dimensions())
        .await
        .context("building the model's vector index")?;
    if json {
        println!(
            "{}",
            serde_json::json!({"embedded": done, "model": model, "missing": 0})
        );
    } else {
        println!("{done} messages embedded under {model}; every message has a vector under it");
    }
    Ok(())
}
