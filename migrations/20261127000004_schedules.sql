-- `[[schedules]]`: each time a schedule fired, so that every dispatch replica (each runs the
-- scheduler) fires it once. The messages themselves are deduplicated by their Nats-Msg-Id and
-- by their turn's provider id (`schedule:<name>:<time>:<person>`); this row stops the
-- replicas from firing it again once JetStream's duplicate window has passed.
CREATE TABLE switchboard.schedule_fires (
    schedule   TEXT NOT NULL,
    fire_at    TIMESTAMPTZ NOT NULL,
    people     INT NOT NULL,
    fired_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, fire_at)
);
