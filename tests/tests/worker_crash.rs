//! Any worker can die at any moment: its message comes back and is answered once.
use std::time::Duration;

use switchboard_e2e::{AppOptions, spawn_app_with};
use switchboard_kit::StageName;

#[tokio::test]
async fn a_dispatcher_killed_mid_turn_loses_nothing_and_replies_once() {
    // Everything in-process except dispatch, which runs as a real worker process.
    let app = spawn_app_with(AppOptions {
        in_process: StageName::ALL
            .into_iter()
            .filter(|s| *s != StageName::Dispatch)
            .collect(),
        ..Default::default()
    })
    .await;
    app.runner.set_hold(true);
    let mut first = app.spawn_worker("dispatch");

    assert_eq!(
        app.send_sms("+14155550177", "survive this").await.status(),
        200
    );
    // The runner has the turn: kill the dispatcher while the call is in flight.
    tokio::time::timeout(Duration::from_secs(30), app.runner.received.notified())
        .await
        .expect("the dispatcher called the runner");
    first.kill().await.expect("SIGKILL the dispatcher");
    app.runner.set_hold(false);
    app.runner.release.notify_waiters();

    let mut second = app.spawn_worker("dispatch");
    let sent = app.wait_for_sms(1, Duration::from_secs(30)).await;
    app.settle().await;
    assert_eq!(
        app.twilio.sent().len(),
        1,
        "one reply: {:?}",
        app.twilio.sent()
    );
    assert_eq!(sent[0].body, "echo: survive this");

    // The turn was redelivered to the new dispatcher with the same idempotency key.
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0].idempotency_key, calls[1].idempotency_key);
    let outbound = app
        .log_rows()
        .await
        .into_iter()
        .filter(|r| r.direction == "outbound")
        .count();
    assert_eq!(outbound, 1);
    second.kill().await.ok();
    app.shutdown().await;
}
