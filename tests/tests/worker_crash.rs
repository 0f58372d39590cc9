//! Any worker can die at any moment: its message comes back and is answered once.
use std::time::Duration;

use switchboard_e2e::{AppOptions, TestApp, sigterm, spawn_app_with};

/// Everything in-process except dispatch, which the test starts as real worker processes.
async fn app_with_dispatch_as_a_process() -> TestApp {
    spawn_app_with(AppOptions::dispatch_as_processes()).await
}

#[tokio::test]
async fn a_dispatcher_killed_mid_turn_loses_nothing_and_replies_once() {
    let app = app_with_dispatch_as_a_process().await;
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

#[tokio::test]
async fn sigterm_lets_a_dispatcher_finish_its_turn_before_it_exits() {
    let app = app_with_dispatch_as_a_process().await;
    app.runner.set_hold(true);
    let mut worker = app.spawn_worker("dispatch");
    assert_eq!(
        app.send_sms("+14155550188", "finish me").await.status(),
        200
    );
    tokio::time::timeout(Duration::from_secs(30), app.runner.received.notified())
        .await
        .expect("the dispatcher called the runner");

    sigterm(&worker);
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.runner.set_hold(false);
    app.runner.release.notify_waiters();

    let status = tokio::time::timeout(Duration::from_secs(10), worker.wait())
        .await
        .expect("the worker exits after draining")
        .expect("wait for the worker");
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
    let sent = app.wait_for_sms(1, Duration::from_secs(10)).await;
    assert_eq!(sent[0].body, "echo: finish me");
    // The drained turn was acked: no other dispatcher is running, and nothing is left pending.
    let stream = app.js.get_stream(app.topology.work_stream()).await.unwrap();
    let mut consumer: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer("dispatch").await.unwrap();
    let info = consumer.info().await.unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
    assert_eq!(app.runner.calls().len(), 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_runner_slower_than_ack_wait_is_not_called_twice() {
    // ack_wait is 2 s in tests; progress acks must keep the turn from being redelivered.
    let app = switchboard_e2e::spawn_app().await;
    app.runner.set_delay(Duration::from_secs(5));
    assert_eq!(
        app.send_sms("+14155550199", "take your time")
            .await
            .status(),
        200
    );
    let sent = app.wait_for_sms(1, Duration::from_secs(30)).await;
    app.settle().await;
    assert_eq!(sent[0].body, "echo: take your time");
    assert_eq!(
        app.runner.calls().len(),
        1,
        "no redelivery while the runner works"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_turn_that_crashes_its_dispatcher_every_time_is_given_up_and_the_next_message_is_answered()
 {
    // Every time a dispatcher calls the runner with this turn, its process dies (the test kills
    // it the moment the call arrives, as a handler that crashes its process would).
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(|c| {
            c.runtime.max_deliver = 3;
            c.dispatch.liveness_ms = 1_000;
        }),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    app.runner.set_hold(true);
    let from = "+14155550166";
    assert_eq!(app.send_sms(from, "poison").await.status(), 200);
    let mut worker = app.spawn_worker("dispatch");
    let started = std::time::Instant::now();
    let mut crashes = 0;
    let letters = loop {
        let letters = app.dead_letters("dispatch").await;
        if !letters.is_empty() {
            break letters;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the turn was never given up ({crashes} crashes)"
        );
        if tokio::time::timeout(Duration::from_millis(500), app.runner.received.notified())
            .await
            .is_ok()
        {
            worker.kill().await.expect("SIGKILL the dispatcher");
            worker = app.spawn_worker("dispatch");
            crashes += 1;
        }
    };
    // After max_deliver deliveries the handler is not run again: the turn is given up.
    assert!((1..=3).contains(&crashes), "{crashes} crashes");
    assert!(
        letters[0].error.contains("crashing the process"),
        "{}",
        letters[0].error
    );
    let status: String =
        sqlx::query_scalar("SELECT status FROM switchboard.turns WHERE seq = 1 LIMIT 1")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(status, "failed", "the turn is recorded as failed");

    // The session is not blocked: the person's next message is answered.
    app.runner.set_hold(false);
    app.runner.release.notify_waiters();
    assert_eq!(app.send_sms(from, "still there?").await.status(), 200);
    let sent = app.wait_for_sms(1, Duration::from_secs(30)).await;
    assert_eq!(sent[0].body, "echo: still there?");
    assert_eq!(sent.len(), 1, "the given-up turn sent nothing: {sent:?}");
    worker.kill().await.ok();
    app.shutdown().await;
}

/// A worker started while Postgres cannot be reached yet (both starting at once, or Postgres
/// recovering from a crash) waits for it and then does its work, rather than exiting.
#[tokio::test]
async fn a_worker_started_before_postgres_is_reachable_waits_and_then_works() {
    let app = spawn_app_with(AppOptions {
        in_process: switchboard::stages::names()
            .into_iter()
            .filter(|s| !s.starts_with("log-"))
            .collect(),
        ..Default::default()
    })
    .await;
    // Postgres as the worker sees it: a port where nothing listens yet.
    let url = &app.config.database_url;
    let (head, rest) = url.split_once('@').expect("user@host in the URL");
    let (target, path) = rest.split_once('/').expect("a database in the URL");
    let port = switchboard_kit::net::free_port("127.0.0.1").expect("a free port");
    let unreachable = format!("{head}@127.0.0.1:{port}/{path}");
    let mut worker = app.spawn_worker_with_env("log", &[("SB_DATABASE_URL", unreachable)]);
    // Longer than the connection pool's own 10 s of trying.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(
        worker.try_wait().expect("the worker's status").is_none(),
        "the worker exited instead of waiting for Postgres"
    );

    // Postgres becomes reachable there.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("listen where the worker looks for Postgres");
    let target = target.to_string();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    app.send_sms("+14155550930", "written down?").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !app
        .log_rows()
        .await
        .iter()
        .any(|r| r.direction == "inbound" && r.message == "written down?")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never logged the message"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sigterm(&worker);
    let _ = worker.wait().await;
    app.shutdown().await;
}

/// What waiting cannot fix is not waited for: a worker whose database password is wrong stops
/// at once (well within the 30 s it waits for an unreachable server), saying why.
#[tokio::test]
async fn a_worker_whose_database_login_is_refused_stops_at_once() {
    let app = spawn_app_with(AppOptions {
        in_process: vec![],
        ..Default::default()
    })
    .await;
    let url = &app.config.database_url;
    let (head, rest) = url.split_once('@').expect("user:password@host in the URL");
    let (user, _) = head.rsplit_once(':').expect("a password in the URL");
    let refused = format!("{user}:not-the-password@{rest}");
    let mut worker = app.spawn_worker_with_env("log", &[("SB_DATABASE_URL", refused)]);
    let status = tokio::time::timeout(Duration::from_secs(15), worker.wait())
        .await
        .expect("the worker stopped instead of waiting")
        .expect("the worker's status");
    assert!(!status.success(), "{status:?}");
    app.shutdown().await;
}
