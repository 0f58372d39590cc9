//! A rolling upgrade under load (`make upgrade-drill`, `chaos --rolling-upgrade`): while an open
//! loop offers a steady load well below capacity, every worker process is replaced one at a
//! time as an orchestrator replaces a pod: SIGTERM, its drain, its exit, the new process. The
//! chaos verdict then holds it to the same promises with no kill to excuse anything: nothing
//! lost, nothing doubled, in order, and no turn run twice at the runner (a drain that gave up
//! a call in flight would show as a re-run with no cause).
use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use super::chaos_check::Evidence;

/// One worker replaced.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Replacement {
    pub at_us: u64,
    pub target: String,
    pub pid: u32,
    /// From SIGTERM to the old process's exit.
    pub drained_ms: u64,
    /// It exited by itself within the grace (else it was SIGKILLed).
    pub clean: bool,
}

/// Overhead from acceptance to the reply's send, over the messages of a run answered at a
/// provider (SMS, Telegram, Slack, WhatsApp).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Latency {
    pub answered: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Acceptance to the first send of its reply, for every accepted message answered at a
/// provider that has one.
pub fn latency(e: &Evidence) -> Option<Latency> {
    let mut first_send: HashMap<&str, u64> = HashMap::new();
    for s in &e.sends {
        first_send
            .entry(s.text.as_str())
            .and_modify(|at| *at = (*at).min(s.at_us))
            .or_insert(s.at_us);
    }
    let mut ms: Vec<f64> = e
        .accepted
        .iter()
        .filter(|a| a.channel.mailbox_channel().is_none())
        .filter_map(|a| {
            let text = crate::message_text(a.sender, a.index);
            let sent = first_send.get(text.as_str())?;
            Some(sent.saturating_sub(a.accepted_us) as f64 / 1e3)
        })
        .collect();
    if ms.is_empty() {
        return None;
    }
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    Some(Latency {
        answered: ms.len(),
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        max_ms: *ms.last().unwrap(),
    })
}

/// When the replacements start, and the time between them (the new process starts pulling
/// within it).
pub const FIRST_AT: Duration = Duration::from_secs(10);
pub const EVERY: Duration = Duration::from_secs(4);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos_check::AcceptedMessage;
    use crate::observers::SendRecord;

    #[test]
    fn latency_runs_from_acceptance_to_the_first_send_of_the_reply() {
        let mut e = Evidence::default();
        for i in 0..100u32 {
            e.accepted.push(AcceptedMessage {
                sender: 1,
                index: i,
                accepted_us: 1_000_000,
                ..Default::default()
            });
            let text = crate::message_text(1, i);
            // Sent twice (a re-send): the first counts.
            for late in [0, 5_000_000] {
                e.sends.push(SendRecord {
                    at_us: 1_000_000 + (u64::from(i) + 1) * 1_000 + late,
                    text: text.clone(),
                    ..Default::default()
                });
            }
        }
        let l = latency(&e).unwrap();
        assert_eq!(l.answered, 100);
        assert_eq!(l.p50_ms, 51.0);
        assert_eq!(l.p99_ms, 99.0);
        assert_eq!(l.max_ms, 100.0);
        assert!(latency(&Evidence::default()).is_none());
    }
}
