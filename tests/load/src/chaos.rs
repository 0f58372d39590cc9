//! The chaos run: messages from many senders, mixed over Twilio, TextMagic, chat, the API,
//! Telegram, Slack and WhatsApp ([`Mix::CHAOS`]), while worker processes are SIGKILLed on a seeded schedule (and started again right away, as an orchestrator would), and NATS and Postgres are
//! each SIGKILLed once and come back by crash recovery (Postgres with `fsync`,
//! `synchronous_commit` and `full_page_writes` on, as in production).
//!
//! Afterwards the run collects its [`Evidence`] (every accepted message, every runner call,
//! every message the providers' fakes took, every mailbox entry and every reply the chat and
//! API clients got, the database's
//! turns, log rows and ledger, every kill and crash, the dead letters),
//! writes it to `chaos-evidence.json`, and [`judge`] gives the verdict: see
//! [`super::chaos_check`] for what fails a run.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;

use super::canary::Canaries;
use super::channels::{self, Channel, LoadClients, Mix, Providers};
use super::chaos_check::WaitingRow;
use super::chaos_check::{
    AcceptedMessage, DeadLetterNote, Evidence, Kill, LedgerRow, MailboxRow, ServerCrash, TurnRow,
    Verdict, judge,
};
use super::chaos_nodes::{self, NodeKill};
use super::chaos_takeover;
use super::chaos_wakeups;
use super::loadgen::{LoadGen, LoadStats, in_groups};
use super::memory_run::{self, MemoryModel};
use super::observers::{LoadRunner, LoadTwilio, RunnerOutage, RunnerStats, SendStats};
use super::pipeline::{self, Knobs, Pipeline};
use super::returning;
use super::rolling::{self, Latency, Replacement};
use super::stack::Stack;
use super::{message_text, now_us};

/// The worker kinds a chaos run kills, each at least [`MIN_KILLS_PER_KIND`] times.
pub const WORKER_KINDS: [&str; 9] = [
    "gateway",
    "identify",
    "session",
    "dispatch",
    "log",
    "deliver",
    "embed",
    "categorise",
    "summary",
];
pub const MIN_KILLS_PER_KIND: usize = 2;

#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub stack_name: String,
    pub nats_port: u16,
    pub pg_port: u16,
    pub sessions: usize,
    pub per_session: u32,
    /// Which channel each session writes on.
    pub mix: Mix,
    /// Messages per second offered to the gateway.
    pub rate: f64,
    /// Senders whose messages interleave; one sender's messages come `group / rate` s apart.
    pub group: usize,
    /// Seed of the kill schedule (which worker, when); printed so a run can be repeated.
    pub seed: u64,
    pub kill_every: Duration,
    /// Kills happen during this window from the start (default: the time the load takes).
    pub kill_for: Option<Duration>,
    /// When NATS is SIGKILLed (and started again; every node of a cluster at once).
    pub crash_nats_at: Option<Duration>,
    /// NATS servers: 1, or a JetStream cluster of 3 (streams at R3) whose nodes are killed
    /// one at a time at `node_kills`.
    pub cluster: usize,
    pub node_kills: Vec<NodeKill>,
    /// NATS fsyncs every JetStream write (`sync_interval: always`).
    pub nats_sync_always: bool,
    /// A rolling upgrade instead of faults: no kills, crashes or outage; every worker
    /// replaced one at a time by SIGTERM from [`rolling::FIRST_AT`] on ([`rolling`]).
    pub rolling: bool,
    /// When Postgres is SIGKILLed (postmaster and backends, then started again).
    pub crash_pg_at: Option<Duration>,
    pub runner_delay: Duration,
    /// When the fake runner goes down (and for how long): it answers 503 for
    /// `runner_503_for`, then stops listening (connections refused) for the rest of
    /// `runner_down_for`, then listens again.
    pub runner_down_at: Option<Duration>,
    pub runner_down_for: Duration,
    pub runner_503_for: Duration,
    /// Wake-ups ([`chaos_wakeups`]): scheduled at `wakeups_at` for people among the first
    /// `wakeups_among` senders, the k-th due `wakeups_due[k]` after that (one each).
    pub wakeups_at: Duration,
    pub wakeups_among: usize,
    pub wakeups_due: Vec<Duration>,
    /// When an operator takes one person of the first group over ([`chaos_takeover`]); `None`:
    /// no takeover.
    pub takeover_at: Option<Duration>,
    /// Worker binaries and replicas.
    pub replicas: Vec<(&'static str, usize)>,
    /// How long to wait for the last replies after the load and the kills stopped.
    pub drain_timeout: Duration,
    /// How long to wait after the drain for the memory workers to catch up (every message
    /// embedded, every exchange labelled, every memory key summarised).
    pub memory_timeout: Duration,
    pub dir: PathBuf,
    pub knobs: Knobs,
    pub progress: bool,
}

impl ChaosOptions {
    /// `make chaos`: 20,000 turns across 2,000 sessions.
    pub fn full(dir: PathBuf) -> Self {
        Self {
            stack_name: "chaos".into(),
            nats_port: 18222,
            pg_port: 19432,
            sessions: 2_000,
            per_session: 10,
            mix: Mix::CHAOS,
            rate: 400.0,
            group: 50,
            seed: rand::rng().random(),
            kill_every: Duration::from_secs(2),
            kill_for: None,
            crash_nats_at: Some(Duration::from_secs(15)),
            cluster: 1,
            node_kills: Vec::new(),
            nats_sync_always: false,
            rolling: false,
            crash_pg_at: Some(Duration::from_secs(32)),
            runner_delay: Duration::from_millis(20),
            runner_down_at: Some(Duration::from_secs(18)),
            runner_down_for: Duration::from_secs(20),
            runner_503_for: Duration::from_secs(3),
            // Due from 20 s to 36 s: while the runner is down (18-38 s) and across Postgres's
            // crash (32 s); the first three groups (150 people, 26 of them private Twilio
            // people) are done by 3.75 s.
            wakeups_at: Duration::from_secs(10),
            wakeups_among: 150,
            wakeups_due: (0..20)
                .map(|k| Duration::from_millis(10_000 + k * 800))
                .collect(),
            // As NATS crashes (15 s), workers are killed, and its held messages wait out the
            // runner's outage and Postgres's crash before the operator answers them.
            takeover_at: Some(Duration::from_secs(14)),
            replicas: vec![
                ("gateway", 1),
                ("identify", 1),
                ("session", 1),
                ("log", 1),
                ("deliver", 2),
                ("dispatch", 2),
                ("embed", 1),
                ("categorise", 1),
                // Two, so that their compare-and-set on the summary's version is raced.
                ("summary", 2),
            ],
            drain_timeout: Duration::from_secs(180),
            memory_timeout: Duration::from_secs(180),
            dir,
            knobs: chaos_knobs(),
            progress: true,
        }
    }

