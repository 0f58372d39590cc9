//! An agent host that goes down: its turns wait for it, durably and without using up their
//! failure budget; each person is told once that the agent will answer shortly; when it is
//! back, every turn is answered, each session's in order.
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchboard_e2e::{AppOptions, TestApp, sigterm, spawn_app_configured, spawn_app_with};
use switchboard_kit::config::Config;

const PERSON: &str = "+14155550181";
const OTHER: &str = "+14155550182";
const WAIT: Duration = Duration::from_secs(30);

fn outage_settings(c: &mut Config) {
    // A wait for the runner must neither use up deliveries nor end at the wait limit.
    c.runtime.max_deliver = 3;
    c.runtime.max_wait_ms = 5_000;
    c.dispatch.breaker_failures = 2;
    c.dispatch.breaker_probe_ms = 300;
    c.dispatch.breaker_probe_max_ms = 2_000;
}

/// [`outage_settings`], with a down runner probed every `probe` (not doubling).
async fn app_probing_every(probe: Duration) -> TestApp {
    let ms = probe.as_millis() as u64;
    spawn_app_configured(move |c| {
        outage_settings(c);
        c.dispatch.breaker_probe_ms = ms;
        c.dispatch.breaker_probe_max_ms = ms;
    })
    .await
}

async fn session_row(app: &TestApp, person: &str) -> (String, Option<uuid::Uuid>) {
    sqlx::query_as("SELECT status, waiting_notice FROM switchboard.sessions WHERE person_id = $1")
        .bind(format!("phone:{person}"))
        .fetch_one(&app.db)
        .await
        .unwrap()
}

fn bodies_to(app: &TestApp, to: &str) -> Vec<String> {
    app.twilio
        .sent()
        .into_iter()
        .filter(|m| m.to == to)
        .map(|m| m.body)
        .collect()
}

/// What the dispatcher's `/metrics` say of its breaker for the app's runner (1: open), as an
/// operator's alert reads it.
async fn breaker_open(app: &TestApp) -> Option<f64> {
    let line = format!(
        "sb_dispatch_runner_breaker_open{{runner=\"{}\"}} ",
        app.config.agents[0].runner_url
    );
    let metrics = app.metrics().await;
    let value = metrics
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str()))?;
    value.trim().parse().ok()
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_runner_down_for_30_s_loses_nothing_tells_each_person_once_and_answers_in_order_after() {
    let app = spawn_app_configured(outage_settings).await;
    let notice = app.config.dispatch.runner_down_notice.clone();
    app.send_sms(PERSON, "before").await;
    app.wait_for_sms(1, WAIT).await;

    app.runner.set_down(true);
    let down_at = Instant::now();
    for text in ["one", "two", "three"] {
        assert_eq!(app.send_sms(PERSON, text).await.status(), 200);
    }
    app.send_sms(OTHER, "hello?").await;
    // Each person hears from us once, and only that.
    until("both notices", || {
        bodies_to(&app, PERSON).len() == 2 && bodies_to(&app, OTHER).len() == 1
    })
    .await;
    assert_eq!(bodies_to(&app, PERSON), ["echo: before", notice.as_str()]);
    assert_eq!(bodies_to(&app, OTHER), [notice.as_str()]);

    // Down for 30 s: far past the wait limit and the delivery budget's retries.
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(down_at.elapsed())).await;
    assert_eq!(bodies_to(&app, PERSON).len(), 2, "told more than once");
    assert_eq!(bodies_to(&app, OTHER).len(), 1, "told more than once");
    assert!(
        app.dead_letters("dispatch").await.is_empty(),
        "a waiting turn was given up"
    );
    assert_eq!(session_row(&app, PERSON).await.0, "waiting");
    // An operator sees both sessions waiting for the agent's runner.
    let out = app.cli(&["status".as_ref(), "--json".as_ref()]).await;
    let status: Value = serde_json::from_slice(&out.stdout).expect("status --json");
    let agent = &app.config.agents[0].name;
    assert_eq!(status["waiting_for_runner"][agent.as_str()], 2, "{status}");
    let probes = app.runner.refused.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        probes >= 3,
        "the runner was not probed while down ({probes} calls)"
    );
    assert!(
        probes < 200,
        "the down runner was hammered: {probes} calls in 30 s"
    );

    app.runner.set_down(false);
    until("every answer", || {
        bodies_to(&app, PERSON).len() == 5 && bodies_to(&app, OTHER).len() == 2
    })
    .await;
    assert_eq!(
        bodies_to(&app, PERSON),
        [
            "echo: before",
            notice.as_str(),
            "echo: one",
            "echo: two",
            "echo: three"
        ]
    );
    assert_eq!(bodies_to(&app, OTHER), [notice.as_str(), "echo: hello?"]);
    app.settle().await;
    // The agent ran each turn once, in order, resuming one engine session.
    let person_calls: Vec<_> = app
        .runner
        .calls()
        .into_iter()
        .filter(|c| switchboard_e2e::fakes::person_of(&c.prompt) == format!("phone:{PERSON}"))
        .collect();
    let said: Vec<String> = person_calls
        .iter()
        .map(|c| switchboard_e2e::fakes::FakeRunner::said(&c.prompt))
        .collect();
    assert_eq!(said, ["before", "one", "two", "three"]);
    assert!(
        person_calls[1..]
            .iter()
            .all(|c| c.session_id.as_deref() == Some("eng-1"))
    );
    assert_eq!(session_row(&app, PERSON).await, ("idle".to_string(), None));
    // The notice is in the conversation's log, and in the journal once.
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.session_events e
           JOIN switchboard.sessions s ON s.id = e.session_id
          WHERE s.person_id = $1 AND e.kind = 'waiting'",
    )
    .bind(format!("phone:{PERSON}"))
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(waiting, 1);
    let logged: Vec<String> = app
        .log_rows()
        .await
        .into_iter()
        .filter(|r| r.direction == "outbound" && r.person_id == format!("phone:{PERSON}"))
        .map(|r| r.message)
        .collect();
    assert!(logged.contains(&notice), "{logged:?}");
    app.shutdown().await;
}

