//! One embedder per configuration per process. The local model is ~90 MB of weights and takes
//! a moment to load; the embedding worker, categorisation, search and recall of one process
//! (`switchboard up` runs them all) share one copy instead of loading it each.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use switchboard_kit::memory_config::EmbeddingConfig;

use super::{EmbedError, Embedder, from_config};

type Cache = Mutex<HashMap<String, Arc<dyn Embedder>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// What makes two configurations the same embedder.
fn key(c: &EmbeddingConfig) -> String {
    format!(
        "{:?}\u{0}{}\u{0}{}\u{0}{}\u{0}{:?}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
        c.provider,
        c.model,
        c.dimensions,
        c.model_dir,
        c.runtime,
        c.onnx_runtime,
        c.onnx_model,
        c.threads,
        c.static_dir,
        c.base_url,
        c.api_key.expose(),
        c.timeout_s,
        c.batch
    )
}

/// The embedder `config` describes, loaded once per process (off the async threads: loading
/// the local model reads and checks its files). A failure is not kept: the next call tries
/// again, so model files that appear later are picked up.
pub async fn shared(config: &EmbeddingConfig) -> Result<Arc<dyn Embedder>, EmbedError> {
    let key = key(config);
    if let Some(e) = cache().lock().unwrap().get(&key) {
        return Ok(e.clone());
    }
    let owned = config.clone();
    let loaded = tokio::task::spawn_blocking(move || from_config(&owned))
        .await
        .map_err(|e| EmbedError::Failed(format!("loading the embedder stopped: {e}")))??;
    // Two callers may have loaded it at once: the first one stored is the one everyone uses.
    Ok(cache().lock().unwrap().entry(key).or_insert(loaded).clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_kit::memory_config::EmbeddingProvider;

    fn openai(base_url: &str) -> EmbeddingConfig {
        EmbeddingConfig {
            provider: EmbeddingProvider::OpenAi,
            model: "m".into(),
            dimensions: 8,
            base_url: base_url.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn the_same_configuration_is_one_embedder_and_another_is_another() {
        let a = shared(&openai("http://127.0.0.1:9/v1")).await.unwrap();
        let b = shared(&openai("http://127.0.0.1:9/v1")).await.unwrap();
        let c = shared(&openai("http://127.0.0.1:10/v1")).await.unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
    }
}
