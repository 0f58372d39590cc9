use super::*;

fn targets() -> Targets {
    Targets::parse(include_str!("../../../bench-targets.toml")).expect("the targets file parses")
}

fn clean(
    turns_per_s: f64,
    runner_ms: u64,
    window: u64,
    rate: Option<f64>,
    latency_us: u64,
) -> ScenarioMeasured {
    let n = (turns_per_s * window as f64) as u64;
    ScenarioMeasured {
        load: "test".into(),
        senders: 1000,
        offered_rate_per_s: rate,
        runner_ms,
        warmup_s: 5.0,
        planned_window_s: window,
        window_s: window as f64,
        db_pool: 8,
        partitions: 32,
        accepted: n,
        accepted_in_window: n,
        turns_in_window: n,
        turns_per_s,
        overhead: overhead(&vec![latency_us; 1000], 0),
        stack_rss_mb: 400.0,
        ..Default::default()
    }
}

/// A run that meets every target of the targets file.
fn passing() -> Measured {
    let t = targets();
    Measured {
        machine: MachineSeen {
            cores: 2,
            memory_gib: 24.0,
            os: "linux".into(),
            arch: "x86_64".into(),
            release_build: true,
        },
        max_throughput: Some(clean(2500.0, 0, t.max_throughput.window_s, None, 3_000)),
        floor: Some(FloorMeasured {
            sessions: 1000,
            planned_window_s: t.max_throughput.window_s,
            window_s: t.max_throughput.window_s as f64,
            db_pool: 8,
            partitions: 32,
            turns_in_window: 240_000,
            turns_per_s: 4000.0,
            io: IoCounts::default(),
        }),
        half_load: Some(clean(1250.0, 0, t.half_load.window_s, Some(1250.0), 2_000)),
        in_flight: Some(clean(
            950.0,
            t.in_flight.runner_ms,
            t.in_flight.window_s,
            Some(950.0),
            200_000,
        )),
        memory_workers: Some(MemoryMeasured {
            embedder: "test".into(),
            max_throughput_lag: ["embed", "categorise", "summary"]
                .map(|stage| super::super::memory_lag::StageLagSummary {
                    stage: stage.into(),
                    mid_window_age_s: Some(2.0),
                    end_window_age_s: Some(2.5),
                    caught_up_after_s: Some(12.0),
                    ..Default::default()
                })
                .to_vec(),
            max_throughput_with: None,
            half_load_with: Some(clean(1250.0, 0, t.half_load.window_s, Some(1250.0), 2_100)),
        }),
    }
}

