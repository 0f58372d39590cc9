//! Agents that come back later (seed 002): with its turn's token an agent schedules a wake-up
//! of its session, at a time, with a note. At that time the note is the input of a turn of
//! the session, and the reply goes to the person on the channel they last wrote on, once,
//! whatever crashed. The person lists and cancels their reminders by text, an operator with
//! an API key; a person has a capped number pending; the session reads `rescheduling` while
//! one is.
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use switchboard_e2e::{AppOptions, TestApp, spawn_app_with};

const WAIT: Duration = Duration::from_secs(30);
const DANA: &str = "+14155550171";
const ELI: &str = "+14155550172";

/// `phone` texts `text` and is answered (`answers` texts sent so far); the turn's token.
async fn text_and_take_token(app: &TestApp, phone: &str, text: &str, answers: usize) -> String {
    assert_eq!(app.send_sms(phone, text).await.status(), 200);
    app.wait_for_sms(answers, WAIT).await;
    app.settle().await;
    app.runner
        .calls()
        .into_iter()
        .rfind(|c| c.prompt.contains(text))
        .expect("the message reached the agent")
        .turn_token
        .expect("the /run body carries a turn token")
}

async fn schedule(app: &TestApp, token: &str, body: Value) -> Value {
    let (status, answer) = app
        .call_api(token, Method::POST, "/api/v1/wakeups", Some(body))
        .await;
    assert_eq!(status, 201, "{answer}");
    answer
}

async fn session_of(app: &TestApp, phone: &str) -> String {
    let id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM switchboard.sessions WHERE person_id = $1")
            .bind(format!("phone:{phone}"))
            .fetch_one(&app.db)
            .await
            .unwrap();
    id.to_string()
}

