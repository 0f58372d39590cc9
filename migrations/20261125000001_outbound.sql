-- Agent-started messages (`POST /api/v1/outbound`) go to the person's latest inbound message's
-- channel and addresses (kept in its `metadata` by the inbound log): find it by person.
CREATE INDEX messages_person_inbound ON switchboard.messages (person_id, id DESC)
    WHERE direction = 'inbound';
