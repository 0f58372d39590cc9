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
//! | log-inbound | `turn.<p>` | - | `message.logged` | 1 INSERT |
//! | dispatch | `turn.<p>` | `reply` | - | UPDATE … RETURNING (call lease), 1 transaction: UPDATE, UPDATE |
//! | log-outbound | `reply` | - | `message.logged` | 1 INSERT |
//! | deliver | `reply` | - | `reply.delivered` | SELECT (order), INSERT … ON CONFLICT … RETURNING (claim), UPDATE |
//!
//! That is 4 work publishes, 4 event publishes (+1 per new session), 1 key-value read and 1
//! key-value compare-and-set, 6 consumes and acks, 15 statements and 7 write commits per turn. Publishes carry `Nats-Msg-Id` and wait for their
//! ack; inputs are acked after the outputs are stored, like the runtime does. The work stream
//! has Interest retention and the turn subject feeds two consumers, as in the product.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::try_join_all;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::{Semaphore, oneshot};
use uuid::Uuid;

use super::procs::CpuSnapshot;

#[derive(Debug, Clone)]
pub struct FloorOptions {
    pub nats_url: String,
    pub database_url: String,
    pub prefix: String,
    /// Sessions, each with one turn in flight (closed loop), like the pipeline run it is
    /// compared with.
    pub sessions: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub batch: usize,
    pub concurrency: usize,
    pub pool: u32,
    /// NATS and Postgres (postmaster) pids, for CPU per turn.
    pub nats_pid: Option<u32>,
    pub postgres_pid: Option<u32>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FloorResult {
    pub turns: u64,
    pub window_s: f64,
    pub turns_per_s: f64,
    pub per_turn: &'static str,
    /// CPU per turn in the window, ms: the floor process alone, and with NATS and Postgres.
    pub cpu_ms_per_turn: f64,
    pub cpu_ms_per_turn_with_stack: f64,
}

const PER_TURN: &str = "4 work + 4 event publishes (acked, deduped), 1 KV get + 1 KV compare-and-set, 6 consumes + acks, 15 SQL statements / 7 write commits";

/// How long the floor's consumers run on after the measured window.
const TEARDOWN: Duration = Duration::from_secs(2);

struct Floor {
    arrivals: jetstream::kv::Store,
    js: jetstream::Context,
    db: PgPool,
    p: String,
    partitions: u32,
    done: Mutex<HashMap<Uuid, oneshot::Sender<()>>>,
    completed: AtomicU64,
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
    fn filter(self, p: &str) -> String {
        match self {
            Hop::Identify => format!("{p}.in"),
            Hop::Session => format!("{p}.identified"),
            Hop::LogInbound | Hop::Dispatch => format!("{p}.turn.>"),
            Hop::LogOutbound | Hop::Deliver => format!("{p}.reply"),
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

    async fn hop(&self, hop: Hop, payload: &[u8]) -> anyhow::Result<()> {
        let (session, turn, seq) = decode(payload).context("floor payload")?;
        let p = &self.p;
        let ev = |name: &str| format!("{p}.events.{name}");
        let body = Bytes::copy_from_slice(payload);
        match hop {
            Hop::Identify => {
                sqlx::query("SELECT 1 FROM sessions WHERE id = $1")
                    .bind(session)
                    .fetch_optional(&self.db)
                    .await?;
                try_join_all([
                    self.publish(format!("{p}.identified"), format!("i/{turn}"), body.clone()),
                    self.publish(ev("received"), format!("ie/{turn}"), body),
                ])
                .await?;
            }
            Hop::Session => {
                let mut tx = self.db.begin().await?;
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
                let part = (session.as_u128() % self.partitions as u128) as u32;
                let mut outs = vec![self.publish(
                    format!("{p}.turn.{part}"),
                    format!("s/{turn}"),
                    encode(session, turn, seq),
                )];
                if created {
                    outs.push(self.publish(ev("created"), format!("se/{session}"), body));
                }
                try_join_all(outs).await?;
            }
            Hop::LogInbound | Hop::LogOutbound => {
                let id = if matches!(hop, Hop::LogInbound) {
                    turn
                } else {
                    Uuid::from_u128(turn.as_u128() ^ 1)
                };
                sqlx::query(
                    "INSERT INTO messages (id, session_id, body) VALUES ($1, $2, $3)
                     ON CONFLICT DO NOTHING",
                )
                .bind(id)
                .bind(session)
                .bind("s1#1 a message of ordinary length")
                .execute(&self.db)
                .await?;
                self.publish(ev("logged"), format!("l/{id}"), body).await?;
            }
            Hop::Dispatch => {
                sqlx::query(
                    "UPDATE sessions SET status = 'running' WHERE id = $1 RETURNING last_seq",
                )
                .bind(session)
                .fetch_one(&self.db)
                .await?;
                let mut tx = self.db.begin().await?;
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
                sqlx::query("SELECT status FROM deliveries WHERE id = $1")
                    .bind(Uuid::from_u128(turn.as_u128() ^ 2))
                    .fetch_optional(&self.db)
                    .await?;
                sqlx::query(
                    "INSERT INTO deliveries (id, status, attempts) VALUES ($1, 'pending', 1)
                     ON CONFLICT (id) DO UPDATE SET attempts = deliveries.attempts + 1
                     RETURNING parts",
                )
                .bind(turn)
                .fetch_optional(&self.db)
                .await?;
                sqlx::query(
                    "UPDATE deliveries SET parts = parts + 1, status = 'sent' WHERE id = $1",
                )
                .bind(turn)
                .execute(&self.db)
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

async fn consume(
    floor: Arc<Floor>,
    hop: Hop,
    consumer: consumer::PullConsumer,
    batch: usize,
    concurrency: usize,
    until: Instant,
) {
    let sem = Arc::new(Semaphore::new(concurrency));
    while Instant::now() < until {
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
        while Instant::now() < until {
            let permit = sem.clone().acquire_owned().await.expect("open");
            let next = tokio::time::timeout(Duration::from_secs(1), messages.next()).await;
            let msg = match next {
                Ok(Some(Ok(m))) => m,
                Ok(Some(Err(_))) | Err(_) => continue,
                Ok(None) => break,
            };
            let floor = floor.clone();
            tokio::spawn(async move {
                match floor.hop(hop, &msg.payload).await {
                    Ok(()) => {
                        let _ = msg.ack().await;
                    }
                    Err(e) => {
                        // Consumers outlive the run by `TEARDOWN` while the streams and pool
                        // are torn down; errors then are expected, not worth printing.
                        if Instant::now() + TEARDOWN < until {
                            eprintln!("floor {}: {e:#}", hop.name());
                        }
                        let _ = msg
                            .ack_with(jetstream::AckKind::Nak(Some(Duration::from_millis(100))))
                            .await;
                    }
                }
                drop(permit);
            });
        }
    }
}

/// Run the floor for `duration` (after `warmup`) with `sessions` turns in flight.
pub async fn run(
    o: &FloorOptions,
    progress: impl Fn(u64) + Send + 'static,
) -> anyhow::Result<FloorResult> {
    let nats = async_nats::connect(&o.nats_url).await?;
    let js = jetstream::new(nats);
    let db = PgPoolOptions::new()
        .max_connections(o.pool)
        .connect(&o.database_url)
        .await?;
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
        sqlx::query(ddl).execute(&db).await?;
    }
    let p = o.prefix.clone();
    let upper = p.to_ascii_uppercase();
    js.create_or_update_stream(stream::Config {
        name: format!("{upper}_WORK"),
        subjects: vec![
            format!("{p}.in"),
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
    let floor = Arc::new(Floor {
        arrivals,
        js: js.clone(),
        db: db.clone(),
        p: p.clone(),
        partitions: 32,
        done: Mutex::new(HashMap::new()),
        completed: AtomicU64::new(0),
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
            until + TEARDOWN,
        )));
    }

    // Closed loop: every session keeps one turn in flight.
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
                            format!("{p}.in"),
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
    senders.abort_all();
    for c in consumers {
        c.abort();
    }
    let _ = js.delete_stream(format!("{upper}_WORK")).await;
    let _ = js.delete_stream(format!("{upper}_EVENTS")).await;
    db.close().await;
    let turns = end_n - warm_n;
    let per_turn = |s: f64| s * 1000.0 / turns.max(1) as f64;
    Ok(FloorResult {
        turns,
        window_s: window,
        turns_per_s: turns as f64 / window.max(1e-9),
        per_turn: PER_TURN,
        cpu_ms_per_turn: per_turn(cpu.harness),
        cpu_ms_per_turn_with_stack: per_turn(cpu.harness + cpu.nats + cpu.postgres),
    })
}
