//! The static embedding model (`[embedding] provider = "static"`): WordLlama's l2_supercat_256
//! table, which the stack fetches out of the `wordllama` wheel. Its vectors are the ones the
//! `wordllama` package itself computes (`tests/fixtures/embedding/static_reference.py`), it
//! ranks a paraphrase first, and a product running on it stores its vectors under their own
//! model id and width (the worker makes the model's index) and recalls what a person said
//! before on the same matter.
//!
//! Reads `SB_EMBEDDING__STATIC_DIR`, which `stack up|env` (services/stack) prints (and
//! `make test` exports).
use std::time::{Duration, Instant};

use switchboard_e2e::embedding_checks::{
    SHIFT_PARAPHRASE, nearest_to_a_question_about_shifts, reference,
};
use switchboard_e2e::{TestApp, recall_block, spawn_app_configured, static_embedder_from};
use switchboard_kit::memory_config::{
    EmbeddingConfig, STATIC_EMBEDDING_DIMENSIONS, STATIC_EMBEDDING_MODEL,
};
use switchboard_memory::embed::{self, cosine};

const WAIT: Duration = Duration::from_secs(30);

fn static_config() -> EmbeddingConfig {
    let mut config = EmbeddingConfig::default();
    static_embedder_from(&mut config, |var| std::env::var(var).ok());
    assert!(
        !config.static_dir.is_empty(),
        "SB_EMBEDDING__STATIC_DIR is not set: run with `make test`, or export what \
         `target/debug/stack env test` prints (the stack fetches the static model)"
    );
    config
}

#[tokio::test]
async fn the_static_model_gives_the_vectors_wordllama_itself_computes() {
    let reference = reference("wordllama-l2-supercat-256.json");
    let embedder = embed::from_config(&static_config()).expect("the static model loads");
    assert_eq!(
        (embedder.model(), embedder.dimensions()),
        (reference.model.as_str(), STATIC_EMBEDDING_DIMENSIONS)
    );
    // All at once, then one at a time: the same vectors.
    let all = embedder.embed(&reference.texts).await.expect("embedded");
    for (i, (text, want)) in reference.texts.iter().zip(&reference.vectors).enumerate() {
        let alone = &embedder.embed(std::slice::from_ref(text)).await.unwrap()[0];
        for got in [&all[i], alone] {
            if text.is_empty() {
                // No tokens: the zero vector (WordLlama divides 0 by 0).
                assert!(got.iter().all(|x| *x == 0.0), "{got:?}");
                assert!(want.iter().all(|x| *x == 0.0));
            } else {
                let same = cosine(want, got);
                assert!(same >= 0.9999, "{text:.40?}: cosine {same} to wordllama's");
            }
        }
    }
}

#[tokio::test]
async fn the_static_model_ranks_a_paraphrase_above_unrelated_messages() {
    let embedder = embed::from_config(&static_config()).unwrap();
    let ranked = nearest_to_a_question_about_shifts(embedder.as_ref()).await;
    assert_eq!(ranked[0].1, SHIFT_PARAPHRASE, "{ranked:?}");
}

/// Every logged message has its vector; the (model, dimensions) of each.
async fn indexed(app: &TestApp, logged: i64) -> Vec<(String, i32)> {
    let deadline = Instant::now() + WAIT;
    loop {
        let messages: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.messages")
            .fetch_one(&app.db)
            .await
            .unwrap();
        let vectors: Vec<(String, i32)> =
            sqlx::query_as("SELECT model, dimensions FROM switchboard.message_vectors")
                .fetch_all(&app.db)
                .await
                .unwrap();
        if messages >= logged && vectors.len() as i64 == messages {
            return vectors;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {messages} messages indexed within {WAIT:?}",
            vectors.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_product_on_the_static_model_recalls_the_persons_earlier_message_on_the_same_matter() {
    let config = static_config();
    let app = spawn_app_configured(move |c| c.embedding = config).await;
    let phone = "+14155550391";
    app.text_answered(phone, "My March payslip is missing the overtime hours", 1)
        .await;
    app.text_answered(phone, "Also the canteen coffee machine is broken", 2)
        .await;
    let stored = indexed(&app, 4).await;
    assert!(
        stored
            .iter()
            .all(|(model, dims)| model == STATIC_EMBEDDING_MODEL
                && *dims as usize == STATIC_EMBEDDING_DIMENSIONS),
        "{stored:?}"
    );
    // The worker made the model's own index for searches across people.
    let index: Option<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes
          WHERE schemaname = 'switchboard' AND indexdef LIKE '%' || $1 || '%'",
    )
    .bind(STATIC_EMBEDDING_MODEL)
    .fetch_optional(&app.db)
    .await
    .unwrap();
    let index = index.expect("an index for the static model's vectors");
    assert!(index.contains("halfvec(256)"), "{index}");

    // A reset: the new engine session knows nothing of the earlier turns.
    app.text_answered(phone, "/reset is my March payslip fixed yet", 3)
        .await;
    let calls = app.runner.calls();
    let prompt = &calls.last().unwrap().prompt;
    let block =
        recall_block(prompt).unwrap_or_else(|| panic!("the prompt has a recall block:\n{prompt}"));
    let recalled: Vec<&str> = block.lines().filter(|l| l.starts_with("- ")).collect();
    assert!(
        recalled.first().is_some_and(
            |l| l.contains("they wrote: My March payslip is missing the overtime hours")
        ),
        "the payslip message is recalled first: {recalled:#?}"
    );
    app.shutdown().await;
}
