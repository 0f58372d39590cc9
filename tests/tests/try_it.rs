//! The README's "Try it" for memory, as a new user runs it: `switchboard up` on the example
//! `switchboard.toml` (the demo runner and outboxes), driven by the `switchboard` CLI and the
//! REST API exactly as the README shows. Only the ports, the database, the subject prefix and
//! the workspace folder differ, so that it shares the test stack with other tests.
//!
//! What it proves is what the README promises a user will see: `/remember` answered without
//! the agent and in the next prompt (above the recalled earlier message, after a reset);
//! `switchboard search` finds a paraphrase and says how far behind the index is; `switchboard
//! analytics categories` counts the labelled exchanges; `switchboard forget` erases the person
//! and says what it removed, after which search finds nothing of them.
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use switchboard_e2e::{fresh_database, switchboard_bin, write_private};

/// The repository's root (the example configuration lives there).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// `switchboard up` (or the CLI) on the example configuration with this run's overrides, as
/// the README's `eval "$(target/debug/stack env run)"` gives them.
struct Demo {
    config: PathBuf,
    env: Vec<(String, String)>,
    gateway: String,
}

impl Demo {
    fn command(&self) -> Command {
        let mut cmd = Command::new(switchboard_bin());
        cmd.arg("--config").arg(&self.config);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SB_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Run one CLI command; its standard output (it must succeed).
    fn cli(&self, args: &[&str]) -> String {
        let Output {
            status,
            stdout,
            stderr,
        } = self
            .command()
            .args(args)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run the switchboard CLI");
        let (out, err) = (
            String::from_utf8_lossy(&stdout).into_owned(),
            String::from_utf8_lossy(&stderr).into_owned(),
        );
        assert!(status.success(), "switchboard {args:?} failed: {out}{err}");
        out
    }

    /// `switchboard sms send --from <from> --text <text>`: what it printed (the reply).
    fn text(&self, from: &str, text: &str) -> String {
        self.cli(&["sms", "send", "--from", from, "--text", text])
    }

    async fn last_prompt(&self) -> String {
        reqwest::get(format!("{}/demo/runner/last-prompt", self.gateway))
            .await
            .expect("the demo engine answers")
            .text()
            .await
            .expect("text")
    }
}

/// Poll `check` on the CLI's output of `args` until it holds (the memory workers run
/// asynchronously); panics with the last output after `timeout`.
fn wait_for(demo: &Demo, args: &[&str], timeout: Duration, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let out = demo.cli(args);
        if check(&out) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "switchboard {args:?} did not show it within {timeout:?}: {out}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// [`try_start_demo`] until it starts: a port picked free may be taken by another test's
/// process before `switchboard up` binds it (seen once in a full run: `up` exited, and the
/// other process answered `/readyz` on the admin port).
async fn start_demo(dir: &Path) -> (Demo, tokio::process::Child) {
    for _ in 0..3 {
        if let Some(started) = try_start_demo(dir).await {
            return started;
        }
    }
    panic!("switchboard up did not start three times (see its log above)");
}

/// `switchboard up` on the example configuration with free ports and a fresh database; `None`
/// when it exited instead of getting ready.
async fn try_start_demo(dir: &Path) -> Option<(Demo, tokio::process::Child)> {
    let port = || switchboard_kit::net::free_port("127.0.0.1").expect("a free port");
    let (http, admin) = (port(), port());
    let example =
        std::fs::read_to_string(repo().join("switchboard.toml")).expect("the example config");
    let config = dir.join("switchboard.toml");
    write_private(
        &config,
        &example
            .replace("127.0.0.1:8080", &format!("127.0.0.1:{http}"))
            .replace("127.0.0.1:8081", &format!("127.0.0.1:{admin}")),
    )
    .expect("write the configuration");
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} (the test stack's)"));
    let mut env = vec![
        ("SB_NATS_URL".to_string(), var("SB_NATS_URL")),
        (
            "SB_DATABASE_URL".to_string(),
            fresh_database(&var("SB_DATABASE_URL")).await,
        ),
        (
            "SB_SUBJECT_PREFIX".to_string(),
            format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        ),
        (
            "SB_WORKSPACE__ROOT".to_string(),
            dir.join("workspaces").display().to_string(),
        ),
    ];
    // The local embedder's files, as `stack env` gives them to `make run`.
    for var in [
        "SB_EMBEDDING__MODEL_DIR",
        "SB_EMBEDDING__ONNX_RUNTIME",
        "SB_EMBEDDING__ONNX_MODEL",
    ] {
        if let Ok(value) = std::env::var(var) {
            env.push((var.into(), value));
        }
    }
    let demo = Demo {
        config,
        env,
        gateway: format!("http://127.0.0.1:{http}"),
    };
    let mut up = tokio::process::Command::from(demo.command())
        .arg("up")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start switchboard up");
    ready(&mut up, http, admin).await.then_some((demo, up))
}

/// Wait until `up` answers `/readyz` on `admin` and its gateway listens on `http`; false when
/// it exited first (a port picked free was taken by another test's process before `up` bound
/// it: seen once in a full run).
async fn ready(up: &mut tokio::process::Child, http: u16, admin: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = up.try_wait() {
            eprintln!("switchboard up exited ({status}) before it was ready: trying other ports");
            return false;
        }
        let answered = reqwest::get(format!("http://127.0.0.1:{admin}/readyz"))
            .await
            .is_ok_and(|r| r.status().is_success());
        // Ours, not another process on a port it took: the gateway answers too.
        if answered
            && tokio::net::TcpStream::connect(("127.0.0.1", http))
                .await
                .is_ok()
        {
            return true;
        }
        assert!(
            Instant::now() < deadline,
            "switchboard up did not get ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_memory_walkthrough_works_as_written_on_the_example_configuration() {
    let dir = std::env::temp_dir().join(format!("sb-try-it-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let (demo, _up) = start_demo(&dir).await;
    let ana = "+14155550100";

    let reply = demo.text(ana, "When is my next shift?");
    assert!(
        reply.contains(r#"you said "When is my next shift?""#),
        "{reply}"
    );
    let reply = demo.text(ana, "/remember I can't work Sundays");
    assert!(
        reply.contains("Noted. I will remember: I can't work Sundays"),
        "answered without the agent: {reply}"
    );
    assert!(
        !demo.last_prompt().await.contains("/remember"),
        "the demo engine never saw /remember"
    );

    // Search by meaning: a paraphrase finds the question, and the answer says how far behind
    // the index is.
    let found = wait_for(
        &demo,
        &["search", "what time do I work tomorrow"],
        Duration::from_secs(60),
        |out| out.contains("When is my next shift?") && out.contains("(0 messages waiting"),
    );
    let first = found.lines().next().unwrap_or_default();
    assert!(
        first.contains("When is my next shift?"),
        "the paraphrase ranks the question first: {found}"
    );
    assert!(found.contains("index lag: "), "{found}");

    // A new conversation: the next prompt carries the curated memory, and the earlier question
    // recalled (the new engine session does not hold it).
    let reply = demo.text(ana, "/reset");
    assert!(reply.contains("New conversation started."), "{reply}");
    let reply = demo.text(ana, "What time do I work tomorrow?");
    assert!(reply.contains("Turn 1 of engine session"), "{reply}");
    let prompt = demo.last_prompt().await;
    let memory = prompt
        .find("I can't work Sundays")
        .unwrap_or_else(|| panic!("the prompt carries the curated memory: {prompt}"));
    let recalled = prompt
        .find("When is my next shift?")
        .unwrap_or_else(|| panic!("the prompt recalls the earlier question: {prompt}"));
    assert!(memory < recalled, "memory comes before recall: {prompt}");

    // Analytics: the labelled exchanges, per day, per person, per channel.
    let counts = wait_for(
        &demo,
        &["analytics", "categories"],
        Duration::from_secs(60),
        |out| out.contains(&format!("phone:{ana}")) && out.contains("sms"),
    );
    assert!(counts.contains("exchanges per label per day"), "{counts}");

    // The same through the REST API, with a key of the README's scopes.
    let key = demo.cli(&[
        "api-keys",
        "create",
        "--owner",
        "ops",
        "--scope",
        "search:read",
        "--scope",
        "analytics:read",
        "--scope",
        "memory:read",
        "--scope",
        "people:forget",
    ]);
    let key = key.trim();
    let http = reqwest::Client::new();
    let get = |path: &str| {
        http.get(format!("{}{path}", demo.gateway))
            .bearer_auth(key)
            .send()
    };
    let memory: serde_json::Value =
        get("/api/v1/people/phone:%2B14155550100/memory?identity=reggie")
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(memory["body"], "- I can't work Sundays", "{memory}");
    let hits: serde_json::Value = get("/api/v1/search?q=shift&limit=2")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(hits["hits"].as_array().map(Vec::len), Some(2), "{hits}");
    assert!(hits["index_lag_s"].is_number(), "{hits}");

    // Forget: what was removed per kind; afterwards nothing of them is found.
    let forgot = demo.cli(&["forget", &format!("phone:{ana}")]);
    assert!(forgot.contains(&format!("forgot phone:{ana}")), "{forgot}");
    for kind in ["messages", "message_vectors", "memories", "sessions"] {
        assert!(
            forgot.lines().any(|l| l.trim_start().starts_with(kind)),
            "{kind} removed: {forgot}"
        );
    }
    let after = demo.cli(&["search", "shift"]);
    assert!(after.contains("no messages found"), "{after}");
    let gone = http
        .delete(format!(
            "{}/api/v1/people/phone:%2B14155550100",
            demo.gateway
        ))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    // Asked again: the erasure that already ran, done (never an "unknown" hiding one that is not).
    assert_eq!(gone.status(), 200, "a forgotten person's erasure is done");
    let gone: serde_json::Value = gone.json().await.unwrap();
    assert_eq!(gone["status"], "done", "{gone}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's "Try it" commands, one per logical line (continuations joined, comments left
/// to the shell), with the gateway's port in place of 8080.
fn readme_try_it_lines(http_port: u16) -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = readme.split("## Try it").nth(1).expect("a Try it section");
    let block = section
        .split("```sh")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its shell block");
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in block.lines() {
        if pending.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        lines.push(pending.replace("127.0.0.1:8080", &format!("127.0.0.1:{http_port}")));
        pending.clear();
    }
    lines
}

/// `make run`'s first terminal in `checkout`: `switchboard up` with nothing set, on the
/// example configuration with free ports and subjects of its own; it and its gateway's port.
async fn up_in_bare_checkout(checkout: &Path) -> (tokio::process::Child, u16) {
    let example = std::fs::read_to_string(repo().join("switchboard.toml")).unwrap();
    let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    for _ in 0..3 {
        let port = || switchboard_kit::net::free_port("127.0.0.1").expect("a free port");
        let (http, admin) = (port(), port());
        write_private(
            &checkout.join("switchboard.toml"),
            &format!(
                "subject_prefix = \"{prefix}\"\n{}",
                example
                    .replace("127.0.0.1:8080", &format!("127.0.0.1:{http}"))
                    .replace("127.0.0.1:8081", &format!("127.0.0.1:{admin}"))
            ),
        )
        .unwrap();
        let mut up = Command::new(switchboard_bin());
        up.arg("up").current_dir(checkout).env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            up.env("PATH", path);
        }
        let mut up = tokio::process::Command::from(up)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start switchboard up");
        if ready(&mut up, http, admin).await {
            return (up, http);
        }
    }
    panic!("switchboard up did not start three times (see its log above)");
}

/// A second terminal of `checkout`: a shell with nothing of ours in its environment (no `SB_*`,
/// no `RUST_LOG`), only `KEY` once a line set it.
fn bare_shell(checkout: &Path, line: &str, key: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(line).current_dir(checkout).env_clear();
    for keep in ["PATH", "HOME", "LANG"] {
        if let Some(v) = std::env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
    if let Some(key) = key {
        cmd.env("KEY", key);
    }
    let out = cmd.output().expect("run bash");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_try_it_runs_line_by_line_from_a_bare_second_shell() {
    // A checkout with `make run`'s stack up: the stack's env file as it writes it (the test
    // stack's servers, a database of this test's own, the embedder's files), the example
    // configuration (its own ports and subjects), and the binary where the README runs it.
    let checkout =
        std::env::temp_dir().join(format!("sb-try-it-{}", uuid::Uuid::new_v4().simple()));
    let creds = checkout.join(".stack/run/credentials");
    std::fs::create_dir_all(&creds).unwrap();
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} (the test stack's)"));
    let mut env = format!(
        "export SB_NATS_URL={}\nexport SB_DATABASE_URL={}\n",
        var("SB_NATS_URL"),
        fresh_database(&var("SB_DATABASE_URL")).await
    );
    for key in [
        "SB_EMBEDDING__MODEL_DIR",
        "SB_EMBEDDING__ONNX_RUNTIME",
        "SB_EMBEDDING__ONNX_MODEL",
        "SB_EMBEDDING__STATIC_DIR",
    ] {
        if let Ok(value) = std::env::var(key) {
            env.push_str(&format!("export {key}='{value}'\n"));
        }
    }
    write_private(&creds.join("env"), &env).unwrap();
    std::fs::create_dir_all(checkout.join("target/debug")).unwrap();
    std::os::unix::fs::symlink(switchboard_bin(), checkout.join("target/debug/switchboard"))
        .unwrap();
    let (mut up, http) = up_in_bare_checkout(&checkout).await;

    let lines = readme_try_it_lines(http);
    assert_eq!(lines.len(), 12, "{lines:#?}");
    let mut key: Option<String> = None;
    let mut said = Vec::new();
    for line in &lines {
        let found_by_meaning = line.contains(" search ");
        let deadline = Instant::now() + Duration::from_secs(60);
        let (stdout, stderr) = loop {
            let run = if line.starts_with("KEY=") {
                format!("{line} && printf %s \"$KEY\"")
            } else {
                line.clone()
            };
            let (ok, stdout, stderr) = bare_shell(&checkout, &run, key.as_deref());
            assert!(ok, "{line}\n{stdout}{stderr}");
            // The memory workers run beside the reply: the README's search waits for them.
            if !found_by_meaning || stdout.contains("Sundays") || Instant::now() > deadline {
                break (stdout, stderr);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        assert!(
            !stderr.contains(" INFO ") && !stderr.contains("\"level\":\"INFO\""),
            "a command logs nothing below WARN unless asked: {line}\n{stderr}"
        );
        if line.starts_with("KEY=") {
            key = Some(stdout.clone());
        }
        said.push(stdout);
    }
    let expect = |i: usize, needle: &str| {
        assert!(
            said[i].contains(needle),
            "{} printed {:?}, not {needle:?}",
            lines[i],
            said[i]
        );
    };
    expect(
        0,
        r#"you said "Hello Reggie". Turn 1 of engine session demo-"#,
    );
    expect(1, "by textmagic");
    expect(1, "Turn 2 of engine session demo-");
    expect(2, "Hello from the dashboard");
    expect(
        3,
        "reply to telegram:424242: reggie_oc (demo engine): you said \"Hello from Telegram\"",
    );
    expect(
        4,
        "reply to slack:T0DEMO001:U0ANA0001: reggie_oc (demo engine): you said \"Hello from Slack\"",
    );
    assert!(
        key.as_deref().is_some_and(|k| k.starts_with("sb_")),
        "{key:?}"
    );
    expect(6, r#""status":"answered""#);
    expect(7, "I will remember: I can't work Sundays");
    expect(8, "Sundays");
    assert!(!said[8].contains("ranked by words only"), "{}", said[8]);
    expect(9, "reggie");
    assert_eq!(said[10].lines().count(), 5, "{}", said[10]);
    for event in said[10].lines() {
        serde_json::from_str::<serde_json::Value>(event).expect("a JSON line");
    }
    expect(11, "forgot phone:+14155550100");
    let _ = up.kill().await;
    let _ = std::fs::remove_dir_all(&checkout);
}
