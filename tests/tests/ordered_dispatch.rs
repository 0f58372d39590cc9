//! Turns of one session run in order and one at a time, across dispatcher replicas.
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use switchboard_dispatch::TurnDispatcher;
use switchboard_e2e::{
    AppOptions, FakeRunner, TestApp, handle_through_waits, spawn_app, spawn_app_configured,
    spawn_app_with,
};
use switchboard_kit::proto::{IdentifiedMessage, InboundMessage, Person, Reply, Turn};
use switchboard_kit::{Attempt, Stage};
use switchboard_session::{Opened, SessionStore};

#[tokio::test]
async fn two_dispatcher_processes_keep_each_sessions_turns_in_order_without_overlap() {
    let app = spawn_app_with(AppOptions::dispatch_as_processes()).await;
    let mut a = app.spawn_worker("dispatch");
    let mut b = app.spawn_worker("dispatch");
    app.runner.set_delay(Duration::from_millis(150));
    let people = ["+14155550201", "+14155550202", "+14155550203"];
    for i in 1..=6 {
        for p in people {
            assert_eq!(app.send_sms(p, &format!("{p} #{i}")).await.status(), 200);
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    app.wait_for_sms(18, Duration::from_secs(60)).await;
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 18);

    for p in people {
        let said: Vec<String> = app
            .runner
            .calls()
            .iter()
            .map(|c| FakeRunner::said(&c.prompt))
            .filter(|t| t.starts_with(p))
            .collect();
        let expected: Vec<String> = (1..=6).map(|i| format!("{p} #{i}")).collect();
        assert_eq!(said, expected, "turns of {p} in order, each once");
        let replies: Vec<String> = app
            .twilio
            .sent()
            .into_iter()
            .filter(|s| s.to == p)
            .map(|s| s.body)
            .collect();
        let expected: Vec<String> = (1..=6).map(|i| format!("echo: {p} #{i}")).collect();
        assert_eq!(replies, expected);
    }
    assert_eq!(app.runner.max_overlap.load(Ordering::SeqCst), 1);
    a.kill().await.ok();
    b.kill().await.ok();
    app.shutdown().await;
}

fn turn_for(session_id: &str, seq: i64, inbound_id: &str, text: &str) -> Turn {
    Turn {
        session_id: session_id.into(),
        seq,
        agent_name: "reggie_oc".into(),
        agent_identity: "reggie".into(),
        scope_key: "external:phone:+14155550301".into(),
        message: Some(IdentifiedMessage {
            inbound: Some(InboundMessage {
                id: inbound_id.into(),
                channel: "sms".into(),
                provider: "twilio".into(),
                sender: "+14155550301".into(),
                text: text.into(),
                provider_message_id: format!("SM{inbound_id}"),
                correlation_id: inbound_id.into(),
                ..Default::default()
            }),
            person: Some(Person {
                person_id: "phone:+14155550301".into(),
                person_type: "external".into(),
                ..Default::default()
            }),
        }),
        reset: String::new(),
    }
}

/// A turn opened in a fresh session, as the session stage would, plus two dispatchers.
async fn one_turn_two_dispatchers(
    app: &TestApp,
    text: &str,
) -> (
    Turn,
    Attempt,
    Arc<TurnDispatcher>,
    Arc<TurnDispatcher>,
    uuid::Uuid,
) {
    let inbound_id = uuid::Uuid::now_v7().to_string();
    let msg = turn_for("", 0, &inbound_id, text).message.unwrap();
    let agent = app.config.agent("reggie_oc").unwrap().clone();
    let Opened::Turn(opened) = SessionStore::new(app.db.clone())
        .open_turn(&msg, &agent, false)
        .await
        .unwrap()
    else {
        panic!("an unnumbered message never waits");
    };
    let turn = turn_for(
        &opened.session_id.to_string(),
        opened.seq,
        &inbound_id,
        text,
    );
    // Each with its session watch running, as in a dispatcher process.
    let make = || {
        let d = Arc::new(TurnDispatcher::new(
            app.db.clone(),
            app.topology.clone(),
            &app.config,
        ));
        let watching = d.clone();
        tokio::spawn(async move { watching.watch_sessions().await });
        d
    };
    let delivery = Attempt {
        subject: app.topology.turn(&opened.session_id),
        delivered: 1,
        stream_sequence: 1,
        correlation_id: inbound_id.clone(),
        ..Default::default()
    };
    (turn, delivery, make(), make(), opened.session_id)
}

fn decode_reply(outs: Vec<switchboard_kit::Output>) -> Reply {
    assert_eq!(outs.len(), 1);
    prost::Message::decode(outs[0].payload.clone()).unwrap()
}

async fn cursor_and_done(app: &TestApp, session: uuid::Uuid) -> (i64, i64) {
    sqlx::query_as(
        "SELECT s.last_seq, (SELECT count(*) FROM switchboard.turns t WHERE t.session_id = s.id AND t.status = 'done')
           FROM switchboard.sessions s WHERE s.id = $1",
    )
    .bind(session)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_turn_redelivered_while_its_call_still_runs_waits_for_that_call() {
    // NATS restarted and the first dispatcher's progress acks were lost, so the turn went to a
    // second dispatcher while the first still waits on the runner. The second must not call
    // the runner beside it (the engine session would fork): it waits and emits the same reply.
    let app = spawn_app().await;
    app.runner.set_delay(Duration::from_millis(800));
    let (turn, delivery, first, second, session) =
        one_turn_two_dispatchers(&app, "only once").await;
    let (x, y) = tokio::join!(first.handle(turn.clone(), &delivery), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        handle_through_waits(second.as_ref(), turn.clone(), &delivery).await
    });
    let (rx, ry) = (decode_reply(x.unwrap()), decode_reply(y.unwrap()));
    assert_eq!(rx.id, ry.id, "both emit the committed reply");
    assert_eq!(app.runner.calls().len(), 1, "the runner was called once");
    assert_eq!(cursor_and_done(&app, session).await, (1, 1));
    app.shutdown().await;
}

/// Two dispatchers run `turn` at once while their leases lapse (liveness 300 ms, runner slower):
/// both call the runner, exactly one answer is committed, the other call defers and, run
/// again, emits that answer without calling the runner. Returns the committed reply.
async fn exactly_one_answer_stands(
    app: &TestApp,
    turn: &Turn,
    delivery: &Attempt,
    a: &TurnDispatcher,
    b: &TurnDispatcher,
) -> Reply {
    let calls_before = app.runner.calls().len();
    let (x, y) = tokio::join!(
        handle_through_waits(a, turn.clone(), delivery),
        handle_through_waits(b, turn.clone(), delivery)
    );
    assert_eq!(
        app.runner.calls().len() - calls_before,
        2,
        "the lapsed lease let a second call in"
    );
    let (committed, (err, superseded)) = match (x, y) {
        (Ok(out), Err(e)) => (decode_reply(out), (e, b)),
        (Err(e), Ok(out)) => (decode_reply(out), (e, a)),
        (x, y) => panic!("exactly one call commits: {x:?} / {y:?}"),
    };
    assert!(
        matches!(err, switchboard_kit::StageError::Defer(..)),
        "the superseded call comes back later: {err}"
    );
    let again = decode_reply(superseded.handle(turn.clone(), delivery).await.unwrap());
    assert_eq!(again.id, committed.id, "it emits the committed reply");
    assert_eq!(
        app.runner.calls().len() - calls_before,
        2,
        "without calling the runner again"
    );
    committed
}

#[tokio::test]
async fn a_failed_turn_replayed_twice_at_once_is_answered_once() {
    // A replay runs a failed latest turn in place (the cursor already points at it), so the
    // cursor's compare-and-set cannot tell two copies apart; the lease and the turn's status
    // must. Otherwise the second commit would replace the reply and a second SMS go out.
    let app = spawn_app_configured(|c| c.dispatch.liveness_ms = 300).await;
    app.runner.set_delay(Duration::from_millis(1_200));
    let (turn, delivery, a, b, session) = one_turn_two_dispatchers(&app, "again").await;
    sqlx::query("UPDATE switchboard.sessions SET last_seq = 1 WHERE id = $1")
        .bind(session)
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("UPDATE switchboard.turns SET status = 'failed', error = 'runner 500' WHERE session_id = $1")
        .bind(session)
        .execute(&app.db)
        .await
        .unwrap();
    let committed = exactly_one_answer_stands(&app, &turn, &delivery, &a, &b).await;
    let stored: uuid::Uuid =
        sqlx::query_scalar("SELECT reply_id FROM switchboard.turns WHERE session_id = $1")
            .bind(session)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        stored.to_string(),
        committed.id,
        "the turn keeps the answer emitted"
    );
    assert_eq!(cursor_and_done(&app, session).await, (1, 1));
    app.shutdown().await;
}

