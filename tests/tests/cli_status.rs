//! `switchboard status`, as an operator reads it: each stage's backlog, what it has in hand and
//! its dead letters, the streams, the live dispatchers; `--json` for scripts.
use std::time::{Duration, Instant};

use switchboard_e2e::{AppOptions, TestApp, spawn_app_with};

const WAIT: Duration = Duration::from_secs(30);

async fn status(app: &TestApp) -> serde_json::Value {
    let out = app.cli(&["status".as_ref(), "--json".as_ref()]).await;
    assert!(
        out.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status --json prints one JSON document")
}

/// The `key` of each entry of the list `status[list]`, in order.
fn each<'a>(status: &'a serde_json::Value, list: &str, key: &str) -> Vec<&'a str> {
    status[list]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s[key].as_str().unwrap())
        .collect()
}

fn stage<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    status["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {status}"))
}

#[tokio::test]
async fn status_shows_a_stopped_stages_backlog_and_a_stages_dead_letters() {
    // Delivery is down: the reply waits for it.
    let app = spawn_app_with(AppOptions::all_but("deliver")).await;
    app.send_sms("+14155550161", "is anyone there?").await;
    let deadline = Instant::now() + WAIT;
    let mut now = status(&app).await;
    while stage(&now, "deliver")["pending"] != 1 {
        assert!(Instant::now() < deadline, "the reply never waited: {now}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        now = status(&app).await;
    }
    assert_eq!(
        each(&now, "stages", "stage"),
        switchboard::stages::names(),
        "every stage, in order"
    );
    assert_eq!(stage(&now, "deliver")["worker"], "deliver");
    assert_eq!(
        stage(&now, "deliver")["pulling"],
        0,
        "no replica asks: {now}"
    );
    assert!(now["dispatchers_alive"].as_i64().unwrap() >= 1, "{now}");
    assert_eq!(
        each(&now, "streams", "name"),
        [
            app.topology.work_stream(),
            app.topology.events_stream(),
            app.topology.dlq_stream()
        ]
    );

    // Delivery comes back: the backlog drains.
    app.start_stage("deliver");
    app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    // A running replica keeps asking for work (a pull request may lapse for a moment).
    let deadline = Instant::now() + WAIT;
    let mut now = status(&app).await;
    while stage(&now, "deliver")["pulling"].as_u64() < Some(1) {
        assert!(Instant::now() < deadline, "deliver never asked: {now}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        now = status(&app).await;
    }
    for s in now["stages"].as_array().unwrap() {
        assert_eq!(
            (s["pending"].as_u64(), s["in_hand"].as_u64()),
            (Some(0), Some(0)),
            "{s}"
        );
        assert_eq!(s["dead_letters"], 0, "{s}");
    }

    // Something identify cannot read is dead-lettered, and counted against identify.
    app.js
        .publish(app.topology.inbound("sms"), "not a message".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let letters = app.wait_for_dead_letters("identify", WAIT).await;
    assert_eq!(letters.len(), 1);
    let now = status(&app).await;
    assert_eq!(stage(&now, "identify")["dead_letters"], 1, "{now}");
    assert_eq!(stage(&now, "session")["dead_letters"], 0, "{now}");

    // Without --json: a table a person reads.
    let out = app.cli(&["status".as_ref()]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let identify = text
        .lines()
        .find(|l| l.starts_with("identify "))
        .unwrap_or_else(|| panic!("no identify row: {text}"));
    assert!(identify.trim_end().ends_with(" 1"), "{identify}");
    assert!(text.contains("dispatchers alive:"), "{text}");
    app.shutdown().await;
}
