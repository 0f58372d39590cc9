//! How far behind the vector index is, as search answers and recall blocks report it: exactly
//! the conversation's messages that have no vector under the model, found through the marks the
//! embedding worker writes with each vector (so the answer costs a handful of index entries, not
//! a pass over the log: the memory bench measures that at 1M messages), and still exact when the
//! marks are for another model (after a change of model, before the new model's worker starts).
use std::time::Duration;

use switchboard_e2e::{FakeModel, TestApp, spawn_app_configured};
use switchboard_memory::index::{self, IndexLag, LagScope};

const WAIT: Duration = Duration::from_secs(30);

async fn lag(app: &TestApp, model: &str, scope: LagScope<'_>) -> IndexLag {
    index::lag(&app.db, model, scope).await.expect("the lag")
}

/// Log one more message of `person`'s session as the log worker would, the embedding worker
/// not having reached it (its event is never published); `kind` as `metadata.kind`.
async fn log_unembedded(app: &TestApp, person: &str, kind: Option<&str>) -> uuid::Uuid {
    let id = uuid::Uuid::now_v7();
    let metadata = match kind {
        Some(k) => serde_json::json!({ "kind": k }),
        None => serde_json::json!({}),
    };
    sqlx::query(
        "INSERT INTO switchboard.messages
            (id, session_id, person_id, agent_name, agent_identity, direction, channel, message,
             correlation_id, metadata, created_at)
         SELECT $1, session_id, person_id, agent_name, agent_identity, 'outbound', channel,
                'a reply the index has not reached', 'test', $3, now() - interval '5 seconds'
           FROM switchboard.messages WHERE person_id = $2 LIMIT 1",
    )
    .bind(id)
    .bind(person)
    .bind(metadata)
    .execute(&app.db)
    .await
    .expect("log a message");
    id
}

/// One person + agent identity's scope (recall's, a person's search).
fn of(person: &str) -> LagScope<'_> {
    LagScope::Person {
        person_id: person,
        agent_identity: Some("reggie"),
    }
}

