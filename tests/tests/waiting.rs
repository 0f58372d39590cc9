//! Waiting is not failing: a message that waits for another worker keeps its failure budget,
//! and only a wait longer than the stage's maximum ends in a dead letter, saying so.
use std::time::Duration;

use switchboard_e2e::{AppOptions, TestApp, sigterm, spawn_app_configured, spawn_app_with};

const WAIT: Duration = Duration::from_secs(30);

/// The person's first message is at the runner, held there; their second is sent behind it.
async fn second_message_behind_a_held_call(app: &TestApp, person: &str, second: &str) {
    app.runner.set_hold(true);
    assert_eq!(app.send_sms(person, "first, slow").await.status(), 200);
    tokio::time::timeout(WAIT, app.runner.received.notified())
        .await
        .expect("the first turn reached the runner");
    assert_eq!(app.send_sms(person, second).await.status(), 200);
}

fn release_the_call(app: &TestApp) {
    app.runner.set_hold(false);
    app.runner.release.notify_waiters();
}

#[tokio::test]
async fn a_turn_waiting_behind_a_long_runner_call_is_answered_when_the_call_ends() {
    // A failure budget of two deliveries, and a waiting turn that checks its session every
    // 200 ms even unwoken: six seconds of waiting were dozens of deliveries when waits counted.
    let app = spawn_app_configured(|c| {
        c.runtime.max_deliver = 2;
        c.dispatch.hold_timeout_ms = 200;
    })
    .await;
    second_message_behind_a_held_call(&app, "+14155550610", "second, waits").await;

    // Longer than the ack wait (2 s) three times over: the parked turn is kept alive, not
    // redelivered, and not given up.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        app.runner.calls().len(),
        1,
        "the second turn waits its turn"
    );
    assert!(app.dead_letters("dispatch").await.is_empty());

    release_the_call(&app);
    let sent = app.wait_for_sms(2, WAIT).await;
    let bodies: Vec<&str> = sent.iter().map(|s| s.body.as_str()).collect();
    assert_eq!(bodies, ["echo: first, slow", "echo: second, waits"]);
    app.settle().await;
    assert!(app.dead_letters("dispatch").await.is_empty());
    assert_eq!(app.twilio.sent().len(), 2, "each answered once");
    app.shutdown().await;
}

#[tokio::test]
async fn a_turn_that_waits_longer_than_the_maximum_is_dead_lettered_saying_why() {
    let app = spawn_app_configured(|c| {
        c.runtime.max_wait_ms = 1_500;
        c.dispatch.hold_timeout_ms = 200;
    })
    .await;
    let person = "+14155550611";
    second_message_behind_a_held_call(&app, person, "second, gives up").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    release_the_call(&app);

    let letters = app.wait_for_dead_letters("dispatch", WAIT).await;
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0]
            .error
            .starts_with("waited too long for turn 2 waits for turn 1"),
        "{}",
        letters[0].error
    );
    // Given up in its turn: the call before it still answered, then the turn was marked
    // failed so the person's next message is not stuck behind it.
    let sent = app.wait_for_sms(1, WAIT).await;
    assert_eq!(sent[0].body, "echo: first, slow");
    assert_eq!(app.send_sms(person, "third").await.status(), 200);
    let sent = app.wait_for_sms(2, WAIT).await;
    assert_eq!(sent[1].body, "echo: third");
    app.settle().await;
    let statuses: Vec<String> =
        sqlx::query_scalar("SELECT status FROM switchboard.turns ORDER BY seq")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(statuses, ["done", "failed", "done"]);
    assert_eq!(app.runner.calls().len(), 2, "the given-up turn never ran");
    app.shutdown().await;
}

