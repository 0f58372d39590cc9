//! The runner as Switchboard's dispatch calls it, with small shell scripts as engines.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_runner::config::{AgentConfig, EngineConfig, PromptVia};
use switchboard_runner::{Runner, RunnerConfig};

struct Host {
    dir: PathBuf,
    url: String,
    server: tokio::task::JoinHandle<()>,
}

impl Host {
    /// A runner on a fresh state folder with one agent `reggie_oc` whose engine is `script`.
    async fn start(script: &str, timeout_s: u64) -> Host {
        let dir = std::env::temp_dir().join(format!("sb-runner-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let engine = dir.join("engine.sh");
        std::fs::write(&engine, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&engine)
            .status()
            .unwrap();
        Self::serve(dir, timeout_s).await
    }

    fn config(dir: &Path, timeout_s: u64) -> RunnerConfig {
        let engine = EngineConfig {
            command: vec![
                dir.join("engine.sh").to_string_lossy().into_owned(),
                "{session_id}".into(),
                "{prompt}".into(),
            ],
            prompt_via: PromptVia::Arg,
            text_path: "/payloads/0/text".into(),
            session_id_path: "/meta/agentMeta/sessionId".into(),
            timeout_s: Some(timeout_s),
            env: BTreeMap::from([("HOST_DIR".to_string(), dir.to_string_lossy().into_owned())]),
            ..Default::default()
        };
        RunnerConfig {
            token: Some("runner-secret".into()),
            state_dir: dir.join("state"),
            core_memory_dir: dir.to_path_buf(),
            max_output_bytes: 4096,
            engines: BTreeMap::from([("script".to_string(), engine)]),
            agents: BTreeMap::from([(
                "reggie_oc".to_string(),
                AgentConfig {
                    engine: "script".into(),
                    identity: "reggie".into(),
                },
            )]),
            ..Default::default()
        }
    }

    async fn serve(dir: PathBuf, timeout_s: u64) -> Host {
        let router = Runner::new(Self::config(&dir, timeout_s))
            .unwrap()
            .supervised_by(env!("CARGO_BIN_EXE_switchboard-runner"))
            .router();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Host { dir, url, server }
    }

    /// The runner process stops and starts again on the same folder.
    async fn restart(self, timeout_s: u64) -> Host {
        self.server.abort();
        Self::serve(self.dir.clone(), timeout_s).await
    }

    async fn run(&self, key: &str, session: Option<&str>, prompt: &str) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(format!("{}/run", self.url))
            .bearer_auth("runner-secret")
            .header("Idempotency-Key", key)
            .json(&json!({"agent": "reggie_oc", "prompt": prompt, "session_id": session, "correlation_id": "c"}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    fn runs(&self) -> usize {
        std::fs::read_to_string(self.dir.join("runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

/// Whether a process is running (a killed one may linger as a zombie until it is reaped).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
        .ok()
        .and_then(|stat| stat.rsplit(") ").next().map(|rest| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Counts its runs, keeps the prompt it saw, answers like `openclaw agent --json`.
const ECHO: &str = r#"echo run >> "$HOST_DIR/runs"
printf '%s' "$2" > "$HOST_DIR/prompt"
echo "some log line"
printf '{"payloads":[{"text":"done"}],"meta":{"agentMeta":{"sessionId":"%s"}}}\n' "$1""#;

#[tokio::test]
async fn a_turn_returns_the_engines_text_and_session_id_and_a_resumed_session_is_passed_through() {
    let host = Host::start(ECHO, 10).await;
    let (status, body) = host.run("turn:s:1", None, "hello").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "done");
    let session = body["session_id"].as_str().unwrap().to_string();
    assert!(!session.is_empty());
    let (_, body) = host.run("turn:s:2", Some(&session), "again").await;
    assert_eq!(
        body["session_id"],
        json!(session),
        "the engine was told to resume it"
    );
}

#[tokio::test]
async fn the_identitys_core_memory_is_prepended_to_the_prompt() {
    let host = Host::start(ECHO, 10).await;
    std::fs::write(
        host.dir.join("coreMEM-reggie.md"),
        "Reggie answers in one line.",
    )
    .unwrap();
    host.run("turn:s:1", None, "what's up?").await;
    let seen = std::fs::read_to_string(host.dir.join("prompt")).unwrap();
    assert_eq!(seen, "Reggie answers in one line.\n\n---\n\nwhat's up?");
}

#[tokio::test]
async fn the_same_idempotency_key_runs_the_engine_once_also_at_once_and_across_a_restart() {
    let host = Host::start(&format!("sleep 0.3\n{ECHO}"), 10).await;
    let (a, b) = tokio::join!(
        host.run("turn:s:1", None, "hi"),
        host.run("turn:s:1", None, "hi")
    );
    assert_eq!((a.0, b.0), (200, 200));
    assert_eq!(a.1, b.1, "the waiting call got the running call's answer");
    assert_eq!(host.runs(), 1);
    let host = host.restart(10).await;
    let (status, again) = host.run("turn:s:1", None, "hi").await;
    assert_eq!(status, 200);
    assert_eq!(again, a.1, "answered from disk after the restart");
    assert_eq!(host.runs(), 1, "the engine ran again");
}

#[tokio::test]
async fn two_calls_for_one_engine_session_never_overlap() {
    let host = Host::start(
        &format!(
            "echo start >> \"$HOST_DIR/trace\"\nsleep 0.3\necho end >> \"$HOST_DIR/trace\"\n{ECHO}"
        ),
        10,
    )
    .await;
    let (a, b) = tokio::join!(
        host.run("turn:s:1", Some("eng-1"), "one"),
        host.run("turn:s:2", Some("eng-1"), "two")
    );
    assert_eq!((a.0, b.0), (200, 200));
    let trace = std::fs::read_to_string(host.dir.join("trace")).unwrap();
    assert_eq!(trace, "start\nend\nstart\nend\n");
}

#[tokio::test]
async fn a_hung_engine_is_killed_at_the_timeout_children_and_all() {
    let host = Host::start(
        r#"sleep 300 &
echo $! > "$HOST_DIR/child"
sleep 300"#,
        1,
    )
    .await;
    let (status, body) = host.run("turn:s:1", None, "hi").await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error"]["code"], "engine_timeout");
    let child = std::fs::read_to_string(host.dir.join("child")).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!alive(&child), "the engine's child outlived the timeout");
}

#[tokio::test]
async fn a_cancelled_call_answers_cancelled_and_so_does_its_retry() {
    let host = Host::start(
        r#"sleep 300 &
echo $! > "$HOST_DIR/child"
sleep 300"#,
        60,
    )
    .await;
    let running = host.run("turn:s:1", None, "hi");
    let cancel = async {
        while !host.dir.join("child").exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        reqwest::Client::new()
            .delete(format!("{}/run/turn:s:1", host.url))
            .bearer_auth("runner-secret")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let ((status, body), cancelled) = tokio::join!(running, cancel);
    assert_eq!(cancelled, 202);
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (409, json!("cancelled"))
    );
    let (status, _) = host.run("turn:s:1", None, "hi").await;
    assert_eq!(status, 409, "a cancelled key stays cancelled");
    let child = std::fs::read_to_string(host.dir.join("child")).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!alive(&child), "the engine's child outlived the cancel");
}

#[tokio::test]
async fn bad_calls_get_clear_errors() {
    let host = Host::start(ECHO, 10).await;
    let post = |auth: Option<&str>, key: Option<&str>, body: Value| {
        let mut r = reqwest::Client::new()
            .post(format!("{}/run", host.url))
            .json(&body);
        if let Some(a) = auth {
            r = r.bearer_auth(a);
        }
        if let Some(k) = key {
            r = r.header("Idempotency-Key", k);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    let ok = json!({"agent": "reggie_oc", "prompt": "hi", "session_id": null});
    assert_eq!(post(None, Some("k"), ok.clone()).await, 401);
    assert_eq!(post(Some("wrong"), Some("k"), ok.clone()).await, 401);
    assert_eq!(post(Some("runner-secret"), None, ok.clone()).await, 400);
    assert_eq!(
        post(
            Some("runner-secret"),
            Some("k"),
            json!({"agent": "nobody", "prompt": "hi"})
        )
        .await,
        404
    );
    assert_eq!(host.runs(), 0);
}

#[tokio::test]
async fn an_engine_that_fails_or_floods_its_output_fails_the_turn_clearly() {
    // What the engine printed stays on the host (the runner's log, the run's stderr file):
    // the caller may pass the error on to the person or the API's client.
    let host = Host::start(
        "echo 'model quota exceeded for key sk-live-0123456789 in /home/agent/.openclaw' >&2\nexit 3",
        10,
    )
    .await;
    let (status, body) = host.run("turn:s:1", None, "hi").await;
    assert_eq!(status, 502);
    assert_eq!(body["error"]["code"], "engine_failed");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("exit status: 3"), "{body}");
    for leaked in ["sk-live", "quota", "/home/agent"] {
        assert!(!body.to_string().contains(leaked), "{leaked} in {body}");
    }
    // Nor when the answer comes from the kept outcome.
    let (status, again) = host.run("turn:s:1", None, "hi").await;
    assert_eq!((status, &again), (502, &body));

    // An engine whose output has no answer: its output is not echoed either.
    let host = Host::start("echo 'Traceback: secret-db-password=hunter2'", 10).await;
    let (status, body) = host.run("turn:s:1", None, "hi").await;
    assert_eq!(status, 502);
    assert!(!body.to_string().contains("hunter2"), "{body}");

    let host = Host::start("head -c 100000 /dev/zero | tr '\\0' 'x'", 10).await;
    let (status, body) = host.run("turn:s:1", None, "hi").await;
    assert_eq!(status, 502);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cut at 4096 bytes"),
        "{body}"
    );
}

#[tokio::test]
async fn a_host_at_its_limit_of_runs_answers_busy_and_runs_nothing_more() {
    let dir = std::env::temp_dir().join(format!("sb-runner-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("engine.sh"),
        format!("#!/bin/sh\nsleep 1\n{ECHO}\n"),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(dir.join("engine.sh"))
        .status()
        .unwrap();
    let mut config = Host::config(&dir, 10);
    config.max_running = 1;
    let router = Runner::new(config)
        .unwrap()
        .supervised_by(env!("CARGO_BIN_EXE_switchboard-runner"))
        .router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let host = Host {
        dir,
        url,
        server: tokio::spawn(async {}),
    };
    let (a, b) = tokio::join!(host.run("turn:s:1", Some("e1"), "one"), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        host.run("turn:t:1", Some("e2"), "two").await
    });
    assert_eq!(a.0, 200);
    assert_eq!((b.0, b.1["error"]["code"].clone()), (429, json!("busy")));
    assert_eq!(host.runs(), 1);
}

#[test]
fn kept_outcomes_older_than_the_retention_are_removed() {
    let dir = std::env::temp_dir().join(format!("sb-store-{}", uuid::Uuid::new_v4().simple()));
    let store = switchboard_runner::store::ResultStore::open(&dir).unwrap();
    store
        .put("k", &switchboard_runner::store::Outcome::Cancelled)
        .unwrap();
    assert_eq!(store.prune(Duration::from_secs(3_600)).unwrap(), 0);
    assert!(store.get("k").unwrap().is_some());
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(store.prune(Duration::from_millis(10)).unwrap(), 1);
    assert!(store.get("k").unwrap().is_none());
}

#[tokio::test]
async fn the_engine_finds_its_turn_token_and_the_api_url_in_its_environment_and_nowhere_else() {
    // What the engine sees: its environment, and its own command line (as `ps` shows it).
    let host = Host::start(
        &format!(
            "printf '%s' \"$SWITCHBOARD_TURN_TOKEN\" > \"$HOST_DIR/token\"\n\
             printf '%s' \"$SWITCHBOARD_API_URL\" > \"$HOST_DIR/api_url\"\n\
             tr '\\0' ' ' < /proc/$$/cmdline > \"$HOST_DIR/cmdline\"\n\
             tr '\\0' ' ' < /proc/$PPID/cmdline >> \"$HOST_DIR/cmdline\"\n\
             cp -r \"$(tr '\\0' '\\n' < /proc/$PPID/cmdline | tail -n 1)\" \"$HOST_DIR/rundir\"\n{ECHO}"
        ),
        10,
    )
    .await;
    let token = "sbt_eyJhbGciOiJIUzI1NiJ9.a-turn-token.signature";
    let r = reqwest::Client::new()
        .post(format!("{}/run", host.url))
        .bearer_auth("runner-secret")
        .header("Idempotency-Key", "turn:s:1")
        .json(&json!({
            "agent": "reggie_oc", "prompt": "hello", "session_id": null, "correlation_id": "c",
            "turn_token": token, "api_url": "http://gateway.example:8080",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = |name: &str| std::fs::read_to_string(host.dir.join(name)).unwrap();
    assert_eq!(seen("token"), token);
    assert_eq!(seen("api_url"), "http://gateway.example:8080");
    let cmdline = seen("cmdline");
    assert!(cmdline.contains("engine.sh"), "{cmdline}");
    assert!(
        !cmdline.contains("a-turn-token"),
        "the token is on the command line: {cmdline}"
    );
    assert!(cmdline.contains("supervise"), "{cmdline}");
    // Nor in the run's folder (spec.json, the prompt, the supervisor's log) on the host's disk,
    // as it was while the engine ran.
    let files = walk(&host.dir.join("rundir"));
    assert!(files.iter().any(|f| f.ends_with("spec.json")), "{files:?}");
    for entry in files.into_iter().chain(walk(&host.dir.join("state"))) {
        let text = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains("a-turn-token"),
            "the token was written to {}",
            entry.display()
        );
    }

    // A call without one: the engine has none (none left over from the runner's own).
    let (status, _) = host.run("turn:s:2", None, "again").await;
    assert_eq!(status, 200);
    assert_eq!(seen("token"), "");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
