//! The floor: what the pipeline's I/O alone costs on this stack.
//!
//! One process does, per turn, the same durable work the pipeline does, counted from the code,
//! with no logic around it (no HTTP, no protobuf, no identity, ordering or ledger rules):
//!
//! | hop | consumes + acks | work publishes | event publishes | Postgres |
//! | --- | --- | --- | --- | --- |
//! | gateway | - | `in` (+ arrival counter: KV get, KV compare-and-set) | - | - |
//! | identify | `in` | `identified` | `message.received` | 1 SELECT |
//! | session | `identified` | `turn.<p>` | - (`session.created` once per session) | 1 transaction: cursor INSERT … ON CONFLICT … RETURNING, session INSERT … ON CONFLICT … RETURNING, SELECT, UPDATE … RETURNING, INSERT, cursor UPDATE |
//! | log-inbound | `turn.<p>` | - | `message.logged` | 1 INSERT per batch |
//! | dispatch | `turn.<p>` | `reply` | - | UPDATE … RETURNING (call lease), 1 transaction: UPDATE, UPDATE |
//! | log-outbound | `reply` | - | `message.logged` | 1 INSERT per batch |
//! | deliver | `reply` | - | `reply.delivered` | SELECT (order), INSERT … ON CONFLICT … RETURNING (claim), UPDATE |
//!
//! That is 4 work publishes, 4 event publishes (+1 per new session), 1 key-value read and 1
//! key-value compare-and-set, 6 consumes and acks, 15 statements (19 with `BEGIN` and `COMMIT`)
//! and 9 transactions (7 of them writing) per turn when every batch holds one message. Like the
//! product's log stages, the floor's log hops take what one pull brought and write it with one
//! `INSERT … SELECT FROM unnest(…)`, publish its events together, then ack. Publishes carry `Nats-Msg-Id` and wait for
//! their ack; inputs are acked after the outputs are stored, like the runtime does. The work
//! stream has Interest retention and the turn subject feeds two consumers, as in the product.
//!
//! Like the pipeline it is compared with, the floor runs on a fresh database, with a Postgres
//! pool of the same size per stage (the log hops share one, as they share the `log` process),
//! the same turn partitions and sessions, over a window of the same length. What a turn costs
//! is counted, not taken from the table above: statements by the floor itself, commits and
//! rows from `pg_stat_database`, publishes from the streams' sequences ([`IoCounts`]), from just
//! before the load until every turn it started has completed.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::future::try_join_all;
use futures::{FutureExt as _, StreamExt};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection as _, PgPool};
use switchboard_kit::Topology;
use tokio::sync::{Semaphore, oneshot};
use uuid::Uuid;

use super::bench_verdict::IoCounts;
use super::procs::CpuSnapshot;

