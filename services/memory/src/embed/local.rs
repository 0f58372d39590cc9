//! The local provider: a BERT sentence-embedding model (all-MiniLM-L6-v2 by default) in the
//! process, offline, through candle, from the folder `[embedding] model_dir` names
//! (`model.safetensors`, `config.json`, `tokenizer.json`; `make run` and `make test` fetch it).
//!
//! It computes what sentence-transformers computes for this model (ARCHITECTURE §13): the
//! BERT encoder's last hidden states, averaged over the real tokens (the attention mask), then
//! L2-normalised. Inputs are cut at 256 tokens (the model's `max_seq_length`).
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use futures::FutureExt;
use futures::future::BoxFuture;
use switchboard_kit::memory_config::EmbeddingConfig;
use tokenizers::Tokenizer;

use super::{EmbedError, Embedder};

pub use super::tokenize::MAX_TOKENS;

/// The files a model folder must hold.
pub const MODEL_FILES: [&str; 3] = ["model.safetensors", "config.json", "tokenizer.json"];

/// A loaded model: the weights are ~90 MB, so each folder is loaded once per process and
/// shared by every embedder made from it.
struct Model {
    bert: BertModel,
    tokenizer: Tokenizer,
    hidden_size: usize,
}

pub struct LocalEmbedder {
    model: Arc<Model>,
    id: String,
    batch: usize,
}

impl LocalEmbedder {
    /// The embedder for `[embedding]` (provider `local`): the model in `model_dir`, stored under
    /// the id `model`. Refused (`Unusable`) when the folder lacks a file or the model's vector
    /// size is not `dimensions`.
    pub fn new(config: &EmbeddingConfig) -> Result<Self, EmbedError> {
        let dir = config.model_dir.trim();
        if dir.is_empty() {
            return Err(EmbedError::Unusable(
                "[embedding] provider = \"local\" needs model_dir, the folder with \
                 model.safetensors, config.json and tokenizer.json (`target/debug/stack env <name>` \
                 prints SB_EMBEDDING__MODEL_DIR for the copy `make run`/`make test` fetch)"
                    .into(),
            ));
        }
        let model = load_once(Path::new(dir))?;
        if model.hidden_size != config.dimensions {
            return Err(EmbedError::Unusable(format!(
                "the model in {dir} makes vectors of {} dimensions, [embedding] dimensions = {}",
                model.hidden_size, config.dimensions
            )));
        }
        Ok(Self {
            model,
            id: config.model.clone(),
            batch: config.batch.max(1),
        })
    }
}

impl Embedder for LocalEmbedder {
    fn model(&self) -> &str {
        &self.id
    }
    fn dimensions(&self) -> usize {
        self.model.hidden_size
    }
    fn runtime(&self) -> &str {
        "candle"
    }
    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        let model = self.model.clone();
        let texts = texts.to_vec();
        let batch = self.batch;
        // The forward passes are seconds of CPU for a large batch: off the async threads.
        async move {
            tokio::task::spawn_blocking(move || model.embed_all(&texts, batch))
                .await
                .map_err(|e| EmbedError::Failed(format!("the embedding task failed: {e}")))?
        }
        .boxed()
    }
}

fn load_once(dir: &Path) -> Result<Arc<Model>, EmbedError> {
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, Arc<Model>>>> = OnceLock::new();
    super::load_once(&LOADED, dir, "model_dir", Model::load)
}

impl Model {
    fn load(dir: &Path) -> Result<Self, EmbedError> {
        let unusable = |what: &str, e: &dyn std::fmt::Display| {
            EmbedError::Unusable(format!("{}: {what}: {e}", dir.display()))
        };
        for file in MODEL_FILES {
            if !dir.join(file).is_file() {
                return Err(EmbedError::Unusable(format!(
                    "{} has no {file} (a model folder holds {})",
                    dir.display(),
                    MODEL_FILES.join(", ")
                )));
            }
        }
        let config = std::fs::read_to_string(dir.join("config.json"))
            .map_err(|e| unusable("config.json", &e))?;
        let config: BertConfig =
            serde_json::from_str(&config).map_err(|e| unusable("config.json", &e))?;
        let device = Device::Cpu;
        let weights = candle_core::safetensors::load(dir.join("model.safetensors"), &device)
            .map_err(|e| unusable("model.safetensors", &e))?;
        let vb = VarBuilder::from_tensors(weights, DType::F32, &device);
        let bert = BertModel::load(vb, &config).map_err(|e| unusable("model.safetensors", &e))?;

        let tokenizer = super::tokenize::load(dir)?;
        Ok(Self {
            bert,
            tokenizer,
            hidden_size: config.hidden_size,
        })
    }

    /// One vector per text, in order, `batch` texts per forward pass. Texts of similar length
    /// go together (sorted first), so little of each pass is padding.
    fn embed_all(&self, texts: &[String], batch: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(batch) {
            let inputs: Vec<&str> = chunk.iter().map(|&i| texts[i].as_str()).collect();
            let vectors = self
                .forward(inputs)
                .map_err(|e| EmbedError::Failed(format!("local embedding: {e}")))?;
            for (&i, v) in chunk.iter().zip(vectors) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    fn forward(&self, texts: Vec<&str>) -> Result<Vec<Vec<f32>>, tokenizers::Error> {
        let encodings = self.tokenizer.encode_batch(texts, true)?;
        let n = encodings.len();
        let len = encodings.first().map_or(0, |e| e.len());
        let column = |f: fn(&tokenizers::Encoding) -> &[u32]| -> Vec<u32> {
            encodings
                .iter()
                .flat_map(|e| f(e).iter().copied())
                .collect()
        };
        let device = &self.bert.device;
        let ids = Tensor::from_vec(column(|e| e.get_ids()), (n, len), device)?;
        let type_ids = Tensor::from_vec(column(|e| e.get_type_ids()), (n, len), device)?;
        let mask = Tensor::from_vec(column(|e| e.get_attention_mask()), (n, len), device)?;
        let hidden = self.bert.forward(&ids, &type_ids, Some(&mask))?; // (n, len, hidden)
        // Mean over the real tokens only, then length 1.
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // (n, len, 1)
        let summed = hidden.broadcast_mul(&mask)?.sum(1)?; // (n, hidden)
        let counted = mask.sum(1)?; // (n, 1)
        let mean = summed.broadcast_div(&counted)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?;
        Ok(mean.broadcast_div(&norm)?.to_vec2::<f32>()?)
    }
}
