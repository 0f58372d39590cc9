//! Forgetting a person (`switchboard forget`, `DELETE /api/v1/people/<id>`): afterwards no
//! table row, workspace folder, stream message or dead letter names them, also when they were
//! mid-turn; everyone else's data is untouched; `person.forgotten` tells downstream consumers;
//! a message they send afterwards starts a new conversation.

use std::time::{Duration, Instant};

use crate::forget_support::*;
use prost::Message as _;
use switchboard_e2e::{AppOptions, ChatClient, spawn_app_with};
use switchboard_kit::proto::PersonForgotten;
use switchboard_kit::stage::StageOverrides;

#[tokio::test]
async fn a_person_who_texted_and_chatted_is_forgotten_everywhere_and_no_one_else_is() {
    let app = app_with_workspaces().await;
    in_directory(&app, DANA, DANA_PHONE, Some(DANA_LOGIN)).await;
    in_directory(&app, BEN, BEN_PHONE, None).await;
    app.send_sms(DANA_PHONE, "when is my next shift").await;
    app.wait_for_sms(1, WAIT).await;
    let mut chat = ChatClient::as_user(&app.gateway_url, DANA_LOGIN).await;
    chat.say("m-1", "and the one after").await;
    chat.reply(WAIT).await;
    app.send_sms(BEN_PHONE, "am I on tomorrow").await;
    app.wait_for_sms(2, WAIT).await;
    app.settle().await;
    // What Twilio reported of each one's reply: hers goes with her, his stays.
    for phone in [DANA_PHONE, BEN_PHONE] {
        let sms = app
            .twilio
            .sent()
            .into_iter()
            .find(|m| m.to == phone)
            .unwrap();
        let report = app.twilio_reports(&sms.sid, "delivered", None).await;
        assert_eq!(report.status(), 200);
    }
    memory_of(&app, DANA).await;
    memory_of(&app, BEN).await;
    let dana = sessions_of(&app, DANA).await;
    assert_eq!(dana.len(), 1, "texting and chatting is one session");
    dead_letter_of(&app, dana[0].0).await;
    let dana_folder = dana[0].1.clone().expect("a workspace folder");
    assert!(std::path::Path::new(&dana_folder).is_dir());
    let ben = sessions_of(&app, BEN).await;
    let ben_needles = vec![BEN.to_string(), BEN_PHONE.into(), ben[0].0.to_string()];
    let ben_rows = rows_naming(&app, &ben_needles).await;
    let ben_stored = stream_messages_naming(&app, &ben_needles).await;
    let needles = dana_needles(&dana);
    assert!(!rows_naming(&app, &needles).await.is_empty());
    assert!(!stream_messages_naming(&app, &needles).await.is_empty());

    let key = app.api_key("privacy-officer", &["people:forget"]).await;
    let answer = forget_request(&app, &key, DANA).send().await.unwrap();
    // Accepted: her rows are gone (committed), the streams are the forget worker's job.
    assert_eq!(answer.status(), 202);
    let location = answer.headers()["location"].to_str().unwrap().to_string();
    let started: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(started["status_url"], location.as_str(), "{started}");
    assert_eq!(started["person_id"], DANA);
    assert_eq!(started["removed"]["sessions"], 1, "{started}");
    let body = poll_until_over(&app, &key, &location).await;
    assert_eq!(body["status"], "done", "{body}");
    assert_eq!(body["failures"], serde_json::json!([]), "{body}");
    assert_eq!(body["job_id"], started["job_id"]);
    assert!(body["finished_at"].is_string(), "{body}");
    let removed = &body["removed"];
    assert_eq!(
        removed["messages"], 4,
        "two messages and two replies: {body}"
    );
    assert_eq!(removed["sessions"], 1, "{body}");
    assert_eq!(removed["people"], 1, "{body}");
    assert_eq!(removed["contact_points"], 2, "{body}");
    assert_eq!(removed["summaries"], 1, "{body}");
    assert_eq!(removed["memories"], 1, "{body}");
    assert_eq!(removed["workspaces"], 1, "{body}");
    assert_eq!(removed["dead_letters"], 1, "{body}");
    assert_eq!(removed["delivery_receipts"], 1, "{body}");
    assert!(removed["stream_messages"].as_i64().unwrap() > 0, "{body}");

    // Nothing names her: no row, no folder, no stored message, no dead letter.
    assert_eq!(rows_naming(&app, &needles).await, Vec::<String>::new());
    assert!(!std::path::Path::new(&dana_folder).exists());
    assert_eq!(
        stream_messages_naming(&app, &needles).await,
        Vec::<String>::new()
    );
    assert!(app.dead_letters("dispatch").await.is_empty());

    // Ben keeps everything.
    let receipts: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.delivery_receipts")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(receipts, 1, "Ben's report alone is left");
    assert_eq!(rows_naming(&app, &ben_needles).await, ben_rows);
    assert_eq!(stream_messages_naming(&app, &ben_needles).await, ben_stored);
    assert!(std::path::Path::new(ben[0].1.as_deref().unwrap()).is_dir());

    // Downstream consumers are told, with the counts.
    let announced: Vec<PersonForgotten> = stored_messages(&app)
        .await
        .into_iter()
        .filter(|(s, _)| *s == app.topology.event("person.forgotten"))
        .map(|(_, p)| PersonForgotten::decode(p.as_slice()).unwrap())
        .collect();
    assert_eq!(announced.len(), 1);
    assert_eq!(announced[0].person_id, DANA);
    assert_eq!(
        serde_json::to_value(&announced[0].removed).unwrap(),
        *removed
    );

    // A second erasure is the first one's job, done: never a bare "unknown".
    let again = forget_request(&app, &key, DANA).send().await.unwrap();
    assert_eq!(again.status(), 200);
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["job_id"], started["job_id"], "{again}");
    assert_eq!(again["status"], "done", "{again}");
    assert_eq!(again["started"], false, "{again}");
    chat.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn forgetting_a_person_mid_turn_leaves_nothing_and_their_next_message_starts_over() {
    let app = app_with_workspaces().await;
    in_directory(&app, DANA, DANA_PHONE, None).await;
    app.runner.set_hold(true);
    app.send_sms(DANA_PHONE, "please remember my allergy").await;
    let deadline = Instant::now() + WAIT;
    while app.runner.calls().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the turn never reached the runner"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dana = sessions_of(&app, DANA).await;
    let needles = dana_needles(&dana);

    // Not waited for: the job waits for the turn in flight, which the agent holds.
    let printed = forget_dana_no_wait(&app).await;
    assert_eq!(printed["removed"]["sessions"], 1, "{printed}");

    // The agent answers the call it was making; the pipeline settles.
    app.runner.set_hold(false);
    app.runner.release.notify_one();
    app.settle().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    app.settle().await;

    assert_eq!(rows_naming(&app, &needles).await, Vec::<String>::new());
    assert_eq!(
        stream_messages_naming(&app, &needles).await,
        Vec::<String>::new()
    );
    assert!(
        app.twilio.sent().is_empty(),
        "the answer to a forgotten person's message was sent"
    );
    assert_eq!(job_status(&app, &printed).await, "done");
    for stage in [
        "identify",
        "session",
        "dispatch",
        "log-inbound",
        "log-outbound",
        "deliver",
    ] {
        assert!(app.dead_letters(stage).await.is_empty(), "{stage}");
    }
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("sb_forgotten_dropped_total{stage=\"dispatch\"}"),
        "the dropped reply is counted: {metrics}"
    );

    // She writes again: a new conversation, answered, with nothing of the old one.
    app.send_sms(DANA_PHONE, "hello again").await;
    let sent = app.wait_for_sms(1, WAIT).await;
    assert_eq!(sent[0].body, "echo: hello again");
    app.settle().await;
    // The directory no longer knows her: she is whoever the number is now.
    let now: Vec<(uuid::Uuid, String)> =
        sqlx::query_as("SELECT id, person_id FROM switchboard.sessions")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(now.len(), 1);
    assert_ne!(now[0].0, dana[0].0, "a new session");
    assert_eq!(now[0].1, format!("phone:{DANA_PHONE}"));
    let last = app.runner.calls().pop().unwrap();
    assert!(last.session_id.is_none(), "a fresh engine session");
    assert!(!last.prompt.contains("allergy"), "{}", last.prompt);
    let messages: Vec<String> =
        sqlx::query_scalar("SELECT message FROM switchboard.messages ORDER BY id")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(messages, ["hello again", "echo: hello again"]);
    app.shutdown().await;
}

