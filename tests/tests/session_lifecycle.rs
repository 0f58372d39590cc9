//! A conversation belongs to the person + agent identity: it survives a switch of engine
//! variant, and it starts over (fresh engine session, summary kept) when the person asks, when
//! it idled, once a day, or when an operator resets it; never silently.
//!
//! Time is moved by writing the session's last-message time back, not by sleeping: the rules
//! compare each message's received time with it.
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_e2e::{TestApp, spawn_app, spawn_app_configured};
use switchboard_kit::proto::SessionReset;
use uuid::Uuid;

const PERSON: &str = "+14155550171";
const WAIT: Duration = Duration::from_secs(20);

/// An API caller's message to `agent`, waiting for the reply; the reply's text.
async fn ask(app: &TestApp, key: &str, agent: &str, text: &str) -> String {
    let response = app
        .post_api_message(
            key,
            json!({"agent": agent, "text": text, "wait": true}),
            None,
        )
        .await;
    assert_eq!(response.status(), 200, "the reply came back in time");
    let body: Value = response.json().await.unwrap();
    body["replies"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("a reply text in {body}"))
        .to_string()
}

async fn texted(app: &TestApp, text: &str, replies: usize) -> String {
    app.send_sms(PERSON, text).await;
    let sent = app.wait_for_sms(replies, WAIT).await;
    sent[replies - 1].body.clone()
}

