-- The key that signs turn tokens (the short-lived bearer tokens an agent's engine calls the API
-- with, scoped to its turn's person), when `[gateway] turn_token_secret` is not configured:
-- generated once by whichever gateway or dispatcher needs it first, so every replica of both
-- signs and verifies with the same key. Rotating it (deleting the row) ends every token issued.
CREATE TABLE switchboard.turn_token_secret (
    id         SMALLINT PRIMARY KEY CHECK (id = 1),
    secret     BYTEA NOT NULL CHECK (length(secret) >= 32),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
