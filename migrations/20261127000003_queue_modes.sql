-- Queue modes (`[[agents]] queue_mode`). Under `collect` (and `interrupt`), messages that
-- arrived while a turn ran are joined into the session's next runner call. Each message keeps
-- its own turn (its place, its dedupe key, its journal entry); the turns joined into a later
-- one are done without a reply of their own and name the turn whose reply answers them.
ALTER TABLE switchboard.turns
    -- The message as the session stage opened it (protobuf `IdentifiedMessage`), kept for
    -- agents that collect: the call that joins it runs before its own turn is delivered.
    ADD COLUMN payload     BYTEA,
    ADD COLUMN joined_into BIGINT;
