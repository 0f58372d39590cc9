//! Memory as the agent's tools: each runner call carries a short-lived token scoped to that
//! turn's person, identity and session (`turn_token` in the `/run` body, with the API's URL).
//! With it the agent searches that person's history, reads and writes their curated memory,
//! reads their sessions and sends them a follow-up, and nothing about anyone else.
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use switchboard_e2e::{AppOptions, FakeModel, TestApp, spawn_app_with};
use switchboard_kit::turn_token::{TurnClaims, TurnTokens};

const WAIT: Duration = Duration::from_secs(30);
const ALICE: &str = "+14155550181";
const BOB: &str = "+14155550182";

/// An app whose embedder is the fake OpenAI-compatible server (search ranks by meaning too).
async fn app() -> (TestApp, FakeModel) {
    let fake = FakeModel::start(64).await;
    let embedding = fake.embedding_config("fake-embed");
    let app = spawn_app_with(AppOptions::default().configured(move |c| {
        c.embedding = embedding;
    }))
    .await;
    (app, fake)
}

/// `phone` texts `text`; the turn's token, as the runner's `/run` body carried it.
async fn text_and_take_token(app: &TestApp, phone: &str, text: &str, answers: usize) -> String {
    assert_eq!(app.send_sms(phone, text).await.status(), 200);
    app.wait_for_sms(answers, WAIT).await;
    app.settle().await;
    let call = app
        .runner
        .calls()
        .into_iter()
        .rfind(|c| c.prompt.contains(text))
        .expect("the message reached the agent");
    assert_eq!(
        call.api_url.as_deref(),
        Some(app.config.gateway.public_url.trim_end_matches('/')),
        "the body says where the API is"
    );
    let token = call.turn_token.expect("the /run body carries a turn token");
    assert!(token.starts_with("sbt_"), "{token}");
    token
}

async fn session_of(app: &TestApp, person: &str) -> String {
    let id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM switchboard.sessions WHERE person_id = $1")
            .bind(person)
            .fetch_one(&app.db)
            .await
            .unwrap();
    id.to_string()
}

