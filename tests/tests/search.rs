//! What reads the memory workers' output: `GET /api/v1/search` (hybrid ranking by meaning and
//! words, filtered by person, agent, identity, channel and time, with the index's lag in every
//! answer), `GET /api/v1/analytics/categories`, and their CLI twins. The fake OpenAI-compatible
//! server is the embedder (bag-of-words vectors) and the chat model; vectors are written by the
//! test as the embedding worker would write them (that worker is not part of this branch), so a
//! message the test leaves without one is a message the index has not reached.
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard_e2e::{AppOptions, FakeAnswer, FakeModel, TestApp, spawn_app_with};
use switchboard_kit::memory_config::LlmConfig;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);
const MODEL: &str = "fake-embed";

async fn app_with_models() -> (TestApp, FakeModel) {
    let fake = FakeModel::start(64).await;
    // The chat model labels every exchange by what the person asked.
    fake.answer_with(|c| {
        FakeAnswer::Text(if c.user.contains("shift") {
            "roster_query".into()
        } else if c.user.contains("broken") {
            "incident_report".into()
        } else {
            "casual_chat".into()
        })
    });
    let url = fake.url.clone();
    let embedding = fake.embedding_config(MODEL);
    // The tests play the embedding worker themselves ([`embed_everything`]), so they decide
    // what the index holds when they search.
    let app = spawn_app_with(AppOptions::without(&["embed"]).configured(move |c| {
        c.llm = LlmConfig {
            base_url: url.clone(),
            model: "fake-chat".into(),
            ..Default::default()
        };
        c.embedding = embedding;
    }))
    .await;
    (app, fake)
}

/// Write the vector of every logged message that has none, as the embedding worker does.
async fn embed_everything(app: &TestApp, fake: &FakeModel) -> usize {
    let rows: Vec<(Uuid, String, String, String)> = sqlx::query_as(
        "SELECT m.id, m.message, m.person_id, m.agent_identity FROM switchboard.messages m
          WHERE NOT EXISTS (SELECT 1 FROM switchboard.message_vectors v
                             WHERE v.message_id = m.id AND v.model = $1)",
    )
    .bind(MODEL)
    .fetch_all(&app.db)
    .await
    .expect("read the log");
    for (id, text, person, identity) in &rows {
        sqlx::query(
            "INSERT INTO switchboard.message_vectors
                (message_id, model, person_id, agent_identity, dimensions, embedding)
             VALUES ($1, $2, $3, $4, 64, $5::vector)",
        )
        .bind(id)
        .bind(MODEL)
        .bind(person)
        .bind(identity)
        .bind(switchboard_memory::embed::pg_vector(&fake.vector_of(text)))
        .execute(&app.db)
        .await
        .expect("write a vector");
    }
    rows.len()
}

