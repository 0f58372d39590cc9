//! A circuit breaker per runner (per runner URL, in each dispatcher process).
//!
//! After `failures` calls in a row failed in a way that says the runner is down (unreachable,
//! timed out, 5xx), the breaker opens: turns for that runner stop calling it and wait (parked,
//! their failure budget untouched). Every `probe` (doubling up to `probe_max`) one call is let
//! through as a probe; the first success closes the breaker and the waiting turns run, each
//! session's in order (the cursor still decides who is next).
//!
//! Process-local on purpose: each replica learns of an outage from its own calls within a few
//! of them, and what must be shared (the session is waiting, the person was told) is in the
//! database. So a replica's breaker can still be open after another found the runner back:
//! dispatch lets a turn of a session not yet told of the outage call once itself (a check,
//! outside the probes' schedule) before anyone is told, and its success closes the breaker.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use switchboard_kit::retry::Backoff;
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls go through; `failures` in a row so far.
    Closed { failures: u32 },
    /// Calls wait; the next probe may go at `probe_at`. `opened` counts probes that failed.
    Open { probe_at: Instant, probes: u32 },
    /// One probe is out; other calls wait for its outcome.
    Probing { probes: u32, since: Instant },
}

/// Whether a call may go to the runner now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Call it (as a probe, if the runner was down).
    Call,
    /// The runner is down: wait this long, then ask again.
    Wait(Duration),
}