#[derive(Debug, Clone)]
pub struct FloorOptions {
    pub nats_url: String,
    /// A fresh database of its own.
    pub database_url: String,
    /// A database on the same server to read `pg_stat_database` from (so the reads are not
    /// counted in the floor's own database).
    pub admin_url: String,
    pub prefix: String,
    /// Sessions, each with one turn in flight (closed loop), like the pipeline run it is
    /// compared with.
    pub sessions: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub batch: usize,
    pub concurrency: usize,
    /// Postgres connections per stage (the pipeline's per worker process).
    pub pool: u32,
    /// Turn partitions (`<p>.turn.<n>`), as `runtime.turn_partitions`.
    pub partitions: u32,
    /// NATS and Postgres (postmaster) pids, for CPU per turn.
    pub nats_pid: Option<u32>,
    pub postgres_pid: Option<u32>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FloorResult {
    pub sessions: usize,
    pub pool: u32,
    pub partitions: u32,
    /// Turns completed in the measured window.
    pub turns: u64,
    pub planned_window_s: u64,
    pub window_s: f64,
    pub turns_per_s: f64,
    /// What the turns cost, counted over the whole run (see the module comment).
    pub io: IoCounts,
    /// Every turn started completed before the counting ended.
    pub drained: bool,
    /// CPU per turn in the window, ms: the floor process alone, and with NATS and Postgres.
    pub cpu_ms_per_turn: f64,
    pub cpu_ms_per_turn_with_stack: f64,
}

/// Who counts the floor's statements.
const COUNTED_BY: &str = "counted by the floor, BEGIN and COMMIT included";

struct Floor {
    arrivals: jetstream::kv::Store,
    js: jetstream::Context,
    /// One pool per stage process: identify, session, log, dispatch, deliver.
    pools: [PgPool; 5],
    p: String,
    topology: Topology,
    done: Mutex<HashMap<Uuid, oneshot::Sender<()>>>,
    completed: AtomicU64,
    statements: AtomicU64,
    stop: AtomicBool,
}

#[derive(Clone, Copy)]
enum Hop {
    Identify,
    Session,
    LogInbound,
    Dispatch,
    LogOutbound,
    Deliver,
}

impl Hop {
    const ALL: [Hop; 6] = [
        Hop::Identify,
        Hop::Session,
        Hop::LogInbound,
        Hop::Dispatch,
        Hop::LogOutbound,
        Hop::Deliver,
    ];
    fn name(self) -> &'static str {
        match self {
            Hop::Identify => "identify",
            Hop::Session => "session",
            Hop::LogInbound => "log-inbound",
            Hop::Dispatch => "dispatch",
            Hop::LogOutbound => "log-outbound",
            Hop::Deliver => "deliver",
        }
    }
    /// Whether the hop handles what one pull brought at once (the product's batch stages).
    fn batched(self) -> bool {
        matches!(self, Hop::LogInbound | Hop::LogOutbound)
    }
    fn filter(self, p: &str) -> String {
        match self {
            Hop::Identify => format!("{p}.in.sms"),
            Hop::Session => format!("{p}.identified"),
            Hop::LogInbound | Hop::Dispatch => format!("{p}.turn.>"),
            Hop::LogOutbound | Hop::Deliver => format!("{p}.reply"),
        }
    }
    /// The stage process whose pool the hop uses (the log hops share the `log` process).
    fn pool(self) -> usize {
        match self {
            Hop::Identify => 0,
            Hop::Session => 1,
            Hop::LogInbound | Hop::LogOutbound => 2,
            Hop::Dispatch => 3,
            Hop::Deliver => 4,
        }
    }
}

/// The payload: session id, turn id, seq, and padding to the size of a real `Turn` message.
fn encode(session: Uuid, turn: Uuid, seq: i64) -> Bytes {
    Bytes::from(format!("{session}|{turn}|{seq}|{}", "x".repeat(320)))
}

fn decode(b: &[u8]) -> Option<(Uuid, Uuid, i64)> {
    let s = std::str::from_utf8(b).ok()?;
    let mut it = s.split('|');
    Some((
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    ))
}

impl Floor {
    async fn publish(&self, subject: String, id: String, payload: Bytes) -> anyhow::Result<()> {
        let msg = jetstream::message::PublishMessage::build()
            .payload(payload)
            .message_id(id);
        self.js.send_publish(subject, msg).await?.await?;
        Ok(())
    }

    /// Count `n` SQL statements about to be sent.
    fn sql(&self, n: u64) {
        self.statements.fetch_add(n, Ordering::Relaxed);
    }

