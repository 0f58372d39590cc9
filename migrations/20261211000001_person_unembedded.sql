-- A person's messages the vector index has not reached yet, found without reading the person's
-- log: every recall asks for its person's index lag, and reading a heavy person's thousands of
-- messages for it (3,433 at 1M in the memory bench: 2.2 ms, the same again as the ranking
-- beside it) made most of their recall. Near empty in the steady state, as
-- `messages_unembedded` is.
CREATE INDEX messages_person_unembedded ON switchboard.messages (person_id, agent_identity)
    WHERE embedded_model IS NULL AND conversation;
