//! `make bench`'s memory part (issue 22, "Speed and scale"): recall and search at 1,000,000
//! stored vectors. Plan and measured figures: `docs/bench-memory.md`.
//!
//! On a fresh database of its own stack (`membench`: NATS 16322, Postgres 17532, without fsync:
//! the data is thrown away) it loads `--vectors` messages with their vectors by COPY, in chunks,
//! with a progress bar: 384-dimensional, L2-normalised, each a noisy copy of one of ~1,000 topic
//! centroids (noise mostly inside a 16-dimensional subspace of the topic, as real text has
//! structure; plus a little isotropic noise), 100 per person plus a skewed slice (10 % of the
//! vectors over 20 people), with texts drawn from a word list per topic so full-text search has
//! hits. The indexes are dropped for the load and built after it (their build times reported).
//!
//! Then it measures the product's own functions (`switchboard_memory::recall::recall`, and
//! `switchboard_memory::search::search` as `GET /api/v1/search` calls it, without and with an
//! agent filter), one call at a time, timed from the client: p50/p95/p99 over `--queries` each.
//! The query's vector is handed to them by an embedder that answers the bench's vector. recall@10
//! compares the product's top 10 (its ranking with a text that matches no word, so meaning alone
//! ranks) with the exact top 10: a brute-force scan in this process over the same vectors (top 30
//! by f32 cosine, under the same filters), ordered again in Postgres by the same halfvec distance
//! the index uses. Each query kind's plan (EXPLAIN ANALYZE of the product's statement) and
//! whether Postgres planned the product's prepared statements generically go with the figures
//! into `bench-results/<time>/memory.json`. Exits 1 when a target is missed.
use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use futures::future::BoxFuture;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection as _, PgConnection, PgPool};
use switchboard_e2e::load::stack::{Stack, repo_dir};
use switchboard_kit::memory_config::{EmbeddingConfig, RecallConfig};
use switchboard_memory::embed::{EmbedError, Embedder};
use switchboard_memory::recall::{self, RecallRequest};
use switchboard_memory::search::{self, SearchQuery};
use uuid::Uuid;

const DIMS: usize = 384;
/// Directions of a topic its messages vary along.
const SUBSPACE: usize = 16;
const SUBSPACE_SIGMA: f32 = 0.25;
const ISO_SIGMA: f32 = 0.02;
const WORDS_PER_TOPIC: usize = 12;
const PER_PERSON: usize = 100;
const SKEWED_PEOPLE: usize = 20;
const CHUNK: usize = 10_000;
/// Candidates the brute force keeps per query before Postgres orders them by halfvec distance.
const EXACT_CANDIDATES: usize = 30;
const WARMUP: usize = 50;
/// A query text no message contains: the product's ranking is then by meaning alone.
const NO_WORD: &str = "zqxjvbenchnoword";
/// (agent, identity, channel) of the generated messages.
const AGENTS: [(&str, &str, &str); 3] = [
    ("reggie_oc", "reggie", "sms"),
    ("reggie_fd", "reggie", "chat"),
    ("nova_oc", "nova", "sms"),
];
const COMMON_WORDS: &[&str] = &[
    "the", "my", "is", "when", "what", "can", "i", "you", "please", "thanks", "today", "tomorrow",
    "next", "week", "shift", "work", "time", "need", "help", "with", "about", "for", "and", "to",
    "a", "on", "at", "do", "have", "still", "again", "how", "it", "me", "we", "this",
];
const SYLLABLES: [&str; 20] = [
    "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "ba", "de", "fi", "gu", "ha", "jo", "ku",
    "le", "mo", "nu", "pi",
];
const TARGET_RECALL_P99_MS: f64 = 10.0;
const TARGET_SEARCH_P99_MS: f64 = 50.0;
const TARGET_RECALL_AT_10: f64 = 0.95;

#[derive(Parser, Debug)]
#[command(
    name = "memory_bench",
    about = "Recall and search of the memory at scale (issue 22): load, index, measure, judge"
)]
struct Args {
    /// Stored vectors (and messages).
    #[arg(long, default_value_t = 1_000_000)]
    vectors: usize,
    /// Queries of each kind.
    #[arg(long, default_value_t = 1_000)]
    queries: usize,
    #[arg(long, default_value_t = 1_000)]
    topics: usize,
    #[arg(long, default_value_t = 22)]
    seed: u64,
    /// A database loaded by an earlier run with the same --vectors, --topics and --seed (the
    /// URL it printed with --keep-stack): measure again without loading.
    #[arg(long)]
    database_url: Option<String>,
    #[arg(long, default_value = "membench")]
    stack_name: String,
    #[arg(long, default_value_t = 16322)]
    nats_port: u16,
    #[arg(long, default_value_t = 17532)]
    pg_port: u16,
    /// Leave the stack and its data (GBs at 1M) in place for a later --database-url run.
    #[arg(long)]
    keep_stack: bool,
    /// For the index builds.
    #[arg(long, default_value = "2GB")]
    maintenance_work_mem: String,
    /// Also measure with these `hnsw.ef_search` values (set on the database; the product's
    /// own setting is measured first).
    #[arg(long, value_delimiter = ',')]
    ef_search: Vec<u32>,
    /// Results go to <out>/<time>/memory.json (default bench-results).
    #[arg(long)]
    out: Option<PathBuf>,
}