#[tokio::test]
async fn a_turn_parked_when_its_dispatcher_stops_is_handed_back_and_answered_by_the_next() {
    // Dispatch runs as real processes; a waiting turn is parked, checking every 200 ms.
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(|c| c.dispatch.hold_timeout_ms = 200),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    let mut first = app.spawn_worker("dispatch");
    second_message_behind_a_held_call(&app, "+14155550640", "second, parked").await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // SIGTERM: the dispatcher finishes the call it holds and hands the parked turn back.
    sigterm(&first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    release_the_call(&app);
    let status = tokio::time::timeout(Duration::from_secs(15), first.wait())
        .await
        .expect("the dispatcher exits after draining")
        .expect("wait for the dispatcher");
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
    assert_eq!(app.runner.calls().len(), 1, "the parked turn was not run");

    let mut next = app.spawn_worker("dispatch");
    let sent = app.wait_for_sms(2, WAIT).await;
    let bodies: Vec<&str> = sent.iter().map(|s| s.body.as_str()).collect();
    assert_eq!(bodies, ["echo: first, slow", "echo: second, parked"]);
    app.settle().await;
    assert_eq!(app.runner.calls().len(), 2, "each turn called once");
    assert_eq!(app.twilio.sent().len(), 2, "each answered once");
    assert!(app.dead_letters("dispatch").await.is_empty());
    next.kill().await.ok();
    app.shutdown().await;
}

/// How long `first` waits to be redelivered after it failed.
const FIRST_RETRY: Duration = Duration::from_secs(3);

/// A stage of the test's own, on the public events: the message `first` fails its first
/// delivery (as under a database outage); every other message waits for `first` to be handled,
/// a little in its slot, then parked, like a reply waiting for the one before it.
struct WaitsForFirst {
    first_failed: std::sync::Mutex<Option<std::time::Instant>>,
    first_done: std::sync::atomic::AtomicBool,
    /// Runs of waiting handlers before `first` was handled: of messages pulled for the first
    /// time, and of parked ones run again.
    fresh_runs: std::sync::atomic::AtomicUsize,
    resumed_runs: std::sync::atomic::AtomicUsize,
    done: std::sync::atomic::AtomicUsize,
}

impl switchboard_kit::Stage for WaitsForFirst {
    type Input = switchboard_kit::proto::MessageReceived;
    const SPEC: switchboard_kit::StageSpec =
        switchboard_kit::StageSpec::new("test-waits", switchboard_kit::Source::Events("test.wait"))
            .concurrency(4)
            .batch(1)
            .retry(switchboard_kit::retry::Backoff::new(
                FIRST_RETRY,
                FIRST_RETRY,
            ));

    async fn handle(
        &self,
        m: switchboard_kit::proto::MessageReceived,
        attempt: &switchboard_kit::Attempt,
    ) -> switchboard_kit::Outcome {
        use std::sync::atomic::Ordering::SeqCst;
        if m.message_id == "first" {
            let mut failed = self.first_failed.lock().unwrap();
            if failed.is_none() {
                *failed = Some(std::time::Instant::now());
                return Err(switchboard_kit::StageError::transient(anyhow::anyhow!(
                    "the database is down"
                )));
            }
            self.first_done.store(true, SeqCst);
        } else {
            if !self.first_done.load(SeqCst) {
                let runs = if attempt.waits == 0 {
                    &self.fresh_runs
                } else {
                    &self.resumed_runs
                };
                runs.fetch_add(1, SeqCst);
            }
            switchboard_kit::Hold {
                poll: Duration::from_millis(5),
                hold: Duration::from_millis(20),
                retry: Duration::from_millis(10),
            }
            .until(
                || "first".to_string(),
                || async { Ok(self.first_done.load(SeqCst)) },
            )
            .await?;
        }
        self.done.fetch_add(1, SeqCst);
        Ok(vec![])
    }
}

#[tokio::test]
async fn messages_waiting_for_one_that_failed_do_not_keep_it_from_a_handler_slot() {
    use std::sync::atomic::Ordering::SeqCst;
    // More than get pulled before `first` is due again: a backlog, as after an outage.
    const WAITERS: usize = 600;
    let app = spawn_app_with(AppOptions::default()).await;
    let stage = std::sync::Arc::new(WaitsForFirst {
        first_failed: Default::default(),
        first_done: false.into(),
        fresh_runs: 0.into(),
        resumed_runs: 0.into(),
        done: 0.into(),
    });
    let spec = <WaitsForFirst as switchboard_kit::Stage>::SPEC;
    app.topology
        .apply(&app.js, &app.config.runtime, &[spec])
        .await
        .expect("the stage's consumer");
    let subject = app.topology.event("test.wait");
    for id in std::iter::once("first".to_string()).chain((0..WAITERS).map(|i| format!("w{i}"))) {
        let m = switchboard_kit::proto::MessageReceived {
            message_id: id,
            ..Default::default()
        };
        app.js
            .publish(subject.clone(), prost::Message::encode_to_vec(&m).into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    app.start(vec![app.app().shared_stage_task(stage.clone())]);

    let deadline = tokio::time::Instant::now() + WAIT;
    while stage.done.load(SeqCst) < WAITERS + 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        stage.done.load(SeqCst),
        WAITERS + 1,
        "every message handled"
    );
    // While messages wait, new ones still get at least the half of the slots parked ones may
    // not take: the pull loop is never starved, so the message they all wait for (`first`,
    // redelivered into the backlog) gets pulled. When parked messages queued ahead of the pull
    // loop every time, new ones got one slot in (parked + 1), and after an outage the pipeline
    // stalled.
    let fresh = stage.fresh_runs.load(SeqCst);
    let resumed = stage.resumed_runs.load(SeqCst);
    assert!(
        fresh * 100 >= (fresh + resumed) * 35,
        "new messages got {fresh} of {} handler runs while others waited",
        fresh + resumed
    );
    app.shutdown().await;
}
