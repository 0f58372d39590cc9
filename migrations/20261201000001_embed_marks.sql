-- What the vector index has not reached yet, findable by an index (issue 22: the index lag was an
-- anti-join of every message against every vector: 2.7 s at 1M messages, paid by every search
-- across people and by the lag gauge).

-- Whether a message is part of the conversation: not the agent's silent answer to the flush
-- before a reset, not a heartbeat's "nothing needs attention" (`switchboard_memory::
-- NOT_CONVERSATION` lists the same kinds; a test checks they agree). Summaries, the index and
-- its lag leave the others out.
ALTER TABLE switchboard.messages
    ADD COLUMN conversation BOOLEAN NOT NULL
        GENERATED ALWAYS AS (coalesce(metadata->>'kind', '') NOT IN ('memory_flush', 'heartbeat_ok')) STORED;

-- The model of the message's vector, set by the embedding worker (and `switchboard reembed`) in
-- the statement that writes the vector; NULL: no vector under the marked model yet. The marks
-- are for the model `embedding_marks` names: an embedding worker or reembed starting with
-- another model marks again (each message: that model's vector there or not) before it marks
-- anything, and a worker of any other model leaves the marks alone.
ALTER TABLE switchboard.messages ADD COLUMN embedded_model TEXT;
CREATE TABLE switchboard.embedding_marks (
    id        BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
    model     TEXT NOT NULL,
    marked_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The waiting messages: near none in the steady state, so the lag (the oldest one's age, how
-- many) and reembed's next step read a handful of index entries whatever the log's size.
CREATE INDEX messages_unembedded ON switchboard.messages (created_at, id)
    WHERE embedded_model IS NULL AND conversation;
