//! A human can step in: an operator takes a person's conversation over (the agent is paused:
//! the person's messages are logged and not sent to it), replies on the person's own channel
//! (sent once, after the replies before it), and hands it back: the agent answers what the
//! operator left unanswered and is told, once, what was said meanwhile. The takeover is kept
//! in the database, so it holds across gateway and dispatcher restarts.
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchboard_e2e::{
    AppOptions, ChatClient, FakeRunner, TestApp, spawn_app, spawn_app_configured, spawn_app_with,
};
use switchboard_kit::proto::{SessionHandedBack, SessionTakenOver};

const WAIT: Duration = Duration::from_secs(30);
const ANA: &str = "+14155550741";

/// `method path` on `base` with `key` (and a JSON body, an Idempotency-Key): status, answer.
async fn call(
    base: &str,
    method: reqwest::Method,
    key: &str,
    path: &str,
    body: Option<Value>,
    idempotency: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    if let Some(k) = idempotency {
        request = request.header("Idempotency-Key", k);
    }
    let answer = request.send().await.unwrap();
    (
        answer.status().as_u16(),
        answer.json().await.unwrap_or_default(),
    )
}

async fn get(base: &str, key: &str, path: &str) -> (u16, Value) {
    call(base, reqwest::Method::GET, key, path, None, None).await
}

async fn post(base: &str, key: &str, path: &str) -> (u16, Value) {
    call(base, reqwest::Method::POST, key, path, None, None).await
}

async fn operator_reply(base: &str, key: &str, session: &str, text: &str, k: &str) -> (u16, Value) {
    let path = format!("/api/v1/sessions/{session}/replies");
    let body = Some(json!({ "text": text }));
    call(base, reqwest::Method::POST, key, &path, body, Some(k)).await
}

/// The session of `person` (else the newest), as the sessions API lists it.
async fn session_of(app: &TestApp, key: &str, person: Option<&str>) -> String {
    let path = match person {
        Some(p) => format!("/api/v1/sessions?person={}", p.replace('+', "%2B")),
        None => "/api/v1/sessions".to_string(),
    };
    let (status, body) = get(&app.gateway_url, key, &path).await;
    assert_eq!(status, 200, "{body}");
    body["sessions"][0]["id"]
        .as_str()
        .expect("a session")
        .to_string()
}

