//! `rate_limit.per_sender_per_minute`: a sender over the limit is told (an SMS sender once a
//! minute), never dropped in silence: what was not answered is a dead letter with the reason.
use std::time::Duration;

use serde_json::json;
use switchboard_e2e::{ChatClient, TestApp, spawn_app_configured};

const WAIT: Duration = Duration::from_secs(20);
const NOTICE: &str = "Slow down please: messages in the next minute will not be answered.";

async fn limited_app() -> TestApp {
    spawn_app_configured(|c| {
        c.rate_limit.per_sender_per_minute = 3;
        c.rate_limit.notice = NOTICE.into();
    })
    .await
}

#[tokio::test]
async fn an_sms_sender_over_the_limit_is_told_once_and_the_rest_is_kept_not_dropped() {
    let app = limited_app().await;
    // Six messages in well under a minute (the window is the clock's minute: a run that
    // straddles one may admit more, never fewer than three).
    for i in 1..=6 {
        let answer = app.send_sms("+14155550181", &format!("message {i}")).await;
        assert_eq!(answer.status(), 200, "the provider is always answered");
    }
    app.send_sms("+14155550182", "someone else").await;
    let sent = app.wait_for_sms(5, WAIT).await;
    app.settle().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = if sent.len() < app.twilio.sent().len() {
        app.twilio.sent()
    } else {
        sent
    };

    let to_first: Vec<_> = sent
        .iter()
        .filter(|s| s.to == "+14155550181")
        .map(|s| s.body.as_str())
        .collect();
    let notices = to_first.iter().filter(|b| **b == NOTICE).count();
    let answered = to_first.len() - notices;
    let calls = app.runner.calls().len();
    if answered == 3 {
        // The usual case: one minute.
        assert_eq!(notices, 1, "told once: {to_first:?}");
        assert_eq!(calls, 4, "three of theirs and the other sender's");
        let letters = app.dead_letters("gateway").await;
        assert_eq!(letters.len(), 3, "each unanswered message is kept");
        assert!(
            letters
                .iter()
                .all(|l| l.error.contains("rate limited") && l.error.contains("replay")),
            "{letters:?}"
        );
    } else {
        // The run straddled a minute boundary: more were admitted, none lost.
        let letters = app.dead_letters("gateway").await;
        assert_eq!(answered + letters.len(), 6, "{to_first:?}");
    }
    // The other sender was not limited.
    assert!(
        sent.iter()
            .any(|s| s.to == "+14155550182" && s.body == "echo: someone else")
    );
    assert!(
        app.metrics()
            .await
            .contains("sb_gateway_rate_limited_total{channel=\"sms\"}")
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_replayed_rate_limited_message_is_answered() {
    let app = limited_app().await;
    for i in 1..=4 {
        app.send_sms("+14155550183", &format!("m{i}")).await;
    }
    let letters = app.wait_for_dead_letters("gateway", WAIT).await;
    assert!(!letters.is_empty());
    app.wait_for_sms(3, WAIT).await;
    app.settle().await;
    let before = app.runner.calls().len();
    let stored = switchboard_kit::dlq::list(&app.js, &app.topology, Some("gateway"), 10)
        .await
        .unwrap();
    let replayed = stored.last().unwrap().seq;
    switchboard_kit::dlq::replay(&app.js, &app.topology, replayed)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while app.runner.calls().len() == before && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        app.runner.calls().len(),
        before + 1,
        "the replay was answered"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn chat_and_api_callers_over_the_limit_are_refused_with_429_and_when_to_retry() {
    let app = limited_app().await;
    let mut chat = ChatClient::as_user(&app.gateway_url, "ana").await;
    let mut refused = None;
    for i in 1..=4 {
        chat.say(&format!("c{i}"), "hi").await;
        let frame = chat.until_any(&["accepted", "error"], WAIT).await;
        if frame["type"] == "error" {
            refused = Some(frame);
        }
    }
    let refused = refused.expect("the fourth message in a minute is refused");
    assert_eq!(refused["code"], "rate_limited");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("send it again")
    );

    let key = app.api_key("crm", &[]).await;
    let mut status = Vec::new();
    for _ in 1..=4 {
        let r = app
            .post_api_message(&key, json!({"text": "hi"}), None)
            .await;
        status.push((
            r.status().as_u16(),
            r.headers().get("retry-after").is_some(),
        ));
    }
    assert!(
        status.contains(&(429, true)),
        "the API says 429 with Retry-After: {status:?}"
    );
    // Chat and API refusals are not dead letters: the caller was told and can resend.
    assert!(app.dead_letters("gateway").await.is_empty());
    app.shutdown().await;
}

/// Wait, if need be, for a clock minute with at least 30 s left: the limit counts per clock
/// minute, and a test that straddled two would be allowed twice as many.
async fn early_in_a_minute() {
    let into = chrono::Utc::now().timestamp() % 60;
    if into > 30 {
        tokio::time::sleep(Duration::from_secs((61 - into) as u64)).await;
    }
}

#[tokio::test]
async fn the_limit_and_the_one_notice_hold_across_gateway_replicas() {
    let app = limited_app().await;
    // A second gateway process: its own arrival-counter client, the same NATS and database.
    let (_replica, other) = app.spawn_gateway_process().await;
    let replicas = [app.gateway_url.clone(), other];
    let key = app.api_key("crm", &[]).await;
    // One chat login with a socket on each replica.
    let mut sockets = [
        ChatClient::as_user(&replicas[0], "ana").await,
        ChatClient::as_user(&replicas[1], "ana").await,
    ];
    early_in_a_minute().await;

    // SMS: six messages from one number, every other one through the other replica.
    for i in 0..6 {
        let answer = app
            .send_sms_to(&replicas[i % 2], "+14155550184", &format!("split {i}"))
            .await;
        assert_eq!(answer.status(), 200, "the provider is always answered");
    }
    // API: six calls with one key, split the same way.
    let mut statuses = Vec::new();
    for i in 0..6 {
        let r = app
            .post_api_to(
                &replicas[i % 2],
                "messages",
                &key,
                json!({"text": "hi"}),
                None,
            )
            .await;
        statuses.push((
            r.status().as_u16(),
            r.headers().get("retry-after").is_some(),
        ));
    }
    // Chat: four messages, alternating between the sockets.
    let mut frames = Vec::new();
    for i in 0..4 {
        let socket = &mut sockets[i % 2];
        socket.say(&format!("c{i}"), "hi").await;
        frames.push(socket.until_any(&["accepted", "error"], WAIT).await);
    }

    // Three answered of six, wherever they came in; the sender told once, by one replica.
    app.wait_for_sms(4, WAIT).await;
    app.settle().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let to_sender: Vec<String> = app
        .twilio
        .sent()
        .into_iter()
        .filter(|s| s.to == "+14155550184")
        .map(|s| s.body)
        .collect();
    let notices = to_sender.iter().filter(|b| *b == NOTICE).count();
    assert_eq!(notices, 1, "told once: {to_sender:?}");
    assert_eq!(
        to_sender.len() - notices,
        3,
        "three answered: {to_sender:?}"
    );
    let letters = app.dead_letters("gateway").await;
    assert_eq!(
        letters.len(),
        3,
        "each unanswered text is kept: {letters:?}"
    );

    // An API caller is answered on every call: three taken, three refused with when to retry.
    let taken = statuses.iter().filter(|(s, _)| *s == 202).count();
    assert_eq!(taken, 3, "{statuses:?}");
    assert!(
        statuses
            .iter()
            .filter(|(s, _)| *s != 202)
            .all(|r| *r == (429, true)),
        "{statuses:?}"
    );
    // The chatter likewise: the fourth message, on whichever replica, is refused.
    let kinds: Vec<&str> = frames.iter().map(|f| f["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["accepted", "accepted", "accepted", "error"],
        "{frames:?}"
    );
    assert_eq!(frames[3]["code"], "rate_limited");
    app.shutdown().await;
}

#[tokio::test]
async fn a_whatsapp_sender_over_the_limit_is_told_within_the_window_they_just_opened() {
    let app = limited_app().await;
    for i in 1..=5 {
        let message =
            app.twilio_whatsapp_params("+14155550184", &format!("m{i}"), &format!("SMrl{i:04}"));
        assert_eq!(app.post_twilio_whatsapp(&message).await.status(), 200);
    }
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let told = app
            .twilio
            .sent()
            .iter()
            .any(|s| s.to == "whatsapp:+14155550184" && s.body == NOTICE);
        if told {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never told: {:?}",
            app.twilio.sent()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.settle().await;
    app.shutdown().await;
}
