-- One inference per message (issue 42): the vector recall computed for a person's message, handed
-- to the embedding worker, which stores it as the message's vector instead of embedding the text
-- again (switchboard_memory::handoff). No foreign key to the message: recall runs beside the
-- inbound log and often comes first. A row lives until the worker takes it (seconds), or is
-- deleted unclaimed after a few minutes; an erasure deletes a person's with their vectors.
CREATE TABLE switchboard.handed_vectors (
    message_id     UUID NOT NULL,
    model          TEXT NOT NULL,
    person_id      TEXT NOT NULL,
    agent_identity TEXT NOT NULL,
    dimensions     INT NOT NULL,
    embedding      vector NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, model)
);
CREATE INDEX handed_vectors_person ON switchboard.handed_vectors (person_id);
CREATE INDEX handed_vectors_created ON switchboard.handed_vectors (created_at);