    /// The bounded version that runs inside `make test`: 600 turns, 60 sessions, a kill every
    /// 1 s for 19.5 s (19 kills: every one of the 9 worker kinds twice), NATS and Postgres each
    /// SIGKILLed once, the runner down for 10 s (from 4 s: 2 s of 503, then connections
    /// refused).
    pub fn small(dir: PathBuf) -> Self {
        Self {
            stack_name: "chaos-small".into(),
            nats_port: 28222,
            pg_port: 29432,
            sessions: 60,
            per_session: 10,
            mix: Mix::CHAOS,
            rate: 30.0,
            group: 10,
            seed: rand::rng().random(),
            kill_every: Duration::from_millis(1_000),
            kill_for: Some(Duration::from_millis(19_500)),
            crash_nats_at: Some(Duration::from_secs(6)),
            cluster: 1,
            node_kills: Vec::new(),
            nats_sync_always: false,
            rolling: false,
            crash_pg_at: Some(Duration::from_secs(13)),
            runner_delay: Duration::from_millis(20),
            runner_down_at: Some(Duration::from_secs(4)),
            runner_down_for: Duration::from_secs(10),
            runner_503_for: Duration::from_secs(2),
            // Due at 9 and 13 s: while the runner is down (4-14 s) and as Postgres is crashed
            // (13 s). The first two groups (20 people, two of them private Twilio people) are
            // sent by 6.7 s, but their last messages are often still on their way when the
            // wake-ups fire (NATS crashed at 6 s, workers killed): each wake-up must come after
            // them.
            wakeups_at: Duration::from_secs(7),
            wakeups_among: 20,
            wakeups_due: [2_000, 6_000].map(Duration::from_millis).to_vec(),
            // While the runner is down and workers are killed, before Postgres crashes (13 s),
            // once the first three groups sent all their messages (10 s): the first two's
            // private Twilio people are the wake-ups', the third's the one taken over.
            takeover_at: Some(Duration::from_secs(10)),
            replicas: vec![
                ("gateway", 1),
                ("identify", 1),
                ("session", 1),
                ("log", 1),
                ("deliver", 1),
                ("dispatch", 2),
                ("embed", 1),
                ("categorise", 1),
                ("summary", 1),
            ],
            drain_timeout: Duration::from_secs(90),
            memory_timeout: Duration::from_secs(60),
            dir,
            knobs: chaos_knobs(),
            progress: false,
        }
    }

    /// The senders whose messages are all sent `at` into the load (the groups done by then).
    pub fn sent_by(&self, at: Duration) -> usize {
        let per_group = (self.group as f64) * f64::from(self.per_session);
        let groups = (at.as_secs_f64() * self.rate / per_group).floor() as usize;
        (groups * self.group).min(self.sessions)
    }

    /// The same run on a JetStream cluster of `nodes` (`make chaos CLUSTER=3`): streams at
    /// R`nodes`, and instead of one crash of the single server, node kills one at a time (the
    /// work stream's leader twice, a follower once: [`chaos_nodes::plan`]).
    pub fn on_cluster(mut self, nodes: usize) -> Self {
        if nodes > 1 {
            self.cluster = nodes;
            self.crash_nats_at = None;
            self.node_kills = chaos_nodes::plan(nodes, self.kill_window());
            // Three servers replicating every write share the same 2 cores: the backlog the
            // load leaves drains at a third of the single server's pace (the first cluster
            // run still had 8,000 replies to send after the single server's 180 s).
            self.drain_timeout = self.drain_timeout.max(Duration::from_secs(900));
        }
        self
    }

    /// `make upgrade-drill`: a steady 60 msg/s (below half of what this machine answers) over
    /// 600 people on every channel for 100 s while each worker process is replaced in turn by
    /// SIGTERM (drained), then the chaos verdict with no kill to excuse anything.
    pub fn rolling_upgrade(dir: PathBuf) -> Self {
        Self {
            stack_name: "upgrade".into(),
            sessions: 600,
            per_session: 10,
            rate: 60.0,
            group: 60,
            // At a steady rate below capacity nothing queues for a collect call to join, so
            // nobody talks to the collect agent (the full run proves collect under faults).
            mix: Mix {
                collect_every: 0,
                front_desk_group: None,
                ..Mix::CHAOS
            },
            crash_nats_at: None,
            crash_pg_at: None,
            runner_down_at: None,
            rolling: true,
            wakeups_due: Vec::new(),
            ..Self::full(dir)
        }
    }

