-- Session scope keys name the agent and the scope mode (`session.scope`), e.g.
-- `reggie_oc:person:staff:17`. Sessions made before carried `<person_type>:<person_id>`, which is
-- the default `person` scope: rewrite exactly those, so the same person keeps the same session.
UPDATE switchboard.sessions
   SET scope_key = agent_name || ':person:' || scope_key
 WHERE scope_key = person_type || ':' || person_id;
