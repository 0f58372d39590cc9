//! `switchboard dlq`, as an operator uses it after an incident: find the dead letters by stage
//! and error, read one whole, try a bulk replay dry, then replay one and the rest once the
//! cause is fixed; every person is answered, nothing is left behind.
use std::ffi::OsStr;
use std::time::Duration;

use serde_json::Value;
use switchboard_e2e::spawn_app;

const WAIT: Duration = Duration::from_secs(30);
const PEOPLE: [&str; 3] = ["+14155550301", "+14155550302", "+14155550303"];

fn seqs(list: &Value) -> Vec<u64> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|l| l["seq"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn an_operator_finds_reads_and_replays_dead_letters_one_or_all_from_the_cli() {
    let app = spawn_app().await;
    // The agent host rejects three turns (a 4xx: retrying cannot help), one per person.
    app.runner.fail_next(3, 422);
    for (i, person) in PEOPLE.iter().enumerate() {
        app.send_sms(person, &format!("stuck {i}")).await;
    }
    let deadline = std::time::Instant::now() + WAIT;
    while app.dead_letters("dispatch").await.len() < 3 {
        assert!(std::time::Instant::now() < deadline, "three dead letters");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Found by stage and by what went wrong.
    let listed = app
        .cli_json(&["dlq", "list", "--stage", "dispatch", "--json"])
        .await;
    assert_eq!(seqs(&listed).len(), 3, "{listed}");
    assert!(
        listed[0]["error"].as_str().unwrap().contains("422"),
        "{listed}"
    );
    assert_eq!(listed[0]["stage"], "dispatch");
    assert_eq!(listed[0]["type"], "switchboard.v1.Turn");
    let by_error = app
        .cli_json(&["dlq", "list", "--error", "HTTP 422", "--json"])
        .await;
    assert_eq!(seqs(&by_error), seqs(&listed));
    let none = app
        .cli_json(&["dlq", "list", "--error", "no such error", "--json"])
        .await;
    assert_eq!(none, Value::Array(vec![]));
    let later = app
        .cli_json(&["dlq", "list", "--since", "2999-01-01T00:00:00Z", "--json"])
        .await;
    assert_eq!(later, Value::Array(vec![]), "nothing failed in the future");
    let table = app.cli_ok(&["dlq", "list", "--stage", "dispatch"]).await;
    assert!(
        table.contains("422") && table.contains("stage=dispatch"),
        "{table}"
    );

    // Read whole: the turn it gave up on, decoded.
    let first = seqs(&listed)[0].to_string();
    let shown = app.cli_json(&["dlq", "show", &first, "--json"]).await;
    let payload = shown["payload"].to_string();
    assert!(payload.contains("stuck "), "the person's words: {shown}");
    assert!(shown["payload"]["seq"].is_i64(), "{shown}");
    assert_eq!(shown["deliveries"], 1);

    // A dry run replays nothing.
    let dry = app
        .cli_json(&[
            "dlq",
            "replay",
            "--all",
            "--stage",
            "dispatch",
            "--dry-run",
            "--json",
        ])
        .await;
    assert_eq!(seqs(&dry["would_replay"]), seqs(&listed));
    assert_eq!(app.dead_letters("dispatch").await.len(), 3);
    assert!(
        app.twilio
            .sent()
            .iter()
            .all(|m| !m.body.starts_with("echo:"))
    );

    // One by name, then the rest in bulk: everyone is answered once.
    let one = app.cli_ok(&["dlq", "replay", &first]).await;
    assert!(one.contains(&format!("replayed #{first}")), "{one}");
    let rest = app.cli_json(&["dlq", "replay", "--all", "--json"]).await;
    assert_eq!(rest["replayed"].as_array().unwrap().len(), 2, "{rest}");
    assert_eq!(rest["failed"], Value::Array(vec![]));
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let echoes: Vec<String> = app
            .twilio
            .sent()
            .into_iter()
            .filter(|m| m.body.starts_with("echo: stuck"))
            .map(|m| m.body)
            .collect();
        if echoes.len() == 3 {
            let mut sorted = echoes.clone();
            sorted.sort();
            assert_eq!(sorted, ["echo: stuck 0", "echo: stuck 1", "echo: stuck 2"]);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "answered: {echoes:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.settle().await;
    assert!(app.dead_letters("dispatch").await.is_empty());

    // Naming a dead letter that is gone is an error that says so; so is naming none.
    let out = app
        .cli(&[OsStr::new("dlq"), OsStr::new("replay"), OsStr::new(&first)])
        .await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("dead letter {first} not found")),
        "{out:?}"
    );
    let out = app.cli(&[OsStr::new("dlq"), OsStr::new("replay")]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--all"),
        "{out:?}"
    );
    app.shutdown().await;
}