/// The session's journal kinds, once `kind` appears `n` times.
async fn journal_once(app: &TestApp, key: &str, session: &str, kind: &str, n: usize) -> Vec<Value> {
    let path = format!("/api/v1/sessions/{session}/events?limit=500");
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = get(&app.gateway_url, key, &path).await;
        assert_eq!(status, 200, "{body}");
        let events = body["events"].as_array().cloned().unwrap_or_default();
        if events.iter().filter(|e| e["kind"] == kind).count() >= n {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "{n} {kind} entries expected: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn kinds_of(events: &[Value], wanted: &[&str]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .filter(|k| wanted.contains(k))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn an_operator_takes_an_sms_conversation_over_answers_and_hands_it_back_across_restarts() {
    let app = spawn_app_with(AppOptions::dispatch_as_processes()).await;
    let mut dispatcher = app.spawn_worker("dispatch");
    let lead = app
        .api_key("nora", &["ops:read", "ops:write", "sessions:read"])
        .await;
    let other = app.api_key("omar", &["ops:read", "ops:write"]).await;
    let reader = app.api_key("watcher", &["ops:read"]).await;

    app.text_answered(ANA, "hi", 1).await;
    let session = session_of(&app, &lead, Some(&format!("phone:{ANA}"))).await;

    // The operator's requests go through a gateway process of their own, restarted midway.
    let (mut gateway, ops) = app.spawn_gateway_process().await;
    let takeover = format!("/api/v1/sessions/{session}/takeover");
    let (status, body) = post(&ops, &reader, &takeover).await;
    assert_eq!(status, 403, "a reader cannot take over: {body}");
    let (status, taken) = post(&ops, &lead, &takeover).await;
    assert_eq!(status, 201, "{taken}");
    assert_eq!(taken["taken_by"], "nora");
    let (status, again) = post(&ops, &lead, &takeover).await;
    assert_eq!((status, &again["id"]), (200, &taken["id"]), "{again}");
    let (status, refused) = post(&ops, &other, &takeover).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "taken_over");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nora"),
        "says who has it: {refused}"
    );

    // The person writes: logged, held, not given to the agent, not answered by it.
    assert_eq!(app.send_sms(ANA, "is anyone there?").await.status(), 200);
    journal_once(&app, &lead, &session, "held", 1).await;
    assert_eq!(app.runner.calls().len(), 1, "the agent is paused");

    // Both restart: the takeover is the database's, not a process's.
    dispatcher.kill().await.ok();
    gateway.kill().await.ok();
    let mut dispatcher = app.spawn_worker("dispatch");
    let (mut gateway, ops) = app.spawn_gateway_process().await;

    let (status, sent) = operator_reply(
        &ops,
        &lead,
        &session,
        "Hi Ana, Nora here from the desk.",
        "r-1",
    )
    .await;
    assert_eq!(status, 202, "{sent}");
    assert_eq!(sent["channel"], "sms");
    // The same Idempotency-Key is the same message: sent once.
    let (status, again) = operator_reply(
        &ops,
        &lead,
        &session,
        "Hi Ana, Nora here from the desk.",
        "r-1",
    )
    .await;
    assert_eq!((status, &again["message_id"]), (202, &sent["message_id"]));
    let texts = app.wait_for_sms(2, WAIT).await;
    assert_eq!(texts[1].to, ANA);
    assert_eq!(texts[1].body, "Hi Ana, Nora here from the desk.");

    assert_eq!(app.send_sms(ANA, "my shift tomorrow?").await.status(), 200);
    journal_once(&app, &lead, &session, "held", 2).await;
    assert_eq!(
        app.runner.calls().len(),
        1,
        "still paused after the restarts"
    );

    let handback = format!("/api/v1/sessions/{session}/handback");
    let (status, back) = post(&ops, &lead, &handback).await;
    assert_eq!(status, 200, "{back}");
    assert_eq!(back["held"], 2, "{back}");
    assert_eq!(
        back["agent_answers"], true,
        "the last message was not answered: {back}"
    );
    assert_eq!(back["takeover"]["ended_by"], "nora");

    // The agent answers what was left, told what happened meanwhile.
    let texts = app.wait_for_sms(3, WAIT).await;
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2, "one agent turn for the hand-back");
    let prompt = &calls[1].prompt;
    assert!(prompt.contains("Hand-back:"), "{prompt}");
    for said in [
        "person: is anyone there?",
        "operator nora: Hi Ana, Nora here from the desk.",
        "person: my shift tomorrow?",
    ] {
        assert!(prompt.contains(said), "{said:?} retold: {prompt}");
    }
    assert_eq!(texts[2].body, format!("echo: {}", FakeRunner::said(prompt)));

    // Handed back once: the agent answers the next message, and is not told again.
    let (status, again) = post(&ops, &lead, &handback).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["held"], Value::Null, "unchanged: {again}");
    app.text_answered(ANA, "thanks", 4).await;
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 3);
    assert!(!calls[2].prompt.contains("HANDOVER"), "{}", calls[2].prompt);
    app.settle().await;
    let sent: Vec<String> = app.twilio.sent().into_iter().map(|s| s.body).collect();
    assert_eq!(sent.len(), 4, "each reply sent once: {sent:?}");

    // The journal tells the story, with the operator's login.
    let events = journal_once(&app, &lead, &session, "handback", 1).await;
    assert_eq!(
        kinds_of(&events, &["takeover", "held", "operator_reply", "handback"]),
        ["takeover", "held", "operator_reply", "held", "handback"]
    );
    let by = |kind: &str| {
        events
            .iter()
            .find(|e| e["kind"] == kind)
            .map(|e| e["detail"]["by"].clone())
    };
    assert_eq!(by("takeover"), Some(json!("nora")));
    assert_eq!(by("operator_reply"), Some(json!("nora")));
    // The log keeps whose reply it was.
    let operator: Option<String> = sqlx::query_scalar(
        "SELECT metadata->>'operator' FROM switchboard.messages
          WHERE direction = 'outbound' AND message = 'Hi Ana, Nora here from the desk.'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(operator.as_deref(), Some("nora"));
    // Announced on the public stream, once each, for analytics.
    let taken: Vec<SessionTakenOver> = app.public_events("session.taken_over").await;
    let back: Vec<SessionHandedBack> = app.public_events("session.handed_back").await;
    assert_eq!((taken.len(), back.len()), (1, 1), "{taken:?} {back:?}");
    assert_eq!(taken[0].session_id, session);
    assert_eq!(taken[0].person_id, format!("phone:{ANA}"));
    assert_eq!(taken[0].taken_by, "nora");
    assert_eq!((back[0].held, back[0].agent_answers), (2, true));
    assert_eq!(back[0].handed_back_by, "nora");
    assert_eq!(back[0].takeover_id, taken[0].takeover_id);

    dispatcher.kill().await.ok();
    gateway.kill().await.ok();
    app.shutdown().await;
}

