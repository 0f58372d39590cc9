-- Which summary version merged each message (NULL: not summarised yet). The summary worker
-- selects what it has not merged by this mark, not by "after the last message merged": a
-- message logged late (its id minted long before, at the gateway) is merged by the next
-- version instead of being passed over. Set in the transaction of the summary's
-- compare-and-set, for exactly the messages that version merged (and for the messages that
-- are not conversation, which are never merged, so that they leave the partial index).
ALTER TABLE switchboard.messages ADD COLUMN summary_version BIGINT;

-- What the summaries written so far cover (every message up to their last one).
UPDATE switchboard.messages m
   SET summary_version = y.version
  FROM switchboard.sessions s
  JOIN switchboard.summaries y ON y.memory_key = s.memory_key
 WHERE s.id = m.session_id
   AND y.last_message_in_summary IS NOT NULL
   AND m.id <= y.last_message_in_summary;

-- The unsummarised messages of a key, and the sweeper's look for quiet keys.
CREATE INDEX messages_unsummarised ON switchboard.messages (session_id, id)
    WHERE summary_version IS NULL;
