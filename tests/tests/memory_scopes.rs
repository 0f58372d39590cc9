//! Memory never leaks between people, whatever `session.scope` says (issue 45). Under scope
//! `main` everyone who writes to the agent continues one engine session, so anything of one
//! person's put into it (their curated memory, recall over their messages, the summary) could
//! be asked for by the next: a shared session's prompt carries none of it, and its workspace
//! gets no memory.md. (Per-person scopes carry the person's own: `curated_memory.rs`,
//! `recall.rs`, `summary.rs`, `sender_isolation.rs`.)
use std::time::{Duration, Instant};

use switchboard_e2e::{FakeModel, TestApp, spawn_app_configured};
use switchboard_kit::config::SessionScope;

const ANA: &str = "+14155550411";
const BEN: &str = "+14155550412";
const SECRET: &str = "7719";
const WAIT: Duration = Duration::from_secs(30);

async fn text(app: &TestApp, phone: &str, body: &str, n: usize) {
    app.send_sms(phone, body).await;
    app.wait_for_sms(n, WAIT).await;
}

/// The memory workers caught up: every logged message embedded, and the summary of the
/// shared session written with what was said in it.
async fn memory_workers_ran(app: &TestApp, logged: i64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let (messages, vectors): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM switchboard.messages),
                    (SELECT count(*) FROM switchboard.message_vectors)",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        if messages >= logged && messages == vectors {
            break;
        }
        assert!(Instant::now() < deadline, "{vectors} of {messages} indexed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An hour of quiet later, the summary worker merges it.
    app.settle().await;
    app.log_ages_two_hours(None).await;
    loop {
        let summary: Option<String> = sqlx::query_scalar(
            "SELECT summary FROM switchboard.summaries WHERE memory_key = 'reggie:main'",
        )
        .fetch_optional(&app.db)
        .await
        .unwrap();
        if summary.is_some_and(|s| s.contains(SECRET)) {
            return;
        }
        assert!(Instant::now() < deadline, "no summary within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn under_main_scope_nothing_of_one_persons_memory_reaches_the_shared_session() {
    let model = FakeModel::start(64).await;
    let embedding = model.embedding_config("fake-embed");
    let root = std::env::temp_dir()
        .join(format!("sb-scopes-{}", uuid::Uuid::new_v4().simple()))
        .to_string_lossy()
        .into_owned();
    let app = spawn_app_configured(move |c| {
        c.session.scope = SessionScope::Main;
        c.workspace.root = root;
        c.embedding = embedding;
        c.summary.idle_gap_s = 3_600;
        c.summary.sweep_every_s = 1;
    })
    .await;

    // Ana keeps a secret in her curated memory and tells it to the agent.
    text(
        &app,
        ANA,
        &format!("/remember my locker code is {SECRET}"),
        1,
    )
    .await;
    text(
        &app,
        ANA,
        &format!("My locker code is {SECRET}, keep it quiet"),
        2,
    )
    .await;
    let told = app.runner.calls().pop().unwrap();
    memory_workers_ran(&app, 4).await;

    // Ben writes next, in a fresh engine session (so recall and summary would be loaded).
    text(&app, BEN, "/reset what is the locker code?", 3).await;
    let ben = app.runner.calls().pop().unwrap();
    assert!(ben.prompt.contains("what is the locker code?"));
    assert!(
        !ben.prompt.contains(SECRET),
        "Ana's secret in Ben's prompt:\n{}",
        ben.prompt
    );
    assert!(ben.prompt.contains("Shared session"), "{}", ben.prompt);

    // Ana's own memory, recall and summary are not put into the session Ben continues either.
    text(&app, ANA, "/reset what is my locker code?", 4).await;
    let ana = app.runner.calls().pop().unwrap();
    assert!(
        !ana.prompt.contains(SECRET),
        "Ana's memory put into the shared session:\n{}",
        ana.prompt
    );
    // And the shared workspace holds no one's memory.md.
    let ws = std::path::PathBuf::from(told.workspace.expect("a workspace"));
    let memory_md = std::fs::read_to_string(ws.join("memory.md")).unwrap_or_default();
    assert!(!memory_md.contains(SECRET), "memory.md: {memory_md}");
    app.shutdown().await;
}
