-- What a provider reports about a message it took from us, later (WhatsApp's statuses,
-- Twilio's status callbacks): sent, delivered, read, or failed after all. Kept by the
-- provider's message id, the id the delivery ledger lists for the part
-- (deliveries.provider_message_ids); a report may come before the ledger records that id, so it
-- is a row of its own, read when the reply's outcome is asked for. One row a status: a
-- provider's repeated report is the same row. Kept as long as the deliveries they speak of
-- (erased with them when a person is forgotten).
CREATE TABLE switchboard.delivery_receipts (
    provider            TEXT NOT NULL,
    provider_message_id TEXT NOT NULL,
    status              TEXT NOT NULL CHECK (status IN ('sent', 'delivered', 'read', 'failed')),
    -- Why it failed, as the provider says it (its code and title).
    error               TEXT,
    reported_at         TIMESTAMPTZ NOT NULL,
    received_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, provider_message_id, status)
);
