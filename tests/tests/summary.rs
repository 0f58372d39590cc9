//! The summary worker: once a person + agent identity has gone quiet, what they said on every
//! channel and to every engine variant is merged, in order, into the summary every sibling
//! session reads; two replicas never summarise the same messages twice; a model that fails
//! never costs the old summary or the messages; with no model, an honest extractive summary.
//!
//! Time is moved by writing the messages' log time back (the quiet gap is an hour), not by
//! sleeping; the sweeper looks every second.
use std::time::{Duration, Instant};

use futures::TryStreamExt as _;
use serde_json::{Value, json};
use switchboard_e2e::{AppOptions, ChatClient, FakeAnswer, FakeModel, TestApp, spawn_app_with};
use switchboard_kit::config::{Config, Secret};
use switchboard_kit::memory_config::LlmConfig;
use switchboard_kit::proto::{SessionSummarised, SummaryDue};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(20);
const PHONE: &str = "+14155550161";
const LOGIN: &str = "ana@clinic";

/// Quiet after an hour, swept every second, the model (if any) answering within a second.
fn configure(c: &mut Config, model: Option<&FakeModel>) {
    c.summary.idle_gap_s = 3_600;
    c.summary.sweep_every_s = 1;
    if let Some(model) = model {
        c.llm = LlmConfig {
            base_url: model.url.clone(),
            model: "fake-chat".into(),
            api_key: Secret::new("sk-test"),
            timeout_s: 1,
            max_tokens: 400,
            max_prompt_chars: 8_000,
        };
    }
}

async fn app_with_model(model: Option<&FakeModel>) -> TestApp {
    let model = model.cloned();
    spawn_app_with(without_categorise().configured(move |c| configure(c, model.as_ref()))).await
}

/// Every stage but categorisation, which asks the same chat model to label exchanges: these tests
/// read every chat the model was asked as a summary request.
fn without_categorise() -> AppOptions {
    AppOptions::without(&["categorise"])
}

/// Ana, staff member 17: the directory knows her phone and her chat login.
async fn ana(app: &TestApp) {
    sqlx::query(
        "INSERT INTO switchboard.people (person_id, person_type, name, role)
         VALUES ('17', 'staff', 'Ana', 'nurse')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO switchboard.contact_points (kind, address, person_id)
         VALUES ('phone', $1, '17'), ('chat_user', $2, '17')",
    )
    .bind(PHONE)
    .bind(LOGIN)
    .execute(&app.db)
    .await
    .unwrap();
}

/// An SMS from Ana (to reggie_oc), answered: the `n`th SMS sent.
async fn text(app: &TestApp, body: &str, n: usize) {
    app.send_sms(PHONE, body).await;
    app.wait_for_sms(n, WAIT).await;
}

