//! Protobuf payloads generated from `proto/switchboard/v1/*.proto`.
#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/switchboard.v1.rs"));

impl Turn {
    /// The text an agent started this turn with (`POST /api/v1/outbound`), if it is such a
    /// turn rather than a message the person sent.
    pub fn agent_started_text(&self) -> Option<&str> {
        self.message
            .as_ref()
            .and_then(|m| m.inbound.as_ref())
            .map(|i| i.outbound_text.as_str())
            .filter(|t| !t.is_empty())
    }
}
