-- A reply that is logged but not sent (a heartbeat's "nothing to report", HEARTBEAT_OK) is
-- recorded in the ledger as `skipped`, settled like sent or failed, so the session's later
-- replies do not wait for it.
ALTER TABLE switchboard.deliveries DROP CONSTRAINT deliveries_status_check;
ALTER TABLE switchboard.deliveries ADD CONSTRAINT deliveries_status_check
    CHECK (status IN ('pending', 'sent', 'failed', 'skipped'));
