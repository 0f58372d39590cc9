-- Erasures as durable jobs (`DELETE /api/v1/people/<id>` answers 202 with one; `GET
-- /api/v1/erasures/<id>` and `switchboard forget` follow it). The row is written in the
-- erasure's own transaction, so a committed erasure always has a job that the forget-sweep
-- stage finishes, across crashes.
--
-- status: `erasing` (rows erased; the streams' copies not yet swept), `sweeping` (swept once;
-- waiting for stages still busy with what they read before, then sweeping what they published
-- late), `done` (`person.forgotten` published), `failed` (deletes that kept failing, listed in
-- `failures`; running the erasure again retries the job).
CREATE TABLE switchboard.erasure_jobs (
    id            UUID PRIMARY KEY,
    -- The person, as the tombstone names them (SHA-256 of their id), never the id itself.
    person_sha256 BYTEA NOT NULL,
    status        TEXT NOT NULL
        CHECK (status IN ('erasing', 'sweeping', 'done', 'failed')),
    -- Per kind, how many were removed (`{"messages": 12, "stream_messages": 3, …}`).
    removed       JSONB NOT NULL DEFAULT '{}'::jsonb,
    -- The deletes that failed after retries: `[{"what", "where", "error"}]`.
    failures      JSONB NOT NULL DEFAULT '[]'::jsonb,
    -- The streams' marks at the first sweep (stream names and sequences only).
    marks         JSONB,
    -- What the stage needs to find the person's stream messages (a ForgetSweep protobuf: their
    -- ids, sessions, messages and senders). Set to NULL once the job is done.
    pending       BYTEA,
    -- Who asked (the API key's owner, or `cli`).
    requested_by  TEXT NOT NULL DEFAULT '',
    forgotten_at  TIMESTAMPTZ NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at   TIMESTAMPTZ
);
CREATE INDEX erasure_jobs_person ON switchboard.erasure_jobs (person_sha256, created_at DESC);
-- Jobs not finished, for the stage's re-queue of jobs whose work message was lost.
CREATE INDEX erasure_jobs_open ON switchboard.erasure_jobs (updated_at)
    WHERE status IN ('erasing', 'sweeping');
