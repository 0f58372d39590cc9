-- Files an agent left in a session's exports/ for the person (switchboard_kit::exports). One
-- row per file dealt with: kept (its bytes, served by signed link until `expires_at`) or not
-- sent (`refused`, why). Rows are staged by the runner call that read the files and become
-- `committed` with the turn's reply, in the same statement (a call whose answer does not
-- stand leaves its rows uncommitted, never served, deleted at expiry). A committed row is
-- what "sent before" is remembered by (workspace, file, sha256): its bytes are cleared at
-- expiry, the row stays until the person is forgotten, so an unchanged file is never sent
-- twice.
CREATE TABLE switchboard.exports (
    id           UUID PRIMARY KEY,
    session_id   UUID NOT NULL,
    seq          BIGINT NOT NULL,
    reply_id     UUID NOT NULL,
    -- The turn's person (in a session shared by several people: the one whose turn it was).
    person_id    TEXT NOT NULL,
    -- The folder read (`sessions.workspace_path`: an identity's variants may share it).
    workspace    TEXT NOT NULL,
    -- Its name in exports/, and the name the person sees.
    file         TEXT NOT NULL,
    name         TEXT NOT NULL,
    content_type TEXT NOT NULL,
    bytes        BIGINT NOT NULL,
    -- SHA-256 of the content; for a refused file, what it was refused at (size and time).
    sha256       TEXT NOT NULL,
    data         BYTEA,
    refused      TEXT,
    committed    BOOLEAN NOT NULL DEFAULT false,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX exports_reply ON switchboard.exports (reply_id);
CREATE INDEX exports_sent ON switchboard.exports (workspace, file, sha256) WHERE committed;
CREATE INDEX exports_person ON switchboard.exports (person_id);
CREATE INDEX exports_session ON switchboard.exports (session_id);
CREATE INDEX exports_expiry ON switchboard.exports (expires_at) WHERE data IS NOT NULL OR NOT committed;

-- The exports a turn's reply carries ([{id, name, content_type, size_bytes, expires_at_ms}]),
-- kept with its stored reply so a reply sent again from the store still carries them.
ALTER TABLE switchboard.turns ADD COLUMN exports JSONB;

-- The files of a mailbox entry, with their signed links (switchboard_kit::exports::ExportLink).
ALTER TABLE switchboard.mailbox ADD COLUMN attachments JSONB NOT NULL DEFAULT '[]'::jsonb;
