-- A session shared by everyone who writes to its agent (scope `main`, scope key `<agent>:main`)
-- is never summarised (issue 45; docs/memory.md, "Shared sessions carry no one's memory").
--
-- Its summary was never loaded into any prompt, yet writing it sent several people's words to
-- the model in one prompt and kept them in one row attributed to whoever wrote first, where the
-- erasure of anyone else did not reach them. Its messages are now marked with summary version
-- 0 as they are logged ("never merged", as a message that is not conversation is once a
-- version passes it), so they never enter the unsummarised index the summary worker reads.

-- Every message has its marks row from the statement that logs it (20261213000001); a message
-- of a shared session gets version 0 there.
CREATE OR REPLACE FUNCTION switchboard.message_marks_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO switchboard.message_marks
        (message_id, session_id, person_id, agent_identity, conversation, created_at,
         embedded_model, summary_version)
    SELECT l.id, l.session_id, l.person_id, l.agent_identity, l.conversation, l.created_at,
           l.embedded_model,
           CASE WHEN s.scope_key = s.agent_name || ':main' THEN coalesce(l.summary_version, 0)
                ELSE l.summary_version END
      FROM logged l
      LEFT JOIN switchboard.sessions s ON s.id = l.session_id
    ON CONFLICT (message_id) DO NOTHING;
    RETURN NULL;
END
$$;

-- What shared sessions logged before: marked, and the summaries written from it erased.
UPDATE switchboard.message_marks k
   SET summary_version = 0
  FROM switchboard.sessions s
 WHERE s.id = k.session_id AND s.scope_key = s.agent_name || ':main'
   AND k.summary_version IS NULL;

DELETE FROM switchboard.summaries y
 WHERE EXISTS (SELECT 1 FROM switchboard.sessions s
                WHERE s.memory_key = y.memory_key AND s.scope_key = s.agent_name || ':main');