#[tokio::test]
async fn an_operator_answers_a_chat_and_the_agent_learns_of_it_at_its_next_turn() {
    let app = spawn_app().await;
    let lead = app
        .api_key("nora", &["ops:read", "ops:write", "sessions:read"])
        .await;
    let base = app.gateway_url.clone();
    let mut chat = ChatClient::as_user(&base, "ben").await;
    chat.say("m-1", "hello").await;
    chat.reply(WAIT).await;
    let session = session_of(&app, &lead, None).await;

    let (status, body) = operator_reply(&base, &lead, &session, "too early", "x").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "not_taken_over");
    let (status, body) = post(
        &base,
        &lead,
        &format!("/api/v1/sessions/{session}/handback"),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("not_taken_over"))
    );
    let (status, body) = post(
        &base,
        &lead,
        &format!("/api/v1/sessions/{}/takeover", uuid::Uuid::now_v7()),
    )
    .await;
    assert_eq!(status, 404, "{body}");

    let (status, _) = post(
        &base,
        &lead,
        &format!("/api/v1/sessions/{session}/takeover"),
    )
    .await;
    assert_eq!(status, 201);
    chat.say("m-2", "can a person help me?").await;
    journal_once(&app, &lead, &session, "held", 1).await;
    let (status, _) = operator_reply(&base, &lead, &session, "Yes, Nora here.", "r-1").await;
    assert_eq!(status, 202);
    let frame = chat.reply(WAIT).await;
    assert_eq!(frame["text"], "Yes, Nora here.", "{frame}");
    assert_eq!(app.runner.calls().len(), 1, "the agent was not called");

    // Everything the person wrote was answered: the agent gets no turn of its own.
    let (status, back) = post(
        &base,
        &lead,
        &format!("/api/v1/sessions/{session}/handback"),
    )
    .await;
    assert_eq!(status, 200, "{back}");
    assert_eq!(
        (&back["held"], &back["agent_answers"]),
        (&json!(1), &json!(false))
    );
    app.settle().await;
    assert_eq!(app.runner.calls().len(), 1, "no turn for the agent");

    // Its next turn tells it what was said meanwhile.
    chat.say("m-3", "thanks, and one more thing").await;
    chat.reply(WAIT).await;
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2);
    let prompt = &calls[1].prompt;
    assert!(prompt.contains("HANDOVER-"), "{prompt}");
    assert!(prompt.contains("person: can a person help me?"), "{prompt}");
    assert!(
        prompt.contains("operator nora: Yes, Nora here."),
        "{prompt}"
    );
    assert_eq!(FakeRunner::said(prompt), "thanks, and one more thing");
    // Counted where an operator looks.
    let metrics = app.metrics().await;
    for counted in [
        "sb_takeovers_total 1",
        "sb_operator_replies_total 1",
        "sb_handbacks_total 1",
        "sb_dispatch_held_turns_total 1",
    ] {
        assert!(metrics.contains(counted), "{counted}: {metrics}");
    }
    app.shutdown().await;
}

