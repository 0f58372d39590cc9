-- The default model's HNSW graph goes (issue 42): every stored vector paid its insert into the
-- graph (2.6-5.7 ms of Postgres CPU at 1M vectors, docs/bench-memory.md). Each model's index is
-- now pgvector's IVFFlat, built in bulk by the embedding worker from the vectors there
-- (`switchboard_embed::vector_index`) and built again as they grow; until it is there a search
-- across people ranks every vector of the model exactly.
DROP INDEX IF EXISTS switchboard.message_vectors_hnsw_all_minilm_l6_v2;
