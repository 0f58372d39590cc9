//! The REST API (`POST /api/v1/messages`, `GET /api/v1/messages/<correlation id>`) with API keys
//! made by `switchboard api-keys create`.
use std::ffi::OsStr;
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_e2e::{TestApp, spawn_app};

const WAIT: Duration = Duration::from_secs(20);

async fn json_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}

/// Poll the message until it is no longer pending.
async fn answered(app: &TestApp, key: &str, correlation_id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, body) = json_of(app.get_api_message(key, correlation_id).await).await;
        assert_eq!(status, 200, "{body}");
        if body["status"] != "pending" || tokio::time::Instant::now() > deadline {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_caller_that_waits_gets_the_agents_reply_in_the_answer() {
    let app = spawn_app().await;
    let key = app.api_key("crm", &[]).await;
    assert!(key.starts_with("sb_"), "{key}");
    let (status, body) = json_of(
        app.post_api_message(
            &key,
            json!({"agent": "reggie_oc", "text": "order 1234 status?", "wait": true}),
            None,
        )
        .await,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "answered");
    assert_eq!(body["replies"][0]["text"], "echo: order 1234 status?");
    assert_eq!(body["replies"][0]["agent"], "reggie_oc");

    // The caller is the person api:<owner>, and the exchange is in the log like any other.
    app.settle().await;
    let calls = app.runner.calls();
    assert!(calls[0].prompt.contains("api:crm"), "{}", calls[0].prompt);
    let rows = app.log_rows().await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r.correlation_id == body["correlation_id"].as_str().unwrap())
    );
    app.shutdown().await;
}

#[tokio::test]
async fn without_wait_the_caller_gets_202_and_polls_for_the_reply() {
    let app = spawn_app().await;
    let key = app.api_key("crm", &[]).await;
    let response = app
        .post_api_message(&key, json!({"text": "hello"}), None)
        .await;
    let location = response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (status, body) = json_of(response).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "pending");
    let cid = body["correlation_id"].as_str().unwrap().to_string();
    assert_eq!(
        location.as_deref(),
        Some(&*format!("/api/v1/messages/{cid}"))
    );
    let done = answered(&app, &key, &cid).await;
    assert_eq!(done["status"], "answered");
    // The channel's default agent answered.
    assert_eq!(done["replies"][0]["agent"], "reggie_oc");
    assert_eq!(done["replies"][0]["text"], "echo: hello");
    app.shutdown().await;
}

#[tokio::test]
async fn a_retried_request_with_the_same_idempotency_key_is_one_turn() {
    let app = spawn_app().await;
    let key = app.api_key("crm", &[]).await;
    let first = json_of(
        app.post_api_message(
            &key,
            json!({"text": "charge once", "wait": true}),
            Some("req-7"),
        )
        .await,
    )
    .await
    .1;
    let second = json_of(
        app.post_api_message(
            &key,
            json!({"text": "charge once", "wait": true}),
            Some("req-7"),
        )
        .await,
    )
    .await
    .1;
    assert_eq!(first["correlation_id"], second["correlation_id"]);
    assert_eq!(second["status"], "answered");
    assert_eq!(first["replies"], second["replies"]);
    app.settle().await;
    assert_eq!(app.runner.calls().len(), 1);

    // Another owner may use the same key for their own message.
    let other = app.api_key("billing", &[]).await;
    let theirs = json_of(
        app.post_api_message(&other, json!({"text": "mine", "wait": true}), Some("req-7"))
            .await,
    )
    .await
    .1;
    assert_ne!(theirs["correlation_id"], first["correlation_id"]);
    assert_eq!(theirs["replies"][0]["text"], "echo: mine");
    app.shutdown().await;
}

#[tokio::test]
async fn keys_are_checked_scoped_revocable_and_never_shown_again() {
    let app = spawn_app().await;
    let key = app.api_key("crm", &[]).await;
    let reader = app.api_key("dashboard", &["messages:read"]).await;

    let code = |r: (u16, Value)| (r.0, r.1["error"]["code"].as_str().unwrap_or("").to_string());
    let hello = json!({"text": "hello"});
    assert_eq!(
        code(
            json_of(
                app.post_api_message("sb_not-a-key", hello.clone(), None)
                    .await
            )
            .await
        ),
        (401, "invalid_api_key".into())
    );
    let anonymous = reqwest::Client::new()
        .post(format!("{}/api/v1/messages", app.gateway_url))
        .json(&hello)
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(json_of(anonymous).await),
        (401, "invalid_api_key".into())
    );
    assert_eq!(
        code(json_of(app.post_api_message(&reader, hello.clone(), None).await).await),
        (403, "missing_scope".into())
    );
    assert_eq!(
        code(
            json_of(
                app.post_api_message(&key, json!({"text": "x", "agent": "nobody"}), None)
                    .await
            )
            .await
        ),
        (400, "unknown_agent".into())
    );
    assert_eq!(
        code(
            json_of(
                app.post_api_message(&key, json!({"words": "x"}), None)
                    .await
            )
            .await
        ),
        (400, "invalid_body".into())
    );
    app.assert_nothing_reached_the_pipeline().await;

    // One owner cannot read another's messages.
    let (_, sent) = json_of(app.post_api_message(&key, hello.clone(), None).await).await;
    let cid = sent["correlation_id"].as_str().unwrap();
    assert_eq!(
        code(json_of(app.get_api_message(&reader, cid).await).await),
        (404, "not_found".into())
    );

    // The list shows who and what, never the key.
    let list = app.cli(&[OsStr::new("api-keys"), OsStr::new("list")]).await;
    let listed = String::from_utf8(list.stdout).unwrap();
    assert!(
        listed.contains("crm") && listed.contains("dashboard"),
        "{listed}"
    );
    assert!(
        !listed.contains(&key) && !listed.contains(&key[10..]),
        "{listed}"
    );
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT key_hash FROM switchboard.api_keys")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert!(stored.iter().all(|h| {
        h.len() == 32
            && !h
                .windows(8)
                .any(|w| key.as_bytes().windows(8).any(|k| k == w))
    }));

    // Revoked: refused at once.
    let id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM switchboard.api_keys WHERE owner = 'crm'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    let revoke = app
        .cli(&[
            OsStr::new("api-keys"),
            OsStr::new("revoke"),
            OsStr::new(&id.to_string()),
        ])
        .await;
    assert!(
        revoke.status.success(),
        "{}",
        String::from_utf8_lossy(&revoke.stderr)
    );
    assert_eq!(
        code(json_of(app.post_api_message(&key, hello, None).await).await),
        (401, "invalid_api_key".into())
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_turn_that_fails_for_good_is_reported_failed_not_pending_forever() {
    let app = spawn_app().await;
    let key = app.api_key("crm", &[]).await;
    app.runner.fail_next(100, 400);
    let (status, body) = json_of(
        app.post_api_message(&key, json!({"text": "doomed"}), None)
            .await,
    )
    .await;
    assert_eq!(status, 202);
    let cid = body["correlation_id"].as_str().unwrap();
    let done = answered(&app, &key, cid).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert!(
        done["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{done}"
    );
    app.shutdown().await;
}