#[tokio::test]
async fn with_its_turn_token_the_agent_reads_and_writes_the_persons_memory_searches_their_history_and_sends_them_a_follow_up()
 {
    let (app, _fake) = app().await;
    let token = text_and_take_token(&app, ALICE, "my locker code is 3141", 1).await;
    let alice = format!("phone:{ALICE}");

    // Memory: written and read back, as the agent's own edit, with the token's identity.
    let memory = format!("/api/v1/people/{alice}/memory");
    let (status, body) = app
        .call_api(
            &token,
            Method::PUT,
            &memory,
            Some(json!({"body": "- locker code 3141"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["identity"], "reggie");
    assert_eq!(body["updated_by"], "agent:reggie_oc");
    let (status, body) = app.call_api(&token, Method::GET, &memory, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["body"], "- locker code 3141");

    // Search: the person's own history.
    let (status, body) = app
        .call_api(&token, Method::GET, "/api/v1/search?q=locker%20code", None)
        .await;
    assert_eq!(status, 200, "{body}");
    let hits = body["hits"].as_array().expect("hits");
    assert!(
        hits.iter()
            .any(|h| h["text"].as_str().unwrap_or("").contains("3141")),
        "{body}"
    );

    // The person's session.
    let session = session_of(&app, &alice).await;
    let (status, body) = app
        .call_api(
            &token,
            Method::GET,
            &format!("/api/v1/sessions/{session}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["person"]["id"], alice, "{body}");

    // A follow-up: it reaches them by SMS, from the turn's agent.
    let (status, body) = app
        .call_api(
            &token,
            Method::POST,
            "/api/v1/outbound",
            Some(json!({"person_id": alice, "text": "Your locker is ready."})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let sent = app.wait_for_sms(2, WAIT).await;
    assert_eq!(sent[1].body, "Your locker is ready.");
    assert_eq!(sent[1].to, ALICE);
}

#[tokio::test]
async fn with_the_token_of_one_persons_turn_another_persons_messages_memory_and_sessions_are_refused()
 {
    let (app, _fake) = app().await;
    let alice_token = text_and_take_token(&app, ALICE, "hello from alice", 1).await;
    text_and_take_token(&app, BOB, "my bank pin is 2718", 2).await;
    let bob = format!("phone:{BOB}");
    let alice = format!("phone:{ALICE}");
    let writer = app.api_key("ops", &["memory:write"]).await;
    let (status, _) = app
        .call_api(
            &writer,
            Method::PUT,
            &format!("/api/v1/people/{bob}/memory?identity=reggie"),
            Some(json!({"body": "- bank pin 2718"})),
        )
        .await;
    assert_eq!(status, 200);
    let refused = |(status, body): (u16, Value), what: &str| {
        assert_eq!(status, 403, "{what}: {body}");
        assert!(
            body.to_string().contains("turn"),
            "{what}: the reason is given: {body}"
        );
    };

    // Bob's messages: asked for by name, refused; searched for without a name, not found.
    let get = |path: String| {
        let (app, token) = (&app, &alice_token);
        async move { app.call_api(token, Method::GET, &path, None).await }
    };
    refused(
        get(format!("/api/v1/search?q=bank%20pin&person={bob}")).await,
        "searching Bob's messages",
    );
    refused(
        get("/api/v1/search?q=bank%20pin&identity=reggie_other".into()).await,
        "searching another identity's messages",
    );
    let (status, body) = get("/api/v1/search?q=bank%20pin%202718".into()).await;
    assert_eq!(status, 200, "{body}");
    let hits = body["hits"].as_array().expect("hits");
    assert!(
        hits.iter().all(|h| h["person_id"] == alice.as_str()),
        "Bob's messages were found with Alice's token: {body}"
    );

    // Bob's memory: neither read nor written.
    let bob_memory = format!("/api/v1/people/{bob}/memory");
    refused(get(bob_memory.clone()).await, "reading Bob's memory");
    refused(
        get(format!("{bob_memory}?identity=reggie")).await,
        "reading Bob's memory by identity",
    );
    refused(
        app.call_api(
            &alice_token,
            Method::PUT,
            &format!("{bob_memory}?identity=reggie"),
            Some(json!({"body": "- overwritten"})),
        )
        .await,
        "writing Bob's memory",
    );

    // Bob's sessions, and the list of everyone's.
    let bob_session = session_of(&app, &bob).await;
    refused(
        get(format!("/api/v1/sessions/{bob_session}")).await,
        "reading Bob's session",
    );
    refused(
        get(format!("/api/v1/sessions/{bob_session}/messages")).await,
        "reading Bob's conversation",
    );
    refused(
        get(format!("/api/v1/sessions?person={bob}")).await,
        "listing sessions",
    );
    refused(
        get(format!("/api/v1/sessions/{bob_session}/export")).await,
        "exporting Bob's conversation",
    );

    // A message to Bob.
    refused(
        app.call_api(
            &alice_token,
            Method::POST,
            "/api/v1/outbound",
            Some(json!({"person_id": bob, "text": "hi Bob"})),
        )
        .await,
        "writing to Bob",
    );

    // What no turn may do, even about its own person.
    refused(
        get("/api/v1/analytics/categories".into()).await,
        "reading analytics",
    );
    refused(
        app.call_api(
            &alice_token,
            Method::DELETE,
            &format!("/api/v1/people/{alice}"),
            None,
        )
        .await,
        "forgetting a person",
    );

    // Bob's memory is as the operator left it, and Bob got no message but his answer.
    let kept: String = sqlx::query_scalar(
        "SELECT body FROM switchboard.memories WHERE person_id = $1 AND agent_identity = 'reggie'",
    )
    .bind(&bob)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(kept, "- bank pin 2718");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let to_bob = app
        .twilio
        .sent()
        .into_iter()
        .filter(|s| s.to == BOB)
        .count();
    assert_eq!(to_bob, 1);
}

#[tokio::test]
async fn an_expired_turn_token_and_one_with_a_changed_character_are_refused_with_401() {
    let (app, _fake) = app().await;
    let token = text_and_take_token(&app, ALICE, "hello", 1).await;
    let alice = format!("phone:{ALICE}");
    let memory = format!("/api/v1/people/{alice}/memory");
    let (status, body) = app
        .call_api(&token, Method::GET, "/api/v1/search?q=hello", None)
        .await;
    assert_eq!(status, 200, "the token as issued works: {body}");

    // One character of the signature changed.
    let mut chars: Vec<char> = token.chars().collect();
    let at = token.rfind('.').unwrap() + 5;
    chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
    let altered: String = chars.into_iter().collect();
    let (status, body) = app.call_api(&altered, Method::GET, &memory, None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "invalid_turn_token", "{body}");

    // Signed with the deployment's key, for this very person, but past its time.
    let tokens = TurnTokens::load(&app.db, &app.config.gateway.turn_token_secret)
        .await
        .unwrap();
    let mut claims = TurnClaims::for_turn(
        &alice,
        "reggie",
        "reggie_oc",
        &session_of(&app, &alice).await,
        "c",
        60,
    );
    let now = chrono::Utc::now().timestamp() as u64;
    claims.iat = now - 3_600;
    claims.exp = now - 600;
    let expired = tokens.mint(&claims);
    let (status, body) = app.call_api(&expired, Method::GET, &memory, None).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("expired"),
        "{body}"
    );
    // The same claims, still in time, are accepted: it was the time that was refused.
    claims.exp = now + 600;
    let (status, body) = app
        .call_api(&tokens.mint(&claims), Method::GET, &memory, None)
        .await;
    assert_ne!(status, 401, "{body}");
}