async fn get(app: &TestApp, key: &str, path: &str, params: &[(&str, &str)]) -> (u16, Value) {
    let response = reqwest::Client::new()
        .get(format!("{}{path}", app.gateway_url))
        .bearer_auth(key)
        .query(params)
        .send()
        .await
        .expect("gateway reachable");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn hits(body: &Value) -> &Vec<Value> {
    body["hits"].as_array().expect("hits")
}

/// Send one SMS per sender and wait until every one is answered.
async fn conversations(app: &TestApp, texts: &[(String, String)]) {
    let logged = || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.messages")
            .fetch_one(&app.db)
            .await
            .unwrap();
        n as usize
    };
    let before = logged().await;
    for (from, text) in texts {
        assert_eq!(app.send_sms(from, text).await.status(), 200);
    }
    app.wait_for_sms(texts.len(), WAIT).await;
    let deadline = Instant::now() + WAIT;
    loop {
        // Each message in, and its reply, on top of what earlier conversations logged.
        let logged = logged().await;
        if logged >= before + texts.len() * 2 {
            return;
        }
        assert!(Instant::now() < deadline, "{logged} messages logged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn phone(i: usize) -> String {
    format!("+1415555{:04}", 2000 + i)
}

#[tokio::test]
async fn fifty_people_with_near_identical_messages_a_search_for_one_never_returns_another() {
    let (app, fake) = app_with_models().await;
    let texts: Vec<(String, String)> = (0..50)
        .map(|i| (phone(i), format!("when is my next shift, asks worker {i}")))
        .collect();
    conversations(&app, &texts).await;
    embed_everything(&app, &fake).await;
    let key = app.api_key("ops", &["search:read"]).await;

    // Unfiltered, the same words find many people: the filter is what keeps them apart.
    let (status, all) = get(
        &app,
        &key,
        "/api/v1/search",
        &[("q", "when is my next shift"), ("limit", "100")],
    )
    .await;
    assert_eq!(status, 200, "{all}");
    let people: std::collections::HashSet<&str> = hits(&all)
        .iter()
        .filter_map(|h| h["person_id"].as_str())
        .collect();
    assert!(people.len() > 40, "{} people found", people.len());

    for i in 0..50 {
        let person = format!("phone:{}", phone(i));
        for filters in [
            vec![("person", person.as_str())],
            // As recall asks: the person and the agent identity together.
            vec![("person", person.as_str()), ("identity", "reggie")],
        ] {
            let mut params = vec![("q", "when is my next shift"), ("limit", "100")];
            params.extend(filters.iter().copied());
            let (status, body) = get(&app, &key, "/api/v1/search", &params).await;
            assert_eq!(status, 200, "{body}");
            let found = hits(&body);
            assert_eq!(
                found.len(),
                2,
                "{person}'s message and its reply, nothing else: {body}"
            );
            for h in found {
                assert_eq!(h["person_id"], person.as_str(), "{person} got {h}");
            }
        }
    }
    // The person under another agent identity has nothing.
    let (_, other) = get(
        &app,
        &key,
        "/api/v1/search",
        &[
            ("q", "when is my next shift"),
            ("person", &format!("phone:{}", phone(7))),
            ("identity", "someone_else"),
        ],
    )
    .await;
    assert_eq!(hits(&other).len(), 0, "{other}");
    app.shutdown().await;
}

#[tokio::test]
async fn a_hit_says_which_message_session_person_channel_and_time_it_is_with_its_score_and_the_index_lag()
 {
    let (app, fake) = app_with_models().await;
    conversations(
        &app,
        &[
            (phone(60), "the fire door on level two is broken".into()),
            (phone(61), "thanks, have a nice weekend".into()),
        ],
    )
    .await;
    embed_everything(&app, &fake).await;
    let key = app.api_key("ops", &["search:read"]).await;
    let (status, body) = get(
        &app,
        &key,
        "/api/v1/search",
        &[("q", "fire door broken"), ("agent", "reggie_oc")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["index_lag_s"], 0.0, "{body}");
    assert_eq!(body["messages_waiting"], 0, "{body}");
    assert_eq!(body["note"], Value::Null, "{body}");
    let row = app
        .log_rows()
        .await
        .into_iter()
        .find(|r| r.message == "the fire door on level two is broken")
        .expect("the message is logged");
    // The message and the agent's echo of it rank first (same words, same meaning).
    let top = hits(&body)
        .iter()
        .take(2)
        .find(|h| h["message_id"] == row.id.to_string())
        .unwrap_or_else(|| panic!("the message ranks in the first two: {body}"));
    assert_eq!(top["text"], row.message);
    assert_eq!(top["direction"], "inbound");
    assert_eq!(top["session_id"], row.session_id.to_string());
    assert_eq!(top["person_id"], format!("phone:{}", phone(60)));
    assert_eq!(top["agent"], "reggie_oc");
    assert_eq!(top["agent_identity"], "reggie");
    assert_eq!(top["channel"], "sms");
    assert!(
        top["at"].as_str().is_some_and(|t| t.starts_with("20")),
        "{top}"
    );
    assert!(top["score"].as_f64().is_some_and(|s| s > 0.0), "{top}");
    assert_eq!(
        (top["by_meaning"].as_bool(), top["by_words"].as_bool()),
        (Some(true), Some(true))
    );
    // The other person's thanks shares no word: found by (weak) meaning alone, it ranks below.
    let person_of = |h: &Value| h["person_id"].as_str().unwrap_or_default().to_string();
    assert_eq!(
        hits(&body)
            .iter()
            .take(2)
            .map(person_of)
            .collect::<Vec<_>>(),
        [
            format!("phone:{}", phone(60)),
            format!("phone:{}", phone(60))
        ],
        "{body}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_search_while_the_index_is_behind_says_so_even_when_it_finds_nothing() {
    let (app, fake) = app_with_models().await;
    conversations(&app, &[(phone(70), "my payslip is missing".into())]).await;
    embed_everything(&app, &fake).await;
    // The embedding worker is stopped: these are logged, not indexed.
    conversations(
        &app,
        &[
            (phone(71), "when is my next shift".into()),
            (phone(72), "the lift is broken".into()),
        ],
    )
    .await;
    let key = app.api_key("ops", &["search:read"]).await;
    for q in ["zebra crossing", "payslip"] {
        let (status, body) = get(&app, &key, "/api/v1/search", &[("q", q)]).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["messages_waiting"], 4, "{body}");
        assert!(body["index_lag_s"].as_f64().is_some(), "{body}");
        let note = body["note"].as_str().unwrap_or_default();
        assert!(
            note.contains("behind") && note.contains("4 messages"),
            "{q}: {body}"
        );
    }
    // Filtered to a person whose messages are all indexed, the index is not behind for them.
    let (_, mine) = get(
        &app,
        &key,
        "/api/v1/search",
        &[
            ("q", "payslip"),
            ("person", &format!("phone:{}", phone(70))),
        ],
    )
    .await;
    assert_eq!(mine["messages_waiting"], 0, "{mine}");
    assert_eq!(mine["note"], Value::Null, "{mine}");
    assert_eq!(
        hits(&mine).len(),
        2,
        "the payslip message and its echo: {mine}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn bad_search_parameters_are_refused_with_the_reason() {
    let (app, _fake) = app_with_models().await;
    let key = app.api_key("ops", &["search:read", "analytics:read"]).await;
    for (params, says) in [
        (vec![], "q"),
        (vec![("q", "  ")], "q"),
        (vec![("q", "x"), ("limit", "0")], "limit"),
        (vec![("q", "x"), ("limit", "101")], "limit"),
        (vec![("q", "x"), ("from", "yesterday")], "from"),
        (
            vec![("q", "x"), ("from", "2026-11-02"), ("to", "2026-11-01")],
            "from",
        ),
        (vec![("q", "x"), ("colour", "blue")], "colour"),
    ] {
        let (status, body) = get(&app, &key, "/api/v1/search", &params).await;
        assert_eq!(status, 400, "{params:?}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{params:?}: {body}");
    }
    let (status, body) = get(
        &app,
        &key,
        "/api/v1/analytics/categories",
        &[("to", "not a time")],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    app.shutdown().await;
}

#[tokio::test]
async fn search_and_analytics_need_their_own_scopes() {
    let (app, _fake) = app_with_models().await;
    let sessions_only = app.api_key("ops", &["sessions:read"]).await;
    let search_only = app.api_key("ops", &["search:read"]).await;
    let analytics_only = app.api_key("ops", &["analytics:read"]).await;
    let search = |key: String| {
        let app = &app;
        async move { get(app, &key, "/api/v1/search", &[("q", "shift")]).await.0 }
    };
    let analytics = |key: String| {
        let app = &app;
        async move { get(app, &key, "/api/v1/analytics/categories", &[]).await.0 }
    };
    assert_eq!(search(sessions_only.clone()).await, 403);
    assert_eq!(search(analytics_only.clone()).await, 403);
    assert_eq!(search(search_only.clone()).await, 200);
    assert_eq!(search("no-such-key".into()).await, 401);
    assert_eq!(analytics(sessions_only).await, 403);
    assert_eq!(analytics(search_only).await, 403);
    assert_eq!(analytics(analytics_only).await, 200);
    assert_eq!(analytics("no-such-key".into()).await, 401);
    app.shutdown().await;
}

/// The stored exchanges, once there are `n`.
async fn wait_for_exchanges(app: &TestApp, n: i64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.exchange_categories")
            .fetch_one(&app.db)
            .await
            .unwrap();
        if done >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {n} exchanges categorised"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn analytics_counts_exchanges_per_label_per_day_per_person_and_per_channel() {
    let (app, _fake) = app_with_models().await;
    conversations(
        &app,
        &[
            (phone(80), "when is my next shift".into()),
            (phone(81), "the lift is broken".into()),
        ],
    )
    .await;
    conversations(&app, &[(phone(80), "and the shift after that?".into())]).await;
    wait_for_exchanges(&app, 3).await;
    // One exchange of yesterday (moved back in time), which a range from today leaves out.
    sqlx::query(
        "UPDATE switchboard.messages SET created_at = now() - interval '1 day'
          WHERE id = (SELECT outbound_id FROM switchboard.exchange_categories
                       WHERE person_id = $1)",
    )
    .bind(format!("phone:{}", phone(81)))
    .execute(&app.db)
    .await
    .unwrap();
    let today = chrono::Utc::now().date_naive();
    let yesterday = today.pred_opt().unwrap();
    let key = app.api_key("ops", &["analytics:read"]).await;

    let (status, body) = get(&app, &key, "/api/v1/analytics/categories", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["per_day"],
        serde_json::json!([
            {"day": yesterday.to_string(), "label": "incident_report", "exchanges": 1},
            {"day": today.to_string(), "label": "roster_query", "exchanges": 2},
        ]),
        "{body}"
    );
    assert_eq!(
        body["per_person"][0],
        serde_json::json!({
            "person_id": format!("phone:{}", phone(80)),
            "exchanges": 2,
            "top_labels": [{"label": "roster_query", "exchanges": 2}],
        }),
        "{body}"
    );
    assert_eq!(
        body["per_channel"],
        serde_json::json!([{"channel": "sms", "exchanges": 3}])
    );

    let (_, from_today) = get(
        &app,
        &key,
        "/api/v1/analytics/categories",
        &[("from", &today.to_string())],
    )
    .await;
    assert_eq!(
        from_today["per_day"],
        serde_json::json!([{"day": today.to_string(), "label": "roster_query", "exchanges": 2}])
    );
    let (_, one_person) = get(
        &app,
        &key,
        "/api/v1/analytics/categories",
        &[("person", &format!("phone:{}", phone(81)))],
    )
    .await;
    assert_eq!(one_person["per_channel"][0]["exchanges"], 1, "{one_person}");
    let (_, other_agent) = get(
        &app,
        &key,
        "/api/v1/analytics/categories",
        &[("agent", "reggie_fd")],
    )
    .await;
    assert_eq!(
        other_agent["per_day"],
        serde_json::json!([]),
        "{other_agent}"
    );

    // The CLI answers the same.
    let out = app
        .cli(&[
            "analytics".as_ref(),
            "categories".as_ref(),
            "--json".as_ref(),
        ])
        .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(cli, body);
    app.shutdown().await;
}

// Multi-threaded: the CLI blocks this thread while it asks the fake model (served by this
// process) to embed the query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_searches_with_the_same_filters_and_says_how_far_behind_the_index_is() {
    let (app, fake) = app_with_models().await;
    conversations(
        &app,
        &[
            (phone(90), "when is my next shift".into()),
            (phone(91), "when is my next shift".into()),
        ],
    )
    .await;
    embed_everything(&app, &fake).await;
    let person = format!("phone:{}", phone(90));
    let out = app
        .cli(&[
            "search".as_ref(),
            "next shift".as_ref(),
            "--person".as_ref(),
            person.as_ref(),
            "--json".as_ref(),
        ])
        .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(hits(&body).len(), 2, "{body}");
    assert!(
        hits(&body)
            .iter()
            .all(|h| h["person_id"] == person.as_str())
    );
    assert_eq!(body["index_lag_s"], 0.0);

    let out = app.cli(&["search".as_ref(), "next shift".as_ref()]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.contains(&person) && table.contains("index lag: 0 s"),
        "{table}"
    );
    let bad = app
        .cli(&[
            "search".as_ref(),
            "x".as_ref(),
            "--limit".as_ref(),
            "500".as_ref(),
        ])
        .await;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("limit"));
    app.shutdown().await;
}
