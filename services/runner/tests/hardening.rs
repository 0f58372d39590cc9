//! The runner as shipped (deploy/runner/runner.toml, deploy/compose/runner.toml), as an
//! attacker on the network or another user of the agent host would try it.
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard_runner::{Runner, RunnerConfig};

const RUNNER: &str = env!("CARGO_BIN_EXE_switchboard-runner");

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sb-{what}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `switchboard-runner --config <file>` as the docs start it (the state folder moved to a
/// temporary one); its exit status and stderr, or `None` if it was still running after 10 s
/// (then it is killed).
fn start_runner(config: &Path, env: &[(&str, &str)]) -> Option<(i32, String)> {
    let state = temp_dir("runner-state");
    let mut cmd = Command::new(RUNNER);
    cmd.arg("--config")
        .arg(config)
        .env_remove("SB_RUNNER_TOKEN")
        .env_remove("SB_RUNNER_LISTEN")
        .env("SB_RUNNER_STATE_DIR", &state)
        .env("SB_RUNNER_CORE_MEMORY_DIR", &state)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
            return Some((status.code().unwrap_or(-1), stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    None
}

#[test]
fn the_shipped_runner_toml_refuses_to_start_reachable_with_its_placeholder_token() {
    // As the docs say: `switchboard-runner --config runner.toml`, the template unchanged
    // (listen 0.0.0.0:8090, token "change-me").
    let (code, stderr) = start_runner(&repo_file("deploy/runner/runner.toml"), &[])
        .expect("the template's runner started and kept serving on 0.0.0.0 with token change-me");
    assert_ne!(code, 0);
    assert!(
        stderr.contains("`token`") && stderr.contains("openssl rand -hex 32"),
        "the refusal names the key and how to make one: {stderr}"
    );
    // Compose's, with the placeholder of deploy/compose/env.example, and with none at all.
    for token in [Some("change-me-runner"), None] {
        let env: Vec<(&str, &str)> = token.map(|t| ("SB_RUNNER_TOKEN", t)).into_iter().collect();
        let (code, stderr) = start_runner(&repo_file("deploy/compose/runner.toml"), &env)
            .expect("compose's runner started reachable with a weak token");
        assert_ne!(code, 0, "{stderr}");
        assert!(stderr.contains("token"), "{stderr}");
    }
}

#[test]
fn the_template_on_loopback_starts_without_a_token_and_says_so() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap().to_string();
    drop(probe);
    // Loopback without a token: starts (local trying-out), warning about it.
    let state = temp_dir("runner-state").join("state");
    let mut child = Command::new(RUNNER)
        .arg("--config")
        .arg(repo_file("deploy/runner/runner.toml"))
        .env("SB_RUNNER_LISTEN", &addr)
        .env("SB_RUNNER_TOKEN", "")
        .env("SB_RUNNER_STATE_DIR", &state)
        .env("SB_RUNNER_CORE_MEMORY_DIR", &state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let up = loop {
        if std::net::TcpStream::connect(&addr).is_ok() {
            break true;
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(up, "the runner did not start on loopback: {log}");
    assert!(log.contains("no `token`"), "{log}");
    assert_eq!(
        std::fs::metadata(&state).unwrap().permissions().mode() & 0o077,
        0
    );
}

/// A runner with `config` in this process; its URL.
async fn serve(config: RunnerConfig) -> String {
    let router = Runner::new(config).unwrap().supervised_by(RUNNER).router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    url
}

async fn run(url: &str, prompt: &str) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/run"))
        .header("Idempotency-Key", "turn:s:1")
        .json(&json!({"agent": "reggie_oc", "prompt": prompt, "session_id": "sess-1"}))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or_default())
}

/// Stands in for `openclaw`: keeps its own command line (as `ps` shows it to every user), its
/// stdin, the file `--message-file` names, and the modes of its run's folder and files; then
/// answers as `openclaw agent --json` does.
const FAKE_OPENCLAW: &str = r#"#!/bin/sh
tr '\0' '\n' < /proc/$$/cmdline > "$HOST_DIR/argv"
cat > "$HOST_DIR/stdin"
session=""
while [ $# -gt 0 ]; do
  case "$1" in
    --message-file) cat "$2" > "$HOST_DIR/message"; shift ;;
    --session-id) session="$2"; shift ;;
  esac
  shift
done
rundir=$(tr '\0' '\n' < /proc/$PPID/cmdline | tail -n 1)
stat -c '%a %n' "$rundir" "$rundir"/* "$rundir/.." > "$HOST_DIR/modes"
printf '{"payloads":[{"text":"ok"}],"meta":{"agentMeta":{"sessionId":"%s"}}}\n' "$session""#;

#[tokio::test]
async fn the_shipped_engine_gets_the_prompt_off_its_command_line_and_its_run_folder_is_private() {
    let host = temp_dir("runner-host");
    let engine = host.join("openclaw");
    std::fs::write(&engine, FAKE_OPENCLAW).unwrap();
    std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut config = RunnerConfig::load(&repo_file("deploy/runner/runner.toml")).unwrap();
    config.state_dir = host.join("state");
    config.core_memory_dir = host.clone();
    config.token = None;
    let openclaw = config.engines.get_mut("openclaw").unwrap();
    openclaw.command[0] = engine.to_string_lossy().into_owned();
    openclaw
        .env
        .insert("HOST_DIR".into(), host.to_string_lossy().into_owned());
    let url = serve(config).await;

    let prompt = "Please wire the deposit for order 5521 to IBAN DE89370400440532013000";
    let (status, body) = run(&url, prompt).await;
    assert_eq!(status, 200, "{body}");
    let seen = |name: &str| std::fs::read_to_string(host.join(name)).unwrap();
    let argv = seen("argv");
    assert!(argv.contains("sess-1"), "{argv}");
    assert!(
        !argv.contains("IBAN"),
        "the prompt is on the engine's command line, readable by every user: {argv}"
    );
    assert_eq!(
        seen("message").trim_end(),
        prompt,
        "the engine got the prompt"
    );

    let modes = seen("modes");
    for line in modes.lines() {
        let (mode, path) = line.split_once(' ').unwrap();
        let mode = u32::from_str_radix(mode, 8).unwrap();
        assert_eq!(mode & 0o077, 0, "{path} is open to other users ({mode:o})");
    }
    assert!(modes.contains("/prompt"), "{modes}");
    // The kept outcome too.
    for entry in std::fs::read_dir(host.join("state/results")).unwrap() {
        let mode = entry.unwrap().metadata().unwrap().permissions().mode();
        assert_eq!(
            mode & 0o077,
            0,
            "a kept outcome is open to others ({mode:o})"
        );
    }
    for dir in ["state", "state/results", "state/runs"] {
        let mode = std::fs::metadata(host.join(dir))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{dir} is open to others ({mode:o})");
    }
}

#[tokio::test]
async fn composes_demo_engine_reads_the_prompt_from_its_file() {
    let host = temp_dir("runner-host");
    let mut config = RunnerConfig::load(&repo_file("deploy/compose/runner.toml")).unwrap();
    config.state_dir = host.join("state");
    config.core_memory_dir = host.clone();
    config.token = None;
    let demo = config.engines.get_mut("demo").unwrap();
    assert!(!demo.command.iter().any(|a| a.contains("{prompt}")));
    demo.command[0] = RUNNER.into();
    let url = serve(config).await;
    let (status, body) = run(&url, "hello from compose").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "(demo engine) You said: hello from compose");
}
