//! Each model's vector index, the one searches across people walk (a person's recall and
//! search are exact and use none): pgvector's IVFFlat over the vectors' `halfvec`, built in
//! bulk and built again as the vectors grow.
//!
//! Why not an HNSW graph (issue 42, docs/bench-memory.md): every stored vector paid its insert
//! into the graph, 2.6-5.7 ms of Postgres CPU at 1M vectors (m 32 / ef_construction 128; the
//! cheaper graphs did not find 0.95 of the true top 10 at 1M), the largest single cost of a
//! turn with memory on. An IVFFlat insert only finds its list's centroid (0.08 ms at 1M), and
//! the centroids are learnt in bulk, by k-means, when the index is built (43 s at 1M against
//! the graph's 601 s). Lists learnt on few vectors would split later ones badly, so the index
//! is built again, beside the old one, whenever the vectors have grown enough to want twice
//! the lists: the builds add up to at most about twice the last one.
use sqlx::PgPool;

/// pgvector indexes `halfvec` of at most this many dimensions.
pub const MAX_DIMENSIONS: usize = 4_000;
/// Vectors per list: pgvector's advice (rows / 1000 lists up to 1M rows, √rows beyond).
const ROWS_PER_LIST: i64 = 1_000;
/// A build samples 50 vectors per list for k-means; this keeps it in memory to √rows lists of
/// 4,000 dimensions (pgvector refuses a build that does not fit).
const BUILD_MEMORY: &str = "1GB";

/// The index a model's vectors have now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexState {
    Missing,
    /// The HNSW graph earlier versions built (the migration's, or one per other model).
    Graph,
    /// IVFFlat with this many lists.
    Lists(u32),
}

/// The lists an index over `rows` vectors is built with.
pub fn lists_for(rows: i64) -> u32 {
    let lists = if rows <= ROWS_PER_LIST * ROWS_PER_LIST {
        rows / ROWS_PER_LIST
    } else {
        (rows as f64).sqrt() as i64
    };
    lists.clamp(1, 32_768) as u32
}

/// The lists to build the index with now, if it is to be built: when it is missing, is still
/// a graph, or the vectors want at least twice its lists.
pub fn plan(state: IndexState, rows: i64) -> Option<u32> {
    let wanted = lists_for(rows);
    match state {
        IndexState::Missing | IndexState::Graph => Some(wanted),
        IndexState::Lists(lists) if wanted >= lists.saturating_mul(2) => Some(wanted),
        IndexState::Lists(_) => None,
    }
}

/// An index name for `model` after `prefix`, as Postgres keeps it (63 bytes at most), with
/// room for `suffix`.
fn name(prefix: &str, model: &str, suffix: &str) -> String {
    let mut name = String::from(prefix);
    let mut last_underscore = true;
    for c in model.chars() {
        if c.is_ascii_alphanumeric() {
            name.push(c.to_ascii_lowercase());
            last_underscore = false;
        } else if !last_underscore {
            name.push('_');
            last_underscore = true;
        }
    }
    name.truncate(63 - suffix.len());
    let mut name = name.trim_end_matches('_').to_string();
    name.push_str(suffix);
    name
}

/// The name of `model`'s vector index.
pub fn index_name(model: &str) -> String {
    name("message_vectors_ivf_", model, "")
}

/// The name the next build of `model`'s index takes until it replaces the index.
fn next_name(model: &str) -> String {
    name("message_vectors_ivf_", model, "_next")
}

/// The name of the HNSW graph earlier versions built for `model`.
pub fn graph_name(model: &str) -> String {
    name("message_vectors_hnsw_", model, "")
}

/// The index `model`'s vectors have now.
pub async fn index_state(db: &PgPool, model: &str) -> Result<IndexState, sqlx::Error> {
    let ivf: Option<Vec<String>> = sqlx::query_scalar(
        "SELECT coalesce(c.reloptions, '{}') FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           JOIN pg_index i ON i.indexrelid = c.oid
          WHERE n.nspname = 'switchboard' AND c.relname = $1 AND i.indisvalid",
    )
    .bind(index_name(model))
    .fetch_optional(db)
    .await?;
    if let Some(options) = ivf {
        let lists = options
            .iter()
            .find_map(|o| o.strip_prefix("lists=")?.parse().ok())
            .unwrap_or(100); // pgvector's default when the index names none
        return Ok(IndexState::Lists(lists));
    }
    let graph: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_indexes
                         WHERE schemaname = 'switchboard' AND indexname = $1)",
    )
    .bind(graph_name(model))
    .fetch_one(db)
    .await?;
    Ok(if graph {
        IndexState::Graph
    } else {
        IndexState::Missing
    })
}

/// What [`keep_index`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// The index fits the vectors (or another process is building it).
    AsItWas,
    /// Built with `lists` over `rows` vectors.
    Built { lists: u32, rows: i64 },
}

