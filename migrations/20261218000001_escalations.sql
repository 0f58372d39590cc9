-- Escalations: an exchange the categoriser labelled with one of `[escalation] labels` asks for
-- a person to step in. One row per (reply, label), raised by the `escalate` stage from
-- `exchange.categorised`, listed first in the console's queue until an operator acknowledges it.
CREATE TABLE switchboard.escalations (
    id                  UUID PRIMARY KEY, -- UUIDv7: time-ordered
    session_id          UUID NOT NULL REFERENCES switchboard.sessions(id),
    person_id           TEXT NOT NULL,
    agent_identity      TEXT NOT NULL,
    channel             TEXT NOT NULL,
    label               TEXT NOT NULL,
    inbound_message_id  UUID,
    outbound_message_id UUID NOT NULL,
    raised_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    acknowledged_at     TIMESTAMPTZ,
    acknowledged_by     TEXT,
    UNIQUE (outbound_message_id, label)
);
CREATE INDEX escalations_open ON switchboard.escalations (raised_at)
    WHERE acknowledged_at IS NULL;
CREATE INDEX escalations_person ON switchboard.escalations (person_id);
CREATE INDEX escalations_session ON switchboard.escalations (session_id);

ALTER TABLE switchboard.session_events DROP CONSTRAINT IF EXISTS session_events_kind_check;
ALTER TABLE switchboard.session_events ADD CONSTRAINT session_events_kind_check
    CHECK (kind IN ('message_in', 'turn_started', 'reply', 'reset', 'reset_requested', 'failure',
                    'waiting', 'expired', 'recall', 'summarised', 'memory_flush', 'memory_written',
                    'wakeup_scheduled', 'wakeup_fired', 'wakeup_cancelled', 'wakeup_failed',
                    'escalated', 'escalation_acknowledged'));
