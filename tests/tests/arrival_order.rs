//! A person's messages are answered in the order they were sent, even when a later one reaches
//! the session stage first (a worker crashed holding the earlier one, or handled it slower).
use std::time::Duration;

use prost::Message as _;
use switchboard_e2e::{
    AppOptions, FakeRunner, TestApp, spawn_app, spawn_app_configured, spawn_app_with,
};
use switchboard_kit::arrival::Arrival;
use switchboard_kit::proto::{IdentifiedMessage, InboundMessage, Person};

async fn number(app: &TestApp, from: &str, sid: &str) -> Arrival {
    app.number_sms(from, sid).await
}

/// Publish a numbered SMS to the inbound subject exactly as the gateway would, but at a moment
/// of the test's choosing (standing in for a message held up between gateway and session).
async fn publish_numbered(app: &TestApp, from: &str, sid: &str, text: &str, arrival: Arrival) {
    publish_numbered_to(app, from, sid, text, arrival, "").await
}

/// [`publish_numbered`], naming the agent the message is for (empty: the channel's default).
async fn publish_numbered_to(
    app: &TestApp,
    from: &str,
    sid: &str,
    text: &str,
    arrival: Arrival,
    agent: &str,
) {
    let inbound = InboundMessage {
        agent: agent.into(),
        ..app.numbered_sms(from, sid, text, arrival)
    };
    app.publish_numbered_sms(&inbound).await;
}

fn runner_texts(app: &TestApp) -> Vec<String> {
    app.runner
        .calls()
        .iter()
        .map(|c| FakeRunner::said(&c.prompt))
        .collect()
}

async fn turn_seq_of(app: &TestApp, sid: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT seq FROM switchboard.turns WHERE provider_message_id = $1")
        .bind(sid)
        .fetch_optional(&app.db)
        .await
        .expect("read turns")
}

#[tokio::test]
async fn a_later_message_waits_for_the_earlier_one_from_the_same_person() {
    let app = spawn_app().await;
    let me = "+14155550401";
    let first = number(&app, me, "SMfirst").await;
    let second = number(&app, me, "SMsecond").await;
    assert_eq!(second.seq, first.seq + 1);

    // The second message gets to the session stage first; the first is still on its way.
    publish_numbered(&app, me, "SMsecond", "and then this", second).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(turn_seq_of(&app, "SMsecond").await, None, "it waits");
    assert!(app.runner.calls().is_empty());

    publish_numbered(&app, me, "SMfirst", "this first", first).await;
    app.wait_for_sms(2, Duration::from_secs(20)).await;
    assert_eq!(runner_texts(&app), ["this first", "and then this"]);
    assert_eq!(turn_seq_of(&app, "SMfirst").await, Some(1));
    assert_eq!(turn_seq_of(&app, "SMsecond").await, Some(2));
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("sb_session_arrival_waits_total"),
        "{metrics}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn another_persons_messages_do_not_wait_for_a_missing_one() {
    let app = spawn_app().await;
    let (stuck, other) = ("+14155550402", "+14155550403");
    let _lost = number(&app, stuck, "SMneverpublished").await;
    let after = number(&app, stuck, "SMwaiting").await;
    publish_numbered(&app, stuck, "SMwaiting", "i wait", after).await;

    assert_eq!(app.send_sms(other, "hello").await.status(), 200);
    let sent = app.wait_for_sms(1, Duration::from_secs(20)).await;
    assert_eq!(sent[0].to, other);
    assert_eq!(turn_seq_of(&app, "SMwaiting").await, None);
    app.shutdown().await;
}

#[tokio::test]
async fn a_message_whose_predecessor_never_comes_is_answered_after_the_gap_timeout() {
    // A gateway died between numbering a message and publishing it, and the provider never
    // retried: the next message is held for the gap timeout, then answered. Nothing is lost:
    // should the missing message turn up after all, it is answered too.
    let app = spawn_app_configured(|c| c.session.arrival_gap_timeout_ms = 1_500).await;
    let me = "+14155550404";
    let lost = number(&app, me, "SMlate").await;
    let next = number(&app, me, "SMnext").await;
    publish_numbered(&app, me, "SMnext", "still there?", next).await;
    let sent = app.wait_for_sms(1, Duration::from_secs(20)).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(runner_texts(&app), ["still there?"]);
    assert!(
        app.metrics()
            .await
            .contains("sb_session_arrival_gaps_skipped_total 1")
    );

    publish_numbered(&app, me, "SMlate", "sorry, late", lost).await;
    app.wait_for_sms(2, Duration::from_secs(20)).await;
    assert_eq!(runner_texts(&app), ["still there?", "sorry, late"]);
    assert!(
        app.metrics()
            .await
            .contains("sb_session_arrivals_late_total 1")
    );
    app.shutdown().await;
}

