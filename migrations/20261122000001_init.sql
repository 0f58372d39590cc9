-- Switchboard's schema. Everything lives in schema `switchboard`.
CREATE SCHEMA IF NOT EXISTS switchboard;
CREATE EXTENSION IF NOT EXISTS vector;

-- The directory: who people are and how to reach them.
CREATE TABLE switchboard.people (
    person_id   TEXT PRIMARY KEY,
    person_type TEXT NOT NULL,
    name        TEXT NOT NULL DEFAULT '',
    role        TEXT NOT NULL DEFAULT '',
    metadata    JSONB NOT NULL DEFAULT '{}'::jsonb,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A channel address (kind = phone | email | chat_user | api_key_owner) that belongs to a person.
CREATE TABLE switchboard.contact_points (
    kind       TEXT NOT NULL,
    address    TEXT NOT NULL,
    person_id  TEXT NOT NULL REFERENCES switchboard.people(person_id) ON DELETE CASCADE,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, address)
);
CREATE INDEX contact_points_person ON switchboard.contact_points (person_id);

-- Links between identities made by operators, kept as data with who and when.
CREATE TABLE switchboard.identity_links (
    id             UUID PRIMARY KEY,
    from_person_id TEXT NOT NULL,
    to_person_id   TEXT NOT NULL,
    linked_by      TEXT NOT NULL,
    reason         TEXT NOT NULL DEFAULT '',
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (from_person_id, to_person_id)
);

CREATE TABLE switchboard.sessions (
    id                      UUID PRIMARY KEY,
    person_type             TEXT NOT NULL,
    person_id               TEXT NOT NULL,
    agent_identity          TEXT NOT NULL,
    agent_name              TEXT NOT NULL,
    engine_type             TEXT NOT NULL,
    engine_session_id       TEXT,
    channel                 TEXT NOT NULL,
    scope_key               TEXT NOT NULL,
    status                  TEXT NOT NULL DEFAULT 'idle' CHECK (status IN ('idle', 'running', 'terminated')),
    summary                 TEXT,
    summary_updated_at      TIMESTAMPTZ,
    last_message_in_summary UUID,
    workspace_path          TEXT,
    metadata                JSONB NOT NULL DEFAULT '{}'::jsonb,
    -- Turn sequencing: next_seq is handed out by the session stage, last_seq is the dispatcher's
    -- cursor, advanced only by compare-and-set (last_seq = seq - 1).
    next_seq                BIGINT NOT NULL DEFAULT 1,
    last_seq                BIGINT NOT NULL DEFAULT 0,
    created_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (scope_key, agent_name)
);
CREATE INDEX sessions_person ON switchboard.sessions (person_id);

-- One row per turn: maps an inbound message to its place in the session, and keeps the reply so
-- a redelivered turn re-emits the same answer instead of running the agent again.
CREATE TABLE switchboard.turns (
    session_id        UUID NOT NULL REFERENCES switchboard.sessions(id),
    seq               BIGINT NOT NULL,
    inbound_id        UUID NOT NULL,
    channel           TEXT NOT NULL,
    provider_message_id TEXT NOT NULL,
    status            TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'done', 'failed')),
    error             TEXT,
    reply_id          UUID,
    reply_text        TEXT,
    engine_session_id TEXT,
    processing_ms     BIGINT,
    tool_calls_count  BIGINT,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at      TIMESTAMPTZ,
    PRIMARY KEY (session_id, seq),
    UNIQUE (channel, provider_message_id)
);

-- Every message in and out.
CREATE TABLE switchboard.messages (
    id               UUID PRIMARY KEY, -- UUIDv7: time-ordered
    session_id       UUID NOT NULL REFERENCES switchboard.sessions(id),
    person_id        TEXT NOT NULL,
    agent_name       TEXT NOT NULL,
    agent_identity   TEXT NOT NULL,
    direction        TEXT NOT NULL CHECK (direction IN ('inbound', 'outbound')),
    channel          TEXT NOT NULL,
    message          TEXT NOT NULL,
    processing_ms    BIGINT,
    tool_calls_count BIGINT,
    correlation_id   TEXT NOT NULL,
    external_id      TEXT,
    metadata         JSONB NOT NULL DEFAULT '{}'::jsonb,
    category         TEXT,
    search           TSVECTOR GENERATED ALWAYS AS (to_tsvector('simple', message)) STORED,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX messages_external ON switchboard.messages (channel, direction, external_id)
    WHERE external_id IS NOT NULL;
CREATE INDEX messages_session ON switchboard.messages (session_id, id);
CREATE INDEX messages_correlation ON switchboard.messages (correlation_id);
CREATE INDEX messages_search ON switchboard.messages USING GIN (search);

-- The delivery ledger: a reply is sent at most once outside the documented window.
CREATE TABLE switchboard.deliveries (
    reply_id             UUID PRIMARY KEY,
    session_id           UUID NOT NULL,
    channel              TEXT NOT NULL,
    provider             TEXT NOT NULL,
    recipient            TEXT NOT NULL,
    status               TEXT NOT NULL CHECK (status IN ('pending', 'sent', 'failed')),
    parts_total          INT NOT NULL DEFAULT 0,
    parts_sent           INT NOT NULL DEFAULT 0,
    provider_message_ids TEXT[] NOT NULL DEFAULT '{}',
    attempts             INT NOT NULL DEFAULT 0,
    last_error           TEXT,
    -- A deliverer holds the row while sending, so two replicas never send the same reply.
    leased_until         TIMESTAMPTZ,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at           TIMESTAMPTZ NOT NULL DEFAULT now()
);
