//! A bounded chaos run inside `make test`: 600 turns across 60 sessions, mixed as the full run
//! mixes them (16 people on Twilio, 7 or 8 each on TextMagic, chat, the API, Telegram, Slack
//! and WhatsApp), while worker processes are SIGKILLed on a seeded schedule (every kind at
//! least twice) and NATS and Postgres are each SIGKILLed once and come back by crash recovery,
//! on a stack of its own (`chaos-small`, ports 28222/29432, or the two of
//! `SB_CHAOS_SMALL_PORTS=<nats>,<pg>`; Postgres durable) so that the crashes do not disturb
//! other tests. A quarter of the SMS, chat and API people talk to an agent with
//! `queue_mode = "collect"`, five (one of each of their shares) to a front desk everyone
//! shares one session with (`scope = "main"`), and the runner is down for 10 s from the 4th
//! second (2 s answering 503, then refusing connections). `make chaos`
//! is the full run. `SB_CHAOS_SEED` repeats a run's kill schedule.
//!
//! The verdict is the full run's (see `switchboard_load::chaos_check`): nothing accepted is
//! lost on any channel (turn, inbound log row, reply at the provider or in the mailbox and at
//! the chat or API client, or on Telegram and WhatsApp recorded failed by the ledger after its
//! deliverer died mid-send, outbound log row), every reply reaches its sender on their channel,
//! no two turns of one person overlap, every runner call and every reply comes in the person's
//! order, no reply is delivered twice, a message joined into a collect call is answered once
//! by that call's reply (and some were joined), every person whose turn waited on the down
//! runner is told once on their channel and nobody else is, no dead letter, and the pipeline
//! settles. After the load one person per channel comes back once their conversation has been
//! summarised, and their prompt must carry that memory. The memory workers (`embed`, `categorise`, `summary`, on a fake OpenAI-compatible
//! model) are SIGKILLed like the others, and every person's messages carry a canary of their
//! own: no prompt (runner or model) carries another person's canary, every logged message has
//! exactly one vector, every exchange one label and one `exchange.categorised` event, and each
//! memory key's summary versions are 1..n, each merging exactly the messages it marks with its
//! version (none twice, none miscounted), all of them summarised once the run has drained.
use switchboard_load::channels::Channel;
use switchboard_load::chaos::{self, ChaosOptions, MIN_KILLS_PER_KIND, WORKER_KINDS};
use switchboard_load::stack::repo_dir;

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
    if let Some((nats, pg)) = std::env::var("SB_CHAOS_SMALL_PORTS")
        .ok()
        .and_then(|p| p.split_once(',').map(|(n, p)| (n.parse(), p.parse())))
        .and_then(|(n, p)| Some((n.ok()?, p.ok()?)))
    {
        (options.nats_port, options.pg_port) = (nats, pg);
    }
    let report = chaos::run(options).await.expect("the chaos run completes");
    report.print();
    for kind in WORKER_KINDS {
        let n = report.kills.iter().filter(|k| k.kind == kind).count();
        assert!(n >= MIN_KILLS_PER_KIND, "{kind} was killed {n} times");
    }
    assert_eq!(report.crashes_of("nats"), 1, "NATS was SIGKILLed once");
    assert_eq!(report.crashes_of("pg"), 1, "Postgres was SIGKILLed once");
    for channel in Channel::ALL {
        let tally = report
            .verdict
            .channels
            .get(&channel)
            .cloned()
            .unwrap_or_default();
        assert!(
            tally.accepted >= 70,
            "{channel:?} carried its share of the load: {tally:?}"
        );
    }
    let v = &report.verdict;
    assert!(
        v.collect_people > 0,
        "some people talk to the collect agent"
    );
    let outage = v.outage.clone().expect("the runner went down");
    assert!(
        outage.waits_recorded > 0 && outage.people_told > 0,
        "the outage made turns wait and people were told: {outage:?}"
    );
    let memory = v.memory.clone().expect("the memory workers ran");
    assert!(
        memory.messages_shared > 0,
        "some people talk to the shared front desk: {memory:?}"
    );
    assert!(
        memory.prompts_with_memory > 0 && memory.summary_versions > 0 && memory.exchanges > 0,
        "memory reached the prompts (else the canary check proves little): {memory:?}"
    );
    assert_eq!(
        memory.returned_summarised,
        Channel::ALL.len() as u64,
        "one person per channel came back after their summary was written: {memory:?}"
    );
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "chaos (seed {}) found: {} (report, evidence and worker logs in {})",
        report.seed,
        failures.join("; "),
        dir.display()
    );
}
