-- Retention (the identify worker's sweep, `[retention]`): rows nothing waits for any more are
-- deleted by age, in bounded batches; these indexes let it find them without reading each table.
CREATE INDEX api_requests_created ON switchboard.api_requests (created_at);
CREATE INDEX mailbox_created ON switchboard.mailbox (created_at);
CREATE INDEX link_claims_created ON switchboard.link_claims (created_at);
CREATE INDEX link_proof_answers_at ON switchboard.link_proof_answers (at);
CREATE INDEX link_proof_answers_claim ON switchboard.link_proof_answers (claim_id);

-- An API request whose message never went in (refused by the rate limit after its row was
-- written, and the row's delete failed; or lost) would read `pending` forever: once it has had
-- no turn for `retention.api_pending_expiry_s`, the sweep marks it expired, for good.
ALTER TABLE switchboard.api_requests ADD COLUMN expired_at TIMESTAMPTZ;
