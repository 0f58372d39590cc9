//! Queue modes (`[[agents]] queue_mode`): what happens to messages that arrive while one of
//! the session's turns runs. `followup` (the default) answers each in its own turn; `collect`
//! joins them into the next turn, in order, every message kept in the log.
use std::time::{Duration, Instant};

use switchboard_e2e::{TestApp, spawn_app_configured};
use switchboard_kit::config::QueueMode;

const PERSON: &str = "+14155550191";
const WAIT: Duration = Duration::from_secs(20);

/// The first message's call is held at the runner while five more arrive.
async fn five_messages_while_a_turn_runs(app: &TestApp) {
    app.runner.set_hold(true);
    app.send_sms(PERSON, "first").await;
    tokio::time::timeout(WAIT, app.runner.received.notified())
        .await
        .expect("the first call reached the runner");
    for i in 1..=5 {
        assert_eq!(app.send_sms(PERSON, &format!("m{i}")).await.status(), 200);
    }
    let deadline = Instant::now() + WAIT;
    while app.turns_opened(&format!("phone:{PERSON}")).await < 6 {
        assert!(Instant::now() < deadline, "the five turns were not opened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.runner.set_hold(false);
    app.runner.release.notify_one();
}

#[tokio::test]
async fn collect_joins_five_messages_sent_while_a_turn_ran_into_one_next_turn_in_order() {
    let app = spawn_app_configured(|c| c.agents[0].queue_mode = QueueMode::Collect).await;
    five_messages_while_a_turn_runs(&app).await;
    let sent = app.wait_for_sms(2, WAIT).await;
    app.settle().await;
    assert_eq!(sent.len(), 2, "one reply per runner call: {sent:?}");
    assert_eq!(sent[0].body, "echo: first");

    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2, "the five waiting messages were one call");
    let prompt = &calls[1].prompt;
    assert!(prompt.contains("The person sent 5 messages"), "{prompt}");
    let at: Vec<usize> = (1..=5)
        .map(|i| {
            prompt
                .find(&format!("\nm{i}\n"))
                .expect("each message in the prompt")
        })
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "in the order sent: {at:?}"
    );
    // The joined call resumed the engine session and has its own key.
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));
    assert!(
        calls[1].idempotency_key.ends_with(":2-6"),
        "{}",
        calls[1].idempotency_key
    );

    // Every message is in the log, and the reply names the five it answers, in order.
    let inbound: Vec<String> = sqlx::query_scalar(
        "SELECT message FROM switchboard.messages WHERE person_id = $1 AND direction = 'inbound'
          ORDER BY id",
    )
    .bind(format!("phone:{PERSON}"))
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(inbound, ["first", "m1", "m2", "m3", "m4", "m5"]);
    let answers: serde_json::Value = sqlx::query_scalar(
        "SELECT metadata->'answers' FROM switchboard.messages
          WHERE person_id = $1 AND direction = 'outbound' ORDER BY id DESC LIMIT 1",
    )
    .bind(format!("phone:{PERSON}"))
    .fetch_one(&app.db)
    .await
    .unwrap();
    let in_ids: Vec<String> = sqlx::query_scalar(
        "SELECT id::text FROM switchboard.messages WHERE person_id = $1 AND direction = 'inbound'
          ORDER BY id OFFSET 1",
    )
    .bind(format!("phone:{PERSON}"))
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(answers, serde_json::json!(in_ids));
    // Each message kept its own turn: all six are done, the cursor past them.
    let open: i64 =
        sqlx::query_scalar("SELECT count(*) FROM switchboard.turns WHERE status <> 'done'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(open, 0);
    // Then the session goes on as usual.
    app.send_sms(PERSON, "thanks").await;
    assert_eq!(app.wait_for_sms(3, WAIT).await[2].body, "echo: thanks");
    assert_eq!(app.runner.calls()[2].session_id.as_deref(), Some("eng-1"));
    app.shutdown().await;
}

#[tokio::test]
async fn followup_answers_each_message_sent_while_a_turn_ran_in_its_own_turn() {
    let app = spawn_app_configured(|c| c.agents[0].queue_mode = QueueMode::Followup).await;
    five_messages_while_a_turn_runs(&app).await;
    let sent = app.wait_for_sms(6, WAIT).await;
    let bodies: Vec<&str> = sent.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(
        bodies,
        [
            "echo: first",
            "echo: m1",
            "echo: m2",
            "echo: m3",
            "echo: m4",
            "echo: m5"
        ]
    );
    assert_eq!(app.runner.calls().len(), 6);
    app.shutdown().await;
}

#[tokio::test]
async fn interrupt_cancels_the_running_call_and_the_next_turn_carries_both_messages() {
    let app = spawn_app_configured(|c| c.agents[0].queue_mode = QueueMode::Interrupt).await;
    app.runner.set_hold(true);
    app.send_sms(PERSON, "book me a table for two").await;
    tokio::time::timeout(WAIT, app.runner.received.notified())
        .await
        .expect("the first call reached the runner");
    // The first call stays held; the next ones are answered at once.
    app.runner.set_hold(false);
    app.send_sms(PERSON, "actually, make it four").await;
    let sent = app.wait_for_sms(1, WAIT).await;
    app.settle().await;

    // The running call was cancelled at the runner, by its key.
    let cancelled = app.runner.cancelled.lock().unwrap().clone();
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert!(cancelled[0].ends_with(":1"), "{cancelled:?}");
    // The call that answered carries both messages, in order, under a key of its own.
    let calls = app.runner.calls();
    assert_eq!(
        calls.len(),
        2,
        "the cancelled call and the one that answered"
    );
    let answered = &calls[1];
    assert!(
        answered.idempotency_key.ends_with(":1-2~1"),
        "{}",
        answered.idempotency_key
    );
    let p = &answered.prompt;
    let (a, b) = (
        p.find("book me a table for two")
            .expect("the first message"),
        p.find("actually, make it four")
            .expect("the second message"),
    );
    assert!(a < b, "{p}");
    // One answer for both, nothing lost: both turns done, both messages logged.
    assert_eq!(sent.len(), 1);
    assert_eq!(app.twilio.sent().len(), 1);
    let open: i64 =
        sqlx::query_scalar("SELECT count(*) FROM switchboard.turns WHERE status <> 'done'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(open, 0);
    assert_eq!(
        app.log_rows()
            .await
            .iter()
            .filter(|r| r.direction == "inbound")
            .count(),
        2
    );
    app.shutdown().await;
}
