-- Queue modes (`[[agents]] queue_mode`). Under `collect` (and `interrupt`), messages that
-- arrived while a turn ran are joined into the session's next runner call. Each message keeps
-- its own turn (its place, its dedupe key, its journal entry); the turns joined into a later
-- one are done without a reply of their own and name the turn whose reply answers them.
ALTER TABLE switchboard.turns
    -- The message as the session stage opened it (protobuf `IdentifiedMessage`), kept for
    -- agents that collect: the call that joins it runs before its own turn is delivered.
    ADD COLUMN payload     BYTEA,
    ADD COLUMN joined_into BIGINT;

-- Under `interrupt`, a message that arrives while a call runs cancels that call at the runner
-- (`DELETE /run/<Idempotency-Key>`, once per call); the cancelled turn runs again joined with
-- it. The session remembers the running call's key and last turn for that; `interrupts`
-- counts a turn's cancelled calls, so its next call never reuses a cancelled key.
ALTER TABLE switchboard.sessions
    ADD COLUMN running_key         TEXT,
    ADD COLUMN running_last        BIGINT,
    ADD COLUMN running_interrupted BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE switchboard.turns
    ADD COLUMN interrupts INT NOT NULL DEFAULT 0;