    /// How long the kills go on.
    pub fn kill_window(&self) -> Duration {
        self.kill_for.unwrap_or_else(|| {
            Duration::from_secs_f64(self.sessions as f64 * self.per_session as f64 / self.rate)
        })
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

/// One kill of the schedule: at `at` from the start, replica `instance` of worker `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedKill {
    pub at: Duration,
    pub kind: &'static str,
    pub instance: usize,
}

/// The kill schedule for `seed`: one kill every `every` within `window`, every kind of worker
/// at least [`MIN_KILLS_PER_KIND`] times, the rest at random; the same seed gives the same plan.
pub fn kill_plan(
    seed: u64,
    replicas: &[(&'static str, usize)],
    every: Duration,
    window: Duration,
) -> anyhow::Result<Vec<PlannedKill>> {
    let kinds: Vec<(&'static str, usize)> =
        replicas.iter().copied().filter(|(_, n)| *n > 0).collect();
    for k in WORKER_KINDS {
        if !kinds.iter().any(|(n, _)| *n == k) {
            bail!("the chaos run must run at least one {k} worker to kill it");
        }
    }
    let slots = (window.as_secs_f64() / every.as_secs_f64()).floor() as usize;
    let needed = kinds.len() * MIN_KILLS_PER_KIND;
    if slots < needed {
        bail!(
            "{slots} kills fit in {window:?} at one every {every:?}; {needed} are needed to kill \
             every kind of worker {MIN_KILLS_PER_KIND} times"
        );
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..kinds.len())
        .flat_map(|k| std::iter::repeat_n(k, MIN_KILLS_PER_KIND))
        .collect();
    while order.len() < slots {
        order.push(rng.random_range(0..kinds.len()));
    }
    order.shuffle(&mut rng);
    Ok(order
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            let (kind, replicas) = kinds[k];
            PlannedKill {
                at: every * (i as u32 + 1),
                kind,
                instance: rng.random_range(0..replicas),
            }
        })
        .collect())
}

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub at_s: f64,
    pub what: String,
}

/// What a chaos run shows: the settings, the faults, what the fakes counted, and the verdict.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosReport {
    pub seed: u64,
    pub sessions: usize,
    pub messages: u64,
    pub elapsed_s: f64,
    pub load: LoadStats,
    /// Distinct messages the gateway accepted.
    pub accepted: u64,
    /// Every kill, in order: when (s since the harness started), which worker, which pid.
    pub kills: Vec<Kill>,
    pub crashes: Vec<ServerCrash>,
    /// Worker processes that exited by themselves (and were restarted), by worker.
    pub self_exits: BTreeMap<String, u32>,
    pub runner: RunnerStats,
    pub twilio: SendStats,
    pub textmagic: SendStats,
    #[serde(default)]
    pub telegram: SendStats,
    #[serde(default)]
    pub slack: SendStats,
    #[serde(default)]
    pub whatsapp: SendStats,
    pub verdict: Verdict,
    pub events: Vec<Event>,
    /// Workers replaced by SIGTERM (a rolling upgrade), in order.
    pub replacements: Vec<Replacement>,
    /// Acceptance to the reply's send (the providers' channels), p50 / p99.
    pub latency: Option<Latency>,
}

impl ChaosReport {
    /// What makes the run fail, one line per kind of finding (empty: passed).
    pub fn failures(&self) -> Vec<String> {
        self.verdict.failures()
    }

    pub fn crashes_of(&self, server: &str) -> usize {
        self.crashes.iter().filter(|c| c.server == server).count()
    }

    pub fn print(&self) {
        let s = |us: u64| us as f64 / 1e6;
        println!(
            "chaos: {} sessions, {} messages, {:.1} s, seed {}",
            self.sessions, self.messages, self.elapsed_s, self.seed
        );
        println!(
            "  gateway: {} accepted, {} non-200 answers {:?}, {} connection errors, {} given up",
            self.accepted,
            self.load.rejected,
            self.load.statuses,
            self.load.errors,
            self.load.gave_up
        );
        println!("  kills ({}):", self.kills.len());
        for k in &self.kills {
            println!(
                "    {:>8.3}s  SIGKILL {:<12} pid {}",
                s(k.at_us),
                k.target,
                k.pid
            );
        }
        for c in &self.crashes {
            println!(
                "    {:>8.3}s  SIGKILL {} (all its processes); back at {:.3}s{}",
                s(c.at_us),
                c.server,
                s(c.back_us),
                if c.recovered {
                    ""
                } else {
                    ": DID NOT COME BACK"
                }
            );
        }
        for r in &self.replacements {
            println!(
                "    {:>8.3}s  SIGTERM {:<12} pid {}: {} in {} ms, replaced",
                s(r.at_us),
                r.target,
                r.pid,
                if r.clean {
                    "drained and exited"
                } else {
                    "SIGKILLed after the grace"
                },
                r.drained_ms
            );
        }
        if let Some(l) = &self.latency {
            println!(
                "  overhead, accepted to the reply's send (at a provider, {} answered): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                l.answered, l.p50_ms, l.p99_ms, l.max_ms
            );
        }
        if !self.self_exits.is_empty() {
            println!("  exited by themselves (restarted): {:?}", self.self_exits);
        }
        let v = &self.verdict;
        println!(
            "  runner: {} calls for {} turns ({} re-runs, each under its first call's key, never beside it, after a dispatcher's kill or a server crash)",
            v.runner_calls, v.distinct_turns_called, v.reruns
        );
        for cause in &v.rerun_causes {
            println!("    re-run after {cause}");
        }
        println!(
            "  collect: {} people; {} calls joined {} messages",
            v.collect_people, v.joined_calls, v.joined_messages
        );
        if let Some(o) = &v.outage {
            println!(
                "  runner outage: {:.1} s ({} calls answered 503, then connections refused); {} waits recorded, {} people told, {} with a message open across it, {} messages answered only after it, {} people with one whose turn a dispatcher picked up 1 s or more before it ended",
                o.down_s,
                o.refused_calls,
                o.waits_recorded,
                o.people_told,
                o.people_open,
                o.waited_messages,
                o.people_waited
            );
        }
        for (channel, t) in &v.channels {
            println!(
                "  {:<10} {:>6} accepted, {:>6} answered, {} failed (recorded), {} lost, {} doubled, {} told once the agent was unavailable",
                format!("{}:", channel.name()),
                t.accepted,
                t.answered,
                t.failed_recorded,
                t.lost,
                t.doubled,
                t.told
            );
        }
        if !v.failed_recorded.is_empty() {
            println!(
                "  failed, recorded (no log to ask whether a part reached the provider before its deliverer died; not sent again):"
            );
            for f in &v.failed_recorded {
                println!("    {}", f.described());
            }
        }
        println!(
            "  providers (Twilio, TextMagic, Telegram, Slack, WhatsApp): {} sends for {} replies; {} sent again ({} explained by a deliverer's kill)",
            v.sends,
            v.distinct_replies_sent,
            v.doubles.len(),
            v.doubles_in_window()
        );
        for d in &v.doubles {
            let why = match &d.explained_by {
                Some(k) => format!(
                    "explained: {} (pid {}) SIGKILLed at {:.3}s before the ledger recorded it",
                    k.target,
                    k.pid,
                    s(k.at_us)
                ),
                None => "UNEXPLAINED".into(),
            };
            println!(
                "    {:<10} to {}: sent {:.3}s by pid {:?}, again {:.3}s by pid {:?}; {why}",
                d.text,
                d.to,
                s(d.previous_at_us),
                d.previous_pid,
                s(d.resent_at_us),
                d.resent_pid
            );
        }
        if let Some(m) = &v.memory {
            super::memory_report::print(m);
        }
        if v.passed() {
            println!("  findings: none");
        } else {
            println!("  findings:");
            for (kind, list) in &v.findings {
                println!("    {} {}:", list.len(), kind.describe());
                for f in list.iter().take(20) {
                    println!("      {}", f.evidence);
                }
                if list.len() > 20 {
                    println!("      … {} more in chaos-report.json", list.len() - 20);
                }
            }
        }
    }
}

