//! A turn costs the same after thirty thousand turns as after thirty, from a deployment's first
//! minute: the reply path reads its growing tables (turns, deliveries, arrival cursors, the
//! message log, the directory) by key, never whole, for people who wrote before and for people
//! writing for the first time.
//!
//! The trap this guards: Postgres caches a prepared statement's generic plan after five runs.
//! A plan made while a table was nearly empty and never analyzed (a fresh database, until
//! autovacuum first analyzes it, a minute or more) scans the table whole, and keeps doing so as
//! the table grows, until an analyze invalidates it. The bench saw the session stage's lookup of
//! placed turns go from 0.06 ms to 9 ms a batch within 25 s. Autovacuum is off for these tables
//! here, so the test sees the database as it is before that first analyze, however long it runs.
use std::time::Duration;

use switchboard_e2e::{AppOptions, TestApp, spawn_app_with};

/// Tables every turn touches, and that grow with every turn or with the directory's imports.
const GROWING: [&str; 8] = [
    "turns",
    "deliveries",
    "arrival_cursors",
    "messages",
    // One row a message, beside the log (its trigger fills it with the history below); recall
    // reads a person's lag from it every turn.
    "message_marks",
    "people",
    "contact_points",
    "identity_links",
];
/// Rows put into each growing table between the rounds: as many as a busy deployment's
/// first thirty seconds.
const HISTORY: i64 = 30_000;
const PEOPLE: usize = 16;
const WAIT: Duration = Duration::from_secs(60);
/// How long a Postgres backend may hold its table statistics before reporting them (an idle
/// backend reports after 10 s, `PGSTAT_IDLE_INTERVAL`).
const STATS_REPORTED: Duration = Duration::from_secs(11);

fn sender(n: usize) -> String {
    format!("+1415556{:04}", n)
}

/// Every person texts at once (so each stage takes them in batches), and all are answered.
/// `first` numbers the people: a round of people not seen before opens their first sessions.
async fn round(app: &TestApp, r: usize, first: usize) {
    let before = app.twilio.sent().len();
    let sends = (first..first + PEOPLE).map(|n| async move {
        let text = format!("round {r} from {n}");
        assert_eq!(app.send_sms(&sender(n), &text).await.status(), 200);
    });
    futures::future::join_all(sends).await;
    app.wait_for_sms(before + PEOPLE, WAIT).await;
}

/// Rows each growing table has given so far, by scans and by indexes, as the server reports
/// them.
async fn rows_read(app: &TestApp) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT relname::text, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
           FROM pg_stat_user_tables
          WHERE schemaname = 'switchboard' AND relname = ANY($1)
          ORDER BY relname",
    )
    .bind(GROWING.map(String::from).to_vec())
    .fetch_all(&app.db)
    .await
    .expect("table statistics")
}

