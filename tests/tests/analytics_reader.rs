//! An analytics team's reader, from outside: `switchboard readers add` gives a durable position
//! in the public event stream to a NATS user that may only fetch and ack on it, and the Python
//! example (examples/analytics/follow.py, nats-py, the proto/ schemas compiled by protoc)
//! counts categories with it, stops, and resumes without missing or repeating an event.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use switchboard_e2e::{FakeAnswer, FakeModel, TestApp, spawn_app_configured};
use switchboard_kit::memory_config::LlmConfig;

const WAIT: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_path_buf()
}

/// A venv with examples/analytics/requirements.txt, made once under the stack's bin-cache (as
/// a Python team would: `pip install -r`), reused while the requirements are the same.
fn analytics_python() -> PathBuf {
    let requirements = repo().join("examples/analytics/requirements.txt");
    let text = std::fs::read_to_string(&requirements).expect("the example's requirements");
    let tag: String = {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        format!("{:016x}", h.finish())
    };
    let root = std::env::var_os("SB_STACK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".stack"));
    let venv = root.join("bin-cache").join(format!("analytics-venv-{tag}"));
    let python = venv.join("bin/python");
    let ready = venv.join(".installed");
    if !ready.is_file() {
        let base = std::env::var("SB_PYTHON").unwrap_or_else(|_| "python3".into());
        let _ = std::fs::remove_dir_all(&venv);
        let made = std::process::Command::new(&base)
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("run python3 -m venv");
        assert!(made.success(), "python3 -m venv {}", venv.display());
        let installed = std::process::Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&requirements)
            .status()
            .expect("run pip");
        assert!(
            installed.success(),
            "pip install -r {}",
            requirements.display()
        );
        std::fs::write(&ready, "").expect("mark the venv made");
    }
    python
}

