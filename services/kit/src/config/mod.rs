//! Configuration: `switchboard.toml` (or the file named by `SB_CONFIG`), overridden by `SB_…`
//! environment variables with nested keys joined by `__` (e.g. `SB_TWILIO__API_BASE`).
//!
//! One file per owner of a part of the file (a service, a provider, the worker runtime); this
//! one holds the top level, loading and the checks made at load. Every type is re-exported here,
//! so `config::AgentConfig` and the like name them wherever they live.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

mod agents;
mod chat;
mod dispatch;
mod escalation;
mod gateway;
mod identity;
/// Public so that `lib.rs` can keep it at `memory_config`, the path the memory crates name.
pub mod memory;
mod prompt;
mod retention;
mod runtime;
mod schedules;
mod secret;
mod session;
mod sms;
mod wakeups;
mod webhooks;

pub use agents::{AgentConfig, ChannelConfig, PolicyError, QueueMode};
pub use chat::ChatConfig;
pub use dispatch::{DispatchConfig, StaleTurns};
pub use escalation::EscalationConfig;
pub use gateway::{ApiConfig, GatewayConfig, RateLimitConfig};
pub use identity::{
    ContactKind, IdentityConfig, IdentityLookup, LinkProofConfig, ProofSmsProvider, SmsSender,
};
pub use memory::{
    CategoriseConfig, CategoryLabel, DEFAULT_IVFFLAT_PROBES, EmbeddingConfig, EmbeddingProvider,
    LlmConfig, LocalRuntime, MAX_IVFFLAT_PROBES, MemoryConfig, RecallConfig, SummaryConfig,
};
pub use prompt::PromptConfig;
pub use retention::RetentionConfig;
pub use runtime::{AdminConfig, RuntimeConfig, StageOverrides};
pub use schedules::{ScheduleConfig, ScheduleKind};
pub use secret::{ProviderSections, Secret, SecretUrl};
pub use session::{ResetNotices, SessionConfig, SessionScope, WorkspaceConfig};
pub use sms::{TextMagicConfig, TwilioConfig};
pub use wakeups::WakeupsConfig;
pub use webhooks::{WebhookSourceConfig, valid_source_name};

