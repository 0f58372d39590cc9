-- The names of the tools the engine called in a turn (the runner reports them when the engine
-- does; names only, never arguments), kept with the turn's stored reply so a reply sent again
-- from the store (a redelivered turn) still carries them. NULL on turns from before.
ALTER TABLE switchboard.turns ADD COLUMN tool_names TEXT[];
