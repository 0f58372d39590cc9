//! A human can step in: an exchange the categoriser labels `incident_report` or `escalation`
//! (`[escalation] labels`) raises an escalation once, announced on the public stream, counted,
//! listed oldest first with the person, the agent and the conversation, and acknowledged by an
//! operator, in the session's journal both times.
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard_e2e::{ChatClient, FakeAnswer, FakeModel, TestApp, spawn_app_configured};
use switchboard_escalate::store::{self, Raised};
use switchboard_kit::memory_config::LlmConfig;
use switchboard_kit::proto::SessionEscalated;

const WAIT: Duration = Duration::from_secs(30);
const ANA: &str = "+14155550631";
const CLEO: &str = "+14155550633";

/// The app, and the model that labels its exchanges (kept as long as the app).
async fn app_with_a_labelling_model() -> (TestApp, FakeModel) {
    let fake = FakeModel::start(64).await;
    fake.answer_with(|c| {
        FakeAnswer::Text(if c.user.contains("fire door") {
            "incident_report".into()
        } else if c.user.contains("manager") {
            "escalation".into()
        } else {
            "casual_chat".into()
        })
    });
    let llm = LlmConfig {
        base_url: fake.url.clone(),
        model: "fake-chat".into(),
        timeout_s: 5,
        ..Default::default()
    };
    let embedding = fake.embedding_config("fake-embed");
    let app = spawn_app_configured(move |c| {
        c.llm = llm;
        c.embedding = embedding;
    })
    .await;
    (app, fake)
}

/// `method path` on the gateway with `key`: the status and the JSON answer.
async fn call(app: &TestApp, method: reqwest::Method, key: &str, path: &str) -> (u16, Value) {
    let answer = reqwest::Client::new()
        .request(method, format!("{}{path}", app.gateway_url))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    (
        answer.status().as_u16(),
        answer.json().await.unwrap_or_default(),
    )
}

async fn get(app: &TestApp, key: &str, path: &str) -> (u16, Value) {
    call(app, reqwest::Method::GET, key, path).await
}

async fn acknowledge(app: &TestApp, key: &str, id: &str) -> (u16, Value) {
    let path = format!("/api/v1/escalations/{id}/acknowledge");
    call(app, reqwest::Method::POST, key, &path).await
}

/// The open escalations, once there are `n`.
async fn queue_of(app: &TestApp, key: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = get(app, key, "/api/v1/escalations").await;
        assert_eq!(status, 200, "{body}");
        let listed = body["escalations"].as_array().cloned().unwrap_or_default();
        if listed.len() >= n {
            return listed;
        }
        assert!(
            Instant::now() < deadline,
            "{n} escalations expected: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn escalated_events(app: &TestApp) -> Vec<SessionEscalated> {
    app.public_events("session.escalated").await
}

#[tokio::test]
async fn an_incident_texted_or_a_manager_asked_for_in_chat_is_escalated_once_and_acknowledged() {
    let (app, _model) = app_with_a_labelling_model().await;
    let reader = app.api_key("ops-desk", &["ops:read"]).await;
    let lead = app.api_key("nurse-lead", &["ops:read", "ops:write"]).await;

    app.text_answered(ANA, "the fire door is broken", 1).await;
    let mut chat = ChatClient::as_user(&app.gateway_url, "ben").await;
    chat.say("m-esc-1", "I want to speak to a manager").await;
    chat.reply(WAIT).await;
    app.text_answered(CLEO, "thanks, all good", 2).await;

    let queue = queue_of(&app, &reader, 2).await;
    app.settle().await;
    let (_, all) = get(&app, &reader, "/api/v1/escalations?status=all").await;
    assert_eq!(
        all["escalations"].as_array().unwrap().len(),
        2,
        "small talk escalates nothing: {all}"
    );
    // Oldest first: Ana's incident, then Ben's request.
    let (ana, ben) = (&queue[0], &queue[1]);
    assert_eq!(ana["label"], "incident_report", "{ana}");
    assert_eq!(ana["person_id"], format!("phone:{ANA}"));
    assert_eq!(ana["channel"], "sms");
    assert_eq!(ana["agent"], "reggie_oc");
    assert!(ana["acknowledged_at"].is_null());
    let said: Vec<(&str, &str)> = ana["last_messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["direction"].as_str().unwrap(),
                m["text"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        said,
        [
            ("inbound", "the fire door is broken"),
            ("outbound", "echo: the fire door is broken")
        ]
    );
    assert_eq!(ben["label"], "escalation", "{ben}");
    assert!(ben["person_id"].as_str().unwrap().contains("ben"), "{ben}");

    // Announced once each on the public stream, and counted.
    let events = escalated_events(&app).await;
    let mut labels: Vec<&str> = events.iter().map(|e| e.label.as_str()).collect();
    labels.sort();
    assert_eq!(labels, ["escalation", "incident_report"]);
    let ana_event = events
        .iter()
        .find(|e| e.label == "incident_report")
        .unwrap();
    assert_eq!(ana_event.escalation_id, ana["id"].as_str().unwrap());
    assert_eq!(ana_event.person_id, format!("phone:{ANA}"));
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"sb_escalations_raised_total{label="incident_report"} 1"#),
        "{metrics}"
    );

    // The same exchange again (a redelivered event) is the same escalation.
    let again = store::raise(
        &app.db,
        &store::NewEscalation {
            session_id: ana["session_id"].as_str().unwrap().parse().unwrap(),
            person_id: format!("phone:{ANA}"),
            agent_identity: "reggie".into(),
            channel: "sms".into(),
            label: "incident_report".into(),
            inbound_message_id: None,
            outbound_message_id: ana["outbound_message_id"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap(),
        },
    )
    .await
    .unwrap();
    assert!(matches!(again, Raised::Before(ref e) if e.id.to_string() == ana["id"]));

    // Acknowledging needs ops:write; it names who did it, once.
    let id = ana["id"].as_str().unwrap();
    let (status, body) = acknowledge(&app, &reader, id).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = acknowledge(&app, &lead, id).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["acknowledged_by"], "nurse-lead");
    let other = app.api_key("night-lead", &["ops:write"]).await;
    let (status, body) = acknowledge(&app, &other, id).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["acknowledged_by"], "nurse-lead", "the first stays");
    let (status, body) = acknowledge(&app, &lead, &uuid::Uuid::new_v4().to_string()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("escalation_not_found"))
    );

    let open = queue_of(&app, &reader, 1).await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0]["label"], "escalation");
    let (status, body) = get(&app, &reader, "/api/v1/escalations?status=maybe").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_status"))
    );

    // The session's journal says both.
    let journal: Vec<(String, Value)> = sqlx::query_as(
        "SELECT kind, detail FROM switchboard.session_events
          WHERE session_id = $1 AND kind LIKE 'escalat%' ORDER BY id",
    )
    .bind(
        ana["session_id"]
            .as_str()
            .unwrap()
            .parse::<uuid::Uuid>()
            .unwrap(),
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    let kinds: Vec<&str> = journal.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["escalated", "escalation_acknowledged"]);
    assert_eq!(journal[1].1["by"], "nurse-lead");
    app.shutdown().await;
}

