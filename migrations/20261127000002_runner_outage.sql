-- Turns that wait out an outage of their agent's runner (and, past dispatch.max_turn_age_s
-- with stale_turns = expire, are not run but expired: journal kind `expired`). The session says so (status
-- `waiting`, since when), and the person is told once per outage: the notice's reply id is
-- kept until the session's next answered turn, so every wait re-emits the same notice (deduped
-- by the delivery ledger) instead of a new one.
ALTER TABLE switchboard.sessions
    ADD COLUMN waiting_since  TIMESTAMPTZ,
    ADD COLUMN waiting_notice UUID;

ALTER TABLE switchboard.session_events DROP CONSTRAINT IF EXISTS session_events_kind_check;
ALTER TABLE switchboard.session_events ADD CONSTRAINT session_events_kind_check
    CHECK (kind IN ('message_in', 'turn_started', 'reply', 'reset', 'reset_requested', 'failure',
                    'waiting', 'expired'));

-- A mailbox entry is the turn's answer (`reply`) or something Switchboard tells the person
-- while the turn waits (`notice`): an API caller waiting for the answer is not answered by a
-- notice.
ALTER TABLE switchboard.mailbox
    ADD COLUMN kind TEXT NOT NULL DEFAULT 'reply' CHECK (kind IN ('reply', 'notice'));
