//! An agent host: the real runner service (`services/runner`) in this process, in front of an
//! engine script, for the tests that cross the runner's HTTP contract for real.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use switchboard_runner::config::{AgentConfig, EngineConfig, PromptVia};
use switchboard_runner::{Runner, RunnerConfig};

/// A fresh host directory holding `engine.sh` (`script`, run as
/// `engine.sh <session id> <prompt>` with `HOST_DIR` set to the directory); agent `reggie_oc`
/// runs it. The engine answers like `openclaw agent --json`.
pub fn agent_host(script: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sb-host-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("engine.sh"), script).unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(dir.join("engine.sh"))
        .status()
        .unwrap();
    dir
}

/// The runner's configuration for a host made by [`agent_host`] (bearer `runner-token`).
pub fn runner_config(dir: &Path) -> RunnerConfig {
    RunnerConfig {
        token: Some("runner-token".into()),
        state_dir: dir.join("state"),
        core_memory_dir: dir.to_path_buf(),
        engines: BTreeMap::from([(
            "script".to_string(),
            EngineConfig {
                command: vec![
                    dir.join("engine.sh").to_string_lossy().into_owned(),
                    "{session_id}".into(),
                    "{prompt}".into(),
                ],
                prompt_via: PromptVia::Arg,
                text_path: "/payloads/0/text".into(),
                session_id_path: "/meta/agentMeta/sessionId".into(),
                env: BTreeMap::from([("HOST_DIR".into(), dir.to_string_lossy().into_owned())]),
                ..Default::default()
            },
        )]),
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

/// The `switchboard-runner` binary next to the test binaries (`make test` builds it first): the
/// runner runs each engine under it (`switchboard-runner supervise`).
pub fn runner_bin() -> PathBuf {
    let bin = std::env::current_exe()
        .expect("test binary path")
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .join("switchboard-runner");
    assert!(
        bin.exists(),
        "{} is missing: `make test` builds it first (cargo build --bins)",
        bin.display()
    );
    bin
}

/// Serve the runner of host `dir` on `addr` (again after a restart: the same address).
pub async fn serve_runner(dir: &Path, addr: std::net::SocketAddr) -> tokio::task::JoinHandle<()> {
    let router = Runner::new(runner_config(dir))
        .unwrap()
        .supervised_by(runner_bin())
        .router();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    })
}
