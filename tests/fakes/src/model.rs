//! An OpenAI-compatible model as a real HTTP server: `POST /v1/chat/completions` answered the
//! way each test says (text, an HTTP error, a hang, garbage, an answer cut off at the token
//! limit), and `POST /v1/embeddings` answered with deterministic bag-of-words vectors (texts
//! sharing words are near each other), so search and recall can be tested without a model.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use switchboard_kit::memory_config::{EmbeddingConfig, EmbeddingProvider};

/// One chat completion request the fake received.
#[derive(Debug, Clone)]
pub struct ChatCall {
    pub model: String,
    pub system: String,
    pub user: String,
    pub max_tokens: Option<u64>,
}

/// How the fake answers a chat completion.
#[derive(Debug, Clone)]
pub enum FakeAnswer {
    /// A completion with this text (`finish_reason: stop`).
    Text(String),
    /// A completion cut off at the token limit (`finish_reason: length`).
    CutOff(String),
    /// This HTTP status with a short error body.
    Status(u16),
    /// No answer for this long (past any sensible client timeout).
    Hang(Duration),
    /// 200 with a body that is not a chat completion.
    Garbage,
}

type Answerer = Arc<dyn Fn(&ChatCall) -> FakeAnswer + Send + Sync>;

#[derive(Clone)]
struct Shared {
    answer: Arc<Mutex<Answerer>>,
    chats: Arc<Mutex<Vec<ChatCall>>>,
    embedded: Arc<AtomicUsize>,
    /// How often each text was embedded.
    by_text: Arc<Mutex<std::collections::HashMap<String, usize>>>,
    dimensions: usize,
}

/// The fake model server. `url` is the `base_url` to configure (`…/v1`).
#[derive(Clone)]
pub struct FakeModel {
    pub url: String,
    shared: Shared,
}

impl FakeModel {
    /// A fake whose chat answers repeat the user message after `MODEL SUMMARY:` and whose
    /// embeddings have `dimensions` numbers.
    pub async fn start(dimensions: usize) -> Self {
        let shared = Shared {
            answer: Arc::new(Mutex::new(Arc::new(|c: &ChatCall| {
                FakeAnswer::Text(format!("MODEL SUMMARY:\n{}", c.user))
            }))),
            chats: Arc::default(),
            embedded: Arc::default(),
            by_text: Arc::default(),
            dimensions,
        };
        let router = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/embeddings", post(embeddings))
            .with_state(shared.clone());
        let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self { url, shared }
    }

    /// From now on, answer chat completions with `f`.
    pub fn answer_with(&self, f: impl Fn(&ChatCall) -> FakeAnswer + Send + Sync + 'static) {
        *self.shared.answer.lock().unwrap() = Arc::new(f);
    }

    /// Every chat completion request so far, in order.
    pub fn chats(&self) -> Vec<ChatCall> {
        self.shared.chats.lock().unwrap().clone()
    }

    /// How many texts were embedded so far.
    pub fn texts_embedded(&self) -> usize {
        self.shared.embedded.load(Ordering::SeqCst)
    }

    /// How many times `text` itself was embedded so far.
    pub fn times_embedded(&self, text: &str) -> usize {
        let counts = self.shared.by_text.lock().unwrap();
        counts.get(text).copied().unwrap_or(0)
    }

    /// The vector the fake gives `text` (for tests that compare).
    pub fn vector_of(&self, text: &str) -> Vec<f32> {
        bag_of_words(text, self.shared.dimensions)
    }

    /// `[embedding]` for this fake as the OpenAI-compatible provider, under `model`.
    pub fn embedding_config(&self, model: &str) -> EmbeddingConfig {
        EmbeddingConfig {
            provider: EmbeddingProvider::OpenAi,
            model: model.into(),
            dimensions: self.shared.dimensions,
            base_url: self.url.clone(),
            ..Default::default()
        }
    }
}

async fn chat(State(s): State<Shared>, Json(body): Json<Value>) -> Response {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let content = |role: &str| {
        messages
            .iter()
            .filter(|m| m["role"] == role)
            .filter_map(|m| m["content"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let call = ChatCall {
        model: body["model"].as_str().unwrap_or_default().to_string(),
        system: content("system"),
        user: content("user"),
        max_tokens: body["max_tokens"].as_u64(),
    };
    s.chats.lock().unwrap().push(call.clone());
    let answerer = s.answer.lock().unwrap().clone();
    let completion = |text: String, finish: &str| {
        Json(json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": call.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }))
        .into_response()
    };
    match answerer(&call) {
        FakeAnswer::Text(t) => completion(t, "stop"),
        FakeAnswer::CutOff(t) => completion(t, "length"),
        FakeAnswer::Status(code) => (
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Json(json!({"error": {"message": "fake failure", "type": "server_error"}})),
        )
            .into_response(),
        FakeAnswer::Hang(d) => {
            tokio::time::sleep(d).await;
            completion("too late".into(), "stop")
        }
        FakeAnswer::Garbage => (StatusCode::OK, "<html>not json</html>").into_response(),
    }
}

async fn embeddings(State(s): State<Shared>, Json(body): Json<Value>) -> Response {
    let inputs: Vec<String> = match &body["input"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(a) => a
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect(),
        _ => return (StatusCode::BAD_REQUEST, "input must be text").into_response(),
    };
    s.embedded.fetch_add(inputs.len(), Ordering::SeqCst);
    {
        let mut counts = s.by_text.lock().unwrap();
        for t in &inputs {
            *counts.entry(t.clone()).or_default() += 1;
        }
    }
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": bag_of_words(t, s.dimensions)}))
        .collect();
    Json(json!({"object": "list", "data": data, "model": body["model"]})).into_response()
}

/// Words (lowercased, a plural `s` dropped) hashed into `dimensions` signed buckets,
/// normalised: texts sharing words have a high cosine, others near zero.
pub fn bag_of_words(text: &str, dimensions: usize) -> Vec<f32> {
    let mut v = vec![0f32; dimensions.max(1)];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let w = word.to_lowercase();
        let w = w.strip_suffix('s').filter(|s| s.len() > 2).unwrap_or(&w);
        // FNV-1a: stable across runs and platforms.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in w.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let i = (h % v.len() as u64) as usize;
        v[i] += if (h >> 63) == 0 { 1.0 } else { -1.0 };
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}