fn failure_text(f: &[Check]) -> String {
    f.iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_targets_file_has_the_issue_targets() {
    let t = targets();
    assert!(t.machine.description.contains("2 cores"));
    assert_eq!(t.machine.cores, 2);
    assert_eq!(t.max_throughput.min_turns_per_s, 2000.0);
    assert_eq!(t.max_throughput.window_s, 60);
    assert_eq!(t.floor.min_pipeline_share, 0.5);
    assert_eq!(t.half_load.max_overhead_p50_ms, 5.0);
    assert_eq!(t.half_load.max_overhead_p99_ms, 20.0);
    assert_eq!(t.in_flight.rate_per_s, 950.0);
    assert_eq!(t.in_flight.runner_ms, 10_000);
    assert_eq!(t.in_flight.window_s, 60);
    assert_eq!(t.in_flight.max_overhead_p99_ms, 1000.0);
    assert_eq!(t.in_flight.max_stack_rss_mb, 500.0);
    assert_eq!(t.memory_workers.max_overhead_ratio, 1.10);
}

#[test]
fn all_targets_met_is_no_failure() {
    let v = verdict(&targets(), &passing());
    assert!(v.is_empty(), "{}", failure_text(&v));
    assert!(
        judge(&targets(), &passing())
            .iter()
            .all(|c| c.outcome == Outcome::Met)
    );
}

#[test]
fn throughput_below_target_fails_with_both_numbers() {
    let mut m = passing();
    let s = m.max_throughput.as_mut().unwrap();
    s.turns_per_s = 323.0;
    s.turns_in_window = 19_380;
    // Half load follows max throughput.
    m.half_load.as_mut().unwrap().offered_rate_per_s = Some(161.5);
    m.half_load.as_mut().unwrap().accepted_in_window = 161 * 30 + 20;
    let v = verdict(&targets(), &m);
    let text = failure_text(&v);
    assert!(
        v.iter()
            .any(|f| f.scenario == MAX_THROUGHPUT && f.target.contains("2000")),
        "{text}"
    );
    assert!(
        text.contains("2000") && text.contains("323 turns/s"),
        "{text}"
    );
    // And the floor ratio (323 / 4000) too.
    assert!(v.iter().any(|f| f.scenario == FLOOR), "{text}");
    assert_eq!(v.len(), 2, "{text}");
}

#[test]
fn one_unanswered_message_fails_every_scenario_and_names_it() {
    for pick in 0..3 {
        let mut m = passing();
        let s = match pick {
            0 => m.max_throughput.as_mut(),
            1 => m.half_load.as_mut(),
            _ => m.in_flight.as_mut(),
        }
        .unwrap();
        s.unanswered = Findings::new(1, ["s4711#3 (accepted at 12.345 s)".to_string()]);
        s.overhead = overhead(&vec![3_000; 999], 1);
        let v = verdict(&targets(), &m);
        let text = failure_text(&v);
        assert!(
            v.iter().any(|f| f.target.contains("answered")
                && f.measured.contains("1 of")
                && f.evidence.iter().any(|e| e.contains("s4711#3"))),
            "scenario {pick}: {text}"
        );
    }
}

#[test]
fn many_unanswered_are_listed_with_their_count() {
    let mut m = passing();
    let s = m.in_flight.as_mut().unwrap();
    let texts: Vec<String> = (0..9_453).map(|i| format!("s{i}#0")).collect();
    s.unanswered = Findings::new(9_453, texts);
    let v = verdict(&targets(), &m);
    let f = v
        .iter()
        .find(|f| f.target.contains("answered"))
        .expect("fails");
    assert!(f.measured.contains("9453 of"), "{f}");
    assert_eq!(f.evidence.len(), EXAMPLES + 1);
    assert!(f.evidence[0] == "s0#0");
    assert!(f.evidence.last().unwrap().contains("9443 more"), "{f}");
}

#[test]
fn a_double_or_an_order_violation_fails() {
    let mut m = passing();
    m.half_load.as_mut().unwrap().doubles =
        Findings::new(1, ["s9#2 delivered 2 times".to_string()]);
    let text = failure_text(&verdict(&targets(), &m));
    assert!(text.contains("twice") && text.contains("s9#2"), "{text}");

    let mut m = passing();
    m.max_throughput.as_mut().unwrap().order_violations = Findings::new(
        1,
        ["sms order: +14152000001 got #3 after #4, at 1.000s".to_string()],
    );
    let v = verdict(&targets(), &m);
    assert_eq!(v.len(), 1, "{}", failure_text(&v));
    assert!(v[0].to_string().contains("got #3 after #4"));

    for kind in 0..4 {
        let mut m = passing();
        let s = m.in_flight.as_mut().unwrap();
        let findings = match kind {
            0 => &mut s.overlaps,
            1 => &mut s.repeated_calls,
            2 => &mut s.dead_letters,
            _ => &mut s.never_accepted,
        };
        *findings = Findings::new(2, ["x".to_string()]);
        assert_eq!(verdict(&targets(), &m).len(), 1, "kind {kind}");
    }
}

#[test]
fn latency_and_memory_targets_fail_with_the_measured_value() {
    let mut m = passing();
    m.half_load.as_mut().unwrap().overhead = overhead(&vec![15_000; 1000], 0);
    // As slow with the memory workers: only the absolute targets are missed.
    let with = m.memory_workers.as_mut().unwrap();
    with.half_load_with.as_mut().unwrap().overhead = overhead(&vec![15_000; 1000], 0);
    m.in_flight.as_mut().unwrap().stack_rss_mb = 812.0;
    let v = verdict(&targets(), &m);
    let text = failure_text(&v);
    assert!(
        text.contains("overhead p50 ≤ 5 ms: measured 15.00 ms"),
        "{text}"
    );
    assert!(text.contains("812 MB"), "{text}");
    assert_eq!(v.len(), 2, "{text}");
}

#[test]
fn a_collapsing_scenario_cannot_pass_on_its_survivors() {
    // The survivors were quick, but most messages were never answered.
    let mut m = passing();
    let s = m.in_flight.as_mut().unwrap();
    s.overhead = overhead(&vec![100_000; 400], 600);
    s.unanswered = Findings::new(600, (0..600).map(|i| format!("s{i}#1")));
    let v = verdict(&targets(), &m);
    let p99 = v
        .iter()
        .find(|f| f.target.contains("p99"))
        .expect("p99 fails");
    assert_eq!(p99.measured, "> window");
    assert!(p99.evidence[0].contains("600 of 1000"), "{p99}");
}

#[test]
fn a_run_with_other_parameters_fails() {
    let mut m = passing();
    m.max_throughput.as_mut().unwrap().planned_window_s = 5;
    m.floor.as_mut().unwrap().planned_window_s = 5;
    m.in_flight.as_mut().unwrap().offered_rate_per_s = Some(100.0);
    let v = verdict(&targets(), &m);
    let text = failure_text(&v);
    assert!(
        text.contains("window: the target is for 60 s, this run had 5 s"),
        "{text}"
    );
    assert!(
        text.contains("rate: the target is for 950 msg/s, this run had 100 msg/s"),
        "{text}"
    );
    // A floor measured over another window than the pipeline is not comparable.
    let mut m = passing();
    m.floor.as_mut().unwrap().planned_window_s = 30;
    m.floor.as_mut().unwrap().db_pool = 64;
    let text = failure_text(&verdict(&targets(), &m));
    assert!(
        text.contains("floor Postgres pool: the target is for 8, this run had 64"),
        "{text}"
    );
    assert!(
        text.contains("window: the target is for 60 s, this run had 30 s"),
        "{text}"
    );
    // Pipeline and floor alike with more connections than the targets are for: not the
    // run the targets describe, even though the two agree with each other.
    let mut m = passing();
    m.max_throughput.as_mut().unwrap().db_pool = 64;
    m.floor.as_mut().unwrap().db_pool = 64;
    let text = failure_text(&verdict(&targets(), &m));
    assert!(
        text.contains("Postgres pool: the target is for 8, this run had 64")
            && text.contains("floor Postgres pool: the target is for 8, this run had 64"),
        "{text}"
    );
}

#[test]
fn an_open_loop_that_did_not_offer_its_load_fails() {
    let mut m = passing();
    m.in_flight.as_mut().unwrap().accepted_in_window = 700 * 60;
    let text = failure_text(&verdict(&targets(), &m));
    assert!(
        text.contains("the load offered") && text.contains("700 msg/s"),
        "{text}"
    );
}

#[test]
fn a_target_not_run_is_a_miss_named_by_its_scenario() {
    // Only scenario 1 and the floor ran: every target of the others is missed.
    let m = Measured {
        max_throughput: passing().max_throughput,
        floor: passing().floor,
        ..Default::default()
    };
    let missed = verdict(&targets(), &m);
    // 2 half load, 2 in flight, 8 memory workers (lag and catch-up per stage, 2 ratios).
    assert_eq!(missed.len(), 12, "{}", failure_text(&missed));
    assert!(missed.iter().all(|c| c.outcome == Outcome::NotRun));
    let checks = judge(&targets(), &m);
    assert_eq!(
        not_run(&checks),
        vec![HALF_LOAD, IN_FLIGHT, super::super::memory_lag::MEMORY]
    );
    let text = failure_text(&missed);
    assert!(
        text.contains("[NOT RUN] in flight: whole-stack RSS"),
        "{text}"
    );
    // Everything run: nothing missed.
    assert!(verdict(&targets(), &passing()).is_empty());
    // Half load without a max throughput to take half of cannot be judged as passing.
    let m = Measured {
        half_load: passing().half_load,
        ..Default::default()
    };
    let text = failure_text(&verdict(&targets(), &m));
    assert!(text.contains("of a measured max throughput"), "{text}");
}

#[test]
fn measured_round_trips_through_json() {
    let mut m = passing();
    m.in_flight.as_mut().unwrap().overhead = overhead(&[5; 3], 7);
    let json = serde_json::to_string_pretty(&m).unwrap();
    let back: Measured = serde_json::from_str(&json).unwrap();
    assert_eq!(back, m);
    assert_eq!(verdict(&targets(), &back), verdict(&targets(), &m));
}

#[test]
fn machine_differences_are_named() {
    let t = targets();
    let same = passing().machine;
    assert!(machine_differences(&t.machine, &same).is_empty());
    let other = MachineSeen {
        cores: 8,
        release_build: false,
        ..same
    };
    let d = machine_differences(&t.machine, &other);
    assert_eq!(d.len(), 2, "{d:?}");
}
