//! Switchboard with the real runner service (`services/runner`) in front of an engine: the
//! contract dispatch relies on, end to end.
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchboard_e2e::runner_host::{agent_host, serve_runner};
use switchboard_e2e::{AppOptions, spawn_app_with};
use switchboard_kit::config::Secret;

const PERSON: &str = "+14155550197";
const WAIT: Duration = Duration::from_secs(40);

/// An engine that takes a while: it notes when it starts and ends, and answers like
/// `openclaw agent --json`.
const SLOW_ENGINE: &str = r#"#!/bin/sh
echo start >> "$HOST_DIR/runs"
sleep 3
echo end >> "$HOST_DIR/runs"
printf '{"payloads":[{"text":"done after a while"}],"meta":{"agentMeta":{"sessionId":"%s"}}}\n' "$1""#;

fn lines(dir: &Path, what: &str) -> usize {
    std::fs::read_to_string(dir.join("runs"))
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == what)
        .count()
}

async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_dispatcher_killed_during_a_runner_call_retries_it_and_the_engine_runs_once_even_across_a_runner_restart()
 {
    let dir = agent_host(SLOW_ENGINE);
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let server = serve_runner(&dir, addr).await;

    let url = format!("http://{addr}");
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(move |c| {
            c.agents[0].runner_url = url;
            c.agents[0].token = Secret::new("runner-token");
        }),
        ..AppOptions::dispatch_as_processes()
    })
    .await;
    let mut first = app.spawn_worker("dispatch");
    app.send_sms(PERSON, "hello").await;
    until("the engine to start", || lines(&dir, "start") == 1).await;
    // The dispatcher dies mid-call; the engine goes on and its outcome is kept.
    first.kill().await.unwrap();
    until("the engine to finish", || lines(&dir, "end") == 1).await;
    // The agent host restarts too.
    server.abort();
    let _ = server.await;
    let _server = serve_runner(&dir, addr).await;

    let _second = app.spawn_worker("dispatch");
    let sent = app.wait_for_sms(1, WAIT).await;
    assert_eq!(sent[0].body, "done after a while");
    app.settle().await;
    assert_eq!(lines(&dir, "start"), 1, "the engine ran twice for one turn");
    assert_eq!(app.twilio.sent().len(), 1);
    app.shutdown().await;
}

/// An engine that fails, printing what only the agent host's operator should see.
const LEAKY_ENGINE: &str = r#"#!/bin/sh
echo "fatal: OPENAI_API_KEY=sk-live-7f3a9c rejected; see /home/agent/.openclaw/logs" >&2
exit 3"#;

#[tokio::test]
async fn a_failed_engines_output_and_the_runners_address_never_reach_the_apis_caller() {
    let dir = agent_host(LEAKY_ENGINE);
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let _server = serve_runner(&dir, addr).await;
    let url = format!("http://{addr}");
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(move |c| {
            c.agents[0].runner_url = url;
            c.agents[0].token = Secret::new("runner-token");
            c.runtime.max_deliver = 2;
        }),
        ..Default::default()
    })
    .await;
    let key = app.api_key("crm", &[]).await;
    let sent = app
        .post_api_message(&key, json!({"agent": "reggie_oc", "text": "hello"}), None)
        .await;
    assert_eq!(sent.status(), 202);
    let sent: Value = sent.json().await.unwrap();
    let correlation_id = sent["correlation_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        let r: Value = app
            .get_api_message(&key, &correlation_id)
            .await
            .json()
            .await
            .unwrap();
        if r["status"] != "pending" || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status["status"], "failed", "{status}");
    let error = status["error"].as_str().unwrap_or_default();
    assert!(!error.is_empty(), "{status}");
    // What a caller may be told: that the agent's engine failed, and the correlation id to
    // ask the operator about.
    assert!(error.contains("502 engine_failed"), "{status}");
    assert_eq!(status["correlation_id"], json!(correlation_id));
    for leaked in [
        "sk-live",
        "/home/agent",
        "OPENAI_API_KEY",
        &addr.to_string(),
    ] {
        assert!(!status.to_string().contains(leaked), "{leaked} in {status}");
    }
    app.shutdown().await;
}