/// Run the chaos scenario on its own stack (brought up here and stopped at the end).
pub async fn run(o: ChaosOptions) -> anyhow::Result<ChaosReport> {
    std::fs::create_dir_all(&o.dir)?;
    let stack = {
        let (name, n, p, nodes) = (o.stack_name.clone(), o.nats_port, o.pg_port, o.cluster);
        let sync = o.nats_sync_always;
        // Durable Postgres: a SIGKILL must not lose a committed transaction.
        tokio::task::spawn_blocking(move || Stack::up_with(&name, n, p, false, "", nodes, sync))
            .await??
    };
    let result = run_on(&stack, &o).await;
    stack.down();
    result
}

async fn run_on(stack: &Stack, o: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    let plan = if o.rolling {
        Vec::new()
    } else {
        kill_plan(o.seed, &o.replicas, o.kill_every, o.kill_window())?
    };
    let started = Instant::now();
    let runner = LoadRunner::start(o.runner_delay).await;
    let twilio = LoadTwilio::start(pipeline::ACCOUNT_SID, pipeline::AUTH_TOKEN).await;
    let providers = Providers::start().await;
    let memory = MemoryModel::start(Canaries::random()).await;
    let mut config =
        pipeline::config_for_run(stack, "chaos", &runner.url, &twilio, &o.knobs).await?;
    channels::configure(&mut config, &providers);
    memory.configure(&mut config);
    config.runtime.stream_replicas = o.cluster;
    let order = pipeline::layout(&o.replicas);
    let mut pipeline = Pipeline::start(&o.dir, config, &order, |_, _| {}).await?;
    let clients = LoadClients::start(pipeline.gateway.clone(), &pipeline.db, o.mix, o.sessions)
        .await?
        .with_canaries(memory.canaries);
    let events: Arc<Mutex<Vec<Event>>> = Default::default();
    let event = {
        let events = events.clone();
        move |what: String| {
            // As it happens too, so a run that stalls shows why.
            eprintln!("chaos: {what}");
            events.lock().unwrap().push(Event {
                at_s: now_us() as f64 / 1e6,
                what,
            })
        }
    };
    let total = o.sessions as u64 * o.per_session as u64;

    // The load: every message is retried (same ids) until the gateway accepts it.
    let load = LoadGen::mixed(Arc::new(clients), twilio.clone(), 256)
        .with_retry_for(Duration::from_secs(90));
    let replies = Replies {
        twilio: &twilio,
        providers: &providers,
        clients: load.clients(),
    };
    let load_task = {
        let load = load.clone();
        let (sessions, per, rate, group) = (o.sessions, o.per_session, o.rate, o.group);
        tokio::spawn(async move {
            let far = Instant::now() + Duration::from_secs(24 * 3600);
            load.open_loop(sessions, rate, far, in_groups(sessions, per, group))
                .await;
        })
    };
    // Wake-ups, scheduled while the faults go on.
    let wakeups_task = {
        let senders =
            chaos_wakeups::chosen(&o.mix, o.sessions, o.wakeups_among, o.wakeups_due.len());
        let (db, gateway) = (pipeline.db.clone(), pipeline.gateway.base.clone());
        let (at, due, index) = (o.wakeups_at, o.wakeups_due.clone(), o.per_session + 1);
        tokio::spawn(async move {
            if senders.is_empty() {
                return Ok(Vec::new());
            }
            tokio::time::sleep(at).await;
            let deadline = Instant::now() + Duration::from_secs(60);
            chaos_wakeups::schedule(
                &db,
                &gateway,
                pipeline::AGENT,
                &senders,
                index,
                &due,
                deadline,
            )
            .await
        })
    };
    // The takeover, while the faults go on.
    let takeover_task = {
        let wakeup_senders =
            chaos_wakeups::chosen(&o.mix, o.sessions, o.wakeups_among, o.wakeups_due.len());
        let sender = o.takeover_at.and_then(|at| {
            chaos_takeover::chosen(&o.mix, o.sessions, o.sent_by(at), &wakeup_senders)
        });
        let (db, gateway, load) = (
            pipeline.db.clone(),
            pipeline.gateway.base.clone(),
            load.clone(),
        );
        let (at, first_extra, patience) = (
            o.takeover_at,
            o.per_session + 1,
            o.drain_timeout + Duration::from_secs(120),
        );
        tokio::spawn(async move {
            let (Some(at), Some(sender)) = (at, sender) else {
                return Ok(None);
            };
            tokio::time::sleep(at).await;
            let deadline = Instant::now() + patience;
            let agent = pipeline::AGENT;
            chaos_takeover::run(&db, &gateway, &load, agent, sender, first_extra, deadline)
                .await
                .map(Some)
        })
    };
    let bar = progress_bar(o.progress, total);

    // The faults.
    let t0 = Instant::now();
    let mut plan = plan.into_iter().peekable();
    let mut nats_at = o.crash_nats_at.map(|d| t0 + d);
    let mut pg_at = o.crash_pg_at.map(|d| t0 + d);
    let mut node_kills = o.node_kills.iter().copied().peekable();
    let mut node_rng = rand::rngs::StdRng::seed_from_u64(o.seed);
    let work_stream = pipeline.topology.work_stream();
    let mut replacements: Vec<Replacement> = Vec::new();
    let mut next_replacement = o.rolling.then(|| (0usize, t0 + rolling::FIRST_AT));
    let grace = Duration::from_millis(o.knobs.shutdown_grace_ms) + Duration::from_secs(5);
    let mut crashing: Vec<Crash> = Vec::new();
    let mut kills: Vec<Kill> = Vec::new();
    let mut loading = true;
    let server_lost = Arc::new(AtomicBool::new(false));
    // The runner's outage: 503, then not listening, then back.
    let mut outage = o.runner_down_at.map(|at| OutagePlan {
        unavailable: t0 + at,
        refusing: t0 + at + o.runner_503_for.min(o.runner_down_for),
        back: t0 + at + o.runner_down_for,
        record: RunnerOutage::default(),
        phase: 0,
    });
    while loading
        || plan.peek().is_some()
        || node_kills.peek().is_some()
        || next_replacement.is_some()
        || crashing.iter().any(|c| !c.is_finished())
        || outage.as_ref().is_some_and(|p| p.phase < 3)
    {
        if server_lost.load(Ordering::SeqCst) {
            // Nothing can be answered without it: stop, and let the verdict say so.
            load_task.abort();
            event("a server did not come back: load and faults stopped".into());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        loading = !load_task.is_finished();
        let now = Instant::now();
        while let Some(k) = plan.next_if(|k| now >= t0 + k.at) {
            let Some(i) = pipeline
                .workers
                .list
                .iter()
                .position(|w| w.name == k.kind && w.instance == k.instance)
            else {
                bail!("no worker {}-{} to kill", k.kind, k.instance);
            };
            let target = pipeline.workers.list[i].label();
            let pid = pipeline.workers.list[i].pid().unwrap_or(0);
            let at_us = now_us();
            pipeline.workers.kill_and_restart(i).await?;
            kills.push(Kill {
                at_us,
                kind: k.kind.to_string(),
                target: target.clone(),
                pid,
            });
            event(format!("SIGKILL {target} (pid {pid}; restarted)"));
        }
        if let Some((i, at)) = next_replacement
            && now >= at
        {
            let target = pipeline.workers.list[i].label();
            let pid = pipeline.workers.list[i].pid().unwrap_or(0);
            let at_us = now_us();
            let (drained, clean) = pipeline.workers.terminate_and_restart(i, grace).await?;
            event(format!(
                "SIGTERM {target} (pid {pid}): {} after {} ms; new process started",
                if clean {
                    "drained and exited"
                } else {
                    "SIGKILLed, not exited"
                },
                drained.as_millis()
            ));
            replacements.push(Replacement {
                at_us,
                target,
                pid,
                drained_ms: drained.as_millis() as u64,
                clean,
            });
            next_replacement = (i + 1 < pipeline.workers.list.len())
                .then(|| (i + 1, Instant::now() + rolling::EVERY));
        }
        if nats_at.is_some_and(|t| now >= t) {
            nats_at = None;
            event("SIGKILL NATS".into());
            crashing.push(crash_server(
                stack,
                "nats".into(),
                event.clone(),
                server_lost.clone(),
            ));
        }
        if let Some(kill) = node_kills.next_if(|k| now >= t0 + k.at) {
            let leader = chaos_nodes::leader_of(&pipeline.js, &work_stream).await;
            let pick = node_rng.random::<u32>() as usize;
            let node = chaos_nodes::target(kill.role, o.cluster, leader, pick);
            let role = match (kill.role, leader) {
                (chaos_nodes::NodeRole::Leader, Some(_)) => format!("leader of {work_stream}"),
                (chaos_nodes::NodeRole::Leader, None) => {
                    format!("{work_stream} had no leader to ask for: a random node")
                }
                (chaos_nodes::NodeRole::Follower, _) => "a follower".to_string(),
            };
            event(format!("SIGKILL NATS node {node} ({role})"));
            crashing.push(crash_server(
                stack,
                format!("nats-{node}"),
                event.clone(),
                server_lost.clone(),
            ));
        }
        if let Some(p) = outage.as_mut() {
            if p.phase == 0 && now >= p.unavailable {
                p.phase = 1;
                p.record.unavailable_us = now_us();
                runner.set_unavailable(true);
                event("runner down: answering 503".into());
            }
            if p.phase == 1 && now >= p.refusing {
                p.phase = 2;
                p.record.refusing_us = now_us();
                runner.stop_listening().await;
                runner.set_unavailable(false);
                event("runner down: not listening (connections refused)".into());
            }
            if p.phase == 2 && now >= p.back {
                runner.listen().await;
                p.record.back_us = now_us();
                p.phase = 3;
                event("runner back: listening and answering".into());
            }
        }
        if pg_at.is_some_and(|t| now >= t) {
            pg_at = None;
            event("SIGKILL Postgres".into());
            crashing.push(crash_server(
                stack,
                "pg".into(),
                event.clone(),
                server_lost.clone(),
            ));
        }
        for label in pipeline.workers.restart_exited()? {
            event(format!("{label} exited by itself; restarted"));
        }
        bar.set_position(replies.pushed());
        bar.set_message(format!(
            "accepted {} | kills {} | server crashes {}",
            load.accepted_count(),
            kills.len(),
            crashing.len()
        ));
    }
    let mut crashes = Vec::new();
    for c in crashing {
        crashes.push(c.await?);
    }
    if let Some(p) = outage.as_ref()
        && p.phase < 3
    {
        // Stopped early (a server lost): the runner listens again for the drain.
        runner.set_unavailable(false);
        runner.listen().await;
    }
    let runner_outage = outage.filter(|p| p.phase == 3).map(|p| p.record);
    event("load done, faults stopped".into());
    let wakeups = match wakeups_task.await? {
        Ok(planned) => {
            event(format!("{} wake-ups scheduled", planned.len()));
            planned
        }
        Err(e) => bail!("scheduling the wake-ups: {e:#}"),
    };
    let takeover = match takeover_task.await? {
        Ok(t) => {
            if let Some(t) = &t {
                event(format!(
                    "takeover of s{}: {} message(s) held and answered by the operator, handed back",
                    t.sender,
                    t.held.len()
                ));
            }
            t
        }
        Err(e) => bail!("the takeover: {e:#}"),
    };
    // One person per channel comes back once their summary is written (see `returning`).
    let returned = if server_lost.load(Ordering::SeqCst) {
        Vec::new()
    } else {
        let senders = returning::returners(&o.mix, o.sessions);
        let index = o.per_session;
        returning::come_back(
            &pipeline.db,
            &load,
            memory.canaries,
            &senders,
            index,
            o.memory_timeout,
            &event,
        )
        .await
    };
    event("draining".into());

    // Drain: wait for the replies of every accepted message (workers keep being restarted if
    // they exit).
    let accepted = load.accepted();
    let drain_deadline = if server_lost.load(Ordering::SeqCst) {
        Instant::now()
    } else {
        Instant::now() + o.drain_timeout
    };
    // (channel, message text, provider id) of every message to answer.
    let want: Vec<(Channel, String, String)> = accepted
        .iter()
        .map(|a| (a.channel, message_text(a.sender, a.index), a.sid.clone()))
        .chain(wakeups.iter().map(|w| {
            let text = message_text(w.sender, w.index);
            (
                Channel::Twilio,
                text,
                switchboard_kit::wakeups::input_key(w.id),
            )
        }))
        .collect();
    let draining = Instant::now();
    let mut told = Duration::ZERO;
    while Instant::now() < drain_deadline {
        for label in pipeline.workers.restart_exited()? {
            event(format!("{label} exited by itself; restarted"));
        }
        let answered = replies.answered(&pipeline.db).await;
        // A reply the ledger recorded failed will not come: no need to wait for it (the
        // verdict judges whether its channel allows that).
        let given_up = Replies::given_up(&pipeline.db).await;
        let have = want
            .iter()
            .filter(|(c, t, sid)| answered.contains(&(*c, t.clone())) || given_up.contains(sid))
            .count();
        bar.set_position(have as u64);
        if have == want.len() {
            break;
        }
        // A slow drain says what it waits for, every 5 s.
        if draining.elapsed() >= told + Duration::from_secs(5) {
            told = draining.elapsed();
            let missing: Vec<String> = want
                .iter()
                .filter(|(c, t, sid)| {
                    !answered.contains(&(*c, t.clone())) && !given_up.contains(sid)
                })
                .take(5)
                .map(|(c, t, _)| format!("{t} ({})", c.name()))
                .collect();
            event(format!(
                "draining for {:.0} s: {} replies missing, among them {}",
                told.as_secs_f64(),
                want.len() - have,
                missing.join(", ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settled = pipeline.settle(Duration::from_secs(30)).await;
    bar.finish_and_clear();
    event(format!("drained (settled: {settled})"));
    let (caught_up, waited) = memory_run::wait_caught_up(
        &mut pipeline,
        if server_lost.load(Ordering::SeqCst) {
            Duration::ZERO
        } else {
            o.memory_timeout
        },
        &event,
    )
    .await?;
    event(format!(
        "memory workers caught up: {caught_up} (after {:.1} s)",
        waited.as_secs_f64()
    ));
    let client_replies = replies.at_clients(&accepted).await;
    load.clients().close();

    let mut evidence = collect_evidence(
        &pipeline,
        &load,
        &runner,
        &replies,
        client_replies,
        kills,
        crashes,
        settled,
    )
    .await?;
    evidence.runner_outage = runner_outage;
    evidence
        .accepted
        .extend(chaos_wakeups::as_accepted(&pipeline.db, &wakeups).await?);
    evidence.takeover = takeover;
    evidence.memory =
        Some(memory_run::collect(&pipeline, &memory, caught_up, waited, returned).await?);
    evidence.refused_calls = runner.refused();
    evidence.notice_text = pipeline.config.dispatch.runner_down_notice.clone();
    for a in &mut evidence.accepted {
        a.collect = o.mix.collects(a.sender);
    }
    std::fs::write(
        o.dir.join("chaos-evidence.json"),
        serde_json::to_string(&evidence)?,
    )?;
    let mut r = ChaosReport {
        seed: o.seed,
        sessions: o.sessions,
        messages: total,
        load: load.stats(),
        accepted: evidence.accepted.len() as u64,
        runner: runner.stats(),
        twilio: twilio.stats(),
        textmagic: providers.textmagic.stats(),
        telegram: providers.telegram.stats(),
        slack: providers.slack.stats(),
        whatsapp: providers.whatsapp.stats(),
        verdict: judge(&evidence),
        latency: rolling::latency(&evidence),
        kills: evidence.kills,
        crashes: evidence.crashes,
        replacements,
        ..Default::default()
    };
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

/// Where the replies of a run arrive: the providers' fakes, the chat clients' sockets, the
/// mailbox (API replies, read back by their callers at the end).
struct Replies<'a> {
    twilio: &'a LoadTwilio,
    providers: &'a Providers,
    clients: &'a LoadClients,
}

impl Replies<'_> {
    /// Replies that reached a person's phone, app or socket so far (for the progress bar).
    fn pushed(&self) -> u64 {
        self.twilio.distinct()
            + self.providers.distinct()
            + self.clients.chat_replies().len() as u64
    }

    /// The provider ids of the messages whose reply the ledger recorded failed (none while
    /// the database is down).
    async fn given_up(db: &sqlx::PgPool) -> std::collections::HashSet<String> {
        sqlx::query_scalar::<_, String>(
            "SELECT t.provider_message_id FROM switchboard.turns t
               JOIN switchboard.deliveries d ON d.reply_id = t.reply_id
              WHERE d.status = 'failed'",
        )
        .fetch_all(db)
        .await
        .map(|ids| ids.into_iter().collect())
        .unwrap_or_default()
    }

    /// The messages answered so far, by channel and text: at the providers' fakes, chat at the
    /// clients, API in the mailbox (its callers read them back once the run is drained).
    async fn answered(&self, db: &sqlx::PgPool) -> std::collections::HashSet<(Channel, String)> {
        // A joined reply answers each message it names.
        let each = |channel: Channel, text: String| {
            super::parse_answers(&text)
                .unwrap_or_default()
                .into_iter()
                .map(move |(s, i)| (channel, message_text(s, i)))
        };
        let mut answered: std::collections::HashSet<(Channel, String)> = self
            .twilio
            .sends()
            .into_iter()
            .chain(self.providers.sends())
            .flat_map(|s| each(s.channel, s.text))
            .chain(
                self.clients
                    .chat_replies()
                    .into_iter()
                    .filter(|r| !r.notice)
                    .flat_map(|r| each(Channel::Chat, r.text)),
            )
            .collect();
        // The database may be down (a crash): then API replies count as not there yet.
        if let Ok(texts) = sqlx::query_scalar::<_, String>(
            "SELECT text FROM switchboard.mailbox WHERE channel = $1 AND kind = 'reply'",
        )
        .bind(switchboard_channels::api::CHANNEL)
        .fetch_all(db)
        .await
        {
            answered.extend(texts.into_iter().flat_map(|t| each(Channel::Api, t)));
        }
        answered
    }

    /// Every reply the chat clients were pushed, and what `GET /api/v1/messages/<id>` shows
    /// each API caller for its accepted messages.
    async fn at_clients(
        &self,
        accepted: &[super::loadgen::Accepted],
    ) -> Vec<channels::ClientReply> {
        let mut seen = std::collections::HashSet::new();
        let api: Vec<(usize, String)> = accepted
            .iter()
            .filter(|a| a.channel == Channel::Api && seen.insert(a.sid.clone()))
            .map(|a| (a.sender, a.correlation_id.clone()))
            .collect();
        let mut got = self.clients.chat_replies();
        got.extend(self.clients.api_replies(&api).await);
        got
    }
}

/// Everything the verdict needs, from the fakes, the clients, the load generator, the
/// database and the dead-letter stream.
#[allow(clippy::too_many_arguments)]
async fn collect_evidence(
    pipeline: &Pipeline,
    load: &LoadGen,
    runner: &LoadRunner,
    replies: &Replies<'_>,
    client_replies: Vec<channels::ClientReply>,
    kills: Vec<Kill>,
    crashes: Vec<ServerCrash>,
    settled: bool,
) -> anyhow::Result<Evidence> {
    let mut seen = std::collections::HashSet::new();
    let accepted = load
        .accepted()
        .into_iter()
        .filter(|a| seen.insert(a.sid.clone()))
        .map(|a| AcceptedMessage {
            channel: a.channel,
            sender: a.sender,
            index: a.index,
            sid: a.sid,
            correlation_id: a.correlation_id,
            accepted_us: a.accepted_us,
            collect: false,
        })
        .collect();
    let db = &pipeline.db;
    // The database's times, on the harness's clock.
    let offset_us = chrono::Utc::now().timestamp_micros() - now_us() as i64;
    // (provider message id, status, seq, reply id, joined into, opened at µs, picked at µs,
    // the picking dispatcher's `host:pid`)
    type Turns = (
        String,
        String,
        i64,
        Option<String>,
        Option<i64>,
        i64,
        Option<i64>,
        Option<String>,
    );
    let turns = sqlx::query_as::<_, Turns>(
        "SELECT t.provider_message_id, t.status, t.seq, t.reply_id::text, t.joined_into,
                (extract(epoch FROM t.created_at) * 1000000)::bigint,
                (extract(epoch FROM t.picked_at) * 1000000)::bigint,
                d.instance
           FROM switchboard.turns t
           LEFT JOIN switchboard.dispatchers d ON d.id = t.picked_by",
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(
        |(provider_message_id, status, seq, reply_id, joined_into, opened, picked, by)| TurnRow {
            provider_message_id,
            status,
            seq,
            reply_id,
            joined_into,
            opened_us: Some((opened - offset_us).max(0) as u64),
            picked_us: picked.map(|at| (at - offset_us).max(0) as u64),
            picked_by_pid: by
                .as_deref()
                .and_then(|i| i.rsplit_once(':'))
                .and_then(|(_, pid)| pid.parse().ok()),
        },
    )
    .collect();
    let inbound_logged = sqlx::query_scalar::<_, Option<String>>(
        "SELECT external_id FROM switchboard.messages WHERE direction = 'inbound'",
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(Option::unwrap_or_default)
    .collect();
    let outbound_logged = sqlx::query_scalar::<_, String>(
        "SELECT message FROM switchboard.messages WHERE direction = 'outbound'",
    )
    .fetch_all(db)
    .await?;
    type Mailbox = (i64, String, i32, String, String, String, String);
    let mailbox = sqlx::query_as::<_, Mailbox>(
        "SELECT seq, reply_id::text, part, channel, address, text, kind FROM switchboard.mailbox",
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(
        |(seq, reply_id, part, channel, address, text, kind)| MailboxRow {
            seq,
            reply_id,
            part,
            channel,
            address,
            text: text.strip_prefix("echo: ").unwrap_or(&text).to_string(),
            kind,
        },
    )
    .collect();
    // The journal's waits, on the harness's clock.
    let waiting = sqlx::query_as::<_, (String, Option<String>, Option<i64>, i64)>(
        "SELECT coalesce(e.detail->>'person_id', s.person_id), e.detail->>'notice_id', e.seq,
                (extract(epoch FROM e.at) * 1000000)::bigint
           FROM switchboard.session_events e
           JOIN switchboard.sessions s ON s.id = e.session_id
          WHERE e.kind = $1 ORDER BY e.at",
    )
    .bind(switchboard_kit::status::SessionEventKind::Waiting)
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|(person, notice_id, seq, at_us)| WaitingRow {
        person,
        notice_id: notice_id.unwrap_or_default(),
        seq: seq.unwrap_or(-1),
        at_us: (at_us - offset_us).max(0) as u64,
    })
    .collect();
    // The attempt of unknown outcome, on the harness's clock.
    type Ledger = (String, String, Vec<String>, Option<String>, Option<i64>);
    let ledger = sqlx::query_as::<_, Ledger>(
        "SELECT reply_id::text, status, provider_message_ids, last_error,
                (extract(epoch FROM attempt_started_at) * 1000000)::bigint
           FROM switchboard.deliveries",
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(
        |(reply_id, status, provider_message_ids, last_error, attempt)| LedgerRow {
            reply_id,
            status,
            provider_message_ids,
            last_error,
            attempt_started_us: attempt.map(|at| (at - offset_us).max(0) as u64),
        },
    )
    .collect();
    let (dead_letters, dead_letters_unreadable) =
        match switchboard_kit::dlq::list(&pipeline.js, &pipeline.topology, None, 1_000_000).await {
            Ok(letters) => (
                letters
                    .into_iter()
                    .map(|d| DeadLetterNote {
                        seq: d.seq,
                        reply_id: (d.letter.stage == "deliver")
                            .then(|| {
                                <switchboard_kit::proto::Reply as prost::Message>::decode(
                                    d.letter.payload.as_slice(),
                                )
                            })
                            .and_then(Result::ok)
                            .map(|reply| reply.id),
                        stage: d.letter.stage,
                        error: d.letter.error,
                    })
                    .collect(),
                None,
            ),
            Err(e) => (Vec::new(), Some(format!("{e:#}"))),
        };
    Ok(Evidence {
        never_accepted: load.stats().gave_up,
        accepted,
        runner_calls: runner.calls(),
        sends: [replies.twilio.sends(), replies.providers.sends()].concat(),
        mailbox,
        client_replies,
        turns,
        inbound_logged,
        outbound_logged,
        ledger,
        kills,
        crashes,
        dead_letters,
        dead_letters_unreadable,
        settled,
        waiting,
        ..Default::default()
    })
}

/// The runner's outage as planned, and as it happened.
struct OutagePlan {
    unavailable: Instant,
    refusing: Instant,
    back: Instant,
    record: RunnerOutage,
    /// 0: up; 1: 503; 2: not listening; 3: back.
    phase: u8,
}

/// A server crash in the background; yields what happened.
type Crash = tokio::task::JoinHandle<ServerCrash>;

/// SIGKILL one server of the stack and start it again, in the background.
fn crash_server(
    stack: &Stack,
    server: String,
    event: impl Fn(String) + Send + 'static,
    lost: Arc<AtomicBool>,
) -> Crash {
    let stack = stack.clone();
    tokio::task::spawn_blocking(move || {
        let at_us = now_us();
        let r = stack.crash(&server);
        if r.is_err() {
            lost.store(true, Ordering::SeqCst);
        }
        event(match &r {
            Ok(()) => format!("{server} back up after crash recovery"),
            Err(e) => format!("{server} did NOT come back: {e:#}"),
        });
        ServerCrash {
            server,
            at_us,
            back_us: now_us(),
            recovered: r.is_ok(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_plan_hits_every_worker_kind_twice_and_is_repeatable() {
        let o = ChaosOptions::small(PathBuf::from("/nonexistent"));
        let a = kill_plan(7, &o.replicas, o.kill_every, o.kill_window()).unwrap();
        let b = kill_plan(7, &o.replicas, o.kill_every, o.kill_window()).unwrap();
        assert_eq!(a, b, "the same seed gives the same plan");
        for kind in WORKER_KINDS {
            assert!(
                a.iter().filter(|k| k.kind == kind).count() >= MIN_KILLS_PER_KIND,
                "{kind} is killed at least twice: {a:?}"
            );
        }
        assert!(a.windows(2).all(|w| w[0].at < w[1].at));
        assert!(a.last().unwrap().at <= o.kill_window());
        let other = kill_plan(8, &o.replicas, o.kill_every, o.kill_window()).unwrap();
        assert_ne!(a, other, "another seed, another plan");
        let full = ChaosOptions::full(PathBuf::from("/nonexistent"));
        assert!(kill_plan(1, &full.replicas, full.kill_every, full.kill_window()).is_ok());
    }

    #[test]
    fn a_window_too_short_to_kill_every_kind_twice_is_refused() {
        let o = ChaosOptions::small(PathBuf::from("/nonexistent"));
        let e = kill_plan(
            1,
            &o.replicas,
            Duration::from_secs(2),
            Duration::from_secs(20),
        );
        assert!(e.is_err(), "10 kills cannot hit 9 kinds twice");
    }

    #[test]
    fn chaos_stacks_listen_below_the_ephemeral_port_range() {
        for o in [
            ChaosOptions::full(PathBuf::new()),
            ChaosOptions::small(PathBuf::new()),
        ] {
            // NATS's monitoring port is its client port + 1000.
            for port in [o.nats_port, o.nats_port + 1000, o.pg_port] {
                assert!(port < 32768, "{} uses port {port}", o.stack_name);
            }
        }
    }
}
