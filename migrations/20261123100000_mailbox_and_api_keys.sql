-- Replies for channels that are not a provider's API: chat sockets and API callers. The deliver
-- stage writes each part here once (its ledger "send"); gateways push it to the person's sockets
-- or hand it to the waiting API request, and read it back for clients that were away.
CREATE TABLE switchboard.mailbox (
    seq            BIGSERIAL PRIMARY KEY,
    reply_id       UUID NOT NULL,
    part           INT NOT NULL,
    channel        TEXT NOT NULL,
    -- The sender address the reply goes back to (chat: the token's subject; API: the key owner).
    address        TEXT NOT NULL,
    agent          TEXT NOT NULL,
    session_id     UUID,
    correlation_id TEXT NOT NULL,
    -- The client's own id of the message answered ('' when the agent started the conversation).
    in_reply_to    TEXT NOT NULL DEFAULT '',
    text           TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- When a gateway first wrote it to one of the person's sockets.
    pushed_at      TIMESTAMPTZ,
    UNIQUE (reply_id, part)
);
CREATE INDEX mailbox_address ON switchboard.mailbox (channel, address, seq);
CREATE INDEX mailbox_correlation ON switchboard.mailbox (correlation_id);

-- API keys: only a SHA-256 of the key is kept (keys are 256-bit random, so a plain hash is
-- enough: nothing to brute-force). The key itself is printed once, when it is made.
CREATE TABLE switchboard.api_keys (
    id           UUID PRIMARY KEY,
    owner        TEXT NOT NULL,
    key_hash     BYTEA NOT NULL UNIQUE,
    -- The key's first characters, so operators can tell keys apart in `api-keys list`.
    key_prefix   TEXT NOT NULL,
    scopes       TEXT[] NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_used_at TIMESTAMPTZ,
    revoked_at   TIMESTAMPTZ
);

-- Messages accepted through the API, so their correlation ids can be polled by (only) their owner.
CREATE TABLE switchboard.api_requests (
    correlation_id TEXT PRIMARY KEY,
    owner          TEXT NOT NULL,
    agent          TEXT NOT NULL,
    -- The caller's Idempotency-Key: the same key again is the same message (and correlation id).
    idempotency_key TEXT,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (owner, idempotency_key)
);
