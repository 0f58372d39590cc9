//! Every target checked against what was measured ([`judge`]), and the checks every scenario
//! gets: run as the target defines it, the load offered, latencies, and integrity.
use super::{
    BEYOND_WINDOW, Check, FLOOR, Findings, HALF_LOAD, IN_FLIGHT, MAX_THROUGHPUT, Measured, Outcome,
    Overhead, Quantile, ScenarioMeasured, Targets,
};

#[derive(Default)]
struct Checks(Vec<Check>);

impl Checks {
    fn add(&mut self, scenario: &str, target: String, measured: String, met: bool) -> &mut Check {
        self.0.push(Check {
            scenario: scenario.into(),
            target,
            measured,
            outcome: if met { Outcome::Met } else { Outcome::Missed },
            evidence: Vec::new(),
        });
        self.0.last_mut().expect("just pushed")
    }

    fn not_run(&mut self, scenario: &str, target: String) {
        self.0.push(Check {
            scenario: scenario.into(),
            target,
            measured: "-".into(),
            outcome: Outcome::NotRun,
            evidence: Vec::new(),
        });
    }

    /// The run's parameters against the target's; `(name, target, run)`.
    fn parameters(&mut self, scenario: &str, params: &[(&str, String, String)]) {
        let wanted: Vec<String> = params.iter().map(|(n, t, _)| format!("{n} {t}")).collect();
        let ran: Vec<String> = params.iter().map(|(n, _, r)| format!("{n} {r}")).collect();
        let off: Vec<String> = params
            .iter()
            .filter(|(_, t, r)| t != r)
            .map(|(n, t, r)| format!("{n}: the target is for {t}, this run had {r}"))
            .collect();
        let c = self.add(
            scenario,
            format!("run as the target defines it ({})", wanted.join(", ")),
            ran.join(", "),
            off.is_empty(),
        );
        c.evidence = off;
    }

    /// The findings every scenario must be free of.
    fn integrity(&mut self, scenario: &str, s: &ScenarioMeasured) {
        let kinds: [(&str, &Findings, String); 7] = [
            (
                "every message posted is accepted",
                &s.never_accepted,
                format!("{} never accepted", s.never_accepted.count),
            ),
            (
                "every accepted message is answered",
                &s.unanswered,
                format!(
                    "{} of {} accepted messages unanswered",
                    s.unanswered.count, s.accepted
                ),
            ),
            (
                "no reply sent twice",
                &s.doubles,
                format!("{} replies sent more than once", s.doubles.count),
            ),
            (
                "no turn called twice at the runner",
                &s.repeated_calls,
                format!("{} repeated runner calls", s.repeated_calls.count),
            ),
            (
                "each person's turns and replies in order",
                &s.order_violations,
                format!("{} order violations", s.order_violations.count),
            ),
            (
                "one turn per person at the runner at a time",
                &s.overlaps,
                format!("{} overlapping calls", s.overlaps.count),
            ),
            (
                "no dead letters",
                &s.dead_letters,
                format!("{} dead letters", s.dead_letters.count),
            ),
        ];
        for (target, findings, measured) in kinds {
            let c = self.add(scenario, target.into(), measured, findings.count == 0);
            c.evidence = findings.evidence();
        }
    }

    /// Open loop: the load was offered as asked (the load generator kept up).
    fn offered(&mut self, scenario: &str, s: &ScenarioMeasured) {
        if let Some(rate) = s.offered_rate_per_s {
            let got = s.accepted_in_window as f64 / s.window_s.max(1e-9);
            self.add(
                scenario,
                format!("the load offered: at least 95% of {rate:.0} msg/s accepted in the window"),
                format!("{got:.0} msg/s"),
                got >= 0.95 * rate,
            );
        }
    }

    fn latency(&mut self, scenario: &str, name: &str, q: Quantile, limit_ms: f64, o: &Overhead) {
        let c = self.add(
            scenario,
            format!("overhead {name} ≤ {limit_ms} ms"),
            format!("{q}"),
            q.at_most(limit_ms),
        );
        if o.unanswered > 0 {
            c.evidence.push(format!(
                "{} of {} messages accepted in the window were never answered (counted as {BEYOND_WINDOW})",
                o.unanswered,
                o.answered + o.unanswered
            ));
        }
    }
}

fn ms(v: u64) -> String {
    format!("{v} ms")
}

fn secs(v: u64) -> String {
    format!("{v} s")
}

