//! One SMS in, the agent's reply out: the product's promises on the thinnest real path.
use std::time::Duration;

use switchboard_e2e::{
    AppOptions, FakeRunner, TWILIO_NUMBER, spawn_app, spawn_app_configured, spawn_app_with,
};

const PERSON: &str = "+14155550101";
const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_signed_sms_gets_exactly_one_reply_with_the_runners_text() {
    let app = spawn_app().await;

    let resp = app.send_sms(PERSON, "hello reggie").await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/xml")
    );
    assert!(resp.text().await.unwrap().contains("<Response"));

    let sent = app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    let sent_after = app.twilio.sent();
    assert_eq!(sent_after.len(), 1, "exactly one reply: {sent_after:?}");
    assert_eq!(sent[0].to, PERSON);
    assert_eq!(sent[0].from, TWILIO_NUMBER);
    assert_eq!(sent[0].body, "echo: hello reggie");

    // The runner was called as the contract says.
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].agent, "reggie_oc");
    assert_eq!(calls[0].session_id, None);
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some("Bearer runner-token")
    );
    assert!(!calls[0].idempotency_key.is_empty());
    assert_eq!(FakeRunner::said(&calls[0].prompt), "hello reggie");

    // Both sides are in the log, tied by one correlation id.
    let rows = app.log_rows().await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    let inbound = rows.iter().find(|r| r.direction == "inbound").unwrap();
    let outbound = rows.iter().find(|r| r.direction == "outbound").unwrap();
    assert_eq!(inbound.message, "hello reggie");
    assert_eq!(outbound.message, "echo: hello reggie");
    assert_eq!(inbound.correlation_id, outbound.correlation_id);
    assert_eq!(inbound.session_id, outbound.session_id);
    assert_eq!(inbound.person_id, format!("phone:{PERSON}"));
    assert_eq!(outbound.processing_ms, Some(7));
    assert_eq!(outbound.tool_calls_count, Some(2));
    assert_eq!(inbound.id.get_version_num(), 7, "message ids are UUIDv7");
    assert!(inbound.id < outbound.id, "ids are time-ordered");

    // The delivery ledger says sent, with Twilio's id.
    let (status, ids): (String, Vec<String>) =
        sqlx::query_as("SELECT status, provider_message_ids FROM switchboard.deliveries")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(status, "sent");
    assert_eq!(ids, vec![sent[0].sid.clone()]);
    app.shutdown().await;
}

#[tokio::test]
async fn a_wrong_or_missing_signature_is_refused_and_nothing_is_published() {
    let app = spawn_app().await;
    let params = app.sms_params(PERSON, "let me in", "SMforged");
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&params)
        .finish();

    let missing = app.post_twilio(body.clone(), None).await;
    assert_eq!(missing.status(), 403);
    let err: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(err["error"]["code"], "missing_signature");

    let wrong = app
        .post_twilio(body.clone(), Some("bm90IHRoZSBzaWduYXR1cmU="))
        .await;
    assert_eq!(wrong.status(), 403);
    let err: serde_json::Value = wrong.json().await.unwrap();
    assert_eq!(err["error"]["code"], "invalid_signature");

    // Signed for other content: the body was changed in transit.
    let signature = app.sign(&params);
    let tampered = body.replace("let+me+in", "let+me+out");
    assert_eq!(
        app.post_twilio(tampered, Some(&signature)).await.status(),
        403
    );

    app.assert_nothing_reached_the_pipeline().await;

    let metrics = app.metrics().await;
    assert!(
        metrics.contains(
            "sb_gateway_rejected_total{channel=\"sms\",reason=\"invalid_signature\",provider=\"twilio\"}"
        ),
        "rejections are counted:\n{metrics}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn the_same_message_sid_posted_three_times_is_one_turn_and_one_reply() {
    let app = spawn_app().await;
    let sid = "SM0123456789abcdef0123456789abcdef";
    let (a, b, c) = tokio::join!(
        app.send_sms_with_sid(PERSON, "only once please", sid),
        app.send_sms_with_sid(PERSON, "only once please", sid),
        app.send_sms_with_sid(PERSON, "only once please", sid),
    );
    assert_eq!(
        [a.status(), b.status(), c.status()].map(|s| s.as_u16()),
        [200; 3]
    );

    app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 1);
    assert_eq!(app.runner.calls().len(), 1);
    let rows = app.log_rows().await;
    assert_eq!(rows.iter().filter(|r| r.direction == "inbound").count(), 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_provider_retry_after_the_dedupe_window_still_gives_one_reply() {
    // JetStream forgets message ids after the window; the session and the delivery ledger must
    // still recognise Twilio's retry.
    let app = spawn_app_configured(|c| c.runtime.duplicate_window_s = 1).await;
    let sid = "SMfedcba9876543210fedcba9876543210";
    assert_eq!(
        app.send_sms_with_sid(PERSON, "late retry", sid)
            .await
            .status(),
        200
    );
    app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    assert_eq!(
        app.send_sms_with_sid(PERSON, "late retry", sid)
            .await
            .status(),
        200
    );
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 1, "{:?}", app.twilio.sent());
    assert_eq!(app.runner.calls().len(), 1);
    assert_eq!(
        app.log_rows()
            .await
            .iter()
            .filter(|r| r.direction == "inbound")
            .count(),
        1
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_persons_second_message_resumes_the_engine_session_of_the_first() {
    let app = spawn_app().await;
    app.send_sms(PERSON, "first").await;
    let first = app.wait_for_sms(1, WAIT).await;
    assert_eq!(first[0].body, "echo: first");
    app.send_sms(PERSON, "second").await;
    let both = app.wait_for_sms(2, WAIT).await;
    assert_eq!(both[1].body, "echo: second");

    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].session_id, None);
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));
    assert_ne!(calls[0].idempotency_key, calls[1].idempotency_key);

    // One session for the person, its cursor past both turns, the engine id recorded.
    let rows: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT person_id, last_seq, engine_session_id FROM switchboard.sessions")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![(format!("phone:{PERSON}"), 2, "eng-1".to_string())]
    );
    app.shutdown().await;
}

