//! What the worker runtime promises every stage: each outcome is on `/metrics` from the start,
//! a handler that panics is reported and its message retried at once, not lost to `ack_wait`,
//! and outputs NATS cannot store for a while (a stream's leader being elected) are stored when
//! it can, without spending the input's deliveries.
use std::sync::Mutex;
use std::time::{Duration, Instant};

use switchboard_e2e::{TestApp, spawn_app, spawn_app_configured};
use switchboard_kit::proto::MessageReceived;
use switchboard_kit::retry::Backoff;
use switchboard_kit::{Attempt, Outcome, Output, Source, Stage, StageSpec};

const WAIT: Duration = Duration::from_secs(20);

/// The value of the `/metrics` series `name` whose labels include every one of `labels`.
fn series(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// `/metrics` once `ready` holds for it (the stages register their series as they start).
async fn metrics_once(app: &TestApp, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let page = app.metrics().await;
        if ready(&page) || Instant::now() >= deadline {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_fresh_app_lists_every_outcome_of_its_stages_at_zero() {
    let app = spawn_app().await;
    // Spelled out rather than taken from the kit: a dashboard or alert names them so.
    let outcomes = [
        "ok",
        "retried",
        "deferred",
        "waiting_outage",
        "dead_lettered",
    ];
    let labels = |o| [("stage", "dispatch"), ("outcome", o)];
    let page = metrics_once(&app, |page| {
        outcomes
            .iter()
            .all(|o| series(page, "sb_stage_messages_total", &labels(o)).is_some())
    })
    .await;
    for o in outcomes {
        assert_eq!(
            series(&page, "sb_stage_messages_total", &labels(o)),
            Some(0.0),
            "sb_stage_messages_total{{stage=\"dispatch\",outcome=\"{o}\"}} at 0"
        );
    }
    assert_eq!(
        series(&page, "sb_stage_panics_total", &[("stage", "dispatch")]),
        Some(0.0)
    );
    app.shutdown().await;
}

/// A stage of the test's own whose handler panics on the first delivery of `boom` (a bug that
/// a retry may not meet again), and handles everything else.
struct PanicsOnBoom {
    /// Each run: the message, its delivery, when.
    runs: Mutex<Vec<(String, u64, Instant)>>,
}

impl PanicsOnBoom {
    fn runs_of(&self, id: &str) -> Vec<(u64, Instant)> {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _, _)| m == id)
            .map(|(_, d, at)| (*d, *at))
            .collect()
    }
}

impl Stage for PanicsOnBoom {
    type Input = MessageReceived;
    const SPEC: StageSpec = StageSpec::new("test-panics", Source::Events("test.panic"))
        .batch(1)
        .retry(Backoff::new(
            Duration::from_millis(200),
            Duration::from_millis(200),
        ));

    async fn handle(&self, m: MessageReceived, attempt: &Attempt) -> Outcome {
        self.runs
            .lock()
            .unwrap()
            .push((m.message_id.clone(), attempt.delivered, Instant::now()));
        if m.message_id == "boom" && attempt.delivered == 1 {
            panic!("a bug in the handler, met by {}", m.message_id);
        }
        Ok(vec![])
    }
}

/// A `MessageReceived` with id `id` on the event `event`, stored.
async fn publish(app: &TestApp, event: &str, id: &str) {
    let m = MessageReceived {
        message_id: id.into(),
        ..Default::default()
    };
    app.js
        .publish(
            app.topology.event(event),
            prost::Message::encode_to_vec(&m).into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored");
}

#[tokio::test]
async fn a_handler_that_panics_is_reported_and_its_message_retried_at_once_not_after_ack_wait() {
    // An ack wait far longer than the retry delay: a panic left to the task came back only
    // when JetStream redelivered the message, after it.
    let ack_wait = Duration::from_secs(40);
    let app =
        spawn_app_configured(move |c| c.runtime.ack_wait_ms = ack_wait.as_millis() as u64).await;
    let stage = std::sync::Arc::new(PanicsOnBoom {
        runs: Mutex::new(Vec::new()),
    });
    app.topology
        .apply(&app.js, &app.config.runtime, &[PanicsOnBoom::SPEC])
        .await
        .expect("the stage's consumer");
    app.start(vec![app.app().shared_stage_task(stage.clone())]);
    publish(&app, "test.panic", "boom").await;

    let deadline = Instant::now() + ack_wait / 2;
    while stage.runs_of("boom").len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let boom = stage.runs_of("boom");
    assert_eq!(
        boom.iter().map(|(d, _)| *d).collect::<Vec<_>>(),
        [1, 2],
        "the message that panicked its handler is handled again (a failed delivery), well \
         before the ack wait ({ack_wait:?})"
    );
    // The process goes on: a message after the panic is handled.
    publish(&app, "test.panic", "after").await;
    let deadline = Instant::now() + WAIT;
    while stage.runs_of("after").is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stage.runs_of("after").len(), 1, "handled after the panic");
    let labels = [("stage", "test-panics")];
    let page = metrics_once(&app, |page| {
        series(page, "sb_stage_panics_total", &labels) == Some(1.0)
    })
    .await;
    assert_eq!(
        series(&page, "sb_stage_panics_total", &labels),
        Some(1.0),
        "the panic is counted"
    );
    assert_eq!(
        series(
            &page,
            "sb_stage_messages_total",
            &[("stage", "test-panics"), ("outcome", "retried")]
        ),
        Some(1.0),
        "as a failed delivery"
    );
    app.shutdown().await;
}

/// A stage of the test's own that forwards each event to `<prefix>.mailbox.forwarded`, a
/// subject no stream holds until the test makes one.
struct Forwards {
    /// Each run's delivery.
    runs: Mutex<Vec<u64>>,
    subject: String,
}

impl Stage for Forwards {
    type Input = MessageReceived;
    const SPEC: StageSpec = StageSpec::new("test-forwards", Source::Events("test.forward"))
        .batch(1)
        .retry(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(200),
        ));

    async fn handle(&self, m: MessageReceived, attempt: &Attempt) -> Outcome {
        self.runs.lock().unwrap().push(attempt.delivered);
        Ok(vec![Output::new(
            self.subject.clone(),
            m.message_id.clone(),
            &m,
        )])
    }
}

