-- The memory workers' marks move off the log into a narrow table beside it (issue 42;
-- docs/data-path-cost.md, "Every logged message is rewritten three times").
--
-- `embedded_model` and `summary_version` are in the predicates of the partial indexes the lag
-- readers use, so each mark made on `messages` was an update no HOT could take: a new wide
-- tuple (the message text, its metadata, its stored `search` vector) and an entry in every one
-- of the log's indexes, the full-text GIN index among them, twice a message. Here a mark is an
-- update of a row of eight narrow columns with one unique index and the three partial ones.
--
-- Expand, then contract: the columns stay on `messages` (the previous version's workers still
-- read and write them while this version's first process migrates) and a later migration
-- drops them. Until then, what an old worker marks there is copied here by a trigger, so
-- nothing it did is done again.
-- The log's writers wait while its marks are copied and the trigger that marks from now on is
-- made: a message logged between the two would have no marks row.
LOCK TABLE switchboard.messages IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE switchboard.message_marks (
    message_id      UUID PRIMARY KEY,
    session_id      UUID NOT NULL,
    person_id       TEXT NOT NULL,
    agent_identity  TEXT NOT NULL,
    conversation    BOOLEAN NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    -- The model of the message's vector (NULL: none under the marked model yet), as
    -- `embedding_marks` says (see 20261201000001_embed_marks.sql).
    embedded_model  TEXT,
    -- The summary version that merged the message (NULL: not summarised yet), see
    -- 20261130000030_summary_marks.sql.
    summary_version BIGINT
);

INSERT INTO switchboard.message_marks
    (message_id, session_id, person_id, agent_identity, conversation, created_at,
     embedded_model, summary_version)
SELECT id, session_id, person_id, agent_identity, conversation, created_at,
       embedded_model, summary_version
  FROM switchboard.messages;

-- The same three partial indexes, on the narrow rows; near empty in the steady state.
CREATE INDEX message_marks_unembedded ON switchboard.message_marks (created_at, message_id)
    WHERE embedded_model IS NULL AND conversation;
CREATE INDEX message_marks_person_unembedded
    ON switchboard.message_marks (person_id, agent_identity)
    WHERE embedded_model IS NULL AND conversation;
CREATE INDEX message_marks_unsummarised ON switchboard.message_marks (session_id, message_id)
    WHERE summary_version IS NULL;

DROP INDEX switchboard.messages_unembedded;
DROP INDEX switchboard.messages_person_unembedded;
DROP INDEX switchboard.messages_unsummarised;

-- Every message has its marks row from the statement that logs it, whoever logs it: one
-- insert a statement (the log stage writes a batch in one), no foreign key (its check would
-- lock each new message row, a write to the log's pages again). The marks a message is
-- written with are kept (none, from this version's log stage; a bulk load of an already
-- embedded log may carry them).
CREATE FUNCTION switchboard.message_marks_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO switchboard.message_marks
        (message_id, session_id, person_id, agent_identity, conversation, created_at,
         embedded_model, summary_version)
    SELECT id, session_id, person_id, agent_identity, conversation, created_at,
           embedded_model, summary_version
      FROM logged
    ON CONFLICT (message_id) DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER messages_marks_insert AFTER INSERT ON switchboard.messages
    REFERENCING NEW TABLE AS logged
    FOR EACH STATEMENT EXECUTE FUNCTION switchboard.message_marks_insert();

-- Erasure deletes a person's messages: their marks go in the same statement.
CREATE FUNCTION switchboard.message_marks_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM switchboard.message_marks k USING erased e WHERE k.message_id = e.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER messages_marks_delete AFTER DELETE ON switchboard.messages
    REFERENCING OLD TABLE AS erased
    FOR EACH STATEMENT EXECUTE FUNCTION switchboard.message_marks_delete();

CREATE FUNCTION switchboard.message_marks_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE switchboard.message_marks;
    RETURN NULL;
END
$$;
CREATE TRIGGER messages_marks_truncate AFTER TRUNCATE ON switchboard.messages
    FOR EACH STATEMENT EXECUTE FUNCTION switchboard.message_marks_truncate();

-- The bridge for the previous version's workers (dropped with the columns): a mark they make on
-- the log is made here too. This version never writes those columns, so it never fires for it.
CREATE FUNCTION switchboard.message_marks_bridge() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE switchboard.message_marks
       SET embedded_model = NEW.embedded_model, summary_version = NEW.summary_version
     WHERE message_id = NEW.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER messages_marks_bridge AFTER UPDATE OF embedded_model, summary_version
    ON switchboard.messages
    FOR EACH ROW
    WHEN (OLD.embedded_model IS DISTINCT FROM NEW.embedded_model
          OR OLD.summary_version IS DISTINCT FROM NEW.summary_version)
    EXECUTE FUNCTION switchboard.message_marks_bridge();
