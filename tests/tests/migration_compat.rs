//! Expand, then contract: a migration must not break the version before it, whose workers still
//! run while the new version's first process migrates (a rolling upgrade, docs/operations.md).
//! `migrations/compat/previous-queries.json` holds that version's compile-time-checked queries
//! (`make migration-baseline` records them from git); each is described here against a
//! database with every migration of today applied, as the old workers would run it.
use std::path::PathBuf;

use serde::Deserialize;
use sqlx::{Column as _, Executor as _, TypeInfo as _};
use switchboard_e2e::fresh_database;
use switchboard_kit::db::MIGRATOR;

#[derive(Deserialize)]
struct Baseline {
    newest_migration: String,
    previous_version: String,
    queries: Vec<PreviousQuery>,
}

#[derive(Deserialize)]
struct PreviousQuery {
    query: String,
    columns: Vec<PreviousColumn>,
}

#[derive(Deserialize)]
struct PreviousColumn {
    name: String,
    /// sqlx's offline name of the type: `Uuid`, `Int8`, `TextArray`, ….
    #[serde(rename = "type")]
    type_info: serde_json::Value,
}

fn migrations_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../migrations")
}

/// Postgres's name of a type as sqlx's offline data spells it (`TextArray` → `TEXT[]`); `None`
/// for what carries no type to compare.
fn postgres_name(offline: &serde_json::Value) -> Option<String> {
    let name = offline.as_str()?;
    if name == "Void" || name == "Unknown" {
        return None;
    }
    Some(match name.strip_suffix("Array") {
        Some(base) => format!("{}[]", base.to_uppercase()),
        None => name.to_uppercase(),
    })
}

#[tokio::test]
async fn the_previous_versions_queries_still_run_on_the_migrated_schema() {
    let baseline: Baseline = serde_json::from_str(
        &std::fs::read_to_string(migrations_dir().join("compat/previous-queries.json"))
            .expect("migrations/compat/previous-queries.json"),
    )
    .expect("previous-queries.json parses");
    let newest = std::fs::read_dir(migrations_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".sql"))
        .max()
        .expect("migrations");
    assert_eq!(
        baseline.newest_migration, newest,
        "migration {newest} has no record of the version before it: run `make \
         migration-baseline` and commit migrations/compat/previous-queries.json"
    );
    assert!(!baseline.queries.is_empty());

    let url = fresh_database(&std::env::var("SB_DATABASE_URL").expect("SB_DATABASE_URL")).await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    MIGRATOR.run(&pool).await.unwrap();

    let mut broken = Vec::new();
    for q in &baseline.queries {
        let described = match pool.describe(&q.query).await {
            Ok(d) => d,
            Err(e) => {
                broken.push(format!("{e}\n  in: {}", q.query));
                continue;
            }
        };
        let now = described.columns();
        if now.len() != q.columns.len() {
            broken.push(format!(
                "returns {} columns, the previous version reads {}\n  in: {}",
                now.len(),
                q.columns.len(),
                q.query
            ));
            continue;
        }
        for (then, now) in q.columns.iter().zip(now) {
            let type_now = now.type_info().name().to_uppercase();
            let changed_type = postgres_name(&then.type_info).is_some_and(|t| t != type_now);
            if then.name != now.name() || changed_type {
                broken.push(format!(
                    "column {} {:?} is now {} {type_now}\n  in: {}",
                    then.name,
                    then.type_info,
                    now.name(),
                    q.query
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} of the {} queries of {} (the version before {newest}) break on today's schema: \
         split the migration (expand now, contract in a later release):\n{}",
        broken.len(),
        baseline.queries.len(),
        baseline.previous_version,
        broken.join("\n")
    );
}

#[test]
fn offline_type_names_read_as_postgres_names() {
    assert_eq!(postgres_name(&"Uuid".into()).as_deref(), Some("UUID"));
    assert_eq!(
        postgres_name(&"TextArray".into()).as_deref(),
        Some("TEXT[]")
    );
    assert_eq!(postgres_name(&"Void".into()), None);
}

#[tokio::test]
async fn the_previous_versions_vector_statements_built_at_run_time_still_plan_on_half_precision() {
    // The baseline holds the compile-time-checked queries only. Recall's ranking (search.rs)
    // and the vectors' other statements built at run time bound `$n::vector` before the
    // vectors became halfvec (20261214000001); a previous version's worker still sends them
    // during a rolling upgrade. Each must still plan, and rank by the same distance.
    let url = fresh_database(&std::env::var("SB_DATABASE_URL").expect("SB_DATABASE_URL")).await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    MIGRATOR.run(&pool).await.unwrap();
    let previous = [
        // Recall's exact ranking of one person's vectors, as the previous version wrote it.
        "SELECT mv.message_id, mv.embedding <=> (SELECT $1::vector(384)) AS distance
           FROM switchboard.message_vectors mv
          WHERE mv.model = 'all-MiniLM-L6-v2' AND mv.person_id = $2
          ORDER BY 2, 1 OFFSET 0",
        // A vector stored from its text form.
        "INSERT INTO switchboard.message_vectors
            (message_id, model, person_id, agent_identity, dimensions, embedding)
         VALUES ($1, $2, $3, $4, 384, $5::vector)",
        // A stored vector read back as text (recall's query from a message's own vector).
        "SELECT embedding::text, dimensions FROM switchboard.message_vectors
          WHERE message_id = $1 AND model = $2",
    ];
    for q in previous {
        if let Err(e) = pool.describe(q).await {
            panic!("{e}\n  in: {q}");
        }
    }
    let same: bool = sqlx::query_scalar(
        "SELECT ('[1,2,3]'::halfvec <=> '[3,2,1]'::vector(3))
              = ('[1,2,3]'::halfvec <=> '[3,2,1]'::halfvec(3))",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        same,
        "a vector query against halfvec storage ranks by the halfvec distance"
    );
}
