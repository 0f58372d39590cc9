//! The stream topology follows the product's list of stages.
use std::time::Duration;

use switchboard::stages;
use switchboard_e2e::spawn_app;
use switchboard_kit::{Source, StageSpec};

#[tokio::test]
async fn a_consumer_left_by_a_removed_stage_is_pruned_and_the_stages_own_stay() {
    let app = spawn_app().await;
    // A stage of an older version, since removed, left its durable consumer on replies.
    let retired = StageSpec::new("retired-notifier", Source::Work("reply"));
    app.topology
        .apply(&app.js, &app.config.runtime, &[retired])
        .await
        .expect("the old consumer");
    let specs: Vec<StageSpec> = stages::ALL.iter().map(|r| r.spec).collect();
    assert_eq!(
        app.topology.strays(&app.js, &specs).await.unwrap(),
        ["retired-notifier"]
    );

    // What an operator runs.
    let bin = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|p| p.parent())
        .unwrap()
        .join("switchboard");
    let mut cmd = tokio::process::Command::new(bin);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SB_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .args(["streams", "prune"])
        .env("SB_CONFIG", &app.config_path)
        .output()
        .await
        .expect("switchboard streams prune");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("deleted consumer retired-notifier"),
        "{stdout}"
    );
    assert!(
        app.topology
            .strays(&app.js, &specs)
            .await
            .unwrap()
            .is_empty()
    );

    // Every stage still has its consumer, and the product still answers.
    assert_eq!(
        app.send_sms("+14155550900", "still here").await.status(),
        200
    );
    let sent = app.wait_for_sms(1, Duration::from_secs(30)).await;
    assert_eq!(sent[0].body, "echo: still here");
    app.settle().await;
    app.shutdown().await;
}

/// What a script reads of the data path: every stage, in the product's order, with its stream
/// and subject; the streams `apply` made; `prune` finding nothing stray on a fresh topology.
#[tokio::test]
async fn the_stages_and_streams_verbs_answer_a_script_in_json() {
    let app = spawn_app().await;
    let listed = app.cli_json(&["stages", "--json"]).await;
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(names, stages::names());
    let dispatch = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "dispatch")
        .unwrap();
    assert_eq!(dispatch["stream"], app.topology.work_stream());
    assert!(dispatch["concurrency"].as_u64().unwrap() > 0, "{dispatch}");

    let applied = app.cli_json(&["streams", "apply", "--json"]).await;
    assert_eq!(
        applied["streams"],
        serde_json::json!([
            app.topology.work_stream(),
            app.topology.events_stream(),
            app.topology.dlq_stream()
        ])
    );
    let pruned = app.cli_json(&["streams", "prune", "--json"]).await;
    assert_eq!(pruned["deleted"], serde_json::json!([]));
    app.shutdown().await;
}
