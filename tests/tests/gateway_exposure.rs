//! What the gateway gives away or lets outlive its credential, tried from outside: a chat
//! socket is closed when its token expires, the public `/readyz` says nothing about the
//! database, and an API caller is an integration (`system`) in the prompt, not a user with
//! full authority.
use std::time::{Duration, Instant};

use futures::StreamExt;
use switchboard_e2e::{TestApp, chat_token, spawn_app};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_chat_socket_is_closed_when_its_token_expires() {
    let app = spawn_app().await;
    let exp = chrono::Utc::now().timestamp() + 2;
    let token = chat_token("short-lived", serde_json::json!({"exp": exp}));
    let url = format!(
        "{}/ws/chat?token={token}",
        app.gateway_url.replacen("http", "ws", 1)
    );
    let started = Instant::now();
    let (mut socket, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("a valid token connects");
    // Kept alive by the client (pongs are automatic); only the token's end may close it.
    let close = tokio::time::timeout(WAIT, async {
        while let Some(message) = socket.next().await {
            match message {
                Ok(Message::Close(frame)) => return frame,
                Ok(_) => continue,
                Err(e) => panic!("the socket failed instead of closing: {e}"),
            }
        }
        None
    })
    .await
    .expect("the socket is closed once its token expired");
    let frame = close.expect("a close frame saying why");
    assert_eq!(frame.code, CloseCode::from(4001), "{frame:?}");
    assert_eq!(frame.reason.as_str(), "token expired");
    let after = started.elapsed();
    assert!(
        after >= Duration::from_millis(900),
        "closed after {after:?}, before the token expired"
    );
    // The client reconnects with a fresh token; the expired one is refused.
    let refused =
        switchboard_e2e::ChatClient::connect(&app.gateway_url, &format!("token={token}")).await;
    if let Err(refusal) = refused {
        assert_eq!(refusal.status, 401);
    }
    app.shutdown().await;
}

/// A process whose database cannot be reached: its public `/readyz` says only "not ready";
/// the admin address says why.
#[tokio::test]
async fn the_public_readyz_tells_no_database_error() {
    let app = spawn_app().await;
    // The app's NATS connection (working), with a database that cannot be reached.
    let nats = app.js.client();
    let db = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://secret_user:hunter2@127.0.0.1:9/secret_db")
        .unwrap();
    let readiness = switchboard_kit::admin::Readiness { nats, db };
    let serve = |router: axum::Router| async move {
        let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        url
    };
    let public = serve(switchboard_kit::admin::health_router(readiness.clone())).await;
    let admin = serve(switchboard_kit::admin::router(readiness)).await;

    let answer = reqwest::get(format!("{public}/readyz")).await.unwrap();
    assert_eq!(answer.status(), 503);
    let body = answer.text().await.unwrap();
    assert_eq!(body, "not ready", "the public port says no more");
    for secret in ["postgres", "secret_user", "secret_db", "127.0.0.1", "error"] {
        assert!(!body.contains(secret), "{body:?} tells {secret:?}");
    }
    let answer = reqwest::get(format!("{admin}/readyz")).await.unwrap();
    assert_eq!(answer.status(), 503);
    let body = answer.text().await.unwrap();
    assert!(
        body.starts_with("postgres:"),
        "the operator sees why: {body:?}"
    );
}

async fn runner_prompt(app: &TestApp, containing: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(call) = app
            .runner
            .calls()
            .into_iter()
            .find(|c| c.prompt.contains(containing))
        {
            return call.prompt;
        }
        assert!(
            Instant::now() < deadline,
            "no runner call with {containing:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_api_caller_is_a_system_with_its_own_authority_not_a_user() {
    let app = spawn_app().await;
    let key = app.api_key("crm-sync", &["messages:write"]).await;
    let answer = app
        .post_api_message(&key, serde_json::json!({"text": "nightly sync done"}), None)
        .await;
    assert!(answer.status().is_success(), "{}", answer.status());
    let prompt = runner_prompt(&app, "nightly sync done").await;
    let authority = &app.config.prompt.authority;
    assert!(
        prompt.contains("| type system |"),
        "typed system (seed 000 §3.1):\n{prompt}"
    );
    assert!(
        prompt.contains(&format!("Authority (system): {}", authority["system"])),
        "{prompt}"
    );
    assert!(
        !prompt.contains(&authority["user"]),
        "an API key is not a user's full authority:\n{prompt}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_chat_token_still_opens_a_socket_before_it_expires() {
    // The expiry timer counts from the token's exp, not from the connection: a token with
    // ten minutes left keeps its socket.
    let app = spawn_app().await;
    let token = chat_token("long-lived", serde_json::json!({}));
    let mut client =
        switchboard_e2e::ChatClient::connect(&app.gateway_url, &format!("token={token}"))
            .await
            .expect("connects");
    client
        .send_frame(serde_json::json!({"type": "ping", "id": "p1"}))
        .await;
    let pong = client.until("pong", Duration::from_secs(5)).await;
    assert_eq!(pong.last().unwrap()["id"], "p1");
    tokio::time::sleep(Duration::from_secs(3)).await;
    client
        .send_frame(serde_json::json!({"type": "ping", "id": "p2"}))
        .await;
    let pong = client.until("pong", Duration::from_secs(5)).await;
    assert_eq!(pong.last().unwrap()["id"], "p2");
    app.shutdown().await;
}
