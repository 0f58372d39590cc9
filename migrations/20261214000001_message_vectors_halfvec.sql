-- The vectors stored at half precision (pgvector's halfvec): a person's recall ranks all of their
-- vectors exactly, and at 1M vectors a heavy person's 3,400 took 6.4 ms at full precision
-- against 2.1 ms at half (p50, the same rows copied both ways; top-10 agreement 0.999;
-- docs/bench-memory.md, "Half precision"). The search index already read them as
-- `embedding::halfvec(N)`, so its answers do not change; its expression stays valid and is
-- rebuilt with the table.
--
-- Rolling upgrade: a previous version's worker still binds `$n::vector`, which converts to
-- halfvec implicitly (pgvector's cast), on insert and in `embedding <=> $n::vector(N)`; reading
-- `embedding::text` gives the same `[x,y,…]` form. The hand-offs (`handed_vectors`) stay full
-- precision: they are a few minutes' worth and converted as they are copied here.
--
-- The table is rewritten under an exclusive lock, its indexes rebuilt (measured at 1M vectors
-- on two cores: see docs/bench-memory.md): recall and the embedding worker wait for it, and
-- nothing is lost. Rebuilding a vector index of 1,000 lists needs more than the default
-- maintenance memory; the embedding worker's own builds use 1 GB (`vector_index::BUILD_MEMORY`).
SET LOCAL maintenance_work_mem = '1GB';
ALTER TABLE switchboard.message_vectors ALTER COLUMN embedding TYPE halfvec USING embedding::halfvec;
