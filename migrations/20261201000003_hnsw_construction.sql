-- The vector index's graph built with 128 candidates per insertion (ef_construction), not 64:
-- at m = 32, 64 is pgvector's floor (2 * m), and the graph it builds left ~5 % of a search's
-- true 10 nearest unreached at 1,000,000 vectors even at hnsw.ef_search 1000 (recall@10 0.951
-- to 0.957; docs/bench-memory.md). The embedding worker creates other models' indexes with
-- the same parameters.
DROP INDEX IF EXISTS switchboard.message_vectors_hnsw_all_minilm_l6_v2;
CREATE INDEX message_vectors_hnsw_all_minilm_l6_v2 ON switchboard.message_vectors
    USING hnsw ((embedding::halfvec(384)) halfvec_cosine_ops) WITH (m = 32, ef_construction = 128)
    WHERE model = 'all-MiniLM-L6-v2';
