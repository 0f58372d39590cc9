//! The states rows move through, as the database stores them (`TEXT` columns with a `CHECK`),
//! so that handlers match on enums instead of comparing strings.

/// A turn (`switchboard.turns.status`): `open` until the dispatcher stores its reply (`done`) or
/// gives up on it (`failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum TurnStatus {
    Open,
    Done,
    Failed,
}

/// A reply in the delivery ledger (`switchboard.deliveries.status`): `pending → sent | failed`,
/// or `skipped` for a reply that is only logged (a heartbeat's "nothing to report").
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum DeliveryStatus {
    Pending,
    Sent,
    Failed,
    Skipped,
}

impl DeliveryStatus {
    /// Sent, failed for good, or not to be sent: nothing more will happen to the reply.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            DeliveryStatus::Sent | DeliveryStatus::Failed | DeliveryStatus::Skipped
        )
    }
}

/// A session (`switchboard.sessions.status`): `running` while a runner call holds it, `waiting`
/// while its turns wait for the agent's runner to come back, `terminated` when it takes no more
/// turns, `idle` otherwise. `rescheduling` is never stored: a session is read so when it is
/// idle with a wake-up pending (its agent will come back to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, serde::Serialize, serde::Deserialize)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    Idle,
    Running,
    Waiting,
    Terminated,
    Rescheduling,
}

impl SessionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Idle => "idle",
            SessionStatus::Running => "running",
            SessionStatus::Waiting => "waiting",
            SessionStatus::Terminated => "terminated",
            SessionStatus::Rescheduling => "rescheduling",
        }
    }
}

/// Why a session started a fresh engine session (`switchboard.turns.reset`,
/// `sessions.pending_reset`, the `session.reset` event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, serde::Serialize, serde::Deserialize)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum ResetReason {
    /// The person asked: `/new` or `/reset`.
    Command,
    /// The session had been idle longer than the agent's `idle_reset_s`.
    Idle,
    /// The agent's daily reset time passed since the person's last message.
    Daily,
    /// An operator asked, through the sessions API.
    Api,
}

impl ResetReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ResetReason::Command => "command",
            ResetReason::Idle => "idle",
            ResetReason::Daily => "daily",
            ResetReason::Api => "api",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "command" => ResetReason::Command,
            "idle" => ResetReason::Idle,
            "daily" => ResetReason::Daily,
            "api" => ResetReason::Api,
            _ => return None,
        })
    }
}

/// An entry of a session's journal (`switchboard.session_events.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, serde::Serialize, serde::Deserialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum SessionEventKind {
    /// A message of the person's took its place in the session.
    MessageIn,
    /// A runner call for a turn began (one entry per call: a retried turn shows twice).
    TurnStarted,
    /// The turn's reply was stored.
    Reply,
    /// The session started a fresh engine session.
    Reset,
    /// An operator asked for a reset; the next turn applies it.
    ResetRequested,
    /// A turn was given up on.
    Failure,
    /// The agent's runner is down: the session's turns wait for it (once per outage).
    Waiting,
    /// A turn was too old when it could first run and was not run (`stale_turns = expire`).
    Expired,
    /// What recall put into a turn's prompt (message ids, scores, how far behind the index was).
    Recall,
    /// The person + identity's summary was rewritten (version, messages covered).
    Summarised,
    /// Before a reset, the pipeline asked the agent to write what it must keep into memory.md.
    MemoryFlush,
    /// The curated memory (memory.md) changed (by the agent, the person or an operator).
    MemoryWritten,
    /// The agent scheduled a wake-up of the session (id, due time, who asked).
    WakeupScheduled,
    /// A wake-up came due and its turn's input was published.
    WakeupFired,
    /// A pending wake-up was cancelled (by the person, the agent or an operator).
    WakeupCancelled,
    /// A wake-up could not fire (the person had no channel to reach them on).
    WakeupFailed,
    /// An exchange got one of `[escalation] labels`: a person should step in (label, reply).
    Escalated,
    /// An operator acknowledged an escalation (who, which).
    EscalationAcknowledged,
    /// An operator took the conversation over: the agent is paused (who, the takeover).
    Takeover,
    /// An operator's reply to the person during a takeover (who, the message).
    OperatorReply,
    /// A turn of a taken-over session was not given to the agent (the takeover holding it).
    Held,
    /// The operator handed the conversation back to the agent (who, messages held, whether
    /// the agent was given a turn to answer what went unanswered).
    Handback,
}

/// The journal key of a session's wait for its agent's runner, told by the notice `notice`.
/// The dispatcher that records the wait and the message log that logs its notice write the
/// same entry: whichever comes second leaves it as it is.
pub fn waiting_key(session: uuid::Uuid, notice: uuid::Uuid) -> String {
    format!("waiting:{session}:{notice}")
}

/// The id of the notice telling `session`'s person that turn `seq` waits for the runner:
/// derived, not drawn, so that a telling the database could not record (it was down) and a
/// later one it did record are one message, sent once.
pub fn runner_down_notice_id(session: uuid::Uuid, seq: i64) -> uuid::Uuid {
    uuid::Uuid::new_v5(&session, format!("runner-down:{seq}").as_bytes())
}