/// `Debug` shows `nats_url` and `database_url` without their passwords.
/// How a process writes its logs (to stderr): lines for people, or JSON for a log pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Config {
    pub nats_url: SecretUrl,
    pub database_url: SecretUrl,
    /// Prefix of every subject and stream. Production uses the default `sb`; tests use their own
    /// so that many runs share one NATS server.
    pub subject_prefix: String,
    /// `text` or `json`.
    pub log_format: LogFormat,
    pub gateway: GatewayConfig,
    pub admin: AdminConfig,
    pub twilio: TwilioConfig,
    pub textmagic: TextMagicConfig,
    pub chat: ChatConfig,
    pub api: ApiConfig,
    pub rate_limit: RateLimitConfig,
    /// `[webhooks.<source>]`: the sources that may post to `/webhooks/generic/<source>`.
    pub webhooks: BTreeMap<String, WebhookSourceConfig>,
    pub channels: BTreeMap<String, ChannelConfig>,
    /// `[providers.<name>]`: the settings of a channel adapter that reads its own
    /// ([`Config::provider_settings`]), so that a new channel needs no section here. Twilio
    /// and TextMagic keep their sections above.
    pub providers: ProviderSections,
    pub agents: Vec<AgentConfig>,
    pub identity: IdentityConfig,
    pub runtime: RuntimeConfig,
    pub session: SessionConfig,
    pub dispatch: DispatchConfig,
    pub workspace: WorkspaceConfig,
    pub prompt: PromptConfig,
    /// `[[schedules]]`: inputs agents get on a timetable.
    pub schedules: Vec<ScheduleConfig>,
    /// `[stages.<name>]`: per-stage overrides of the runtime knobs (the stage runtime's).
    pub stages: BTreeMap<String, StageOverrides>,
    pub demo: DemoConfig,
    pub readers: ReadersConfig,
    pub console: ConsoleConfig,
    pub llm: memory::LlmConfig,
    pub embedding: memory::EmbeddingConfig,
    pub summary: memory::SummaryConfig,
    pub categorise: memory::CategoriseConfig,
    pub recall: memory::RecallConfig,
    pub memory: memory::MemoryConfig,
    /// `[telemetry]`: OTLP export of each turn's trace (off unless `otlp_endpoint` is set).
    pub telemetry: switchboard_trace::TelemetryConfig,
    /// `[retention]`: how long finished rows are kept.
    pub retention: RetentionConfig,
    /// `[wakeups]`: the wake-ups agents schedule for themselves.
    pub wakeups: WakeupsConfig,
    /// `[escalation]`: the labels that ask for a person to step in.
    pub escalation: EscalationConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            nats_url: "nats://127.0.0.1:14222".into(),
            database_url: "postgres://switchboard@127.0.0.1:15432/switchboard".into(),
            subject_prefix: "sb".into(),
            log_format: LogFormat::Text,
            gateway: GatewayConfig::default(),
            admin: AdminConfig::default(),
            twilio: TwilioConfig::default(),
            textmagic: TextMagicConfig::default(),
            chat: ChatConfig::default(),
            api: ApiConfig::default(),
            rate_limit: RateLimitConfig::default(),
            webhooks: BTreeMap::new(),
            channels: [
                "sms",
                "admin_chat",
                "header_widget",
                "api",
                "webhook",
                "telegram",
                "slack",
                "whatsapp",
            ]
            .into_iter()
            .map(|channel| {
                let default_agent = "reggie_oc".into();
                (
                    channel.to_string(),
                    ChannelConfig {
                        default_agent,
                        ..Default::default()
                    },
                )
            })
            .collect(),
            providers: ProviderSections::default(),
            agents: Vec::new(),
            identity: IdentityConfig::default(),
            runtime: RuntimeConfig::default(),
            session: SessionConfig::default(),
            dispatch: DispatchConfig::default(),
            workspace: WorkspaceConfig::default(),
            prompt: PromptConfig::default(),
            schedules: Vec::new(),
            stages: BTreeMap::new(),
            demo: DemoConfig::default(),
            readers: ReadersConfig::default(),
            console: ConsoleConfig::default(),
            llm: Default::default(),
            embedding: Default::default(),
            summary: Default::default(),
            categorise: Default::default(),
            recall: Default::default(),
            memory: Default::default(),
            telemetry: Default::default(),
            retention: RetentionConfig::default(),
            wakeups: WakeupsConfig::default(),
            escalation: EscalationConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct DemoConfig {
    /// `switchboard up` also serves a demo runner (`/demo/runner`) and a demo Twilio outbox
    /// (`/demo/twilio`), so the product can be tried with no external accounts.
    pub enabled: bool,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct ConsoleConfig {
    /// The ops console (`/console` on the gateway's admin address) takes an API key with the
    /// scopes it shows. Set roles here to also take a JWT signed with the chat key
    /// (`chat.jwt_secret` / `chat.jwt_public_key`) whose `role` is one of them and whose `aud`
    /// is `jwt_audience`: an operator signed in by your own login. Empty (the default): API
    /// keys only, so no chat user's token opens the console.
    pub jwt_roles: Vec<String>,
    /// The `aud` a console JWT must carry; required with `jwt_roles`, and not the chat's
    /// (`chat.jwt_audience`), so a chat token never signs in to the console.
    pub jwt_audience: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct ReadersConfig {
    /// The embedded stack's folder (`.stack/run`) whose NATS users `switchboard readers`
    /// manages; found by itself next to `make run`'s stack. Unset elsewhere: `readers add`
    /// prints the user's entry for your own nats.conf (deploy/README.md).
    pub local_stack: Option<std::path::PathBuf>,
}

/// Merge `SB_…` variables with their scalar values kept as written. Figment's `Env` reads
/// `SB_TWILIO__FROM_NUMBER=+61400000000` as an integer, which a string field then refuses; here
/// it stays text, and lossy extraction turns text into a number or flag only where a field wants
/// one. Arrays and tables (`SB_X='[1, 2]'`) are still parsed; a quoted value loses its quotes.
fn merge_env_as_text(mut figment: Figment, env: Env) -> Figment {
    use figment::value::Value;
    for (key, raw) in env.iter() {
        let parsed: Value = raw.parse().expect("parsing a Value is infallible");
        let value = match parsed {
            Value::Num(..) | Value::Bool(..) | Value::Char(..) | Value::Empty(..) => {
                Value::from(raw)
            }
            other => other,
        };
        // `agents.0.token` (SB_AGENTS__0__TOKEN): a field of an element of an array the file
        // has. Merged as a pair it would make `agents` a map and fail the whole load.
        if let Some((array, index, rest)) = indexed(key.as_str())
            && let Ok(Value::Array(tag, mut items)) = figment.find_value(array)
            && let Some(item) = items.get_mut(index)
        {
            set_at(item, &rest, value);
            figment = figment.merge((array.to_string(), Value::Array(tag, items)));
            continue;
        }
        // A `(key path, value)` pair is a provider that nests the value at `a.b.c`.
        figment = figment.merge((key.as_str().to_string(), value));
    }
    figment
}

/// `a.b.3.c.d` → (`a.b`, 3, [`c`, `d`]): the path of the array, the index and the rest.
fn indexed(key: &str) -> Option<(&str, usize, Vec<&str>)> {
    let mut start = 0;
    for segment in key.split('.') {
        if start > 0
            && let Ok(index) = segment.parse::<usize>()
        {
            let rest = key[start + segment.len()..]
                .trim_start_matches('.')
                .split('.')
                .filter(|s| !s.is_empty())
                .collect();
            return Some((&key[..start - 1], index, rest));
        }
        start += segment.len() + 1;
    }
    None
}

/// Set `value` at `path` within `item` (a table; missing tables on the way are made).
fn set_at(item: &mut figment::value::Value, path: &[&str], value: figment::value::Value) {
    use figment::value::{Dict, Value};
    let Some((first, rest)) = path.split_first() else {
        *item = value;
        return;
    };
    if !matches!(item, Value::Dict(..)) {
        *item = Value::from(Dict::new());
    }
    if let Value::Dict(_, dict) = item {
        let child = dict
            .entry(first.to_string())
            .or_insert_with(|| Value::from(Dict::new()));
        set_at(child, rest, value);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    /// A value the product cannot run with: where it is (`agents.reggie_oc`, `webhooks.crm`,
    /// `providers.toy`) and why.
    #[error("invalid configuration: {key}: {reason}")]
    Invalid { key: String, reason: String },
}

impl ConfigError {
    pub fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

impl Config {
    /// The file named by `SB_CONFIG`, else `switchboard.toml` in the working directory (if any),
    /// overridden by `SB_…` variables.
    pub fn load() -> Result<Self, ConfigError> {
        let path = std::env::var_os("SB_CONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("switchboard.toml"));
        Self::load_from(&path)
    }

    pub fn load_from(path: &Path) -> Result<Self, ConfigError> {
        let figment = merge_env_as_text(
            Figment::from(Serialized::defaults(Config::default())).merge(Toml::file(path)),
            Env::prefixed("SB_").split("__").ignore(&["config"]),
        );
        // Lossy: a value the environment gave as text becomes the number or flag a field needs.
        let config: Config = figment.extract_lossy().map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    /// The settings of the adapter of `provider` (`[providers.<provider>]`, an absent section
    /// read as an empty one), or why they cannot be read, naming the section.
    pub fn provider_settings<T: serde::de::DeserializeOwned>(
        &self,
        provider: &str,
    ) -> Result<T, ConfigError> {
        let section = self.providers.0.get(provider).cloned().unwrap_or_default();
        // Lossy as the whole file is read: `SB_PROVIDERS__<NAME>__<KEY>` values come as text.
        Figment::from(Serialized::defaults(section))
            .extract_lossy()
            .map_err(|e| ConfigError::invalid(format!("providers.{provider}"), e.to_string()))
    }

    /// Set `[providers.<provider>]` to `settings` (what a deployment tool or a test writes).
    pub fn set_provider_settings(
        &mut self,
        provider: &str,
        settings: &impl Serialize,
    ) -> Result<(), ConfigError> {
        let invalid = |why: String| ConfigError::invalid(format!("providers.{provider}"), why);
        match figment::value::Value::serialize(settings).map_err(|e| invalid(e.to_string()))? {
            figment::value::Value::Dict(_, section) => {
                self.providers.0.insert(provider.to_string(), section);
                Ok(())
            }
            _ => Err(invalid("settings must be a table".into())),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashSet::new();
        for a in &self.agents {
            if a.name.is_empty() || a.identity.is_empty() || a.runner_url.is_empty() {
                return Err(ConfigError::invalid(
                    format!("agents.{}", a.name),
                    "an agent needs name, identity and runner_url",
                ));
            }
            a.daily_reset_at()
                .map_err(|e| ConfigError::invalid(format!("agents.{}", a.name), e.to_string()))?;
            if !seen.insert(a.name.as_str()) {
                return Err(ConfigError::invalid(
                    format!("agents.{}", a.name),
                    "listed twice",
                ));
            }
        }
        // Variants of one identity share its memory key, so they must share its scope.
        for a in &self.agents {
            if let Some(b) = self.agents.iter().find(|b| {
                b.identity == a.identity
                    && b.scope_or(self.session.scope) != a.scope_or(self.session.scope)
            }) {
                return Err(ConfigError::invalid(
                    format!("agents.{}.scope", a.name),
                    format!(
                        "the engine variants of identity {:?} share its memory, so they need one \
                         session scope: {} has {:?}, {} has {:?}",
                        a.identity,
                        a.name,
                        a.scope_or(self.session.scope).as_str(),
                        b.name,
                        b.scope_or(self.session.scope).as_str()
                    ),
                ));
            }
        }
        for (channel, c) in &self.channels {
            for (number, agent) in &c.recipients {
                if self.agent(agent).is_none() {
                    return Err(ConfigError::invalid(
                        format!("channels.{channel}.recipients"),
                        format!("{number} goes to agent {agent:?}, which is not configured"),
                    ));
                }
            }
        }
        for (name, source) in &self.webhooks {
            let invalid = |why: &str| Err(ConfigError::invalid(format!("webhooks.{name}"), why));
            if !valid_source_name(name) {
                return invalid("a source name is 1 to 64 ASCII letters, digits, '-' or '_'");
            }
            for (key, path) in [
                ("sender_field", &source.sender_field),
                ("text_field", &source.text_field),
                ("id_field", &source.id_field),
            ] {
                if path.is_empty() || path.split('.').any(str::is_empty) {
                    return invalid(&format!("{key} must be a dotted path like user.id"));
                }
            }
            if !source.agent.is_empty() && self.agent(&source.agent).is_none() {
                return invalid(&format!("agent {:?} is not configured", source.agent));
            }
            if source.timestamp_window_s == 0 {
                return invalid("timestamp_window_s must be > 0");
            }
            if source.signing_key().is_none() {
                return invalid(&format!(
                    "secret is required (or SB_WEBHOOKS__{}__SECRET)",
                    name.to_ascii_uppercase()
                ));
            }
        }
        let proof = &self.identity.proof;
        if proof.enabled && (proof.code_ttl_s == 0 || proof.codes_per_hour == 0) {
            return Err(ConfigError::invalid(
                "identity.proof",
                "code_ttl_s and codes_per_hour must be > 0 (or enabled = false)",
            ));
        }
        if proof.enabled && !proof.sms_template.contains("{code}") {
            return Err(ConfigError::invalid(
                "identity.proof.sms_template",
                "must contain {code}",
            ));
        }
        let mut names = std::collections::HashSet::new();
        for s in &self.schedules {
            let invalid =
                |why: String| Err(ConfigError::invalid(format!("schedules.{}", s.name), why));
            if !valid_source_name(&s.name) || !names.insert(s.name.as_str()) {
                return invalid("each needs a unique name of letters, digits, '-' or '_'".into());
            }
            if self.agent(&s.agent).is_none() {
                return invalid(format!("agent {:?} is not configured", s.agent));
            }
            if s.person.trim().is_empty() == s.people.trim().is_empty() {
                return invalid("give either person or people (a query), not both".into());
            }
            if s.text.trim().is_empty() {
                return invalid("text is empty".into());
            }
            match (s.kind, s.deliver_to.trim().is_empty()) {
                (ScheduleKind::Heartbeat, true) => {
                    return invalid(
                        "a heartbeat needs deliver_to: the person (id) its answer is sent to"
                            .into(),
                    );
                }
                (ScheduleKind::Person, false) => {
                    return invalid(
                        "deliver_to is for kind = \"heartbeat\"; a person schedule answers \
                         each person"
                            .into(),
                    );
                }
                _ => {}
            }
            if let Err(why) = s.timetable() {
                return invalid(why);
            }
        }
        if let Err(why) = self.memory.daily_notes_tz() {
            return Err(ConfigError::invalid("memory.daily_notes_timezone", why));
        }
        if let Err(why) = self.wakeups.tz() {
            return Err(ConfigError::invalid("wakeups.time_zone", why));
        }
        if self.wakeups.max_ahead_days > 36_500 {
            return Err(ConfigError::invalid(
                "wakeups.max_ahead_days",
                "at most 36500 (100 years)",
            ));
        }
        if !self.console.jwt_roles.is_empty() {
            let audience = self.console.jwt_audience.trim();
            if audience.is_empty() {
                return Err(ConfigError::invalid(
                    "console.jwt_audience",
                    "required with console.jwt_roles: the aud your login puts in console \
                     tokens (not the chat's), so a chat token cannot sign in to the console",
                ));
            }
            if audience == self.chat.jwt_audience.trim() {
                return Err(ConfigError::invalid(
                    "console.jwt_audience",
                    "must differ from chat.jwt_audience, or every chat token would sign in to \
                     the console",
                ));
            }
        }
        if let Some(unknown) = self
            .escalation
            .labels
            .iter()
            .find(|l| !self.categorise.labels.iter().any(|c| &c.name == *l))
        {
            return Err(ConfigError::invalid(
                "escalation.labels",
                format!(
                    "{unknown:?} is not one of [categorise] labels, so no exchange could get it"
                ),
            ));
        }
        if self.runtime.turn_partitions == 0 {
            return Err(ConfigError::invalid(
                "runtime.turn_partitions",
                "must be > 0",
            ));
        }
        // JetStream keeps at most 5 copies of a stream.
        if !(1..=5).contains(&self.runtime.stream_replicas) {
            return Err(ConfigError::invalid(
                "runtime.stream_replicas",
                "must be from 1 to 5 (1 on a single NATS server, 3 on a three-node cluster)",
            ));
        }
        if !(1..=memory::MAX_IVFFLAT_PROBES).contains(&self.embedding.ivfflat_probes) {
            return Err(ConfigError::invalid(
                "embedding.ivfflat_probes",
                format!(
                    "must be from 1 to {} (pgvector's range)",
                    memory::MAX_IVFFLAT_PROBES
                ),
            ));
        }
        Ok(())
    }

    /// This configuration for a process serving the gateway: its Postgres pool is
    /// `gateway.db_pool_size` unless `runtime.db_pool_size` is set.
    pub fn for_gateway(mut self) -> Self {
        if self.runtime.db_pool_size == 0 {
            self.runtime.db_pool_size = self.gateway.db_pool_size.max(1);
        }
        self
    }

    pub fn agent(&self, name: &str) -> Option<&AgentConfig> {
        self.agents.iter().find(|a| a.name == name)
    }
}

#[cfg(test)]
mod reference_tests;
#[cfg(test)]
mod tests;
