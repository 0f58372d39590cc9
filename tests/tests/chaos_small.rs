//! A bounded chaos run inside `make test`: 600 turns across 60 sessions while worker processes
//! are SIGKILLed on a seeded schedule (every kind at least twice) and NATS and Postgres are each
//! SIGKILLed once and come back by crash recovery, on a stack of its own (`chaos-small`, ports
//! 28222/29432, Postgres durable) so that the crashes do not disturb other tests. `make chaos`
//! is the full run. `SB_CHAOS_SEED` repeats a run's kill schedule.
//!
//! The verdict is the full run's (see `switchboard_e2e::load::chaos_check`): nothing accepted is
//! lost (turn, inbound log row, SMS, outbound log row), every reply reaches its sender, no two
//! turns of one person overlap, every runner call and every SMS comes in the person's order, no
//! reply is sent twice unless its sender was killed before the ledger recorded it, no dead
//! letter, and the pipeline settles.
use switchboard_e2e::load::chaos::{self, ChaosOptions, MIN_KILLS_PER_KIND, WORKER_KINDS};
use switchboard_e2e::load::stack::repo_dir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_nats_and_postgres_killed_lose_nothing_and_keep_every_persons_order() {
    let dir = repo_dir().join("target").join("chaos-small");
    let _ = std::fs::remove_dir_all(&dir);
    let mut options = ChaosOptions::small(dir.clone());
    if let Some(seed) = std::env::var("SB_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        options.seed = seed;
    }
    let report = chaos::run(options).await.expect("the chaos run completes");
    report.print();
    for kind in WORKER_KINDS {
        let n = report.kills.iter().filter(|k| k.kind == kind).count();
        assert!(n >= MIN_KILLS_PER_KIND, "{kind} was killed {n} times");
    }
    assert_eq!(report.crashes_of("nats"), 1, "NATS was SIGKILLed once");
    assert_eq!(report.crashes_of("pg"), 1, "Postgres was SIGKILLed once");
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "chaos (seed {}) found: {} (report, evidence and worker logs in {})",
        report.seed,
        failures.join("; "),
        dir.display()
    );
}
