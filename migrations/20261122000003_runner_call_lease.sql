-- One runner call per session at a time, even across a dispatcher that lost its message (NATS
-- restart, ack_wait passed) but is still calling the runner. A session's call is leased to the
-- dispatcher process making it; the lease holds while that process is alive (it heartbeats in
-- `dispatchers`) and the call's own deadline has not passed.
ALTER TABLE switchboard.sessions
    ADD COLUMN running_call  UUID,
    ADD COLUMN running_by    UUID,
    ADD COLUMN running_until TIMESTAMPTZ;

CREATE TABLE switchboard.dispatchers (
    id          UUID PRIMARY KEY,
    alive_until TIMESTAMPTZ NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
