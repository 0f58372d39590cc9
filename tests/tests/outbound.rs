//! Messages an agent starts (`POST /api/v1/outbound`, scope `outbound:write`): they reach the
//! person on the channel they used last (or the one named), are logged as outbound, and keep
//! their place among the session's replies.
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_e2e::{ChatClient, TestApp, spawn_app};

const WAIT: Duration = Duration::from_secs(20);
/// Long enough for a message sent out of turn to have gone out.
const QUIET: Duration = Duration::from_millis(1_500);
const PHONE: &str = "+14155550161";

async fn post_outbound(
    app: &TestApp,
    key: &str,
    body: Value,
    idempotency_key: Option<&str>,
) -> (u16, Value) {
    let response = app.post_api("outbound", key, body, idempotency_key).await;
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}

/// Poll the message until it is no longer pending.
async fn settled_status(app: &TestApp, key: &str, correlation_id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let response = app.get_api_message(key, correlation_id).await;
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        if body["status"] != "pending" || tokio::time::Instant::now() > deadline {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A person who has texted once and been answered.
async fn texted_once(app: &TestApp) {
    assert_eq!(app.send_sms(PHONE, "hi there").await.status(), 200);
    app.wait_for_sms(1, WAIT).await;
    // The way back is read from the inbound log row, written beside the reply, not before it.
    app.settle().await;
}

#[tokio::test]
async fn an_agent_started_message_reaches_the_person_by_sms_and_is_logged_as_outbound() {
    let app = spawn_app().await;
    texted_once(&app).await;
    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let person = format!("phone:{PHONE}");
    let (status, body) = post_outbound(
        &app,
        &key,
        json!({"person_id": person, "agent": "reggie_oc", "text": "Your appointment is at 3pm."}),
        None,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "pending");
    assert_eq!(body["channel"], "sms");
    let cid = body["correlation_id"].as_str().unwrap().to_string();

    // Exactly that text, to their number, from ours.
    let sent = app.wait_for_sms(2, WAIT).await;
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].body, "Your appointment is at 3pm.");
    assert_eq!(sent[1].to, PHONE);
    assert_eq!(sent[1].from, app.config.twilio.from_number);
    // Polled, it is answered once it went out.
    let status = settled_status(&app, &key, &cid).await;
    assert_eq!(status["status"], "answered", "{status}");
    assert_eq!(status["replies"][0]["text"], "Your appointment is at 3pm.");

    app.settle().await;
    // The runner answered the person's text only; the agent's message is not a turn it ran.
    assert_eq!(app.runner.calls().len(), 1);
    let rows = app.log_rows().await;
    let ours: Vec<_> = rows.iter().filter(|r| r.correlation_id == cid).collect();
    assert_eq!(ours.len(), 1, "{rows:?}");
    assert_eq!(ours[0].direction, "outbound");
    assert_eq!(ours[0].message, "Your appointment is at 3pm.");
    assert_eq!(ours[0].person_id, person);
    // In the person's one session, after their exchange.
    assert_eq!(ours[0].session_id, rows[0].session_id);
    assert_eq!(rows.last().unwrap().correlation_id, cid);
    app.shutdown().await;
}