/// `HISTORY` rows in each growing table (the reply path's copied from a row the rounds wrote),
/// for a session and people nobody texts: only a statement that reads the whole table reaches
/// them.
async fn add_history(app: &TestApp) {
    let statements = [
        "INSERT INTO switchboard.sessions
         SELECT (jsonb_populate_record(NULL::switchboard.sessions, to_jsonb(s) || jsonb_build_object(
                   'id', '00000000-0000-7000-8000-000000000001', 'scope_key', 'history',
                   'person_id', 'history'))).*
           FROM switchboard.sessions s LIMIT 1",
        "INSERT INTO switchboard.turns
         SELECT (jsonb_populate_record(NULL::switchboard.turns, to_jsonb(t) || jsonb_build_object(
                   'session_id', '00000000-0000-7000-8000-000000000001', 'seq', g,
                   'inbound_id', gen_random_uuid(), 'reply_id', gen_random_uuid(),
                   'provider_message_id', 'history-' || g))).*
           FROM (SELECT * FROM switchboard.turns LIMIT 1) t, generate_series(1, $1) g",
        "INSERT INTO switchboard.deliveries
         SELECT (jsonb_populate_record(NULL::switchboard.deliveries, to_jsonb(d) || jsonb_build_object(
                   'reply_id', gen_random_uuid(),
                   'session_id', '00000000-0000-7000-8000-000000000001'))).*
           FROM (SELECT * FROM switchboard.deliveries LIMIT 1) d, generate_series(1, $1) g",
        "INSERT INTO switchboard.arrival_cursors
         SELECT (jsonb_populate_record(NULL::switchboard.arrival_cursors, to_jsonb(a) || jsonb_build_object(
                   'sender', 'history-' || g))).*
           FROM (SELECT * FROM switchboard.arrival_cursors LIMIT 1) a, generate_series(1, $1) g",
        // The log has generated columns (its text search), so its columns are named. History
        // the memory workers have been through (embedded, labelled) but not summarised yet, as
        // a conversation's is until it goes quiet.
        "INSERT INTO switchboard.messages
                (id, session_id, person_id, agent_name, agent_identity, direction, channel,
                 message, correlation_id, external_id, metadata, created_at, embedded_model,
                 summary_version, category)
         SELECT gen_random_uuid(), '00000000-0000-7000-8000-000000000001', 'history',
                m.agent_name, m.agent_identity, m.direction, m.channel, 'history ' || g,
                m.correlation_id, 'history-' || g, m.metadata, m.created_at,
                (SELECT model FROM switchboard.embedding_marks), NULL, 'other'
           FROM (SELECT * FROM switchboard.messages LIMIT 1) m, generate_series(1, $1) g",
        // A directory imported after the first rounds: people, their phones, links between them.
        "INSERT INTO switchboard.people (person_id, person_type, name)
         SELECT 'history-' || g, 'external', 'Person ' || g FROM generate_series(1, $1) g",
        "INSERT INTO switchboard.contact_points (kind, address, person_id)
         SELECT 'phone', '+4420' || lpad(g::text, 8, '0'), 'history-' || g
           FROM generate_series(1, $1) g",
        "INSERT INTO switchboard.identity_links (id, from_person_id, to_person_id, linked_by)
         SELECT gen_random_uuid(), 'history-' || g, 'history-' || (g + 1), 'import'
           FROM generate_series(1, $1 - 1) g",
    ];
    for sql in statements {
        let q = sqlx::query(sql);
        let q = if sql.contains("$1") {
            q.bind(HISTORY)
        } else {
            q
        };
        q.execute(&app.db)
            .await
            .unwrap_or_else(|e| panic!("{e}: {sql}"));
    }
}

#[tokio::test]
async fn a_fresh_deployments_turns_read_no_table_whole_as_its_history_grows() {
    // Two connections, so each one runs every statement of the reply path many times (and
    // Postgres caches its generic plans) within the first rounds.
    let app =
        spawn_app_with(AppOptions::default().configured(|c| c.runtime.db_pool_size = 2)).await;
    for table in GROWING {
        sqlx::query(&format!(
            "ALTER TABLE switchboard.{table} SET (autovacuum_enabled = false)"
        ))
        .execute(&app.db)
        .await
        .expect("autovacuum off");
    }

    // The first minute: the tables hold a few rows, and the plans are made for that.
    for r in 0..12 {
        round(&app, r, 0).await;
    }
    app.settle().await;
    add_history(&app).await;
    tokio::time::sleep(STATS_REPORTED).await;
    let before = rows_read(&app).await;

    // Sixteen people writing for the first time, then the first sixteen again.
    round(&app, 12, PEOPLE).await;
    for r in 13..16 {
        round(&app, r, 0).await;
    }
    app.settle().await;
    tokio::time::sleep(STATS_REPORTED).await;
    let after = rows_read(&app).await;

    // Four rounds of sixteen people read a few rows each by key (a person's turns and
    // messages); reading any of these tables whole even once, by a scan or along an index,
    // reads more rows than the history put in it.
    let read: Vec<(String, i64)> = after
        .iter()
        .zip(&before)
        .map(|((table, a), (_, b))| (table.clone(), a - b))
        .collect();
    assert_eq!(read.len(), GROWING.len(), "{after:?}");
    for (table, rows) in &read {
        assert!(
            *rows < HISTORY,
            "{rows} rows of {table} read in four rounds: {read:?}"
        );
    }
}