/// Build `model`'s index if it is missing or the vectors have outgrown it. One process builds
/// at a time (an advisory lock per model); searches and inserts go on during the build, which
/// happens beside the old index (`CREATE INDEX CONCURRENTLY`) and replaces it when complete.
pub async fn keep_index(db: &PgPool, model: &str, dimensions: usize) -> Result<Kept, sqlx::Error> {
    if dimensions == 0 || dimensions > MAX_DIMENSIONS || fits(db, model).await? {
        return Ok(Kept::AsItWas);
    }
    // A connection of its own, closed when done: the session's advisory lock goes with it
    // whatever happens (an error, a worker stopped mid-build), never back into the pool held.
    let mut conn = db.acquire().await?.detach();
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1))")
        .bind(format!("switchboard.vector_index:{model}"))
        .fetch_one(&mut conn)
        .await?;
    if !locked {
        return Ok(Kept::AsItWas);
    }
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM switchboard.message_vectors WHERE model = $1")
            .bind(model)
            .fetch_one(&mut conn)
            .await?;
    // Read again under the lock: another process may have built it meanwhile.
    let Some(lists) = plan(index_state(db, model).await?, rows) else {
        return Ok(Kept::AsItWas);
    };
    build(&mut conn, model, dimensions, lists).await?;
    Ok(Kept::Built { lists, rows })
}

/// Whether `model`'s index surely fits its vectors, without counting them. Counting reads
/// every vector of the model (at 1M an index of ~40 MB, or a heap of ~1.7 GB, every minute,
/// through the cache recall needs); the table's row estimate (every model's vectors, kept by
/// autovacuum's analyze: it lags growth by about autovacuum's 10 %, and a rebuild waits for
/// twice the vectors) says first whether a count could change anything.
async fn fits(db: &PgPool, model: &str) -> Result<bool, sqlx::Error> {
    let state = index_state(db, model).await?;
    if !matches!(state, IndexState::Lists(_)) {
        return Ok(false);
    }
    let estimate: f32 = sqlx::query_scalar(
        "SELECT reltuples FROM pg_class WHERE oid = 'switchboard.message_vectors'::regclass",
    )
    .fetch_one(db)
    .await?;
    Ok(estimate >= 0.0 && plan(state, estimate as i64).is_none())
}

/// Build `model`'s index with `lists` beside the one there (a build left half done by a crash
/// is dropped first), then put it in the old one's place; an HNSW graph of earlier versions
/// goes with it. DDL takes no parameters: the model is written in as a literal.
pub async fn build(
    conn: &mut sqlx::PgConnection,
    model: &str,
    dimensions: usize,
    lists: u32,
) -> Result<(), sqlx::Error> {
    let (name, next) = (index_name(model), next_name(model));
    drop_index(conn, &next).await?;
    sqlx::query(&format!("SET maintenance_work_mem = '{BUILD_MEMORY}'"))
        .execute(&mut *conn)
        .await?;
    let built = sqlx::query(&format!(
        "CREATE INDEX CONCURRENTLY {next} ON switchboard.message_vectors
             USING ivfflat ((embedding::halfvec({dimensions})) halfvec_cosine_ops)
             WITH (lists = {lists})
             WHERE model = {model}",
        model = switchboard_memory::search::sql_literal(model),
    ))
    .execute(&mut *conn)
    .await;
    sqlx::query("RESET maintenance_work_mem")
        .execute(&mut *conn)
        .await?;
    built?;
    drop_index(conn, &name).await?;
    drop_index(conn, &graph_name(model)).await?;
    sqlx::query(&format!("ALTER INDEX switchboard.{next} RENAME TO {name}"))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Drop the index `name` if it is there, without blocking writes (an index name, not input).
async fn drop_index(conn: &mut sqlx::PgConnection, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "DROP INDEX CONCURRENTLY IF EXISTS switchboard.{name}"
    ))
    .execute(conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_follow_pgvectors_advice() {
        assert_eq!(lists_for(0), 1);
        assert_eq!(lists_for(999), 1);
        assert_eq!(lists_for(50_000), 50);
        assert_eq!(lists_for(1_000_000), 1_000);
        assert_eq!(lists_for(4_000_000), 2_000);
    }

    #[test]
    fn the_index_is_built_when_missing_or_a_graph_and_again_when_outgrown() {
        assert_eq!(plan(IndexState::Missing, 0), Some(1));
        assert_eq!(plan(IndexState::Graph, 1_000_000), Some(1_000));
        assert_eq!(plan(IndexState::Lists(1), 1_999), None);
        assert_eq!(plan(IndexState::Lists(1), 2_000), Some(2));
        assert_eq!(plan(IndexState::Lists(500), 999_999), None);
        assert_eq!(plan(IndexState::Lists(500), 1_000_000), Some(1_000));
        // Erasures shrink the vectors: the index stays, never rebuilt smaller.
        assert_eq!(plan(IndexState::Lists(1_000), 10), None);
    }

    #[test]
    fn each_model_gets_index_names_postgres_keeps_whole() {
        assert_eq!(
            index_name("all-MiniLM-L6-v2"),
            "message_vectors_ivf_all_minilm_l6_v2"
        );
        assert_eq!(
            graph_name("all-MiniLM-L6-v2"),
            "message_vectors_hnsw_all_minilm_l6_v2"
        );
        assert_eq!(
            index_name("a'; DROP TABLE x"),
            "message_vectors_ivf_a_drop_table_x"
        );
        let long = "m".repeat(100);
        assert_eq!(index_name(&long).len(), 63);
        assert_eq!(next_name(&long).len(), 63);
        assert!(next_name(&long).ends_with("_next"));
        assert_ne!(index_name(&long), next_name(&long));
    }
}