#[tokio::test]
async fn a_zombie_dispatcher_whose_lease_lapsed_cannot_commit_a_second_answer() {
    // A dispatcher stalls (paused process: no heartbeat) in the middle of a runner call, so its
    // lease lapses and another dispatcher runs the same turn. Both calls reach the runner; only
    // the call holding the lease commits, even though the stalled one finishes first. The
    // stalled one comes back later and emits the committed answer.
    let app = spawn_app_configured(|c| c.dispatch.liveness_ms = 300).await;
    app.runner.set_delay(Duration::from_millis(1_200));
    let (turn, delivery, zombie, live, session) = one_turn_two_dispatchers(&app, "race me").await;
    let committed = exactly_one_answer_stands(&app, &turn, &delivery, &zombie, &live).await;
    assert_eq!(committed.text, "echo: race me");
    assert_eq!(cursor_and_done(&app, session).await, (1, 1));

    // A later turn of the session is not run before its predecessor: it waits, then defers.
    let early = turn_for(
        &session.to_string(),
        3,
        &uuid::Uuid::now_v7().to_string(),
        "too soon",
    );
    let err = live.handle(early, &delivery).await.unwrap_err();
    assert!(
        matches!(err, switchboard_kit::StageError::Wait { .. }),
        "turn 3 waits for turn 2: {err}"
    );
    assert_eq!(
        app.runner.calls().len(),
        2,
        "the early turn never reached the runner"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_turn_that_fails_for_good_does_not_block_the_session_and_can_be_replayed() {
    let app = spawn_app().await;
    let person = "+14155550401";
    // The agent host rejects the first turn (a 4xx: retrying cannot help).
    app.runner.fail_next(1, 422);
    assert_eq!(app.send_sms(person, "first").await.status(), 200);
    let letters = app
        .wait_for_dead_letters("dispatch", Duration::from_secs(20))
        .await;
    assert_eq!(letters.len(), 1);
    assert!(letters[0].error.contains("422"), "{}", letters[0].error);

    // The dead letter is replayed once the host is fixed: the failed turn runs again in place.
    let stored = switchboard_kit::dlq::list(&app.js, &app.topology, Some("dispatch"), 10)
        .await
        .unwrap();
    switchboard_kit::dlq::replay(&app.js, &app.topology, stored[0].seq)
        .await
        .unwrap();
    let sent = app.wait_for_sms(1, Duration::from_secs(20)).await;
    assert_eq!(sent[0].body, "echo: first");

    // The session moves on normally.
    assert_eq!(app.send_sms(person, "second").await.status(), 200);
    let sent = app.wait_for_sms(2, Duration::from_secs(20)).await;
    assert_eq!(sent[1].body, "echo: second");
    app.settle().await;
    assert!(
        app.dead_letters("dispatch").await.is_empty(),
        "replayed letter is gone"
    );
    let statuses: Vec<String> =
        sqlx::query_scalar("SELECT status FROM switchboard.turns ORDER BY seq")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(statuses, vec!["done", "done"]);
    app.shutdown().await;
}

#[tokio::test]
async fn a_failed_turn_lets_the_next_one_through() {
    let app = spawn_app().await;
    let person = "+14155550402";
    app.runner.fail_next(1, 400);
    assert_eq!(app.send_sms(person, "doomed").await.status(), 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.send_sms(person, "next").await.status(), 200);
    let sent = app.wait_for_sms(1, Duration::from_secs(20)).await;
    assert_eq!(sent[0].body, "echo: next");
    app.settle().await;
    assert_eq!(app.dead_letters("dispatch").await.len(), 1);
    let delivered = app.twilio.sent();
    assert_eq!(
        delivered.len(),
        1,
        "the failed turn sent nothing: {delivered:?}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_runner_that_keeps_failing_is_retried_then_dead_lettered_with_the_count() {
    let app = spawn_app_configured(|c| c.runtime.max_deliver = 3).await;
    // The engine fails on this turn every time (a down runner, 503, would be waited for).
    app.runner.fail_next(usize::MAX, 500);
    assert_eq!(app.send_sms("+14155550403", "anyone?").await.status(), 200);
    let letters = app
        .wait_for_dead_letters("dispatch", Duration::from_secs(20))
        .await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].delivery_count, 3);
    assert!(letters[0].error.contains("500"), "{}", letters[0].error);
    // Retried with a delay between attempts (transient), not dropped after the first.
    assert_eq!(app.runner.calls().len(), 3);
    assert!(app.twilio.sent().is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn a_wait_recorded_by_a_dispatcher_that_died_before_telling_is_told_once_with_the_answer() {
    // One failed call opens a breaker; a down runner is probed every 300 ms.
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(|c| {
            c.runtime.max_deliver = 10;
            c.dispatch.breaker_failures = 1;
            c.dispatch.breaker_probe_ms = 300;
            c.dispatch.breaker_probe_max_ms = 300;
        }),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    let person = "+14155550431";
    let notice = app.config.dispatch.runner_down_notice.clone();
    let bodies = || -> Vec<String> {
        app.twilio
            .sent()
            .into_iter()
            .filter(|m| m.to == person)
            .map(|m| m.body)
            .collect()
    };
    app.runner.set_down(true);
    // The dispatcher finds the runner down, records the session waiting with its notice, and
    // is killed before it publishes the notice.
    let mut dying = app.spawn_worker_with_env(
        "dispatch",
        &[(
            switchboard_kit::failpoint::ENV,
            "dispatch.wait_recorded".into(),
        )],
    );
    assert_eq!(app.send_sms(person, "hello?").await.status(), 200);
    let died = tokio::time::timeout(Duration::from_secs(30), dying.wait())
        .await
        .expect("the dispatcher died at the failpoint")
        .expect("its exit status");
    assert!(!died.success(), "killed, not stopped: {died}");
    let (status, told): (String, Option<uuid::Uuid>) = sqlx::query_as(
        "SELECT status, waiting_notice FROM switchboard.sessions WHERE person_id = $1",
    )
    .bind(format!("phone:{person}"))
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(status, "waiting");
    assert!(told.is_some(), "the wait and its notice are recorded");
    assert!(bodies().is_empty(), "nobody told yet");

    // Another dispatcher takes the turn again: the runner is still down, so it tells the person
    // while the turn waits, and once more with the answer when the runner is back. Each telling
    // is the recorded notice: the person gets it once.
    let mut next = app.spawn_worker("dispatch");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while bodies().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(bodies(), [notice.as_str()], "told while it waits");
    app.runner.set_down(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !bodies().contains(&"echo: hello?".to_string()) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.settle().await;
    assert_eq!(
        bodies(),
        [notice.as_str(), "echo: hello?"],
        "told once, then answered"
    );
    next.kill().await.ok();
    app.shutdown().await;
}

#[tokio::test]
async fn a_first_delivery_of_a_turn_whose_session_was_told_does_not_tell_again() {
    // The notice went out with the wait: only a redelivered turn tells again (its dispatcher
    // may have died before publishing it).
    let app = spawn_app().await;
    let (turn, delivery, dispatcher, _, session) = one_turn_two_dispatchers(&app, "again").await;
    sqlx::query(
        "UPDATE switchboard.sessions SET status = 'waiting', waiting_notice = $2 WHERE id = $1",
    )
    .bind(session)
    .bind(uuid::Uuid::now_v7())
    .execute(&app.db)
    .await
    .unwrap();
    let out = dispatcher.handle(turn, &delivery).await.unwrap();
    assert_eq!(
        out.iter()
            .filter(|o| o.subject == app.topology.reply())
            .count(),
        1
    );
    app.shutdown().await;
}
