//! Erasure as a durable job: a worker that dies midway leaves the job to the next one, which
//! finishes it and announces it once; deletes that keep failing fail the job visibly (and a
//! rerun retries it); the person's history includes the ids linked into them; an address is
//! theirs only on the channels of its kind.

use std::time::Duration;

use crate::forget_support::*;
use async_nats::jetstream;
use switchboard_e2e::{AppOptions, TestApp, spawn_app_with};

/// Dana's second phone, a stranger to the directory until an operator links it to her.
const DANA_OTHER_PHONE: &str = "+14155550143";
/// A name that is Dana's chat login and the owner of Ben's API key.
const SHARED: &str = "ops-desk-forget";

async fn dana_texted(app: &TestApp) -> Vec<String> {
    in_directory(app, DANA, DANA_PHONE, None).await;
    app.send_sms(DANA_PHONE, "when is my next shift").await;
    app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    dana_needles(&sessions_of(app, DANA).await)
}

/// The forget worker dies right after the first sweep, then right after announcing: each time
/// the next worker takes the job from where the row says it is, and `person.forgotten` is
/// published once.
#[tokio::test]
async fn an_erasure_whose_worker_dies_midway_is_finished_by_the_next_and_announced_once() {
    let root = std::env::temp_dir().join(format!("sb-forget-{}", uuid::Uuid::new_v4()));
    let app = spawn_app_with(
        AppOptions::all_but("forget-sweep")
            .configured(move |c| c.workspace.root = root.to_string_lossy().into_owned()),
    )
    .await;
    let needles = dana_texted(&app).await;
    let job = forget_dana_no_wait(&app).await;
    assert_eq!(job["status"], "erasing", "{job}");

    for (failpoint, status, announced) in [
        ("forget.swept_once", "sweeping", 0),
        ("forget.announced", "sweeping", 1),
    ] {
        let mut dying = app.spawn_worker_with_env(
            "forget",
            &[(switchboard_kit::failpoint::ENV, failpoint.into())],
        );
        let died = tokio::time::timeout(Duration::from_secs(30), dying.wait())
            .await
            .expect("the forget worker died at the failpoint")
            .expect("its exit status");
        assert!(
            !died.success(),
            "killed at {failpoint}, not stopped: {died}"
        );
        assert_eq!(job_status(&app, &job).await, status, "after {failpoint}");
        assert_eq!(announcements(&app).await, announced, "after {failpoint}");
    }

    let mut next = app.spawn_worker("forget");
    wait_for_job(&app, &job, &["done"]).await;
    assert_eq!(announcements(&app).await, 1, "announced once");
    assert_eq!(rows_naming(&app, &needles).await, Vec::<String>::new());
    assert_eq!(
        stream_messages_naming(&app, &needles).await,
        Vec::<String>::new()
    );
    next.kill().await.ok();
    app.shutdown().await;
}

/// Make the dead-letter stream refuse deleting messages (the server allows no way back).
async fn refuse_dead_letter_deletes(app: &TestApp) -> jetstream::stream::Config {
    let mut stream = app.js.get_stream(app.topology.dlq_stream()).await.unwrap();
    let config = stream.info().await.unwrap().config.clone();
    app.js
        .update_stream(jetstream::stream::Config {
            deny_delete: true,
            ..config.clone()
        })
        .await
        .unwrap();
    config
}

/// A dead letter naming Dana that the server refuses to delete: the job ends `failed`, saying
/// which message and why, and nothing is announced; asked again once the stream is fixed, the
/// same job runs again and finishes.
#[tokio::test]
async fn a_delete_that_keeps_failing_fails_the_job_visibly_and_a_rerun_retries_it() {
    let app = app_with_workspaces().await;
    let needles = dana_texted(&app).await;
    let session = sessions_of(&app, DANA).await[0].0;
    dead_letter_of(&app, session).await;
    let config = refuse_dead_letter_deletes(&app).await;

    let key = app.api_key("privacy-officer", &["people:forget"]).await;
    let started = forget_request(&app, &key, DANA).send().await.unwrap();
    assert_eq!(started.status(), 202);
    let started: serde_json::Value = started.json().await.unwrap();
    let url = started["status_url"].as_str().unwrap().to_string();
    let failed = poll_until_over(&app, &key, &url).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let failures = failed["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{failed}");
    assert_eq!(failures[0]["what"], "dead_letter");
    let place = failures[0]["where"].as_str().unwrap();
    assert!(place.starts_with(&app.topology.dlq_stream()), "{place}");
    assert!(!failures[0]["error"].as_str().unwrap().is_empty());
    assert_eq!(
        announcements(&app).await,
        0,
        "a failed erasure is not announced"
    );
    assert_eq!(app.dead_letters("dispatch").await.len(), 1);

    // The operator fixes the stream (here: makes it again, as it was, without the letter).
    app.js
        .delete_stream(app.topology.dlq_stream())
        .await
        .unwrap();
    app.js.create_stream(config).await.unwrap();
    let again = forget_request(&app, &key, DANA).send().await.unwrap();
    assert_eq!(again.status(), 202);
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["job_id"], started["job_id"], "{again}");
    let done = poll_until_over(&app, &key, &url).await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["failures"], serde_json::json!([]));
    assert_eq!(announcements(&app).await, 1);
    assert!(app.dead_letters("dispatch").await.is_empty());
    assert_eq!(
        stream_messages_naming(&app, &needles).await,
        Vec::<String>::new()
    );
    app.shutdown().await;
}

