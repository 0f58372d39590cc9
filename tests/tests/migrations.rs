//! The schema is applied by `switchboard migrate` and by every process at start-up, again and
//! again: a database must take the product's migrations any number of times, whatever its role
//! is called.
use std::str::FromStr as _;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use switchboard_e2e::fresh_database;
use switchboard_kit::db::{self, MIGRATOR};

/// A pool on a new database as a production role named `switchboard` sees it: Postgres's
/// default search path, `"$user", public`, whose first entry is the product's own schema once
/// the first migration made it (the embedded stack pins the role's path to `public`).
async fn database_with_the_default_search_path() -> (sqlx::PgPool, String) {
    let url = fresh_database(&std::env::var("SB_DATABASE_URL").expect("SB_DATABASE_URL")).await;
    let options = PgConnectOptions::from_str(&url)
        .unwrap()
        .options([("search_path", "\"$user\",public")]);
    // One connection: the one the migrations ran on is the one later queries get.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let user: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    (pool, user)
}

/// The schemas holding a ledger of applied migrations.
async fn ledger_schemas(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT table_schema::text FROM information_schema.tables
          WHERE table_name = '_sqlx_migrations' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_role_named_like_the_schema_starts_again_after_its_first_migration() {
    let (pool, user) = database_with_the_default_search_path().await;
    assert_eq!(
        user, "switchboard",
        "the stack's role is the production name"
    );
    db::migrate(&pool).await.expect("the first start migrates");
    // Every later start (a restart, a second replica) finds the migrations applied.
    db::migrate(&pool)
        .await
        .expect("a restart finds its migrations");
    db::migrate(&pool).await.expect("and so does the next");
    let tables = ledger_schemas(&pool).await;
    assert_eq!(
        tables,
        ["public"],
        "one ledger of migrations, not one per search path"
    );
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM public._sqlx_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(applied as usize, MIGRATOR.iter().count());
    // The connection the migrations ran on is back on the operator's search path.
    let path: String = sqlx::query_scalar("SELECT current_setting('search_path')")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(path, "\"$user\",public");
}

#[tokio::test]
async fn a_database_whose_schema_was_made_before_the_first_start_keeps_its_ledger_there() {
    // A DBA created the schema before the first start, so sqlx kept its ledger in it (the
    // first schema of the role's path); every start after must go on with that ledger.
    let (pool, _) = database_with_the_default_search_path().await;
    sqlx::query("CREATE SCHEMA switchboard")
        .execute(&pool)
        .await
        .unwrap();
    MIGRATOR
        .run(&pool)
        .await
        .expect("the first start, as sqlx ran it");
    db::migrate(&pool)
        .await
        .expect("a restart finds its migrations");
    db::migrate(&pool).await.expect("and so does the next");
    let tables = ledger_schemas(&pool).await;
    assert_eq!(tables, ["switchboard"], "one ledger, where it was");
}