#[tokio::test]
async fn forgetting_needs_the_scope_and_a_person_someone_has_seen() {
    let app = app_with_workspaces().await;
    in_directory(&app, DANA, DANA_PHONE, None).await;
    let plain = app.api_key("integration", &["messages:write"]).await;
    let refused = forget_request(&app, &plain, DANA).send().await.unwrap();
    assert_eq!(refused.status(), 403);
    let still: i64 =
        sqlx::query_scalar("SELECT count(*) FROM switchboard.people WHERE person_id = $1")
            .bind(DANA)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(still, 1, "a refused request erases nothing");

    let key = app.api_key("privacy-officer", &["people:forget"]).await;
    let unknown = forget_request(&app, &key, "staff-never-seen")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let body: serde_json::Value = unknown.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unknown_person");
    let tombstones: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.forgotten_people")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(tombstones, 0, "nothing is recorded for a person never seen");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.erasure_jobs")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(jobs, 0, "no job for a person never seen");
    // An erasure's status needs the scope too, and an unknown job is not found.
    let somewhere = format!("/api/v1/erasures/{}", uuid::Uuid::now_v7());
    assert_eq!(erasure_at(&app, &plain, &somewhere).await.status(), 403);
    let unknown = erasure_at(&app, &key, &somewhere).await;
    assert_eq!(unknown.status(), 404);
    let body: serde_json::Value = unknown.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unknown_erasure");

    let out = app
        .cli(&["forget".as_ref(), "staff-never-seen".as_ref()])
        .await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no person"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    app.shutdown().await;
}

