//! The chaos run: SMS from many senders while a random worker process is SIGKILLed every few
//! seconds (and started again right away, as an orchestrator would), and NATS and Postgres are
//! restarted mid-run. Afterwards every accepted message is accounted for:
//!
//! - inbound lost: accepted by the gateway (200) but no turn or no inbound log row;
//! - replies lost: a turn with no SMS at Twilio;
//! - replies delivered twice, each matched against the documented window (the deliverer died,
//!   or could not record the send, after Twilio accepted it);
//! - order: the runner saw a person's turn N+1 before N, or a person got SMS out of order;
//! - overlap: the runner saw two calls for the same person at once.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng as _;
use serde::Serialize;
use sqlx::Row as _;

use super::fakes::{LoadRunner, LoadTwilio, RunnerStats, TwilioStats};
use super::loadgen::{LoadGen, LoadStats, in_groups};
use super::pipeline::{self, Knobs, Pipeline};
use super::stack::Stack;
use super::{message_text, now_us};

#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub stack_name: String,
    pub nats_port: u16,
    pub pg_port: u16,
    pub sessions: usize,
    pub per_session: u32,
    /// Messages per second offered to the gateway.
    pub rate: f64,
    /// Senders whose messages interleave; one sender's messages come `group / rate` s apart.
    pub group: usize,
    pub kill_every: Duration,
    /// Kills stop after this long (default: when the last message was accepted).
    pub kill_for: Option<Duration>,
    pub restart_nats_at: Option<Duration>,
    pub restart_pg_at: Option<Duration>,
    pub runner_delay: Duration,
    /// Worker binaries and replicas.
    pub replicas: Vec<(&'static str, usize)>,
    /// How long to wait for the last replies after the load and the kills stopped.
    pub drain_timeout: Duration,
    pub dir: PathBuf,
    pub knobs: Knobs,
    pub progress: bool,
}

impl ChaosOptions {
    /// `make chaos`: 20,000 turns across 2,000 sessions.
    pub fn full(dir: PathBuf) -> Self {
        Self {
            stack_name: "chaos".into(),
            nats_port: 38222,
            pg_port: 39432,
            sessions: 2_000,
            per_session: 10,
            rate: 400.0,
            group: 50,
            kill_every: Duration::from_secs(2),
            kill_for: None,
            restart_nats_at: Some(Duration::from_secs(15)),
            restart_pg_at: Some(Duration::from_secs(32)),
            runner_delay: Duration::from_millis(20),
            replicas: vec![
                ("gateway", 1),
                ("identify", 1),
                ("session", 1),
                ("log", 1),
                ("deliver", 2),
                ("dispatch", 2),
            ],
            drain_timeout: Duration::from_secs(180),
            dir,
            knobs: chaos_knobs(),
            progress: true,
        }
    }

    /// The bounded version that runs inside `make test`: 600 turns, 60 sessions, kills every
    /// 2 s for 20 s, one NATS restart.
    pub fn small(dir: PathBuf) -> Self {
        Self {
            stack_name: "chaos-small".into(),
            nats_port: 44222,
            pg_port: 45432,
            sessions: 60,
            per_session: 10,
            rate: 30.0,
            group: 10,
            kill_every: Duration::from_secs(2),
            kill_for: Some(Duration::from_secs(20)),
            restart_nats_at: Some(Duration::from_secs(8)),
            restart_pg_at: None,
            runner_delay: Duration::from_millis(20),
            replicas: vec![
                ("gateway", 1),
                ("identify", 1),
                ("session", 1),
                ("log", 1),
                ("deliver", 1),
                ("dispatch", 2),
            ],
            drain_timeout: Duration::from_secs(60),
            dir,
            knobs: chaos_knobs(),
            progress: false,
        }
    }
}