#[derive(Debug)]
pub struct Breakers {
    failures: u32,
    probe: Backoff,
    /// A probe that never reports (its dispatcher task vanished) is forgotten after this.
    probe_timeout: Duration,
    runners: Mutex<HashMap<String, State>>,
    /// Bumped each time a runner is found back, so the turns parked waiting for it go on at
    /// once rather than at their next probe time.
    recovered: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Breakers {
    pub fn new(
        failures: u32,
        probe: Duration,
        probe_max: Duration,
        probe_timeout: Duration,
    ) -> Self {
        Self {
            failures: failures.max(1),
            probe: Backoff::new(probe, probe_max.max(probe)),
            probe_timeout,
            runners: Mutex::new(HashMap::new()),
            recovered: Mutex::new(HashMap::new()),
        }
    }

    /// Resolves the next time `runner` is found back after this call (take it before the
    /// call that may find the runner down, so a recovery in between is not missed).
    pub fn recovery(&self, runner: &str) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self
            .recovered
            .lock()
            .unwrap()
            .entry(runner.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        async move {
            // The sender lives as long as the breakers: an error would mean no recovery ever.
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    pub fn admit(&self, runner: &str, now: Instant) -> Admission {
        let mut runners = self.runners.lock().unwrap();
        let state = runners
            .entry(runner.to_string())
            .or_insert(State::Closed { failures: 0 });
        match *state {
            State::Closed { .. } => Admission::Call,
            State::Open { probe_at, probes } if now >= probe_at => {
                *state = State::Probing { probes, since: now };
                Admission::Call
            }
            State::Open { probe_at, .. } => Admission::Wait(probe_at - now),
            State::Probing { probes, since } if now - since >= self.probe_timeout => {
                *state = State::Probing { probes, since: now };
                Admission::Call
            }
            State::Probing { probes, .. } => {
                Admission::Wait(self.probe.delay(u64::from(probes) + 1))
            }
        }
    }

    /// The runner answered (any answer that is not "down": a 4xx is the turn's problem).
    pub fn succeeded(&self, runner: &str) {
        let mut runners = self.runners.lock().unwrap();
        if let Some(state) = runners.get_mut(runner)
            && !matches!(state, State::Closed { failures: 0 })
        {
            if !matches!(state, State::Closed { .. }) {
                tracing::info!(runner, "runner is back; waiting turns resume");
                metrics::counter!("sb_dispatch_runner_recovered_total").increment(1);
                metrics::gauge!("sb_dispatch_runner_breaker_open", "runner" => runner.to_string())
                    .set(0.0);
                if let Some(tx) = self.recovered.lock().unwrap().get(runner) {
                    tx.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
            *state = State::Closed { failures: 0 };
        }
    }

    /// The call failed as a down runner fails. Returns whether the runner is now taken as
    /// down.
    pub fn failed(&self, runner: &str, now: Instant) -> bool {
        let mut runners = self.runners.lock().unwrap();
        let state = runners
            .entry(runner.to_string())
            .or_insert(State::Closed { failures: 0 });
        let next = match *state {
            State::Closed { failures } if failures + 1 < self.failures => State::Closed {
                failures: failures + 1,
            },
            State::Closed { .. } => {
                tracing::warn!(runner, "runner is down; its turns wait for it");
                metrics::counter!("sb_dispatch_runner_down_total").increment(1);
                // 1 while this process's breaker for the runner is open (the alert rule
                // SwitchboardRunnerBreakerOpen in deploy/grafana/alerts.yaml reads it).
                metrics::gauge!("sb_dispatch_runner_breaker_open", "runner" => runner.to_string())
                    .set(1.0);
                State::Open {
                    probe_at: now + self.probe.delay(1),
                    probes: 0,
                }
            }
            State::Open { probes, .. } | State::Probing { probes, .. } => State::Open {
                probe_at: now + self.probe.delay(u64::from(probes) + 2),
                probes: probes + 1,
            },
        };
        *state = next;
        !matches!(next, State::Closed { .. })
    }

    /// The caller was let through as a probe but made no call (its turn needed none): the
    /// next caller probes.
    pub fn probe_unused(&self, runner: &str, now: Instant) {
        let mut runners = self.runners.lock().unwrap();
        if let Some(state) = runners.get_mut(runner)
            && let State::Probing { probes, .. } = *state
        {
            *state = State::Open {
                probe_at: now,
                probes,
            };
        }
    }

    /// Whether the runner is taken as down now.
    pub fn is_down(&self, runner: &str) -> bool {
        self.runners
            .lock()
            .unwrap()
            .get(runner)
            .is_some_and(|s| !matches!(s, State::Closed { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breakers() -> Breakers {
        Breakers::new(
            3,
            Duration::from_secs(1),
            Duration::from_secs(8),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn a_runner_is_taken_as_down_after_failures_in_a_row_and_probed_until_it_answers() {
        let b = breakers();
        let t0 = Instant::now();
        assert_eq!(b.admit("r", t0), Admission::Call);
        assert!(!b.failed("r", t0));
        assert!(!b.failed("r", t0));
        // A success in between starts the count again.
        b.succeeded("r");
        assert!(!b.failed("r", t0));
        assert!(!b.failed("r", t0));
        assert!(b.failed("r", t0), "third in a row");
        assert!(b.is_down("r"));
        assert_eq!(b.admit("r", t0), Admission::Wait(Duration::from_secs(1)));
        // The probe time comes: one call goes, the others wait for it.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.admit("r", t1), Admission::Call);
        assert!(matches!(b.admit("r", t1), Admission::Wait(_)));
        // It failed: the next probe comes later, doubling.
        assert!(b.failed("r", t1));
        assert_eq!(b.admit("r", t1), Admission::Wait(Duration::from_secs(2)));
        let t2 = t1 + Duration::from_secs(2);
        assert_eq!(b.admit("r", t2), Admission::Call);
        b.succeeded("r");
        assert!(!b.is_down("r"));
        assert_eq!(b.admit("r", t2), Admission::Call);
        assert_eq!(b.admit("r", t2), Admission::Call);
    }

    #[test]
    fn probes_back_off_to_the_maximum_and_a_lost_probe_is_replaced() {
        let b = breakers();
        let mut t = Instant::now();
        for _ in 0..3 {
            b.failed("r", t);
        }
        for _ in 0..10 {
            let Admission::Wait(d) = b.admit("r", t) else {
                panic!("down")
            };
            assert!(d <= Duration::from_secs(8));
            t += d;
            assert_eq!(b.admit("r", t), Admission::Call);
            b.failed("r", t);
        }
        // A probe that never reports does not keep the runner shut for ever.
        let Admission::Wait(d) = b.admit("r", t) else {
            panic!("down")
        };
        t += d;
        assert_eq!(b.admit("r", t), Admission::Call);
        assert!(matches!(b.admit("r", t), Admission::Wait(_)));
        assert_eq!(b.admit("r", t + Duration::from_secs(60)), Admission::Call);
    }

    #[test]
    fn turns_waiting_for_a_runner_hear_when_it_is_found_back() {
        use futures::FutureExt as _;
        let b = breakers();
        let t = Instant::now();
        // Taken before the failures: a recovery after it counts.
        let mut back = Box::pin(b.recovery("r"));
        let mut other = Box::pin(b.recovery("other"));
        for _ in 0..3 {
            b.failed("r", t);
        }
        assert!(back.as_mut().now_or_never().is_none(), "still down");
        assert_eq!(b.admit("r", t + Duration::from_secs(1)), Admission::Call);
        b.succeeded("r");
        assert!(back.as_mut().now_or_never().is_some(), "found back");
        assert!(other.as_mut().now_or_never().is_none(), "another runner");
        // A success while the runner was up is no recovery.
        let mut again = Box::pin(b.recovery("r"));
        b.succeeded("r");
        assert!(again.as_mut().now_or_never().is_none());
    }

    #[test]
    fn runners_are_judged_apart() {
        let b = breakers();
        let t = Instant::now();
        for _ in 0..3 {
            b.failed("down", t);
        }
        assert!(b.is_down("down"));
        assert!(!b.is_down("up"));
        assert_eq!(b.admit("up", t), Admission::Call);
    }
}
