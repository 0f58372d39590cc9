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
    /// Where the runner listens. Anything but a loopback address needs a strong `token`.
    pub listen: String,
    /// Bearer token callers must present. Required, at least 32 characters and random (`openssl
    /// rand -hex 32`), unless `listen` is a loopback address: whoever holds it runs the engine,
    /// with its tools, on any prompt.
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
    /// How the prompt reaches the engine: `file` (`{prompt_file}`, a file only the runner's user
    /// reads), `stdin`, or `arg` (via `{prompt}`: on the command line, which every user of the
    /// host sees in `ps`; warned about at start).
    pub prompt_via: PromptVia,
    /// JSON pointer to the reply text in the engine's JSON output (e.g. `/payloads/0/text`).
    pub text_path: String,
    /// JSON pointer to the engine session id (e.g. `/meta/agentMeta/sessionId`); when absent
    /// from the output, the id the run was started with.
    pub session_id_path: String,
    /// JSON pointer to a tool-call count, if the engine reports one.
    pub tool_calls_path: String,
    /// JSON pointer to the names of the tools the engine called (an array of strings), if it
    /// reports them (OpenClaw: `/meta/toolSummary/tools`). Names only, never arguments.
    pub tool_names_path: String,
    pub timeout_s: Option<u64>,
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the session's workspace when given).
    pub cwd: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptVia {
    Arg,
    #[default]
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

/// The shortest bearer token a runner on a non-loopback address accepts.
pub const MIN_TOKEN_CHARS: usize = 32;

/// Why the runner refuses to start with a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "listen = {listen:?} is reachable from other hosts but `token` is not set: anyone who \
         reaches the port would run the agent's engine, with its tools, on any prompt. Set \
         `token` (or SB_RUNNER_TOKEN) to a random value, e.g. `openssl rand -hex 32`, the same \
         as Switchboard's [[agents]] token, or listen on 127.0.0.1 behind a TLS proxy or tunnel \
         (docs/runner.md)"
    )]
    NoToken { listen: String },
    #[error(
        "listen = {listen:?} is reachable from other hosts and `token` is {why}: set `token` \
         (or SB_RUNNER_TOKEN) to a random value of at least {MIN_TOKEN_CHARS} characters, e.g. \
         `openssl rand -hex 32`, the same as Switchboard's [[agents]] token (docs/runner.md)"
    )]
    WeakToken { listen: String, why: &'static str },
    #[error("`listen` = {0:?} is not a host:port address")]
    BadListen(String),
    #[error(
        "engine {engine:?}: its command has {{prompt}} but prompt_via is not \"arg\" (the \
         prompt would be empty); use {{prompt_file}} with prompt_via = \"file\", or stdin"
    )]
    PromptPlaceholder { engine: String },
}

/// Why `token` is too weak to guard a reachable runner, if it is.
pub fn token_weakness(token: &str) -> Option<&'static str> {
    let lower = token.to_ascii_lowercase();
    // The template's placeholder and its likes: a token someone copied without changing it.
    const PLACEHOLDERS: [&str; 9] = [
        "change-me",
        "changeme",
        "change_me",
        "replace",
        "example",
        "placeholder",
        "secret",
        "password",
        "token",
    ];
    if PLACEHOLDERS.iter().any(|p| lower.contains(p)) {
        return Some("a placeholder");
    }
    if token.chars().count() < MIN_TOKEN_CHARS {
        return Some("too short");
    }
    // `aaaa…`, `abab…`: long but guessable. Random hex of 32 characters has ~14 distinct.
    let mut distinct: Vec<char> = token.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 8 {
        return Some("too repetitive to be random");
    }
    None
}

/// Whether `listen` (`host:port`) only takes connections from this host.
pub fn is_loopback(listen: &str) -> Result<bool, ConfigError> {
    if let Ok(addr) = listen.parse::<std::net::SocketAddr>() {
        return Ok(addr.ip().is_loopback());
    }
    let (host, port) = listen
        .rsplit_once(':')
        .ok_or_else(|| ConfigError::BadListen(listen.to_string()))?;
    if port.parse::<u16>().is_err() || host.is_empty() {
        return Err(ConfigError::BadListen(listen.to_string()));
    }
    // A name other than localhost may resolve to anything: taken as reachable.
    Ok(host.eq_ignore_ascii_case("localhost"))
}