/// Her second phone texted before an operator linked it to her: that history (a session, its
/// messages, the phone's arrival cursor) is hers, and goes with the rest.
#[tokio::test]
async fn history_recorded_under_an_id_linked_into_the_person_is_erased_with_theirs() {
    let app = app_with_workspaces().await;
    in_directory(&app, DANA, DANA_PHONE, None).await;
    app.send_sms(DANA_OTHER_PHONE, "it's Dana, on my new phone")
        .await;
    app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    let other = format!("phone:{DANA_OTHER_PHONE}");
    let before = sessions_of(&app, &other).await;
    assert_eq!(before.len(), 1, "the stranger's session");
    sqlx::query(
        "INSERT INTO switchboard.identity_links
            (id, from_person_id, to_person_id, linked_by, reason)
         VALUES ($1, $2, $3, 'ops', 'her new phone')",
    )
    .bind(uuid::Uuid::now_v7())
    .bind(&other)
    .bind(DANA)
    .execute(&app.db)
    .await
    .unwrap();
    let needles = vec![
        DANA_OTHER_PHONE.to_string(),
        other.clone(),
        before[0].0.to_string(),
    ];
    assert!(!rows_naming(&app, &needles).await.is_empty());

    // The CLI follows the job to its end.
    let printed = forget_dana(&app).await;
    assert_eq!(printed["status"], "done", "{printed}");
    assert_eq!(printed["removed"]["sessions"], 1, "{printed}");
    assert_eq!(printed["removed"]["identity_links"], 1, "{printed}");
    assert_eq!(rows_naming(&app, &needles).await, Vec::<String>::new());
    assert_eq!(
        stream_messages_naming(&app, &needles).await,
        Vec::<String>::new()
    );
    app.shutdown().await;
}

/// One name, two people: Dana's chat login and the owner of Ben's API key. Erasing Dana takes
/// her chat mailbox and her upload, never Ben's key or his API mailbox.
#[tokio::test]
async fn a_chat_login_equal_to_someone_elses_api_key_owner_erases_only_the_chat_users_rows() {
    let app = app_with_workspaces().await;
    in_directory(&app, DANA, DANA_PHONE, Some(SHARED)).await;
    in_directory(&app, BEN, BEN_PHONE, None).await;
    sqlx::query(
        "INSERT INTO switchboard.contact_points (kind, address, person_id)
         VALUES ('api_key_owner', $1, $2)",
    )
    .bind(SHARED)
    .bind(BEN)
    .execute(&app.db)
    .await
    .unwrap();
    let ben_key = app.api_key(SHARED, &["messages:write"]).await;
    for channel in ["admin_chat", "api"] {
        sqlx::query(
            "INSERT INTO switchboard.mailbox
                (reply_id, part, channel, address, agent, correlation_id, text)
             VALUES ($1, 0, $2, $3, 'reggie_oc', $4, 'a reply')",
        )
        .bind(uuid::Uuid::now_v7())
        .bind(channel)
        .bind(SHARED)
        .bind(format!("c-{channel}"))
        .execute(&app.db)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO switchboard.chat_uploads
            (id, owner, name, content_type, bytes, sha256, data, expires_at)
         VALUES ($1, $2, 'roster.txt', 'text/plain', 2, '', 'hi', now() + interval '1 day')",
    )
    .bind(uuid::Uuid::now_v7())
    .bind(SHARED)
    .execute(&app.db)
    .await
    .unwrap();

    let printed = forget_dana(&app).await;
    assert_eq!(printed["status"], "done", "{printed}");
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT channel FROM switchboard.mailbox WHERE address = $1 ORDER BY channel",
    )
    .bind(SHARED)
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(
        left,
        ["api"],
        "Ben's API mailbox stays, Dana's chat one goes"
    );
    let uploads: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.chat_uploads")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(uploads, 0, "Dana's upload goes");
    let keys: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.api_keys WHERE owner = $1 AND revoked_at IS NULL",
    )
    .bind(SHARED)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(keys, 1, "Ben's API key stays");
    assert_eq!(printed["removed"]["api_keys"], 0, "{printed}");
    // And it still opens the API for him.
    let answer = reqwest::Client::new()
        .get(format!("{}/api/v1/messages/c-api", app.gateway_url))
        .bearer_auth(&ben_key)
        .send()
        .await
        .unwrap();
    assert_ne!(answer.status(), 401);
    app.shutdown().await;
}
