-- The vector index's graph with twice pgvector's default connections per node (m = 32): at
-- 1,000,000 vectors the default graph (m = 16) left ~7 % of each search's true 10 nearest
-- unreachable, whatever hnsw.ef_search (recall@10 stopped at 0.93; docs/bench-memory.md).
-- The embedding worker creates other models' indexes with the same parameters.
DROP INDEX IF EXISTS switchboard.message_vectors_hnsw_all_minilm_l6_v2;
CREATE INDEX message_vectors_hnsw_all_minilm_l6_v2 ON switchboard.message_vectors
    USING hnsw ((embedding::halfvec(384)) halfvec_cosine_ops) WITH (m = 32, ef_construction = 64)
    WHERE model = 'all-MiniLM-L6-v2';
