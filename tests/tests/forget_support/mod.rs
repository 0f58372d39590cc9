//! What the erasure tests share: Dana (to be forgotten) and Ben (who keeps everything), the
//! rows and stream messages that name someone, and ways to ask for an erasure and follow it.
#![allow(dead_code)] // each test file uses its share

use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt as _;
use prost::{Message as _, Name as _};
use switchboard_e2e::{TestApp, spawn_app_configured};
use switchboard_kit::config::Config;
use switchboard_kit::proto::{DeadLetter, MessageEmbedded, Turn};
use switchboard_kit::{Source, StageSpec};

pub const WAIT: Duration = Duration::from_secs(20);

/// Dana: in the directory by phone and chat login. Her ids are distinctive, so that a text
/// search for them finds only her data.
pub const DANA: &str = "staff-forgetme-41";
pub const DANA_PHONE: &str = "+14155550141";
pub const DANA_LOGIN: &str = "dana-forgetme@clinic";
/// Ben: someone else, who must keep everything.
pub const BEN: &str = "staff-keepme-42";
pub const BEN_PHONE: &str = "+14155550142";

pub async fn app_with_workspaces() -> TestApp {
    app_with_workspaces_and(|_| {}).await
}

pub async fn app_with_workspaces_and(tweak: impl FnOnce(&mut Config) + Send + 'static) -> TestApp {
    let root = std::env::temp_dir().join(format!("sb-forget-{}", uuid::Uuid::new_v4()));
    spawn_app_configured(move |c| {
        c.workspace.root = root.to_string_lossy().into_owned();
        tweak(c);
    })
    .await
}

pub async fn in_directory(app: &TestApp, id: &str, phone: &str, login: Option<&str>) {
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
pub async fn memory_of(app: &TestApp, person: &str) {
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
    // A vector recall handed to an embedding worker that has not taken it (none running).
    sqlx::query(
        "INSERT INTO switchboard.handed_vectors
            (message_id, model, person_id, agent_identity, dimensions, embedding)
         VALUES ($1, 'fake', $2, 'reggie', 3, '[1,2,3]')",
    )
    .bind(uuid::Uuid::now_v7())
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

pub async fn sessions_of(app: &TestApp, person: &str) -> Vec<(uuid::Uuid, Option<String>)> {
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
pub async fn rows_naming(app: &TestApp, needles: &[String]) -> Vec<String> {
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
pub async fn stored_messages(app: &TestApp) -> Vec<(String, Vec<u8>)> {
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
pub async fn stream_messages_naming(app: &TestApp, needles: &[String]) -> Vec<String> {
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

pub fn dana_needles(sessions: &[(uuid::Uuid, Option<String>)]) -> Vec<String> {
    let mut needles = vec![DANA.to_string(), DANA_PHONE.to_string(), DANA_LOGIN.into()];
    needles.extend(sessions.iter().map(|(id, _)| id.to_string()));
    needles
}

/// A dead letter of one of Dana's turns, as the runtime stores one for a turn it gave up on.
pub async fn dead_letter_of(app: &TestApp, session: uuid::Uuid) {
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
pub async fn forget_dana(app: &TestApp) -> serde_json::Value {
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

pub fn forget_request(app: &TestApp, key: &str, person: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .delete(format!("{}/api/v1/people/{person}", app.gateway_url))
        .bearer_auth(key)
}

/// A stage of the test's own, made as the product's stages are (so the erasure's last step
/// waits for it), holding Dana's turn in hand, as a handler at work on it would: the held
/// message, her turn, and the needles that find her.
pub async fn dana_held_by_a_slow_stage(app: &TestApp) -> (jetstream::Message, Turn, Vec<String>) {
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
pub async fn publish_late(app: &TestApp, turn: &Turn) {
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
pub async fn announcements(app: &TestApp) -> usize {
    let announced = app.topology.event("person.forgotten");
    stored_messages(app)
        .await
        .iter()
        .filter(|(subject, _)| *subject == announced)
        .count()
}

/// `switchboard forget <Dana> --no-wait --json`: the job as it started.
pub async fn forget_dana_no_wait(app: &TestApp) -> serde_json::Value {
    app.cli_json(&["forget", DANA, "--no-wait", "--json"]).await
}

/// The status of erasure job `job` (as the table keeps it).
pub async fn job_status(app: &TestApp, job: &serde_json::Value) -> String {
    let id: uuid::Uuid = job["job_id"].as_str().unwrap().parse().unwrap();
    sqlx::query_scalar("SELECT status FROM switchboard.erasure_jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// Wait until erasure job `job` is in one of `statuses`.
pub async fn wait_for_job(app: &TestApp, job: &serde_json::Value, statuses: &[&str]) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = job_status(app, job).await;
        if statuses.contains(&status.as_str()) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "job {} is still {status}, not {statuses:?}",
            job["job_id"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET <status_url>` with `key`, as a privacy officer polls an erasure: its answer.
pub async fn erasure_at(app: &TestApp, key: &str, status_url: &str) -> reqwest::Response {
    reqwest::Client::new()
        .get(format!("{}{status_url}", app.gateway_url))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
}

/// Poll `status_url` until the job is over (done or failed): its last answer.
pub async fn poll_until_over(app: &TestApp, key: &str, status_url: &str) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = erasure_at(app, key, status_url).await;
        assert_eq!(answer.status(), 200);
        let job: serde_json::Value = answer.json().await.unwrap();
        if job["status"] == "done" || job["status"] == "failed" {
            return job;
        }
        assert!(Instant::now() < deadline, "the erasure never ended: {job}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