#[tokio::test]
async fn console_an_escalation_heads_the_queue_with_the_conversation_and_is_acknowledged_there() {
    let (app, _model) = app_with_a_labelling_model().await;
    app.text_answered(ANA, "the fire door is broken", 1).await;
    let key = app
        .api_key(
            "ops-desk",
            &[
                "sessions:read",
                "search:read",
                "analytics:read",
                "ops:read",
                "ops:write",
            ],
        )
        .await;
    let raised = queue_of(&app, &key, 1).await;

    let browser = switchboard_e2e::browser::Browser::start("escalations_console").await;
    browser.goto(&format!("{}/console", app.admin_url)).await;
    browser.type_into("#login-key", &key).await;
    browser.click("#login-form button").await;
    let queue = browser
        .texts_until(
            "#escalations-list > li",
            "the escalation in the queue",
            |t| t.len() == 1 && t[0].contains("incident report"),
        )
        .await;
    assert!(queue[0].contains(&format!("phone:{ANA}")), "{queue:?}");
    assert!(queue[0].contains("the fire door is broken"), "{queue:?}");
    assert!(queue[0].contains("reggie_oc"), "{queue:?}");
    browser.screenshot("queue").await;

    // The conversation, with the escalation in its journal.
    browser.click("#escalations-list button.open").await;
    browser
        .texts_until("#transcript li.journal", "the journal entry", |t| {
            t.iter().any(|t| t.contains("escalated"))
        })
        .await;
    browser.screenshot("conversation").await;
    browser.click("#transcript-back").await;
    // From the queue straight to the conversation, taken over from the agent.
    browser
        .texts_until("#escalations-list > li", "the queue", |t| t.len() == 1)
        .await;
    browser.click("#escalations-list button.take-over").await;
    browser
        .texts_until("#takeover-state", "taken over from the queue", |t| {
            t.len() == 1 && t[0].starts_with("Taken over by ops-desk")
        })
        .await;
    browser.screenshot("taken_over").await;
    browser.click("#takeover-handback").await;
    browser
        .texts_until("#takeover-state", "handed back", |t| {
            t == ["The agent has this conversation."]
        })
        .await;
    browser.click("#transcript-back").await;
    browser
        .texts_until("#escalations-list > li", "the queue again", |t| {
            t.len() == 1 && t[0].contains("Acknowledge")
        })
        .await;

    browser.click("#escalations-list button.acknowledge").await;
    browser
        .texts_until("#escalations-list > li", "the queue emptied", |t| {
            t == ["No open escalations."]
        })
        .await;
    browser.screenshot("acknowledged").await;
    let (_, all) = get(&app, &key, "/api/v1/escalations?status=all").await;
    assert_eq!(all["escalations"][0]["id"], raised[0]["id"]);
    assert_eq!(
        all["escalations"][0]["acknowledged_by"], "ops-desk",
        "{all}"
    );
    browser.close().await;
    app.shutdown().await;
}
