//! `[[agents]]`, and `[channels.<channel>]`: the agent each channel's messages go to.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Secret;
use super::session::SessionScope;

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct ChannelConfig {
    pub default_agent: String,
    /// `[channels.<channel>.recipients]`: the agent a message written to one of our numbers
    /// goes to (`"+15555550198" = "reggie_fd"`), for a business with a number per agent;
    /// numbers compare by their digits. A message that names its agent (chat, API) keeps it.
    pub recipients: BTreeMap<String, String>,
}

impl ChannelConfig {
    /// The agent for a message written to `recipient`: the one its number is given, else the
    /// channel's default.
    pub fn agent_for(&self, recipient: &str) -> &str {
        let digits = |n: &str| n.chars().filter(char::is_ascii_digit).collect::<String>();
        let wanted = digits(recipient);
        self.recipients
            .iter()
            .find(|(number, _)| !wanted.is_empty() && digits(number) == wanted)
            .map_or(self.default_agent.as_str(), |(_, agent)| agent.as_str())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct AgentConfig {
    /// Engine variant, e.g. `reggie_oc`.
    pub name: String,
    /// Persona shared by the variants, e.g. `reggie`.
    pub identity: String,
    /// `openclaw`, `droid`, ...
    pub engine: String,
    pub runner_url: String,
    #[serde(default)]
    pub token: Secret,
    #[serde(default = "default_agent_timeout")]
    pub timeout_s: u64,
    /// Turns of this agent run at once across one dispatcher.
    #[serde(default = "default_agent_concurrency")]
    pub concurrency: usize,
    /// A message after a gap longer than this starts a fresh engine session (0: never).
    #[serde(default)]
    pub idle_reset_s: u64,
    /// A message after this local time passed since the person's last one starts a fresh
    /// engine session, e.g. `"04:00"` (empty: never).
    #[serde(default)]
    pub daily_reset: String,
    /// The IANA time zone `daily_reset` is read in, e.g. `"Europe/London"`.
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    /// `/new` and `/reset` start a fresh engine session (false: they go to the agent as text).
    #[serde(default = "default_true")]
    pub reset_commands: bool,
    /// What happens to messages that arrive while one of the session's turns runs.
    #[serde(default)]
    pub queue_mode: QueueMode,
    /// Before a reset, run one silent turn asking the agent to write what it must keep into
    /// `memory.md` (its reply is logged, never sent).
    #[serde(default = "default_true")]
    pub memory_flush: bool,
    /// What one session of this agent spans (unset: `session.scope`), e.g. `"main"` for a
    /// front-desk agent everyone talks to in one session beside private ones. The engine
    /// variants of one identity must agree: they share its memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<SessionScope>,
}

/// Why an agent's reset rules cannot be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error("agent {agent}: daily_reset {value:?} is not a time like \"04:00\"")]
    DailyReset { agent: String, value: String },
    #[error("agent {agent}: time_zone {value:?} is not an IANA time zone like \"Europe/London\"")]
    TimeZone { agent: String, value: String },
}

impl AgentConfig {
    /// `daily_reset` in its `time_zone` (none when `daily_reset` is empty), or why not.
    pub fn daily_reset_at(
        &self,
    ) -> Result<Option<(chrono::NaiveTime, chrono_tz::Tz)>, PolicyError> {
        let zone: chrono_tz::Tz =
            self.time_zone
                .trim()
                .parse()
                .map_err(|_| PolicyError::TimeZone {
                    agent: self.name.clone(),
                    value: self.time_zone.clone(),
                })?;
        match self.daily_reset.trim() {
            "" => Ok(None),
            t => chrono::NaiveTime::parse_from_str(t, "%H:%M")
                .map(|at| Some((at, zone)))
                .map_err(|_| PolicyError::DailyReset {
                    agent: self.name.clone(),
                    value: self.daily_reset.clone(),
                }),
        }
    }

    /// The scope of this agent's sessions: its own, else the default (`session.scope`).
    pub fn scope_or(&self, default: SessionScope) -> SessionScope {
        self.scope.unwrap_or(default)
    }
}

/// `[[agents]] queue_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueMode {
    /// Each message is its own turn, in order.
    #[default]
    Followup,
    /// Messages that arrived while a turn ran are joined into the next turn, in order.
    Collect,
    /// A new message cancels the running call at the runner; the next turn carries both.
    Interrupt,
}

impl QueueMode {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueMode::Followup => "followup",
            QueueMode::Collect => "collect",
            QueueMode::Interrupt => "interrupt",
        }
    }

    /// Whether the session's waiting messages are joined into one runner call.
    pub fn joins(self) -> bool {
        self != QueueMode::Followup
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            identity: String::new(),
            engine: String::new(),
            runner_url: String::new(),
            token: Secret::default(),
            timeout_s: default_agent_timeout(),
            concurrency: default_agent_concurrency(),
            idle_reset_s: 0,
            daily_reset: String::new(),
            time_zone: default_time_zone(),
            reset_commands: true,
            queue_mode: QueueMode::Followup,
            memory_flush: true,
            scope: None,
        }
    }
}

fn default_agent_timeout() -> u64 {
    120
}
fn default_agent_concurrency() -> usize {
    16
}
fn default_time_zone() -> String {
    "UTC".into()
}
fn default_true() -> bool {
    true
}
