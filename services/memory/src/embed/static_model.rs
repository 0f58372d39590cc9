//! The static provider (`[embedding] provider = "static"`): a sentence's vector is the mean of
//! its tokens' rows in one embedding table, then length 1. No network runs, so a message costs
//! a tokenisation and a few hundred additions: ~100x less CPU than MiniLM on ONNX Runtime, at a
//! loss of quality that `docs/embedding-runtime.md` measures ("A static model").
//!
//! The folder `[embedding] static_dir` names holds `model.safetensors` (one 2-D tensor,
//! vocabulary x dimensions, F16 or F32) and `tokenizer.json`. The stack tool fetches
//! WordLlama's `l2_supercat_256` (MIT, carried by the `wordllama` wheel on PyPI) there; this
//! computes what `WordLlama.embed(texts, norm=True)` computes: ids without special tokens,
//! no truncation, ids past the table clamped to its last row, mean, L2-normalised.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use futures::FutureExt;
use futures::future::BoxFuture;
use switchboard_kit::memory_config::EmbeddingConfig;
use tokenizers::Tokenizer;

use super::{EmbedError, Embedder, normalise};

/// The files a static model's folder holds.
pub const STATIC_FILES: [&str; 2] = ["model.safetensors", "tokenizer.json"];

/// Texts per blocking task: a text takes microseconds, so one task per call is enough until a
/// call is large, and a large call should not hold a blocking thread for long.
const TEXTS_PER_TASK: usize = 4_096;

struct StaticModel {
    /// Row-major, `rows` x `dimensions`.
    table: Vec<f32>,
    rows: usize,
    dimensions: usize,
    tokenizer: Tokenizer,
}

pub struct StaticEmbedder {
    model: Arc<StaticModel>,
    id: String,
}

impl StaticEmbedder {
    /// The embedder for `[embedding]` with provider `static`: the table in `static_dir`,
    /// stored under the id `model`. Refused (`Unusable`) when a file is missing or unreadable,
    /// when the table's width is not `dimensions`, or when `model` still names the default
    /// MiniLM (its vectors would be mixed with another model's under one id).
    pub fn new(config: &EmbeddingConfig) -> Result<Self, EmbedError> {
        let dir = config.static_dir.trim();
        if dir.is_empty() {
            return Err(EmbedError::Unusable(
                "[embedding] provider = \"static\" needs static_dir, the folder with \
                 model.safetensors and tokenizer.json (`target/debug/stack env <name>` prints \
                 SB_EMBEDDING__STATIC_DIR for the copy `make run`/`make test` fetch)"
                    .into(),
            ));
        }
        if config.model == switchboard_kit::memory_config::DEFAULT_EMBEDDING_MODEL {
            return Err(EmbedError::Unusable(format!(
                "[embedding] provider = \"static\" makes other vectors than {}: set model to the \
                 static model's own id (e.g. \"{}\") and dimensions to its width",
                config.model,
                switchboard_kit::memory_config::STATIC_EMBEDDING_MODEL
            )));
        }
        let model = load_once(Path::new(dir))?;
        if model.dimensions != config.dimensions {
            return Err(EmbedError::Unusable(format!(
                "the table in {dir} makes vectors of {} dimensions, [embedding] dimensions = {}",
                model.dimensions, config.dimensions
            )));
        }
        Ok(Self {
            model,
            id: config.model.clone(),
        })
    }
}

impl Embedder for StaticEmbedder {
    fn model(&self) -> &str {
        &self.id
    }
    fn dimensions(&self) -> usize {
        self.model.dimensions
    }
    fn runtime(&self) -> &str {
        "static table"
    }
    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        // A short call is cheaper inline than a hop to the blocking pool.
        if texts.len() <= 16 {
            return futures::future::ready(self.model.embed_all(texts)).boxed();
        }
        let model = self.model.clone();
        let texts = texts.to_vec();
        async move {
            let mut out = Vec::with_capacity(texts.len());
            for chunk in texts.chunks(TEXTS_PER_TASK) {
                let model = model.clone();
                let chunk = chunk.to_vec();
                let vectors = tokio::task::spawn_blocking(move || model.embed_all(&chunk))
                    .await
                    .map_err(|e| EmbedError::Failed(format!("the embedding task failed: {e}")))??;
                out.extend(vectors);
            }
            Ok(out)
        }
        .boxed()
    }
}

fn load_once(dir: &Path) -> Result<Arc<StaticModel>, EmbedError> {
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, Arc<StaticModel>>>> = OnceLock::new();
    super::load_once(&LOADED, dir, "static_dir", StaticModel::load)
}

