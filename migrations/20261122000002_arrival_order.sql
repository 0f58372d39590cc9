-- Per-sender arrival cursors: the last arrival number (within its epoch) the session stage has
-- placed for a sender, so a sender's messages open turns in the order they were accepted.
CREATE TABLE switchboard.arrival_cursors (
    channel    text        NOT NULL,
    sender     text        NOT NULL,
    epoch      bigint      NOT NULL,
    last_seq   bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel, sender)
);