#[tokio::test]
async fn a_named_channel_is_used_instead_of_the_last_one() {
    let app = spawn_app().await;
    // Ana is in the directory by phone and by chat login; she chats, then texts (last).
    sqlx::query(
        "INSERT INTO switchboard.people (person_id, person_type, name, role)
         VALUES ('17', 'staff', 'Ana', 'nurse')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO switchboard.contact_points (kind, address, person_id)
         VALUES ('phone', $1, '17'), ('chat_user', 'ana@clinic', '17')",
    )
    .bind(PHONE)
    .execute(&app.db)
    .await
    .unwrap();
    let mut chat = ChatClient::as_user(&app.gateway_url, "ana@clinic").await;
    chat.say("m-1", "from the dashboard").await;
    assert_eq!(chat.reply(WAIT).await["text"], "echo: from the dashboard");
    texted_once(&app).await;
    app.settle().await;

    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let (status, body) = post_outbound(
        &app,
        &key,
        json!({"person_id": "17", "agent": "reggie_oc", "text": "Shift swap approved.",
               "channel": "admin_chat"}),
        None,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["channel"], "admin_chat");
    let reply = chat.reply(WAIT).await;
    assert_eq!(reply["type"], "reply");
    assert_eq!(reply["text"], "Shift swap approved.");
    assert_eq!(reply["agent"], "reggie_oc");
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 1, "nothing more by SMS");

    // Named, a channel she never used is refused the same way as no channel at all.
    let (status, body) = post_outbound(
        &app,
        &key,
        json!({"person_id": "17", "agent": "reggie_oc", "text": "x", "channel": "header_widget"}),
        None,
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("no_channel"))
    );
    chat.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn an_agent_started_message_waits_for_the_reply_being_written() {
    let app = spawn_app().await;
    texted_once(&app).await;
    // The person's next text is at the runner, held there.
    app.runner.set_hold(true);
    assert_eq!(
        app.send_sms(PHONE, "what about friday?").await.status(),
        200
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while app.runner.calls().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the turn reached the runner"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let (status, body) = post_outbound(
        &app,
        &key,
        json!({"person_id": format!("phone:{PHONE}"), "agent": "reggie_oc",
               "text": "Reminder: bring your card."}),
        None,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        app.twilio.sent().len(),
        1,
        "not sent ahead of the reply being written"
    );

    app.runner.set_hold(false);
    app.runner.release.notify_waiters();
    let sent = app.wait_for_sms(3, WAIT).await;
    let bodies: Vec<&str> = sent.iter().map(|s| s.body.as_str()).collect();
    assert_eq!(
        bodies,
        [
            "echo: hi there",
            "echo: what about friday?",
            "Reminder: bring your card."
        ]
    );
    app.shutdown().await;
}

#[tokio::test]
async fn only_keys_granted_outbound_may_start_messages_and_only_to_known_people_and_agents() {
    let app = spawn_app().await;
    texted_once(&app).await;
    let person = format!("phone:{PHONE}");
    let message = json!({"person_id": person, "agent": "reggie_oc", "text": "hello"});

    // A default key (messages:write, messages:read) may not write to people first.
    let plain = app.api_key("crm", &[]).await;
    let (status, body) = post_outbound(&app, &plain, message.clone(), None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("missing_scope"))
    );

    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let (status, body) = post_outbound(
        &app,
        &key,
        json!({"person_id": "phone:+14155550000", "agent": "reggie_oc", "text": "hello"}),
        None,
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("no_channel"))
    );
    let (status, body) = post_outbound(
        &app,
        &key,
        json!({"person_id": person, "agent": "nobody", "text": "hello"}),
        None,
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("unknown_agent"))
    );

    // The same Idempotency-Key twice is one message.
    let (first, a) = post_outbound(&app, &key, message.clone(), Some("remind-42")).await;
    let (second, b) = post_outbound(&app, &key, message.clone(), Some("remind-42")).await;
    assert_eq!((first, second), (202, 202), "{a} {b}");
    assert_eq!(a["correlation_id"], b["correlation_id"]);
    app.wait_for_sms(2, WAIT).await;
    app.settle().await;
    let sent: Vec<String> = app.twilio.sent().into_iter().map(|s| s.body).collect();
    assert_eq!(sent, ["echo: hi there", "hello"]);

    // A key is the caller's own per route: the same one on /messages and on /outbound is two
    // requests, each answered.
    let both = app
        .api_key("ops", &["messages:write", "outbound:write"])
        .await;
    let api = app
        .post_api_message(&both, json!({"text": "status?"}), Some("k-1"))
        .await;
    assert_eq!(api.status(), 202);
    let api: Value = api.json().await.unwrap();
    let (status, out) = post_outbound(&app, &both, message.clone(), Some("k-1")).await;
    assert_eq!(status, 202, "{out}");
    assert_ne!(api["correlation_id"], out["correlation_id"]);
    let sent = app.wait_for_sms(3, WAIT).await;
    assert_eq!(sent[2].body, "hello");
    app.shutdown().await;
}