    /// A log hop over a batch: one statement, the events published together.
    async fn log_batch(&self, hop: Hop, payloads: &[&[u8]]) -> anyhow::Result<()> {
        let p = &self.p;
        let mut ids = Vec::with_capacity(payloads.len());
        let mut sessions = Vec::with_capacity(payloads.len());
        for payload in payloads {
            let (session, turn, _) = decode(payload).context("floor payload")?;
            ids.push(if matches!(hop, Hop::LogInbound) {
                turn
            } else {
                Uuid::from_u128(turn.as_u128() ^ 1)
            });
            sessions.push(session);
        }
        let bodies = vec!["s1#1 a message of ordinary length"; payloads.len()];
        self.sql(1);
        sqlx::query(
            "INSERT INTO messages (id, session_id, body)
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[])
             ON CONFLICT DO NOTHING",
        )
        .bind(&ids)
        .bind(&sessions)
        .bind(&bodies)
        .execute(&self.pools[hop.pool()])
        .await?;
        try_join_all(ids.iter().zip(payloads).map(|(id, payload)| {
            self.publish(
                format!("{p}.events.logged"),
                format!("l/{id}"),
                Bytes::copy_from_slice(payload),
            )
        }))
        .await?;
        Ok(())
    }

    async fn hop(&self, hop: Hop, payload: &[u8]) -> anyhow::Result<()> {
        let (session, turn, seq) = decode(payload).context("floor payload")?;
        let p = &self.p;
        let ev = |name: &str| format!("{p}.events.{name}");
        let body = Bytes::copy_from_slice(payload);
        let db = &self.pools[hop.pool()];
        match hop {
            Hop::Identify => {
                self.sql(1);
                sqlx::query("SELECT 1 FROM sessions WHERE id = $1")
                    .bind(session)
                    .fetch_optional(db)
                    .await?;
                try_join_all([
                    self.publish(format!("{p}.identified"), format!("i/{turn}"), body.clone()),
                    self.publish(ev("received"), format!("ie/{turn}"), body),
                ])
                .await?;
            }
            Hop::Session => {
                // BEGIN, six statements, COMMIT.
                self.sql(8);
                let mut tx = db.begin().await?;
                let (last,): (i64,) = sqlx::query_as(
                    "INSERT INTO cursors (id, last_seq) VALUES ($1, 0)
                     ON CONFLICT (id) DO UPDATE SET last_seq = cursors.last_seq RETURNING last_seq",
                )
                .bind(session)
                .fetch_one(&mut *tx)
                .await?;
                let (created,): (bool,) = sqlx::query_as(
                    "INSERT INTO sessions (id) VALUES ($1)
                     ON CONFLICT (id) DO UPDATE SET status = sessions.status
                     RETURNING xmax = 0",
                )
                .bind(session)
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query("SELECT seq FROM turns WHERE turn_id = $1")
                    .bind(turn)
                    .fetch_optional(&mut *tx)
                    .await?;
                let seq: i64 = sqlx::query_scalar(
                    "UPDATE sessions SET next_seq = next_seq + 1 WHERE id = $1 RETURNING next_seq - 1",
                )
                .bind(session)
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query("INSERT INTO turns (session_id, seq, turn_id) VALUES ($1, $2, $3)")
                    .bind(session)
                    .bind(seq)
                    .bind(turn)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("UPDATE cursors SET last_seq = $2 WHERE id = $1")
                    .bind(session)
                    .bind(last + 1)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                let mut outs = vec![self.publish(
                    format!("{p}.turn.{}", self.topology.partition_of(&session)),
                    format!("s/{turn}"),
                    encode(session, turn, seq),
                )];
                if created {
                    outs.push(self.publish(ev("created"), format!("se/{session}"), body));
                }
                try_join_all(outs).await?;
            }
            Hop::LogInbound | Hop::LogOutbound => self.log_batch(hop, &[payload]).await?,
            Hop::Dispatch => {
                // The call lease; then BEGIN, two statements, COMMIT.
                self.sql(5);
                sqlx::query(
                    "UPDATE sessions SET status = 'running' WHERE id = $1 RETURNING last_seq",
                )
                .bind(session)
                .fetch_one(db)
                .await?;
                let mut tx = db.begin().await?;
                sqlx::query("UPDATE sessions SET last_seq = $2, status = 'idle' WHERE id = $1")
                    .bind(session)
                    .bind(seq)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("UPDATE turns SET done = true WHERE session_id = $1 AND seq = $2")
                    .bind(session)
                    .bind(seq)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                self.publish(format!("{p}.reply"), format!("d/{turn}"), body)
                    .await?;
            }
            Hop::Deliver => {
                self.sql(3);
                sqlx::query("SELECT status FROM deliveries WHERE id = $1")
                    .bind(Uuid::from_u128(turn.as_u128() ^ 2))
                    .fetch_optional(db)
                    .await?;
                sqlx::query(
                    "INSERT INTO deliveries (id, status, attempts) VALUES ($1, 'pending', 1)
                     ON CONFLICT (id) DO UPDATE SET attempts = deliveries.attempts + 1
                     RETURNING parts",
                )
                .bind(turn)
                .fetch_optional(db)
                .await?;
                sqlx::query(
                    "UPDATE deliveries SET parts = parts + 1, status = 'sent' WHERE id = $1",
                )
                .bind(turn)
                .execute(db)
                .await?;
                self.publish(ev("delivered"), format!("dv/{turn}"), body)
                    .await?;
                if let Some(tx) = self.done.lock().unwrap().remove(&turn) {
                    let _ = tx.send(());
                }
                self.completed.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// Pull and handle `hop`'s messages until the floor stops.
async fn consume(
    floor: Arc<Floor>,
    hop: Hop,
    consumer: consumer::PullConsumer,
    batch: usize,
    concurrency: usize,
) {
    let sem = Arc::new(Semaphore::new(concurrency));
    let stopped = || floor.stop.load(Ordering::Relaxed);
    while !stopped() {
        let Ok(mut messages) = consumer
            .stream()
            .max_messages_per_batch(batch)
            .expires(Duration::from_secs(1))
            .messages()
            .await
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while !stopped() {
            let permit = sem.clone().acquire_owned().await.expect("open");
            let next = tokio::time::timeout(Duration::from_secs(1), messages.next()).await;
            let msg = match next {
                Ok(Some(Ok(m))) => m,
                Ok(Some(Err(_))) | Err(_) => continue,
                Ok(None) => break,
            };
            // The log hops take what is already here, as the product's batch stages do.
            let mut msgs = vec![msg];
            if hop.batched() {
                while msgs.len() < batch {
                    match messages.next().now_or_never() {
                        Some(Some(Ok(m))) => msgs.push(m),
                        _ => break,
                    }
                }
            }
            let floor = floor.clone();
            tokio::spawn(async move {
                let done = if hop.batched() {
                    let payloads: Vec<&[u8]> = msgs.iter().map(|m| &m.payload[..]).collect();
                    floor.log_batch(hop, &payloads).await
                } else {
                    floor.hop(hop, &msgs[0].payload).await
                };
                match done {
                    Ok(()) => {
                        futures::future::join_all(msgs.iter().map(|m| m.ack())).await;
                    }
                    Err(e) => {
                        if !floor.stop.load(Ordering::Relaxed) {
                            eprintln!("floor {}: {e:#}", hop.name());
                        }
                        for m in &msgs {
                            let _ = m
                                .ack_with(jetstream::AckKind::Nak(Some(Duration::from_millis(100))))
                                .await;
                        }
                    }
                }
                drop(permit);
            });
        }
    }
}

/// Messages waiting or unacked, summed over the floor's consumers.
async fn backlog(work: &jetstream::stream::Stream) -> anyhow::Result<u64> {
    let mut n = 0;
    for hop in Hop::ALL {
        let mut c: consumer::PullConsumer = work
            .get_consumer(hop.name())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let info = c.info().await?;
        n += info.num_pending + info.num_ack_pending as u64;
    }
    Ok(n)
}

/// Run the floor for `duration` (after `warmup`) with `sessions` turns in flight.
pub async fn run(
    o: &FloorOptions,
    progress: impl Fn(u64) + Send + 'static,
) -> anyhow::Result<FloorResult> {
    let database = database_name(&o.database_url)?;
    let nats =
        switchboard_kit::endpoint::nats_connect(&o.nats_url, async_nats::ConnectOptions::new())
            .await?;
    let js = jetstream::new(nats);
    // The tables, on a connection of its own that is gone before the counting starts.
    {
        let mut conn = sqlx::PgConnection::connect(&o.database_url).await?;
        for ddl in [
            "CREATE TABLE IF NOT EXISTS sessions (id UUID PRIMARY KEY, next_seq BIGINT NOT NULL DEFAULT 1,
                last_seq BIGINT NOT NULL DEFAULT 0, status TEXT NOT NULL DEFAULT 'idle')",
            "CREATE TABLE IF NOT EXISTS turns (session_id UUID NOT NULL, seq BIGINT NOT NULL,
                turn_id UUID NOT NULL UNIQUE, done BOOLEAN NOT NULL DEFAULT false,
                PRIMARY KEY (session_id, seq))",
            "CREATE TABLE IF NOT EXISTS messages (id UUID PRIMARY KEY, session_id UUID NOT NULL, body TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS cursors (id UUID PRIMARY KEY, last_seq BIGINT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS deliveries (id UUID PRIMARY KEY, status TEXT NOT NULL,
                parts INT NOT NULL DEFAULT 0, attempts INT NOT NULL DEFAULT 0)",
        ] {
            sqlx::query(ddl).execute(&mut conn).await?;
        }
        conn.close().await?;
    }
    let p = o.prefix.clone();
    let upper = p.to_ascii_uppercase();
    js.create_or_update_stream(stream::Config {
        name: format!("{upper}_WORK"),
        subjects: vec![
            format!("{p}.in.sms"),
            format!("{p}.identified"),
            format!("{p}.turn.>"),
            format!("{p}.reply"),
        ],
        retention: stream::RetentionPolicy::Interest,
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    })
    .await?;
    js.create_or_update_stream(stream::Config {
        name: format!("{upper}_EVENTS"),
        subjects: vec![format!("{p}.events.>")],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    })
    .await?;
    let work = js.get_stream(format!("{upper}_WORK")).await?;
    let arrivals = js
        .create_key_value(jetstream::kv::Config {
            bucket: format!("{upper}_ARRIVALS"),
            history: 1,
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    let streams = [
        format!("{upper}_WORK"),
        format!("{upper}_EVENTS"),
        format!("KV_{upper}_ARRIVALS"),
    ];

    // Counting starts here.
    wait_for_no_backends(&o.admin_url, &database, Duration::from_secs(10)).await;
    let pg_before = pg_counters(&o.admin_url, &database).await?;
    let seq_before = stream_sequences(&js, &streams).await;

    let pool = || {
        PgPoolOptions::new()
            .max_connections(o.pool)
            .connect(&o.database_url)
    };
    let pools = [
        pool().await?,
        pool().await?,
        pool().await?,
        pool().await?,
        pool().await?,
    ];
    let floor = Arc::new(Floor {
        arrivals,
        js: js.clone(),
        pools,
        p: p.clone(),
        topology: Topology::new(p.clone(), o.partitions),
        done: Mutex::new(HashMap::new()),
        completed: AtomicU64::new(0),
        statements: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let start = Instant::now();
    let until = start + o.warmup + o.duration;
    let mut consumers = Vec::new();
    for hop in Hop::ALL {
        let c = work
            .create_consumer(consumer::pull::Config {
                durable_name: Some(hop.name().into()),
                filter_subject: hop.filter(&p),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: (o.concurrency.max(o.batch) * 16) as i64,
                ..Default::default()
            })
            .await?;
        consumers.push(tokio::spawn(consume(
            floor.clone(),
            hop,
            c,
            o.batch,
            o.concurrency,
        )));
    }

    // Closed loop: every session keeps one turn in flight; after `until` each finishes the
    // turn it has in flight and stops.
    let mut senders = tokio::task::JoinSet::new();
    for s in 0..o.sessions {
        let floor = floor.clone();
        senders.spawn(async move {
            let session = Uuid::from_u128(0xf100_0000_0000_0000 ^ s as u128);
            while Instant::now() < until {
                let turn = Uuid::now_v7();
                let (tx, rx) = oneshot::channel();
                floor.done.lock().unwrap().insert(turn, tx);
                let p = &floor.p;
                // The gateway's arrival number: read the sender's counter, compare-and-set it.
                let key = format!("s{s}");
                let counted = async {
                    let rev = floor
                        .arrivals
                        .entry(key.as_str())
                        .await?
                        .map_or(0, |e| e.revision);
                    floor
                        .arrivals
                        .update(key.as_str(), Bytes::from(turn.to_string()), rev)
                        .await?;
                    anyhow::Ok(())
                };
                if counted.await.is_err()
                    || floor
                        .publish(
                            format!("{p}.in.sms"),
                            format!("g/{turn}"),
                            encode(session, turn, 0),
                        )
                        .await
                        .is_err()
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                let _ = tokio::time::timeout(Duration::from_secs(30), rx).await;
            }
        });
    }
    let mut at_warm = None;
    let mut cpu_before = None;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let n = floor.completed.load(Ordering::Relaxed);
        progress(n);
        if at_warm.is_none() && start.elapsed() >= o.warmup {
            at_warm = Some((n, Instant::now()));
            cpu_before = Some(CpuSnapshot::take(&[], o.nats_pid, o.postgres_pid));
        }
    }
    let end_n = floor.completed.load(Ordering::Relaxed);
    let cpu =
        cpu_before
            .unwrap_or_default()
            .delta(&CpuSnapshot::take(&[], o.nats_pid, o.postgres_pid));
    let (warm_n, warm_at) = at_warm.unwrap_or((0, start));
    let window = warm_at.elapsed().as_secs_f64();

    // Let the turns in flight complete (every hop, the log hops included), then count.
    let drained = tokio::time::timeout(Duration::from_secs(40), async {
        while senders.join_next().await.is_some() {}
        while backlog(&work).await.map_or(true, |n| n > 0) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .is_ok();
    senders.abort_all();
    floor.stop.store(true, Ordering::SeqCst);
    for c in consumers {
        let _ = tokio::time::timeout(Duration::from_secs(3), c).await;
    }
    let seq_after = stream_sequences(&js, &streams).await;
    for pool in &floor.pools {
        pool.close().await;
    }
    wait_for_no_backends(&o.admin_url, &database, Duration::from_secs(10)).await;
    let pg_after = pg_counters(&o.admin_url, &database).await?;
    let _ = js.delete_stream(format!("{upper}_WORK")).await;
    let _ = js.delete_stream(format!("{upper}_EVENTS")).await;
    let _ = js.delete_key_value(format!("{upper}_ARRIVALS")).await;

    let turns = end_n - warm_n;
    let per_turn = |s: f64| s * 1000.0 / turns.max(1) as f64;
    Ok(FloorResult {
        sessions: o.sessions,
        pool: o.pool,
        partitions: o.partitions,
        turns,
        planned_window_s: o.duration.as_secs(),
        window_s: window,
        turns_per_s: turns as f64 / window.max(1e-9),
        io: io_counts(
            floor.completed.load(Ordering::Relaxed),
            (&pg_before, &seq_before),
            (&pg_after, &seq_after),
            Some(floor.statements.load(Ordering::Relaxed)),
            COUNTED_BY.into(),
        ),
        drained,
        cpu_ms_per_turn: per_turn(cpu.harness),
        cpu_ms_per_turn_with_stack: per_turn(cpu.harness + cpu.nats + cpu.postgres),
    })
}

// ---- counting I/O (the floor's and the pipeline's alike) ------------------------------------

/// `pg_stat_database` counters of one database.
#[derive(Debug, Clone, Copy, Default)]
pub struct PgCounters {
    pub commits: u64,
    pub rollbacks: u64,
    pub inserted: u64,
    pub updated: u64,
    pub deleted: u64,
}

/// The database name in a Postgres URL.
pub fn database_name(url: &str) -> anyhow::Result<String> {
    let u = reqwest::Url::parse(url).context("a Postgres URL")?;
    let name = u.path().trim_start_matches('/');
    anyhow::ensure!(!name.is_empty(), "no database in the URL");
    Ok(name.to_string())
}

/// `database`'s counters, read through `admin_url` (another database of the same server, so
/// that the read is not counted in `database`). The view shows what backends have flushed:
/// a busy backend flushes at most once a second, an idle one after 10 s
/// (`PGSTAT_IDLE_INTERVAL`), an exiting one at once; read after the backends are gone
/// ([`wait_for_no_backends`]) for exact numbers.
pub async fn pg_counters(admin_url: &str, database: &str) -> anyhow::Result<PgCounters> {
    let mut conn = sqlx::PgConnection::connect(admin_url).await?;
    let row: (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted
         FROM pg_stat_database WHERE datname = $1",
    )
    .bind(database)
    .fetch_one(&mut conn)
    .await
    .with_context(|| format!("pg_stat_database of {database}"))?;
    let _ = conn.close().await;
    let u = |v: i64| v.max(0) as u64;
    Ok(PgCounters {
        commits: u(row.0),
        rollbacks: u(row.1),
        inserted: u(row.2),
        updated: u(row.3),
        deleted: u(row.4),
    })
}

/// Wait (at most `timeout`) until no backend is connected to `database`, so every backend
/// has flushed its statistics on exit; returns whether that happened.
pub async fn wait_for_no_backends(admin_url: &str, database: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let Ok(mut conn) = sqlx::PgConnection::connect(admin_url).await else {
        return false;
    };
    let gone = loop {
        let n: Option<i64> =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
                .bind(database)
                .fetch_one(&mut conn)
                .await
                .ok();
        if n == Some(0) {
            break true;
        }
        if Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = conn.close().await;
    // A backend leaves pg_stat_activity while it exits; its last flush is part of that.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gone
}

/// Each stream's last sequence (0 for a stream that does not exist).
pub async fn stream_sequences(
    js: &jetstream::Context,
    streams: &[String],
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for name in streams {
        let seq = match js.get_stream(name).await {
            Ok(mut s) => s.info().await.map_or(0, |i| i.state.last_sequence),
            Err(_) => 0,
        };
        out.insert(name.clone(), seq);
    }
    out
}

/// What `turns` turns cost between two readings.
pub fn io_counts(
    turns: u64,
    before: (&PgCounters, &BTreeMap<String, u64>),
    after: (&PgCounters, &BTreeMap<String, u64>),
    statements: Option<u64>,
    statements_counted_by: String,
) -> IoCounts {
    let (b, a) = (before.0, after.0);
    IoCounts {
        turns,
        commits: a.commits.saturating_sub(b.commits),
        rollbacks: a.rollbacks.saturating_sub(b.rollbacks),
        rows_inserted: a.inserted.saturating_sub(b.inserted),
        rows_updated: a.updated.saturating_sub(b.updated),
        rows_deleted: a.deleted.saturating_sub(b.deleted),
        statements,
        statements_counted_by,
        stream_messages: after
            .1
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.saturating_sub(before.1.get(k).copied().unwrap_or(0)),
                )
            })
            .collect(),
        tables: BTreeMap::new(),
    }
}