#[tokio::test]
async fn an_operator_steps_in_from_a_terminal_and_the_person_is_told_once() {
    const CLEO: &str = "+14155550742";
    const NOTICE: &str = "A person from the desk has joined this conversation.";
    let app = spawn_app_configured(|c| c.escalation.takeover_notice = NOTICE.into()).await;
    let reader = app.api_key("watcher", &["sessions:read"]).await;
    app.text_answered(CLEO, "hello", 1).await;
    let session = session_of(&app, &reader, Some(&format!("phone:{CLEO}"))).await;

    let taken = app
        .cli_json(&["sessions", "takeover", &session, "--json"])
        .await;
    let by = taken["taken_by"].as_str().unwrap().to_string();
    assert!(by.starts_with("cli:"), "{taken}");
    // Told once, though the take is repeated (as a caller whose answer was lost would).
    let again = app
        .cli_json(&["sessions", "takeover", &session, "--json"])
        .await;
    assert_eq!(again["id"], taken["id"]);
    let texts = app.wait_for_sms(2, WAIT).await;
    assert_eq!(
        (texts[1].to.as_str(), texts[1].body.as_str()),
        (CLEO, NOTICE)
    );
    assert_eq!(app.send_sms(CLEO, "are you a bot?").await.status(), 200);
    journal_once(&app, &reader, &session, "held", 1).await;
    let sent = app
        .cli_json(&["sessions", "reply", &session, "No, a person.", "--json"])
        .await;
    assert_eq!(sent["channel"], "sms", "{sent}");
    let texts = app.wait_for_sms(3, WAIT).await;
    assert_eq!(
        (texts[2].to.as_str(), texts[2].body.as_str()),
        (CLEO, "No, a person.")
    );
    let back = app
        .cli_json(&["sessions", "handback", &session, "--json"])
        .await;
    assert_eq!(
        (&back["held"], &back["agent_answers"]),
        (&json!(1), &json!(false)),
        "{back}"
    );
    assert_eq!(back["takeover"]["ended_by"], by.as_str());
    app.settle().await;
    assert_eq!(
        app.twilio.sent().len(),
        3,
        "the notice and the reply once each"
    );
    assert_eq!(
        app.runner.calls().len(),
        1,
        "the agent was never called meanwhile"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn console_an_operator_takes_over_replies_and_hands_back_in_the_transcript() {
    const DINA: &str = "+14155550743";
    let app = spawn_app().await;
    app.text_answered(DINA, "hello", 1).await;
    let key = app
        .api_key("ops-desk", &["sessions:read", "ops:read", "ops:write"])
        .await;

    let browser = switchboard_e2e::browser::Browser::start("takeover_console").await;
    browser.goto(&format!("{}/console", app.admin_url)).await;
    browser.type_into("#login-key", &key).await;
    browser.click("#login-form button").await;
    browser
        .texts_until("#sessions-table tbody tr", "the session", |t| {
            t.iter().any(|r| r.contains(DINA))
        })
        .await;
    browser.click("#sessions-table tbody tr").await;
    browser
        .texts_until("#takeover-state", "the agent has it", |t| {
            t == ["The agent has this conversation."]
        })
        .await;
    browser.screenshot("agent").await;

    browser.click("#takeover-take").await;
    browser
        .texts_until("#takeover-state", "taken over", |t| {
            t.len() == 1 && t[0].starts_with("Taken over by ops-desk")
        })
        .await;
    // The person writes: shown live, held for the operator.
    assert_eq!(app.send_sms(DINA, "is there a person?").await.status(), 200);
    browser
        .texts_until("#transcript li", "the message and its hold", |t| {
            t.iter().any(|l| l.contains("is there a person?"))
                && t.iter().any(|l| l.contains("held"))
        })
        .await;
    browser.screenshot("taken_over").await;
    assert_eq!(app.runner.calls().len(), 1, "the agent is paused");

    browser.type_into("#takeover-text", "Yes, Nora here.").await;
    browser.click("#takeover-reply button").await;
    let texts = app.wait_for_sms(2, WAIT).await;
    assert_eq!(
        (texts[1].to.as_str(), texts[1].body.as_str()),
        (DINA, "Yes, Nora here.")
    );
    browser
        .texts_until("#transcript li.operator", "the operator's reply", |t| {
            t.iter()
                .any(|l| l.contains("operator ops-desk") && l.contains("Yes, Nora here."))
        })
        .await;
    browser.screenshot("replied").await;

    browser.click("#takeover-handback").await;
    browser
        .texts_until("#takeover-state", "handed back", |t| {
            t == ["The agent has this conversation."]
        })
        .await;
    browser
        .texts_until("#transcript li.journal", "the hand-back", |t| {
            t.iter()
                .any(|l| l.contains("handback") && l.contains("by: ops-desk"))
        })
        .await;
    browser.screenshot("handed_back").await;
    app.settle().await;
    assert_eq!(
        app.twilio.sent().len(),
        2,
        "the reply went once; nothing was left for the agent"
    );
    browser.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_hand_back_whose_gateway_died_before_publishing_still_gives_the_agent_its_turn() {
    const EVA: &str = "+14155550744";
    let app = spawn_app().await;
    let lead = app
        .api_key("nora", &["sessions:read", "ops:read", "ops:write"])
        .await;
    app.text_answered(EVA, "hello", 1).await;
    let session = session_of(&app, &lead, Some(&format!("phone:{EVA}"))).await;
    let path = format!("/api/v1/sessions/{session}/takeover");
    assert_eq!(post(&app.gateway_url, &lead, &path).await.0, 201);
    assert_eq!(app.send_sms(EVA, "still there?").await.status(), 200);
    journal_once(&app, &lead, &session, "held", 1).await;

    // The hand-back commits, and its gateway dies before publishing the agent's turn.
    let id: uuid::Uuid = session.parse().unwrap();
    let back = switchboard_kit::takeovers::hand_back(&app.db, id, "nora")
        .await
        .unwrap();
    let switchboard_kit::takeovers::HandedBack::Now { takeover, held } = back else {
        panic!("handed back now: {back:?}");
    };
    assert_eq!(held, 1);
    assert!(
        takeover.handback_input.is_some(),
        "the person waits for an answer"
    );

    // A gateway finds it stranded and publishes it: the agent answers, once.
    let texts = app.wait_for_sms(2, Duration::from_secs(45)).await;
    assert_eq!(texts[1].to, EVA);
    assert!(
        texts[1].body.starts_with("echo: The operator handed"),
        "{}",
        texts[1].body
    );
    let (_, shown) = get(&app.gateway_url, &lead, &path).await;
    assert!(
        shown["takeover"]["handback_published_at"].is_string(),
        "{shown}"
    );
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 2, "published once");
    assert_eq!(app.runner.calls().len(), 2);
    app.shutdown().await;
}
