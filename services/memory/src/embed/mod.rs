//! Embedding providers: text in, one L2-normalised vector per text out, under a model id that
//! is stored with every vector (`message_vectors.model`).
//!
//! - [`openai::OpenAiEmbedder`]: an OpenAI-compatible `POST {base_url}/embeddings`.
//! - all-MiniLM-L6-v2 in the process, offline (`[embedding] provider = "local"`, the default), on
//!   [`onnx::OnnxEmbedder`] (ONNX Runtime, the default runtime when the stack provides it) or
//!   [`local::LocalEmbedder`] (candle, the fallback): same model id, interchangeable vectors.
//! - [`static_model::StaticEmbedder`]: a static token table (`[embedding] provider = "static"`),
//!   its own model id and width.
use std::sync::Arc;

use futures::future::BoxFuture;
use switchboard_kit::memory_config::{EmbeddingConfig, EmbeddingProvider};

#[cfg(feature = "local-embedder")]
pub mod local;
#[cfg(feature = "local-embedder")]
pub mod onnx;
pub mod openai;
mod shared;
#[cfg(feature = "local-embedder")]
pub mod static_model;
#[cfg(feature = "local-embedder")]
mod tokenize;

pub use shared::shared;

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The provider cannot be used as configured (missing model files, wrong dimensions): no
    /// retry helps until the configuration changes.
    #[error("embedding provider is not usable: {0}")]
    Unusable(String),
    /// The provider failed this time (unreachable, busy, timed out): try again later.
    #[error("embedding failed: {0}")]
    Failed(String),
}

impl EmbedError {
    pub fn is_transient(&self) -> bool {
        matches!(self, EmbedError::Failed(_))
    }
}

/// A way of turning texts into vectors.
pub trait Embedder: Send + Sync {
    /// The model id stored with every vector, e.g. `all-MiniLM-L6-v2`.
    fn model(&self) -> &str;
    /// The length of every vector it returns.
    fn dimensions(&self) -> usize;
    /// What computes the vectors, for logs and status (e.g. `ONNX Runtime 1.31.1 (…)`).
    fn runtime(&self) -> &str {
        "unspecified"
    }
    /// One L2-normalised vector per text, in the texts' order.
    fn embed<'a>(&'a self, texts: &'a [String])
    -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>>;
}

/// The embedder `[embedding]` configures.
pub fn from_config(config: &EmbeddingConfig) -> Result<Arc<dyn Embedder>, EmbedError> {
    match config.provider {
        EmbeddingProvider::OpenAi => Ok(Arc::new(openai::OpenAiEmbedder::new(config)?)),
        #[cfg(feature = "local-embedder")]
        EmbeddingProvider::Local => local_embedder(config),
        #[cfg(not(feature = "local-embedder"))]
        EmbeddingProvider::Local => Err(EmbedError::Unusable(
            "this build has no local embedder (switchboard-memory without `local-embedder`)".into(),
        )),
        #[cfg(feature = "local-embedder")]
        EmbeddingProvider::Static => {
            let embedder = static_model::StaticEmbedder::new(config)?;
            tracing::info!(model = embedder.model(), "static embedder ready");
            Ok(Arc::new(embedder))
        }
        #[cfg(not(feature = "local-embedder"))]
        EmbeddingProvider::Static => Err(EmbedError::Unusable(
            "this build has no static embedder (switchboard-memory without `local-embedder`)"
                .into(),
        )),
    }
}

/// The local provider on the runtime `[embedding] runtime` asks for: ONNX Runtime when it is
/// configured and loads (`auto`, the default) and candle otherwise, saying which in the log.
#[cfg(feature = "local-embedder")]
fn local_embedder(config: &EmbeddingConfig) -> Result<Arc<dyn Embedder>, EmbedError> {
    use switchboard_kit::memory_config::LocalRuntime;
    let embedder: Arc<dyn Embedder> = match config.runtime {
        LocalRuntime::Onnx => Arc::new(onnx::OnnxEmbedder::new(config)?),
        LocalRuntime::Candle => Arc::new(local::LocalEmbedder::new(config)?),
        LocalRuntime::Auto
            if config.onnx_runtime.trim().is_empty() || config.onnx_model.trim().is_empty() =>
        {
            tracing::info!(
                "[embedding] onnx_runtime/onnx_model are not set: the local embedder runs on \
                 candle (about half ONNX Runtime's speed; `target/debug/stack env <name>` prints them)"
            );
            Arc::new(local::LocalEmbedder::new(config)?)
        }
        LocalRuntime::Auto => match onnx::OnnxEmbedder::new(config) {
            Ok(onnx) => Arc::new(onnx),
            Err(e) => {
                tracing::warn!("the local embedder falls back to candle: {e}");
                Arc::new(local::LocalEmbedder::new(config)?)
            }
        },
    };
    tracing::info!(
        model = embedder.model(),
        runtime = embedder.runtime(),
        "local embedder ready"
    );
    Ok(embedder)
}

/// The model a folder holds, loaded once per process and shared by every embedder made from
/// it (weights are megabytes: each stage of a process must not hold its own copy). The lock is
/// held while loading, so two stages starting together load it once. `setting` names the
/// configuration key in errors.
#[cfg(feature = "local-embedder")]
pub(crate) fn load_once<T>(
    loaded: &'static std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, Arc<T>>>,
    >,
    dir: &std::path::Path,
    setting: &str,
    load: impl FnOnce(&std::path::Path) -> Result<T, EmbedError>,
) -> Result<Arc<T>, EmbedError> {
    let key = dir.canonicalize().map_err(|e| {
        EmbedError::Unusable(format!("[embedding] {setting} {}: {e}", dir.display()))
    })?;
    let mut loaded = loaded
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(model) = loaded.get(&key) {
        return Ok(model.clone());
    }
    let model = Arc::new(load(&key)?);
    loaded.insert(key, model.clone());
    Ok(model)
}

/// `v` scaled to length 1 (a zero vector stays zero).
pub fn normalise(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Cosine similarity of two vectors of the same length.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

/// A vector in pgvector's text form (`[0.1,0.2,…]`), for binding as `$n::vector`.
pub fn pg_vector(v: &[f32]) -> String {
    let mut s = String::with_capacity(v.len() * 10 + 2);
    s.push('[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&x.to_string());
    }
    s.push(']');
    s
}
