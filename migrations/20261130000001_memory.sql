-- Memory: what the summary, embedding and categorisation workers write, and the curated memory
-- the agent and the person keep. Every row names its person and agent identity, so isolation is
-- a predicate on the data itself (and erasure one DELETE per table).

-- One vector per message and embedding model. The column has no fixed dimension so that a new
-- model's vectors (`switchboard reembed`) live beside the old ones until they are complete; each
-- model gets its own partial HNSW index over `embedding::halfvec(N)` (created by the embedding
-- worker when it first sees a model; the default model's is created here).
CREATE TABLE switchboard.message_vectors (
    message_id     UUID NOT NULL REFERENCES switchboard.messages(id) ON DELETE CASCADE,
    model          TEXT NOT NULL,
    person_id      TEXT NOT NULL,
    agent_identity TEXT NOT NULL,
    dimensions     INT NOT NULL,
    embedding      vector NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, model)
);
CREATE INDEX message_vectors_person ON switchboard.message_vectors (person_id, agent_identity, model);
CREATE INDEX message_vectors_hnsw_all_minilm_l6_v2 ON switchboard.message_vectors
    USING hnsw ((embedding::halfvec(384)) halfvec_cosine_ops)
    WHERE model = 'all-MiniLM-L6-v2';

-- The messages the memory workers have not reached yet are found by these (lag, sweeps).
CREATE INDEX messages_person_identity ON switchboard.messages (person_id, agent_identity, id);

-- One label per exchange (an inbound message and the reply that answers it). The label is also
-- written on both messages (`messages.category`).
CREATE TABLE switchboard.exchange_categories (
    outbound_id    UUID PRIMARY KEY REFERENCES switchboard.messages(id) ON DELETE CASCADE,
    inbound_id     UUID REFERENCES switchboard.messages(id) ON DELETE CASCADE,
    session_id     UUID NOT NULL,
    person_id      TEXT NOT NULL,
    agent_identity TEXT NOT NULL,
    channel        TEXT NOT NULL,
    label          TEXT NOT NULL,
    -- `model` (the configured LLM chose it) or `embedding` (nearest label description).
    source         TEXT NOT NULL CHECK (source IN ('model', 'embedding')),
    -- What the model answered, when it was outside the label set (stored as `other`).
    raw_label      TEXT,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX exchange_categories_time ON switchboard.exchange_categories (created_at);
CREATE INDEX exchange_categories_person ON switchboard.exchange_categories (person_id, agent_identity, created_at);

-- Summaries say what they cover and are written with compare-and-set on `version`.
ALTER TABLE switchboard.summaries
    ADD COLUMN version                  BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN first_message_in_summary UUID,
    ADD COLUMN messages_covered         BIGINT NOT NULL DEFAULT 0,
    -- `model` (the configured LLM wrote it) or `extractive` (the offline default).
    ADD COLUMN method                   TEXT NOT NULL DEFAULT 'extractive'
        CHECK (method IN ('model', 'extractive')),
    ADD COLUMN created_at               TIMESTAMPTZ NOT NULL DEFAULT now();
CREATE INDEX summaries_person ON switchboard.summaries (person_id, agent_identity);

-- Curated memory (`memory.md`) of one person + agent identity, shared by the identity's engine
-- variants and channels: written by the agent through its workspace, by the person with
-- `/remember`, and by operators through the API. Keyed by the person, never by a session scope
-- (a `main`-scoped session is shared by everyone; a person's memory never is). Capped by
-- `[memory] max_chars`.
CREATE TABLE switchboard.memories (
    person_id      TEXT NOT NULL,
    agent_identity TEXT NOT NULL,
    body           TEXT NOT NULL,
    version        BIGINT NOT NULL DEFAULT 1,
    -- Who wrote the current body: `agent`, `person` (/remember) or `api:<key owner>`.
    updated_by     TEXT NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (person_id, agent_identity)
);

-- The journal records what memory did to a session: the recall a turn carried, summaries, the
-- flush before a reset and changes to the curated memory.
ALTER TABLE switchboard.session_events DROP CONSTRAINT IF EXISTS session_events_kind_check;
ALTER TABLE switchboard.session_events ADD CONSTRAINT session_events_kind_check
    CHECK (kind IN ('message_in', 'turn_started', 'reply', 'reset', 'reset_requested', 'failure',
                    'waiting', 'expired', 'recall', 'summarised', 'memory_flush', 'memory_written'));
