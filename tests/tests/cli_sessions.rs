//! `switchboard sessions` and `switchboard tail`, as an operator uses them from a terminal
//! next to the running product: find a person's session, read it, start it over, export the
//! conversation; follow the public events as JSON lines and pick up where a script stopped.
use std::ffi::OsStr;
use std::time::Duration;

use serde_json::Value;
use switchboard_e2e::spawn_app;

const WAIT: Duration = Duration::from_secs(30);
const PERSON: &str = "+14155550191";
const OTHER: &str = "+14155550192";

#[tokio::test]
async fn an_operator_finds_reads_resets_and_exports_a_persons_session_from_the_cli() {
    let app = spawn_app().await;
    app.send_sms(PERSON, "hello").await;
    app.send_sms(OTHER, "not me").await;
    app.wait_for_sms(2, WAIT).await;
    app.settle().await;

    // Found by person: theirs alone, as the API lists it.
    let person = format!("phone:{PERSON}");
    let listed = app
        .cli_json(&["sessions", "list", "--person", &person, "--json"])
        .await;
    let sessions = listed["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{listed}");
    assert_eq!(sessions[0]["person"]["id"], person.as_str());
    assert_eq!(sessions[0]["status"], "idle");
    assert_eq!(sessions[0]["turns"]["done"], 1);
    assert_eq!(listed["next"], Value::Null);
    let id = sessions[0]["id"].as_str().unwrap().to_string();
    // The table a person reads names it too; every session is there without a filter.
    let table = app.cli_ok(&["sessions", "list"]).await;
    assert!(table.contains(&id) && table.contains(&person), "{table}");
    assert!(table.contains(&format!("phone:{OTHER}")), "{table}");
    // Paged: one at a time, the next page after it.
    let first = app
        .cli_json(&["sessions", "list", "--limit", "1", "--json"])
        .await;
    let next = first["next"].as_str().expect("a next page").to_string();
    let second = app
        .cli_json(&["sessions", "list", "--after", &next, "--json"])
        .await;
    assert_eq!(second["sessions"].as_array().unwrap().len(), 1);
    assert_ne!(second["sessions"][0]["id"], first["sessions"][0]["id"]);

    // Read: the conversation and the journal.
    let shown = app.cli_json(&["sessions", "show", &id, "--json"]).await;
    let said: Vec<(&str, &str)> = shown["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["direction"].as_str().unwrap(),
                m["text"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(said, [("inbound", "hello"), ("outbound", "echo: hello")]);
    let kinds: Vec<&str> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"message_in") && kinds.contains(&"reply"),
        "{kinds:?}"
    );
    assert!(shown["engine_session_id"].is_string(), "{shown}");
    let text = app.cli_ok(&["sessions", "show", &id]).await;
    assert!(
        text.contains("echo: hello") && text.contains(&person),
        "{text}"
    );

    // Started over: the next message opens a fresh engine session; the journal says who asked.
    let reset = app.cli_json(&["sessions", "reset", &id, "--json"]).await;
    assert_eq!(reset["session_id"], id.as_str());
    assert_eq!(reset["pending_reset"], "api");
    app.send_sms(PERSON, "again").await;
    app.wait_for_sms(3, WAIT).await;
    app.settle().await;
    let calls: Vec<_> = app
        .runner
        .calls()
        .into_iter()
        .filter(|c| switchboard_e2e::fakes::person_of(&c.prompt) == person)
        .collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].session_id, None, "the reset did not start over");
    let shown = app
        .cli_json(&["sessions", "show", &id, "--json", "--last", "50"])
        .await;
    let asked = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "reset_requested")
        .expect("the request is in the journal");
    assert!(
        asked["detail"]["by"].as_str().unwrap().starts_with("cli:"),
        "{asked}"
    );
    assert_eq!(shown["resets"], 1);

    // Exported: the whole conversation, a message a line, oldest first.
    let file = std::env::temp_dir().join(format!("conversation-{id}.jsonl"));
    app.cli_ok(&[
        "sessions",
        "export",
        &id,
        "--output",
        file.to_str().unwrap(),
    ])
    .await;
    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let texts: Vec<&str> = lines.iter().map(|m| m["text"].as_str().unwrap()).collect();
    assert_eq!(texts[0], "hello");
    assert_eq!(texts[1], "echo: hello");
    assert_eq!(texts[2], "again");
    assert!(texts[3].ends_with("echo: again"), "{texts:?}");
    assert_eq!(texts.len(), 4);
    // Standard output gets the same lines.
    let out = app.cli_ok(&["sessions", "export", &id]).await;
    assert_eq!(out.lines().count(), 4);
    let _ = std::fs::remove_file(&file);

    // A session that is not there is an error that says so, and nothing is changed.
    let missing = uuid::Uuid::now_v7().to_string();
    for verb in ["show", "reset", "export"] {
        let out = app
            .cli(&[
                OsStr::new("sessions"),
                OsStr::new(verb),
                OsStr::new(&missing),
            ])
            .await;
        assert!(
            !out.status.success(),
            "{verb} of a missing session succeeded"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("no session {missing}")),
            "{verb}: {err}"
        );
    }
    let out = app
        .cli(&[
            OsStr::new("sessions"),
            OsStr::new("list"),
            OsStr::new("--status"),
            OsStr::new("asleep"),
        ])
        .await;
    assert_eq!(out.status.code(), Some(2), "a bad filter is a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("idle, running, waiting, terminated"));
    app.shutdown().await;
}