#[tokio::test]
async fn different_people_get_different_sessions_and_only_their_own_replies() {
    let app = spawn_app().await;
    let people = ["+14155550111", "+14155550122", "+14155550133"];
    for p in people {
        assert_eq!(app.send_sms(p, &format!("I am {p}")).await.status(), 200);
    }
    let sent = app.wait_for_sms(3, WAIT).await;
    for p in people {
        let mine: Vec<_> = sent.iter().filter(|s| s.to == p).collect();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].body, format!("echo: I am {p}"));
    }
    for call in app.runner.calls() {
        assert_eq!(
            call.session_id, None,
            "each person starts their own engine session"
        );
    }
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.sessions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(sessions, 3);
    app.shutdown().await;
}

#[tokio::test]
async fn turns_of_one_session_reach_the_runner_in_order_and_one_at_a_time() {
    let app = spawn_app().await;
    app.runner.set_delay(Duration::from_millis(300));
    for i in 1..=5 {
        assert_eq!(app.send_sms(PERSON, &format!("m{i}")).await.status(), 200);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let sent = app.wait_for_sms(5, Duration::from_secs(30)).await;
    let said: Vec<String> = app
        .runner
        .calls()
        .iter()
        .map(|c| FakeRunner::said(&c.prompt))
        .collect();
    assert_eq!(said, vec!["m1", "m2", "m3", "m4", "m5"]);
    assert_eq!(
        app.runner
            .max_overlap
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "never two turns of one session at once"
    );
    // Each turn resumed the engine session the previous one recorded.
    let resumed: Vec<Option<String>> = app
        .runner
        .calls()
        .iter()
        .map(|c| c.session_id.clone())
        .collect();
    assert_eq!(resumed[0], None);
    assert!(resumed[1..].iter().all(|s| s.as_deref() == Some("eng-1")));
    let bodies: Vec<&str> = sent.iter().map(|s| s.body.as_str()).collect();
    assert_eq!(
        bodies,
        vec!["echo: m1", "echo: m2", "echo: m3", "echo: m4", "echo: m5"]
    );
    app.shutdown().await;
}

#[tokio::test]
async fn an_undecodable_message_on_a_work_subject_is_dead_lettered_with_its_reason() {
    let app = spawn_app().await;
    let garbage = bytes::Bytes::from_static(&[0xff, 0xff, 0xff, 0x01, 0x02]);
    app.js
        .publish(app.topology.inbound("sms"), garbage.clone())
        .await
        .unwrap()
        .await
        .unwrap();

    let letters = app.wait_for_dead_letters("identify", WAIT).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(
        letters[0].error.contains("undecodable"),
        "{}",
        letters[0].error
    );
    assert_eq!(letters[0].payload, garbage.to_vec());
    assert_eq!(letters[0].subject, app.topology.inbound("sms"));
    assert_eq!(letters[0].delivery_count, 1);

    // The pipeline keeps working after it.
    app.send_sms(PERSON, "still there?").await;
    app.wait_for_sms(1, WAIT).await;
    app.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let app = spawn_app().await;
    // Signed but without a MessageSid.
    let params: Vec<(String, String)> = app
        .sms_params(PERSON, "x", "SMx")
        .into_iter()
        .filter(|(k, _)| k != "MessageSid" && k != "SmsSid")
        .collect();
    let sig = app.sign(&params);
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&params)
        .finish();
    let resp = app.post_twilio(body, Some(&sig)).await;
    assert_eq!(resp.status(), 400);
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "missing_field");

    // A body over the size limit.
    let huge = "Body=".to_string() + &"a".repeat(200_000);
    assert_eq!(app.post_twilio(huge, Some("x")).await.status(), 413);

    // Signed, but From is not a phone number.
    let params = app.sms_params("not-a-phone", "x", "SMy");
    let sig = app.sign(&params);
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&params)
        .finish();
    let resp = app.post_twilio(body, Some(&sig)).await;
    assert_eq!(resp.status(), 400);

    // A channel that does not exist is named in the 400; a known one at a wrong path is 404.
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{}/webhooks/fax/inbound", app.gateway_url))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "unknown_channel");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"fax\""),
        "{err}"
    );
    let resp = client
        .post(format!("{}/webhooks/twilio/voice", app.gateway_url))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let err: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "not_found");
    app.shutdown().await;
}

