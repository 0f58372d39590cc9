//! Forgetting a person (`switchboard forget`, `DELETE /api/v1/people/<id>`): afterwards no
//! table row, workspace folder, stream message or dead letter names them, also when they were
//! mid-turn; everyone else's data is untouched; `person.forgotten` tells downstream consumers;
//! a message they send afterwards starts a new conversation.
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt as _;
use prost::{Message as _, Name as _};
use switchboard_e2e::{ChatClient, TestApp, spawn_app_configured};
use switchboard_kit::config::Config;
use switchboard_kit::proto::{DeadLetter, MessageEmbedded, PersonForgotten, Turn};
use switchboard_kit::stage::StageOverrides;
use switchboard_kit::{Source, StageSpec};

const WAIT: Duration = Duration::from_secs(20);

/// Dana: in the directory by phone and chat login. Her ids are distinctive, so that a text
/// search for them finds only her data.
const DANA: &str = "staff-forgetme-41";
const DANA_PHONE: &str = "+14155550141";
const DANA_LOGIN: &str = "dana-forgetme@clinic";
/// Ben: someone else, who must keep everything.
const BEN: &str = "staff-keepme-42";
const BEN_PHONE: &str = "+14155550142";

async fn app_with_workspaces() -> TestApp {
    app_with_workspaces_and(|_| {}).await
}

async fn app_with_workspaces_and(tweak: impl FnOnce(&mut Config) + Send + 'static) -> TestApp {
    let root = std::env::temp_dir().join(format!("sb-forget-{}", uuid::Uuid::new_v4()));
    spawn_app_configured(move |c| {
        c.workspace.root = root.to_string_lossy().into_owned();
        tweak(c);
    })
    .await
}

async fn in_directory(app: &TestApp, id: &str, phone: &str, login: Option<&str>) {
    sqlx::query(
        "INSERT INTO switchboard.people (person_id, person_type, name, role)
         VALUES ($1, 'staff', $1, 'nurse')",
    )
    .bind(id)
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO switchboard.contact_points (kind, address, person_id)
         VALUES ('phone', $1, $2)",
    )
    .bind(phone)
    .bind(id)
    .execute(&app.db)
    .await
    .unwrap();
    if let Some(login) = login {
        sqlx::query(
            "INSERT INTO switchboard.contact_points (kind, address, person_id)
             VALUES ('chat_user', $1, $2)",
        )
        .bind(login)
        .bind(id)
        .execute(&app.db)
        .await
        .unwrap();
    }
}

/// What the memory workers keep of a person (their summary, curated memory, a vector and a
/// category of their messages), as they would write it.
async fn memory_of(app: &TestApp, person: &str) {
    let (session, inbound, outbound): (uuid::Uuid, uuid::Uuid, uuid::Uuid) = sqlx::query_as(
        "SELECT s.id,
                (SELECT id FROM switchboard.messages WHERE session_id = s.id
                  AND direction = 'inbound' ORDER BY id LIMIT 1),
                (SELECT id FROM switchboard.messages WHERE session_id = s.id
                  AND direction = 'outbound' ORDER BY id LIMIT 1)
           FROM switchboard.sessions s WHERE s.person_id = $1 LIMIT 1",
    )
    .bind(person)
    .fetch_one(&app.db)
    .await
    .unwrap();
    let key = format!("reggie:person:staff:{person}");
    sqlx::query(
        "INSERT INTO switchboard.summaries (memory_key, agent_identity, person_id, summary)
         VALUES ($1, 'reggie', $2, 'asked about shifts')",
    )
    .bind(&key)
    .bind(person)
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO switchboard.memories (person_id, agent_identity, body, updated_by)
         VALUES ($1, 'reggie', 'prefers mornings', 'person')",
    )
    .bind(person)
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO switchboard.message_vectors
            (message_id, model, person_id, agent_identity, dimensions, embedding)
         VALUES ($1, 'fake', $2, 'reggie', 3, '[1,2,3]')",
    )
    .bind(inbound)
    .bind(person)
    .execute(&app.db)
    .await
    .unwrap();
    // The categorisation worker may have labelled the exchange already.
    sqlx::query(
        "INSERT INTO switchboard.exchange_categories
            (outbound_id, inbound_id, session_id, person_id, agent_identity, channel, label, source)
         VALUES ($1, $2, $3, $4, 'reggie', 'sms', 'roster_query', 'embedding')
         ON CONFLICT DO NOTHING",
    )
    .bind(outbound)
    .bind(inbound)
    .bind(session)
    .bind(person)
    .execute(&app.db)
    .await
    .unwrap();
}

async fn sessions_of(app: &TestApp, person: &str) -> Vec<(uuid::Uuid, Option<String>)> {
    sqlx::query_as(
        "SELECT id, workspace_path FROM switchboard.sessions WHERE person_id = $1 ORDER BY id",
    )
    .bind(person)
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// Rows of any table of the `switchboard` schema whose text form contains one of `needles`,
/// as `table: row`. Generic, so a table added later is checked too.
async fn rows_naming(app: &TestApp, needles: &[String]) -> Vec<String> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
          WHERE table_schema = 'switchboard' AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert!(tables.len() > 15, "the schema's tables: {tables:?}");
    let mut found = Vec::new();
    for table in tables {
        let rows: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT x::text FROM switchboard.{table} x
              WHERE EXISTS (SELECT 1 FROM unnest($1::text[]) n WHERE strpos(x::text, n) > 0)"
        ))
        .bind(needles)
        .fetch_all(&app.db)
        .await
        .unwrap();
        found.extend(rows.into_iter().map(|r| format!("{table}: {r}")));
    }
    found
}