#[tokio::test]
async fn an_api_caller_waiting_for_an_answer_is_not_answered_by_the_notice() {
    let app = spawn_app_configured(|c| {
        outage_settings(c);
        c.api.wait_max_ms = 3_000;
    })
    .await;
    let key = app.api_key("ops", &[]).await;
    app.runner.set_down(true);
    let response = app
        .post_api_message(
            &key,
            json!({"agent": "reggie_oc", "text": "status?", "wait": true}),
            None,
        )
        .await;
    assert_eq!(response.status(), 202, "pending, not answered");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "pending");
    assert_eq!(body["replies"], json!([]));
    assert_eq!(
        body["notices"][0]["text"],
        json!(app.config.dispatch.runner_down_notice)
    );
    let correlation = body["correlation_id"].as_str().unwrap().to_string();

    app.runner.set_down(false);
    let deadline = Instant::now() + WAIT;
    loop {
        let body: Value = app
            .get_api_message(&key, &correlation)
            .await
            .json()
            .await
            .unwrap();
        if body["status"] == "answered" {
            assert_eq!(body["replies"][0]["text"], "echo: status?");
            assert_eq!(body["notices"].as_array().map(Vec::len), Some(1));
            break;
        }
        assert!(Instant::now() < deadline, "never answered: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.shutdown().await;
}

/// Messages that waited out a long outage: by default answered with their age in the prompt;
/// with `stale_turns = expire`, not run, dead-lettered as expired and the person told.
#[tokio::test]
async fn after_a_long_outage_a_stale_message_is_answered_knowing_its_age_or_expired_and_told() {
    // Turns older than 2 s are stale; the outage lasts longer.
    let answer = spawn_app_configured(|c| {
        outage_settings(c);
        c.dispatch.max_turn_age_s = 2;
    })
    .await;
    answer.runner.set_down(true);
    answer.send_sms(PERSON, "is my order shipped?").await;
    answer.wait_for_sms(1, WAIT).await; // the notice
    tokio::time::sleep(Duration::from_secs(3)).await;
    answer.runner.set_down(false);
    let sent = answer.wait_for_sms(2, WAIT).await;
    assert_eq!(sent[1].body, "echo: is my order shipped?");
    let prompt = &answer.runner.calls()[0].prompt;
    assert!(
        prompt.contains("longer than turns are meant to wait"),
        "{prompt}"
    );
    answer.shutdown().await;

    let expire = spawn_app_configured(|c| {
        outage_settings(c);
        c.dispatch.max_turn_age_s = 2;
        c.dispatch.stale_turns = switchboard_kit::config::StaleTurns::Expire;
    })
    .await;
    expire.runner.set_down(true);
    expire.send_sms(PERSON, "is my order shipped?").await;
    expire.wait_for_sms(1, WAIT).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    expire.runner.set_down(false);
    let letters = expire.wait_for_dead_letters("dispatch", WAIT).await;
    assert!(
        letters[0].error.starts_with("expired: "),
        "{}",
        letters[0].error
    );
    let sent = expire.wait_for_sms(2, WAIT).await;
    assert!(
        sent[1].body.starts_with("Sorry: your message sent ")
            && sent[1].body.contains("was not answered"),
        "{}",
        sent[1].body
    );
    // The agent never saw it, and the session goes on: the next message is answered.
    assert!(expire.runner.calls().is_empty());
    expire.send_sms(PERSON, "hello again").await;
    let sent = expire.wait_for_sms(3, WAIT).await;
    assert_eq!(sent[2].body, "echo: hello again");
    expire.shutdown().await;
}

/// Send `signal` (`STOP`, `CONT`) to a worker process.
fn signal(worker: &tokio::process::Child, signal: &str) {
    let pid = worker.id().expect("a running worker").to_string();
    let sent = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .expect("send a signal");
    assert!(sent.success(), "SIG{signal} to {pid}");
}

/// A dispatcher's breaker is its own: after another replica found the runner back, it may
/// still be open, waiting for its next probe. A person who writes then is answered before that
/// probe, never told that the agent is unavailable, and the person who was told is answered.
#[tokio::test]
async fn a_person_writing_after_another_dispatcher_found_the_runner_back_is_answered_not_told() {
    // Dispatcher `stale` probes a down runner only every STALE; `finder` every 300 ms.
    const STALE: Duration = Duration::from_secs(30);
    let app = spawn_app_with(AppOptions {
        // `outage_settings` allows 3 deliveries: a turn handed to a dispatcher whose breaker is
        // still closed waits on the session's recorded outage instead of spending them.
        tweak: Box::new(outage_settings),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    let notice = app.config.dispatch.runner_down_notice.clone();
    let ms = STALE.as_millis().to_string();
    let mut stale = app.spawn_worker_with_env(
        "dispatch",
        &[
            ("SB_DISPATCH__BREAKER_PROBE_MS", ms.clone()),
            ("SB_DISPATCH__BREAKER_PROBE_MAX_MS", ms),
        ],
    );
    app.runner.set_down(true);
    // `stale`'s breaker opens after this: its next probe is no sooner than STALE from here.
    let before_open = Instant::now();
    app.send_sms(PERSON, "anyone there?").await;
    until("the notice", || bodies_to(&app, PERSON).len() == 1).await;
    assert_eq!(bodies_to(&app, PERSON), [notice.as_str()]);

    // `stale` stalls; the waiting turn comes back to `finder`, which finds the runner down too
    // (its breaker opens, then probes) ...
    let mut finder = app.spawn_worker("dispatch");
    signal(&stale, "STOP");
    let refused = app.runner.refused.load(Ordering::SeqCst);
    until("the other dispatcher's breaker open and probing", || {
        app.runner.refused.load(Ordering::SeqCst) >= refused + 3
    })
    .await;
    signal(&stale, "CONT");
    // ... and finds it back: the waiting person is answered, told once.
    app.runner.set_down(false);
    until("the waiting person's answer", || {
        bodies_to(&app, PERSON).len() == 2
    })
    .await;
    assert_eq!(
        bodies_to(&app, PERSON),
        [notice.as_str(), "echo: anyone there?"]
    );
    // `finder` leaves (scaled down); `stale` is the only dispatcher, its breaker still open.
    sigterm(&finder);
    tokio::time::timeout(WAIT, finder.wait())
        .await
        .expect("the dispatcher drains and exits")
        .ok();

    app.send_sms(OTHER, "hello").await;
    until("the answer", || !bodies_to(&app, OTHER).is_empty()).await;
    assert_eq!(
        bodies_to(&app, OTHER),
        ["echo: hello"],
        "told the agent is unavailable while it was back"
    );
    assert!(
        before_open.elapsed() < STALE,
        "answered only at the stale breaker's probe, {:?} after it opened (probes every {STALE:?})",
        before_open.elapsed()
    );
    app.settle().await;
    assert_eq!(session_row(&app, OTHER).await, ("idle".to_string(), None));
    assert_eq!(
        bodies_to(&app, PERSON).len(),
        2,
        "the told person, told once"
    );
    stale.kill().await.ok();
    app.shutdown().await;
}

/// Messages waiting behind their sender's earlier message do not keep a dispatcher busy: a
/// person who writes in the middle of an outage is told, however many messages of other people
/// already wait, and everyone is answered, in order, when the runner is back.
#[tokio::test]
async fn a_person_writing_late_in_an_outage_is_told_however_many_messages_wait_before_theirs() {
    let app = spawn_app_configured(|c| {
        outage_settings(c);
        // Four handler slots, and waiting turns that would keep one for the default 20 s.
        c.stages.insert(
            "dispatch".into(),
            switchboard_kit::stage::StageOverrides {
                concurrency: Some(4),
                ..Default::default()
            },
        );
        c.dispatch.hold_timeout_ms = 20_000;
    })
    .await;
    let notice = app.config.dispatch.runner_down_notice.clone();
    let early: Vec<String> = (0..4).map(|i| format!("+1415555070{i}")).collect();
    let late = "+14155550709";
    app.runner.set_down(true);
    // Four people write three messages each: eight wait behind their sender's first.
    for person in &early {
        for text in ["a", "b", "c"] {
            assert_eq!(app.send_sms(person, text).await.status(), 200);
        }
    }
    until("the first four told", || {
        early.iter().all(|p| bodies_to(&app, p).len() == 1)
    })
    .await;
    app.send_sms(late, "still there?").await;
    until("the late writer told", || !bodies_to(&app, late).is_empty()).await;
    assert_eq!(bodies_to(&app, late), [notice.as_str()]);

    app.runner.set_down(false);
    until("every answer", || {
        early.iter().all(|p| bodies_to(&app, p).len() == 4) && bodies_to(&app, late).len() == 2
    })
    .await;
    for person in &early {
        assert_eq!(
            bodies_to(&app, person),
            [notice.as_str(), "echo: a", "echo: b", "echo: c"]
        );
    }
    assert_eq!(
        bodies_to(&app, late),
        [notice.as_str(), "echo: still there?"]
    );
    app.settle().await;
    assert!(app.dead_letters("dispatch").await.is_empty());
    app.shutdown().await;
}

/// When a probe finds the runner back, every turn waiting for it goes on at once: none waits
/// for a probe time of its own.
#[tokio::test]
async fn when_the_runner_is_back_every_waiting_person_is_answered_at_once_not_at_the_next_probe() {
    // Probes 6 s apart: a turn that waited for the next one would be answered 6 s late.
    let app = app_probing_every(Duration::from_secs(6)).await;
    let notice = app.config.dispatch.runner_down_notice.clone();
    let people: Vec<String> = (0..3).map(|i| format!("+1415555072{i}")).collect();
    app.runner.set_down(true);
    for person in &people {
        app.send_sms(person, "are you there?").await;
    }
    until("everyone told", || {
        people.iter().all(|p| bodies_to(&app, p).len() == 1)
    })
    .await;
    assert_eq!(breaker_open(&app).await, Some(1.0), "the breaker is open");
    // Back, and slow: the turns that resume while the probe's call runs must not be sent to
    // wait for another probe.
    app.runner.set_delay(Duration::from_millis(1_000));
    app.runner.set_down(false);
    until("every answer", || {
        people.iter().all(|p| bodies_to(&app, p).len() == 2)
    })
    .await;
    for person in &people {
        assert_eq!(
            bodies_to(&app, person),
            [notice.as_str(), "echo: are you there?"]
        );
    }
    assert_eq!(breaker_open(&app).await, Some(0.0), "the breaker closed");
    let answered: Vec<_> = app
        .twilio
        .sent()
        .into_iter()
        .filter(|m| m.body.starts_with("echo: "))
        .map(|m| m.created)
        .collect();
    let first = answered.iter().min().unwrap();
    let last = answered.iter().max().unwrap();
    assert!(
        *last - *first < chrono::Duration::seconds(4),
        "answered {} ms apart: a waiting turn kept to its own probe time",
        (*last - *first).num_milliseconds()
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_person_whose_wait_could_not_be_recorded_at_first_is_told_as_soon_as_it_can_be() {
    // The runner is probed only every 10 s, so a turn that waited for the next probe before
    // telling anyone would leave its person in silence that long.
    let app = app_probing_every(Duration::from_secs(10)).await;
    let notice = app.config.dispatch.runner_down_notice.clone();
    // The database refuses the first write that marks a session waiting (as while Postgres
    // restarts); a sequence counts the attempts, since the failed transaction rolls back.
    sqlx::raw_sql(
        "CREATE SEQUENCE switchboard.fail_waiting_once;
         CREATE FUNCTION switchboard.fail_waiting_once() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.status = 'waiting' AND nextval('switchboard.fail_waiting_once') = 1 THEN
                 RAISE EXCEPTION 'simulated: the database cannot be written';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER fail_waiting_once BEFORE UPDATE ON switchboard.sessions
             FOR EACH ROW EXECUTE FUNCTION switchboard.fail_waiting_once();",
    )
    .execute(&app.db)
    .await
    .unwrap();
    app.send_sms(PERSON, "before").await;
    app.wait_for_sms(1, WAIT).await;

    app.runner.set_down(true);
    let down_at = Instant::now();
    assert_eq!(app.send_sms(PERSON, "are you there?").await.status(), 200);
    until("the notice", || bodies_to(&app, PERSON).len() == 2).await;
    assert!(
        down_at.elapsed() < Duration::from_secs(6),
        "told {:?} after the runner went down: the turn waited for the next probe",
        down_at.elapsed()
    );
    let failed: i64 = sqlx::query_scalar("SELECT last_value FROM switchboard.fail_waiting_once")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert!(
        failed >= 2,
        "the first mark was refused and a later one made"
    );
    assert_eq!(bodies_to(&app, PERSON), ["echo: before", notice.as_str()]);

    app.runner.set_down(false);
    until("the answer", || bodies_to(&app, PERSON).len() == 3).await;
    assert_eq!(
        bodies_to(&app, PERSON),
        ["echo: before", notice.as_str(), "echo: are you there?"],
        "told once, then answered"
    );
    app.shutdown().await;
}

/// The notices (their ids) the message log holds for `person`, and the waits of theirs the
/// sessions' journal records (the notice each names), oldest first.
async fn notices_and_waits(app: &TestApp, person: &str) -> (Vec<String>, Vec<String>) {
    let person = format!("phone:{person}");
    let notices = sqlx::query_scalar(
        "SELECT id::text FROM switchboard.messages
          WHERE person_id = $1 AND metadata->>'kind' = 'notice' ORDER BY id",
    )
    .bind(&person)
    .fetch_all(&app.db)
    .await
    .unwrap();
    let waits = sqlx::query_scalar(
        "SELECT e.detail->>'notice_id' FROM switchboard.session_events e
           JOIN switchboard.sessions s ON s.id = e.session_id
          WHERE s.person_id = $1 AND e.kind = 'waiting' ORDER BY e.id",
    )
    .bind(&person)
    .fetch_all(&app.db)
    .await
    .unwrap();
    (notices, waits)
}

#[tokio::test]
async fn a_person_whose_wait_the_database_cannot_record_is_told_anyway_once_and_the_wait_kept() {
    let app = app_probing_every(Duration::from_secs(1)).await;
    let notice = app.config.dispatch.runner_down_notice.clone();
    app.send_sms(PERSON, "before").await;
    app.wait_for_sms(1, WAIT).await;
    // Every write marking a session waiting fails as when Postgres shuts down under it (a
    // connection error's SQLSTATE): a dispatcher killed now, before the database is back,
    // would leave its person in silence until the runner is back.
    sqlx::raw_sql(
        "CREATE FUNCTION switchboard.database_down_for_waits() RETURNS trigger
             LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.status = 'waiting' THEN
                 RAISE EXCEPTION 'simulated: the database is shutting down'
                     USING ERRCODE = 'admin_shutdown';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER database_down_for_waits BEFORE UPDATE ON switchboard.sessions
             FOR EACH ROW EXECUTE FUNCTION switchboard.database_down_for_waits();",
    )
    .execute(&app.db)
    .await
    .unwrap();

    app.runner.set_down(true);
    assert_eq!(app.send_sms(PERSON, "are you there?").await.status(), 200);
    until("the notice", || bodies_to(&app, PERSON).len() == 2).await;
    assert_eq!(bodies_to(&app, PERSON), ["echo: before", notice.as_str()]);
    // The dispatcher could not record the wait; the message log recorded it with the notice.
    let (status, marked) = session_row(&app, PERSON).await;
    assert!(
        status != "waiting" && marked.is_none(),
        "the database refused every mark: {status} {marked:?}"
    );
    let deadline = Instant::now() + WAIT;
    let (notices, waits) = loop {
        let (notices, waits) = notices_and_waits(&app, PERSON).await;
        if !waits.is_empty() || Instant::now() > deadline {
            break (notices, waits);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(notices.len(), 1, "one notice logged: {notices:?}");
    assert_eq!(
        waits, notices,
        "the wait the notice told of is in the journal"
    );

    // The database takes writes again while the runner is still down: the turn's next try
    // records the wait under the notice it already told, and tells it again, the same message.
    sqlx::raw_sql(
        "DROP TRIGGER database_down_for_waits ON switchboard.sessions;
         DROP FUNCTION switchboard.database_down_for_waits();",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let deadline = Instant::now() + WAIT;
    let marked = loop {
        if let (status, Some(marked)) = session_row(&app, PERSON).await {
            assert_eq!(status, "waiting");
            break marked;
        }
        assert!(Instant::now() < deadline, "the wait was never marked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(marked.to_string(), notices[0], "the notice already told");

    app.runner.set_down(false);
    until("the answer", || bodies_to(&app, PERSON).len() == 3).await;
    app.settle().await;
    assert_eq!(
        bodies_to(&app, PERSON),
        ["echo: before", notice.as_str(), "echo: are you there?"],
        "told once, then answered"
    );
    let (notices, waits) = notices_and_waits(&app, PERSON).await;
    assert_eq!(
        (notices.len(), waits.len()),
        (1, 1),
        "{notices:?} {waits:?}"
    );
    app.shutdown().await;
}

/// A dispatcher whose breaker has not opened yet (it just started, say) takes a refused call
/// as one failure; the turn tries again at once, here, and its person is told when the
/// breaker opens, not after the stream's retry delay, when the runner may be back and the
/// person has waited in silence.
#[tokio::test]
async fn a_person_whose_message_meets_the_down_runner_before_the_breaker_opened_is_told_at_once() {
    let app = spawn_app_configured(|c| {
        outage_settings(c);
        c.dispatch.breaker_failures = 3;
        // A turn handed back to the stream would come back only after a minute.
        c.runtime.retry_base_ms = 60_000;
        c.runtime.retry_max_ms = 60_000;
    })
    .await;
    let notice = app.config.dispatch.runner_down_notice.clone();
    app.runner.set_down(true);
    assert_eq!(app.send_sms(PERSON, "are you there?").await.status(), 200);
    until("the notice", || bodies_to(&app, PERSON).len() == 1).await;
    assert_eq!(bodies_to(&app, PERSON), [notice.as_str()]);
    assert_eq!(breaker_open(&app).await, Some(1.0), "the breaker is open");
    let refused = app.runner.refused.load(Ordering::SeqCst);
    assert_eq!(refused, 3, "one call for each failure the breaker counts");

    app.runner.set_down(false);
    until("the answer", || bodies_to(&app, PERSON).len() == 2).await;
    assert_eq!(
        bodies_to(&app, PERSON),
        [notice.as_str(), "echo: are you there?"]
    );
    assert!(app.dead_letters("dispatch").await.is_empty());
    app.shutdown().await;
}

/// One refused call is a blip, not an outage: the turn tries again at once, in place, and the
/// person gets the answer and no notice; the breaker stays shut.
#[tokio::test]
async fn a_single_failed_call_is_tried_again_at_once_and_nobody_is_told() {
    let app = spawn_app_configured(|c| {
        outage_settings(c);
        c.dispatch.breaker_failures = 3;
        // Handed back to the stream, the turn would come back only after a minute.
        c.runtime.retry_base_ms = 60_000;
        c.runtime.retry_max_ms = 60_000;
    })
    .await;
    app.runner.fail_next(1, 503);
    assert_eq!(app.send_sms(PERSON, "anyone?").await.status(), 200);
    until("the answer", || bodies_to(&app, PERSON).len() == 1).await;
    assert_eq!(
        bodies_to(&app, PERSON),
        ["echo: anyone?"],
        "answered, not told"
    );
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2, "the failed call, then the answered one");
    assert_eq!(
        calls[0].idempotency_key, calls[1].idempotency_key,
        "the same turn's call"
    );
    assert_ne!(
        breaker_open(&app).await,
        Some(1.0),
        "a blip does not open the breaker"
    );
    assert_eq!(session_row(&app, PERSON).await.1, None, "no wait recorded");
    app.shutdown().await;
}

#[tokio::test]
async fn in_a_session_everyone_shares_each_person_waiting_on_the_down_runner_is_told_once() {
    // Scope `main`: everyone continues one session, so the other person's message waits
    // behind the first person's turn, which waits for the runner. Both are told, once each.
    let app = spawn_app_configured(|c| {
        outage_settings(c);
        c.session.scope = switchboard_kit::config::SessionScope::Main;
    })
    .await;
    let notice = app.config.dispatch.runner_down_notice.clone();
    app.runner.set_down(true);
    for text in ["one", "two"] {
        assert_eq!(app.send_sms(PERSON, text).await.status(), 200);
    }
    assert_eq!(app.send_sms(OTHER, "hello?").await.status(), 200);
    until("both told", || {
        bodies_to(&app, PERSON).len() == 1 && bodies_to(&app, OTHER).len() == 1
    })
    .await;
    // Past the wait limit, with the turns parked and woken again: nobody is told twice.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(bodies_to(&app, PERSON), [notice.as_str()]);
    assert_eq!(bodies_to(&app, OTHER), [notice.as_str()]);

    app.runner.set_down(false);
    until("every answer", || {
        bodies_to(&app, PERSON).len() == 3 && bodies_to(&app, OTHER).len() == 2
    })
    .await;
    assert_eq!(
        bodies_to(&app, PERSON),
        [notice.as_str(), "echo: one", "echo: two"]
    );
    assert_eq!(bodies_to(&app, OTHER), [notice.as_str(), "echo: hello?"]);
    app.settle().await;
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.session_events WHERE kind = 'waiting'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(waiting, 2, "one telling journalled per person");
    assert!(app.dead_letters("dispatch").await.is_empty());
    app.shutdown().await;
}
