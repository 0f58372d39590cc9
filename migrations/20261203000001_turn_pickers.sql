-- Which dispatcher process first took each turn up, and which process a dispatcher is (its
-- `host:pid`, as its logs and metrics name it): an operator can then tell a turn held by a
-- dispatcher that died from one a live dispatcher kept (the chaos verdict does). Both columns
-- are written by statements that already run (the heartbeat, the lease): no extra round trip.
ALTER TABLE switchboard.dispatchers ADD COLUMN instance TEXT;
ALTER TABLE switchboard.turns ADD COLUMN picked_by UUID;