/// Settings of a deployment that expects crashes: redeliver a dead worker's messages after 2 s.
pub fn chaos_knobs() -> Knobs {
    Knobs {
        batch: 32,
        concurrency: 64,
        agent_concurrency: 64,
        ack_wait_ms: 2_000,
        partitions: 8,
        runner_timeout_s: 10,
        retry_base_ms: 100,
        retry_max_ms: 1_000,
        shutdown_grace_ms: 2_000,
        ..Knobs::default()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub at_s: f64,
    pub what: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosReport {
    pub sessions: usize,
    pub messages: u64,
    pub elapsed_s: f64,
    pub load: LoadStats,
    /// Distinct messages the gateway accepted.
    pub accepted: u64,
    pub inbound_lost_no_turn: u64,
    pub inbound_lost_no_log: u64,
    pub replies_lost: u64,
    /// Lost replies by the turn's status (`done`, `failed`, `open`, `missing`).
    pub replies_lost_by_turn_status: BTreeMap<String, u64>,
    pub outbound_log_rows_missing: u64,
    pub replies_doubled: u64,
    /// Doubles with a deliver worker killed (or a Postgres restart) between the two sends.
    pub replies_doubled_in_window: u64,
    pub replies_doubled_unexplained: u64,
    /// The runner got a person's message before one they sent earlier (gateway arrival order).
    pub runner_arrival_order_violations: u64,
    /// The runner got a session's turn before a lower-numbered one (`seq`, the session stage's
    /// numbering, which dispatch enforces).
    pub runner_seq_order_violations: u64,
    /// A person got SMS replies out of the order they wrote.
    pub sms_arrival_order_violations: u64,
    /// A person got SMS replies out of turn (`seq`) order.
    pub sms_seq_order_violations: u64,
    pub overlapping_turns: u64,
    pub dead_letters: BTreeMap<String, u64>,
    pub kills: u64,
    /// Worker processes that exited by themselves (and were restarted), by worker.
    pub self_exits: BTreeMap<String, u32>,
    pub nats_restarts: u32,
    pub postgres_restarts: u32,
    pub settled: bool,
    pub runner: RunnerStats,
    pub twilio: TwilioStats,
    pub lost_examples: Vec<String>,
    pub events: Vec<Event>,
}

impl ChaosReport {
    /// What makes the run fail: loss, order, overlap, doubles outside the documented window.
    pub fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        let mut check = |n: u64, what: &str| {
            if n > 0 {
                f.push(format!("{n} {what}"));
            }
        };
        check(self.load.gave_up, "messages never accepted by the gateway");
        check(self.inbound_lost_no_turn, "accepted messages with no turn");
        check(
            self.inbound_lost_no_log,
            "accepted messages with no inbound log row",
        );
        check(self.replies_lost, "turns with no SMS delivered");
        check(
            self.runner_seq_order_violations,
            "runner turn (seq) order violations",
        );
        check(
            self.runner_arrival_order_violations,
            "runner arrival order violations",
        );
        check(
            self.sms_arrival_order_violations,
            "SMS arrival order violations",
        );
        check(
            self.sms_seq_order_violations,
            "SMS turn (seq) order violations",
        );
        check(self.overlapping_turns, "overlapping turns of one person");
        check(
            self.replies_doubled_unexplained,
            "replies delivered twice outside the documented window",
        );
        f
    }

    pub fn print(&self) {
        let yes = |b: bool| if b { "yes" } else { "NO" };
        println!(
            "chaos: {} sessions, {} messages, {:.1} s",
            self.sessions, self.messages, self.elapsed_s
        );
        println!(
            "  faults: {} SIGKILLs, {} NATS restarts, {} Postgres restarts, self-exits {:?}",
            self.kills, self.nats_restarts, self.postgres_restarts, self.self_exits
        );
        println!(
            "  gateway: {} accepted, {} non-200 answers {:?}, {} connection errors, {} given up",
            self.accepted,
            self.load.rejected,
            self.load.statuses,
            self.load.errors,
            self.load.gave_up
        );
        println!(
            "  inbound lost (no turn):          {}",
            self.inbound_lost_no_turn
        );
        println!(
            "  inbound lost (no log row):       {}",
            self.inbound_lost_no_log
        );
        println!(
            "  replies lost (turn, no SMS):     {} {:?}",
            self.replies_lost, self.replies_lost_by_turn_status
        );
        println!(
            "  outbound log rows missing:       {}",
            self.outbound_log_rows_missing
        );
        println!(
            "  replies delivered twice:         {} ({} in the documented window, {} unexplained)",
            self.replies_doubled, self.replies_doubled_in_window, self.replies_doubled_unexplained
        );
        println!(
            "  runner order violations:         {} by arrival, {} by turn seq",
            self.runner_arrival_order_violations, self.runner_seq_order_violations
        );
        println!(
            "  SMS order violations:            {} by arrival, {} by turn seq",
            self.sms_arrival_order_violations, self.sms_seq_order_violations
        );
        println!(
            "  overlapping turns of one person: {} (max {} calls at once)",
            self.overlapping_turns, self.runner.max_overlap
        );
        println!(
            "  a turn called again while its first call ran (same Idempotency-Key): {}",
            self.runner.reruns
        );
        println!(
            "  runner calls: {} for {} turns; Twilio sends: {} for {} replies",
            self.runner.calls, self.runner.turns, self.twilio.total, self.twilio.distinct
        );
        println!("  dead letters: {:?}", self.dead_letters);
        println!("  pipeline settled afterwards: {}", yes(self.settled));
        let evidence: Vec<&String> = self
            .lost_examples
            .iter()
            .chain(&self.runner.evidence)
            .chain(&self.twilio.evidence)
            .take(30)
            .collect();
        if !evidence.is_empty() {
            println!("  evidence (first lines):");
            for e in evidence {
                println!("    {e}");
            }
        }
    }
}

/// Run the chaos scenario on its own stack (brought up here and stopped at the end).
pub async fn run(o: ChaosOptions) -> anyhow::Result<ChaosReport> {
    std::fs::create_dir_all(&o.dir)?;
    let stack = {
        let (name, n, p) = (o.stack_name.clone(), o.nats_port, o.pg_port);
        tokio::task::spawn_blocking(move || Stack::up(&name, n, p, true)).await??
    };
    let result = run_on(&stack, &o).await;
    stack.down();
    result
}

async fn run_on(stack: &Stack, o: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    let started = Instant::now();
    let runner = LoadRunner::start(o.runner_delay).await;
    let twilio = LoadTwilio::start(pipeline::ACCOUNT_SID, pipeline::AUTH_TOKEN).await;
    let config = pipeline::config_for_run(stack, "chaos", &runner.url, &twilio, &o.knobs).await?;
    let order = pipeline::layout(&o.replicas);
    let mut pipeline = Pipeline::start(&o.dir, config, &order, |_, _| {}).await?;
    let events: Arc<Mutex<Vec<Event>>> = Default::default();
    let event = {
        let events = events.clone();
        move |what: String| {
            events.lock().unwrap().push(Event {
                at_s: now_us() as f64 / 1e6,
                what,
            })
        }
    };
    let total = o.sessions as u64 * o.per_session as u64;

    // The load: every message is retried (same MessageSid) until the gateway accepts it.
    let load = LoadGen::new(pipeline.gateway.clone(), twilio.clone(), 256)
        .with_retry_for(Duration::from_secs(90));
    let load_task = {
        let load = load.clone();
        let (sessions, per, rate, group) = (o.sessions, o.per_session, o.rate, o.group);
        tokio::spawn(async move {
            let far = Instant::now() + Duration::from_secs(24 * 3600);
            load.open_loop(sessions, rate, far, in_groups(sessions, per, group))
                .await;
        })
    };
    let bar = progress_bar(o.progress, total);

    // The faults.
    let t0 = Instant::now();
    let mut next_kill = t0 + o.kill_every;
    let mut nats_at = o.restart_nats_at.map(|d| t0 + d);
    let mut pg_at = o.restart_pg_at.map(|d| t0 + d);
    let mut restarts: Vec<(&str, Restart)> = Vec::new();
    let (mut nats_restarts, mut pg_restarts) = (0, 0);
    let mut kill_times: Vec<(u64, String)> = Vec::new();
    let mut pg_restart_times: Vec<(u64, u64)> = Vec::new();
    let mut kills = 0u64;
    let mut loading = true;
    while loading || restarts.iter().any(|(_, r)| !r.is_finished()) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        loading = !load_task.is_finished();
        let now = Instant::now();
        let killing = match o.kill_for {
            Some(d) => now < t0 + d,
            None => loading,
        };
        if killing && now >= next_kill {
            next_kill += o.kill_every;
            let i = rand::rng().random_range(0..pipeline.workers.list.len());
            let label = pipeline.workers.list[i].label();
            pipeline.workers.kill_and_restart(i).await?;
            kills += 1;
            kill_times.push((now_us(), label.clone()));
            event(format!("SIGKILL {label} (restarted)"));
        }
        if nats_at.is_some_and(|t| now >= t) {
            nats_at = None;
            nats_restarts += 1;
            event("restarting NATS".into());
            restarts.push(("nats", restart_server(stack, "nats", event.clone())));
        }
        if pg_at.is_some_and(|t| now >= t) {
            pg_at = None;
            pg_restarts += 1;
            event("restarting Postgres".into());
            restarts.push(("pg", restart_server(stack, "pg", event.clone())));
        }
        for label in pipeline.workers.restart_exited()? {
            event(format!("{label} exited by itself; restarted"));
        }
        bar.set_position(twilio.distinct());
        bar.set_message(format!(
            "accepted {} | kills {kills} | nats {nats_restarts} pg {pg_restarts}",
            load.accepted_count()
        ));
    }
    for (server, r) in restarts {
        let (from, to) = r.await??;
        if server == "pg" {
            pg_restart_times.push((from, to));
        }
    }
    event("load done, faults stopped; draining".into());

    // Drain: wait for the replies of every accepted message (workers keep being restarted if
    // they exit).
    let accepted = load.accepted();
    let drain_deadline = Instant::now() + o.drain_timeout;
    let want: HashSet<String> = accepted
        .iter()
        .map(|a| message_text(a.sender, a.index))
        .collect();
    while Instant::now() < drain_deadline {
        for label in pipeline.workers.restart_exited()? {
            event(format!("{label} exited by itself; restarted"));
        }
        let have = want
            .iter()
            .filter(|t| !twilio.arrivals_of(t).is_empty())
            .count();
        bar.set_position(have as u64);
        if have == want.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settled = pipeline.settle(Duration::from_secs(30)).await;
    bar.finish_and_clear();
    event(format!("drained (settled: {settled})"));

    // Accounting.
    let mut r = ChaosReport {
        sessions: o.sessions,
        messages: total,
        load: load.stats(),
        accepted: accepted
            .iter()
            .map(|a| &a.sid)
            .collect::<HashSet<_>>()
            .len() as u64,
        kills,
        nats_restarts,
        postgres_restarts: pg_restarts,
        settled,
        runner: runner.stats(),
        twilio: twilio.stats(),
        ..Default::default()
    };
    let turns: HashMap<String, String> =
        sqlx::query("SELECT provider_message_id, status FROM switchboard.turns")
            .fetch_all(&pipeline.db)
            .await?
            .into_iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
    let logged: HashSet<String> = sqlx::query_scalar::<_, Option<String>>(
        "SELECT external_id FROM switchboard.messages WHERE direction = 'inbound'",
    )
    .fetch_all(&pipeline.db)
    .await?
    .into_iter()
    .flatten()
    .collect();
    let mut note = |line: String| {
        if r.lost_examples.len() < 20 {
            r.lost_examples.push(line);
        }
    };
    let mut lost_no_turn = 0;
    let mut lost_no_log = 0;
    let mut lost_replies = 0;
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    for a in &accepted {
        let text = message_text(a.sender, a.index);
        let status = turns.get(&a.sid);
        if status.is_none() {
            lost_no_turn += 1;
            note(format!(
                "inbound lost: {text} ({}) accepted at {:.3}s, no turn",
                a.sid,
                a.accepted_us as f64 / 1e6
            ));
        }
        if !logged.contains(&a.sid) {
            lost_no_log += 1;
            note(format!("inbound not logged: {text} ({})", a.sid));
        }
        if twilio.arrivals_of(&text).is_empty() {
            lost_replies += 1;
            let s = status.cloned().unwrap_or_else(|| "missing".into());
            note(format!("reply lost: {text} ({}), turn status {s}", a.sid));
            *by_status.entry(s).or_default() += 1;
        }
    }
    r.inbound_lost_no_turn = lost_no_turn;
    r.inbound_lost_no_log = lost_no_log;
    r.replies_lost = lost_replies;
    r.replies_lost_by_turn_status = by_status;
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM switchboard.turns WHERE status = 'done'")
            .fetch_one(&pipeline.db)
            .await?;
    let outbound: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.messages WHERE direction = 'outbound'",
    )
    .fetch_one(&pipeline.db)
    .await?;
    r.outbound_log_rows_missing = (done - outbound).max(0) as u64;

    // Doubles: explained when a deliverer was killed, or Postgres restarted, between sends.
    let deliver_kills: Vec<u64> = kill_times
        .iter()
        .filter(|(_, l)| l.starts_with("deliver"))
        .map(|(t, _)| *t)
        .collect();
    for (text, times) in twilio.doubled() {
        r.replies_doubled += (times.len() - 1) as u64;
        let (first, last) = (times[0], *times.last().unwrap());
        let killed = deliver_kills.iter().any(|t| *t >= first && *t <= last);
        // The first send went out while Postgres was going down or coming back, so the ledger
        // could not record it.
        let pg = pg_restart_times
            .iter()
            .any(|(from, to)| first + 1_000_000 >= *from && first <= *to + 1_000_000);
        if killed || pg {
            r.replies_doubled_in_window += (times.len() - 1) as u64;
        } else {
            r.replies_doubled_unexplained += (times.len() - 1) as u64;
            r.lost_examples.push(format!(
                "unexplained double: {text} sent at {:?} s",
                times.iter().map(|t| *t as f64 / 1e6).collect::<Vec<_>>()
            ));
        }
    }
    r.runner_arrival_order_violations = r.runner.order_violations;
    r.runner_seq_order_violations = r.runner.seq_violations;
    r.sms_arrival_order_violations = r.twilio.order_violations;
    for (to, texts) in twilio.sequences() {
        let mut max: Option<(i64, &String)> = None;
        for t in &texts {
            let Some(q) = runner.seq_of(t) else { continue };
            if let Some((m, mt)) = max
                && m > q
            {
                r.sms_seq_order_violations += 1;
                if r.lost_examples.len() < 40 {
                    r.lost_examples.push(format!(
                        "sms seq order: {to} got turn {q} ({t}) after turn {m} ({mt})"
                    ));
                }
            }
            if max.is_none_or(|(m, _)| q > m) {
                max = Some((q, t));
            }
        }
    }
    r.overlapping_turns = r.runner.overlaps;
    if let Ok(letters) =
        switchboard_kit::dlq::list(&pipeline.js, &pipeline.topology, None, 100_000).await
    {
        for d in letters {
            *r.dead_letters.entry(d.letter.stage.clone()).or_default() += 1;
            if r.lost_examples.len() < 40 {
                r.lost_examples.push(format!(
                    "dead letter #{} stage {}: {}",
                    d.seq, d.letter.stage, d.letter.error
                ));
            }
        }
    }
    for w in &pipeline.workers.list {
        if w.self_exits > 0 {
            r.self_exits.insert(w.label(), w.self_exits);
        }
    }
    r.events = events.lock().unwrap().clone();
    r.elapsed_s = started.elapsed().as_secs_f64();
    pipeline.stop().await;
    std::fs::write(
        o.dir.join("chaos-report.json"),
        serde_json::to_string_pretty(&r)?,
    )?;
    Ok(r)
}

/// A server restart in the background; yields when it began and ended, µs.
type Restart = tokio::task::JoinHandle<anyhow::Result<(u64, u64)>>;

/// Restart one server of the stack in the background; returns when it began and ended, µs.
fn restart_server(
    stack: &Stack,
    server: &'static str,
    event: impl Fn(String) + Send + 'static,
) -> Restart {
    let stack = stack.clone();
    tokio::task::spawn_blocking(move || {
        let from = now_us();
        let r = stack.restart(server);
        event(format!(
            "{server} back up: {}",
            if r.is_ok() { "ok" } else { "FAILED" }
        ));
        r.map(|_| (from, now_us()))
    })
}

fn progress_bar(show: bool, total: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} replies  {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar
}
