//! A bounded chaos run inside `make test`: 600 turns across 60 sessions while a random worker
//! process is SIGKILLed every 2 s for 20 s and NATS is restarted once, on a stack of its own
//! (`chaos-small`, ports 44222/45432) so that restarting NATS does not disturb other tests.
//! `make chaos` is the full run.
//!
//! Asserted: nothing accepted is lost (turn, inbound log row, SMS), no two turns of one person
//! overlap, turns reach the runner and replies reach the person in the order the person wrote
//! (and in turn order), and no reply is sent twice outside the documented window.
use switchboard_e2e::load::chaos::{self, ChaosOptions};
use switchboard_e2e::load::stack::repo_dir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_and_nats_restarted_lose_nothing_and_keep_every_persons_order() {
    let dir = repo_dir().join("target").join("chaos-small");
    let _ = std::fs::remove_dir_all(&dir);
    let report = chaos::run(ChaosOptions::small(dir.clone()))
        .await
        .expect("the chaos run completes");
    report.print();
    assert!(report.kills >= 5, "workers were killed: {}", report.kills);
    assert_eq!(report.nats_restarts, 1);
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "chaos found: {} (report and worker logs in {})",
        failures.join("; "),
        dir.display()
    );
}