/// An hour (and a bit) passes since everything logged so far.
async fn time_passes(app: &TestApp) {
    app.settle().await;
    app.log_ages_two_hours(None).await;
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
struct Row {
    summary: String,
    version: i64,
    method: String,
    first_message_in_summary: Option<Uuid>,
    last_message_in_summary: Option<Uuid>,
    messages_covered: i64,
}

async fn summary_row(app: &TestApp, memory_key: &str) -> Option<Row> {
    sqlx::query_as(
        "SELECT summary, version, method, first_message_in_summary, last_message_in_summary,
                messages_covered
           FROM switchboard.summaries WHERE memory_key = $1",
    )
    .bind(memory_key)
    .fetch_optional(&app.db)
    .await
    .unwrap()
}

/// The summary once it has reached `version`.
async fn summary_at(app: &TestApp, memory_key: &str, version: i64) -> Row {
    let deadline = Instant::now() + WAIT;
    loop {
        let row = summary_row(app, memory_key).await;
        if let Some(row) = row.as_ref().filter(|r| r.version >= version) {
            return row.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no summary version {version} within {WAIT:?}: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The summary once it covers the message `last`.
async fn summary_covering(app: &TestApp, memory_key: &str, last: Uuid) -> Row {
    let deadline = Instant::now() + WAIT;
    loop {
        let row = summary_row(app, memory_key).await;
        if let Some(row) = row
            .as_ref()
            .filter(|r| r.last_message_in_summary == Some(last))
        {
            return row.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no summary up to {last} within {WAIT:?}: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn memory_key(app: &TestApp) -> String {
    sqlx::query_scalar(
        "SELECT DISTINCT memory_key FROM switchboard.sessions WHERE person_id = '17'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// Ana's logged messages, oldest first: (id, text).
async fn logged(app: &TestApp) -> Vec<(Uuid, String)> {
    sqlx::query_as(
        "SELECT id, message FROM switchboard.messages WHERE person_id = '17' ORDER BY id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// The `summarised` entries of a session's journal.
async fn summarised_entries(app: &TestApp, session: Uuid) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT detail FROM switchboard.session_events
          WHERE session_id = $1 AND kind = 'summarised' ORDER BY id",
    )
    .bind(session)
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// `session.summarised` events published so far.
async fn summarised_events(app: &TestApp) -> Vec<SessionSummarised> {
    let stream = app
        .js
        .get_stream(app.topology.events_stream())
        .await
        .unwrap();
    let subject = app.topology.event("session.summarised");
    let mut n = 0;
    let mut subjects = stream.info_with_subjects(&subject).await.unwrap();
    while let Some((_, count)) = subjects.try_next().await.unwrap() {
        n += count;
    }
    if n == 0 {
        return Vec::new();
    }
    // The last one is enough to check its content; the count says how many.
    let raw = stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .unwrap();
    let last: SessionSummarised = prost::Message::decode(raw.payload.as_ref()).unwrap();
    let mut all = vec![SessionSummarised::default(); n - 1];
    all.push(last);
    all
}

async fn sessions_of_ana(app: &TestApp) -> Vec<(Uuid, String)> {
    sqlx::query_as(
        "SELECT id, agent_name FROM switchboard.sessions WHERE person_id = '17' ORDER BY agent_name",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

async fn session_json(app: &TestApp, key: &str, session: Uuid) -> Value {
    let response = reqwest::Client::new()
        .get(format!("{}/api/v1/sessions/{session}", app.gateway_url))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

#[tokio::test]
async fn a_quiet_persons_sms_and_chat_with_both_engines_are_merged_in_order_into_the_summary_both_sessions_and_the_next_prompt_carry()
 {
    let model = FakeModel::start(8).await;
    let app = app_with_model(Some(&model)).await;
    ana(&app).await;
    text(&app, "My Friday shift at Elm Street needs cover.", 1).await;
    let mut chat = ChatClient::as_user(&app.gateway_url, LOGIN).await;
    chat.send_frame(
        json!({"type": "message", "id": "c-1", "agent": "reggie_fd", "text": "Maria said she can cover Friday."}),
    )
    .await;
    chat.reply(WAIT).await;
    app.settle().await;
    let key = memory_key(&app).await;
    let sessions = sessions_of_ana(&app).await;
    assert_eq!(sessions.len(), 2, "one session per engine variant");

    // Switching to the other engine variant asks for a summary at once (long before the
    // conversation is an hour quiet).
    summary_at(&app, &key, 1).await;

    // An hour later, whatever was not summarised yet is merged in: all of it, in order.
    time_passes(&app).await;
    let messages = logged(&app).await;
    let texts: Vec<&str> = messages.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        texts,
        [
            "My Friday shift at Elm Street needs cover.",
            "echo: My Friday shift at Elm Street needs cover.",
            "Maria said she can cover Friday.",
            "echo: Maria said she can cover Friday."
        ]
    );
    let row = summary_covering(&app, &key, messages[3].0).await;
    assert_eq!(
        (
            row.method.as_str(),
            row.messages_covered,
            row.first_message_in_summary
        ),
        ("model", 4, Some(messages[0].0))
    );
    // The model was given each message once, in the order they were said, with its channel.
    // (Each prompt's new messages come after its previous summary, which the fake repeats.)
    let prompts: String = new_messages(&model).concat();
    let sms = prompts
        .find("sms via reggie_oc] person: My Friday shift")
        .unwrap();
    let chat_in = prompts
        .find("admin_chat via reggie_fd] person: Maria said")
        .unwrap();
    assert!(sms < chat_in, "{prompts}");
    for t in texts {
        assert_eq!(
            prompts.matches(&format!("] person: {t}\n")).count()
                + prompts.matches(&format!("] assistant: {t}\n")).count(),
            1,
            "{t:?} sent to the model once, as a new message: {prompts}"
        );
    }

    // Both sibling sessions show it, with what it covers, and their journals say so.
    let reader = app.api_key("ops", &["sessions:read"]).await;
    for (session, agent) in &sessions {
        let shown = session_json(&app, &reader, *session).await;
        let s = &shown["summary"];
        assert_eq!(s["text"], row.summary.as_str(), "{agent}");
        assert_eq!(s["version"], row.version, "{agent}");
        assert_eq!(s["method"], "model");
        assert_eq!(s["messages_covered"], 4);
        assert_eq!(s["first_message_id"], messages[0].0.to_string());
        assert_eq!(s["last_message_id"], messages[3].0.to_string());
        assert!(s["written_at"].is_string());
        let versions: Vec<i64> = summarised_entries(&app, *session)
            .await
            .iter()
            .map(|d| d["version"].as_i64().unwrap())
            .collect();
        // One entry per version written.
        assert_eq!(versions, (1..=row.version).collect::<Vec<_>>(), "{agent}");
    }
    let events = summarised_events(&app).await;
    assert_eq!(events.len() as i64, row.version);
    let last = events.last().unwrap();
    assert_eq!(
        (last.version, last.messages_covered, last.method.as_str()),
        (row.version, 4, "model")
    );
    assert_eq!(last.last_message_id, messages[3].0.to_string());

    // The next turn's prompt carries it.
    text(&app, "Thanks!", 2).await;
    let calls = app.runner.calls();
    let prompt = &calls.last().unwrap().prompt;
    assert!(
        prompt.contains("Maria said she can cover Friday.") && prompt.contains("MODEL SUMMARY:"),
        "{prompt}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn two_summary_replicas_summarise_each_batch_of_messages_once() {
    let model = FakeModel::start(8).await;
    // Slow enough that the replicas' runs overlap.
    model.answer_with(|c| {
        std::thread::sleep(Duration::from_millis(300));
        FakeAnswer::Text(format!("MODEL SUMMARY:\n{}", c.user))
    });
    let m = model.clone();
    let app = spawn_app_with(
        AppOptions::without(&["summary", "categorise"]).configured(move |c| configure(c, Some(&m))),
    )
    .await;
    app.start_stage("summary");
    app.start_stage("summary");
    ana(&app).await;
    text(&app, "Can I swap my Sunday shift?", 1).await;
    text(&app, "Ben would take it.", 2).await;
    time_passes(&app).await;
    let key = memory_key(&app).await;
    // As many items as publishers past the dedupe window, resets and switches would make.
    let due = SummaryDue {
        memory_key: key.clone(),
        person_id: "17".into(),
        agent_identity: "reggie".into(),
        reason: "idle".into(),
    };
    let runtime = app.app().runtime();
    for i in 0..8 {
        let out =
            switchboard_kit::Output::new(app.topology.summary_due(), format!("extra-{i}"), &due);
        runtime.publish("test", &out).await.unwrap();
    }
    summary_at(&app, &key, 1).await;
    app.settle().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    app.settle().await;
    let row = summary_row(&app, &key).await.unwrap();
    assert_eq!((row.version, row.messages_covered), (1, 4), "{row:?}");
    let (session, _) = sessions_of_ana(&app).await[0];
    assert_eq!(summarised_entries(&app, session).await.len(), 1);
    assert_eq!(summarised_events(&app).await.len(), 1);

    // The next batch: once more, once.
    text(&app, "Ben confirmed.", 3).await;
    time_passes(&app).await;
    for i in 0..8 {
        let out =
            switchboard_kit::Output::new(app.topology.summary_due(), format!("more-{i}"), &due);
        runtime.publish("test", &out).await.unwrap();
    }
    summary_at(&app, &key, 2).await;
    app.settle().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    app.settle().await;
    let row = summary_row(&app, &key).await.unwrap();
    assert_eq!((row.version, row.messages_covered), (2, 6), "{row:?}");
    assert_eq!(summarised_entries(&app, session).await.len(), 2);
    assert_eq!(summarised_events(&app).await.len(), 2);
    app.shutdown().await;
}

/// Wait until the fake model has been asked `n` times in all.
async fn asked(model: &FakeModel, n: usize) {
    let deadline = Instant::now() + WAIT;
    while model.chats().len() < n {
        assert!(
            Instant::now() < deadline,
            "the model was asked {} times within {WAIT:?}, not {n}",
            model.chats().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_failing_slow_garbled_or_overlong_model_leaves_the_old_summary_and_the_messages_for_a_later_run()
 {
    let model = FakeModel::start(8).await;
    model.answer_with(|_| FakeAnswer::Text("Ana wants Sunday off.".into()));
    let app = app_with_model(Some(&model)).await;
    ana(&app).await;
    text(&app, "Can I have Sunday off?", 1).await;
    time_passes(&app).await;
    let key = memory_key(&app).await;
    let before = summary_at(&app, &key, 1).await;
    assert_eq!(before.summary, "Ana wants Sunday off.");

    text(&app, "Also Monday please.", 2).await;
    let bad: [(&str, FakeAnswer); 5] = [
        ("HTTP 500", FakeAnswer::Status(500)),
        ("a timeout", FakeAnswer::Hang(Duration::from_secs(3))),
        ("garbage", FakeAnswer::Garbage),
        ("cut off", FakeAnswer::CutOff("Ana wants Sunday and".into())),
        // Over the summary's cap ([summary] max_summary_chars).
        ("too long", FakeAnswer::Text("x".repeat(4_001))),
    ];
    model.answer_with(|_| FakeAnswer::Status(500));
    time_passes(&app).await;
    for (what, answer) in bad {
        model.answer_with(move |_| answer.clone());
        // Tried, and tried again: the item was not given up.
        let n = model.chats().len();
        asked(&model, n + 2).await;
        let now = summary_row(&app, &key).await.unwrap();
        assert_eq!(
            now, before,
            "after {what}, the summary and what it covers stay"
        );
    }
    assert!(app.dead_letters("summary").await.is_empty());

    // The model is back: the waiting messages are summarised.
    model.answer_with(|_| FakeAnswer::Text("Ana wants Sunday and Monday off.".into()));
    let after = summary_at(&app, &key, 2).await;
    let messages = logged(&app).await;
    assert_eq!(after.summary, "Ana wants Sunday and Monday off.");
    assert_eq!(after.messages_covered, 4);
    assert_eq!(after.first_message_in_summary, Some(messages[0].0));
    assert_eq!(after.last_message_in_summary, Some(messages[3].0));
    app.shutdown().await;
}

#[tokio::test]
async fn with_no_model_the_summary_is_extractive_and_says_so() {
    let app = app_with_model(None).await;
    ana(&app).await;
    text(&app, "My Friday shift at Elm Street needs cover.", 1).await;
    text(&app, "Maria can cover the Friday shift at Elm Street.", 2).await;
    time_passes(&app).await;
    let key = memory_key(&app).await;
    let row = summary_at(&app, &key, 1).await;
    let lines: Vec<&str> = row.summary.lines().collect();
    assert_eq!(
        lines[0], "Extractive summary (no model configured): 4 sentences chosen from 4 messages.",
        "{}",
        row.summary
    );
    // Sentences as they were said, in order.
    assert_eq!(
        &lines[1..],
        [
            "My Friday shift at Elm Street needs cover.",
            "echo: My Friday shift at Elm Street needs cover.",
            "Maria can cover the Friday shift at Elm Street.",
            "echo: Maria can cover the Friday shift at Elm Street."
        ]
    );
    assert_eq!(
        (row.method.as_str(), row.messages_covered),
        ("extractive", 4)
    );
    let reader = app.api_key("ops", &["sessions:read"]).await;
    let (session, _) = sessions_of_ana(&app).await[0];
    let shown = session_json(&app, &reader, session).await;
    assert_eq!(shown["summary"]["method"], "extractive");
    app.shutdown().await;
}

#[tokio::test]
async fn a_reset_first_summarises_what_the_old_engine_session_heard() {
    let model = FakeModel::start(8).await;
    model.answer_with(|_| FakeAnswer::Text("Ana asked about her Friday shift.".into()));
    let app = app_with_model(Some(&model)).await;
    ana(&app).await;
    text(&app, "When is my Friday shift?", 1).await;
    // No hour has passed: only the reset asks for the summary.
    text(&app, "/reset", 2).await;
    let key = memory_key(&app).await;
    let row = summary_at(&app, &key, 1).await;
    assert_eq!(row.summary, "Ana asked about her Friday shift.");
    let messages = logged(&app).await;
    assert_eq!(row.first_message_in_summary, Some(messages[0].0));
    let user = &model.chats()[0].user;
    assert!(user.contains("person: When is my Friday shift?"), "{user}");
    app.shutdown().await;
}

#[tokio::test]
async fn a_model_down_longer_than_the_stages_maximum_wait_dead_letters_the_item_with_the_reason() {
    let model = FakeModel::start(8).await;
    model.answer_with(|_| FakeAnswer::Status(500));
    let m = model.clone();
    let app = spawn_app_with(without_categorise().configured(move |c| {
        configure(c, Some(&m));
        c.stages.insert(
            "summary".into(),
            switchboard_kit::stage::StageOverrides {
                max_wait_ms: Some(2_000),
                ..Default::default()
            },
        );
    }))
    .await;
    ana(&app).await;
    text(&app, "Can I have Sunday off?", 1).await;
    time_passes(&app).await;
    let letters = app.wait_for_dead_letters("summary", WAIT).await;
    assert!(
        letters[0].error.contains("HTTP 500"),
        "the dead letter says why: {}",
        letters[0].error
    );
    // Nothing was written in its place.
    assert_eq!(summary_row(&app, &memory_key(&app).await).await, None);
    app.shutdown().await;
}

/// A message id minted at the gateway 1 ms after `of` (UUIDv7: its first 48 bits are the ms).
fn minted_just_after(of: Uuid) -> Uuid {
    let b = of.as_bytes();
    let ms = u64::from_be_bytes([0, 0, b[0], b[1], b[2], b[3], b[4], b[5]]) + 1;
    let mut id = *Uuid::now_v7().as_bytes();
    id[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    Uuid::from_bytes(id)
}

/// What a lagging log stage does: a message of Ana's, minted as `id` long ago, logged now (in
/// the session of the message `beside`).
async fn log_late(app: &TestApp, id: Uuid, beside: Uuid, text: &str) {
    sqlx::query(
        "INSERT INTO switchboard.messages
             (id, session_id, person_id, agent_name, agent_identity, direction, channel, message,
              correlation_id, created_at)
         SELECT $1, session_id, person_id, agent_name, agent_identity, 'inbound', channel, $2,
                'late-' || $1::text, now()
           FROM switchboard.messages WHERE id = $3",
    )
    .bind(id)
    .bind(text)
    .bind(beside)
    .execute(&app.db)
    .await
    .unwrap();
}

/// Which summary version merged each of Ana's messages, oldest id first.
async fn marks(app: &TestApp) -> Vec<(Uuid, Option<i64>)> {
    sqlx::query_as(
        "SELECT message_id, summary_version FROM switchboard.message_marks
          WHERE person_id = '17' ORDER BY message_id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// The new messages of each prompt the model got, in order.
fn new_messages(model: &FakeModel) -> Vec<String> {
    model
        .chats()
        .iter()
        .map(|c| {
            c.user
                .rsplit_once("New messages, oldest first:\n")
                .unwrap()
                .1
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn a_message_logged_after_a_newer_one_was_summarised_is_merged_by_the_next_version_and_nothing_twice()
 {
    let model = FakeModel::start(8).await;
    let app = app_with_model(Some(&model)).await;
    ana(&app).await;
    text(&app, "Can I swap my Sunday shift?", 1).await;
    text(&app, "Ben would take it.", 2).await;
    time_passes(&app).await;
    let key = memory_key(&app).await;
    let said = logged(&app).await;
    let v1 = summary_covering(&app, &key, said[3].0).await;
    assert_eq!((v1.version, v1.messages_covered), (1, 4));

    // Ana's first SMS had a second part, minted at the gateway right after it, that its log
    // stage wrote only now: older than everything version 1 merged.
    let late = minted_just_after(said[0].0);
    assert!(said[0].0 < late && late < said[3].0);
    log_late(&app, late, said[0].0, "Sunday the 14th, not the 7th.").await;
    time_passes(&app).await;

    let v2 = summary_at(&app, &key, 2).await;
    assert_eq!(
        (
            v2.messages_covered,
            v2.first_message_in_summary,
            v2.last_message_in_summary
        ),
        (5, Some(said[0].0), Some(said[3].0)),
        "version 2 covers the late message too: {v2:?}"
    );
    // Version 2 was given the late message, and only it.
    let prompts = new_messages(&model);
    assert_eq!(
        prompts.last().unwrap().lines().collect::<Vec<_>>().len(),
        1,
        "{prompts:?}"
    );
    assert!(
        prompts
            .last()
            .unwrap()
            .contains("person: Sunday the 14th, not the 7th."),
        "{prompts:?}"
    );
    // Each message merged by exactly one version, and nothing more to do.
    app.settle().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    app.settle().await;
    let marked = marks(&app).await;
    let versions: Vec<Option<i64>> = marked.iter().map(|(_, v)| *v).collect();
    let late_at = marked.iter().position(|(id, _)| *id == late).unwrap();
    let mut expected = vec![Some(1); 5];
    expected[late_at] = Some(2);
    assert_eq!(versions, expected);
    let (session, _) = sessions_of_ana(&app).await[0];
    let merged: Vec<i64> = summarised_entries(&app, session)
        .await
        .iter()
        .map(|d| d["messages_merged"].as_i64().unwrap())
        .collect();
    assert_eq!(merged, [4, 1]);
    assert_eq!(summary_row(&app, &key).await.unwrap().version, 2);
    app.shutdown().await;
}

#[tokio::test]
async fn a_key_with_a_message_logged_late_is_summarised_soon_after_it_goes_quiet_not_after_the_dedupe_window()
 {
    let model = FakeModel::start(8).await;
    let app = app_with_model(Some(&model)).await;
    ana(&app).await;
    text(&app, "Can I swap my Sunday shift?", 1).await;
    text(&app, "Ben would take it.", 2).await;
    app.settle().await;
    let said = logged(&app).await;
    // A part of Ana's first SMS is logged only now, while the rest has been quiet for hours.
    let late = minted_just_after(said[0].0);
    log_late(&app, late, said[0].0, "Sunday the 14th, not the 7th.").await;
    app.log_ages_two_hours(Some(late)).await;
    let key = memory_key(&app).await;
    // Sweeps pass while it is fresh (a run may stop before it, and merge what came first).
    tokio::time::sleep(Duration::from_secs(3)).await;
    app.settle().await;

    // The conversation is quiet: all of it is summarised within seconds (the sweeper looks
    // every second), not once JetStream's duplicate window (600 s) has passed.
    time_passes(&app).await;
    let done = summary_covering(&app, &key, said[3].0).await;
    assert_eq!(done.messages_covered, 5, "{done:?}");
    app.settle().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    app.settle().await;
    assert!(marks(&app).await.iter().all(|(_, v)| v.is_some()));
    let row = summary_row(&app, &key).await.unwrap();
    assert_eq!(row.messages_covered, 5, "nothing merged twice: {row:?}");
    app.shutdown().await;
}