/// Publish a numbered SMS on the identified subject, as identify hands it on (standing in for a
/// message identify handled before its sender's earlier one).
async fn publish_identified(app: &TestApp, from: &str, sid: &str, text: &str, arrival: Arrival) {
    let message = IdentifiedMessage {
        inbound: Some(app.numbered_sms(from, sid, text, arrival)),
        person: Some(Person {
            person_id: format!("phone:{from}"),
            person_type: "external".into(),
            ..Default::default()
        }),
    };
    app.js
        .publish(
            app.topology.identified_from("sms", from),
            message.encode_to_vec().into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored");
}

async fn work_stream(app: &TestApp) -> async_nats::jetstream::stream::Stream {
    app.js
        .get_stream(app.topology.work_stream())
        .await
        .expect("work stream")
}

/// Hold a stage's consumer: nothing new is delivered to it until [`resume`].
async fn pause(app: &TestApp, stage: &str) {
    let until = time::OffsetDateTime::now_utc() + Duration::from_secs(300);
    let paused = work_stream(app)
        .await
        .pause_consumer(stage, until)
        .await
        .expect("pause");
    assert!(paused.paused, "{stage} paused");
}

async fn resume(app: &TestApp, stage: &str) {
    work_stream(app)
        .await
        .resume_consumer(stage)
        .await
        .expect("resume");
}

/// Whether a message's turn is still unopened after well past the gap timeout (1 s here), with
/// the stage looking for its predecessor every few seconds meanwhile.
async fn still_waits_past_the_gap_timeout(app: &TestApp, sid: &str) {
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(turn_seq_of(app, sid).await, None, "it waits for the first");
    assert!(app.runner.calls().is_empty());
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("sb_session_arrival_gaps_on_their_way_total"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("sb_session_arrival_gaps_skipped_total 1"),
        "{metrics}"
    );
}

/// Once the first message got through: both answered, the first as turn 1, the second as 2.
async fn answered_first_then_second(app: TestApp) {
    app.wait_for_sms(2, Duration::from_secs(20)).await;
    assert_eq!(runner_texts(&app), ["first", "second"]);
    assert_eq!(turn_seq_of(&app, "SMfirst").await, Some(1));
    assert_eq!(turn_seq_of(&app, "SMsecond").await, Some(2));
    app.shutdown().await;
}

#[tokio::test]
async fn a_message_waits_past_the_gap_timeout_for_an_earlier_one_identify_has_not_handled_yet() {
    // Under a backlog a person's first message can take longer than the gap timeout to get
    // through identify (a crashed worker's message comes back after ack_wait, behind minutes of
    // others) while the second is already at the session stage. The first is not lost, so
    // answering the second then would answer the person out of order.
    let app = spawn_app_with(
        AppOptions::all_but("identify").configured(|c| c.session.arrival_gap_timeout_ms = 1_000),
    )
    .await;
    let me = "+14155550410";
    assert_eq!(
        app.send_sms_with_sid(me, "first", "SMfirst").await.status(),
        200
    );
    let second = number(&app, me, "SMsecond").await;
    assert_eq!(second.seq, 2, "numbered after the first");
    publish_identified(&app, me, "SMsecond", "second", second).await;
    still_waits_past_the_gap_timeout(&app, "SMsecond").await;

    app.start_stage("identify");
    answered_first_then_second(app).await;
}

#[tokio::test]
async fn a_message_waits_past_the_gap_timeout_for_an_earlier_one_queued_for_the_session_stage() {
    // The first message got through identify but waits behind a backlog at the session stage
    // (held here by pausing the session stage's consumer after the second reached it).
    let app = spawn_app_configured(|c| c.session.arrival_gap_timeout_ms = 1_000).await;
    let me = "+14155550411";
    let first = number(&app, me, "SMfirst").await;
    let second = number(&app, me, "SMsecond").await;
    publish_identified(&app, me, "SMsecond", "second", second).await;
    // The second is at the session stage, waiting (the stage counts its wait).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !app
        .metrics()
        .await
        .contains("sb_session_arrival_waits_total")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the second never got there"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pause(&app, "session").await;
    publish_identified(&app, me, "SMfirst", "first", first).await;
    still_waits_past_the_gap_timeout(&app, "SMsecond").await;

    resume(&app, "session").await;
    answered_first_then_second(app).await;
}

#[tokio::test]
async fn a_provider_retry_after_a_newer_message_is_one_turn_and_holds_nobody_up() {
    // Twilio retries message A after message B was accepted. The retry gets a new number; it
    // must map to A's turn and move the sender past that number, or C would wait for it.
    let app = spawn_app_configured(|c| c.session.arrival_gap_timeout_ms = 600_000).await;
    let me = "+14155550405";
    assert_eq!(app.send_sms_with_sid(me, "a", "SMaaaa").await.status(), 200);
    assert_eq!(app.send_sms_with_sid(me, "b", "SMbbbb").await.status(), 200);
    assert_eq!(app.send_sms_with_sid(me, "a", "SMaaaa").await.status(), 200);
    assert_eq!(app.send_sms_with_sid(me, "c", "SMcccc").await.status(), 200);
    app.wait_for_sms(3, Duration::from_secs(20)).await;
    app.settle().await;
    assert_eq!(runner_texts(&app), ["a", "b", "c"]);
    assert_eq!(
        app.twilio.sent().len(),
        3,
        "the retry is not answered twice"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn an_immediate_provider_retry_keeps_its_number() {
    let app = spawn_app().await;
    let me = "+14155550406";
    let a = number(&app, me, "SMsame").await;
    let again = number(&app, me, "SMsame").await;
    let b = number(&app, me, "SMother").await;
    assert_eq!(a, again);
    assert_eq!(b.seq, a.seq + 1);
    assert_eq!(number(&app, "+14155550407", "SMsame").await.seq, 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_message_that_cannot_be_answered_does_not_hold_up_the_next_one() {
    // The first message names an agent that does not exist: it is dead-lettered, in its turn,
    // and the sender's next message goes ahead at once (the gap timeout is 10 minutes here).
    let app = spawn_app_configured(|c| c.session.arrival_gap_timeout_ms = 600_000).await;
    let me = "+14155550408";
    let first = number(&app, me, "SMnoagent").await;
    let second = number(&app, me, "SMfine").await;
    publish_numbered(&app, me, "SMfine", "hello?", second).await;
    publish_numbered_to(&app, me, "SMnoagent", "for nobody", first, "nobody").await;
    let sent = app.wait_for_sms(1, Duration::from_secs(20)).await;
    assert_eq!(runner_texts(&app), ["hello?"]);
    assert_eq!(sent.len(), 1);
    let letters = app.dead_letters("session").await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(letters[0].error.contains("nobody"), "{}", letters[0].error);
    app.shutdown().await;
}

#[tokio::test]
async fn one_persons_burst_through_two_gateway_processes_is_answered_in_the_order_accepted() {
    // Two gateway replicas, each its own process, share the person's counter: whichever one
    // takes a message, it is numbered after the one accepted before it.
    let app = spawn_app().await;
    let (_replica, replica_url) = app.spawn_gateway_process().await;
    let me = "+14155550409";
    let mut accepted = Vec::new();
    for i in 1..=20 {
        let (text, sid) = (format!("message {i:02}"), format!("SMburst{i:02}"));
        let gateway = if i % 2 == 1 {
            &app.gateway_url
        } else {
            &replica_url
        };
        let params = app.sms_params(me, &text, &sid);
        let signature = app.sign(&params);
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&params)
            .finish();
        let answer = app.post_twilio_to(gateway, body, Some(&signature)).await;
        assert_eq!(answer.status(), 200, "message {i} through {gateway}");
        accepted.push((sid, text));
    }

    let sent = app.wait_for_sms(20, Duration::from_secs(60)).await;
    app.settle().await;
    let texts: Vec<String> = accepted.iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(runner_texts(&app), texts, "one call each, in accept order");
    let replies: Vec<String> = app.twilio.sent().into_iter().map(|s| s.body).collect();
    let echoes: Vec<String> = texts.iter().map(|t| format!("echo: {t}")).collect();
    assert_eq!(replies, echoes, "one reply each, in order");
    assert!(sent.iter().all(|s| s.to == me));
    let turns: Vec<(i64, String)> =
        sqlx::query_as("SELECT seq, provider_message_id FROM switchboard.turns ORDER BY seq")
            .fetch_all(&app.db)
            .await
            .expect("read turns");
    let expected: Vec<(i64, String)> = accepted
        .iter()
        .enumerate()
        .map(|(i, (sid, _))| (i as i64 + 1, sid.clone()))
        .collect();
    assert_eq!(turns, expected, "turn n is the n-th message accepted");
    app.shutdown().await;
}
