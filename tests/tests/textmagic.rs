//! TextMagic in and out: its callbacks (JSON, form, multipart) authenticated by the URL token,
//! its retries one turn, the reply sent once through its Messages API, whatever it answers.
use std::time::Duration;

use switchboard_e2e::{AppOptions, TEXTMAGIC_NUMBER, TEXTMAGIC_TOKEN, spawn_app, spawn_app_with};

/// The person's number as TextMagic writes it, and as Switchboard knows it.
const PERSON_DIGITS: &str = "447860021130";
const PERSON: &str = "+447860021130";
const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_textmagic_sms_gets_one_reply_through_textmagic_and_its_retry_is_the_same_turn() {
    let app = spawn_app().await;

    let first = app
        .send_textmagic_sms(PERSON_DIGITS, "hello from textmagic", 7001)
        .await;
    assert_eq!(first.status(), 200);
    // TextMagic retries a callback it got no answer to: same id, one turn.
    let retry = app
        .send_textmagic_sms(PERSON_DIGITS, "hello from textmagic", 7001)
        .await;
    assert_eq!(retry.status(), 200);

    let sent = app.wait_for_textmagic(1, WAIT).await;
    app.settle().await;
    assert_eq!(app.textmagic.sent().len(), 1, "exactly one reply: {sent:?}");
    assert!(
        app.twilio.sent().is_empty(),
        "the reply goes out the way the message came in"
    );
    assert_eq!(
        sent[0].to, PERSON_DIGITS,
        "TextMagic takes numbers without +"
    );
    assert_eq!(sent[0].body, "echo: hello from textmagic");
    assert_eq!(
        app.runner.calls().len(),
        1,
        "the retry was not a second turn"
    );

    let rows = app.log_rows().await;
    let inbound = rows.iter().find(|r| r.direction == "inbound").unwrap();
    assert_eq!(inbound.person_id, format!("phone:{PERSON}"));
    assert_eq!(inbound.message, "hello from textmagic");
    let (status, ids, provider): (String, Vec<String>, String) =
        sqlx::query_as("SELECT status, provider_message_ids, provider FROM switchboard.deliveries")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((status.as_str(), provider.as_str()), ("sent", "textmagic"));
    assert_eq!(ids, vec![sent[0].sid.clone()]);
    app.shutdown().await;
}

#[tokio::test]
async fn textmagic_answering_429_then_201_sends_exactly_one_sms() {
    let app = spawn_app().await;
    app.textmagic.failures.fail_next(1, 429);

    let resp = app
        .send_textmagic_sms(PERSON_DIGITS, "are you there", 7101)
        .await;
    assert_eq!(resp.status(), 200);
    let sent = app.wait_for_textmagic(1, WAIT).await;
    app.settle().await;
    assert_eq!(app.textmagic.sent().len(), 1, "{sent:?}");
    assert_eq!(sent[0].body, "echo: are you there");
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("sb_delivery_throttled_total{provider=\"textmagic\"} 1"),
        "the 429 is counted"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn the_same_phone_through_twilio_and_textmagic_is_one_session_answered_on_each() {
    let app = spawn_app().await;

    app.send_sms(PERSON, "first, by twilio").await;
    app.wait_for_sms(1, WAIT).await;
    app.send_textmagic_sms(PERSON_DIGITS, "then by textmagic", 7201)
        .await;
    app.wait_for_textmagic(1, WAIT).await;
    app.settle().await;

    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2);
    // The second turn resumes the engine session the first one started.
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.sessions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(sessions, 1);
    assert_eq!(app.twilio.sent().len(), 1);
    assert_eq!(app.textmagic.sent()[0].body, "echo: then by textmagic");
    app.shutdown().await;
}

#[tokio::test]
async fn form_and_multipart_callbacks_from_older_setups_are_accepted() {
    let app = spawn_app().await;
    let url = format!(
        "{}/webhooks/textmagic/sms/{TEXTMAGIC_TOKEN}",
        app.gateway_url
    );
    let client = reqwest::Client::new();

    let form = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("id", "7301"),
            ("sender", PERSON_DIGITS),
            ("receiver", TEXTMAGIC_NUMBER),
            ("messageTime", "2012-11-28T18:38:28+0000"),
            ("text", "by form"),
        ])
        .finish();
    let resp = client
        .post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    app.wait_for_textmagic(1, WAIT).await;

    let part = |name: &str, value: &str| {
        format!("--b0undary\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
    };
    let multipart = [
        part("id", "7302"),
        part("sender", PERSON_DIGITS),
        part("receiver", TEXTMAGIC_NUMBER),
        part("text", "by multipart"),
    ]
    .concat()
        + "--b0undary--\r\n";
    let resp = client
        .post(&url)
        .header("content-type", "multipart/form-data; boundary=b0undary")
        .body(multipart)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sent = app.wait_for_textmagic(2, WAIT).await;
    app.settle().await;
    let bodies: Vec<_> = sent.iter().map(|s| s.body.as_str()).collect();
    assert_eq!(bodies, ["echo: by form", "echo: by multipart"]);
    app.shutdown().await;
}

