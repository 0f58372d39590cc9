//! Scheduled inputs (`[[schedules]]`): at its time a schedule opens a turn of the person's
//! session with its agent, once however many dispatchers run, and the reply goes out on the
//! channel the person last wrote on. A heartbeat is one turn for a whole batch, answered to
//! one reader, or to nobody when there is nothing to report.
use std::time::{Duration, Instant};

use chrono::Timelike;
use switchboard_e2e::{AppOptions, spawn_app_with};
use switchboard_kit::config::{ScheduleConfig, ScheduleKind};

const PERSON: &str = "+14155550195";
const LEAD: &str = "+14155550194";
const WAIT: Duration = Duration::from_secs(30);

/// A cron pattern (seconds first) due `secs` from now, once a day.
fn due_in(secs: i64) -> String {
    let at = chrono::Utc::now() + chrono::Duration::seconds(secs);
    format!("{} {} {} * * *", at.second(), at.minute(), at.hour())
}

#[tokio::test]
async fn a_scheduled_input_fires_once_with_three_dispatch_replicas_running() {
    // Due a few seconds from now (seconds given first), once a day.
    let at = chrono::Utc::now() + chrono::Duration::seconds(8);
    let cron = format!("{} {} {} * * *", at.second(), at.minute(), at.hour());
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(move |c| {
            c.dispatch.schedule_tick_ms = 200;
            c.schedules = vec![ScheduleConfig {
                name: "morning-agenda".into(),
                agent: "reggie_oc".into(),
                person: format!("phone:{PERSON}"),
                cron,
                time_zone: "UTC".into(),
                text: "Send today's agenda".into(),
                ..Default::default()
            }];
        }),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    let _dispatchers: Vec<_> = (0..3).map(|_| app.spawn_worker("dispatch")).collect();
    // The person wrote once: that is the channel the schedule's reply goes out on.
    app.send_sms(PERSON, "hi").await;
    app.wait_for_sms(1, WAIT).await;

    let sent = app.wait_for_sms(2, WAIT).await;
    assert_eq!(sent[1].to, PERSON);
    assert_eq!(sent[1].body, "echo: Send today's agenda");
    // Give the other replicas time to (not) fire it too.
    let deadline = Instant::now() + Duration::from_secs(4);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 2, "fired more than once");
    let calls = app.runner.calls();
    let scheduled: Vec<_> = calls
        .iter()
        .filter(|c| c.prompt.contains("Scheduled input (morning-agenda)"))
        .collect();
    assert_eq!(scheduled.len(), 1);
    // In the person's session, resuming their engine session.
    assert_eq!(scheduled[0].session_id.as_deref(), Some("eng-1"));
    let fires: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.schedule_fires")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(fires, 1);
    // Logged as the schedule's input, not the person's words.
    let marked: Option<String> = sqlx::query_scalar(
        "SELECT metadata->>'scheduled' FROM switchboard.messages
          WHERE direction = 'inbound' AND message = 'Send today''s agenda'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(marked.as_deref(), Some("morning-agenda"));
    app.shutdown().await;
}

