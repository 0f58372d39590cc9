\o /dev/null
SELECT set_config('sb.old', :'old', false), set_config('sb.new', :'new', false);
DO $$
DECLARE
  old oid := current_setting('sb.old')::regrole;
  new text := quote_ident(current_setting('sb.new'));
  r record;
BEGIN
  FOR r IN SELECT n.oid, n.nspname FROM pg_namespace n
           WHERE n.nspowner = old AND n.nspname NOT IN ('public', 'information_schema')
             AND n.nspname NOT LIKE 'pg\_%'
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_namespace'::regclass
                             AND d.objid = n.oid AND d.deptype = 'e') LOOP
    EXECUTE format('ALTER SCHEMA %I OWNER TO %s', r.nspname, new);
  END LOOP;
  -- Tables, views, foreign tables; their indexes and owned sequences follow.
  FOR r IN SELECT c.oid::regclass AS rel, c.relkind FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE c.relowner = old AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
             AND n.nspname NOT IN ('pg_catalog', 'information_schema')
             AND n.nspname NOT LIKE 'pg\_%'
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                             AND d.objid = c.oid AND d.deptype IN ('e', 'a', 'i')) LOOP
    IF r.relkind = 'S' THEN
      EXECUTE format('ALTER SEQUENCE %s OWNER TO %s', r.rel, new);
    ELSIF r.relkind = 'v' THEN
      EXECUTE format('ALTER VIEW %s OWNER TO %s', r.rel, new);
    ELSIF r.relkind = 'm' THEN
      EXECUTE format('ALTER MATERIALIZED VIEW %s OWNER TO %s', r.rel, new);
    ELSIF r.relkind = 'f' THEN
      EXECUTE format('ALTER FOREIGN TABLE %s OWNER TO %s', r.rel, new);
    ELSE
      EXECUTE format('ALTER TABLE %s OWNER TO %s', r.rel, new);
    END IF;
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
           JOIN pg_namespace n ON n.oid = p.pronamespace
           WHERE p.proowner = old AND n.nspname NOT IN ('pg_catalog', 'information_schema')
             AND n.nspname NOT LIKE 'pg\_%'
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                             AND d.objid = p.oid AND d.deptype = 'e') LOOP
    EXECUTE format('ALTER ROUTINE %s OWNER TO %s', r.fn, new);
  END LOOP;
  -- Enums, domains, composite and range types of their own (not a table's row type, not
  -- an array type: those follow).
  FOR r IN SELECT t.oid::regtype AS ty FROM pg_type t
           JOIN pg_namespace n ON n.oid = t.typnamespace
           WHERE t.typowner = old AND t.typtype IN ('e', 'd', 'c', 'r')
             AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c')
             AND n.nspname NOT IN ('pg_catalog', 'information_schema')
             AND n.nspname NOT LIKE 'pg\_%'
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_type'::regclass
                             AND d.objid = t.oid AND d.deptype = 'e') LOOP
    EXECUTE format('ALTER TYPE %s OWNER TO %s', r.ty, new);
  END LOOP;
END
$$;
