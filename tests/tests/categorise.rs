//! The categorisation worker: every exchange (a person's message and the reply that answers it)
//! gets one of the configured labels, once, stored on the exchange and on both its messages and
//! announced on the public stream. With a chat model configured the model picks the label (an
//! answer outside the set is stored as `other`, keeping what it said); without one, the label
//! whose description is nearest by embedding. The fake OpenAI-compatible server plays both.
use std::time::{Duration, Instant};

use switchboard_e2e::{FakeAnswer, FakeModel, TestApp, spawn_app_configured};
use switchboard_kit::memory_config::{EmbeddingConfig, EmbeddingProvider, LlmConfig};
use switchboard_kit::proto::ExchangeCategorised;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(20);

fn llm(fake: &FakeModel) -> LlmConfig {
    LlmConfig {
        base_url: fake.url.clone(),
        model: "fake-chat".into(),
        timeout_s: 5,
        ..Default::default()
    }
}

fn embedding(fake: &FakeModel) -> EmbeddingConfig {
    fake.embedding_config("fake-embed")
}

/// An exchange as stored.
#[derive(Debug, sqlx::FromRow)]
struct Exchange {
    outbound_id: Uuid,
    inbound_id: Option<Uuid>,
    person_id: String,
    channel: String,
    label: String,
    source: String,
    raw_label: Option<String>,
}