impl RunnerConfig {
    /// Refuse a configuration that would serve the engine to anyone: a non-loopback `listen`
    /// without a strong `token`; and one whose engine would get an empty prompt. What is
    /// allowed but worth saying comes back as warnings (no token on loopback; a prompt on
    /// the command line).
    pub fn check(&self) -> Result<Vec<String>, ConfigError> {
        let mut warnings = Vec::new();
        let token = self.token.as_deref().filter(|t| !t.is_empty());
        if is_loopback(&self.listen)? {
            if token.is_none() {
                warnings.push(format!(
                    "no `token`: any local user of this host can call the runner on {} \
                     (fine for trying it out; set one, e.g. `openssl rand -hex 32`)",
                    self.listen
                ));
            }
        } else {
            let listen = self.listen.clone();
            match token {
                None => return Err(ConfigError::NoToken { listen }),
                Some(t) => {
                    if let Some(why) = token_weakness(t) {
                        return Err(ConfigError::WeakToken { listen, why });
                    }
                }
            }
        }
        for (name, engine) in &self.engines {
            let has_prompt = engine.command.iter().any(|a| a.contains("{prompt}"));
            if engine.prompt_via == PromptVia::Arg {
                warnings.push(format!(
                    "engine {name:?} gets the prompt on its command line, which every user of \
                     this host can read (ps, /proc): use prompt_via = \"file\" with \
                     {{prompt_file}}, or \"stdin\""
                ));
            } else if has_prompt {
                return Err(ConfigError::PromptPlaceholder {
                    engine: name.clone(),
                });
            }
        }
        Ok(warnings)
    }

    pub fn load(path: &Path) -> Result<Self, Box<figment::Error>> {
        let config: RunnerConfig = Figment::from(Serialized::defaults(RunnerConfig::default()))
            .merge(Toml::file(path))
            .merge(Env::prefixed("SB_RUNNER_").split("__").ignore(&["config"]))
            .extract()
            .map_err(Box::new)?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(listen: &str, token: Option<&str>) -> RunnerConfig {
        RunnerConfig {
            listen: listen.into(),
            token: token.map(str::to_string),
            ..Default::default()
        }
    }

    const STRONG: &str = "3f9c0e5a7b21d84c6e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d";

    #[test]
    fn a_reachable_runner_needs_a_strong_token() {
        for listen in [
            "0.0.0.0:8090",
            "[::]:8090",
            "10.0.0.5:8090",
            "agent-host:8090",
        ] {
            assert!(matches!(
                with(listen, None).check(),
                Err(ConfigError::NoToken { .. })
            ));
            assert!(matches!(
                with(listen, Some("")).check(),
                Err(ConfigError::NoToken { .. })
            ));
            for weak in [
                "change-me",
                "change-me-runner",
                "CHANGEME0000000000000000000000000000000",
                "short-but-random-9f8e7d",
                "abababababababababababababababababababab",
                "my-runner-token-that-is-long-enough-for-sure",
            ] {
                assert!(
                    matches!(
                        with(listen, Some(weak)).check(),
                        Err(ConfigError::WeakToken { .. })
                    ),
                    "{weak} on {listen}"
                );
            }
            assert!(with(listen, Some(STRONG)).check().unwrap().is_empty());
        }
    }

    #[test]
    fn a_loopback_runner_starts_without_a_token_and_says_so() {
        for listen in ["127.0.0.1:8090", "[::1]:8090", "localhost:8090"] {
            let warnings = with(listen, None).check().unwrap();
            assert!(warnings[0].contains("no `token`"), "{warnings:?}");
            assert!(with(listen, Some("dev")).check().unwrap().is_empty());
        }
        assert!(matches!(
            with("8090", None).check(),
            Err(ConfigError::BadListen(_))
        ));
    }

    #[test]
    fn a_prompt_on_the_command_line_is_warned_about_and_an_empty_one_refused() {
        let mut config = with("127.0.0.1:8090", Some("dev"));
        let engine = |via| EngineConfig {
            command: vec!["engine".into(), "--message".into(), "{prompt}".into()],
            prompt_via: via,
            ..Default::default()
        };
        config.engines.insert("e".into(), engine(PromptVia::Arg));
        assert!(config.check().unwrap()[0].contains("command line"));
        config.engines.insert("e".into(), engine(PromptVia::File));
        assert!(matches!(
            config.check(),
            Err(ConfigError::PromptPlaceholder { .. })
        ));
    }
}
