//! `runner.toml` (path from `--config` or `SB_RUNNER_CONFIG`; `SB_RUNNER_…` variables override
//! keys, nested ones joined by `__`).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct RunnerConfig {
    pub listen: String,
    /// Bearer token callers must present (empty: none; only on a private network).
    pub token: Option<String>,
    /// Outcomes by Idempotency-Key, kept across restarts.
    pub state_dir: PathBuf,
    /// Where `coreMEM-<identity>.md` files are read from (prepended to every prompt).
    pub core_memory_dir: PathBuf,
    pub max_prompt_bytes: usize,
    /// Each of stdout and stderr is kept up to this much; the rest is drained and dropped.
    pub max_output_bytes: usize,
    /// Default timeout of a run; an engine may set its own.
    pub timeout_s: u64,
    /// Runs at once on this host; a call beyond it is answered 429 (Switchboard waits and
    /// tries again, without using up the turn's failure budget).
    pub max_running: usize,
    /// Kept outcomes older than this are removed (at start and every hour). Keep it longer
    /// than any turn can take to be retried.
    pub keep_results_days: u64,
    pub engines: BTreeMap<String, EngineConfig>,
    pub agents: BTreeMap<String, AgentConfig>,
    /// `[telemetry]`: OTLP export of each run's spans, in the trace of the turn that called.
    pub telemetry: switchboard_trace::TelemetryConfig,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8090".into(),
            token: None,
            state_dir: PathBuf::from("runner-state"),
            core_memory_dir: PathBuf::from("."),
            max_prompt_bytes: 1024 * 1024,
            max_output_bytes: 4 * 1024 * 1024,
            timeout_s: 600,
            max_running: 64,
            keep_results_days: 7,
            engines: BTreeMap::new(),
            agents: BTreeMap::new(),
            telemetry: Default::default(),
        }
    }
}

/// How an engine CLI is run for one turn.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct EngineConfig {
    /// The command as a list; `{session_id}`, `{prompt}`, `{prompt_file}`, `{workspace}` and
    /// `{agent}` are replaced in each element.
    pub command: Vec<String>,
    /// How the prompt reaches the engine: `arg` (via `{prompt}`), `file` (`{prompt_file}`) or
    /// `stdin`.
    pub prompt_via: PromptVia,
    /// JSON pointer to the reply text in the engine's JSON output (e.g. `/payloads/0/text`).
    pub text_path: String,
    /// JSON pointer to the engine session id (e.g. `/meta/agentMeta/sessionId`); when absent
    /// from the output, the id the run was started with.
    pub session_id_path: String,
    /// JSON pointer to a tool-call count, if the engine reports one.
    pub tool_calls_path: String,
    pub timeout_s: Option<u64>,
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the session's workspace when given).
    pub cwd: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptVia {
    #[default]
    Arg,
    File,
    Stdin,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct AgentConfig {
    pub engine: String,
    /// The persona (`reggie` for `reggie_oc`): names its core memory file.
    pub identity: String,
}

impl RunnerConfig {
    pub fn load(path: &Path) -> Result<Self, Box<figment::Error>> {
        let config: RunnerConfig = Figment::from(Serialized::defaults(RunnerConfig::default()))
            .merge(Toml::file(path))
            .merge(Env::prefixed("SB_RUNNER_").split("__").ignore(&["config"]))
            .extract()
            .map_err(Box::new)?;
        Ok(config)
    }
}