impl StaticModel {
    fn load(dir: &Path) -> Result<Self, EmbedError> {
        let unusable = |what: &str, e: &dyn std::fmt::Display| {
            EmbedError::Unusable(format!("{}: {what}: {e}", dir.display()))
        };
        for file in STATIC_FILES {
            if !dir.join(file).is_file() {
                return Err(EmbedError::Unusable(format!(
                    "{} has no {file} (a static model's folder holds {})",
                    dir.display(),
                    STATIC_FILES.join(", ")
                )));
            }
        }
        let tensors = candle_core::safetensors::load(
            dir.join("model.safetensors"),
            &candle_core::Device::Cpu,
        )
        .map_err(|e| unusable("model.safetensors", &e))?;
        let mut tensors = tensors.into_iter();
        let table = match (tensors.next(), tensors.next()) {
            (Some((_, table)), None) => table,
            _ => {
                return Err(unusable(
                    "model.safetensors",
                    &"a static model holds exactly one tensor (the token table)",
                ));
            }
        };
        let (rows, dimensions) = table
            .dims2()
            .map_err(|e| unusable("model.safetensors", &e))?;
        if rows == 0 || dimensions == 0 {
            return Err(unusable("model.safetensors", &"the token table is empty"));
        }
        let table = table
            .to_dtype(candle_core::DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| unusable("model.safetensors", &e))?;
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| unusable("tokenizer.json", &e))?;
        Ok(Self {
            table,
            rows,
            dimensions,
            tokenizer,
        })
    }

    fn embed_all(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        texts.iter().map(|t| self.embed_one(t)).collect()
    }

    fn embed_one(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| EmbedError::Failed(format!("static embedding: {e}")))?;
        let mut sum = vec![0f32; self.dimensions];
        let ids = encoding.get_ids();
        for &id in ids {
            let row = (id as usize).min(self.rows - 1) * self.dimensions;
            for (s, x) in sum.iter_mut().zip(&self.table[row..row + self.dimensions]) {
                *s += x;
            }
        }
        // An empty text has no tokens: its vector is zero (normalise keeps it so), as
        // WordLlama's mean over a mask clamped to 1 gives.
        let count = ids.len().max(1) as f32;
        sum.iter_mut().for_each(|s| *s /= count);
        normalise(&mut sum);
        Ok(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder with a 4-token table of width 2 and a word-level tokenizer.
    fn tiny_model(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let table = candle_core::Tensor::new(
            &[[1f32, 0.], [0., 1.], [3., 4.], [-1., 0.]],
            &candle_core::Device::Cpu,
        )
        .unwrap()
        .to_dtype(candle_core::DType::F16)
        .unwrap();
        candle_core::safetensors::save(
            &HashMap::from([("embedding.weight".to_string(), table)]),
            dir.join("model.safetensors"),
        )
        .unwrap();
        let tokenizer = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "c": 2, "far": 9}, "unk_token": "a"}
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    }

    fn config(dir: &Path, dimensions: usize) -> EmbeddingConfig {
        EmbeddingConfig {
            provider: switchboard_kit::memory_config::EmbeddingProvider::Static,
            model: "tiny-static".into(),
            dimensions,
            static_dir: dir.display().to_string(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_sentence_is_the_normalised_mean_of_its_tokens_rows() {
        let dir = std::env::temp_dir().join(format!("sb-static-{}", uuid::Uuid::new_v4()));
        tiny_model(&dir);
        let e = StaticEmbedder::new(&config(&dir, 2)).unwrap();
        let texts = [
            "a b".to_string(),
            "c".to_string(),
            "far".to_string(),
            String::new(),
        ];
        let v = e.embed(&texts).await.unwrap();
        let s = std::f32::consts::FRAC_1_SQRT_2;
        assert!(
            (v[0][0] - s).abs() < 1e-6 && (v[0][1] - s).abs() < 1e-6,
            "{:?}",
            v[0]
        );
        assert!(
            (v[1][0] - 0.6).abs() < 1e-3 && (v[1][1] - 0.8).abs() < 1e-3,
            "{:?}",
            v[1]
        );
        // An id past the table takes its last row.
        assert_eq!(v[2], vec![-1.0, 0.0]);
        assert_eq!(v[3], vec![0.0, 0.0]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_table_of_another_width_or_the_minilm_id_is_refused() {
        let dir = std::env::temp_dir().join(format!("sb-static-{}", uuid::Uuid::new_v4()));
        tiny_model(&dir);
        let wrong_width = StaticEmbedder::new(&config(&dir, 384)).err().unwrap();
        assert!(
            wrong_width.to_string().contains("2 dimensions"),
            "{wrong_width}"
        );
        let mut minilm = config(&dir, 2);
        minilm.model = switchboard_kit::memory_config::DEFAULT_EMBEDDING_MODEL.into();
        let refused = StaticEmbedder::new(&minilm).err().unwrap();
        assert!(refused.to_string().contains("own id"), "{refused}");
        let missing = StaticEmbedder::new(&config(&dir.join("nothing"), 2))
            .err()
            .unwrap();
        assert!(!missing.is_transient());
        std::fs::remove_dir_all(&dir).ok();
    }
}