/// Run the example; its state afterwards.
async fn follow(python: &Path, reader: &Path, state: &Path, args: &[&str]) -> serde_json::Value {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(python)
            .arg(repo().join("examples/analytics/follow.py"))
            .arg("--reader")
            .arg(reader)
            .arg("--state")
            .arg(state)
            .arg("--record-seqs")
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("follow.py finishes")
    .expect("run follow.py");
    assert!(
        out.status.success(),
        "follow.py {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(state).expect("its state")).expect("JSON state")
}

/// The stream sequences of the events the reader follows, as the stream holds them.
async fn followed_sequences(app: &TestApp) -> Vec<u64> {
    let stream = app
        .js
        .get_stream(app.topology.events_stream())
        .await
        .expect("the events stream");
    let wanted = [
        app.topology.event("message.logged"),
        app.topology.event("exchange.categorised"),
    ];
    let mut seqs = Vec::new();
    for seq in 1..=stream.cached_info().state.last_sequence {
        if let Ok(m) = stream.get_raw_message(seq).await
            && wanted.contains(&m.subject.to_string())
        {
            seqs.push(seq);
        }
    }
    seqs
}

async fn wait_for_labels(app: &TestApp, n: i64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let have: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.exchange_categories")
            .fetch_one(&app.db)
            .await
            .expect("count exchanges");
        if have >= n {
            app.settle().await;
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{have} of {n} exchanges labelled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn connect_as(reader: &serde_json::Value) -> Result<async_nats::Client, String> {
    async_nats::ConnectOptions::new()
        .user_and_password(
            reader["user"].as_str().unwrap().into(),
            reader["password"].as_str().unwrap().into(),
        )
        .custom_inbox_prefix(reader["inbox_prefix"].as_str().unwrap())
        .connect(reader["nats_url"].as_str().unwrap())
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn an_analytics_reader_resumes_where_it_stopped_without_missing_or_repeating_an_event() {
    let python = tokio::task::spawn_blocking(analytics_python)
        .await
        .expect("the example's venv");
    let fake = FakeModel::start(64).await;
    fake.answer_with(|c| {
        FakeAnswer::Text(if c.user.contains("shift") {
            "roster_query".into()
        } else {
            "incident_report".into()
        })
    });
    let url = fake.url.clone();
    let embedding = fake.embedding_config("fake-embed");
    let app = spawn_app_configured(move |c| {
        c.llm = LlmConfig {
            base_url: url,
            model: "fake-chat".into(),
            timeout_s: 5,
            ..Default::default()
        };
        c.embedding = embedding;
    })
    .await;
    for (phone, text) in [
        ("+14155550801", "when is my next shift?"),
        ("+14155550802", "the fire door is broken"),
    ] {
        assert_eq!(app.send_sms(phone, text).await.status(), 200);
    }
    wait_for_labels(&app, 2).await;

    let name = format!("bi-{}", app.config.subject_prefix);
    let reader = app
        .cli_json(&[
            "readers",
            "add",
            &name,
            "--event",
            "message.logged",
            "--event",
            "exchange.categorised",
            "--json",
        ])
        .await;
    assert_eq!(reader["user"], format!("reader-{name}"));
    assert_eq!(reader["stream"], app.topology.events_stream());
    assert!(
        !reader["nats_url"].as_str().unwrap().contains('@'),
        "the URL carries no secret: {reader}"
    );
    let reader_file = std::env::temp_dir().join(format!("{name}.json"));
    let state = std::env::temp_dir().join(format!("{name}-counts.json"));
    let _ = std::fs::remove_file(&state);
    std::fs::write(&reader_file, reader.to_string()).unwrap();

    // The reader's user may read its consumer, and nothing else: no consumer of its own.
    let as_reader = connect_as(&reader).await.expect("the reader connects");
    let js = jetstream::new(as_reader);
    let events = js
        .get_stream_no_info(app.topology.events_stream())
        .await
        .unwrap();
    // Refused outright (a permissions violation) or never answered: either way, not made.
    let own = tokio::time::timeout(
        Duration::from_secs(8),
        events.create_consumer(consumer::pull::Config {
            durable_name: Some(format!("mine-{name}")),
            ..Default::default()
        }),
    )
    .await;
    assert!(
        !matches!(own, Ok(Ok(_))),
        "a reader made a consumer of its own"
    );
    assert!(
        app.js
            .get_stream(app.topology.events_stream())
            .await
            .unwrap()
            .consumer_info(format!("mine-{name}"))
            .await
            .is_err(),
        "no such consumer exists"
    );

    // First run: three events, then it stops (as a deploy or a crash would stop it).
    let first = follow(&python, &reader_file, &state, &["--stop-after", "3"]).await;
    assert_eq!(first["events"], 3, "{first}");

    // While it is stopped the product goes on.
    assert_eq!(
        app.send_sms("+14155550803", "another shift swap?")
            .await
            .status(),
        200
    );
    wait_for_labels(&app, 3).await;

    // Second run: it resumes after the third and reads to the end.
    let second = follow(&python, &reader_file, &state, &["--idle-exit", "3"]).await;
    let counted: Vec<u64> = second["seqs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(
        counted,
        followed_sequences(&app).await,
        "every followed event counted once, in order"
    );
    assert_eq!(
        counted.len(),
        9,
        "six messages logged, three exchanges labelled"
    );
    assert_eq!(
        second["labels"],
        serde_json::json!({"roster_query": 2, "incident_report": 1})
    );
    assert_eq!(
        second["messages"],
        serde_json::json!({"inbound:sms": 3, "outbound:sms": 3})
    );

    let listed = app.cli_json(&["readers", "list", "--json"]).await;
    let mine = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} listed: {listed}"))
        .clone();
    assert_eq!(mine["pending"], 0, "{mine}");
    assert_eq!(mine["ack_pending"], 0, "{mine}");
    assert_eq!(mine["acked_through"], *counted.last().unwrap(), "{mine}");
    assert_eq!(mine["user_configured"], true, "{mine}");

    // Removed: its position is gone and its user no longer gets in.
    app.cli_ok(&["readers", "remove", &name]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while connect_as(&reader).await.is_ok() {
        assert!(Instant::now() < deadline, "a removed reader still connects");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let listed = app.cli_json(&["readers", "list", "--json"]).await;
    assert!(
        !listed.to_string().contains(&name),
        "removed yet listed: {listed}"
    );
    let _ = std::fs::remove_file(&reader_file);
    let _ = std::fs::remove_file(&state);
}
