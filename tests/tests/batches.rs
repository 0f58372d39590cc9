//! Stages that take a whole pull at once, and stages that follow the public events: the same
//! runtime, the same promises (every message settled on its own, nothing lost, nothing doubled).
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use prost::Message as _;
use switchboard::stages;
use switchboard_e2e::{AppOptions, spawn_app_with};
use switchboard_kit::proto::{InboundMessage, MessageLogged, Person, Turn};
use switchboard_kit::{Attempt, BatchStage, Outcome, Source, Stage, StageError, StageSpec};

const WAIT: Duration = Duration::from_secs(30);

async fn publish(app: &switchboard_e2e::TestApp, subject: String, payload: Vec<u8>) {
    app.js
        .publish(subject, payload.into())
        .await
        .expect("publish")
        .await
        .expect("stored");
}

#[tokio::test]
async fn a_backlog_is_logged_in_batches_and_one_bad_message_in_a_batch_fails_alone() {
    // The inbound log starts late, so a backlog waits for it: good turns, one payload that is
    // not a turn, and one turn of a session that does not exist (the database refuses its row).
    let app = spawn_app_with(AppOptions {
        in_process: vec!["identify", "session"],
        ..Default::default()
    })
    .await;
    const PEOPLE: usize = 12;
    for i in 0..PEOPLE {
        let from = format!("+1415555{:04}", 3000 + i);
        assert_eq!(
            app.send_sms(&from, &format!("hello {i}")).await.status(),
            200
        );
    }
    let turns = format!("{}.turn.>", app.topology.prefix());
    let deadline = Instant::now() + WAIT;
    while app.stored_on(&turns).await < PEOPLE as u64 {
        assert!(Instant::now() < deadline, "the turns were not opened");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let garbage = vec![0xff, 0xff, 0xff, 0x01];
    let orphan_session = uuid::Uuid::now_v7();
    let orphan = Turn {
        session_id: orphan_session.to_string(),
        seq: 1,
        agent_name: "reggie_oc".into(),
        agent_identity: "reggie".into(),
        message: Some(switchboard_kit::proto::IdentifiedMessage {
            inbound: Some(InboundMessage {
                id: uuid::Uuid::now_v7().to_string(),
                channel: "sms".into(),
                text: "from nowhere".into(),
                correlation_id: "orphan".into(),
                ..Default::default()
            }),
            person: Some(Person {
                person_id: "phone:+14155550000".into(),
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    publish(&app, app.topology.turn(&orphan_session), garbage.clone()).await;
    publish(
        &app,
        app.topology.turn(&orphan_session),
        orphan.encode_to_vec(),
    )
    .await;
    assert_eq!(app.stored_on(&turns).await, PEOPLE as u64 + 2);

    app.start(stages::tasks(
        app.app(),
        &stages::select(&["log-inbound"]).expect("a stage"),
    ));

    let letters = app.wait_for_dead_letters("log-inbound", WAIT).await;
    let deadline = Instant::now() + WAIT;
    let mut letters = letters;
    while letters.len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        letters = app.dead_letters("log-inbound").await;
    }
    let mut rows = app.log_rows().await;
    while rows.len() < PEOPLE && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        rows = app.log_rows().await;
    }
    // Every good message is logged once; exactly the two bad ones are dead-lettered, each
    // with its own reason, on its first delivery (nobody else's failure cost them a retry).
    assert_eq!(rows.len(), PEOPLE, "{rows:?}");
    assert!(rows.iter().all(|r| r.direction == "inbound"));
    assert_eq!(letters.len(), 2, "{letters:?}");
    let undecodable = letters
        .iter()
        .find(|l| l.payload == garbage)
        .expect("the garbage is dead-lettered");
    assert!(
        undecodable.error.contains("undecodable"),
        "{}",
        undecodable.error
    );
    let refused = letters
        .iter()
        .find(|l| l.payload == orphan.encode_to_vec())
        .expect("the orphan turn is dead-lettered");
    assert!(
        refused.error.contains("refused") && refused.error.contains("foreign key"),
        "{}",
        refused.error
    );
    assert!(letters.iter().all(|l| l.delivery_count == 1), "{letters:?}");

    // And it was batched: fewer handler calls than messages.
    let metrics = app.metrics().await;
    let batches = metric(&metrics, "sb_stage_batch_size_count{stage=\"log-inbound\"}");
    let batched = metric(&metrics, "sb_stage_batch_size_sum{stage=\"log-inbound\"}");
    assert!(
        batches >= 1.0 && batched > batches,
        "batches: {batches}, messages in them: {batched}\n{metrics}"
    );
    app.shutdown().await;
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .map(|v| v.trim().parse().unwrap_or(0.0))
        })
        .unwrap_or(0.0)
}

/// A stage of the test's own, following `message.logged` on the public events stream: it fails
/// the first delivery of the first event it sees, and records what it handled.
struct Follower {
    failed_once: AtomicBool,
    handled: Mutex<HashMap<String, Vec<u64>>>,
}

impl Stage for Follower {
    type Input = MessageLogged;
    const SPEC: StageSpec = StageSpec::new("test-follower", Source::Events("message.logged"))
        .max_deliver(3)
        .retry(switchboard_kit::retry::Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(100),
        ));

    async fn handle(&self, event: MessageLogged, attempt: &Attempt) -> Outcome {
        if !self.failed_once.swap(true, Ordering::SeqCst) {
            return Err(StageError::transient(anyhow::anyhow!(
                "first delivery fails"
            )));
        }
        self.handled
            .lock()
            .unwrap()
            .entry(event.message_id)
            .or_default()
            .push(attempt.delivered);
        Ok(vec![])
    }
}

#[tokio::test]
async fn a_stage_following_the_public_events_gets_each_event_retries_and_dead_letters() {
    let app = spawn_app_with(AppOptions::default()).await;
    let follower = std::sync::Arc::new(Follower {
        failed_once: AtomicBool::new(false),
        handled: Mutex::new(HashMap::new()),
    });
    app.topology
        .apply(&app.js, &app.config.runtime, &[Follower::SPEC])
        .await
        .expect("the follower's consumer");
    app.start(vec![app.app().shared_stage_task(follower.clone())]);

    for i in 0..3 {
        let from = format!("+1415555{:04}", 4000 + i);
        assert_eq!(app.send_sms(&from, "hi").await.status(), 200);
    }
    app.wait_for_sms(3, WAIT).await;
    let garbage = vec![0xfe, 0xff, 0x00];
    publish(&app, app.topology.event("message.logged"), garbage.clone()).await;

    // Three messages in, three replies out: six log rows, six events, each handled once.
    let deadline = Instant::now() + WAIT;
    loop {
        let handled = follower.handled.lock().unwrap().clone();
        if handled.len() >= 6 || Instant::now() > deadline {
            assert_eq!(handled.len(), 6, "{handled:?}");
            assert!(handled.values().all(|d| d.len() == 1), "{handled:?}");
            // The event whose first delivery failed came back as delivery 2.
            assert_eq!(
                handled.values().filter(|d| d[0] == 2).count(),
                1,
                "{handled:?}"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let letters = app.wait_for_dead_letters("test-follower", WAIT).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].payload, garbage);
    assert!(
        letters[0].error.contains("undecodable"),
        "{}",
        letters[0].error
    );
    assert_eq!(letters[0].subject, app.topology.event("message.logged"));
    app.shutdown().await;
}

/// A batch stage of the test's own that lingers: it records the batches it was handed.
struct Lingering {
    calls: std::sync::Arc<Mutex<Vec<Vec<String>>>>,
}

impl BatchStage for Lingering {
    type Input = MessageLogged;
    const SPEC: StageSpec = StageSpec::new("test-lingering", Source::Events("message.logged"))
        .linger(Duration::from_millis(1500));

    async fn handle_batch(&self, events: Vec<MessageLogged>, _: &[Attempt]) -> Vec<Outcome> {
        let ids = events.iter().map(|e| e.message_id.clone()).collect();
        self.calls.lock().unwrap().push(ids);
        events.iter().map(|_| Ok(vec![])).collect()
    }
}

#[tokio::test]
async fn a_lingering_batch_stage_takes_what_comes_within_its_linger_in_one_call() {
    // Nothing else runs: the events are the test's own.
    let app = spawn_app_with(AppOptions {
        in_process: vec![],
        ..Default::default()
    })
    .await;
    app.topology
        .apply(&app.js, &app.config.runtime, &[Lingering::SPEC])
        .await
        .expect("the stage's consumer");
    let calls = std::sync::Arc::new(Mutex::new(Vec::new()));
    app.start(vec![app.app().batch_stage_task(Lingering {
        calls: calls.clone(),
    })]);
    let event = |id: &str| {
        MessageLogged {
            message_id: id.into(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    // Three events a little apart, all within the linger of the first: one call, not three
    // (seen: three calls of one event each while the stage did not linger).
    for id in ["first", "second", "third"] {
        publish(&app, app.topology.event("message.logged"), event(id)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let calls = calls.lock().unwrap().clone();
        let handled: usize = calls.iter().map(Vec::len).sum();
        if handled >= 3 || Instant::now() > deadline {
            assert_eq!(calls, vec![vec!["first", "second", "third"]]);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.shutdown().await;
}
