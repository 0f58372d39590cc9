//! The flush before a reset: before a session starts a fresh engine session, the pipeline runs
//! one silent turn on the old one asking the agent to write what it must keep into memory.md.
//! Its answer is logged, never sent to the person; then the reset happens. Once per turn, also
//! when the turn is redelivered; a failing flush does not stop the reset.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard_dispatch::prompt::FLUSH_INSTRUCTION;
use switchboard_e2e::{AppOptions, RunnerCall, TestApp, spawn_app_configured, spawn_app_with};

const PERSON: &str = "+14155550188";
const WAIT: Duration = Duration::from_secs(20);
const FLUSH_ANSWER: &str = "Kept in memory.md: works nights at the depot.";

fn workspace_root() -> String {
    std::env::temp_dir()
        .join(format!("sb-flush-{}", uuid::Uuid::new_v4().simple()))
        .to_string_lossy()
        .into_owned()
}

fn is_flush(call: &RunnerCall) -> bool {
    call.prompt.contains(FLUSH_INSTRUCTION)
}

fn flush_calls(app: &TestApp) -> Vec<RunnerCall> {
    app.runner.calls().into_iter().filter(is_flush).collect()
}

/// The session's `memory_flush` journal entries' details.
async fn flush_entries(app: &TestApp) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT detail FROM switchboard.session_events WHERE kind = 'memory_flush' ORDER BY id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

async fn resets(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM switchboard.session_events WHERE kind = 'reset'")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn bodies(app: &TestApp) -> Vec<String> {
    app.twilio.sent().into_iter().map(|m| m.body).collect()
}

#[tokio::test]
async fn a_reset_first_asks_the_agent_silently_to_keep_what_matters_then_starts_fresh() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| c.workspace.root = root).await;
    app.runner.answer_when(FLUSH_INSTRUCTION, FLUSH_ANSWER);

    app.send_sms(PERSON, "I work nights at the depot").await;
    app.wait_for_sms(1, WAIT).await;
    let first = app.runner.calls().pop().unwrap();
    assert_eq!(first.session_id, None);
    let old = "eng-1";

    // `/reset` alone: the agent is asked on its old engine session, and edits memory.md while
    // it answers.
    app.runner.set_hold(true);
    app.send_sms(PERSON, "/reset").await;
    until("the flush call", || !flush_calls(&app).is_empty()).await;
    let flush = flush_calls(&app).pop().unwrap();
    assert_eq!(
        flush.session_id.as_deref(),
        Some(old),
        "on the old engine session"
    );
    let folder = PathBuf::from(flush.workspace.clone().expect("a workspace"));
    std::fs::write(folder.join("memory.md"), "- works nights at the depot\n").unwrap();
    app.runner.set_hold(false);
    app.runner.release.notify_one();
    app.wait_for_sms(2, WAIT).await;

    app.send_sms(PERSON, "when do I start?").await;
    app.wait_for_sms(3, WAIT).await;
    app.settle().await;

    let calls = app.runner.calls();
    assert_eq!(calls.len(), 3, "the message, one flush, the next message");
    assert!(is_flush(&calls[1]), "{}", calls[1].prompt);
    let next = &calls[2];
    assert_eq!(
        next.session_id, None,
        "the next message starts a fresh engine session"
    );
    assert!(
        next.prompt.contains("- works nights at the depot"),
        "what the agent wrote during the flush is in the next prompt: {}",
        next.prompt
    );

    // Nothing of the flush reached the person: the first answer, the reset notice, the answer.
    let sent = bodies(&app);
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(sent.iter().all(|b| !b.contains(FLUSH_ANSWER)), "{sent:?}");
    assert_eq!(sent[2], "echo: when do I start?");

    // It is logged, marked, and the journal says what it did.
    let logged: Vec<(uuid::Uuid, Option<String>)> = sqlx::query_as(
        "SELECT id, metadata->>'kind' FROM switchboard.messages
          WHERE direction = 'outbound' AND message = $1",
    )
    .bind(FLUSH_ANSWER)
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(logged.len(), 1, "the flush's answer is logged once");
    assert_eq!(logged[0].1.as_deref(), Some("memory_flush"));
    let entries = flush_entries(&app).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["outcome"], "flushed");
    assert_eq!(entries[0]["memory_changed"], true);
    assert_eq!(entries[0]["reset"], "command");
    assert_eq!(entries[0]["engine_session_id"], old);
    assert_eq!(entries[0]["message_id"], logged[0].0.to_string());
    assert_eq!(resets(&app).await, 1, "then the reset happened");
    app.shutdown().await;
}

