//! Load and failure runs against the real product: `make bench` (throughput, overhead, CPU and
//! memory per turn, and the floor the same I/O sets) and `make chaos` (workers SIGKILLed, NATS
//! and Postgres restarted, then every message accounted for).
//!
//! Everything here runs the real worker binaries (`switchboard-<name>`), each its own process
//! with its own configuration file, on a stack instance of its own (the `stack` tool,
//! services/stack). The third parties are the shared fakes (`switchboard-fakes`, real HTTP
//! servers) in the harness process, watched through [`observers`]; their cost is measured
//! apart from the pipeline's.
//!
//! - [`stack`]: bring a named stack up and down, restart one server, fresh databases.
//! - [`procs`]: worker processes (spawn, kill, restart) and `/proc` accounting (CPU, RSS).
//! - [`observers`]: what the runner and the providers' fakes (SMS and chat platforms) saw, as
//!   order, overlap and duplicates checks need it, and when each reply arrived.
//! - [`pipeline`]: the generated configuration and the gateway client (signed SMS).
//! - [`loadgen`]: senders, open-loop (target rate) and closed-loop (one turn per sender).
//! - [`floor`]: the same durable publishes, consumes, acks and database writes per turn, no logic.
//! - [`report`]: percentiles, JSON and PNG plots.
//! - [`chaos`]: the chaos run (load, seeded kills, server crashes) and its evidence;
//!   [`chaos_check`]: the verdict on that evidence; [`returning`]: people who come back
//!   after their summary was written.
pub mod bench_verdict;
pub mod canary;
pub mod channels;
pub mod chaos;
pub mod chaos_check;
pub mod chaos_nodes;
pub mod chaos_takeover;
pub mod chaos_wakeups;
pub mod floor;
pub mod loadgen;
pub mod memory_lag;
pub mod memory_report;
pub mod memory_run;
pub mod observers;
pub mod pipeline;
pub mod procs;
pub mod report;
pub mod returning;
pub mod rolling;
pub mod stack;
pub mod statement_profile;
pub mod table_writes;

use std::sync::OnceLock;
use std::time::Instant;

/// Microseconds since the harness started: one clock for the load generator and the fakes.
pub fn now_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// The message text a sender sends: `s<sender>#<index>`, so order can be checked from the text.
pub fn message_text(sender: usize, index: u32) -> String {
    format!("s{sender}#{index}")
}

/// The (sender, index) back from a message text (or a reply `echo: s<sender>#<index>`).
pub fn parse_text(text: &str) -> Option<(usize, u32)> {
    let t = text.strip_prefix("echo: ").unwrap_or(text).trim();
    let (s, i) = t.strip_prefix('s')?.split_once('#')?;
    Some((s.parse().ok()?, i.parse().ok()?))
}

/// The messages a reply answers, in order: `echo: s1#2` answers one, `echo: s1#2 s1#3` (a
/// call that joined messages, queue mode `collect`) several. `None` if any part is not a
/// message of the run.
pub fn parse_answers(text: &str) -> Option<Vec<(usize, u32)>> {
    let t = text.strip_prefix("echo: ").unwrap_or(text).trim();
    let parts: Option<Vec<_>> = t.split(' ').map(parse_text).collect();
    parts.filter(|p| !p.is_empty())
}

/// A valid, distinct US number per sender (E.164).
pub fn sender_phone(sender: usize) -> String {
    format!("+1415{:07}", 2_000_000 + sender)
}

/// The sender back from a phone number.
pub fn sender_of_phone(phone: &str) -> Option<usize> {
    let n: usize = phone.strip_prefix("+1415")?.parse().ok()?;
    n.checked_sub(2_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_and_phones_round_trip() {
        assert_eq!(parse_text(&message_text(12, 7)), Some((12, 7)));
        assert_eq!(parse_text("echo: s3#0"), Some((3, 0)));
        assert_eq!(
            parse_text("s3#0 s3#1"),
            None,
            "a joined answer is not one message"
        );
        assert_eq!(parse_answers("echo: s3#0 s3#1"), Some(vec![(3, 0), (3, 1)]));
        assert_eq!(parse_answers("s3#0"), Some(vec![(3, 0)]));
        assert_eq!(parse_answers("Your message is safe with us"), None);
        assert_eq!(sender_of_phone(&sender_phone(9_999)), Some(9_999));
        assert!(
            switchboard_kit::address::normalize_phone(&sender_phone(9_999), "US").is_ok(),
            "sender phones must be valid numbers"
        );
    }
}
