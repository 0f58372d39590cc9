-- Links a person proves: in chat, "link my phone +61…" texts a one-time code to that number; the
-- code texted back from it (or typed in chat) within its lifetime records the link.
CREATE TABLE switchboard.link_claims (
    -- UUIDv7; also the id of the message that carries the code.
    id            UUID PRIMARY KEY,
    -- The message that asked: a redelivered one finds its claim instead of making another.
    requested_by  UUID NOT NULL UNIQUE,
    -- Who asked (their canonical person id when they asked).
    claimant_id   TEXT NOT NULL,
    claimant_name TEXT NOT NULL DEFAULT '',
    -- The number claimed, E.164.
    phone         TEXT NOT NULL,
    -- Kept as sent (six digits, minutes long): the code message must be rebuilt exactly if the
    -- stage is redelivered before it was published, and whoever reads this table can already
    -- read every conversation.
    code          TEXT NOT NULL,
    status        TEXT NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'linked', 'used_up', 'superseded')),
    wrong_codes   INT NOT NULL DEFAULT 0,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL,
    settled_at    TIMESTAMPTZ
);
CREATE INDEX link_claims_phone ON switchboard.link_claims (phone, created_at DESC);
CREATE INDEX link_claims_claimant ON switchboard.link_claims (claimant_id, created_at DESC);

-- What Switchboard answered to each message that asked for a code or gave one, written in the
-- same transaction as what it did: a redelivered message gets the same answer and does nothing
-- twice (no second code, no second wrong try counted).
CREATE TABLE switchboard.link_proof_answers (
    message_id UUID PRIMARY KEY,
    claim_id   UUID REFERENCES switchboard.link_claims (id),
    outcome    TEXT NOT NULL,
    answer     TEXT NOT NULL,
    at         TIMESTAMPTZ NOT NULL DEFAULT now()
);