#[tokio::test]
async fn an_agent_with_memory_flush_off_is_not_asked_before_a_reset() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root;
        for agent in &mut c.agents {
            agent.memory_flush = false;
        }
    })
    .await;
    app.send_sms(PERSON, "hello").await;
    app.wait_for_sms(1, WAIT).await;
    app.send_sms(PERSON, "/new what now?").await;
    app.wait_for_sms(2, WAIT).await;
    app.settle().await;

    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls.iter().all(|c| !is_flush(c)));
    assert_eq!(calls[1].session_id, None, "the reset still happened");
    assert!(flush_entries(&app).await.is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn a_flush_that_fails_still_lets_the_reset_and_the_turn_happen_and_the_journal_says_why() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| c.workspace.root = root).await;
    app.send_sms(PERSON, "hello").await;
    app.wait_for_sms(1, WAIT).await;

    // The flush is the next call; the engine fails it.
    app.runner.fail_next(1, 500);
    app.send_sms(PERSON, "/new what now?").await;
    let sent = app.wait_for_sms(2, WAIT).await;
    app.settle().await;
    assert!(
        sent[1].body.ends_with("echo: what now?"),
        "the turn was answered: {:?}",
        sent[1].body
    );

    let calls = app.runner.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(is_flush(&calls[1]));
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));
    assert!(!is_flush(&calls[2]));
    assert_eq!(calls[2].session_id, None, "the turn ran on a fresh session");
    let entries = flush_entries(&app).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["outcome"], "failed");
    assert_eq!(entries[0]["reset_goes_on"], true);
    let error = entries[0]["error"].as_str().unwrap();
    assert!(error.contains("500"), "{error}");
    assert_eq!(resets(&app).await, 1);
    assert_eq!(app.twilio.sent().len(), 2);
    app.shutdown().await;
}

#[tokio::test]
async fn a_turn_redelivered_after_its_flush_does_not_flush_again() {
    let root = workspace_root();
    let app = spawn_app_with(
        AppOptions::dispatch_as_processes().configured(move |c| c.workspace.root = root),
    )
    .await;
    app.runner.answer_when(FLUSH_INSTRUCTION, FLUSH_ANSWER);
    // This dispatcher dies right after the flush is recorded, before the turn is answered.
    let mut dying = app.spawn_worker_with_env(
        "dispatch",
        &[(
            switchboard_kit::failpoint::ENV,
            "dispatch.flush_recorded".into(),
        )],
    );
    app.send_sms(PERSON, "hello").await;
    app.wait_for_sms(1, WAIT).await;
    app.send_sms(PERSON, "/new what now?").await;
    let died = tokio::time::timeout(Duration::from_secs(30), dying.wait())
        .await
        .expect("the dispatcher died at the failpoint")
        .expect("its exit status");
    assert!(!died.success(), "killed, not stopped: {died}");
    assert_eq!(flush_entries(&app).await.len(), 1, "the flush was recorded");

    // Another dispatcher takes the turn again: it goes on with the reset, without a second
    // flush.
    let mut next = app.spawn_worker("dispatch");
    let sent = app.wait_for_sms(2, Duration::from_secs(40)).await;
    app.settle().await;
    assert!(
        sent[1].body.ends_with("echo: what now?"),
        "{:?}",
        sent[1].body
    );
    assert_eq!(flush_calls(&app).len(), 1, "{:?}", app.runner.calls());
    assert_eq!(flush_entries(&app).await.len(), 1);
    let logged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.messages WHERE metadata->>'kind' = 'memory_flush'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(logged, 1);
    assert!(bodies(&app).iter().all(|b| !b.contains(FLUSH_ANSWER)));
    next.kill().await.ok();
    app.shutdown().await;
}

