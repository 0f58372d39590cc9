//! Queue mode `collect` when a dispatcher dies mid-call: the turn's retry is the same call
//! (same messages, same Idempotency-Key), so the runner never runs the agent twice on a
//! message, and what arrived meanwhile is answered after it.
use std::time::{Duration, Instant};

use switchboard_e2e::{AppOptions, spawn_app_with};
use switchboard_kit::config::QueueMode;

const PERSON: &str = "+14155550193";
const WAIT: Duration = Duration::from_secs(30);
const FIRST: &str = "is my parcel out for delivery";
const SECOND: &str = "it was due on Monday";
const THIRD: &str = "the order number is 4411";

#[tokio::test]
async fn a_collect_turn_retried_after_its_dispatcher_died_is_the_same_call_not_a_second_run_with_later_messages()
 {
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(|c| {
            c.agents[0].queue_mode = QueueMode::Collect;
            c.dispatch.liveness_ms = 1_000;
        }),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    app.runner.set_hold(true);
    let mut first = app.spawn_worker("dispatch");

    // The first message's call, alone, is at the runner when its dispatcher dies; two more
    // messages arrive meanwhile.
    assert_eq!(app.send_sms(PERSON, FIRST).await.status(), 200);
    tokio::time::timeout(WAIT, app.runner.received.notified())
        .await
        .expect("the dispatcher called the runner");
    for text in [SECOND, THIRD] {
        assert_eq!(app.send_sms(PERSON, text).await.status(), 200);
    }
    let deadline = Instant::now() + WAIT;
    while app.turns_opened(&format!("phone:{PERSON}")).await < 3 {
        assert!(Instant::now() < deadline, "the later turns were not opened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.kill().await.expect("SIGKILL the dispatcher");
    app.runner.set_hold(false);
    app.runner.release.notify_waiters();

    // Another dispatcher takes the turns over.
    let mut second = app.spawn_worker("dispatch");
    // Until every turn is done (not a count of SMS: the broken retry answers all in one).
    let deadline = Instant::now() + WAIT;
    loop {
        let open: i64 =
            sqlx::query_scalar("SELECT count(*) FROM switchboard.turns WHERE status <> 'done'")
                .fetch_one(&app.db)
                .await
                .unwrap();
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{open} turns never done");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.settle().await;
    let sent = app.twilio.sent();

    // The runner: the first message only ever under the first call's key (a retry of that
    // call, not a new call that also carries the later messages).
    let calls = app.runner.calls();
    let key = &calls[0].idempotency_key;
    assert!(calls[0].prompt.contains(FIRST), "{calls:?}");
    for call in calls.iter().filter(|c| c.prompt.contains(FIRST)) {
        assert_eq!(
            &call.idempotency_key,
            key,
            "the first message was run again under another key, with {:?}",
            said_in(&call.prompt)
        );
        assert_eq!(said_in(&call.prompt), [FIRST]);
    }
    // The later two went together in a call of their own, in the order sent.
    let later: Vec<_> = calls
        .iter()
        .filter(|c| c.prompt.contains(SECOND) || c.prompt.contains(THIRD))
        .collect();
    assert!(!later.is_empty(), "{calls:?}");
    for call in &later {
        let (at2, at3) = (call.prompt.find(SECOND), call.prompt.find(THIRD));
        assert!(
            matches!((at2, at3), (Some(a), Some(b)) if a < b),
            "{}",
            call.prompt
        );
        assert_eq!(call.idempotency_key, later[0].idempotency_key);
    }

    // The person: the first message answered once, then one answer to the other two.
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0].body, format!("echo: {FIRST}"));
    assert_eq!(sent[1].body, format!("echo: {SECOND}"));
    let inbound: Vec<String> = sqlx::query_scalar(
        "SELECT id::text FROM switchboard.messages WHERE person_id = $1 AND direction = 'inbound'
          ORDER BY id",
    )
    .bind(format!("phone:{PERSON}"))
    .fetch_all(&app.db)
    .await
    .unwrap();
    let answers: Vec<Option<serde_json::Value>> = sqlx::query_scalar(
        "SELECT metadata->'answers' FROM switchboard.messages
          WHERE person_id = $1 AND direction = 'outbound' ORDER BY id",
    )
    .bind(format!("phone:{PERSON}"))
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(answers.len(), 2, "two replies in the log: {answers:?}");
    assert_eq!(answers[1], Some(serde_json::json!(inbound[1..])));
    second.kill().await.ok();
    app.shutdown().await;
}

/// Which of the person's messages a prompt carries.
fn said_in(prompt: &str) -> Vec<&str> {
    [FIRST, SECOND, THIRD]
        .into_iter()
        .filter(|t| prompt.contains(t))
        .collect()
}
