//! The vector index survives vacuum while people keep writing: the memory's HNSW graph is
//! vacuumed (autovacuum, retention's deletions, erasures) while the embedding worker inserts and
//! recall and search read. pgvector before 0.8.3 could corrupt an HNSW index vacuumed under
//! inserts, and before 0.8.4 failed inserts and vacuums with `hnsw graph not repaired`; the
//! stack builds a version with both fixes (`services/stack/src/pins.rs`).
//!
//! The workload is pgvector's own regression test for those fixes (`test/t/047_hnsw_vacuum_insert.pl`:
//! five clients, a thousand transactions each, inserts and deletes half and half, a few nearest-
//! neighbour reads and now and then a VACUUM), run here against the server `make test` starts.
//! The races those releases fixed are rare: the workload did not fail on 0.8.0 in five runs here
//! (2026-12-06), so it guards the graph's health and the version check is what fails against a
//! stack without the fixes (seen: the wheel's 0.8.2).
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use switchboard_e2e::fresh_database;

const CLIENTS: usize = 5;
const TRANSACTIONS: usize = 1_000;
const ROWS: i64 = 1_000;

/// pgbench's weights in 047: insert 500, delete 500, select 20, vacuum 1.
#[derive(Debug, Clone, Copy)]
enum Step {
    Insert,
    Delete,
    Select,
    Vacuum,
}

fn step(roll: u64) -> Step {
    match roll % 1_021 {
        0..500 => Step::Insert,
        500..1_000 => Step::Delete,
        1_000..1_020 => Step::Select,
        _ => Step::Vacuum,
    }
}

/// A small xorshift per client: which statement each transaction runs (the vectors themselves
/// come from the server's `random()`).
fn next(state: &AtomicU64) -> u64 {
    let mut x = state.load(Ordering::Relaxed);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    state.store(x, Ordering::Relaxed);
    x
}

async fn run(db: &PgPool, step: Step) -> Result<(), sqlx::Error> {
    let sql = match step {
        Step::Insert => "INSERT INTO vacuum_probe (v) VALUES (ARRAY[random(), random(), random()])",
        Step::Delete => "DELETE FROM vacuum_probe WHERE i = (SELECT i FROM vacuum_probe LIMIT 1)",
        Step::Select => {
            "SELECT i FROM vacuum_probe
              ORDER BY v <-> (SELECT ARRAY[random(), random(), random()]::vector) LIMIT 10"
        }
        Step::Vacuum => "VACUUM vacuum_probe",
    };
    // VACUUM cannot run in a transaction block: every step as a simple query of its own.
    sqlx::raw_sql(sql).execute(db).await.map(|_| ())
}

/// (major, minor, patch) of a version string such as `0.8.5`.
fn version(v: &str) -> (u32, u32, u32) {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

/// A new database of the test stack with the product's schema (and so its extension), on a pool
/// wide enough for the clients.
async fn database() -> PgPool {
    let url = fresh_database(&std::env::var("SB_DATABASE_URL").expect("SB_DATABASE_URL")).await;
    let db = PgPoolOptions::new()
        .max_connections(CLIENTS as u32 + 1)
        .connect(&url)
        .await
        .expect("the test database");
    switchboard_kit::db::migrate(&db).await.expect("the schema");
    db
}

#[tokio::test]
async fn the_stacks_pgvector_has_the_hnsw_vacuum_fixes() {
    let db = database().await;
    let installed: String =
        sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            .fetch_one(&db)
            .await
            .expect("the vector extension is installed");
    assert!(
        version(&installed) >= (0, 8, 4),
        "pgvector {installed}: HNSW vacuuming can corrupt the index or fail inserts before 0.8.4"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vector_index_stays_whole_when_vacuumed_while_rows_come_and_go() {
    let db = &database().await;
    sqlx::raw_sql(
        "CREATE TABLE vacuum_probe (i serial, v vector(3));
         ALTER TABLE vacuum_probe SET (autovacuum_enabled = false);",
    )
    .execute(db)
    .await
    .expect("the probe table");
    sqlx::query(
        "INSERT INTO vacuum_probe (v)
         SELECT ARRAY[random(), random(), random()] FROM generate_series(1, $1)",
    )
    .bind(ROWS)
    .execute(db)
    .await
    .expect("the first rows");
    sqlx::raw_sql("CREATE INDEX ON vacuum_probe USING hnsw (v vector_l2_ops)")
        .execute(db)
        .await
        .expect("the graph");

    let clients = (0..CLIENTS).map(|c| {
        let db = db.clone();
        tokio::spawn(async move {
            let state = AtomicU64::new(0x9E37_79B9_7F4A_7C15 ^ ((c as u64 + 1) << 32));
            let mut errors = Vec::new();
            let mut vacuums = 0;
            for _ in 0..TRANSACTIONS {
                let step = step(next(&state));
                if matches!(step, Step::Vacuum) {
                    vacuums += 1;
                }
                if let Err(e) = run(&db, step).await {
                    errors.push(format!("{step:?}: {e}"));
                }
            }
            (errors, vacuums)
        })
    });
    let mut errors = Vec::new();
    let mut vacuums = 0;
    for client in futures::future::join_all(clients).await {
        let (e, v) = client.expect("a client");
        errors.extend(e);
        vacuums += v;
    }
    // Every client ran its vacuums among the others' writes (each a 1-in-1,021 roll: the seeds
    // above give some to every run; a run without one would prove nothing).
    assert!(vacuums > 0, "no VACUUM ran: the workload proves nothing");
    assert!(
        errors.is_empty(),
        "{} of {} statements failed under vacuum, first: {:?}",
        errors.len(),
        CLIENTS * TRANSACTIONS,
        errors.iter().take(5).collect::<Vec<_>>()
    );

    // And the graph still finds what the table holds, vacuumed once more: every row within
    // reach of an index scan (ef_search at its largest, the scan going on until the limit is
    // met), as a sequential scan counts them.
    run(db, Step::Vacuum).await.expect("a last vacuum");
    let mut tx = db.begin().await.expect("a transaction");
    sqlx::raw_sql(
        "SET LOCAL enable_seqscan = off;
         SET LOCAL hnsw.ef_search = 1000;
         SET LOCAL hnsw.iterative_scan = strict_order;",
    )
    .execute(&mut *tx)
    .await
    .expect("index scans only");
    let by_index: Vec<i32> =
        sqlx::query_scalar("SELECT i FROM vacuum_probe ORDER BY v <-> '[0.5,0.5,0.5]' LIMIT 1000")
            .fetch_all(&mut *tx)
            .await
            .expect("read along the graph");
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT i FROM vacuum_probe ORDER BY v <-> '[0.5,0.5,0.5]' LIMIT 1000",
    )
    .fetch_all(&mut *tx)
    .await
    .expect("the plan");
    tx.rollback().await.expect("rollback");
    assert!(
        plan.iter().any(|l| l.contains("Index Scan")),
        "the read did not use the graph: {plan:?}"
    );
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM vacuum_probe")
        .fetch_one(db)
        .await
        .expect("count");
    let reachable = (total as usize).min(1000);
    assert!(
        by_index.len() >= reachable * 95 / 100,
        "the graph reaches {} of the {total} rows the table holds (want ≥ 95 % of {reachable})",
        by_index.len()
    );
}
