-- The part a deliverer is about to hand to the provider, written before the send (by the claim
-- that creates the row, by the record of the part before, or on its own). A later claimer that
-- finds it, with no record that the part went out, cannot know whether the provider took it:
-- it asks the provider's message log for messages created since `attempt_started_at` before
-- sending the part again. Cleared when the part is recorded as sent.
ALTER TABLE switchboard.deliveries
    ADD COLUMN attempt_part       INT,
    ADD COLUMN attempt_started_at TIMESTAMPTZ;
