//! The runner as a real process that crashes (SIGKILL) in the middle of a turn: the engine goes
//! on, the restarted runner adopts it, and the retried turn never runs the engine twice.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Generous bound for anything a loaded 2-core machine has to do here.
const WAIT: Duration = Duration::from_secs(40);

/// Notes each start (its pid, which leads its process group) and the child it starts, takes
/// `sleep_s`, answers like `openclaw agent --json`.
fn slow_engine(sleep_s: u64) -> String {
    format!(
        r#"#!/bin/sh
echo $$ >> "$HOST_DIR/starts"
sleep {sleep_s} &
echo $! > "$HOST_DIR/child"
wait
printf '{{"payloads":[{{"text":"done after a while"}}],"meta":{{"agentMeta":{{"sessionId":"%s"}}}}}}\n' "$1"
"#
    )
}

const KEY: &str = "turn:crash:1";

/// A runner process on a state folder and a port that outlive it; whatever it started is
/// killed when the test ends, passed or not.
struct Host {
    dir: PathBuf,
    port: u16,
    runner: Option<Child>,
}

/// A port below 32768 that is free now (a restarted runner must get the same one back).
fn free_port() -> u16 {
    let base = 20_000 + (uuid::Uuid::new_v4().as_u128() % 10_000) as u16;
    (0..500)
        .map(|i| 20_000 + (base - 20_000 + i * 7) % 10_000)
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("a free port in 20000..30000")
}

/// `/proc/<pid>/stat` past the command name: state, ppid, pgrp, …
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Whether a process is running (a killed one may linger as a zombie until it is reaped).
fn alive(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| f[0] != "Z" && f[0] != "X")
}

fn kill_group_of(pid: i32) {
    if let Some(pgrp) = stat_fields(pid).and_then(|f| f[2].parse::<i32>().ok())
        && pgrp > 1
    {
        // SAFETY: kill(2) on a process group; no memory is touched.
        unsafe {
            libc::kill(-pgrp, libc::SIGKILL);
        }
    }
}

