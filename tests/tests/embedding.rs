//! The embedding worker: every message in and out gets exactly one vector under the configured
//! model, with its person and identity, and a `message.embedded` event; a redelivery doubles
//! nothing; what names no message is skipped, never retried forever; and the default, local
//! model (all-MiniLM-L6-v2 in the process) is the real one: it matches reference vectors
//! computed independently (`tests/fixtures/embedding/`) and ranks a paraphrase first.
//!
//! The tests of the local model read its folder from `SB_EMBEDDING__MODEL_DIR`, and its default
//! runtime's files from `SB_EMBEDDING__ONNX_RUNTIME` and `SB_EMBEDDING__ONNX_MODEL`, which
//! `stack up|env` (services/stack) prints (and `make test` exports); without the latter two the
//! local model runs on candle (tests/tests/embedding_onnx.rs checks ONNX Runtime itself).
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_nats::jetstream::consumer;
use futures::StreamExt;
use prost::Message as _;
use switchboard_e2e::embedding_checks::{
    SHIFT_PARAPHRASE, nearest_to_a_question_about_shifts, reference,
};
use switchboard_e2e::{AppOptions, FakeModel, TestApp, spawn_app_configured, spawn_app_with};
use switchboard_kit::memory_config::EmbeddingConfig;
use switchboard_kit::proto::{MessageEmbedded, MessageLogged};
use switchboard_memory::embed::{self, cosine};

const WAIT: Duration = Duration::from_secs(30);

fn model_dir() -> String {
    std::env::var("SB_EMBEDDING__MODEL_DIR").unwrap_or_else(|_| {
        panic!(
            "SB_EMBEDDING__MODEL_DIR is not set: run with `make test`, or export what \
             `target/debug/stack env test` prints (the stack fetches the model)"
        )
    })
}

/// `[embedding]` as the stack's env sets it (the default provider and runtime).
fn local_config() -> EmbeddingConfig {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    EmbeddingConfig {
        model_dir: model_dir(),
        onnx_runtime: var("SB_EMBEDDING__ONNX_RUNTIME"),
        onnx_model: var("SB_EMBEDDING__ONNX_MODEL"),
        ..Default::default()
    }
}

fn fake_config(fake: &FakeModel) -> EmbeddingConfig {
    EmbeddingConfig {
        batch: 3,
        ..fake.embedding_config("fake-embed")
    }
}

/// A stored vector as a user would read it back.
#[derive(Debug)]
struct Stored {
    message_id: uuid::Uuid,
    text: String,
    direction: String,
    person_id: String,
    agent_identity: String,
    model: String,
    dimensions: i32,
    embedding: Vec<f32>,
}

/// A message and its vector (the vector's columns are empty when it has none).
type StoredRow = (
    uuid::Uuid,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i32>,
    Option<String>,
);

/// Every vector stored, with the message it belongs to (a message without one shows up with an
/// empty model).
async fn vectors(app: &TestApp) -> Vec<Stored> {
    let rows: Vec<StoredRow> = sqlx::query_as(
        "SELECT m.id, m.message, m.direction, v.person_id, v.agent_identity, v.model,
                    v.dimensions, v.embedding::text
               FROM switchboard.messages m
               LEFT JOIN switchboard.message_vectors v ON v.message_id = m.id
              ORDER BY m.id, v.model",
    )
    .fetch_all(&app.db)
    .await
    .expect("read the vectors");
    rows.into_iter()
        .map(
            |(id, text, direction, person, identity, model, dims, embedding)| Stored {
                message_id: id,
                text,
                direction,
                person_id: person.unwrap_or_default(),
                agent_identity: identity.unwrap_or_default(),
                model: model.unwrap_or_default(),
                dimensions: dims.unwrap_or_default(),
                embedding: embedding
                    .unwrap_or_default()
                    .trim_matches(['[', ']'])
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|x| x.parse().expect("a vector component"))
                    .collect(),
            },
        )
        .collect()
}