async fn people(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar("SELECT DISTINCT person_id FROM switchboard.messages ORDER BY 1")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_lag_counts_exactly_the_messages_without_a_vector_also_across_a_model_change() {
    let fake = FakeModel::start(16).await;
    let config = fake.embedding_config("fake-embed");
    let app = spawn_app_configured(move |c| c.embedding = config).await;
    app.text_and_settle(&[
        ("+14155550711", "when is my next shift"),
        ("+14155550712", "the fire alarm in building C went off"),
    ])
    .await;

    let marked: Vec<(bool, Option<String>)> = sqlx::query_as(
        "SELECT conversation, embedded_model FROM switchboard.message_marks ORDER BY message_id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(marked.len(), 4);
    assert!(
        marked
            .iter()
            .all(|m| *m == (true, Some("fake-embed".to_string()))),
        "the worker marks each message it embeds, with the vector: {marked:?}"
    );
    assert_eq!(
        lag(&app, "fake-embed", LagScope::Everyone).await,
        IndexLag {
            seconds: 0.0,
            messages_waiting: 0
        }
    );

    // The index falls behind on one person's message; what is not conversation never waits.
    let people = people(&app).await;
    let (behind, other) = (&people[0], &people[1]);
    log_unembedded(&app, behind, None).await;
    log_unembedded(&app, behind, Some("memory_flush")).await;
    log_unembedded(&app, other, Some("heartbeat_ok")).await;
    let everyone = lag(&app, "fake-embed", LagScope::Everyone).await;
    assert_eq!(everyone.messages_waiting, 1, "{everyone:?}");
    assert!(
        everyone.seconds >= 4.0,
        "the oldest waits since it was logged: {everyone:?}"
    );
    assert_eq!(
        lag(&app, "fake-embed", of(behind)).await.messages_waiting,
        1
    );
    assert_eq!(lag(&app, "fake-embed", of(other)).await.messages_waiting, 0);

    // A new model: the marks are made for it, and every message waits for it; the old model's
    // lag is still told exactly (the vectors are looked up, the marks being for the new one).
    assert!(index::ensure_marks(&app.db, "fake-embed-v2").await.unwrap());
    assert!(
        !index::ensure_marks(&app.db, "fake-embed-v2").await.unwrap(),
        "once"
    );
    assert_eq!(
        lag(&app, "fake-embed-v2", LagScope::Everyone)
            .await
            .messages_waiting,
        5
    );
    assert_eq!(
        lag(&app, "fake-embed", LagScope::Everyone)
            .await
            .messages_waiting,
        1
    );
    // A person's lag, one statement whichever model the marks are for: by the marks for the
    // new model, by the vectors for the old one.
    assert_eq!(
        lag(&app, "fake-embed-v2", of(behind))
            .await
            .messages_waiting,
        3
    );
    assert_eq!(
        lag(&app, "fake-embed-v2", of(other)).await.messages_waiting,
        2
    );
    assert_eq!(
        lag(&app, "fake-embed", of(behind)).await.messages_waiting,
        1
    );
    assert_eq!(lag(&app, "fake-embed", of(other)).await.messages_waiting, 0);
    // And back: marked again from the vectors, the same answer as before the change.
    assert!(index::ensure_marks(&app.db, "fake-embed").await.unwrap());
    assert_eq!(
        lag(&app, "fake-embed", LagScope::Everyone)
            .await
            .messages_waiting,
        1
    );
    assert_eq!(lag(&app, "fake-embed", of(other)).await.messages_waiting, 0);
}

#[tokio::test]
async fn what_is_not_conversation_is_the_same_for_the_database_and_the_code() {
    let app = spawn_app_configured(|_| {}).await;
    assert_eq!(app.send_sms("+14155550713", "hello").await.status(), 200);
    app.wait_for_sms(1, WAIT).await;
    let person = people(&app).await.remove(0);
    let kinds: Vec<Option<&str>> = switchboard_memory::NOT_CONVERSATION
        .iter()
        .copied()
        .map(Some)
        .chain([None, Some("notice"), Some("reply")])
        .collect();
    for kind in kinds {
        let id = log_unembedded(&app, &person, kind).await;
        let conversation: bool =
            sqlx::query_scalar("SELECT conversation FROM switchboard.messages WHERE id = $1")
                .bind(id)
                .fetch_one(&app.db)
                .await
                .unwrap();
        let expected = !kind.is_some_and(|k| switchboard_memory::NOT_CONVERSATION.contains(&k));
        assert_eq!(conversation, expected, "kind {kind:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vector_written_while_the_marks_are_remade_for_its_model_is_not_left_waiting() {
    let fake = FakeModel::start(16).await;
    let config = fake.embedding_config("fake-embed");
    let app = spawn_app_configured(move |c| c.embedding = config).await;
    app.text_and_settle(&[("+14155550714", "when is my next shift")])
        .await;
    let person = people(&app).await.remove(0);
    let late = log_unembedded(&app, &person, None).await;

    // A worker of the new model writes `late`'s vector (its marks are still for the old
    // model, so it marks nothing) while the marks are being remade for the new model.
    let mut writer = app.db.begin().await.unwrap();
    index::mark_embedded(&mut writer, "fake-embed-v2", &[late])
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO switchboard.message_vectors
            (message_id, model, person_id, agent_identity, dimensions, embedding)
         SELECT id, 'fake-embed-v2', person_id, agent_identity, 3, '[1,2,3]'
           FROM switchboard.messages WHERE id = $1",
    )
    .bind(late)
    .execute(&mut *writer)
    .await
    .unwrap();
    let db = app.db.clone();
    let remark = tokio::spawn(async move { index::ensure_marks(&db, "fake-embed-v2").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !remark.is_finished(),
        "marking again waits for the transaction that holds the marks' row"
    );
    writer.commit().await.unwrap();
    assert!(remark.await.unwrap().unwrap(), "marked again");

    let marked: Option<String> = sqlx::query_scalar(
        "SELECT embedded_model FROM switchboard.message_marks WHERE message_id = $1",
    )
    .bind(late)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        marked.as_deref(),
        Some("fake-embed-v2"),
        "its vector was seen"
    );
    let v2 = lag(&app, "fake-embed-v2", LagScope::Everyone).await;
    assert_eq!(
        v2.messages_waiting, 2,
        "the first exchange waits for the new model, the message with its vector does not: {v2:?}"
    );
}
