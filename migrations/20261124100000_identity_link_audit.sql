-- Identity links as data. A link from → to says that a message resolved to `from` is `to`'s
-- (the canonical person). An id has at most one canonical person, so it is unambiguous where
-- its messages go; chains (a → b → c) are followed by identify.
CREATE UNIQUE INDEX identity_links_one_canonical ON switchboard.identity_links (from_person_id);
CREATE INDEX identity_links_to ON switchboard.identity_links (to_person_id);
-- How the link was made: `link`, or `merge` (the contact points moved too).
ALTER TABLE switchboard.identity_links
    ADD COLUMN action TEXT NOT NULL DEFAULT 'link' CHECK (action IN ('link', 'merge'));

-- Every link, unlink and merge, with who, when and why; written in the action's transaction,
-- never updated. An action that changes nothing (linking what is already linked) adds no row.
CREATE TABLE switchboard.identity_link_audit (
    -- UUIDv7: time-ordered.
    id             UUID PRIMARY KEY,
    action         TEXT NOT NULL CHECK (action IN ('link', 'unlink', 'merge')),
    from_person_id TEXT NOT NULL,
    to_person_id   TEXT NOT NULL,
    -- Who: the operator (`--by`, else the OS user) or `api:<key owner>`.
    actor          TEXT NOT NULL,
    reason         TEXT NOT NULL,
    -- For a merge: the contact points it moved to `to` (`kind:address`).
    moved          TEXT[] NOT NULL DEFAULT '{}',
    at             TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX identity_link_audit_from ON switchboard.identity_link_audit (from_person_id, at DESC);
CREATE INDEX identity_link_audit_to ON switchboard.identity_link_audit (to_person_id, at DESC);