impl Host {
    fn new(sleep_s: u64) -> Host {
        let dir = std::env::temp_dir().join(format!("sb-crash-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let engine = dir.join("engine.sh");
        std::fs::write(&engine, slow_engine(sleep_s)).unwrap();
        Command::new("chmod")
            .arg("+x")
            .arg(&engine)
            .status()
            .unwrap();
        let port = free_port();
        let q = |p: &Path| serde_json::to_string(&p.to_string_lossy()).unwrap();
        std::fs::write(
            dir.join("runner.toml"),
            format!(
                r#"listen = "127.0.0.1:{port}"
token = "crash-secret"
state_dir = {state}
core_memory_dir = {dir}
timeout_s = 60

[engines.script]
command = [{engine}, "{{session_id}}", "{{prompt}}"]
prompt_via = "arg"
text_path = "/payloads/0/text"
session_id_path = "/meta/agentMeta/sessionId"

[engines.script.env]
HOST_DIR = {dir}

[agents.reggie_oc]
engine = "script"
identity = "reggie"
"#,
                state = q(&dir.join("state")),
                dir = q(&dir),
                engine = q(&engine),
            ),
        )
        .unwrap();
        Host {
            dir,
            port,
            runner: None,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Start the runner process and wait until it answers.
    async fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("runner.log"))
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard-runner"));
        cmd.arg("--config").arg(self.dir.join("runner.toml"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SB_RUNNER") {
                cmd.env_remove(k);
            }
        }
        self.runner = Some(
            cmd.env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start switchboard-runner"),
        );
        let deadline = Instant::now() + WAIT;
        loop {
            let up = reqwest::get(format!("{}/healthz", self.url())).await;
            if up.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the runner did not come up: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL the runner (only the runner: not its process group).
    fn crash(&mut self) {
        let mut runner = self.runner.take().expect("a running runner");
        runner.kill().unwrap();
        runner.wait().unwrap();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("runner.log")).unwrap_or_default()
    }

    /// The pids of the engine's starts, in order.
    fn starts(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("starts"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    async fn until(&self, what: &str, check: impl Fn() -> bool) {
        let deadline = Instant::now() + WAIT;
        while !check() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn client() -> reqwest::Client {
        reqwest::Client::builder().timeout(WAIT).build().unwrap()
    }

    async fn run(&self) -> (u16, Value) {
        let r = Self::client()
            .post(format!("{}/run", self.url()))
            .bearer_auth("crash-secret")
            .header("Idempotency-Key", KEY)
            .json(&json!({"agent": "reggie_oc", "prompt": "hello", "session_id": "eng-1", "correlation_id": "c"}))
            .send()
            .await
            .expect("the runner answers");
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    /// The first call: it is cut when the runner dies, so nobody waits for its answer.
    /// Start the runner, call it, and SIGKILL it once the engine runs (the caller hangs up);
    /// the engine's pid.
    async fn crash_mid_turn(&mut self) -> i32 {
        self.start().await;
        let first = self.run_in_background();
        self.until("the engine to start", || self.starts().len() == 1)
            .await;
        self.crash();
        first.abort();
        self.starts()[0]
    }

    fn run_in_background(&self) -> tokio::task::JoinHandle<()> {
        let url = self.url();
        tokio::spawn(async move {
            let _ = Self::client()
                .post(format!("{url}/run"))
                .bearer_auth("crash-secret")
                .header("Idempotency-Key", KEY)
                .json(&json!({"agent": "reggie_oc", "prompt": "hello", "session_id": "eng-1", "correlation_id": "c"}))
                .send()
                .await;
        })
    }

    async fn metrics(&self) -> String {
        Self::client()
            .get(format!("{}/metrics", self.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut runner) = self.runner.take() {
            let _ = runner.kill();
            let _ = runner.wait();
        }
        let child = std::fs::read_to_string(self.dir.join("child"))
            .ok()
            .and_then(|c| c.trim().parse().ok());
        for pid in self.starts().into_iter().chain(child) {
            if alive(pid) {
                kill_group_of(pid);
            }
        }
    }
}

#[tokio::test]
async fn a_runner_killed_mid_turn_is_restarted_and_the_retried_turn_gets_the_first_runs_answer() {
    let mut host = Host::new(3);
    host.crash_mid_turn().await;
    host.start().await;

    let (status, body) = host.run().await;
    assert_eq!(status, 200, "{body} {}", host.log());
    assert_eq!(body["text"], "done after a while");
    assert_eq!(body["session_id"], "eng-1");
    assert_ne!(body["rerun"], json!(true), "{body}");
    assert_eq!(host.starts().len(), 1, "the engine ran twice for one turn");
    // Asked again: the kept answer.
    let (status, again) = host.run().await;
    assert_eq!((status, &again), (200, &body));
    assert_eq!(host.starts().len(), 1);
}

#[tokio::test]
async fn an_engine_that_died_with_its_runner_runs_again_and_the_answer_says_so() {
    let mut host = Host::new(3);
    // The whole host goes down (say a reboot): the runner, the engine and all it started.
    let engine = host.crash_mid_turn().await;
    kill_group_of(engine);
    host.until("the engine to die", || !alive(engine)).await;
    host.start().await;

    let (status, body) = host.run().await;
    assert_eq!(status, 200, "{body} {}", host.log());
    assert_eq!(body["text"], "done after a while");
    assert_eq!(body["rerun"], json!(true), "{body}");
    assert_eq!(host.starts().len(), 2, "the engine ran again");
    let metrics = host.metrics().await;
    assert!(
        metrics.lines().any(|l| l == "sb_runner_reruns_total 1"),
        "{metrics}"
    );
    assert!(host.log().contains(KEY), "the rerun is logged with its key");
}

#[tokio::test]
async fn a_turn_cancelled_after_a_runner_crash_kills_the_engine_it_left_running() {
    let mut host = Host::new(300);
    let engine = host.crash_mid_turn().await;
    host.start().await;
    assert!(alive(engine), "the engine outlives its runner");

    let cancelled = Host::client()
        .delete(format!("{}/run/{KEY}", host.url()))
        .bearer_auth("crash-secret")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(cancelled, 202, "{}", host.log());
    let child: i32 = std::fs::read_to_string(host.dir.join("child"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    host.until("the engine and its child to be killed", || {
        !alive(engine) && !alive(child)
    })
    .await;
    let (status, body) = host.run().await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (409, json!("cancelled")),
        "{body}"
    );
    assert_eq!(host.starts().len(), 1, "the cancelled turn ran again");
}
