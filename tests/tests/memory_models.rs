//! The model clients the memory workers use, against a fake OpenAI-compatible server: a good
//! answer is taken, every bad one is refused with its reason (so a summary is never replaced
//! by it), and embeddings come back normalised and in the texts' order.
use std::time::Duration;

use switchboard_e2e::{FakeAnswer, FakeModel};
use switchboard_kit::config::Secret;
use switchboard_kit::memory_config::{EmbeddingConfig, LlmConfig};
use switchboard_memory::{ChatError, ChatModel, EmbedError};

fn llm(fake: &FakeModel) -> LlmConfig {
    LlmConfig {
        base_url: fake.url.clone(),
        model: "fake-chat".into(),
        api_key: Secret::new("sk-test"),
        timeout_s: 1,
        max_tokens: 100,
        max_prompt_chars: 1_000,
    }
}

#[tokio::test]
async fn a_good_answer_is_taken_and_every_bad_one_is_refused_with_its_reason() {
    let fake = FakeModel::start(8).await;
    let model = ChatModel::from_config(&llm(&fake)).expect("configured");
    fake.answer_with(|c| FakeAnswer::Text(format!("  heard: {}  ", c.user)));
    assert_eq!(
        model.complete("be brief", "hello").await.unwrap(),
        "heard: hello"
    );
    let call = fake.chats().pop().unwrap();
    assert_eq!(
        (call.model.as_str(), call.system.as_str()),
        ("fake-chat", "be brief")
    );
    assert_eq!(call.max_tokens, Some(100));

    fake.answer_with(|_| FakeAnswer::CutOff("half a sum".into()));
    assert!(matches!(
        model.complete("s", "u").await,
        Err(ChatError::OverBudget { .. })
    ));
    fake.answer_with(|_| FakeAnswer::Status(503));
    let busy = model.complete("s", "u").await.unwrap_err();
    assert!(matches!(busy, ChatError::Status { status: 503, .. }) && busy.is_transient());
    fake.answer_with(|_| FakeAnswer::Garbage);
    assert!(matches!(
        model.complete("s", "u").await,
        Err(ChatError::Malformed(_))
    ));
    fake.answer_with(|_| FakeAnswer::Text("   ".into()));
    assert!(matches!(
        model.complete("s", "u").await,
        Err(ChatError::Empty)
    ));
    fake.answer_with(|_| FakeAnswer::Hang(Duration::from_secs(5)));
    assert!(matches!(
        model.complete("s", "u").await,
        Err(ChatError::Timeout(_))
    ));
}

#[tokio::test]
async fn a_prompt_over_the_cap_keeps_its_latest_part() {
    let fake = FakeModel::start(8).await;
    let model = ChatModel::from_config(&llm(&fake)).expect("configured");
    let long = format!("{}THE END", "x".repeat(5_000));
    model.complete("system", &long).await.unwrap();
    let sent = fake.chats().pop().unwrap().user;
    assert!(
        sent.len() < 1_100 && sent.ends_with("THE END"),
        "{sent:.80}"
    );
    assert!(sent.starts_with("[… "), "{sent:.80}");
}

#[test]
fn no_model_configured_means_no_chat_model() {
    assert!(ChatModel::from_config(&LlmConfig::default()).is_none());
}

#[tokio::test]
async fn embeddings_come_back_normalised_in_order_and_a_wrong_size_is_refused() {
    let fake = FakeModel::start(16).await;
    let config = fake.embedding_config("fake-embed");
    let embedder = switchboard_memory::embed::from_config(&config).unwrap();
    let texts = vec![
        "when is my next shift".to_string(),
        "the fire alarm".to_string(),
    ];
    let vectors = embedder.embed(&texts).await.unwrap();
    assert_eq!(vectors.len(), 2);
    for (v, t) in vectors.iter().zip(&texts) {
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        let same = switchboard_memory::embed::cosine(v, &fake.vector_of(t));
        assert!(same > 0.99999, "{t}: {same}");
    }
    let wrong = EmbeddingConfig {
        dimensions: 384,
        ..config
    };
    let embedder = switchboard_memory::embed::from_config(&wrong).unwrap();
    assert!(matches!(
        embedder.embed(&texts).await,
        Err(EmbedError::Unusable(_))
    ));
}