#[tokio::test]
async fn an_operators_reset_flushes_when_it_is_applied_and_that_turn_reads_what_was_kept() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| c.workspace.root = root).await;
    app.send_sms(PERSON, "my manager is Priya").await;
    app.wait_for_sms(1, WAIT).await;
    let session: uuid::Uuid = sqlx::query_scalar("SELECT id FROM switchboard.sessions LIMIT 1")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let ops = app.api_key("ops", &["sessions:write"]).await;
    let r = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/sessions/{session}/reset",
            app.gateway_url
        ))
        .bearer_auth(ops)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);

    // The reset is applied by the person's next message: first the flush, on the old engine
    // session, then the message on a fresh one whose prompt carries what the flush kept.
    app.runner.set_hold(true);
    app.send_sms(PERSON, "who do I report to?").await;
    until("the flush call", || !flush_calls(&app).is_empty()).await;
    let flush = flush_calls(&app).pop().unwrap();
    assert_eq!(flush.session_id.as_deref(), Some("eng-1"));
    let folder = PathBuf::from(flush.workspace.clone().expect("a workspace"));
    std::fs::write(folder.join("memory.md"), "- manager: Priya\n").unwrap();
    app.runner.set_hold(false);
    app.runner.release.notify_one();
    let sent = app.wait_for_sms(2, WAIT).await;
    app.settle().await;

    let calls = app.runner.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    let turn = &calls[2];
    assert_eq!(turn.session_id, None, "the operator's reset happened");
    assert!(turn.prompt.contains("- manager: Priya"), "{}", turn.prompt);
    assert!(
        sent[1].body.ends_with("echo: who do I report to?"),
        "{:?}",
        sent[1].body
    );
    assert_eq!(app.twilio.sent().len(), 2, "nothing more was sent");
    let entries = flush_entries(&app).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["reset"], "api");
    assert_eq!(entries[0]["memory_changed"], true);
    app.shutdown().await;
}

#[tokio::test]
async fn an_idle_reset_is_flushed_first_too() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root;
        c.agents[0].idle_reset_s = 3_600;
    })
    .await;
    app.send_sms(PERSON, "hello").await;
    app.wait_for_sms(1, WAIT).await;
    // Two hours of quiet.
    sqlx::query(
        "UPDATE switchboard.sessions SET last_message_at = last_message_at - interval '2 hours'",
    )
    .execute(&app.db)
    .await
    .unwrap();
    app.send_sms(PERSON, "back again").await;
    app.wait_for_sms(2, WAIT).await;
    app.settle().await;

    let calls = app.runner.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(is_flush(&calls[1]) && calls[1].session_id.as_deref() == Some("eng-1"));
    assert_eq!(calls[2].session_id, None);
    let entries = flush_entries(&app).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["reset"], "idle");
    assert_eq!(entries[0]["outcome"], "flushed");
    app.shutdown().await;
}

#[tokio::test]
async fn a_reset_whose_turn_failed_after_its_flush_is_not_flushed_again_by_the_next_turn() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root;
        c.runtime.max_deliver = 1;
    })
    .await;
    app.runner.answer_when(FLUSH_INSTRUCTION, FLUSH_ANSWER);
    app.send_sms(PERSON, "hello").await;
    app.wait_for_sms(1, WAIT).await;

    // The flush answers; the turn's own call is then rejected for good.
    app.runner.set_hold(true);
    app.send_sms(PERSON, "/new lost one").await;
    until("the flush call", || !flush_calls(&app).is_empty()).await;
    app.runner.fail_next(1, 400);
    app.runner.set_hold(false);
    app.runner.release.notify_one();
    app.wait_for_dead_letters("dispatch", WAIT).await;

    // The reset waits for the next message, which applies it without asking the old engine
    // session a second time.
    app.send_sms(PERSON, "second try").await;
    let sent = app.wait_for_sms(2, WAIT).await;
    app.settle().await;
    assert!(
        sent[1].body.ends_with("echo: second try"),
        "{:?}",
        sent[1].body
    );
    let calls = app.runner.calls();
    assert_eq!(
        calls.len(),
        4,
        "hello, the flush, the failed turn, the next: {calls:?}"
    );
    assert_eq!(calls[3].session_id, None, "the reset was applied");
    assert_eq!(flush_calls(&app).len(), 1);
    assert_eq!(flush_entries(&app).await.len(), 1);
    app.shutdown().await;
}
