//! Configured look-ups (`identity.lookups`): SQL against the operator's own tables names the
//! people the directory does not. A number a look-up knows is that person (`<type>:<id>`, with
//! the name and role it gives); a look-up that fails is reported and retried, then
//! dead-lettered with its cause, and never silently turns a known person into `phone:+…`.
use std::time::Duration;

use switchboard_e2e::fakes::person_of;
use switchboard_e2e::{AppOptions, FakeRunner, TestApp, spawn_app_configured, spawn_app_with};
use switchboard_kit::config::{Config, ContactKind, IdentityLookup};

const WAIT: Duration = Duration::from_secs(30);
/// Rosa's mobile, in the clinic's own table (not in Switchboard's directory).
const ROSA: &str = "+14155550701";

/// The clinic's patients, as a look-up reads them.
fn patients_lookup(c: &mut Config) {
    c.identity.lookups = vec![IdentityLookup {
        person_type: "patient".into(),
        kind: ContactKind::Phone,
        sql: "SELECT id::text AS person_id, full_name AS name, ward AS role
                FROM clinic.patients WHERE mobile = $1"
            .into(),
    }];
    // A failing message reaches its dead letter after a few quick retries.
    c.runtime.max_deliver = 3;
}

/// The clinic's table in the test's database, Rosa in it.
async fn clinic_table(app: &TestApp) {
    for statement in [
        "CREATE SCHEMA clinic",
        "CREATE TABLE clinic.patients (id INT PRIMARY KEY, full_name TEXT, ward TEXT, mobile TEXT)",
        "INSERT INTO clinic.patients VALUES (17, 'Rosa Diaz', 'ward 4', '+14155550701')",
    ] {
        sqlx::query(statement).execute(&app.db).await.unwrap();
    }
}

/// The runner's calls once there are `n`.
async fn calls(app: &TestApp, n: usize) -> Vec<switchboard_e2e::RunnerCall> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let calls = app.runner.calls();
        if calls.len() >= n {
            return calls;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} runner calls, not {n}",
            calls.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn inbound_people(app: &TestApp) -> Vec<(String, String)> {
    app.log_rows()
        .await
        .into_iter()
        .filter(|r| r.direction == "inbound")
        .map(|r| (r.message, r.person_id))
        .collect()
}

#[tokio::test]
async fn a_number_a_lookup_knows_is_that_person_and_a_failing_lookup_loses_nothing() {
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(patients_lookup),
        ..AppOptions::all_but("identify")
    })
    .await;
    clinic_table(&app).await;
    let identify = app.spawn_logged_worker("identify").await;

    app.send_sms(ROSA, "is my scan today?").await;
    app.wait_for_sms(1, WAIT).await;
    let prompt = &calls(&app, 1).await[0].prompt;
    assert!(
        prompt.contains("Current user: Rosa Diaz | id patient:17 | type patient | role ward 4"),
        "the agent is told who she is: {prompt}"
    );
    app.settle().await;
    assert_eq!(
        inbound_people(&app).await,
        [("is my scan today?".to_string(), "patient:17".to_string())],
        "logged under her id"
    );

    // The clinic's table goes away (a migration of theirs renamed it): the look-up fails.
    sqlx::query("ALTER TABLE clinic.patients RENAME TO patients_moved")
        .execute(&app.db)
        .await
        .unwrap();
    app.send_sms(ROSA, "can I eat before it?").await;
    let letters = app.wait_for_dead_letters("identify", WAIT).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let cause = &letters[0].error;
    assert!(
        cause.contains("configured lookup for patient failed") && cause.contains("patients"),
        "the dead letter says why: {cause}"
    );
    // Not answered as a stranger, nor logged as one.
    assert_eq!(app.runner.calls().len(), 1, "the agent is not asked");
    assert_eq!(app.twilio.sent().len(), 1);
    assert!(
        !inbound_people(&app)
            .await
            .iter()
            .any(|(_, person)| person.starts_with("phone:")),
        "never a phone: person"
    );
    // Reported: counted, and logged as an error with its cause.
    let metrics = identify.metrics().await;
    for outcome in ["retried", "dead_lettered"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("sb_stage_messages_total")
                    && l.contains("stage=\"identify\"")
                    && l.contains(&format!("outcome=\"{outcome}\""))),
            "identify's {outcome} messages are counted:\n{metrics}"
        );
    }
    let log = identify.log();
    assert!(
        log.lines().any(|l| l.contains("ERROR")
            && l.contains("dead-lettering")
            && l.contains("configured lookup for patient failed")),
        "an error is logged with its cause:\n{log}"
    );

    // The table is back: the dead letter, replayed, is Rosa's message after all.
    sqlx::query("ALTER TABLE clinic.patients_moved RENAME TO patients")
        .execute(&app.db)
        .await
        .unwrap();
    app.replay_dead_letter("identify").await;
    app.wait_for_sms(2, WAIT).await;
    let call = &calls(&app, 2).await[1];
    assert_eq!(FakeRunner::said(&call.prompt), "can I eat before it?");
    assert_eq!(person_of(&call.prompt), "patient:17");
    app.settle().await;
    assert_eq!(
        inbound_people(&app).await,
        [
            ("is my scan today?".to_string(), "patient:17".to_string()),
            ("can I eat before it?".to_string(), "patient:17".to_string())
        ]
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_lookup_whose_sql_is_wrong_dead_letters_the_message_with_the_cause() {
    let app = spawn_app_configured(|c| {
        patients_lookup(c);
        // A column the table does not have.
        c.identity.lookups[0].sql =
            "SELECT id::text AS person_id, nickname AS name FROM clinic.patients WHERE mobile = $1"
                .into();
    })
    .await;
    clinic_table(&app).await;

    app.send_sms(ROSA, "hello?").await;
    let letters = app.wait_for_dead_letters("identify", WAIT).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let cause = &letters[0].error;
    assert!(
        cause.contains("configured lookup for patient failed") && cause.contains("nickname"),
        "the dead letter names the broken look-up and why: {cause}"
    );
    app.settle().await;
    assert!(app.runner.calls().is_empty(), "not answered as a stranger");
    assert!(inbound_people(&app).await.is_empty(), "not logged as one");
    let metrics = app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sb_stage_messages_total")
                && l.contains("stage=\"identify\"")
                && l.contains("outcome=\"dead_lettered\"")),
        "{metrics}"
    );
    app.shutdown().await;
}