async fn session_status(app: &TestApp, key: &str, session: &str) -> String {
    let (status, answer) = app
        .call_api(
            key,
            Method::GET,
            &format!("/api/v1/sessions/{session}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    answer["status"].as_str().unwrap().to_string()
}

async fn wakeup_status(app: &TestApp, id: &str) -> String {
    sqlx::query_scalar("SELECT status FROM switchboard.wakeups WHERE id = $1::uuid")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// Texts sent to `phone` whose body contains `needle`.
fn texts_to(app: &TestApp, phone: &str, needle: &str) -> usize {
    app.twilio
        .sent()
        .iter()
        .filter(|s| s.to == phone && s.body.contains(needle))
        .count()
}

/// Let `secs` pass (other replicas, a lapsed claim, a timer that should not fire).
async fn pass(secs: u64) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
}

fn fast(c: &mut switchboard_kit::config::Config) {
    c.wakeups.tick_ms = 200;
    c.wakeups.claim_s = 5;
}

#[tokio::test]
async fn an_agent_that_schedules_a_wake_up_comes_back_to_the_person_at_that_time_once() {
    let app = spawn_app_with(AppOptions::default().configured(fast)).await;
    let operator = app.api_key("ops", &["sessions:read"]).await;
    let token = text_and_take_token(&app, DANA, "remind me before my shift", 1).await;
    let session = session_of(&app, DANA).await;

    let wakeup = schedule(
        &app,
        &token,
        json!({"delay_s": 4, "note": "Tell Dana her shift starts at 7"}),
    )
    .await;
    assert_eq!(wakeup["status"], "pending");
    assert_eq!(wakeup["session_id"], session.as_str());
    assert_eq!(wakeup["person_id"], format!("phone:{DANA}"));
    assert_eq!(wakeup["created_by"], "agent:reggie_oc");
    let id = wakeup["id"].as_str().unwrap().to_string();
    assert_eq!(
        session_status(&app, &operator, &session).await,
        "rescheduling",
        "the session says its agent will come back"
    );
    let (_, listed) = app
        .call_api(
            &operator,
            Method::GET,
            "/api/v1/wakeups?status=rescheduling",
            None,
        )
        .await;
    assert_eq!(listed["error"]["code"], "invalid_status", "{listed}");
    let (status, listed) = app
        .call_api(
            &operator,
            Method::GET,
            &format!(
                "/api/v1/sessions?status=rescheduling&person=phone:%2B{}",
                &DANA[1..]
            ),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1, "{listed}");

    // Not before its time: nothing yet.
    assert_eq!(texts_to(&app, DANA, "shift starts at 7"), 0);
    let sent = app.wait_for_sms(2, WAIT).await;
    assert_eq!(sent[1].to, DANA, "on the channel Dana last used");
    assert_eq!(sent[1].body, "echo: Tell Dana her shift starts at 7");
    // Given time to (not) fire again.
    pass(3).await;
    app.settle().await;
    assert_eq!(
        app.twilio.sent().len(),
        2,
        "the wake-up came back more than once"
    );

    let calls = app.runner.calls();
    let woke: Vec<_> = calls
        .iter()
        .filter(|c| c.prompt.contains("Wake-up: you scheduled it at"))
        .collect();
    assert_eq!(woke.len(), 1);
    assert!(
        woke[0].prompt.contains("not a message from the person"),
        "{}",
        woke[0].prompt
    );
    assert_eq!(
        woke[0].session_id.as_deref(),
        Some("eng-1"),
        "the wake-up resumes the person's engine session"
    );
    assert_eq!(wakeup_status(&app, &id).await, "fired");
    assert_eq!(session_status(&app, &operator, &session).await, "idle");
    // Logged as the agent's own input, not Dana's words.
    let marked: Option<String> = sqlx::query_scalar(
        "SELECT metadata->>'scheduled' FROM switchboard.messages
          WHERE direction = 'inbound' AND message = 'Tell Dana her shift starts at 7'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(marked.as_deref(), Some("wakeup"));
    // Journalled: scheduled, then fired.
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT kind FROM switchboard.session_events
          WHERE session_id = $1::uuid AND kind LIKE 'wakeup%' ORDER BY id",
    )
    .bind(&session)
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(kinds, ["wakeup_scheduled", "wakeup_fired"]);
    app.shutdown().await;
}

#[tokio::test]
async fn a_person_lists_and_cancels_their_reminders_by_text_and_a_cancelled_one_never_comes() {
    let app = spawn_app_with(AppOptions::default().configured(fast)).await;
    let operator = app
        .api_key("ops", &["sessions:read", "sessions:write"])
        .await;
    let token = text_and_take_token(&app, DANA, "remind me of two things", 1).await;
    let soon = schedule(
        &app,
        &token,
        json!({"delay_s": 6, "note": "Check the locker code"}),
    )
    .await;
    let later = schedule(
        &app,
        &token,
        json!({"delay_s": 7200, "note": "Ask how the interview went"}),
    )
    .await;
    let calls_before = app.runner.calls().len();

    assert_eq!(app.send_sms(DANA, "/reminders").await.status(), 200);
    let sent = app.wait_for_sms(2, WAIT).await;
    let list = &sent[1].body;
    assert!(list.starts_with("Your reminders (2):"), "{list}");
    assert!(
        list.contains("1. ") && list.contains(": Check the locker code"),
        "{list}"
    );
    assert!(
        list.contains("2. ") && list.contains(": Ask how the interview went"),
        "{list}"
    );

    assert_eq!(
        app.send_sms(DANA, "/reminders cancel 1").await.status(),
        200
    );
    let sent = app.wait_for_sms(3, WAIT).await;
    assert!(sent[2].body.starts_with("Cancelled:"), "{}", sent[2].body);
    assert!(
        sent[2].body.contains("Check the locker code"),
        "{}",
        sent[2].body
    );
    assert_eq!(
        app.runner.calls().len(),
        calls_before,
        "Switchboard answers /reminders itself"
    );

    // Past its time: the cancelled one never came.
    pass(8).await;
    app.settle().await;
    assert_eq!(texts_to(&app, DANA, "echo: Check the locker code"), 0);
    assert_eq!(
        wakeup_status(&app, soon["id"].as_str().unwrap()).await,
        "cancelled"
    );
    let by: String =
        sqlx::query_scalar("SELECT cancelled_by FROM switchboard.wakeups WHERE id = $1::uuid")
            .bind(soon["id"].as_str().unwrap())
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(by.starts_with("person:"), "{by}");

    // The operator cancels the other; cancelling it again is refused.
    let path = format!("/api/v1/wakeups/{}", later["id"].as_str().unwrap());
    let (status, cancelled) = app.call_api(&operator, Method::DELETE, &path, None).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["cancelled_by"], "key:ops");
    let (status, again) = app.call_api(&operator, Method::DELETE, &path, None).await;
    assert_eq!(status, 409);
    assert_eq!(again["error"]["code"], "not_pending");

    assert_eq!(app.send_sms(DANA, "/reminders").await.status(), 200);
    let sent = app.wait_for_sms(4, WAIT).await;
    assert_eq!(sent[3].body, "You have no reminders with me.");
    let session = session_of(&app, DANA).await;
    assert_eq!(session_status(&app, &operator, &session).await, "idle");
    app.shutdown().await;
}

#[tokio::test]
async fn a_turn_token_reaches_only_its_own_persons_wake_ups_and_a_person_has_a_capped_number() {
    let app = spawn_app_with(AppOptions::default().configured(|c| {
        fast(c);
        c.wakeups.max_pending_per_person = 2;
    }))
    .await;
    let dana = text_and_take_token(&app, DANA, "hello from Dana", 1).await;
    let eli = text_and_take_token(&app, ELI, "hello from Eli", 2).await;
    let hers = schedule(
        &app,
        &dana,
        json!({"delay_s": 3600, "note": "Dana: badge 4471"}),
    )
    .await;
    let path = format!("/api/v1/wakeups/{}", hers["id"].as_str().unwrap());

    // Eli's agent turn sees nothing of Dana's.
    for (method, path) in [
        (Method::GET, path.clone()),
        (Method::DELETE, path.clone()),
        (
            Method::GET,
            format!("/api/v1/wakeups?person=phone:%2B{}", &DANA[1..]),
        ),
    ] {
        let (status, answer) = app.call_api(&eli, method, &path, None).await;
        assert_eq!(status, 403, "{path}: {answer}");
        assert_eq!(answer["error"]["code"], "outside_turn");
    }
    let (status, listed) = app
        .call_api(&eli, Method::GET, "/api/v1/wakeups", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        listed["wakeups"],
        json!([]),
        "Eli's list holds none of Dana's"
    );
    let dana_session = session_of(&app, DANA).await;
    let (status, answer) = app
        .call_api(
            &eli,
            Method::POST,
            "/api/v1/wakeups",
            Some(json!({"delay_s": 60, "note": "x", "session_id": dana_session})),
        )
        .await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(
        wakeup_status(&app, hers["id"].as_str().unwrap()).await,
        "pending"
    );

    // Bad requests are told why.
    for (body, code) in [
        (json!({"note": "x"}), "invalid_due"),
        (
            json!({"delay_s": 5, "due_at": "2030-01-01T00:00:00Z", "note": "x"}),
            "invalid_due",
        ),
        (
            json!({"due_at": "2020-01-01T00:00:00Z", "note": "x"}),
            "due_in_past",
        ),
        (
            json!({"due_at": "tomorrow at 6", "note": "x"}),
            "invalid_due_at",
        ),
        (json!({"delay_s": 5, "note": "  "}), "missing_field"),
        (
            json!({"delay_s": 5, "note": "x".repeat(2001)}),
            "note_too_long",
        ),
    ] {
        let (status, answer) = app
            .call_api(&dana, Method::POST, "/api/v1/wakeups", Some(body.clone()))
            .await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{body}: {answer}");
    }

    // The cap: two pending at most.
    schedule(&app, &dana, json!({"delay_s": 7200, "note": "second"})).await;
    let (status, answer) = app
        .call_api(
            &dana,
            Method::POST,
            "/api/v1/wakeups",
            Some(json!({"delay_s": 9000, "note": "third"})),
        )
        .await;
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"]["code"], "too_many_wakeups");
    // Cancelling one makes room.
    let (status, _) = app.call_api(&dana, Method::DELETE, &path, None).await;
    assert_eq!(status, 200);
    schedule(&app, &dana, json!({"delay_s": 9000, "note": "third"})).await;

    // An API key without the scope is refused; a turn token lists its own.
    let reader = app.api_key("reader", &["search:read"]).await;
    let (status, _) = app
        .call_api(&reader, Method::GET, "/api/v1/wakeups", None)
        .await;
    assert_eq!(status, 403);
    let (_, listed) = app
        .call_api(&dana, Method::GET, "/api/v1/wakeups?status=pending", None)
        .await;
    let notes: Vec<&str> = listed["wakeups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["note"].as_str().unwrap())
        .collect();
    assert_eq!(notes, ["second", "third"]);
    app.shutdown().await;
}

#[tokio::test]
async fn a_wake_up_due_while_its_dispatcher_crashed_after_firing_it_comes_back_once() {
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(|c| {
            fast(c);
            // The second firing comes after JetStream's duplicate window: the session stage
            // alone must know it for the same message.
            c.runtime.duplicate_window_s = 1;
        }),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    let mut crashing = app.spawn_worker_with_env(
        "dispatch",
        &[(
            switchboard_kit::failpoint::ENV,
            "dispatch.wakeup_published".to_string(),
        )],
    );
    let token = text_and_take_token(&app, DANA, "wake me at six", 1).await;
    let wakeup = schedule(&app, &token, json!({"delay_s": 2, "note": "Wake Dana up"})).await;
    let id = wakeup["id"].as_str().unwrap().to_string();

    // It publishes the wake-up's input and dies before it can record that it did.
    let started = Instant::now();
    let exit = tokio::time::timeout(WAIT, crashing.wait())
        .await
        .expect("the dispatcher reached its failpoint")
        .unwrap();
    assert!(!exit.success());
    assert_eq!(
        wakeup_status(&app, &id).await,
        "pending",
        "not recorded as fired"
    );
    // Its turn is on its way: an operator can no longer cancel it (and is told why), so
    // nobody is told "cancelled" of a reminder that still comes.
    let operator = app.api_key("ops", &["sessions:write"]).await;
    let (status, answer) = app
        .call_api(
            &operator,
            Method::DELETE,
            &format!("/api/v1/wakeups/{id}"),
            None,
        )
        .await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "firing");

    // Two dispatchers take over: the claim lapses, one fires it again, the same message.
    let _dispatchers: Vec<_> = (0..2).map(|_| app.spawn_worker("dispatch")).collect();
    let sent = app.wait_for_sms(2, WAIT).await;
    assert_eq!(sent[1].to, DANA);
    assert_eq!(sent[1].body, "echo: Wake Dana up");
    while wakeup_status(&app, &id).await != "fired" && started.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(wakeup_status(&app, &id).await, "fired");
    pass(3).await;
    app.settle().await;
    assert_eq!(
        texts_to(&app, DANA, "echo: Wake Dana up"),
        1,
        "the wake-up came back more than once"
    );
    let turns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.turns WHERE provider_message_id LIKE 'wakeup:%'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(turns, 1, "one input, one turn");
    app.shutdown().await;
}

#[tokio::test]
async fn forgetting_a_person_erases_their_wake_ups_and_none_of_them_comes_back() {
    let app = spawn_app_with(AppOptions::default().configured(fast)).await;
    let eraser = app.api_key("dpo", &["people:forget"]).await;
    let token = text_and_take_token(&app, DANA, "remind me about the clinic", 1).await;
    schedule(
        &app,
        &token,
        json!({"delay_s": 5, "note": "Dana's clinic appointment is at 3"}),
    )
    .await;
    let (status, answer) = app
        .call_api(
            &eraser,
            Method::DELETE,
            &format!("/api/v1/people/phone:{DANA}"),
            None,
        )
        .await;
    assert!(status == 200 || status == 202, "{status}: {answer}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.wakeups")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(left, 0, "the agent's notes about Dana are erased with her");
    pass(7).await;
    app.settle().await;
    assert_eq!(
        texts_to(&app, DANA, "echo: Dana's clinic appointment"),
        0,
        "nothing came back"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn an_agents_note_is_never_read_as_the_persons_request_to_link_a_phone() {
    let app = spawn_app_with(AppOptions::default().configured(fast)).await;
    let mut chat = switchboard_e2e::ChatClient::as_user(&app.gateway_url, "ana").await;
    chat.say("m-1", "remind me to link my phone later").await;
    chat.reply(WAIT).await;
    app.settle().await;
    let token = app
        .runner
        .calls()
        .into_iter()
        .rfind(|c| c.prompt.contains("remind me to link"))
        .and_then(|c| c.turn_token)
        .expect("the turn's token");
    // Read as Ana's words, this would text a code to a number nobody asked for.
    schedule(
        &app,
        &token,
        json!({"delay_s": 1, "note": "link my phone +14155550177"}),
    )
    .await;
    let reply = chat.reply(WAIT).await;
    assert_eq!(
        reply["text"], "echo: link my phone +14155550177",
        "the agent answered its own note: {reply}"
    );
    pass(1).await;
    assert!(
        app.twilio.sent().iter().all(|s| s.to != "+14155550177"),
        "a code was texted: {:?}",
        app.twilio.sent()
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_wake_up_due_while_the_persons_earlier_message_is_on_its_way_comes_after_it() {
    // Dana wrote again before the wake-up came due, but a crashed worker still holds that
    // message (numbered by the gateway, not yet at the session stage) when it fires. The
    // agent's return must not jump ahead of what Dana said before it.
    let app = spawn_app_with(AppOptions::default().configured(fast)).await;
    let token = text_and_take_token(&app, DANA, "remind me about the keys", 1).await;
    let held = app.number_sms(DANA, "SMheld").await;
    let wakeup = schedule(
        &app,
        &token,
        json!({"delay_s": 0, "note": "Ask Dana whether she found the keys"}),
    )
    .await;
    let id = wakeup["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + WAIT;
    while wakeup_status(&app, &id).await != "fired" {
        assert!(Instant::now() < deadline, "the wake-up never fired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pass(2).await;
    assert_eq!(
        texts_to(&app, DANA, "found the keys"),
        0,
        "the wake-up was answered before the message Dana sent before it"
    );

    let message = app.numbered_sms(DANA, "SMheld", "also, the car is at the garage", held);
    app.publish_numbered_sms(&message).await;
    let sent = app.wait_for_sms(3, WAIT).await;
    assert_eq!(
        [sent[1].body.as_str(), sent[2].body.as_str()],
        [
            "echo: also, the car is at the garage",
            "echo: Ask Dana whether she found the keys"
        ],
        "Dana's message, then the agent's return"
    );
    let seqs: Vec<(String, i64)> = sqlx::query_as(
        "SELECT provider_message_id, seq FROM switchboard.turns
          WHERE provider_message_id IN ('SMheld', $1) ORDER BY seq",
    )
    .bind(format!("wakeup:{id}"))
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(
        seqs.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["SMheld", format!("wakeup:{id}").as_str()],
        "one turn each, Dana's first"
    );
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 3, "nothing answered twice");
    app.shutdown().await;
}

#[tokio::test]
async fn a_wake_up_whose_input_could_not_be_published_is_tried_again_soon_and_holds_nobody_up() {
    // Its input was numbered among Dana's messages, then its publish failed: Dana's next
    // message waits for that number, so the wake-up must not wait out its whole claim.
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(|c| {
            fast(c);
            c.wakeups.claim_s = 600;
        }),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    let _dispatcher = app.spawn_worker_with_env(
        "dispatch",
        &[(
            switchboard_kit::failpoint::ENV,
            "dispatch.wakeup_publish:lose".to_string(),
        )],
    );
    let token = text_and_take_token(&app, DANA, "ping me", 1).await;
    let wakeup = schedule(&app, &token, json!({"delay_s": 0, "note": "Pinging Dana"})).await;
    let id = wakeup["id"].as_str().unwrap().to_string();
    // The firing numbered its input among Dana's messages (then its publish failed).
    let counters = app
        .js
        .get_key_value(app.topology.arrivals_bucket())
        .await
        .unwrap();
    let key = switchboard_kit::arrival::sender_key("sms", DANA);
    let deadline = Instant::now() + WAIT;
    loop {
        let counter = counters
            .get(key.as_str())
            .await
            .unwrap()
            .unwrap_or_default();
        if String::from_utf8_lossy(&counter).contains(&format!("wakeup:{id}")) {
            break;
        }
        assert!(Instant::now() < deadline, "the wake-up was never numbered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Dana writes right after the failed firing.
    assert_eq!(app.send_sms(DANA, "are you there?").await.status(), 200);
    let sent = app.wait_for_sms(3, WAIT).await;
    assert_eq!(
        [sent[1].body.as_str(), sent[2].body.as_str()],
        ["echo: Pinging Dana", "echo: are you there?"],
        "the wake-up, fired again within the claim, then Dana's message"
    );
    assert_eq!(wakeup_status(&app, &id).await, "fired");
    app.shutdown().await;
}

#[tokio::test]
async fn a_reminders_cancel_run_again_after_a_crash_cancels_nothing_more() {
    // Dana cancels her first reminder; the dispatcher dies right after the cancel committed.
    // The turn runs again: her second reminder is now "1" in her list, and must not be
    // cancelled by the same message read again.
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(fast),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    let mut crashing = app.spawn_worker_with_env(
        "dispatch",
        &[(
            switchboard_kit::failpoint::ENV,
            "dispatch.reminders_cancelled".to_string(),
        )],
    );
    let token = text_and_take_token(&app, DANA, "two reminders please", 1).await;
    let first = schedule(
        &app,
        &token,
        json!({"delay_s": 3600, "note": "Water the plants"}),
    )
    .await;
    let second = schedule(
        &app,
        &token,
        json!({"delay_s": 7200, "note": "Call the vet"}),
    )
    .await;

    assert_eq!(
        app.send_sms(DANA, "/reminders cancel 1").await.status(),
        200
    );
    let exit = tokio::time::timeout(WAIT, crashing.wait())
        .await
        .expect("the dispatcher reached its failpoint")
        .unwrap();
    assert!(!exit.success());
    let _dispatcher = app.spawn_worker("dispatch");
    let sent = app.wait_for_sms(2, WAIT).await;
    assert!(sent[1].body.starts_with("Cancelled:"), "{}", sent[1].body);
    assert!(
        sent[1].body.contains("Water the plants"),
        "{}",
        sent[1].body
    );
    assert!(!sent[1].body.contains("Call the vet"), "{}", sent[1].body);
    let id = |w: &Value| w["id"].as_str().unwrap().to_string();
    assert_eq!(wakeup_status(&app, &id(&first)).await, "cancelled");
    assert_eq!(
        wakeup_status(&app, &id(&second)).await,
        "pending",
        "the rerun cancelled by the shifted numbers"
    );
    pass(2).await;
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 2, "answered once");
    app.shutdown().await;
}
