//! `[prompt]`: the envelope dispatch builds around each message.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `[prompt]`: the envelope dispatch builds around each message.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct PromptConfig {
    /// What the agent may do for each person type (`[prompt.authority]`: `user`, `staff`,
    /// `participant`, `external`, `system` (API callers), `schedule`; another type gets
    /// `external`'s).
    pub authority: BTreeMap<String, String>,
    /// The summary is cut to this many characters, with a marker saying so.
    pub max_summary_chars: usize,
    /// The person's message is cut to this many characters, with a marker saying so.
    pub max_message_chars: usize,
}

impl Default for PromptConfig {
    fn default() -> Self {
        let authority = [
            (
                "user",
                "Full: the person's own account and everything they are entitled to; act on their requests.",
            ),
            (
                "staff",
                "Standard: operations within their role; ask before anything irreversible.",
            ),
            (
                "participant",
                "Limited: their own participation only; share nothing about other people.",
            ),
            (
                "external",
                "Minimal: an unverified contact; general information only, nothing about any person or account.",
            ),
            (
                "system",
                "System: an integration calling with an API key, not a person; answer the request as asked, nothing about any person or account beyond what it names.",
            ),
            (
                "schedule",
                "Operator's heartbeat: about the people it lists, answered only to the person it reports to.",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Self {
            authority,
            max_summary_chars: 4_000,
            max_message_chars: 8_000,
        }
    }
}

impl PromptConfig {
    /// The authority text for a person type (unknown types get the least: `external`'s).
    pub fn authority_for(&self, person_type: &str) -> &str {
        self.authority
            .get(person_type)
            .or_else(|| self.authority.get("external"))
            .map(String::as_str)
            .unwrap_or("Minimal.")
    }
}