/// The stored exchanges, once there are at least `n`.
async fn wait_for_exchanges(app: &TestApp, n: usize) -> Vec<Exchange> {
    let deadline = Instant::now() + WAIT;
    loop {
        let rows: Vec<Exchange> = sqlx::query_as(
            "SELECT outbound_id, inbound_id, person_id, channel, label, source, raw_label
               FROM switchboard.exchange_categories ORDER BY outbound_id",
        )
        .fetch_all(&app.db)
        .await
        .expect("read the exchanges");
        if rows.len() >= n {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "expected {n} categorised exchanges, got {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The label each logged message carries, by id.
async fn message_categories(app: &TestApp) -> Vec<(Uuid, String, Option<String>)> {
    sqlx::query_as("SELECT id, direction, category FROM switchboard.messages ORDER BY id")
        .fetch_all(&app.db)
        .await
        .expect("read the log")
}

/// Every `exchange.categorised` event on the public stream.
async fn categorised_events(app: &TestApp) -> Vec<ExchangeCategorised> {
    app.public_events("exchange.categorised").await
}

/// The one `message.logged` of `direction` on the stream, published again under a new stream
/// message id (not a duplicate the stream would drop: a second delivery), and the pipeline
/// settled after it.
async fn deliver_logged_again(app: &TestApp, direction: &str) {
    let stream = app
        .js
        .get_stream(app.topology.events_stream())
        .await
        .expect("the events stream");
    let subject = app.topology.event("message.logged");
    let mut logged = Vec::new();
    for seq in 1..=stream.cached_info().state.last_sequence {
        if let Ok(m) = stream.get_raw_message(seq).await
            && m.subject.as_str() == subject
        {
            let e: switchboard_kit::proto::MessageLogged =
                prost::Message::decode(m.payload.clone()).expect("a MessageLogged");
            if e.direction == direction {
                logged.push(m);
            }
        }
    }
    assert_eq!(logged.len(), 1);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        switchboard_kit::runtime::HEADER_TYPE,
        <switchboard_kit::proto::MessageLogged as prost::Name>::full_name().as_str(),
    );
    app.js
        .publish_with_headers(subject, headers, logged[0].payload.clone())
        .await
        .expect("publish")
        .await
        .expect("stored again");
    app.settle().await;
}

#[tokio::test]
async fn each_exchange_is_labelled_once_by_the_model_stored_on_both_messages_and_announced() {
    let fake = FakeModel::start(64).await;
    fake.answer_with(|c| {
        FakeAnswer::Text(if c.user.contains("shift") {
            " Roster_Query. ".into()
        } else {
            "incident_report".into()
        })
    });
    let (l, e) = (llm(&fake), embedding(&fake));
    let app = spawn_app_configured(move |c| {
        c.llm = l;
        c.embedding = e;
    })
    .await;

    assert_eq!(
        app.send_sms("+14155550701", "when is my next shift?")
            .await
            .status(),
        200
    );
    app.wait_for_sms(1, WAIT).await;
    assert_eq!(
        app.send_sms("+14155550702", "the fire door is broken")
            .await
            .status(),
        200
    );
    app.wait_for_sms(2, WAIT).await;
    wait_for_exchanges(&app, 2).await;
    app.settle().await;

    let exchanges = wait_for_exchanges(&app, 2).await;
    assert_eq!(exchanges.len(), 2, "{exchanges:?}");
    let rows = message_categories(&app).await;
    assert_eq!(rows.len(), 4, "two messages in, two replies out: {rows:?}");
    for x in &exchanges {
        let expected = if x.person_id == "phone:+14155550701" {
            "roster_query"
        } else {
            "incident_report"
        };
        assert_eq!(
            (x.label.as_str(), x.source.as_str()),
            (expected, "model"),
            "{x:?}"
        );
        assert_eq!(x.raw_label, None);
        assert_eq!(x.channel, "sms");
        let inbound = x
            .inbound_id
            .expect("the reply answers the person's message");
        for id in [inbound, x.outbound_id] {
            let (_, _, category) = rows.iter().find(|r| r.0 == id).expect("a logged message");
            assert_eq!(category.as_deref(), Some(expected), "message {id}");
        }
        let directions: Vec<&str> = rows
            .iter()
            .filter(|r| r.0 == inbound || r.0 == x.outbound_id)
            .map(|r| r.1.as_str())
            .collect();
        assert_eq!(directions, ["inbound", "outbound"]);
    }
    // The model saw the labels with their descriptions, and the exchange, once per exchange.
    let chats = fake.chats();
    assert_eq!(chats.len(), 2, "one model call per exchange");
    assert!(
        chats[0]
            .system
            .contains("- roster_query: Questions about shifts")
    );
    assert!(
        chats
            .iter()
            .any(|c| c.user.contains("when is my next shift?")
                && c.user.contains("echo: when is my next shift?"))
    );

    let events = categorised_events(&app).await;
    assert_eq!(events.len(), 2, "one event per exchange: {events:?}");
    for x in &exchanges {
        let ev = events
            .iter()
            .find(|ev| ev.outbound_message_id == x.outbound_id.to_string())
            .expect("the exchange was announced");
        assert_eq!(ev.label, x.label);
        assert_eq!(ev.inbound_message_id, x.inbound_id.unwrap().to_string());
        assert_eq!(ev.person_id, x.person_id);
        assert_eq!(ev.source, "model");
    }
    app.shutdown().await;
}

#[tokio::test]
async fn a_model_answer_outside_the_label_set_is_stored_as_other_keeping_what_it_said() {
    let fake = FakeModel::start(64).await;
    fake.answer_with(|_| FakeAnswer::Text("Weather smalltalk".into()));
    let (l, e) = (llm(&fake), embedding(&fake));
    let app = spawn_app_configured(move |c| {
        c.llm = l;
        c.embedding = e;
    })
    .await;

    app.send_sms("+14155550703", "lovely sunny day").await;
    let exchanges = wait_for_exchanges(&app, 1).await;
    assert_eq!(exchanges[0].label, "other");
    assert_eq!(exchanges[0].raw_label.as_deref(), Some("Weather smalltalk"));
    let rows = message_categories(&app).await;
    assert!(
        rows.iter().all(|r| r.2.as_deref() == Some("other")),
        "{rows:?}"
    );
    let metrics = app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sb_categorise_outside_label_set_total") && l.ends_with(" 1")),
        "the answer outside the set is counted:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("categorise"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    app.shutdown().await;
}

#[tokio::test]
async fn without_a_model_the_label_whose_description_is_nearest_by_embedding_is_chosen() {
    let fake = FakeModel::start(64).await;
    let e = embedding(&fake);
    let app = spawn_app_configured(move |c| c.embedding = e).await;

    app.send_sms(
        "+14155550704",
        "what are my working hours on the roster, when is my next shift",
    )
    .await;
    app.wait_for_sms(1, WAIT).await;
    app.send_sms(
        "+14155550705",
        "my app login fails, I forgot my password, the phone system is down",
    )
    .await;
    let exchanges = wait_for_exchanges(&app, 2).await;
    let label_of = |person: &str| {
        exchanges
            .iter()
            .find(|x| x.person_id == person)
            .map(|x| (x.label.as_str(), x.source.as_str()))
    };
    assert_eq!(
        label_of("phone:+14155550704"),
        Some(("roster_query", "embedding"))
    );
    assert_eq!(
        label_of("phone:+14155550705"),
        Some(("technical_support", "embedding"))
    );
    assert!(fake.chats().is_empty(), "no chat model was asked");
    app.shutdown().await;
}

#[tokio::test]
async fn with_no_way_to_label_an_exchange_is_dead_lettered_saying_why() {
    // No chat model, and an embedder that cannot work (an OpenAI-compatible one with no URL).
    let app = spawn_app_configured(|c| {
        c.embedding.provider = EmbeddingProvider::OpenAi;
        c.embedding.base_url = String::new();
    })
    .await;
    app.send_sms("+14155550706", "hello").await;
    app.wait_for_sms(1, WAIT).await;
    let letters = app.wait_for_dead_letters("categorise", WAIT).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(
        letters[0].error.contains("[llm] is not configured"),
        "{}",
        letters[0].error
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_message_the_agent_starts_is_an_exchange_of_its_own() {
    let fake = FakeModel::start(64).await;
    fake.answer_with(|c| {
        FakeAnswer::Text(if c.user.contains("reminder") {
            "roster_query".into()
        } else {
            "casual_chat".into()
        })
    });
    let (l, e) = (llm(&fake), embedding(&fake));
    let app = spawn_app_configured(move |c| {
        c.llm = l;
        c.embedding = e;
    })
    .await;
    let person = "+14155550707";
    app.send_sms(person, "hi there").await;
    app.wait_for_sms(1, WAIT).await;
    wait_for_exchanges(&app, 1).await;

    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let sent = app
        .post_api(
            "outbound",
            &key,
            serde_json::json!({
                "person_id": format!("phone:{person}"),
                "agent": "reggie_oc",
                "text": "A reminder: your shift starts at 9 tomorrow.",
            }),
            None,
        )
        .await;
    assert_eq!(
        sent.status(),
        202,
        "{}",
        sent.text().await.unwrap_or_default()
    );
    app.wait_for_sms(2, WAIT).await;
    let exchanges = wait_for_exchanges(&app, 2).await;
    let rows = message_categories(&app).await;
    let reminder = rows
        .iter()
        .find(|r| r.1 == "outbound" && r.2.as_deref() == Some("roster_query"))
        .unwrap_or_else(|| panic!("the reminder is labelled: {rows:?}"));
    let x = exchanges
        .iter()
        .find(|x| x.outbound_id == reminder.0)
        .expect("the reminder's exchange");
    assert_eq!(x.inbound_id, None, "nothing the person said is part of it");
    // The earlier exchange keeps its own label on its own messages.
    let greeting: Vec<_> = rows
        .iter()
        .filter(|r| r.2.as_deref() == Some("casual_chat"))
        .collect();
    assert_eq!(greeting.len(), 2, "{rows:?}");
    app.shutdown().await;
}

#[tokio::test]
async fn an_event_delivered_again_labels_nothing_twice() {
    let fake = FakeModel::start(64).await;
    fake.answer_with(|_| FakeAnswer::Text("casual_chat".into()));
    let (l, e) = (llm(&fake), embedding(&fake));
    let app = spawn_app_configured(move |c| {
        c.llm = l;
        c.embedding = e;
    })
    .await;
    app.send_sms("+14155550708", "good morning").await;
    app.wait_for_sms(1, WAIT).await;
    wait_for_exchanges(&app, 1).await;
    app.settle().await;

    // The reply's `message.logged` again, as a replay or a second publisher would send it.
    deliver_logged_again(&app, "outbound").await;

    assert_eq!(wait_for_exchanges(&app, 1).await.len(), 1);
    assert_eq!(
        fake.chats().len(),
        1,
        "the stored label is reused, not asked again"
    );
    assert_eq!(categorised_events(&app).await.len(), 1, "announced once");
    app.shutdown().await;
}

#[tokio::test]
async fn a_message_logged_after_its_reply_was_labelled_joins_that_label() {
    let fake = FakeModel::start(64).await;
    fake.answer_with(|_| FakeAnswer::Text("roster_query".into()));
    let (l, e) = (llm(&fake), embedding(&fake));
    let app = spawn_app_configured(move |c| {
        c.llm = l;
        c.embedding = e;
    })
    .await;
    app.send_sms("+14155550709", "when is my next shift").await;
    app.wait_for_sms(1, WAIT).await;
    let exchange = wait_for_exchanges(&app, 1).await.remove(0);
    let inbound = exchange.inbound_id.expect("labelled with its message");
    app.settle().await;
    // As when the message's log came later than the reply's grace (a crash between them): the
    // exchange was labelled on the reply alone.
    sqlx::query("UPDATE switchboard.exchange_categories SET inbound_id = NULL")
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("UPDATE switchboard.messages SET category = NULL WHERE id = $1")
        .bind(inbound)
        .execute(&app.db)
        .await
        .unwrap();

    // The message's own `message.logged`, delivered now.
    deliver_logged_again(&app, "inbound").await;

    let after = wait_for_exchanges(&app, 1).await.remove(0);
    assert_eq!(
        after.inbound_id,
        Some(inbound),
        "the label names its message"
    );
    let categories = message_categories(&app).await;
    assert!(
        categories
            .iter()
            .all(|(_, _, label)| label.as_deref() == Some("roster_query")),
        "both messages carry the label: {categories:?}"
    );
    assert_eq!(fake.chats().len(), 1, "nothing labelled again");
    assert_eq!(categorised_events(&app).await.len(), 1, "announced once");
    app.shutdown().await;
}

#[tokio::test]
async fn thirty_exchanges_labelled_together_each_get_the_label_of_their_own_words() {
    let fake = FakeModel::start(64).await;
    let e = embedding(&fake);
    let app = spawn_app_configured(move |c| c.embedding = e).await;
    let phone = |i: usize| format!("+1415555{:04}", 7100 + i);
    let words = |i: usize| {
        if i.is_multiple_of(2) {
            format!("when is my next shift on the roster, what are my working hours {i}")
        } else {
            format!("my app login fails, I forgot my password, the phone system is down {i}")
        }
    };
    // All at once, so the stage gets them many to a batch.
    let sent = futures::future::join_all((0..30).map(|i| {
        let (app, phone, text) = (&app, phone(i), words(i));
        async move { app.send_sms(&phone, &text).await.status() }
    }))
    .await;
    assert!(sent.iter().all(|s| *s == 200), "{sent:?}");
    let exchanges = wait_for_exchanges(&app, 30).await;
    let categories = message_categories(&app).await;
    for i in 0..30 {
        let person = format!("phone:{}", phone(i));
        let x = exchanges
            .iter()
            .find(|x| x.person_id == person)
            .unwrap_or_else(|| panic!("{person} has an exchange"));
        let want = if i.is_multiple_of(2) {
            "roster_query"
        } else {
            "technical_support"
        };
        assert_eq!(x.label, want, "{person}: {x:?}");
        // Both messages of the exchange carry its label, and no one else's.
        for id in [Some(x.outbound_id), x.inbound_id] {
            let id = id.unwrap_or_else(|| panic!("{person}: the exchange names its message"));
            let (_, _, category) = categories.iter().find(|c| c.0 == id).unwrap();
            assert_eq!(category.as_deref(), Some(want), "{person}: message {id}");
        }
    }
    app.shutdown().await;
}

#[tokio::test]
async fn labels_that_fail_to_be_stored_are_labelled_again_not_lost() {
    let fake = FakeModel::start(64).await;
    let e = embedding(&fake);
    let app = spawn_app_configured(move |c| c.embedding = e).await;
    // The first write of labels fails, as when Postgres goes away mid-batch.
    sqlx::raw_sql(
        "CREATE SEQUENCE switchboard.labels_write_attempts;
         CREATE FUNCTION switchboard.fail_the_first_labels_write() RETURNS trigger
             LANGUAGE plpgsql AS $$
         BEGIN
             IF nextval('switchboard.labels_write_attempts') = 1 THEN
                 RAISE EXCEPTION 'injected: the labels write fails once';
             END IF;
             RETURN NULL;
         END $$;
         CREATE TRIGGER fail_the_first_labels_write BEFORE INSERT
             ON switchboard.exchange_categories
             FOR EACH STATEMENT EXECUTE FUNCTION switchboard.fail_the_first_labels_write();",
    )
    .execute(&app.db)
    .await
    .expect("the failure is injected");
    for i in 0..3 {
        let status = app
            .send_sms(&format!("+1415555{:04}", 7200 + i), "when is my next shift")
            .await
            .status();
        assert_eq!(status, 200);
    }
    app.wait_for_sms(3, WAIT).await;
    let exchanges = wait_for_exchanges(&app, 3).await;
    assert_eq!(exchanges.len(), 3, "{exchanges:?}");
    let attempts: i64 =
        sqlx::query_scalar("SELECT last_value FROM switchboard.labels_write_attempts")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(
        attempts >= 2,
        "the failing write was tried again ({attempts})"
    );
    app.shutdown().await;
}
