//! Protobuf payloads generated from `proto/switchboard/v1/*.proto`.
#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/switchboard.v1.rs"));

impl Turn {
    /// The turn's answer when it was given without the agent (`outbound_text`: a message the
    /// agent started, or one Switchboard answered itself).
    pub fn given_answer(&self) -> Option<&str> {
        self.inbound()
            .map(|i| i.outbound_text.as_str())
            .filter(|t| !t.is_empty())
    }

    /// Whether the turn is a message the person sent (not one the agent started: that has an
    /// answer and no text; a blank SMS with only a picture has neither, and is the person's).
    pub fn person_said_something(&self) -> bool {
        self.inbound()
            .is_some_and(|i| !i.text.is_empty() || i.outbound_text.is_empty())
    }

    fn inbound(&self) -> Option<&InboundMessage> {
        self.message.as_ref().and_then(|m| m.inbound.as_ref())
    }
}
