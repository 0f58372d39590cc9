-- Categorise finds the inbound message a reply answers by session and correlation id. With an
-- index on the correlation id alone, Postgres ANDed it with the whole of
-- `messages_person_inbound` (a partial index used only for its `direction = 'inbound'`
-- predicate): every inbound entry of the log read for each reply, ~38 ms a batch of twenty at
-- the bench's load (issue 42, docs/bench-memory-workers.md), 57 ms for sixteen over a 30,000-
-- message history (tests/tests/table_growth.rs) against 0.17 ms by this index. Same count of
-- indexes on the log: the lookups by correlation id alone use its first column.
CREATE INDEX messages_correlation_session ON switchboard.messages (correlation_id, session_id);
DROP INDEX switchboard.messages_correlation;