/// The events published on `sb.events.<name>` so far, decoded.
async fn events<M: prost::Message + Default>(app: &TestApp, name: &str) -> Vec<M> {
    let stream = app
        .js
        .get_stream(app.topology.events_stream())
        .await
        .expect("the events stream");
    let reader = stream
        .create_consumer(consumer::pull::Config {
            filter_subject: app.topology.event(name),
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .expect("a reader of the events stream");
    let mut out = Vec::new();
    let mut messages = reader.messages().await.expect("read events");
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_secs(1), messages.next()).await
    {
        let message = message.expect("an event");
        out.push(M::decode(message.payload.clone()).expect("the event decodes"));
    }
    out
}

async fn publish_logged(app: &TestApp, logged: &MessageLogged) {
    app.js
        .publish(
            app.topology.event("message.logged"),
            logged.encode_to_vec().into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored");
}

/// Two people write; the agent answers each. Returns once the pipeline is quiet.
async fn two_conversations(app: &TestApp) {
    app.text_and_settle(&[
        ("+14155550701", "when is my next shift"),
        ("+14155550702", "the fire alarm in building C went off"),
    ])
    .await;
}

#[tokio::test]
async fn every_message_in_and_out_gets_one_vector_under_the_configured_model_and_an_event() {
    let fake = FakeModel::start(16).await;
    let config = fake_config(&fake);
    let app = spawn_app_configured(move |c| c.embedding = config).await;
    two_conversations(&app).await;

    let stored = vectors(&app).await;
    let logged: Vec<(uuid::Uuid, String, String)> = sqlx::query_as(
        "SELECT id, person_id, agent_identity FROM switchboard.messages ORDER BY id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(logged.len(), 4, "two messages in, two replies out");
    assert_eq!(
        stored.len(),
        logged.len(),
        "exactly one vector per message: {stored:?}"
    );
    for ((id, person, identity), v) in logged.iter().zip(&stored) {
        assert_eq!(&v.message_id, id);
        assert_eq!(v.model, "fake-embed", "{} message {id}", v.direction);
        assert_eq!(
            (&v.person_id, &v.agent_identity),
            (person, identity),
            "the vector names the message's person and identity"
        );
        assert_eq!(v.dimensions, 16);
        let same = cosine(&v.embedding, &fake.vector_of(&v.text));
        assert!(
            same > 0.9999,
            "the vector of {:?} is its text's: {same}",
            v.text
        );
    }
    let directions: HashSet<&str> = stored.iter().map(|v| v.direction.as_str()).collect();
    assert_eq!(directions, HashSet::from(["inbound", "outbound"]));

    let announced = events::<MessageEmbedded>(&app, "message.embedded").await;
    assert_eq!(announced.len(), logged.len(), "one event per message");
    let by_id: HashMap<String, &MessageEmbedded> = announced
        .iter()
        .map(|e| (e.message_id.clone(), e))
        .collect();
    for (id, person, identity) in &logged {
        let e = by_id
            .get(&id.to_string())
            .unwrap_or_else(|| panic!("no message.embedded for {id}"));
        assert_eq!(
            (
                &e.person_id,
                &e.agent_identity,
                e.model.as_str(),
                e.dimensions
            ),
            (person, identity, "fake-embed", 16)
        );
    }

    // The model's vector index is built at start (IVFFlat; no model has one from the migrations).
    let index = wait_for_index(&app, "message_vectors_ivf_fake_embed").await;
    assert!(
        index.contains("ivfflat") && index.contains("halfvec(16)") && index.contains("fake-embed"),
        "{index}"
    );
    assert!(app.dead_letters("embed").await.is_empty());
}

#[tokio::test]
async fn a_redelivered_batch_doubles_nothing_and_what_names_no_message_is_skipped_not_retried() {
    let fake = FakeModel::start(16).await;
    let config = fake_config(&fake);
    // Categorisation embeds exchanges through the same model; this test counts the embed
    // worker's calls alone.
    let app = spawn_app_with(AppOptions::without(&["categorise"]).configured(move |c| {
        c.embedding = config;
        // Recall embeds each turn's message through the same model.
        c.recall.enabled = false;
    }))
    .await;
    two_conversations(&app).await;
    let embedded_once = fake.texts_embedded();
    assert_eq!(embedded_once, 4);

    // Every message.logged again (as after a crash before the acks), plus one that names a
    // message erased since (no row) and one whose id is not an id.
    let logged = events::<MessageLogged>(&app, "message.logged").await;
    assert_eq!(logged.len(), 4);
    for l in &logged {
        publish_logged(&app, l).await;
    }
    let erased = MessageLogged {
        message_id: uuid::Uuid::now_v7().to_string(),
        person_id: "phone:+14155550799".into(),
        ..logged[0].clone()
    };
    let bad = MessageLogged {
        message_id: "not-a-message-id".into(),
        ..logged[0].clone()
    };
    publish_logged(&app, &erased).await;
    publish_logged(&app, &bad).await;
    app.settle().await;

    let stored = vectors(&app).await;
    assert_eq!(stored.len(), 4, "still one vector per message: {stored:?}");
    assert_eq!(
        fake.texts_embedded(),
        embedded_once,
        "what already has a vector is not embedded again"
    );
    let announced = events::<MessageEmbedded>(&app, "message.embedded").await;
    assert_eq!(announced.len(), 4, "no event twice");
    assert!(
        !announced.iter().any(|e| e.message_id == erased.message_id),
        "nothing is announced for a message that is not there"
    );
    assert!(
        app.dead_letters("embed").await.is_empty(),
        "skipped, not dead-lettered"
    );
    let metrics = app.metrics().await;
    for reason in ["no_row", "bad_id"] {
        let line = format!("sb_embed_skipped_total{{reason=\"{reason}\"}} 1");
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
}

#[tokio::test]
async fn an_embedder_that_cannot_be_used_dead_letters_each_message_with_the_reason() {
    let empty = std::env::temp_dir().join(format!("no-model-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&empty).unwrap();
    let dir = empty.display().to_string();
    let app = spawn_app_configured(move |c| {
        c.embedding = EmbeddingConfig {
            model_dir: dir,
            ..Default::default()
        }
    })
    .await;
    assert_eq!(app.send_sms("+14155550703", "hello").await.status(), 200);
    app.wait_for_sms(1, WAIT).await;
    let letters = app.wait_for_dead_letters("embed", WAIT).await;
    assert!(!letters.is_empty(), "the message is dead-lettered");
    assert!(
        letters[0].error.contains("has no model.safetensors"),
        "the reason says what is wrong: {}",
        letters[0].error
    );
    assert!(vectors(&app).await.iter().all(|v| v.model.is_empty()));
    let _ = std::fs::remove_dir(&empty);
}

#[tokio::test]
async fn the_local_model_matches_reference_vectors_computed_independently() {
    let reference = reference("all-MiniLM-L6-v2.json");
    let config = local_config();
    assert_eq!(reference.model, config.model);
    let embedder = embed::from_config(&config).expect("the local model loads");
    assert_eq!(
        (embedder.model(), embedder.dimensions()),
        ("all-MiniLM-L6-v2", 384)
    );
    // All at once: texts of very different lengths share a padded batch (an empty one, and one
    // past the 256-token cut among them).
    let got = embedder.embed(&reference.texts).await.expect("embedded");
    assert_eq!(got.len(), reference.texts.len());
    for ((text, want), got) in reference.texts.iter().zip(&reference.vectors).zip(&got) {
        let same = cosine(want, got);
        assert!(same >= 0.9999, "{text:.40?}: cosine {same}");
    }
}

#[tokio::test]
async fn the_local_model_ranks_a_paraphrase_above_unrelated_messages() {
    let embedder = embed::from_config(&local_config()).expect("the local model loads");
    let ranked = nearest_to_a_question_about_shifts(embedder.as_ref()).await;
    assert_eq!(ranked[0].1, SHIFT_PARAPHRASE, "{ranked:?}");
}

#[tokio::test]
async fn by_default_each_message_is_embedded_in_the_process_by_the_local_model() {
    let dir = model_dir();
    let app = spawn_app_configured(move |c| c.embedding.model_dir = dir).await;
    two_conversations(&app).await;
    let local = embed::from_config(&local_config()).unwrap();
    let stored = vectors(&app).await;
    assert_eq!(stored.len(), 4, "{stored:?}");
    for v in &stored {
        assert_eq!((v.model.as_str(), v.dimensions), ("all-MiniLM-L6-v2", 384));
        let want = &local.embed(std::slice::from_ref(&v.text)).await.unwrap()[0];
        let same = cosine(want, &v.embedding);
        assert!(same > 0.9999, "{:?}: {same}", v.text);
    }
}

// The CLI runs as a child process while this test's runtime serves the fake model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_model_change_reembed_gives_every_message_a_vector_under_the_new_model_and_keeps_the_old()
 {
    let fake = FakeModel::start(16).await;
    let config = fake_config(&fake);
    let app = spawn_app_configured(move |c| c.embedding = config).await;
    two_conversations(&app).await;

    // The operator changes the model and runs `switchboard reembed`.
    let mut changed = app.config.clone();
    changed.embedding.model = "fake-embed-v2".into();
    switchboard_e2e::write_private(&app.config_path, &toml::to_string(&changed).unwrap()).unwrap();
    async fn reembed(app: &TestApp) -> String {
        let out = app.cli(&["reembed".as_ref()]).await;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
    let said = reembed(&app).await;
    assert!(
        said.contains("4 messages embedded under fake-embed-v2"),
        "{said}"
    );
    let per_model = |app: &TestApp| {
        let db = app.db.clone();
        async move {
            let rows: Vec<(String, i64)> = sqlx::query_as(
                "SELECT model, count(*) FROM switchboard.message_vectors GROUP BY model ORDER BY model",
            )
            .fetch_all(&db)
            .await
            .unwrap();
            rows
        }
    };
    assert_eq!(
        per_model(&app).await,
        [
            ("fake-embed".to_string(), 4),
            ("fake-embed-v2".to_string(), 4)
        ],
        "the old model's vectors stay beside the new ones"
    );

    // Stopped half way (two vectors never written, nor their marks): a second run does only
    // what is left.
    sqlx::query(
        "WITH gone AS (
           DELETE FROM switchboard.message_vectors WHERE model = 'fake-embed-v2'
              AND message_id IN (SELECT message_id FROM switchboard.message_vectors
                                  WHERE model = 'fake-embed-v2' ORDER BY message_id LIMIT 2)
           RETURNING message_id)
         UPDATE switchboard.message_marks SET embedded_model = NULL
          WHERE message_id IN (SELECT message_id FROM gone)",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let said = reembed(&app).await;
    assert!(
        said.contains("2 messages embedded under fake-embed-v2"),
        "{said}"
    );
    assert_eq!(per_model(&app).await[1], ("fake-embed-v2".to_string(), 4));
    let index: Option<String> =
        sqlx::query_scalar("SELECT indexname::text FROM pg_indexes WHERE indexname = $1")
            .bind("message_vectors_ivf_fake_embed_v2")
            .fetch_optional(&app.db)
            .await
            .unwrap();
    assert!(index.is_some(), "the new model gets its own vector index");
}

/// The definition of the index named `name`, once it is there (the embedding worker builds it
/// beside its stage).
async fn wait_for_index(app: &TestApp, name: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let index: Option<String> =
            sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE indexname = $1")
                .bind(name)
                .fetch_optional(&app.db)
                .await
                .unwrap();
        if let Some(index) = index {
            return index;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no index {name} after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An app embedding through `fake` with `left_out` stages not started (the test starts them).
async fn app_on_fake_without(fake: &FakeModel, left_out: &[&str]) -> TestApp {
    let config = fake_config(fake);
    spawn_app_with(AppOptions::without(left_out).configured(move |c| c.embedding = config)).await
}

/// Wait until `count_sql` counts at least `n` rows.
async fn wait_for_rows(app: &TestApp, count_sql: &str, n: i64, what: &str) {
    let count = || async {
        sqlx::query_scalar::<_, i64>(count_sql)
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    let deadline = std::time::Instant::now() + WAIT;
    while count().await < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {} of {n} after {WAIT:?}",
            count().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One inference per message: the vector recall computed for what a person said is stored as
/// that message's vector, and the embedding worker embeds only the replies. The worker starts
/// after the conversations here, so the order (recall first, then the worker) is the test's,
/// not a race's; its marks are made first, as the worker's start makes them.
#[tokio::test]
async fn what_a_person_said_is_embedded_once_recalls_vector_is_the_one_stored() {
    let fake = FakeModel::start(16).await;
    let app = app_on_fake_without(&fake, &["embed", "categorise"]).await;
    switchboard_memory::index::ensure_marks(&app.db, "fake-embed")
        .await
        .expect("the marks");
    two_conversations(&app).await;
    let said = [
        "when is my next shift",
        "the fire alarm in building C went off",
    ];
    let handed = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM switchboard.handed_vectors")
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    wait_for_rows(
        &app,
        "SELECT count(*) FROM switchboard.handed_vectors",
        2,
        "recall's vectors handed over, one for each message",
    )
    .await;
    for text in said {
        assert_eq!(fake.times_embedded(text), 1, "recall embedded {text:?}");
    }

    app.start_stage("embed");
    app.settle().await;
    let stored = vectors(&app).await;
    assert_eq!(stored.len(), 4, "one vector per message: {stored:?}");
    for v in &stored {
        assert_eq!(
            fake.times_embedded(&v.text),
            1,
            "{} message {:?} embedded once in all",
            v.direction,
            v.text
        );
        let same = cosine(&v.embedding, &fake.vector_of(&v.text));
        assert!(
            same > 0.9999,
            "the vector of {:?} is its text's: {same}",
            v.text
        );
        assert_eq!(v.model, "fake-embed");
    }
    assert_eq!(handed().await, 0, "every hand-off taken");
    let announced = events::<MessageEmbedded>(&app, "message.embedded").await;
    assert_eq!(announced.len(), 4, "each message announced as embedded");
}

/// A hand-off no embedding worker takes (none runs) does not stay: the dispatcher's sweep deletes
/// it after a few minutes, and one still fresh is left for the worker.
#[tokio::test]
async fn a_vector_no_worker_takes_is_deleted_in_minutes() {
    let app = switchboard_e2e::spawn_app().await;
    for age_s in [3_600, 10] {
        sqlx::query(
            "INSERT INTO switchboard.handed_vectors
                (message_id, model, person_id, agent_identity, dimensions, embedding, created_at)
             VALUES ($1, 'fake', 'phone:+14155550777', 'reggie', 3, '[1,2,3]',
                     now() - make_interval(secs => $2))",
        )
        .bind(uuid::Uuid::now_v7())
        .bind(age_s as f64)
        .execute(&app.db)
        .await
        .unwrap();
    }
    let swept = switchboard_memory::handoff::sweep_unclaimed(
        &app.db,
        switchboard_memory::handoff::UNCLAIMED_AFTER,
    )
    .await
    .unwrap();
    assert_eq!(
        swept, 1,
        "the hour-old hand-off is deleted, the fresh one kept"
    );
}

/// The other way round: when the embedding worker stored a message's vector before its turn ran
/// (the dispatcher behind), recall ranks with that vector instead of embedding the words again.
#[tokio::test]
async fn when_the_worker_came_first_recall_ranks_with_the_stored_vector() {
    let fake = FakeModel::start(16).await;
    let app = app_on_fake_without(&fake, &["dispatch", "categorise"]).await;
    let said = [
        ("+14155550701", "when is my next shift"),
        ("+14155550702", "the fire alarm in building C went off"),
    ];
    for (from, text) in said {
        assert_eq!(app.send_sms(from, text).await.status(), 200);
    }
    wait_for_rows(
        &app,
        "SELECT count(*) FROM switchboard.message_vectors v
           JOIN switchboard.messages m ON m.id = v.message_id
          WHERE m.direction = 'inbound'",
        2,
        "the worker's vectors of the messages",
    )
    .await;

    app.start_stage("dispatch");
    app.wait_for_sms(2, WAIT).await;
    app.settle().await;
    for (_, text) in said {
        assert_eq!(
            fake.times_embedded(text),
            1,
            "{text:?} embedded once in all: recall ranked with its stored vector"
        );
    }
    assert_eq!(vectors(&app).await.len(), 4, "and the replies got theirs");
    let metrics = app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sb_recall_query_vectors_total{source=\"stored\"} 2")),
        "recall says where its vectors came from: {}",
        metrics
            .lines()
            .filter(|l| l.contains("query_vectors"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A hand-off that comes after the person's erasure (recall ran on her message just before it)
/// is not written: nothing of hers is left for the embedding worker to store.
#[tokio::test]
async fn a_vector_handed_over_after_her_erasure_is_not_kept() {
    let fake = FakeModel::start(16).await;
    let app = app_on_fake_without(&fake, &["embed", "categorise"]).await;
    switchboard_memory::index::ensure_marks(&app.db, "fake-embed")
        .await
        .expect("the marks");
    let person = "phone:+14155550703";
    app.text_and_settle(&[("+14155550703", "my address is 5 Elm St")])
        .await;
    // Her next message came before the erasure; recall's vector of it comes after.
    let message_id = uuid::Uuid::now_v7();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let out = app
        .cli(&["forget".as_ref(), person.as_ref(), "--json".as_ref()])
        .await;
    assert!(
        out.status.success(),
        "forget failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let handed = switchboard_memory::handoff::HandedVector {
        message_id,
        person_id: person.into(),
        agent_identity: "reggie".into(),
        model: "fake-embed".into(),
        dimensions: 16,
        vector: switchboard_memory::embed::pg_vector(&fake.vector_of("my address is 5 Elm St")),
    };
    let written = switchboard_memory::handoff::write_all(&app.db, std::slice::from_ref(&handed))
        .await
        .expect("the write is refused quietly, not failed");
    assert_eq!(
        written, 0,
        "her vector is not handed over after she was forgotten"
    );
    let someone_else = switchboard_memory::handoff::HandedVector {
        person_id: "phone:+14155550704".into(),
        ..handed
    };
    assert_eq!(
        switchboard_memory::handoff::write_all(&app.db, &[someone_else])
            .await
            .unwrap(),
        1,
        "someone not forgotten is handed over as before"
    );
}
