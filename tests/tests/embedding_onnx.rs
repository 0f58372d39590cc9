//! The local embedder's default runtime, ONNX Runtime: when the stack provides the library and
//! the graph, it is what serves, its vectors match the reference vectors computed independently
//! (`tests/fixtures/embedding/`) and candle's (the same model id, so they are interchangeable),
//! and a wrong library is refused with an error that says what is wrong, never a panic or a
//! hang; without ONNX Runtime the local embedder still works, on candle.
//!
//! Reads `SB_EMBEDDING__MODEL_DIR`, `SB_EMBEDDING__ONNX_RUNTIME` and `SB_EMBEDDING__ONNX_MODEL`,
//! which `stack up|env` (services/stack) prints (and `make test` exports).
use std::time::{Duration, Instant};

use switchboard_e2e::embedding_checks::reference;
use switchboard_e2e::{TestApp, spawn_app_configured};
use switchboard_kit::memory_config::{EmbeddingConfig, LocalRuntime};
use switchboard_memory::embed::{self, EmbedError, cosine};

const WAIT: Duration = Duration::from_secs(30);

fn stack_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run with `make test`, or export what `target/debug/stack env \
             test` prints (the stack fetches the model and ONNX Runtime)"
        )
    })
}

/// `[embedding]` as the stack's env sets it: the default provider and runtime choice.
fn stack_config() -> EmbeddingConfig {
    EmbeddingConfig {
        model_dir: stack_var("SB_EMBEDDING__MODEL_DIR"),
        onnx_runtime: stack_var("SB_EMBEDDING__ONNX_RUNTIME"),
        onnx_model: stack_var("SB_EMBEDDING__ONNX_MODEL"),
        ..Default::default()
    }
}

#[tokio::test]
async fn onnx_runtime_serves_by_default_and_matches_the_reference_vectors_and_candle() {
    let reference = reference("all-MiniLM-L6-v2.json");
    let config = stack_config();
    let onnx = embed::from_config(&config).expect("the default local embedder loads");
    assert!(
        onnx.runtime().starts_with("ONNX Runtime 1.31."),
        "the default runtime is ONNX Runtime 1.31, not {:?}",
        onnx.runtime()
    );
    assert_eq!(
        (onnx.model(), onnx.dimensions()),
        (reference.model.as_str(), 384)
    );
    // All at once: texts of very different lengths (an empty one, and one past the 256-token
    // cut among them) in one call.
    let got = onnx.embed(&reference.texts).await.expect("embedded");
    assert_eq!(got.len(), reference.texts.len());
    for ((text, want), got) in reference.texts.iter().zip(&reference.vectors).zip(&got) {
        let same = cosine(want, got);
        assert!(
            same >= 0.9999,
            "{text:.40?}: cosine {same} to the reference"
        );
    }
    // One at a time gives the same vectors as all at once.
    for (text, all_at_once) in reference.texts.iter().zip(&got) {
        let alone = &onnx.embed(std::slice::from_ref(text)).await.unwrap()[0];
        let same = cosine(alone, all_at_once);
        assert!(same >= 0.99999, "{text:.40?}: alone {same}");
    }
    // Interchangeable with candle's vectors under the same model id.
    let candle = embed::from_config(&EmbeddingConfig {
        runtime: LocalRuntime::Candle,
        ..config
    })
    .expect("candle loads");
    assert_eq!(candle.runtime(), "candle");
    assert_eq!(candle.model(), onnx.model());
    let theirs = candle.embed(&reference.texts).await.unwrap();
    for ((text, a), b) in reference.texts.iter().zip(&got).zip(&theirs) {
        let same = cosine(a, b);
        assert!(same >= 0.9999, "{text:.40?}: cosine {same} to candle's");
    }
}

fn unusable(result: Result<std::sync::Arc<dyn embed::Embedder>, EmbedError>) -> String {
    match result {
        Err(EmbedError::Unusable(why)) => why,
        Err(other) => panic!("refused, but as transient: {other}"),
        Ok(e) => panic!("loaded on {:?}", e.runtime()),
    }
}