/// A stage's handler that read Dana's data before the erasure committed can publish after the
/// erasure swept the streams (an embedding or an agent's answer under way). A stage of the
/// test's own stands for it: it holds her turn in hand across the erasure, then publishes
/// what it made of the turn. The erasure's last step waits for it, then sweeps that too, and
/// only then announces the erasure.
#[tokio::test]
async fn what_a_stage_publishes_after_the_erasure_swept_is_swept_once_the_stage_is_done() {
    let app = app_with_workspaces().await;
    let (held, turn, needles) = dana_held_by_a_slow_stage(&app).await;
    let job = forget_dana_no_wait(&app).await;
    wait_for_job(&app, &job, &["sweeping"]).await;
    publish_late(&app, &turn).await;
    // Asked again meanwhile: the same job, still under way.
    let key = app.api_key("privacy-officer", &["people:forget"]).await;
    let again = forget_request(&app, &key, DANA).send().await.unwrap();
    assert_eq!(again.status(), 202);
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["job_id"], job["job_id"], "{again}");
    assert_eq!(again["status"], "sweeping", "{again}");
    // The last step waits while the stage still holds what it read before the erasure.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_ne!(
        stream_messages_naming(&app, &needles).await,
        Vec::<String>::new(),
        "the late event is still there while the stage works"
    );
    assert_eq!(
        announcements(&app).await,
        0,
        "announced before the last step"
    );

    held.ack().await.unwrap();
    app.settle().await;
    assert_eq!(
        stream_messages_naming(&app, &needles).await,
        Vec::<String>::new()
    );
    assert!(app.dead_letters("forget-sweep").await.is_empty());
    assert_eq!(announcements(&app).await, 1);
    assert_eq!(job_status(&app, &job).await, "done");
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("sb_forget_late_swept_total 1"),
        "the late message is counted: {metrics}"
    );
    app.shutdown().await;
}

/// A stage busy past the last step's wait: the job becomes a dead letter that says which stage
/// it waited for; replayed once that stage is done, it sweeps what came late and announces the
/// erasure, and the replay leaves no dead letter keeping her addresses.
#[tokio::test]
async fn a_last_step_that_waited_too_long_is_a_dead_letter_whose_replay_finishes_the_erasure() {
    let app = app_with_workspaces_and(|c| {
        c.stages.insert(
            "forget-sweep".into(),
            StageOverrides {
                max_wait_ms: Some(1_000),
                ..Default::default()
            },
        );
    })
    .await;
    let (held, turn, needles) = dana_held_by_a_slow_stage(&app).await;
    let job = forget_dana_no_wait(&app).await;
    wait_for_job(&app, &job, &["sweeping"]).await;
    publish_late(&app, &turn).await;
    let letters = app.wait_for_dead_letters("forget-sweep", WAIT).await;
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].error.contains("waited too long for slow-stage"),
        "{}",
        letters[0].error
    );
    assert_eq!(announcements(&app).await, 0);

    held.ack().await.unwrap();
    app.replay_dead_letter("forget-sweep").await;
    app.settle().await;
    assert_eq!(
        stream_messages_naming(&app, &needles).await,
        Vec::<String>::new(),
        "the late event and the dead letter are gone"
    );
    assert_eq!(announcements(&app).await, 1);
    assert_eq!(job_status(&app, &job).await, "done");
    app.shutdown().await;
}

#[tokio::test]
async fn a_message_still_waiting_for_the_session_stage_on_her_own_subject_is_erased_with_her() {
    // The session stage is behind (not started yet): her message waits in the work stream on
    // the subject identify names after its sender.
    let app = spawn_app_with(AppOptions::all_but("session")).await;
    in_directory(&app, DANA, DANA_PHONE, None).await;
    assert_eq!(
        app.send_sms(DANA_PHONE, "please remember my allergy")
            .await
            .status(),
        200
    );
    let waiting_on = app.topology.identified_from("sms", DANA_PHONE);
    let deadline = Instant::now() + WAIT;
    while app.stored_on(&waiting_on).await == 0 {
        assert!(Instant::now() < deadline, "identify never handed it on");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let needles = vec![
        DANA.to_string(),
        DANA_PHONE.to_string(),
        "please remember my allergy".to_string(),
    ];

    let job = app.cli_json(&["forget", DANA, "--json"]).await;
    assert_eq!(job_status(&app, &job).await, "done", "{job}");
    assert_eq!(app.stored_on(&waiting_on).await, 0, "her waiting message");
    assert_eq!(
        stream_messages_naming(&app, &needles).await,
        Vec::<String>::new()
    );

    // The session stage catches up: nothing of hers reaches it, the agent or her phone.
    app.start_stage("session");
    app.settle().await;
    assert_eq!(rows_naming(&app, &needles).await, Vec::<String>::new());
    assert!(app.runner.calls().is_empty(), "a turn ran for her");
    assert!(app.twilio.sent().is_empty(), "she was answered");
    app.shutdown().await;
}
