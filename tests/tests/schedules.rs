//! Scheduled inputs (`[[schedules]]`): at its time a schedule opens a turn of the person's
//! session with its agent, once however many dispatchers run, and the reply goes out on the
//! channel the person last wrote on.
use std::time::{Duration, Instant};

use chrono::Timelike;
use switchboard_e2e::{AppOptions, spawn_app_with};
use switchboard_kit::config::ScheduleConfig;

const PERSON: &str = "+14155550195";
const WAIT: Duration = Duration::from_secs(30);

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
    c.schedules = vec![good.clone()];
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
    ] {
        let mut c = base();
        c.schedules = vec![bad];
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
}