async fn session_of(app: &TestApp, agent: &str) -> (Uuid, String) {
    sqlx::query_as("SELECT id, memory_key FROM switchboard.sessions WHERE agent_name = $1")
        .bind(agent)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

async fn journal(app: &TestApp, session: Uuid) -> Vec<(String, Option<i64>, Value)> {
    sqlx::query_as(
        "SELECT kind, seq, detail FROM switchboard.session_events
          WHERE session_id = $1 ORDER BY id",
    )
    .bind(session)
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// The session's last message, moved back by `by`.
async fn time_passes(app: &TestApp, session: Uuid, by: Duration) {
    sqlx::query(
        "UPDATE switchboard.sessions
            SET last_message_at = last_message_at - $2 * interval '1 second' WHERE id = $1",
    )
    .bind(session)
    .bind(by.as_secs() as f64)
    .execute(&app.db)
    .await
    .unwrap();
}

/// The last `session.reset` event published.
async fn last_reset_event(app: &TestApp) -> SessionReset {
    let raw = app
        .js
        .get_stream(app.topology.events_stream())
        .await
        .unwrap()
        .get_last_raw_message_by_subject(&app.topology.event("session.reset"))
        .await
        .expect("a session.reset event");
    prost::Message::decode(raw.payload.as_ref()).expect("a SessionReset")
}

async fn no_reset_event(app: &TestApp) -> bool {
    app.js
        .get_stream(app.topology.events_stream())
        .await
        .unwrap()
        .get_last_raw_message_by_subject(&app.topology.event("session.reset"))
        .await
        .is_err()
}

#[tokio::test]
async fn switching_engine_variants_carries_the_identitys_summary_into_the_new_engine_session() {
    let app = spawn_app().await;
    let key = app.api_key("ana", &[]).await;
    assert_eq!(
        ask(&app, &key, "reggie_oc", "my order is late").await,
        "echo: my order is late"
    );
    let (oc, memory_key) = session_of(&app, "reggie_oc").await;
    // The summary worker's output, written directly.
    sqlx::query(
        "INSERT INTO switchboard.summaries (memory_key, agent_identity, person_id, summary, updated_at)
         VALUES ($1, 'reggie', 'api:ana', 'Ana is waiting on order 1234, promised for Friday.', now() - interval '10 minutes')",
    )
    .bind(&memory_key)
    .execute(&app.db)
    .await
    .unwrap();

    ask(&app, &key, "reggie_fd", "any news?").await;
    let calls = app.runner.calls();
    let fd = &calls[1];
    assert_eq!(fd.agent, "reggie_fd");
    // A new engine session for the new variant...
    assert_eq!(
        fd.session_id, None,
        "reggie_fd must not resume reggie_oc's engine session"
    );
    // ...that knows what the identity knew.
    assert!(
        fd.prompt
            .contains("Ana is waiting on order 1234, promised for Friday."),
        "{}",
        fd.prompt
    );
    let (fd_session, fd_memory) = session_of(&app, "reggie_fd").await;
    assert_ne!(fd_session, oc, "each variant has its own session");
    assert_eq!(
        fd_memory, memory_key,
        "both variants share the identity's memory"
    );
    // Back on reggie_oc: its own engine session resumes, with the same summary.
    ask(&app, &key, "reggie_oc", "thanks").await;
    let back = &app.runner.calls()[2];
    assert_eq!(back.session_id.as_deref(), Some("eng-1"));
    assert!(back.prompt.contains("promised for Friday"));
    app.shutdown().await;
}

#[tokio::test]
async fn a_person_sending_reset_gets_a_fresh_engine_session_and_is_told() {
    let app = spawn_app().await;
    assert_eq!(texted(&app, "hello", 1).await, "echo: hello");
    let (session, _) = session_of(&app, "reggie_oc").await;

    // `/reset` alone: answered by Switchboard, the agent is not bothered.
    assert_eq!(texted(&app, "/reset", 2).await, "New conversation started.");
    assert_eq!(app.runner.calls().len(), 1);
    let event = last_reset_event(&app).await;
    assert_eq!(
        (event.session_id.as_str(), event.reason.as_str(), event.seq),
        (session.to_string().as_str(), "command", 2)
    );

    // The next message starts a new engine session.
    assert_eq!(texted(&app, "who are you?", 3).await, "echo: who are you?");
    let calls = app.runner.calls();
    assert_eq!(calls[0].session_id, None);
    assert_eq!(
        calls[1].session_id, None,
        "the engine session was not reset"
    );

    // `/new` with a question: reset and answered in one turn, the command not sent along.
    let reply = texted(&app, "/NEW what's the plan?", 4).await;
    assert_eq!(reply, "New conversation started.\n\necho: what's the plan?");
    let calls = app.runner.calls();
    assert_eq!(calls[2].session_id, None);
    assert!(
        calls[2]
            .prompt
            .contains("a fresh engine session (reset: command)")
    );

    let entries = journal(&app, session).await;
    let resets: Vec<_> = entries
        .iter()
        .filter(|(kind, ..)| kind == "reset")
        .map(|(_, seq, detail)| (*seq, detail["reason"].clone()))
        .collect();
    assert_eq!(
        resets,
        [(Some(2), json!("command")), (Some(4), json!("command"))]
    );
    let previous: Vec<_> = entries
        .iter()
        .filter(|(kind, ..)| kind == "reset")
        .map(|(_, _, d)| d["previous_engine_session_id"].clone())
        .collect();
    assert_eq!(previous, [json!("eng-1"), json!("eng-2")]);
    app.shutdown().await;
}

#[tokio::test]
async fn a_session_idle_longer_than_the_agents_gap_starts_over_and_says_so() {
    let app = spawn_app_configured(|c| c.agents[0].idle_reset_s = 3_600).await;
    texted(&app, "first", 1).await;
    let (session, _) = session_of(&app, "reggie_oc").await;
    // Fifty minutes later: same engine session, nothing said.
    time_passes(&app, session, Duration::from_secs(50 * 60)).await;
    assert_eq!(texted(&app, "second", 2).await, "echo: second");
    assert_eq!(app.runner.calls()[1].session_id.as_deref(), Some("eng-1"));
    assert!(no_reset_event(&app).await);
    // Two hours later: a fresh engine session, and the reply says why.
    time_passes(&app, session, Duration::from_secs(2 * 3_600)).await;
    let reply = texted(&app, "third", 3).await;
    assert!(
        reply.starts_with("(We're starting a new conversation: the last one had been quiet")
            && reply.ends_with("echo: third"),
        "{reply}"
    );
    assert_eq!(app.runner.calls()[2].session_id, None);
    assert_eq!(last_reset_event(&app).await.reason, "idle");
    app.shutdown().await;
}

#[tokio::test]
async fn the_daily_reset_fires_once_its_hour_passed_in_the_agents_time_zone() {
    // The hour is chosen so that "now" is a few hours past it in Sydney.
    let zone: chrono_tz::Tz = "Australia/Sydney".parse().unwrap();
    let local = chrono::Utc::now().with_timezone(&zone) - chrono::Duration::hours(3);
    let daily = local.format("%H:%M").to_string();
    let app = spawn_app_configured(move |c| {
        c.agents[0].daily_reset = daily;
        c.agents[0].time_zone = "Australia/Sydney".into();
    })
    .await;
    texted(&app, "morning", 1).await;
    let (session, _) = session_of(&app, "reggie_oc").await;
    // Two hours "ago" is after today's reset time: no reset.
    time_passes(&app, session, Duration::from_secs(2 * 3_600)).await;
    assert_eq!(texted(&app, "still there?", 2).await, "echo: still there?");
    assert!(no_reset_event(&app).await);
    // Four hours "ago" is before it: the next message starts the day fresh.
    time_passes(&app, session, Duration::from_secs(4 * 3_600)).await;
    let reply = texted(&app, "new day", 3).await;
    assert!(
        reply.starts_with(
            "(We're starting a new conversation: conversations start fresh each day.)"
        ),
        "{reply}"
    );
    assert_eq!(app.runner.calls()[2].session_id, None);
    assert_eq!(last_reset_event(&app).await.reason, "daily");
    app.shutdown().await;
}

#[tokio::test]
async fn resets_switched_off_for_an_agent_do_not_happen() {
    let app = spawn_app_configured(|c| c.agents[0].reset_commands = false).await;
    texted(&app, "hello", 1).await;
    let (session, _) = session_of(&app, "reggie_oc").await;
    time_passes(&app, session, Duration::from_secs(30 * 24 * 3_600)).await;
    // No idle or daily reset configured, commands off: /reset is just text for the agent.
    assert_eq!(texted(&app, "/reset", 2).await, "echo: /reset");
    assert_eq!(app.runner.calls()[1].session_id.as_deref(), Some("eng-1"));
    assert!(no_reset_event(&app).await);
    app.shutdown().await;
}

#[tokio::test]
async fn an_operators_reset_applies_to_the_next_turn_and_is_told_once() {
    let app = spawn_app().await;
    texted(&app, "hello", 1).await;
    let (session, _) = session_of(&app, "reggie_oc").await;
    // What `POST /api/v1/sessions/<id>/reset` leaves behind.
    sqlx::query(
        "UPDATE switchboard.sessions SET pending_reset = 'api', pending_reset_at = now() WHERE id = $1",
    )
    .bind(session)
    .execute(&app.db)
    .await
    .unwrap();
    let reply = texted(&app, "are you there?", 2).await;
    assert_eq!(
        reply,
        "(We're starting a new conversation: this one was reset by an operator.)\n\necho: are you there?"
    );
    assert_eq!(app.runner.calls()[1].session_id, None);
    // Applied once: the turn after goes on in the new engine session, nothing said.
    assert_eq!(texted(&app, "good", 3).await, "echo: good");
    assert_eq!(app.runner.calls()[2].session_id.as_deref(), Some("eng-2"));
    let pending: Option<String> =
        sqlx::query_scalar("SELECT pending_reset FROM switchboard.sessions WHERE id = $1")
            .bind(session)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(pending, None);
    app.shutdown().await;
}

#[tokio::test]
async fn a_reset_whose_turn_failed_is_still_applied_and_told_on_the_next_one() {
    let app = spawn_app_configured(|c| c.agents[0].idle_reset_s = 60).await;
    texted(&app, "hello", 1).await;
    let (session, _) = session_of(&app, "reggie_oc").await;
    time_passes(&app, session, Duration::from_secs(3_600)).await;
    // The agent host rejects the turn that would reset (a permanent failure).
    app.runner.fail_next(1, 400);
    app.send_sms(PERSON, "lost one").await;
    app.wait_for_dead_letters("dispatch", WAIT).await;
    let reply = texted(&app, "second try", 2).await;
    assert!(
        reply.starts_with("(We're starting a new conversation"),
        "{reply}"
    );
    assert_eq!(app.runner.calls().last().unwrap().session_id, None);
    let kinds: Vec<String> = journal(&app, session)
        .await
        .into_iter()
        .map(|(kind, ..)| kind)
        .collect();
    assert!(kinds.contains(&"failure".to_string()), "{kinds:?}");
    app.shutdown().await;
}

#[tokio::test]
async fn the_journal_tells_a_sessions_story_in_order() {
    let app = spawn_app().await;
    texted(&app, "one", 1).await;
    texted(&app, "two", 2).await;
    app.settle().await;
    let (session, _) = session_of(&app, "reggie_oc").await;
    let story: Vec<(String, Option<i64>)> = journal(&app, session)
        .await
        .into_iter()
        .map(|(kind, seq, _)| (kind, seq))
        .collect();
    let expected = [
        ("message_in", 1),
        ("turn_started", 1),
        ("recall", 1),
        ("reply", 1),
        ("message_in", 2),
        ("turn_started", 2),
        ("recall", 2),
        ("reply", 2),
    ];
    assert_eq!(
        story,
        expected
            .iter()
            .map(|(k, s)| (k.to_string(), Some(*s)))
            .collect::<Vec<_>>()
    );
    // The session is idle between turns.
    let status: String =
        sqlx::query_scalar("SELECT status FROM switchboard.sessions WHERE id = $1")
            .bind(session)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(status, "idle");
    app.shutdown().await;
}

#[tokio::test]
async fn each_session_has_a_workspace_shared_by_the_identitys_variants_and_sent_to_the_runner() {
    let root = std::env::temp_dir().join(format!("sb-ws-{}", Uuid::new_v4().simple()));
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_configured(move |c| c.workspace.root = root_text).await;
    let key = app.api_key("ana", &[]).await;
    ask(&app, &key, "reggie_oc", "hi").await;
    let (oc, memory_key) = session_of(&app, "reggie_oc").await;
    let folder = root.join(oc.to_string());
    for part in ["attachments", "exports", "context"] {
        assert!(folder.join(part).is_dir(), "{part}/ in {folder:?}");
    }
    assert_eq!(
        app.runner.calls()[0].workspace.as_deref(),
        Some(folder.to_str().unwrap())
    );
    sqlx::query(
        "INSERT INTO switchboard.summaries (memory_key, agent_identity, person_id, summary)
         VALUES ($1, 'reggie', 'api:ana', 'Ana likes short answers.')",
    )
    .bind(&memory_key)
    .execute(&app.db)
    .await
    .unwrap();
    // The other variant works in the same folder, where the summary now is.
    ask(&app, &key, "reggie_fd", "hello again").await;
    assert_eq!(
        app.runner.calls()[1].workspace.as_deref(),
        Some(folder.to_str().unwrap())
    );
    assert_eq!(
        std::fs::read_to_string(folder.join("summary.md")).unwrap(),
        "Ana likes short answers."
    );
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}