#[tokio::test]
async fn a_wrong_token_is_refused_counted_and_publishes_nothing() {
    let app = spawn_app().await;
    let callback = serde_json::json!({"id": 7401, "sender": PERSON_DIGITS, "text": "let me in"});

    for token in ["wrong", "tm-callback-7f3", ""] {
        let resp = app.post_textmagic(token, &callback).await;
        // An empty token does not even match the route.
        let expected = if token.is_empty() { 404 } else { 403 };
        assert_eq!(resp.status(), expected, "token {token:?}");
    }
    let resp = app.post_textmagic("wrong", &callback).await;
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "invalid_token");

    let metrics = app.metrics().await;
    assert!(
        metrics.contains(
            "sb_gateway_rejected_total{channel=\"sms\",reason=\"invalid_token\",provider=\"textmagic\"} 3"
        ),
        "{metrics}"
    );
    app.assert_nothing_reached_the_pipeline().await;
    app.shutdown().await;
}

/// The lease of a deliverer that dies holding a reply: short, so the test need not wait 45 s.
const DEAD_LEASE: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_part_textmagic_accepted_before_its_deliverer_died_is_not_sent_again() {
    let app = spawn_app_with(AppOptions::all_but("deliver")).await;
    app.send_textmagic_sms(PERSON_DIGITS, "did you get that", 7501)
        .await;
    let reply = app.wait_for_reply(&[], WAIT).await;
    // A deliverer takes the reply, TextMagic accepts its part, and the deliverer dies before
    // the ledger says so.
    app.deliverer_dies_sending(&reply, DEAD_LEASE, 0, true)
        .await;
    let accepted = app.textmagic.sent();
    assert_eq!(accepted.len(), 1);
    // TextMagic's message list is down for a while: the part waits rather than go out blind.
    app.textmagic.list_failures.fail_next(2, 503);

    app.start_stage("deliver");
    let (status, ids) = app.wait_for_delivery(&reply, WAIT).await;
    app.settle().await;
    let sent = app.textmagic.sent();
    assert_eq!(sent.len(), 1, "the person got the reply once: {sent:?}");
    assert_eq!(sent[0].body, "echo: did you get that");
    assert_eq!(status, "sent");
    assert_eq!(
        ids,
        vec![accepted[0].sid.clone()],
        "the ledger has TextMagic's id"
    );
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(
            r#"sb_delivery_reconciled_total{provider="textmagic",outcome="unreadable"} 2"#
        ) && metrics
            .contains(r#"sb_delivery_reconciled_total{provider="textmagic",outcome="found"} 1"#),
        "{metrics}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_part_that_never_reached_textmagic_is_sent_even_when_someone_else_just_got_the_same_text()
{
    let app = spawn_app_with(AppOptions::all_but("deliver")).await;
    let other = "447860021199";
    app.send_textmagic_sms(other, "hello", 7601).await;
    let theirs = app.wait_for_reply(&[], WAIT).await;
    app.deliver_directly(&theirs).await;
    // Our person says the same, gets the same answer, and its deliverer dies before handing
    // it to TextMagic: TextMagic's list holds the same text, moments old, to someone else.
    app.send_textmagic_sms(PERSON_DIGITS, "hello", 7602).await;
    let ours = app.wait_for_reply(&[&theirs], WAIT).await;
    assert_eq!(ours.text, theirs.text);
    app.deliverer_dies_sending(&ours, DEAD_LEASE, 0, false)
        .await;

    app.start_stage("deliver");
    let (status, ids) = app.wait_for_delivery(&ours, WAIT).await;
    app.settle().await;
    let sent = app.textmagic.sent();
    let to_person: Vec<_> = sent.iter().filter(|s| s.to == PERSON_DIGITS).collect();
    assert_eq!(
        to_person.len(),
        1,
        "the person got the answer once: {sent:?}"
    );
    assert_eq!(to_person[0].body, "echo: hello");
    assert_eq!(sent.len(), 2);
    assert_eq!(status, "sent");
    assert_eq!(ids, vec![to_person[0].sid.clone()]);
    app.shutdown().await;
}
