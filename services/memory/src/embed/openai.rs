//! An OpenAI-compatible embeddings endpoint: `POST {base_url}/embeddings` with
//! `{"model", "input": [texts]}`, answered with `{"data": [{"index", "embedding"}]}`.
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Deserialize;
use switchboard_kit::config::Secret;
use switchboard_kit::memory_config::EmbeddingConfig;

use super::{EmbedError, Embedder, normalise};

pub struct OpenAiEmbedder {
    http: reqwest::Client,
    url: String,
    api_key: Secret,
    model: String,
    dimensions: usize,
}

#[derive(Deserialize)]
struct Answer {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    index: usize,
    embedding: Vec<f32>,
}

impl OpenAiEmbedder {
    pub fn new(config: &EmbeddingConfig) -> Result<Self, EmbedError> {
        if config.base_url.trim().is_empty() {
            return Err(EmbedError::Unusable(
                "[embedding] provider = \"openai\" needs base_url".into(),
            ));
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.timeout_s.max(1)))
            .build()
            .map_err(|e| EmbedError::Unusable(e.to_string()))?;
        Ok(Self {
            http,
            url: format!("{}/embeddings", config.base_url.trim_end_matches('/')),
            api_key: config.api_key.clone(),
            model: config.model.clone(),
            dimensions: config.dimensions,
        })
    }

    async fn call(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let mut request = self
            .http
            .post(&self.url)
            .json(&serde_json::json!({"model": self.model, "input": texts}));
        if !self.api_key.is_empty() {
            request = request.bearer_auth(self.api_key.expose());
        }
        let response = request
            .send()
            .await
            .map_err(|e| EmbedError::Failed(e.without_url().to_string()))?;
        let status = response.status();
        if !status.is_success() {
            let body: String = response
                .text()
                .await
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect();
            let e = format!("HTTP {status}: {body}");
            return Err(match status.as_u16() {
                400 | 401 | 403 | 404 | 422 => EmbedError::Unusable(e),
                _ => EmbedError::Failed(e),
            });
        }
        let answer: Answer = response
            .json()
            .await
            .map_err(|e| EmbedError::Failed(format!("not an embeddings answer: {e}")))?;
        let mut out = vec![Vec::new(); texts.len()];
        for item in answer.data {
            if item.index >= texts.len() {
                return Err(EmbedError::Failed(format!(
                    "answer names input {} of {}",
                    item.index,
                    texts.len()
                )));
            }
            out[item.index] = item.embedding;
        }
        for v in &mut out {
            if v.len() != self.dimensions {
                return Err(EmbedError::Unusable(format!(
                    "model {} answered a vector of {} dimensions, [embedding] dimensions = {}",
                    self.model,
                    v.len(),
                    self.dimensions
                )));
            }
            normalise(v);
        }
        Ok(out)
    }
}

impl Embedder for OpenAiEmbedder {
    fn model(&self) -> &str {
        &self.model
    }
    fn dimensions(&self) -> usize {
        self.dimensions
    }
    fn runtime(&self) -> &str {
        "OpenAI-compatible /embeddings"
    }
    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        self.call(texts).boxed()
    }
}
