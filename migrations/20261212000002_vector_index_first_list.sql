-- The default model's IVFFlat index from the start, with one list (a search reads every vector,
-- exactly), so the embedding worker's first start on a new database finds it fitting and runs
-- no index build among the first turns; it builds again, with lists learnt from the vectors,
-- once there are 2,000 of them (`switchboard_embed::vector_index`). On a database upgraded with
-- many vectors this build is one pass over them; the worker then rebuilds it with its lists.
CREATE INDEX IF NOT EXISTS message_vectors_ivf_all_minilm_l6_v2 ON switchboard.message_vectors
    USING ivfflat ((embedding::halfvec(384)) halfvec_cosine_ops) WITH (lists = 1)
    WHERE model = 'all-MiniLM-L6-v2';
