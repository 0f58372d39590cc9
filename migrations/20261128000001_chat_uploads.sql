-- Files chat users upload (`POST /chat/uploads`), kept until a message names them and dispatch
-- copies them into the session's attachments/ (the gateway and dispatch may run on different
-- hosts: Postgres is what both reach). Capped per file (workspace.max_attachment_bytes) and per
-- person (chat.upload_quota_bytes); deleted after chat.upload_retention_s.
CREATE TABLE switchboard.chat_uploads (
    id           UUID PRIMARY KEY,
    -- The chat token's sub: only its owner's messages may name an upload.
    owner        TEXT NOT NULL,
    -- The client's Idempotency-Key: a retried upload is the same upload.
    client_key   TEXT,
    name         TEXT NOT NULL,
    content_type TEXT NOT NULL,
    bytes        BIGINT NOT NULL,
    sha256       TEXT NOT NULL,
    data         BYTEA NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ NOT NULL
);
CREATE UNIQUE INDEX chat_uploads_client_key ON switchboard.chat_uploads (owner, client_key)
    WHERE client_key IS NOT NULL;
CREATE INDEX chat_uploads_owner ON switchboard.chat_uploads (owner, expires_at);
CREATE INDEX chat_uploads_expiry ON switchboard.chat_uploads (expires_at);