/// Every target checked against what was measured.
pub fn judge(t: &Targets, m: &Measured) -> Vec<Check> {
    let mut c = Checks::default();

    let mt = &t.max_throughput;
    let max_target = format!("≥ {:.0} turns/s", mt.min_turns_per_s);
    match &m.max_throughput {
        None => c.not_run(MAX_THROUGHPUT, max_target),
        Some(s) => {
            c.parameters(
                MAX_THROUGHPUT,
                &[
                    ("runner", ms(mt.runner_ms), ms(s.runner_ms)),
                    ("window", secs(mt.window_s), secs(s.planned_window_s)),
                ],
            );
            c.add(
                MAX_THROUGHPUT,
                max_target,
                format!(
                    "{:.0} turns/s ({} turns in {:.1} s)",
                    s.turns_per_s, s.turns_in_window, s.window_s
                ),
                s.turns_per_s >= mt.min_turns_per_s,
            );
            c.integrity(MAX_THROUGHPUT, s);
        }
    }

    let ft = &t.floor;
    let share = ft.min_pipeline_share;
    let floor_target = format!("≥ {:.0}%", share * 100.0);
    match (&m.max_throughput, &m.floor) {
        (Some(s), Some(f)) => {
            c.parameters(
                FLOOR,
                &[
                    ("window", secs(s.planned_window_s), secs(f.planned_window_s)),
                    (
                        "Postgres pool",
                        ft.db_pool.to_string(),
                        s.db_pool.to_string(),
                    ),
                    (
                        "floor Postgres pool",
                        ft.db_pool.to_string(),
                        f.db_pool.to_string(),
                    ),
                    (
                        "partitions",
                        ft.partitions.to_string(),
                        s.partitions.to_string(),
                    ),
                    (
                        "floor partitions",
                        ft.partitions.to_string(),
                        f.partitions.to_string(),
                    ),
                    ("sessions", ft.sessions.to_string(), s.senders.to_string()),
                    (
                        "floor sessions",
                        ft.sessions.to_string(),
                        f.sessions.to_string(),
                    ),
                ],
            );
            let ratio = s.turns_per_s / f.turns_per_s.max(1e-9);
            c.add(
                FLOOR,
                floor_target,
                format!(
                    "{:.1}% ({:.0} ÷ {:.0} turns/s)",
                    ratio * 100.0,
                    s.turns_per_s,
                    f.turns_per_s
                ),
                f.turns_per_s > 0.0 && ratio >= share,
            );
        }
        _ => c.not_run(FLOOR, floor_target),
    }

    let hl = &t.half_load;
    let p50 = format!("overhead p50 ≤ {} ms", hl.max_overhead_p50_ms);
    match &m.half_load {
        None => {
            c.not_run(HALF_LOAD, p50);
            c.not_run(
                HALF_LOAD,
                format!("overhead p99 ≤ {} ms", hl.max_overhead_p99_ms),
            );
        }
        Some(s) => {
            let rate = s.offered_rate_per_s.unwrap_or(0.0);
            let wanted_rate = m
                .max_throughput
                .as_ref()
                .map(|x| (hl.share_of_max * x.turns_per_s).max(1.0));
            let rate_ok = wanted_rate.is_some_and(|w| (rate - w).abs() <= (0.01 * w).max(1.0));
            c.parameters(
                HALF_LOAD,
                &[
                    ("runner", ms(0), ms(s.runner_ms)),
                    ("window", secs(hl.window_s), secs(s.planned_window_s)),
                    (
                        "rate",
                        match wanted_rate {
                            Some(_) if rate_ok => format!("{rate:.0} msg/s"),
                            Some(w) => format!(
                                "{w:.0} msg/s ({:.0}% of max throughput)",
                                hl.share_of_max * 100.0
                            ),
                            None => format!(
                                "{:.0}% of a measured max throughput",
                                hl.share_of_max * 100.0
                            ),
                        },
                        format!("{rate:.0} msg/s"),
                    ),
                ],
            );
            c.offered(HALF_LOAD, s);
            c.latency(
                HALF_LOAD,
                "p50",
                s.overhead.p50,
                hl.max_overhead_p50_ms,
                &s.overhead,
            );
            c.latency(
                HALF_LOAD,
                "p99",
                s.overhead.p99,
                hl.max_overhead_p99_ms,
                &s.overhead,
            );
            c.integrity(HALF_LOAD, s);
        }
    }

    let inf = &t.in_flight;
    let p99 = format!("overhead p99 ≤ {} ms", inf.max_overhead_p99_ms);
    match &m.in_flight {
        None => {
            c.not_run(IN_FLIGHT, p99);
            c.not_run(
                IN_FLIGHT,
                format!("whole-stack RSS ≤ {} MB", inf.max_stack_rss_mb),
            );
        }
        Some(s) => {
            c.parameters(
                IN_FLIGHT,
                &[
                    (
                        "rate",
                        format!("{:.0} msg/s", inf.rate_per_s),
                        format!("{:.0} msg/s", s.offered_rate_per_s.unwrap_or(0.0)),
                    ),
                    ("runner", ms(inf.runner_ms), ms(s.runner_ms)),
                    ("window", secs(inf.window_s), secs(s.planned_window_s)),
                ],
            );
            c.offered(IN_FLIGHT, s);
            c.latency(
                IN_FLIGHT,
                "p99",
                s.overhead.p99,
                inf.max_overhead_p99_ms,
                &s.overhead,
            );
            c.add(
                IN_FLIGHT,
                format!("whole-stack RSS ≤ {} MB", inf.max_stack_rss_mb),
                format!("{:.0} MB", s.stack_rss_mb),
                s.stack_rss_mb <= inf.max_stack_rss_mb,
            );
            c.integrity(IN_FLIGHT, s);
        }
    }
    c.0.extend(crate::memory_lag::judge(
        &t.memory_workers,
        m.memory_workers.as_ref(),
        m.half_load.as_ref(),
    ));
    c.0
}
