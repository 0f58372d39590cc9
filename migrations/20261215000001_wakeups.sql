-- Agent wake-ups (seed 002): an agent, with its turn's token, asks to come back to a session
-- at a time, with a note that is the input of that later turn. Durable: every dispatch replica
-- fires what is due (claimed with SKIP LOCKED, the claim lapsing if the replica dies), and the
-- inbound message is keyed `wakeup:<id>` so a firing repeated after a crash is one turn.
CREATE TABLE switchboard.wakeups (
    id             UUID PRIMARY KEY,
    session_id     UUID NOT NULL REFERENCES switchboard.sessions (id) ON DELETE CASCADE,
    person_id      TEXT NOT NULL,
    -- The engine variant that asked (the later turn runs on it) and its identity.
    agent_name     TEXT NOT NULL,
    agent_identity TEXT NOT NULL,
    due_at         TIMESTAMPTZ NOT NULL,
    note           TEXT NOT NULL,
    status         TEXT NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'fired', 'cancelled', 'failed')),
    -- `agent:<name>` (a turn's token), `key:<owner>` (an API key or operator).
    created_by     TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- A replica firing it holds it until `claimed_until`; a claim that lapsed is free again.
    claimed_by     TEXT,
    claimed_until  TIMESTAMPTZ,
    -- The inbound message its firing publishes (its correlation id) and the way to the person
    -- it goes by (channel, provider, sender, recipient, person_type): fixed the first time it
    -- fires, so a firing repeated after a crash is the same message on the same channel.
    message_id     UUID,
    input_route    JSONB,
    fired_at       TIMESTAMPTZ,
    cancelled_at   TIMESTAMPTZ,
    -- `person` (their `/reminders cancel`), `agent:<name>`, `key:<owner>`.
    cancelled_by   TEXT,
    -- Why it could not fire (`failed`): the person has no channel to reach them on.
    failure        TEXT
);

-- What the firing loop scans: the pending ones by time.
CREATE INDEX wakeups_due ON switchboard.wakeups (due_at) WHERE status = 'pending';
-- A person's pending ones (the cap, `/reminders`) and a session's (its status).
CREATE INDEX wakeups_person ON switchboard.wakeups (person_id, agent_identity)
    WHERE status = 'pending';
CREATE INDEX wakeups_session ON switchboard.wakeups (session_id);
-- What a person's `/reminders cancel` message cancelled (asked again when its turn reruns).
CREATE INDEX wakeups_cancelled_by ON switchboard.wakeups (cancelled_by)
    WHERE cancelled_by IS NOT NULL;

ALTER TABLE switchboard.session_events DROP CONSTRAINT IF EXISTS session_events_kind_check;
ALTER TABLE switchboard.session_events ADD CONSTRAINT session_events_kind_check
    CHECK (kind IN ('message_in', 'turn_started', 'reply', 'reset', 'reset_requested', 'failure',
                    'waiting', 'expired', 'recall', 'summarised', 'memory_flush', 'memory_written',
                    'wakeup_scheduled', 'wakeup_fired', 'wakeup_cancelled', 'wakeup_failed'));
