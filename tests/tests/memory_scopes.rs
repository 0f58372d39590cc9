//! Memory never leaks between people, whatever `session.scope` says (issue 45). Under scope
//! `main` everyone who writes to the agent continues one engine session, so anything of one
//! person's put into it (their curated memory, recall over their messages, the summary) could
//! be asked for by the next: a shared session's prompt carries none of it, its workspace gets
//! no memory.md, and its conversation is never summarised (a summary of it would mix everyone's
//! words in one model prompt and one row no one's erasure reaches). (Per-person scopes carry the person's own: `curated_memory.rs`,
//! `recall.rs`, `summary.rs`, `sender_isolation.rs`.)
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard_e2e::{FakeModel, TestApp, spawn_app_configured};
use switchboard_kit::config::{AgentConfig, SessionScope};

const ANA: &str = "+14155550411";
const BEN: &str = "+14155550412";
const SECRET: &str = "7719";
const WAIT: Duration = Duration::from_secs(30);

async fn text(app: &TestApp, phone: &str, body: &str, n: usize) {
    app.send_sms(phone, body).await;
    app.wait_for_sms(n, WAIT).await;
}

/// The embedding worker caught up: every logged message has its vector (so recall could find
/// them).
async fn embedded(app: &TestApp, logged: i64) {
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
            return;
        }
        assert!(Instant::now() < deadline, "{vectors} of {messages} indexed");
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
    embedded(&app, 4).await;

    // Ben writes next, in a fresh engine session (so recall would be loaded).
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

#[tokio::test]
async fn a_shared_agents_conversation_is_never_summarised_while_a_private_one_beside_it_is() {
    // A front-desk agent everyone talks to in one session (its own `scope = "main"`) beside a
    // private one (the default scope): the summary worker merges the private conversation
    // once it is quiet, and never the shared one, where Ana's and Ben's words would meet in
    // one model prompt and one summary row that Ben's erasure does not reach.
    let app = spawn_app_configured(move |c| {
        for a in &mut c.agents {
            a.scope = Some(SessionScope::Main);
        }
        let private = AgentConfig {
            name: "pat_oc".into(),
            identity: "pat".into(),
            ..c.agents[0].clone()
        };
        c.agents.push(AgentConfig {
            scope: None,
            ..private
        });
        c.summary.idle_gap_s = 3_600;
        c.summary.sweep_every_s = 1;
    })
    .await;
    text(&app, ANA, &format!("My locker code is {SECRET}"), 1).await;
    text(&app, BEN, "Ben here, what did Ana say?", 2).await;
    let key = app.api_key("crm", &[]).await;
    let answered = app
        .post_api_message(
            &key,
            json!({"agent": "pat_oc", "text": "a private note for Pat", "wait": true}),
            None,
        )
        .await;
    assert_eq!(answered.status(), 200);
    app.settle().await;
    let sessions: Vec<(String, String)> =
        sqlx::query_as("SELECT scope_key, memory_key FROM switchboard.sessions ORDER BY scope_key")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(
        sessions,
        [
            (
                "pat_oc:person:system:api:crm".to_string(),
                "pat:person:system:api:crm".to_string()
            ),
            ("reggie_oc:main".to_string(), "reggie:main".to_string()),
        ],
        "Ana and Ben share the front desk's session; the API caller has a private one with Pat"
    );

    // An hour of quiet later the sweep merges the private conversation...
    app.log_ages_two_hours(None).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let pat: Option<String> = sqlx::query_scalar(
            "SELECT summary FROM switchboard.summaries WHERE memory_key LIKE 'pat:%'",
        )
        .fetch_optional(&app.db)
        .await
        .unwrap();
        if pat.is_some_and(|s| s.contains("private note for Pat")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the private conversation was never summarised"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...and another sweep passes (it runs every second) without touching the shared one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let summarised: Vec<String> =
        sqlx::query_scalar("SELECT memory_key FROM switchboard.summaries ORDER BY memory_key")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(
        summarised,
        ["pat:person:system:api:crm"],
        "a summary of the shared session"
    );
    let unmerged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.message_marks k
           JOIN switchboard.sessions s ON s.id = k.session_id
          WHERE s.scope_key = 'reggie_oc:main' AND k.summary_version IS DISTINCT FROM 0",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        unmerged, 0,
        "the shared session's messages are marked never to merge"
    );
    app.shutdown().await;
}