/// Every stored message of the work, events and dead-letter streams: (subject, payload).
async fn stored_messages(app: &TestApp) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for name in [
        app.topology.work_stream(),
        app.topology.events_stream(),
        app.topology.dlq_stream(),
    ] {
        let mut stream = app.js.get_stream(&name).await.unwrap();
        let info = stream.info().await.unwrap();
        if info.state.messages == 0 {
            continue;
        }
        for seq in info.state.first_sequence..=info.state.last_sequence {
            if let Ok(m) = stream.get_raw_message(seq).await {
                out.push((m.subject.to_string(), m.payload.to_vec()));
            }
        }
    }
    out
}

/// Stored stream messages (but the announcement of the erasure) whose bytes hold a needle;
/// protobuf keeps strings as they are, dead letters keep their payload as it was.
async fn stream_messages_naming(app: &TestApp, needles: &[String]) -> Vec<String> {
    let announced = app.topology.event("person.forgotten");
    stored_messages(app)
        .await
        .into_iter()
        .filter(|(subject, _)| *subject != announced)
        .filter(|(_, payload)| {
            needles
                .iter()
                .any(|n| payload.windows(n.len()).any(|w| w == n.as_bytes()))
        })
        .map(|(subject, payload)| format!("{subject}: {}", String::from_utf8_lossy(&payload)))
        .collect()
}

fn dana_needles(sessions: &[(uuid::Uuid, Option<String>)]) -> Vec<String> {
    let mut needles = vec![DANA.to_string(), DANA_PHONE.to_string(), DANA_LOGIN.into()];
    needles.extend(sessions.iter().map(|(id, _)| id.to_string()));
    needles
}

/// A dead letter of one of Dana's turns, as the runtime stores one for a turn it gave up on.
async fn dead_letter_of(app: &TestApp, session: uuid::Uuid) {
    let turn = Turn {
        session_id: session.to_string(),
        seq: 9,
        agent_name: "reggie_oc".into(),
        ..Default::default()
    };
    let letter = DeadLetter {
        stage: "dispatch".into(),
        subject: app.topology.turn(&session),
        error: "permanent: the runner refused the turn".into(),
        payload: turn.encode_to_vec(),
        message_type: Turn::full_name(),
        ..Default::default()
    };
    app.js
        .publish(
            app.topology.dead_letter("dispatch"),
            letter.encode_to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

/// `switchboard forget <Dana> --json`, as an operator runs it: what it printed.
async fn forget_dana(app: &TestApp) -> serde_json::Value {
    let out = app
        .cli(&["forget".as_ref(), DANA.as_ref(), "--json".as_ref()])
        .await;
    assert!(
        out.status.success(),
        "forget failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("forget --json prints one JSON document")
}

fn forget_request(app: &TestApp, key: &str, person: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .delete(format!("{}/api/v1/people/{person}", app.gateway_url))
        .bearer_auth(key)
}

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
    assert_eq!(answer.status(), 200);
    let body: serde_json::Value = answer.json().await.unwrap();
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

    // Forgotten is gone: a second erasure finds no one.
    let again = forget_request(&app, &key, DANA).send().await.unwrap();
    assert_eq!(again.status(), 404);
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

    let printed = forget_dana(&app).await;
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

/// A stage of the test's own, made as the product's stages are (so the erasure's last step
/// waits for it), holding Dana's turn in hand, as a handler at work on it would: the held
/// message, her turn, and the needles that find her.
async fn dana_held_by_a_slow_stage(app: &TestApp) -> (jetstream::Message, Turn, Vec<String>) {
    in_directory(app, DANA, DANA_PHONE, None).await;
    let work = app.js.get_stream(app.topology.work_stream()).await.unwrap();
    let spec = StageSpec::new("slow-stage", Source::Work("turn.>"));
    let slow: jetstream::consumer::PullConsumer = work
        .create_consumer(jetstream::consumer::pull::Config {
            ack_wait: Duration::from_secs(120),
            ..app.topology.consumer_config(&spec, &app.config.runtime)
        })
        .await
        .unwrap();
    app.send_sms(DANA_PHONE, "please remember my allergy").await;
    app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    let mut batch = slow.fetch().max_messages(1).messages().await.unwrap();
    let held = batch.next().await.expect("her turn").unwrap();
    let turn = Turn::decode(held.payload.as_ref()).unwrap();
    let needles = dana_needles(&sessions_of(app, DANA).await);
    (held, turn, needles)
}

/// What the slow stage made of her turn, published after the erasure's sweep.
async fn publish_late(app: &TestApp, turn: &Turn) {
    let inbound = turn.message.as_ref().unwrap().inbound.as_ref().unwrap();
    let late = MessageEmbedded {
        message_id: inbound.id.clone(),
        session_id: turn.session_id.clone(),
        person_id: DANA.into(),
        embedded_at_ms: switchboard_kit::now_ms() - 1,
        ..Default::default()
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Sb-Type", MessageEmbedded::full_name().as_str());
    app.js
        .publish_with_headers(
            app.topology.event("message.embedded"),
            headers,
            late.encode_to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

/// How many `person.forgotten` the events stream holds.
async fn announcements(app: &TestApp) -> usize {
    let announced = app.topology.event("person.forgotten");
    stored_messages(app)
        .await
        .iter()
        .filter(|(subject, _)| *subject == announced)
        .count()
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
    forget_dana(&app).await;
    publish_late(&app, &turn).await;
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
    forget_dana(&app).await;
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
    app.shutdown().await;
}
