-- People erased by `switchboard forget` / `DELETE /api/v1/people/<id>`: one tombstone each,
-- written in the erasure's transaction. Work of theirs still in flight (a message received
-- before `forgotten_at`) is dropped by every stage that would write it back; a message they send
-- afterwards starts over. The person is named by a SHA-256 of their id, not the id itself, so
-- that after the erasure no table names them, while a late write can still be recognised.
CREATE TABLE switchboard.forgotten_people (
    person_sha256 BYTEA PRIMARY KEY,
    forgotten_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- What the erasure removed, per kind (`{"messages": 12, "sessions": 2, …}`).
    removed       JSONB NOT NULL DEFAULT '{}'::jsonb
);