#[tokio::test]
async fn a_wrong_onnx_runtime_library_is_refused_with_a_clear_error_and_auto_falls_back_to_candle()
{
    let stack = stack_config();
    let missing = "/nonexistent/libonnxruntime.so.1.31.1".to_string();
    // A real shared library that is not ONNX Runtime.
    let not_onnx = ["/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("libm")
        .to_string();
    let cases = [
        (missing.clone(), vec![missing.as_str(), "No such file"]),
        (
            not_onnx.clone(),
            vec![not_onnx.as_str(), "is not ONNX Runtime"],
        ),
        // Not a library at all: the graph file.
        (
            stack.onnx_model.clone(),
            vec![stack.onnx_model.as_str(), "cannot be loaded"],
        ),
    ];
    for (library, says) in cases {
        let onnx_only = EmbeddingConfig {
            runtime: LocalRuntime::Onnx,
            onnx_runtime: library.clone(),
            ..stack.clone()
        };
        let why = unusable(embed::from_config(&onnx_only));
        for part in says {
            assert!(why.contains(part), "{library}: {why:?} should say {part:?}");
        }
        // The default (auto) still embeds, on candle.
        let auto = EmbeddingConfig {
            onnx_runtime: library.clone(),
            ..stack.clone()
        };
        let embedder = embed::from_config(&auto).expect("auto falls back");
        assert_eq!(embedder.runtime(), "candle", "{library}");
        let v = &embedder.embed(&["hello".into()]).await.unwrap()[0];
        assert_eq!(v.len(), 384);
    }
    // A graph that is not a graph.
    let bad_graph = EmbeddingConfig {
        runtime: LocalRuntime::Onnx,
        onnx_model: format!("{}/tokenizer.json", stack.model_dir),
        ..stack.clone()
    };
    let why = unusable(embed::from_config(&bad_graph));
    assert!(why.contains("onnx_model"), "{why}");
    // Without ONNX Runtime configured, the local embedder runs on candle.
    let none = EmbeddingConfig {
        onnx_runtime: String::new(),
        onnx_model: String::new(),
        ..stack
    };
    assert_eq!(embed::from_config(&none).unwrap().runtime(), "candle");
}

/// Every message's text and stored vector, once each message has one.
async fn stored_vectors(app: &TestApp, messages: usize) -> Vec<(String, String, Vec<f32>)> {
    let deadline = Instant::now() + WAIT;
    loop {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT m.message, v.model, v.embedding::text
               FROM switchboard.messages m
               JOIN switchboard.message_vectors v ON v.message_id = m.id",
        )
        .fetch_all(&app.db)
        .await
        .unwrap();
        if rows.len() >= messages {
            return rows
                .into_iter()
                .map(|(text, model, v)| {
                    let v = v
                        .trim_matches(['[', ']'])
                        .split(',')
                        .map(|x| x.parse().expect("a vector component"))
                        .collect();
                    (text, model, v)
                })
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {messages} messages have a vector",
            rows.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn the_embedding_worker_on_onnx_runtime_gives_every_message_its_reference_vector() {
    let reference = reference("all-MiniLM-L6-v2.json");
    let config = EmbeddingConfig {
        // ONNX Runtime only: a failure to load it must not pass as candle here.
        runtime: LocalRuntime::Onnx,
        ..stack_config()
    };
    let in_app = config.clone();
    let app = spawn_app_configured(move |c| c.embedding = in_app).await;
    let texts = &reference.texts[..3];
    for (i, text) in texts.iter().enumerate() {
        let from = format!("+1415555072{i}");
        assert_eq!(app.send_sms(&from, text).await.status(), 200);
    }
    app.wait_for_sms(texts.len(), WAIT).await;
    // Each inbound message and the agent's answer to it.
    let stored = stored_vectors(&app, texts.len() * 2).await;
    for (text, want) in texts.iter().zip(&reference.vectors) {
        let (_, model, got) = stored
            .iter()
            .find(|(t, _, _)| t == text)
            .unwrap_or_else(|| panic!("{text:?} has a vector"));
        assert_eq!(model, "all-MiniLM-L6-v2");
        let same = cosine(want, got);
        assert!(same >= 0.9999, "{text:.40?}: stored vector's cosine {same}");
    }
    app.shutdown().await;
}
