-- When a dispatcher first took the turn up: leased the session's call slot for it, in the
-- same statement (so the hot path gains no round trip). Set once; a redelivered turn keeps
-- its first pickup. NULL for a turn never taken up itself (one joined into an earlier turn's
-- call). It tells who met a down runner at a dispatcher, and so must have been told, from
-- whose turn reached one only after the runner was back.
ALTER TABLE switchboard.turns ADD COLUMN picked_at TIMESTAMPTZ;
