-- Takeovers: an operator takes a person's conversation with an agent over. While one is open
-- the agent is paused (dispatch holds the session's turns: done, no reply, `held_by` set), the
-- operator's replies go out as turns with a given answer; the hand-back ends it and, when the
-- person's last messages went unanswered, gives the agent one turn to answer them. The next
-- prompt of the session tells the agent what happened meanwhile (`briefed_at` once it did).
CREATE TABLE switchboard.takeovers (
    id              UUID PRIMARY KEY, -- UUIDv7: time-ordered
    session_id      UUID NOT NULL REFERENCES switchboard.sessions(id),
    taken_by        TEXT NOT NULL,
    started_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_reply_at   TIMESTAMPTZ,
    ended_at        TIMESTAMPTZ,
    ended_by        TEXT,
    -- The hand-back's turn input (drawn once at the hand-back; NULL: nothing was left unanswered).
    handback_input  UUID,
    handback_published_at TIMESTAMPTZ,
    briefed_at      TIMESTAMPTZ
);
-- One open takeover a session: a second operator is told who has it.
CREATE UNIQUE INDEX takeovers_open ON switchboard.takeovers (session_id) WHERE ended_at IS NULL;
CREATE INDEX takeovers_unbriefed ON switchboard.takeovers (session_id)
    WHERE ended_at IS NOT NULL AND briefed_at IS NULL;
CREATE INDEX takeovers_session ON switchboard.takeovers (session_id, started_at);

-- The takeover that held a turn (it was done without calling the agent).
ALTER TABLE switchboard.turns ADD COLUMN held_by UUID;
CREATE INDEX turns_held_by ON switchboard.turns (held_by) WHERE held_by IS NOT NULL;

ALTER TABLE switchboard.session_events DROP CONSTRAINT IF EXISTS session_events_kind_check;
ALTER TABLE switchboard.session_events ADD CONSTRAINT session_events_kind_check
    CHECK (kind IN ('message_in', 'turn_started', 'reply', 'reset', 'reset_requested', 'failure',
                    'waiting', 'expired', 'recall', 'summarised', 'memory_flush', 'memory_written',
                    'wakeup_scheduled', 'wakeup_fired', 'wakeup_cancelled', 'wakeup_failed',
                    'escalated', 'escalation_acknowledged',
                    'takeover', 'operator_reply', 'held', 'handback'));