/// The `data` of `message.logged` lines: (direction, message id).
fn logged(lines: &[Value]) -> Vec<(String, String)> {
    lines
        .iter()
        .map(|l| {
            assert_eq!(l["event"], "message.logged", "{l}");
            assert_eq!(l["type"], "switchboard.v1.MessageLogged", "{l}");
            (
                l["data"]["direction"].as_str().unwrap().to_string(),
                l["data"]["message_id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn lines(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[tokio::test]
async fn tail_prints_the_public_events_as_json_lines_and_resumes_from_a_sequence_or_a_time() {
    let app = spawn_app().await;
    app.send_sms(PERSON, "first").await;
    app.wait_for_sms(1, WAIT).await;
    app.settle().await;

    // From the start, one kind of event: the exchange's two messages, decoded.
    let all = lines(
        &app.cli_ok(&[
            "tail",
            "--from",
            "all",
            "--event",
            "message.logged",
            "--count",
            "2",
        ])
        .await,
    );
    let first = logged(&all);
    assert_eq!(
        first.iter().map(|(d, _)| d.as_str()).collect::<Vec<_>>(),
        ["inbound", "outbound"]
    );
    assert_eq!(all[0]["data"]["person_id"], format!("phone:{PERSON}"));
    assert!(all[0]["data"]["logged_at_ms"].is_i64(), "{}", all[0]);
    let (seq0, seq1) = (
        all[0]["seq"].as_u64().unwrap(),
        all[1]["seq"].as_u64().unwrap(),
    );
    assert!(seq0 < seq1);
    // Resumed after the first line kept: the second, and only what follows it.
    let resumed = lines(
        &app.cli_ok(&[
            "tail",
            "--from",
            &(seq0 + 1).to_string(),
            "--event",
            "message.logged",
            "--count",
            "1",
        ])
        .await,
    );
    assert_eq!(resumed[0]["seq"], seq1);
    assert_eq!(logged(&resumed), first[1..]);

    // From a time: what happened since, not before.
    let since = chrono::Utc::now().to_rfc3339();
    app.send_sms(PERSON, "second").await;
    app.wait_for_sms(2, WAIT).await;
    app.settle().await;
    let later = lines(
        &app.cli_ok(&[
            "tail",
            "--from",
            &since,
            "--event",
            "message.logged",
            "--count",
            "2",
        ])
        .await,
    );
    let later = logged(&later);
    assert!(
        later.iter().all(|m| !first.contains(m)),
        "an event from before the time came back"
    );
    assert_eq!(later[0].0, "inbound");

    // Every kind, when none is named: the session's creation among them.
    let every = lines(&app.cli_ok(&["tail", "--from", "all", "--count", "6"]).await);
    let events: Vec<&str> = every.iter().map(|l| l["event"].as_str().unwrap()).collect();
    assert!(events.contains(&"session.created"), "{events:?}");
    assert!(events.contains(&"message.received"), "{events:?}");

    let out = app
        .cli(&[
            OsStr::new("tail"),
            OsStr::new("--from"),
            OsStr::new("yesterday"),
        ])
        .await;
    assert_eq!(out.status.code(), Some(2), "a bad start is a usage error");
    app.shutdown().await;
}