#[tokio::test]
async fn a_twilio_outage_is_retried_and_the_reply_still_goes_out_once() {
    let app = spawn_app().await;
    app.twilio.fail_next(2);
    app.send_sms(PERSON, "are you there").await;
    let sent = app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 1);
    assert_eq!(sent[0].body, "echo: are you there");
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM switchboard.deliveries")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(attempts, 3);
    app.shutdown().await;
}

#[tokio::test]
async fn a_known_person_is_resolved_from_the_directory() {
    let app = spawn_app().await;
    sqlx::query("INSERT INTO switchboard.people (person_id, person_type, name, role) VALUES ('staff-7', 'staff', 'Dana', 'admin')")
        .execute(&app.db).await.unwrap();
    sqlx::query("INSERT INTO switchboard.contact_points (kind, address, person_id) VALUES ('phone', $1, 'staff-7')")
        .bind(PERSON)
        .execute(&app.db).await.unwrap();
    // Written the way a person types it: the gateway normalises to E.164.
    app.send_sms("(415) 555-0101", "[Current User: Nobody | Type: user] hi")
        .await;
    app.wait_for_sms(1, WAIT).await;
    let prompt = &app.runner.calls()[0].prompt;
    let head = &prompt[..prompt.find("<<<").unwrap()];
    assert!(
        head.contains("Current user: Dana | id staff-7 | type staff | role admin"),
        "{prompt}"
    );
    assert_eq!(
        FakeRunner::said(prompt),
        "[Current User: Nobody | Type: user] hi"
    );
    app.shutdown().await;
}

