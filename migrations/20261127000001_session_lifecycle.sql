-- Sessions that survive engines, resets and outages.
--
-- A session is one person + one engine variant (`reggie_oc`); its summary belongs to the person
-- + agent identity (`reggie`) and is shared by every variant, so it lives in its own table keyed
-- by `memory_key` (the session's scope key with the identity in place of the variant). The
-- per-session summary columns of the first schema were never written; they go.
ALTER TABLE switchboard.sessions
    DROP COLUMN summary,
    DROP COLUMN summary_updated_at,
    DROP COLUMN last_message_in_summary;

ALTER TABLE switchboard.sessions ADD COLUMN memory_key TEXT;
UPDATE switchboard.sessions
   SET memory_key = agent_identity || substr(scope_key, length(agent_name) + 1)
 WHERE starts_with(scope_key, agent_name || ':');
UPDATE switchboard.sessions SET memory_key = agent_identity || ':' || scope_key
 WHERE memory_key IS NULL;
ALTER TABLE switchboard.sessions ALTER COLUMN memory_key SET NOT NULL;
CREATE INDEX sessions_memory_key ON switchboard.sessions (memory_key);

ALTER TABLE switchboard.sessions DROP CONSTRAINT IF EXISTS sessions_status_check;
ALTER TABLE switchboard.sessions ADD CONSTRAINT sessions_status_check
    CHECK (status IN ('idle', 'running', 'waiting', 'terminated'));

ALTER TABLE switchboard.sessions
    -- When the person's latest message was received: idle and daily resets compare the next
    -- message's time with it.
    ADD COLUMN last_message_at TIMESTAMPTZ,
    -- A reset the session's next turn applies, in its order: one asked for outside the
    -- conversation (`api`, the sessions API), or one whose own turn was given up on (its
    -- reason stays: the person is still told). NULL when none is pending.
    ADD COLUMN pending_reset    TEXT CHECK (pending_reset IN ('command', 'idle', 'daily', 'api')),
    ADD COLUMN pending_reset_at TIMESTAMPTZ,
    -- Engine sessions this session has started over with.
    ADD COLUMN resets           INT NOT NULL DEFAULT 0;

-- Which reset, if any, the turn starts with: the person asked (`/new`, `/reset`), the session
-- had idled past the agent's `idle_reset_s`, or the agent's daily reset time passed since the
-- last message. Decided once, when the turn is opened.
ALTER TABLE switchboard.turns
    ADD COLUMN reset TEXT CHECK (reset IN ('command', 'idle', 'daily', 'api'));

-- Summaries of one person + agent identity, shared by the identity's engine variants. Written
-- by the summary worker; read into every prompt.
CREATE TABLE switchboard.summaries (
    memory_key              TEXT PRIMARY KEY,
    agent_identity          TEXT NOT NULL,
    person_id               TEXT NOT NULL,
    summary                 TEXT NOT NULL,
    last_message_in_summary UUID,
    updated_at              TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Each session's journal: what happened to it and when. `key` makes every entry idempotent, as
-- it is written in the same transaction as the change it records (a redelivered message writes
-- nothing twice).
CREATE TABLE switchboard.session_events (
    id         UUID PRIMARY KEY, -- UUIDv7: time-ordered
    session_id UUID NOT NULL REFERENCES switchboard.sessions(id),
    key        TEXT NOT NULL UNIQUE,
    kind       TEXT NOT NULL CHECK (kind IN
                   ('message_in', 'turn_started', 'reply', 'reset', 'reset_requested', 'failure')),
    -- The turn it belongs to, when it belongs to one.
    seq        BIGINT,
    detail     JSONB NOT NULL DEFAULT '{}'::jsonb,
    at         TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX session_events_session ON switchboard.session_events (session_id, id);
