//! A turn called again at the runner (a re-run).
//!
//! Dispatch calls a turn again only when the earlier attempt's dispatcher could not take the
//! answer in: it was killed, or NATS or Postgres went away under it (the commit or the ack
//! failed), and the turn was redelivered. The retry makes the same call under the same
//! `Idempotency-Key` (`turn:<session>:<seq>`, or `…:<first>-<last>` for the group a collect
//! call planned before its first attempt), so that the runner answers it from its record
//! instead of running the agent again. So a re-run is legitimate only
//! - under the first call's `Idempotency-Key` (another key runs the agent again on the same
//!   message: a solo call retried as a joined one, say), and
//! - with a dispatcher SIGKILLed, or NATS or Postgres down, between the first call and it
//!   (nothing else makes dispatch try a called turn again).
//!
//! (Queue mode `interrupt` changes a cancelled call's key by design, `~<n>`; the chaos run
//! has no interrupt agent and its fake runner cancels nothing, so no such re-run is expected.)
use super::doubles::SEND_RECORD_LAG_US;
use super::{Evidence, Kind, ServerCrash, Verdict, secs};
use crate::observers::CallRecord;

/// Judge `again`, a call of the turn whose first call was `first`, of `person`.
pub(super) fn judge_rerun(
    e: &Evidence,
    person: &str,
    first: &CallRecord,
    again: &CallRecord,
    v: &mut Verdict,
) {
    let turn = first.messages().join(" ");
    let when = format!(
        "{person}: {turn} (turn {}) called at {} and again at {}",
        first.seq.unwrap_or(-1),
        secs(first.start_us),
        secs(again.start_us)
    );
    if again.idempotency_key != first.idempotency_key {
        v.add(
            Kind::RerunUnderAnotherKey,
            format!(
                "{when} ({}) under Idempotency-Key {:?}, not the first call's {:?}: the runner \
                 cannot answer it from its record",
                again.messages().join(" "),
                again.idempotency_key,
                first.idempotency_key
            ),
        );
    }
    if let Some(why) = explained(e, first, again) {
        v.rerun_causes.push(why);
    } else {
        v.add(
            Kind::RerunUnexplained,
            format!("{when}, with no dispatcher killed and no NATS or Postgres crash in between"),
        );
    }
}

/// What made dispatch call the turn again: a dispatcher's kill, or a server down, between the
/// two calls (a kill may be recorded a little before the first call's start: the request was
/// on the wire).
fn explained(e: &Evidence, first: &CallRecord, again: &CallRecord) -> Option<String> {
    let kill = e.kills.iter().find(|k| {
        k.kind == "dispatch"
            && k.at_us + SEND_RECORD_LAG_US >= first.start_us
            && k.at_us <= again.start_us
    });
    if let Some(k) = kill {
        return Some(k.described());
    }
    e.crashes
        .iter()
        .find(|c| c.at_us <= again.start_us && c.back_us >= first.start_us)
        .map(ServerCrash::described)
}

#[cfg(test)]
mod tests {
    //! A re-run passes only under its first call's key with a kill or crash in between.
    use super::super::joined_tests::joined_run;
    use super::super::tests::{clean_run, kill_dispatcher, only_kind};
    use super::super::{Kill, judge};
    use super::*;

    /// [`clean_run`] with s0#0 called again 6 s after its first call ended (before s0#1), under
    /// the same key.
    fn rerun() -> Evidence {
        let mut e = clean_run();
        let mut again = e.runner_calls[0].clone();
        again.start_us = e.runner_calls[0].end_us.unwrap() + 6_000_000;
        again.end_us = Some(again.start_us + 20_000);
        e.runner_calls[1].start_us = again.end_us.unwrap() + 1_000;
        e.runner_calls[1].end_us = Some(e.runner_calls[1].start_us + 20_000);
        e.runner_calls.push(again);
        e
    }

    #[test]
    fn a_rerun_under_the_same_key_after_a_dispatcher_was_killed_passes() {
        let mut e = rerun();
        kill_dispatcher(&mut e.kills, e.runner_calls[0].start_us + 5_000);
        let v = judge(&e);
        assert!(v.passed(), "{:?}", v.findings);
        assert_eq!(v.reruns, 1);
        assert_eq!(
            v.rerun_causes,
            vec!["dispatch-1 killed at 1.006s".to_string()]
        );
    }

    #[test]
    fn a_rerun_across_a_postgres_or_nats_crash_passes() {
        for server in ["pg", "nats"] {
            let mut e = rerun();
            let first = e.runner_calls[0].start_us;
            e.crashes.push(ServerCrash {
                server: server.into(),
                at_us: first + 10_000,
                back_us: first + 3_000_000,
                recovered: true,
            });
            let v = judge(&e);
            assert!(v.passed(), "{server}: {:?}", v.findings);
        }
    }

    #[test]
    fn a_rerun_with_nothing_to_make_dispatch_retry_fails() {
        let mut e = rerun();
        // A kill of another worker, a dispatcher killed after the re-run, a crash over before
        // the first call: none makes dispatch call the turn again.
        let (first, again) = (
            e.runner_calls[0].start_us,
            e.runner_calls.last().unwrap().start_us,
        );
        e.kills.push(Kill {
            at_us: first + 5_000,
            kind: "deliver".into(),
            target: "deliver-0".into(),
            pid: 4242,
        });
        kill_dispatcher(&mut e.kills, again + 5_000_000);
        e.crashes.push(ServerCrash {
            server: "pg".into(),
            at_us: 1,
            back_us: first - 100_000,
            recovered: true,
        });
        let f = only_kind(&judge(&e), Kind::RerunUnexplained);
        assert!(
            f.evidence
                .contains("s0#0 (turn 1) called at 1.001s and again at 7.021s"),
            "{}",
            f.evidence
        );
    }

    #[test]
    fn a_rerun_under_another_key_fails_even_after_a_kill() {
        let mut e = rerun();
        kill_dispatcher(&mut e.kills, e.runner_calls[0].start_us + 5_000);
        e.runner_calls.last_mut().unwrap().idempotency_key = "turn-0-0~1".into();
        let f = only_kind(&judge(&e), Kind::RerunUnderAnotherKey);
        assert!(
            f.evidence.contains("\"turn-0-0~1\"") && f.evidence.contains("\"turn-0-0\""),
            "{}",
            f.evidence
        );
    }

    #[test]
    fn a_solo_call_retried_as_a_joined_one_runs_the_agent_again_and_fails() {
        // s1#0 was called alone; its dispatcher died; the retry joined s1#1 under a new key.
        let mut e = joined_run();
        let joined = e.runner_calls.iter().position(|c| c.joined()).unwrap();
        let mut alone = e.runner_calls[joined].clone();
        alone.texts = Vec::new();
        alone.idempotency_key = "turn:S1:1".into();
        let retry = &mut e.runner_calls[joined];
        retry.idempotency_key = "turn:S1:1-2".into();
        retry.start_us += 3_000_000;
        retry.end_us = Some(retry.start_us + 20_000);
        kill_dispatcher(&mut e.kills, alone.start_us + 5_000);
        e.runner_calls.insert(joined, alone);
        let f = only_kind(&judge(&e), Kind::RerunUnderAnotherKey);
        assert!(
            f.evidence.contains("s1#0 s1#1") && f.evidence.contains("\"turn:S1:1-2\""),
            "{}",
            f.evidence
        );
    }
}