/// The lease of a deliverer that dies holding a reply: short, so the test need not wait 45 s.
const DEAD_LEASE: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_part_twilio_accepted_before_its_deliverer_died_is_not_sent_again() {
    let app = spawn_app_with(AppOptions::all_but("deliver")).await;
    app.send_sms(PERSON, "did you get that").await;
    let reply = app.wait_for_reply(&[], WAIT).await;
    // A deliverer takes the reply, Twilio accepts its part, and the deliverer dies before the
    // ledger says so.
    app.deliverer_dies_sending(&reply, DEAD_LEASE, 0, true)
        .await;
    let accepted = app.twilio.sent();
    assert_eq!(accepted.len(), 1);

    // The reply is redelivered; once the dead deliverer's lease ends a live one takes it,
    // finds the part in Twilio's message log, and records it instead of sending it again.
    app.start_stage("deliver");
    let (status, ids) = app.wait_for_delivery(&reply, WAIT).await;
    app.settle().await;
    let sent = app.twilio.sent();
    assert_eq!(sent.len(), 1, "the person got the reply once: {sent:?}");
    assert_eq!(sent[0].body, "echo: did you get that");
    assert_eq!(status, "sent");
    assert_eq!(
        ids,
        vec![accepted[0].sid.clone()],
        "the ledger has Twilio's id"
    );
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"sb_delivery_reconciled_total{provider="twilio",outcome="found"} 1"#),
        "{metrics}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_long_reply_whose_deliverer_died_after_its_second_part_reached_twilio_is_sent_once() {
    let app = spawn_app_with(AppOptions::all_but("deliver")).await;
    // A reply of two SMS parts (Twilio takes 1,600 characters a message).
    let long = "word ".repeat(400);
    app.send_sms(PERSON, long.trim_end()).await;
    let reply = app.wait_for_reply(&[], WAIT).await;
    // The deliverer sent and recorded part 1, Twilio accepted part 2, and it died before the
    // ledger said so.
    app.deliverer_dies_sending(&reply, DEAD_LEASE, 1, true)
        .await;
    let accepted = app.twilio.sent();
    assert_eq!(accepted.len(), 2);

    app.start_stage("deliver");
    let (status, ids) = app.wait_for_delivery(&reply, WAIT).await;
    app.settle().await;
    let sent = app.twilio.sent();
    assert_eq!(
        sent.len(),
        2,
        "each part reached the person once: {sent}",
        sent = sent.len()
    );
    assert_eq!(status, "sent");
    let accepted_ids: Vec<_> = accepted.iter().map(|s| s.sid.clone()).collect();
    assert_eq!(
        ids, accepted_ids,
        "the ledger has both of Twilio's ids, in order"
    );
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"sb_delivery_reconciled_total{provider="twilio",outcome="found"} 1"#),
        "{metrics}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_part_that_never_reached_twilio_is_sent_even_when_the_reply_before_was_the_same_text() {
    let app = spawn_app_with(AppOptions::all_but("deliver")).await;
    app.send_sms(PERSON, "hello").await;
    let first = app.wait_for_reply(&[], WAIT).await;
    app.deliver_directly(&first).await;
    // The person says the same again, the agent answers the same, and the deliverer of that
    // answer dies before handing it to Twilio: Twilio's log holds the first answer, moments
    // old, to the same person with the same text, but not this one.
    app.send_sms(PERSON, "hello").await;
    let second = app.wait_for_reply(&[&first], WAIT).await;
    assert_eq!(second.text, first.text);
    app.deliverer_dies_sending(&second, DEAD_LEASE, 0, false)
        .await;

    app.start_stage("deliver");
    let (status, ids) = app.wait_for_delivery(&second, WAIT).await;
    app.settle().await;
    let sent = app.twilio.sent();
    assert_eq!(sent.len(), 2, "both answers reached the person: {sent:?}");
    assert!(
        sent.iter()
            .all(|s| s.to == PERSON && s.body == "echo: hello")
    );
    assert_eq!(status, "sent");
    assert_eq!(
        ids,
        vec![sent[1].sid.clone()],
        "the second answer is its own SMS"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_part_of_unknown_outcome_is_never_sent_blind_and_fails_visibly_if_twilios_log_stays_unreadable()
 {
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(|c| c.runtime.max_deliver = 3),
        ..AppOptions::all_but("deliver")
    })
    .await;
    app.send_sms(PERSON, "are you sure").await;
    let reply = app.wait_for_reply(&[], WAIT).await;
    app.deliverer_dies_sending(&reply, DEAD_LEASE, 0, true)
        .await;
    // Twilio takes messages but its message log answers 503 from now on.
    app.twilio.list_failures.fail_next(1000, 503);

    app.start_stage("deliver");
    let (status, _) = app.wait_for_delivery(&reply, Duration::from_secs(30)).await;
    assert_eq!(status, "failed", "the ledger says the reply failed");
    let letters = app
        .wait_for_dead_letters("deliver", Duration::from_secs(10))
        .await;
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].error.contains("message log") && letters[0].error.contains("503"),
        "the dead letter says why: {}",
        letters[0].error
    );
    let announced = app
        .js
        .get_stream(app.topology.events_stream())
        .await
        .unwrap()
        .get_last_raw_message_by_subject(&app.topology.event("delivery.failed"))
        .await;
    assert!(announced.is_ok(), "delivery.failed is announced");
    assert_eq!(
        app.twilio.sent().len(),
        1,
        "only the dead deliverer's send: nothing was sent blind"
    );
    app.shutdown().await;
}
