//! Protobuf payloads generated from `proto/switchboard/v1/*.proto`.
#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/switchboard.v1.rs"));

/// The `proto/` schemas as a `FileDescriptorSet` (protobuf-encoded), for decoding a payload by
/// its `Sb-Type` name without the generated types.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/switchboard.fds.bin"));

/// `Reply.kind` of a heartbeat's answer that said nothing needs attention: logged, not sent.
pub const HEARTBEAT_OK_KIND: &str = "heartbeat_ok";

impl InboundMessage {
    /// A message the agent started (`POST /api/v1/outbound`, or a code Switchboard texts): its
    /// answer is given and the person said nothing. Not one the person sent, so it is not
    /// numbered among theirs, not announced as received, and not logged inbound.
    pub fn is_agent_started(&self) -> bool {
        self.text.is_empty() && !self.outbound_text.is_empty()
    }

    /// Words the person wrote: not a message the agent started, nor a scheduled input.
    pub fn is_from_person(&self) -> bool {
        !self.is_agent_started() && self.scheduled.is_empty()
    }
}

impl SummaryDue {
    /// The dedupe id of a due item: the same for every publisher (the summary worker's sweeper,
    /// the session stage on a reset) that sees the same newest unsummarised message and summary
    /// version; a new one once a version was written (a run that merged only part of what was
    /// due must not make the next item a duplicate).
    pub fn dedupe_id(memory_key: &str, newest: &uuid::Uuid, version: i64) -> String {
        format!("{memory_key}:{newest}:v{version}")
    }
}

impl Turn {
    /// The turn's answer when it was given without the agent (`outbound_text`: a message the
    /// agent started, or one Switchboard answered itself).
    pub fn given_answer(&self) -> Option<&str> {
        self.inbound()
            .map(|i| i.outbound_text.as_str())
            .filter(|t| !t.is_empty())
    }

    /// Whether the turn is a message the person sent (a blank SMS with only a picture is), not
    /// one the agent started.
    pub fn person_said_something(&self) -> bool {
        self.inbound().is_some_and(|i| !i.is_agent_started())
    }

    fn inbound(&self) -> Option<&InboundMessage> {
        self.message.as_ref().and_then(|m| m.inbound.as_ref())
    }
}