#[tokio::test]
async fn a_heartbeat_is_one_turn_for_the_batch_answered_to_its_reader_once_or_to_nobody() {
    let cron = due_in(8);
    let heartbeat = |name: &str, text: &str| ScheduleConfig {
        name: name.into(),
        agent: "reggie_oc".into(),
        kind: ScheduleKind::Heartbeat,
        deliver_to: "lead-1".into(),
        people: "SELECT person_id FROM switchboard.people WHERE person_type = 'staff' \
                 ORDER BY person_id"
            .into(),
        cron: cron.clone(),
        time_zone: "UTC".into(),
        text: text.into(),
        ..Default::default()
    };
    let schedules = vec![
        heartbeat(
            "staff-checkin",
            "Check on the staff; report who needs a call.",
        ),
        heartbeat("quiet-hours", "Anything urgent tonight?"),
    ];
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(move |c| {
            c.dispatch.schedule_tick_ms = 200;
            c.schedules = schedules;
        }),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    for (id, kind, name, role) in [
        ("staff-1", "staff", "Dana", "nurse"),
        ("staff-2", "staff", "Eli", "driver"),
        ("lead-1", "manager", "Lee", "lead"),
    ] {
        sqlx::query(
            "INSERT INTO switchboard.people (person_id, person_type, name, role)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(kind)
        .bind(name)
        .bind(role)
        .execute(&app.db)
        .await
        .unwrap();
    }
    // The reader is in the directory by phone: a heartbeat answered to that phone still runs
    // as the schedule, not as them.
    sqlx::query(
        "INSERT INTO switchboard.contact_points (kind, address, person_id)
         VALUES ('phone', $1, 'lead-1')",
    )
    .bind(LEAD)
    .execute(&app.db)
    .await
    .unwrap();
    // The agent has something to report for one, nothing for the other.
    app.runner.answer_when(
        "Heartbeat (staff-checkin)",
        "Dana has not checked in since Monday.",
    );
    app.runner
        .answer_when("Heartbeat (quiet-hours)", "HEARTBEAT_OK");
    let _dispatchers: Vec<_> = (0..3).map(|_| app.spawn_worker("dispatch")).collect();
    // The reader wrote once, by SMS: that is where a heartbeat's answer goes.
    app.send_sms(LEAD, "hi").await;
    app.wait_for_sms(1, WAIT).await;

    let sent = app.wait_for_sms(2, WAIT).await;
    assert_eq!(sent[1].to, LEAD);
    assert_eq!(sent[1].body, "Dana has not checked in since Monday.");
    // Give the other replicas time to (not) fire again, and the no-op answer time to (not) go.
    let deadline = Instant::now() + Duration::from_secs(4);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.settle().await;
    let texts: Vec<String> = app.twilio.sent().iter().map(|m| m.body.clone()).collect();
    assert_eq!(
        texts.len(),
        2,
        "the report once, the no-op never: {texts:?}"
    );

    let calls = app.runner.calls();
    for name in ["staff-checkin", "quiet-hours"] {
        let of: Vec<_> = calls
            .iter()
            .filter(|c| c.prompt.contains(&format!("Heartbeat ({name})")))
            .collect();
        assert_eq!(of.len(), 1, "one runner call per firing of {name}");
        let p = &of[0].prompt;
        // The batch in one prompt.
        assert!(p.contains("People in this batch (2):"), "{p}");
        assert!(p.contains("- staff-1: Dana (staff, nurse)"), "{p}");
        assert!(p.contains("- staff-2: Eli (staff, driver)"), "{p}");
        // In a session of its own: not the reader's (whose engine session is eng-1).
        assert_eq!(
            of[0].session_id, None,
            "{name} started its own engine session"
        );
        assert_eq!(
            switchboard_e2e::fakes::person_of(p),
            format!("schedule:{name}")
        );
    }
    let fires: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.schedule_fires")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(fires, 2);
    // The no-op answer is logged (not sent), in the heartbeat's own session.
    let logged: Vec<(String, Option<String>, String)> = sqlx::query_as(
        "SELECT message, metadata->>'kind', person_id FROM switchboard.messages
          WHERE direction = 'outbound' ORDER BY id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert!(
        logged.contains(&(
            "HEARTBEAT_OK".into(),
            Some("heartbeat_ok".into()),
            "schedule:quiet-hours".into()
        )),
        "{logged:?}"
    );
    let own_sessions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.sessions WHERE person_id LIKE 'schedule:%'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(own_sessions, 2);
    app.shutdown().await;
}

#[test]
fn a_schedule_that_cannot_run_is_refused_at_start_up() {
    let base = || switchboard_kit::config::Config {
        agents: vec![switchboard_kit::config::AgentConfig {
            name: "reggie_oc".into(),
            identity: "reggie".into(),
            engine: "openclaw".into(),
            runner_url: "http://runner".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let good = ScheduleConfig {
        name: "daily".into(),
        agent: "reggie_oc".into(),
        person: "staff-7".into(),
        cron: "0 9 * * 1-5".into(),
        time_zone: "Europe/London".into(),
        text: "Agenda".into(),
        ..Default::default()
    };
    let mut c = base();
    c.schedules = vec![
        good.clone(),
        ScheduleConfig {
            name: "heartbeat".into(),
            kind: ScheduleKind::Heartbeat,
            deliver_to: "staff-1".into(),
            ..good.clone()
        },
    ];
    assert!(c.validate().is_ok());
    for (bad, why) in [
        (
            ScheduleConfig {
                cron: "every morning".into(),
                ..good.clone()
            },
            "cron",
        ),
        (
            ScheduleConfig {
                time_zone: "Mars/Olympus".into(),
                ..good.clone()
            },
            "time_zone",
        ),
        (
            ScheduleConfig {
                agent: "nobody".into(),
                ..good.clone()
            },
            "agent",
        ),
        (
            ScheduleConfig {
                people: "SELECT person_id FROM switchboard.people".into(),
                ..good.clone()
            },
            "either",
        ),
        (
            ScheduleConfig {
                text: " ".into(),
                ..good.clone()
            },
            "text",
        ),
        (
            ScheduleConfig {
                kind: ScheduleKind::Heartbeat,
                ..good.clone()
            },
            "needs deliver_to",
        ),
        (
            ScheduleConfig {
                deliver_to: "staff-1".into(),
                ..good.clone()
            },
            "deliver_to is for kind = \"heartbeat\"",
        ),
    ] {
        let mut c = base();
        c.schedules = vec![bad];
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
    // A kind that is not one is named, with the ones there are.
    let e = toml::from_str::<ScheduleConfig>("kind = \"hearbeat\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected `person` or `heartbeat`"), "{e}");
}
