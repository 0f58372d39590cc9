//! Backup and restore (docs/operations.md, "Backup and restore"): `switchboard backup` of a
//! running deployment, the deployment lost (its database dropped, its streams deleted), then
//! `switchboard restore` into the empty one: the sessions carry on and the message that was
//! waiting in the work stream when the backup was taken is answered.
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use sqlx::Connection as _;
use switchboard_e2e::{AppOptions, TestApp, sigterm, spawn_app_with};
use tokio::process::Child;

const PERSON: &str = "+14155550163";
const WAIT: Duration = Duration::from_secs(30);
/// The stages a turn goes through, each its own worker process.
const STAGES: [&str; 6] = [
    "identify",
    "session",
    "dispatch",
    "log-inbound",
    "log-outbound",
    "deliver",
];

fn start_workers(app: &TestApp) -> Vec<Child> {
    STAGES.iter().map(|s| app.spawn_worker(s)).collect()
}

async fn stop(workers: Vec<Child>) {
    for mut w in workers {
        sigterm(&w);
        let _ = tokio::time::timeout(WAIT, w.wait()).await;
    }
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `switchboard <command> <dir> --json`: its document (the backup's manifest and `dir`).
async fn cli(app: &TestApp, command: &str, dir: &Path) -> serde_json::Value {
    let pg_bin = std::env::var("SB_PG_BIN")
        .expect("SB_PG_BIN: `make test` runs the tests in the stack's environment");
    let out = app
        .cli(&[
            OsStr::new(command),
            dir.as_os_str(),
            OsStr::new("--pg-bin"),
            OsStr::new(&pg_bin),
            OsStr::new("--json"),
        ])
        .await;
    assert!(
        out.status.success(),
        "switchboard {command} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

/// The deployment's state is gone: its database dropped and made again empty, its streams
/// (and the arrival counters' bucket) deleted.
async fn lose_everything(app: &TestApp) {
    let url = url::Url::parse(&app.config.database_url).unwrap();
    let name = url.path().trim_start_matches('/').to_string();
    let mut admin_url = url.clone();
    admin_url.set_path("/switchboard");
    let mut admin = sqlx::PgConnection::connect(admin_url.as_str())
        .await
        .unwrap();
    sqlx::query(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&mut admin)
        .await
        .unwrap();
    let t = &app.topology;
    for stream in [t.work_stream(), t.events_stream(), t.dlq_stream()] {
        app.js.delete_stream(&stream).await.unwrap();
    }
    app.js.delete_key_value(t.arrivals_bucket()).await.unwrap();
}

#[tokio::test]
async fn a_backup_restored_into_an_empty_deployment_carries_its_sessions_on_and_answers_what_was_waiting()
 {
    // The gateway in this process; every stage a worker process, stopped and started as an
    // operator would.
    let app = spawn_app_with(AppOptions::without(&switchboard::stages::names())).await;
    let workers = start_workers(&app);
    app.send_sms(PERSON, "first").await;
    app.wait_for_sms(1, WAIT).await;

    // While workers pull, a backup could miss a message (the server copies a stream's messages
    // before its consumers' acks): it is refused, naming them, and writes nothing.
    let early = std::env::temp_dir().join(format!("sb-backup-{}", uuid::Uuid::new_v4().simple()));
    let refused = app
        .cli(&[
            OsStr::new("backup"),
            early.as_os_str(),
            OsStr::new("--quiet-wait-s"),
            OsStr::new("2"),
        ])
        .await;
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("workers are still running"), "{said}");
    assert!(!early.exists(), "a refused backup writes nothing");

    // Dispatch stops: the next message's turn waits in the work stream.
    let mut workers = workers;
    let dispatch = workers.remove(2);
    stop(vec![dispatch]).await;
    app.send_sms(PERSON, "second").await;
    let person = format!("phone:{PERSON}");
    until("the second turn to be opened", async || {
        app.turns_opened(&person).await == 2
    })
    .await;
    stop(workers).await;

    let dir = std::env::temp_dir().join(format!("sb-backup-{}", uuid::Uuid::new_v4().simple()));
    let taken = cli(&app, "backup", &dir).await;
    assert_eq!(taken["dir"], dir.display().to_string());
    assert!(
        taken["streams"].as_array().is_some_and(|s| !s.is_empty()),
        "{taken}"
    );
    lose_everything(&app).await;
    let restored = cli(&app, "restore", &dir).await;
    assert_eq!(restored["restored"], true);
    assert_eq!(restored["taken_at"], taken["taken_at"]);

    // The deployment starts again on what was restored.
    let workers = start_workers(&app);
    let sent = app.wait_for_sms(2, WAIT).await;
    assert_eq!(
        sent[1].body, "echo: second",
        "the waiting message is answered"
    );
    app.send_sms(PERSON, "third").await;
    let sent = app.wait_for_sms(3, WAIT).await;
    assert_eq!(sent[2].body, "echo: third");
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 3, "one reply each: {sent:?}");

    // One session throughout: the engine resumed with the session it began before the backup.
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert_eq!(calls[0].session_id, None);
    let engine_session = calls[1]
        .session_id
        .clone()
        .expect("the second turn resumes");
    assert_eq!(
        calls[2].session_id.as_deref(),
        Some(engine_session.as_str())
    );
    assert_eq!(app.turns_opened(&person).await, 3);
    let rows = app.log_rows().await;
    assert_eq!(
        rows.len(),
        6,
        "every message in and out is logged: {rows:?}"
    );
    assert!(rows.iter().all(|r| r.session_id == rows[0].session_id));
    stop(workers).await;

    // A restore overwrites nothing: into a database that has the product's tables, it refuses.
    let pg_bin = std::env::var("SB_PG_BIN").unwrap();
    let again = app
        .cli(&[
            OsStr::new("restore"),
            dir.as_os_str(),
            OsStr::new("--pg-bin"),
            OsStr::new(&pg_bin),
        ])
        .await;
    assert!(!again.status.success());
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(said.contains("restore into an empty database"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
    app.shutdown().await;
}