// ---- the corpus ---------------------------------------------------------------------------

struct Person {
    id: String,
    /// Its rows are `start..start + count`.
    start: usize,
    count: usize,
    topics: [usize; 4],
    skewed: bool,
}

/// Everything generated, deterministic from the seed: the exact answers of a run that did not
/// load are those of the run that did.
struct Corpus {
    topics: usize,
    centroids: Vec<f32>,
    basis: Vec<f32>,
    words: Vec<Vec<String>>,
    people: Vec<Person>,
}

fn gauss(rng: &mut StdRng) -> f32 {
    // Box-Muller; one of the pair is enough here.
    let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let v: f64 = rng.random();
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

fn normalise(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

fn unit(rng: &mut StdRng) -> Vec<f32> {
    let mut v: Vec<f32> = (0..DIMS).map(|_| gauss(rng)).collect();
    normalise(&mut v);
    v
}

impl Corpus {
    fn new(vectors: usize, topics: usize, seed: u64) -> Corpus {
        let mut rng = StdRng::seed_from_u64(seed);
        let centroids = (0..topics).flat_map(|_| unit(&mut rng)).collect();
        let basis = (0..topics * SUBSPACE)
            .flat_map(|_| unit(&mut rng))
            .collect();
        let words = (0..topics)
            .map(|t| {
                (0..WORDS_PER_TOPIC)
                    .map(|w| {
                        let mut n = t * WORDS_PER_TOPIC + w;
                        (0..4)
                            .map(|_| {
                                let s = SYLLABLES[n % SYLLABLES.len()];
                                n /= SYLLABLES.len();
                                s
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let skewed_rows = vectors / 10;
        let regular = (vectors - skewed_rows) / PER_PERSON;
        let mut plan: Vec<(String, usize, bool)> = (0..regular)
            .map(|p| (format!("phone:+1555{p:07}"), PER_PERSON, false))
            .collect();
        let skewed_each = (vectors - regular * PER_PERSON) / SKEWED_PEOPLE;
        for p in 0..SKEWED_PEOPLE {
            let count = if p + 1 == SKEWED_PEOPLE {
                vectors - regular * PER_PERSON - skewed_each * (SKEWED_PEOPLE - 1)
            } else {
                skewed_each
            };
            plan.push((format!("phone:+1666{p:07}"), count, true));
        }
        let mut start = 0;
        let people = plan
            .into_iter()
            .map(|(id, count, skewed)| {
                let person = Person {
                    id,
                    start,
                    count,
                    topics: [0; 4].map(|_| rng.random_range(0..topics)),
                    skewed,
                };
                start += count;
                person
            })
            .collect();
        Corpus {
            topics,
            centroids,
            basis,
            words,
            people,
        }
    }

    /// A noisy copy of topic `t`'s centroid.
    fn sample(&self, t: usize, rng: &mut StdRng, out: &mut [f32]) {
        out.copy_from_slice(&self.centroids[t * DIMS..(t + 1) * DIMS]);
        for j in 0..SUBSPACE {
            let g = gauss(rng) * SUBSPACE_SIGMA;
            let b = &self.basis[(t * SUBSPACE + j) * DIMS..(t * SUBSPACE + j + 1) * DIMS];
            out.iter_mut().zip(b).for_each(|(o, b)| *o += g * b);
        }
        out.iter_mut().for_each(|o| *o += gauss(rng) * ISO_SIGMA);
        normalise(out);
    }

    fn text(&self, t: usize, rng: &mut StdRng) -> String {
        let n = rng.random_range(6..=12);
        let words: Vec<&str> = (0..n)
            .map(|_| {
                if rng.random_bool(0.5) {
                    self.words[t][rng.random_range(0..WORDS_PER_TOPIC)].as_str()
                } else {
                    COMMON_WORDS[rng.random_range(0..COMMON_WORDS.len())]
                }
            })
            .collect();
        words.join(" ")
    }

    /// Two words of topic `t`: what a person searching for it would type.
    fn query_text(&self, t: usize, rng: &mut StdRng) -> String {
        let a = rng.random_range(0..WORDS_PER_TOPIC);
        let b = (a + rng.random_range(1..WORDS_PER_TOPIC)) % WORDS_PER_TOPIC;
        format!("{} {}", self.words[t][a], self.words[t][b])
    }
}

/// What the exact answers need of each stored row.
struct Rows {
    vectors: Vec<f32>,
    agent: Vec<u8>,
    ids: Vec<Uuid>,
}

fn session_id(person: usize, agent: usize) -> Uuid {
    Uuid::from_u128(
        0x5b5b_0000_0000_4000_8000_0000_0000_0000 | ((person as u128) << 8) | agent as u128,
    )
}

/// 2026-08-01T00:00:00Z: the messages span the 90 days after it (before any real clock's now).
const BASE_MS: u64 = 1_785_542_400_000;

/// One chunk of rows: the COPY text of its messages and of its vectors.
struct Chunk {
    rows: usize,
    messages: Vec<u8>,
    vectors: Vec<u8>,
}

/// Generates every row in order; `sink` gets each chunk's COPY text (`None`: only the rows).
fn generate(
    corpus: &Corpus,
    total: usize,
    seed: u64,
    model: &str,
    mut sink: Option<tokio::sync::mpsc::Sender<Chunk>>,
) -> Rows {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9);
    let mut rows = Rows {
        vectors: vec![0.0; total * DIMS],
        agent: vec![0; total],
        ids: Vec::with_capacity(total),
    };
    let spacing_ms = (90 * 86_400_000 / total.max(1)) as u64;
    let mut chunk = Chunk {
        rows: 0,
        messages: Vec::new(),
        vectors: Vec::new(),
    };
    for (p, person) in corpus.people.iter().enumerate() {
        for k in 0..person.count {
            let i = person.start + k;
            let topic = if rng.random_bool(0.8) {
                person.topics[rng.random_range(0..4)]
            } else {
                rng.random_range(0..corpus.topics)
            };
            let a = rng.random_range(0..AGENTS.len());
            let (agent, identity, channel) = AGENTS[a];
            let v = &mut rows.vectors[i * DIMS..(i + 1) * DIMS];
            corpus.sample(topic, &mut rng, v);
            let ms = BASE_MS + i as u64 * spacing_ms;
            let id = uuid::Builder::from_unix_timestamp_millis(ms, &rng.random()).into_uuid();
            rows.agent[i] = a as u8;
            rows.ids.push(id);
            let text = corpus.text(topic, &mut rng);
            if sink.is_none() {
                continue;
            }
            let at = chrono::DateTime::from_timestamp_millis(ms as i64)
                .expect("in range")
                .to_rfc3339();
            let direction = if k % 2 == 0 { "inbound" } else { "outbound" };
            let m = format!(
                "{id}\t{}\t{}\t{agent}\t{identity}\t{direction}\t{channel}\t{text}\tbench-{i}\t{at}\n",
                session_id(p, a),
                person.id
            );
            chunk.messages.extend_from_slice(m.as_bytes());
            let mut line = format!("{id}\t{model}\t{}\t{identity}\t{DIMS}\t[", person.id);
            for (j, x) in v.iter().enumerate() {
                if j > 0 {
                    line.push(',');
                }
                let _ = write!(line, "{x}");
            }
            let _ = writeln!(line, "]\t{at}");
            chunk.vectors.extend_from_slice(line.as_bytes());
            chunk.rows += 1;
            if chunk.rows == CHUNK || i + 1 == total {
                let full = std::mem::replace(
                    &mut chunk,
                    Chunk {
                        rows: 0,
                        messages: Vec::new(),
                        vectors: Vec::new(),
                    },
                );
                if let Some(tx) = &sink
                    && tx.blocking_send(full).is_err()
                {
                    // The loader stopped (it reports why); the rows are still generated.
                    sink = None;
                }
            }
        }
    }
    rows
}

// ---- loading --------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct IndexBuild {
    name: String,
    seconds: f64,
}

#[derive(Debug, Serialize)]
struct LoadReport {
    rows: usize,
    seconds: f64,
    rows_per_s: f64,
    index_builds: Vec<IndexBuild>,
    vacuum_analyze_s: f64,
}

async fn copy(conn: &mut PgConnection, statement: &str, data: &[u8]) -> anyhow::Result<()> {
    let mut c = conn.copy_in_raw(statement).await?;
    c.send(data).await?;
    c.finish().await?;
    Ok(())
}

async fn load(
    url: &str,
    corpus: &Corpus,
    total: usize,
    seed: u64,
    model: &str,
    maintenance_work_mem: &str,
) -> anyhow::Result<(Rows, LoadReport)> {
    let mut conn = PgConnection::connect(url).await?;
    // The indexes other than the primary keys go for the load and come back after it.
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT i.indexname::text, i.indexdef FROM pg_indexes i
          WHERE i.schemaname = 'switchboard' AND i.tablename IN ('messages', 'message_vectors')
            AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)
          ORDER BY i.indexdef LIKE '%hnsw%', i.indexname",
    )
    .fetch_all(&mut conn)
    .await?;
    for (name, _) in &indexes {
        sqlx::query(&format!("DROP INDEX switchboard.{name}"))
            .execute(&mut conn)
            .await?;
    }
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
                         agent_identity, direction, channel, message, correlation_id, created_at) \
                         FROM STDIN",
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
    let t = Instant::now();
    sqlx::query(
        "VACUUM (ANALYZE) switchboard.sessions, switchboard.messages, switchboard.message_vectors",
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

// ---- exact answers --------------------------------------------------------------------------

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0f32; 8];
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for i in 0..8 {
            s[i] += x[i] * y[i];
        }
    }
    s.iter().sum()
}

/// A query: its vector, its text, and whose messages it searches.
#[derive(Clone)]
struct Query {
    /// Queries with the same vector share its number (a search and its agent-filtered twin).
    vector_id: usize,
    vector: Vec<f32>,
    text: String,
    /// Recall: the person (index) and agent identity.
    person: Option<(usize, &'static str)>,
    /// Search: the agent filter.
    agent: Option<usize>,
}

impl Query {
    fn admits(&self, rows: &Rows, i: usize) -> bool {
        let a = rows.agent[i] as usize;
        self.person
            .is_none_or(|(_, identity)| AGENTS[a].1 == identity)
            && self.agent.is_none_or(|want| want == a)
    }
}

/// The rows closest to each query by f32 cosine, under the query's filters: the
/// [`EXACT_CANDIDATES`] best, best first. Two threads, each query block scanning the rows once.
fn brute_force(corpus: &Corpus, rows: &Rows, queries: &[Query]) -> Vec<Vec<usize>> {
    let scan = |q: &[Query]| -> Vec<Vec<usize>> {
        let mut best: Vec<Vec<(f32, usize)>> = vec![Vec::new(); q.len()];
        let all = 0..rows.agent.len();
        // Recall queries look at their person's rows only; search queries at every row.
        let ranges: Vec<std::ops::Range<usize>> = q
            .iter()
            .map(|q| match q.person {
                Some((p, _)) => {
                    let person = &corpus.people[p];
                    person.start..person.start + person.count
                }
                None => all.clone(),
            })
            .collect();
        let lo = ranges.iter().map(|r| r.start).min().unwrap_or(0);
        let hi = ranges.iter().map(|r| r.end).max().unwrap_or(0);
        for i in lo..hi {
            let v = &rows.vectors[i * DIMS..(i + 1) * DIMS];
            // Twins are next to each other: the similarity is computed once for both.
            let mut last: Option<(usize, f32)> = None;
            for (j, query) in q.iter().enumerate() {
                if !ranges[j].contains(&i) || !query.admits(rows, i) {
                    continue;
                }
                let sim = match last {
                    Some((id, sim)) if id == query.vector_id => sim,
                    _ => dot(v, &query.vector),
                };
                last = Some((query.vector_id, sim));
                let b = &mut best[j];
                if b.len() < EXACT_CANDIDATES || sim > b[b.len() - 1].0 {
                    let at = b.partition_point(|(s, _)| *s >= sim);
                    b.insert(at, (sim, i));
                    b.truncate(EXACT_CANDIDATES);
                }
            }
        }
        best.into_iter()
            .map(|b| b.into_iter().map(|(_, i)| i).collect())
            .collect()
    };
    let (filtered, mut everyone): (Vec<_>, Vec<_>) = queries
        .iter()
        .enumerate()
        .partition(|(_, q)| q.person.is_some());
    everyone.sort_by_key(|(_, q)| q.vector_id);
    let mut out = vec![Vec::new(); queries.len()];
    for (i, q) in filtered {
        out[i] = scan(std::slice::from_ref(q)).remove(0);
    }
    let blocks: Vec<Vec<(usize, &Query)>> = everyone.chunks(32).map(|c| c.to_vec()).collect();
    let results: Vec<Vec<(usize, Vec<usize>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let blocks = &blocks;
                s.spawn(move || {
                    blocks
                        .iter()
                        .skip(t)
                        .step_by(2)
                        .flat_map(|b| {
                            let qs: Vec<Query> = b.iter().map(|(_, q)| (*q).clone()).collect();
                            b.iter().map(|(i, _)| *i).zip(scan(&qs)).collect::<Vec<_>>()
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    for (i, best) in results.into_iter().flatten() {
        out[i] = best;
    }
    out
}

/// The exact top 10 of each query: its candidates ordered by the halfvec cosine distance the
/// index orders by (an expression the index cannot serve, so the order is exact).
async fn exact_top10(
    db: &PgPool,
    model: &str,
    rows: &Rows,
    queries: &[Query],
    candidates: &[Vec<usize>],
) -> anyhow::Result<Vec<Vec<Uuid>>> {
    let mut out = Vec::with_capacity(queries.len());
    for (q, c) in queries.iter().zip(candidates) {
        let ids: Vec<Uuid> = c.iter().map(|&i| rows.ids[i]).collect();
        let top: Vec<Uuid> = sqlx::query_scalar(&format!(
            "SELECT message_id FROM switchboard.message_vectors
              WHERE model = $1 AND message_id = ANY($2)
              ORDER BY (embedding::halfvec({DIMS}) <=> $3::halfvec({DIMS})) + 0, message_id
              LIMIT 10"
        ))
        .bind(model)
        .bind(&ids)
        .bind(switchboard_memory::embed::pg_vector(&q.vector))
        .fetch_all(db)
        .await?;
        out.push(top);
    }
    Ok(out)
}

// ---- measuring ------------------------------------------------------------------------------

/// The embedder the product's functions get: it answers the vector the bench set for the query.
struct BenchEmbedder {
    model: String,
    next: Mutex<Vec<f32>>,
}

impl BenchEmbedder {
    fn set(&self, v: &[f32]) {
        *self.next.lock().expect("not poisoned") = v.to_vec();
    }
}

impl Embedder for BenchEmbedder {
    fn model(&self) -> &str {
        &self.model
    }
    fn dimensions(&self) -> usize {
        DIMS
    }
    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        let v = self.next.lock().expect("not poisoned").clone();
        Box::pin(async move { Ok(texts.iter().map(|_| v.clone()).collect()) })
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Recall,
    Search,
    SearchAgent,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Recall => "recall (person + identity)",
            Kind::Search => "search (everyone)",
            Kind::SearchAgent => "search (agent reggie_oc)",
        }
    }
    fn target_ms(self) -> f64 {
        match self {
            Kind::Recall => TARGET_RECALL_P99_MS,
            _ => TARGET_SEARCH_P99_MS,
        }
    }
}

struct Bench<'a> {
    db: PgPool,
    corpus: &'a Corpus,
    embedder: BenchEmbedder,
}

impl Bench<'_> {
    /// The product's call for `q`: `limit` hits, with `text` (the query's own, or [`NO_WORD`]).
    async fn run(
        &self,
        kind: Kind,
        q: &Query,
        text: &str,
        limit: usize,
    ) -> anyhow::Result<Vec<Uuid>> {
        self.embedder.set(&q.vector);
        let model = self.embedder.model.as_str();
        let embedder: &dyn Embedder = &self.embedder;
        Ok(match kind {
            Kind::Recall => {
                let (p, identity) = q.person.context("a recall query names its person")?;
                let config = RecallConfig {
                    top_k: limit,
                    ..RecallConfig::default()
                };
                let req = RecallRequest {
                    person_id: &self.corpus.people[p].id,
                    agent_identity: identity,
                    text,
                    held_by: None,
                    // The message being answered: newer than every stored one.
                    answering: vec![Uuid::now_v7()],
                };
                recall::recall(&self.db, Ok(embedder), model, &config, &req)
                    .await?
                    .context("recall is on")?
                    .hits
                    .into_iter()
                    .map(|h| h.message_id)
                    .collect()
            }
            Kind::Search | Kind::SearchAgent => {
                search::search(&self.db, Ok(embedder), model, &search_query(q, text, limit))
                    .await?
                    .hits
                    .into_iter()
                    .map(|h| h.message_id)
                    .collect()
            }
        })
    }

    async fn explain(&self, kind: Kind, q: &Query) -> anyhow::Result<String> {
        self.embedder.set(&q.vector);
        let model = self.embedder.model.as_str();
        let embedder: &dyn Embedder = &self.embedder;
        Ok(match kind {
            Kind::Recall => {
                let (p, identity) = q.person.context("a recall query names its person")?;
                let req = RecallRequest {
                    person_id: &self.corpus.people[p].id,
                    agent_identity: identity,
                    text: &q.text,
                    held_by: None,
                    answering: vec![Uuid::now_v7()],
                };
                recall::explain(
                    &self.db,
                    Ok(embedder),
                    model,
                    &RecallConfig::default(),
                    &req,
                )
                .await?
                .unwrap_or_default()
            }
            _ => {
                search::explain(
                    &self.db,
                    Ok(embedder),
                    model,
                    &search_query(q, &q.text, search::DEFAULT_LIMIT as usize),
                )
                .await?
            }
        })
    }
}

fn search_query(q: &Query, text: &str, limit: usize) -> SearchQuery {
    SearchQuery {
        text: text.to_string(),
        agent: q.agent.map(|a| AGENTS[a].0.to_string()),
        limit: limit as i64,
        ..Default::default()
    }
}

#[derive(Debug, Clone, Serialize)]
struct Latency {
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    mean_ms: f64,
}

fn latency(us: &[u64]) -> Latency {
    // 1 µs to 10 min; slower calls count as 10 min.
    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
    for &u in us {
        h.saturating_record(u.clamp(1, 600_000_000));
    }
    let ms = |v: u64| v as f64 / 1000.0;
    Latency {
        p50_ms: ms(h.value_at_quantile(0.50)),
        p95_ms: ms(h.value_at_quantile(0.95)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        max_ms: ms(h.max()),
        mean_ms: h.mean() / 1000.0,
    }
}

#[derive(Debug, Serialize)]
struct Series {
    kind: String,
    queries: usize,
    /// The product's call as a turn or an operator makes it (the query's own words).
    latency: Latency,
    /// Recall only: the calls for the skewed people (thousands of messages each).
    latency_skewed: Option<Latency>,
    /// The product's ranking by meaning alone, top 10, against the exact top 10.
    recall_at_10: f64,
    /// The calls that measured recall@10 (a text without hits: the vector branch only).
    latency_vector_only: Latency,
    /// EXPLAIN ANALYZE of the product's ranking statement for the first query.
    plan: String,
    /// Recall only: the same for a skewed person.
    plan_skewed: Option<String>,
    load_average: [f64; 3],
}

fn load_average() -> [f64; 3] {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = s.split_whitespace().map(|x| x.parse().unwrap_or(f64::NAN));
    [0; 3].map(|_| it.next().unwrap_or(f64::NAN))
}

/// `plan` with each vector literal (384 numbers) cut to its first values.
fn shorten_vectors(plan: &str) -> String {
    let mut out = String::with_capacity(plan.len());
    let mut rest = plan;
    while let Some(start) = rest.find("'[") {
        let Some(len) = rest[start..].find("]'") else {
            break;
        };
        let literal = &rest[start..start + len + 2];
        out.push_str(&rest[..start]);
        if literal.len() > 80 {
            out.push_str(&literal[..40]);
            out.push_str("…]'");
        } else {
            out.push_str(literal);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

async fn measure(
    bench: &Bench<'_>,
    kind: Kind,
    queries: &[Query],
    exact: &[Vec<Uuid>],
) -> anyhow::Result<Series> {
    let limit_realistic = match kind {
        Kind::Recall => RecallConfig::default().top_k,
        _ => search::DEFAULT_LIMIT as usize,
    };
    for q in queries.iter().cycle().take(WARMUP) {
        bench.run(kind, q, &q.text, limit_realistic).await?;
    }
    let bar = ProgressBar::new(queries.len() as u64 * 2);
    bar.set_style(
        ProgressStyle::with_template(&format!("{:<28} {{bar:40}} {{pos}}/{{len}}", kind.name()))
            .expect("template"),
    );
    let mut us = Vec::with_capacity(queries.len());
    let mut us_skewed = Vec::new();
    for q in queries {
        let t = Instant::now();
        bench.run(kind, q, &q.text, limit_realistic).await?;
        let e = t.elapsed().as_micros() as u64;
        us.push(e);
        if q.person.is_some_and(|(p, _)| bench.corpus.people[p].skewed) {
            us_skewed.push(e);
        }
        bar.inc(1);
    }
    let mut us_vector = Vec::with_capacity(queries.len());
    let mut found = 0usize;
    let mut possible = 0usize;
    for (q, exact) in queries.iter().zip(exact) {
        let t = Instant::now();
        let hits = bench.run(kind, q, NO_WORD, 10).await?;
        us_vector.push(t.elapsed().as_micros() as u64);
        let exact: HashSet<&Uuid> = exact.iter().collect();
        found += hits.iter().take(10).filter(|h| exact.contains(h)).count();
        possible += exact.len();
        bar.inc(1);
    }
    bar.finish_and_clear();
    let plan = shorten_vectors(&bench.explain(kind, &queries[0]).await?);
    let plan_skewed = match queries
        .iter()
        .find(|q| q.person.is_some_and(|(p, _)| bench.corpus.people[p].skewed))
    {
        Some(q) => Some(shorten_vectors(&bench.explain(kind, q).await?)),
        None => None,
    };
    Ok(Series {
        kind: kind.name().into(),
        queries: queries.len(),
        latency: latency(&us),
        latency_skewed: (!us_skewed.is_empty()).then(|| latency(&us_skewed)),
        recall_at_10: if possible == 0 {
            0.0
        } else {
            found as f64 / possible as f64
        },
        latency_vector_only: latency(&us_vector),
        plan,
        plan_skewed,
        load_average: load_average(),
    })
}

fn make_queries(corpus: &Corpus, n: usize, seed: u64) -> (Vec<Query>, Vec<Query>, Vec<Query>) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_0f_0e41);
    let mut vector = vec![0f32; DIMS];
    let regular = corpus.people.iter().filter(|p| !p.skewed).count();
    let recall = (0..n)
        .map(|i| {
            // One in ten asks for a skewed person (thousands of messages).
            let p = if i % 10 == 9 {
                regular + rng.random_range(0..corpus.people.len() - regular)
            } else {
                rng.random_range(0..regular)
            };
            let t = corpus.people[p].topics[rng.random_range(0..4)];
            corpus.sample(t, &mut rng, &mut vector);
            Query {
                vector_id: i,
                vector: vector.clone(),
                text: corpus.query_text(t, &mut rng),
                person: Some((
                    p,
                    if rng.random_bool(0.5) {
                        "reggie"
                    } else {
                        "nova"
                    },
                )),
                agent: None,
            }
        })
        .collect();
    let search: Vec<Query> = (0..n)
        .map(|i| {
            let t = rng.random_range(0..corpus.topics);
            corpus.sample(t, &mut rng, &mut vector);
            Query {
                vector_id: n + i,
                vector: vector.clone(),
                text: corpus.query_text(t, &mut rng),
                person: None,
                agent: None,
            }
        })
        .collect();
    let agent = search
        .iter()
        .map(|q| Query {
            agent: Some(0),
            ..q.clone()
        })
        .collect();
    (recall, search, agent)
}

// ---- the run --------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct Run {
    /// `hnsw.ef_search` as the product's statements saw it.
    ef_search: String,
    series: Vec<Series>,
    /// The product's prepared ranking statements: how often Postgres planned them generically.
    prepared_statements: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize)]
struct Check {
    target: String,
    measured: f64,
    pass: bool,
}

fn destroy_stack(name: &str) {
    let status = Command::new("bash")
        .arg(repo_dir().join("deploy/local/stack.sh"))
        .args(["destroy", name])
        .status();
    if !status.is_ok_and(|s| s.success()) {
        eprintln!("warning: stack.sh destroy {name} failed");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.vectors >= SKEWED_PEOPLE * PER_PERSON * 10 && args.queries > 0 && args.topics > 0,
        "--vectors must be at least {} and --queries, --topics positive",
        SKEWED_PEOPLE * PER_PERSON * 10
    );
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| repo_dir().join("bench-results"))
        .join(&stamp);
    std::fs::create_dir_all(&out)?;
    let model = EmbeddingConfig::default().model;
    let corpus = Corpus::new(args.vectors, args.topics, args.seed);

    let mut stack = None;
    let (url, rows, load_report) = match &args.database_url {
        Some(url) => {
            println!("memory_bench: measuring the database given (generating its rows again)");
            let rows = generate(&corpus, args.vectors, args.seed, &model, None);
            (url.clone(), rows, None)
        }
        None => {
            let s = {
                let (n, np, pp) = (args.stack_name.clone(), args.nats_port, args.pg_port);
                // Without fsync: the data is generated, and thrown away after the run.
                tokio::task::spawn_blocking(move || Stack::up(&n, np, pp, true)).await??
            };
            let url = s.fresh_database("membench").await?;
            stack = Some(s);
            let db = switchboard_kit::db::connect(&url, 2).await?;
            switchboard_kit::db::migrate(&db).await?;
            db.close().await;
            let (rows, report) = load(
                &url,
                &corpus,
                args.vectors,
                args.seed,
                &model,
                &args.maintenance_work_mem,
            )
            .await?;
            (url, rows, Some(report))
        }
    };
    let result = measure_all(&args, &url, &corpus, &rows, &model).await;
    if let Some(s) = &stack {
        if args.keep_stack {
            println!(
                "memory_bench: stack '{}' kept; measure again with --database-url '{url}'",
                s.name
            );
        } else {
            s.down();
            destroy_stack(&s.name);
        }
    }
    let (runs, facts) = result?;

    let mut checks = Vec::new();
    let Some(product) = runs.first() else {
        anyhow::bail!("nothing was measured");
    };
    for s in &product.series {
        let kind = [Kind::Recall, Kind::Search, Kind::SearchAgent]
            .into_iter()
            .find(|k| k.name() == s.kind)
            .expect("a known kind");
        checks.push(Check {
            target: format!("{}: p99 <= {} ms", s.kind, kind.target_ms()),
            measured: s.latency.p99_ms,
            pass: s.latency.p99_ms <= kind.target_ms(),
        });
        checks.push(Check {
            target: format!("{}: recall@10 >= {TARGET_RECALL_AT_10}", s.kind),
            measured: s.recall_at_10,
            pass: s.recall_at_10 >= TARGET_RECALL_AT_10,
        });
    }
    let passed = checks.iter().all(|c| c.pass);

    println!();
    if let Some(l) = &load_report {
        println!(
            "load: {} vectors in {:.0} s ({:.0}/s); index builds: {}; vacuum analyze {:.0} s",
            l.rows,
            l.seconds,
            l.rows_per_s,
            l.index_builds
                .iter()
                .map(|b| format!("{} {:.0} s", b.name, b.seconds))
                .collect::<Vec<_>>()
                .join(", "),
            l.vacuum_analyze_s
        );
    }
    for run in &runs {
        println!("\nhnsw.ef_search = {}", run.ef_search);
        println!(
            "{:<28} {:>8} {:>8} {:>8} {:>8} {:>10} {:>14}",
            "query", "p50 ms", "p95 ms", "p99 ms", "max ms", "recall@10", "vec-only p99"
        );
        for s in &run.series {
            println!(
                "{:<28} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>10.3} {:>14.2}",
                s.kind,
                s.latency.p50_ms,
                s.latency.p95_ms,
                s.latency.p99_ms,
                s.latency.max_ms,
                s.recall_at_10,
                s.latency_vector_only.p99_ms
            );
            if let Some(l) = &s.latency_skewed {
                println!(
                    "{:<28} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
                    "  of which skewed people", l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
                );
            }
        }
    }
    println!("\ntargets (the product's settings, first run above):");
    for c in &checks {
        println!(
            "  {:<4} {:<50} measured {:.3}",
            if c.pass { "PASS" } else { "FAIL" },
            c.target,
            c.measured
        );
    }
    let json = serde_json::json!({
        "vectors": args.vectors,
        "queries": args.queries,
        "topics": args.topics,
        "seed": args.seed,
        "data": {
            "dimensions": DIMS,
            "per_person": PER_PERSON,
            "skewed_people": SKEWED_PEOPLE,
            "skewed_share": 0.1,
            "topic_subspace": SUBSPACE,
            "subspace_sigma": SUBSPACE_SIGMA,
            "isotropic_sigma": ISO_SIGMA,
            "people": corpus.people.len(),
        },
        "machine": facts,
        "load": load_report,
        "runs": runs,
        "checks": checks,
        "passed": passed,
    });
    let path = out.join("memory.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
    println!("\nwrote {}", path.display());
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}

async fn measure_all(
    args: &Args,
    url: &str,
    corpus: &Corpus,
    rows: &Rows,
    model: &str,
) -> anyhow::Result<(Vec<Run>, serde_json::Value)> {
    let (recall_q, search_q, agent_q) = make_queries(corpus, args.queries, args.seed);
    println!(
        "memory_bench: exact answers (brute force over {} vectors)",
        args.vectors
    );
    let t = Instant::now();
    let all: Vec<Query> = recall_q
        .iter()
        .chain(&search_q)
        .chain(&agent_q)
        .cloned()
        .collect();
    let candidates = tokio::task::block_in_place(|| brute_force(corpus, rows, &all));
    let admin = PgPoolOptions::new().max_connections(1).connect(url).await?;
    let exact = exact_top10(&admin, model, rows, &all, &candidates).await?;
    println!(
        "memory_bench: exact answers in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let n = args.queries;
    let (exact_recall, rest) = exact.split_at(n);
    let (exact_search, exact_agent) = rest.split_at(n);

    let facts: serde_json::Value = {
        let (pg, pgvector, shared_buffers, work_mem, db_name): (
            String,
            String,
            String,
            String,
            String,
        ) = sqlx::query_as(
            "SELECT version(), (SELECT extversion FROM pg_extension WHERE extname = 'vector'),
                        current_setting('shared_buffers'), current_setting('work_mem'),
                        current_database()",
        )
        .fetch_one(&admin)
        .await?;
        let sizes: Vec<(String, i64)> = sqlx::query_as(
            "SELECT c.relname::text, pg_total_relation_size(c.oid) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'switchboard'
                AND c.relname IN ('messages', 'message_vectors', 'message_vectors_person',
                                  'message_vectors_hnsw_all_minilm_l6_v2', 'messages_search')
              ORDER BY 1",
        )
        .fetch_all(&admin)
        .await?;
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
            })
            .unwrap_or_default();
        let mem_gb = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.trim().trim_end_matches(" kB").parse::<f64>().ok())
            .map(|kb| kb / 1024.0 / 1024.0);
        serde_json::json!({
            "cpu": cpu,
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "memory_gb": mem_gb,
            "postgres": pg,
            "pgvector": pgvector,
            "shared_buffers": shared_buffers,
            "work_mem": work_mem,
            "database": db_name,
            "sizes_bytes": sizes.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
            "load_average_at_start": load_average(),
        })
    };

    let mut settings: Vec<Option<u32>> = vec![None];
    settings.extend(args.ef_search.iter().copied().map(Some));
    let mut runs = Vec::new();
    for ef in settings {
        let db_name = facts["database"].as_str().unwrap_or_default();
        let set = match ef {
            None => format!("ALTER DATABASE \"{db_name}\" RESET hnsw.ef_search"),
            Some(v) => format!("ALTER DATABASE \"{db_name}\" SET hnsw.ef_search = {v}"),
        };
        sqlx::query(&set).execute(&admin).await?;
        // One connection: the prepared statements' plan counters below are all of them.
        let db = PgPoolOptions::new().max_connections(1).connect(url).await?;
        // pgvector defines its settings when the session first loads it.
        sqlx::query("SELECT '[1]'::vector").execute(&db).await?;
        let ef_search: String = sqlx::query_scalar("SELECT current_setting('hnsw.ef_search')")
            .fetch_one(&db)
            .await?;
        println!("\nmemory_bench: measuring with hnsw.ef_search = {ef_search}");
        let bench = Bench {
            db,
            corpus,
            embedder: BenchEmbedder {
                model: model.to_string(),
                next: Mutex::new(vec![0.0; DIMS]),
            },
        };
        let mut series = Vec::new();
        for (kind, q, e) in [
            (Kind::Recall, &recall_q, exact_recall),
            (Kind::Search, &search_q, exact_search),
            (Kind::SearchAgent, &agent_q, exact_agent),
        ] {
            let s = measure(&bench, kind, q, e).await?;
            println!(
                "  {:<28} p50 {:.2} ms  p99 {:.2} ms  recall@10 {:.3}",
                s.kind, s.latency.p50_ms, s.latency.p99_ms, s.recall_at_10
            );
            series.push(s);
        }
        let prepared: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements
              WHERE statement LIKE '%WITH vec AS%' OR statement LIKE '%NOT EXISTS (SELECT 1 FROM switchboard.message_vectors%'",
        )
        .fetch_all(&bench.db)
        .await?;
        runs.push(Run {
            ef_search,
            series,
            prepared_statements: prepared
                .into_iter()
                .map(|(statement, generic, custom)| {
                    serde_json::json!({
                        "statement_start": statement.split_whitespace().take(12).collect::<Vec<_>>().join(" "),
                        "generic_plans": generic,
                        "custom_plans": custom,
                    })
                })
                .collect(),
        });
        bench.db.close().await;
    }
    Ok((runs, facts))
}