#[tokio::test]
async fn outputs_nats_cannot_store_for_a_while_are_stored_when_it_can_without_spending_deliveries()
{
    let app = spawn_app().await;
    let subject = format!("{}.mailbox.forwarded", app.config.subject_prefix);
    let stage = std::sync::Arc::new(Forwards {
        runs: Mutex::new(Vec::new()),
        subject: subject.clone(),
    });
    app.topology
        .apply(&app.js, &app.config.runtime, &[Forwards::SPEC])
        .await
        .expect("the stage's consumer");
    app.start(vec![app.app().shared_stage_task(stage.clone())]);
    publish(&app, "test.forward", "m1").await;
    // For 3 s no stream takes the output (as while its stream's leader is elected): with a
    // retry delay of 100-200 ms, handing the input back each time would have spent every one
    // of its deliveries and had it given up as a crash loop.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stream = format!("{}_FORWARDED", app.config.subject_prefix.to_uppercase());
    let mut forwarded = app
        .js
        .create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![subject],
            ..Default::default()
        })
        .await
        .expect("the stream the output waits for");
    let deadline = Instant::now() + WAIT;
    while forwarded.info().await.unwrap().state.messages == 0 {
        assert!(Instant::now() < deadline, "the output was never stored");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        *stage.runs.lock().unwrap(),
        [1],
        "handled once, on its first delivery"
    );
    assert!(
        app.dead_letters("test-forwards").await.is_empty(),
        "given up"
    );
    let _ = app.js.delete_stream(&stream).await;
    app.shutdown().await;
}
