//! Loading the corpus: COPY in chunks with a progress bar, the indexes dropped for the load and
//! built after it; then the model's vector index, as the embedding worker builds it
//! (`switchboard_embed::keep_index`), after the others.
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection as _, PgConnection};

use switchboard_embed::{Kept, vector_index};

use super::corpus::{AGENTS, Chunk, Corpus, Rows, generate, session_id};

#[derive(Debug, Serialize)]
pub struct IndexBuild {
    pub name: String,
    pub seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct LoadReport {
    pub rows: usize,
    pub seconds: f64,
    pub rows_per_s: f64,
    pub index_builds: Vec<IndexBuild>,
    pub vacuum_analyze_s: f64,
}

pub async fn copy(conn: &mut PgConnection, statement: &str, data: &[u8]) -> anyhow::Result<()> {
    let mut c = conn.copy_in_raw(statement).await?;
    c.send(data).await?;
    c.finish().await?;
    Ok(())
}

pub async fn load(
    url: &str,
    corpus: &Corpus,
    total: usize,
    seed: u64,
    model: &str,
    maintenance_work_mem: &str,
    lists: Option<u32>,
) -> anyhow::Result<(Rows, LoadReport)> {
    let mut conn = PgConnection::connect(url).await?;
    // The indexes other than the primary keys go for the load and come back after it; the
    // model's vector index comes back as the embedding worker builds it (below), not as the
    // migrations left it (one list).
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT i.indexname::text, i.indexdef FROM pg_indexes i
          WHERE i.schemaname = 'switchboard' AND i.tablename IN ('messages', 'message_marks', 'message_vectors')
            AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)
          ORDER BY i.indexname",
    )
    .fetch_all(&mut conn)
    .await?;
    for (name, _) in &indexes {
        sqlx::query(&format!("DROP INDEX switchboard.{name}"))
            .execute(&mut conn)
            .await?;
    }
    let indexes: Vec<(String, String)> = indexes
        .into_iter()
        .filter(|(_, def)| !def.contains("USING ivfflat"))
        .collect();
    let mut sessions = String::new();
    for (p, person) in corpus.people.iter().enumerate() {
        for (a, (agent, identity, channel)) in AGENTS.iter().enumerate() {
            let _ = writeln!(
                sessions,
                "{}\tphone\t{}\t{identity}\t{agent}\topenclaw\t{channel}\t{agent}:{}\t{identity}:{}",
                session_id(p, a),
                person.id,
                person.id,
                person.id
            );
        }
    }
    copy(
        &mut conn,
        "COPY switchboard.sessions (id, person_type, person_id, agent_identity, agent_name, \
         engine_type, channel, scope_key, memory_key) FROM STDIN",
        sessions.as_bytes(),
    )
    .await
    .context("loading sessions")?;
    // Every message is loaded with its vector and mark, as the embedding worker leaves them
    // (the steady state the lag is measured in).
    sqlx::query("INSERT INTO switchboard.embedding_marks (model) VALUES ($1)")
        .bind(model)
        .execute(&mut conn)
        .await
        .context("the marks' model")?;

    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("loading {bar:40} {pos}/{len} vectors ({per_sec}, eta {eta})")
            .expect("template"),
    );
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Chunk>(2);
    let started = Instant::now();
    let rows = std::thread::scope(|s| -> anyhow::Result<Rows> {
        let producer = s.spawn(|| generate(corpus, total, seed, model, Some(tx)));
        let loaded = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                while let Some(chunk) = rx.recv().await {
                    copy(
                        &mut conn,
                        "COPY switchboard.messages (id, session_id, person_id, agent_name, \
                         agent_identity, direction, channel, message, correlation_id, created_at, \
                         embedded_model) FROM STDIN",
                        &chunk.messages,
                    )
                    .await
                    .context("loading messages")?;
                    copy(
                        &mut conn,
                        "COPY switchboard.message_vectors (message_id, model, person_id, \
                         agent_identity, dimensions, embedding, created_at) FROM STDIN",
                        &chunk.vectors,
                    )
                    .await
                    .context("loading vectors")?;
                    bar.inc(chunk.rows as u64);
                }
                anyhow::Ok(())
            })
        });
        // Dropping the receiver lets a producer blocked on a full channel finish.
        drop(rx);
        let rows = producer.join().expect("the generator does not panic");
        loaded.map(|_| rows)
    })?;
    bar.finish();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "memory_bench: loaded {total} messages and vectors in {seconds:.0} s ({:.0}/s)",
        total as f64 / seconds
    );

    sqlx::query(&format!(
        "SET maintenance_work_mem = '{}'",
        maintenance_work_mem.replace('\'', "")
    ))
    .execute(&mut conn)
    .await?;
    let mut index_builds = Vec::new();
    for (name, def) in &indexes {
        let spinner = ProgressBar::new_spinner();
        spinner.set_message(format!("building {name}"));
        spinner.enable_steady_tick(Duration::from_millis(500));
        let t = Instant::now();
        sqlx::query(def).execute(&mut conn).await?;
        spinner.finish_and_clear();
        let seconds = t.elapsed().as_secs_f64();
        println!("memory_bench: built {name} in {seconds:.1} s");
        index_builds.push(IndexBuild {
            name: name.clone(),
            seconds,
        });
    }
    // The model's vector index, by the product's own statements (its lists from the vectors
    // there, unless --lists says).
    let own = vector_index::index_name(model);
    let spinner = ProgressBar::new_spinner();
    spinner.set_message(format!("building {own}"));
    spinner.enable_steady_tick(Duration::from_millis(500));
    let t = Instant::now();
    let lists = match lists {
        Some(lists) => {
            vector_index::build(&mut conn, model, corpus.dims, lists)
                .await
                .with_context(|| format!("building {own}"))?;
            lists
        }
        None => {
            let pool = PgPoolOptions::new().max_connections(2).connect(url).await?;
            let kept = switchboard_embed::keep_index(&pool, model, corpus.dims)
                .await
                .with_context(|| format!("building {own}"))?;
            pool.close().await;
            match kept {
                Kept::Built { lists, .. } => lists,
                Kept::AsItWas => anyhow::bail!(
                    "switchboard_embed::keep_index built no {own} for {model} ({} dimensions)",
                    corpus.dims
                ),
            }
        }
    };
    spinner.finish_and_clear();
    let seconds = t.elapsed().as_secs_f64();
    println!("memory_bench: built {own} with {lists} lists in {seconds:.1} s");
    index_builds.push(IndexBuild { name: own, seconds });
    let t = Instant::now();
    sqlx::query(
        "VACUUM (ANALYZE) switchboard.sessions, switchboard.messages, switchboard.message_marks,
                          switchboard.message_vectors",
    )
    .execute(&mut conn)
    .await?;
    let vacuum_analyze_s = t.elapsed().as_secs_f64();
    Ok((
        rows,
        LoadReport {
            rows: total,
            seconds,
            rows_per_s: total as f64 / seconds,
            index_builds,
            vacuum_analyze_s,
        },
    ))
}
