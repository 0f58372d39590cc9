//! `[session]`: what a session spans, the arrival order it keeps, the notices of its resets; and
//! `[workspace]`: the folder each session gets.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct SessionConfig {
    /// What one session (per agent) spans; see [`SessionScope`].
    pub scope: SessionScope,
    /// How often a message waiting for its sender's previous message re-checks while held.
    pub arrival_poll_ms: u64,
    /// How long a waiting message is held in its handler before it goes back to the stream.
    /// Short on purpose: a held message occupies a handler slot, and under a backlog (after a
    /// NATS restart, say) the messages it waits for may be queued behind it.
    pub arrival_hold_ms: u64,
    /// Longest delay before a waiting message that went back to the stream is tried again; the
    /// delay doubles from `arrival_poll_ms` with each try.
    pub arrival_retry_max_ms: u64,
    /// How long a message waits for a missing predecessor at most, counted while the
    /// session stage runs (time it was down does not count); then it takes its turn anyway.
    /// A predecessor is missing for long only when it never got published (a gateway died
    /// between numbering and publishing it and the provider never retried); a crashed worker's
    /// message comes back after `runtime.ack_wait_ms`, so keep this well above that.
    pub arrival_gap_timeout_ms: u64,
    /// What the person is told, ahead of the next reply, when their session started over.
    pub reset_notices: ResetNotices,
}

/// `[session.reset_notices]`: one text per reason a session starts a fresh engine session. A
/// reset is never silent: the next reply starts with its text.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct ResetNotices {
    /// The person sent `/new` or `/reset`.
    pub command: String,
    /// The session had been idle longer than the agent's `idle_reset_s`.
    pub idle: String,
    /// The agent's daily reset time passed.
    pub daily: String,
    /// An operator reset it (sessions API).
    pub api: String,
}

impl Default for ResetNotices {
    fn default() -> Self {
        Self {
            command: "New conversation started.".into(),
            idle: "(We're starting a new conversation: the last one had been quiet for a while.)"
                .into(),
            daily: "(We're starting a new conversation: conversations start fresh each day.)"
                .into(),
            api: "(We're starting a new conversation: this one was reset by an operator.)".into(),
        }
    }
}

impl ResetNotices {
    pub fn for_reason(&self, reason: crate::status::ResetReason) -> &str {
        use crate::status::ResetReason::*;
        match reason {
            Command => &self.command,
            Idle => &self.idle,
            Daily => &self.daily,
            Api => &self.api,
        }
    }
}

/// What one session of an agent spans (`session.scope`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SessionScope {
    /// One session per person and agent, whatever the channel (the default): a person who
    /// texts and then chats continues the same conversation.
    #[default]
    Person,
    /// One per person, agent and channel (`sms`, `admin_chat`, …).
    Channel,
    /// One per person, agent, channel and the account they wrote to (our number, say).
    AccountChannel,
    /// One session per agent, shared by everyone who writes to it.
    Main,
}

impl SessionScope {
    /// The name configuration gives it (`person`, `channel`, `account-channel`, `main`).
    pub fn as_str(self) -> &'static str {
        match self {
            SessionScope::Person => "person",
            SessionScope::Channel => "channel",
            SessionScope::AccountChannel => "account-channel",
            SessionScope::Main => "main",
        }
    }

    /// The readable key of the session a message belongs to, e.g. `reggie_oc:person:staff:17`.
    pub fn key(
        self,
        agent: &str,
        person_type: &str,
        person_id: &str,
        channel: &str,
        account: &str,
    ) -> String {
        match self {
            SessionScope::Person => format!("{agent}:person:{person_type}:{person_id}"),
            SessionScope::Channel => {
                format!("{agent}:channel:{channel}:{person_type}:{person_id}")
            }
            SessionScope::AccountChannel => {
                format!("{agent}:account-channel:{channel}:{account}:{person_type}:{person_id}")
            }
            SessionScope::Main => format!("{agent}:main"),
        }
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            scope: SessionScope::Person,
            arrival_poll_ms: 25,
            arrival_hold_ms: 250,
            arrival_retry_max_ms: 5_000,
            arrival_gap_timeout_ms: 120_000,
            reset_notices: ResetNotices::default(),
        }
    }
}

/// `[workspace]`: a folder per session on storage the agent hosts mount (`summary.md`,
/// `attachments/`, `exports/`, `context/`), its path sent to the runner with each turn.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct WorkspaceConfig {
    /// Where session folders are made (empty: no workspaces).
    pub root: String,
    /// The engine variants of one identity (`reggie_oc`, `reggie_fd`) share one person's
    /// folder (the first session's); false gives each session its own.
    pub separate_variants: bool,
    /// Media a person sends (MMS) larger than this is not kept in `attachments/`; a chat
    /// upload larger than this is refused (413).
    pub max_attachment_bytes: u64,
    /// A file the agent leaves in `exports/` larger than this is not sent (the reply says
    /// so). 5 MiB: the most Twilio takes in one MMS.
    pub max_export_bytes: u64,
    /// At most this many files of `exports/` go with one reply (Twilio takes 10 media in one
    /// message); the rest go with the next.
    pub max_exports_per_reply: usize,
    /// How long the person's links to a sent file work; the file's bytes are deleted then
    /// (what was sent is remembered, so an unchanged file is never sent twice).
    pub export_ttl_s: u64,
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        Self {
            root: String::new(),
            separate_variants: false,
            max_attachment_bytes: 10 * 1024 * 1024,
            max_export_bytes: 5 * 1024 * 1024,
            max_exports_per_reply: 10,
            export_ttl_s: 7 * 24 * 3_600,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_session_scope_gives_a_readable_key() {
        let key =
            |scope: SessionScope| scope.key("reggie_oc", "staff", "17", "sms", "+15555550199");
        assert_eq!(key(SessionScope::Person), "reggie_oc:person:staff:17");
        assert_eq!(key(SessionScope::Channel), "reggie_oc:channel:sms:staff:17");
        assert_eq!(
            key(SessionScope::AccountChannel),
            "reggie_oc:account-channel:sms:+15555550199:staff:17"
        );
        assert_eq!(key(SessionScope::Main), "reggie_oc:main");
        // The same person on two channels (texting, then chatting): one session under `person`,
        // two under `channel` and `account-channel`, one shared by all under `main`.
        let on = |scope: SessionScope, channel| scope.key("reggie_oc", "staff", "17", channel, "");
        assert_eq!(
            on(SessionScope::Person, "sms"),
            on(SessionScope::Person, "admin_chat")
        );
        assert_ne!(
            on(SessionScope::Channel, "sms"),
            on(SessionScope::Channel, "admin_chat")
        );
        assert_ne!(
            on(SessionScope::AccountChannel, "sms"),
            on(SessionScope::AccountChannel, "admin_chat")
        );
        assert_eq!(
            SessionScope::Main.key("reggie_oc", "staff", "17", "sms", ""),
            SessionScope::Main.key("reggie_oc", "external", "phone:+1", "api", "")
        );
        let parsed: SessionConfig =
            serde_json::from_value(serde_json::json!({"scope": "account-channel"})).unwrap();
        assert_eq!(parsed.scope, SessionScope::AccountChannel);
        assert!(
            serde_json::from_value::<SessionConfig>(serde_json::json!({"scope": "nope"})).is_err()
        );
    }
}
