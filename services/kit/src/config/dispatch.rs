//! `[dispatch]`: how turns wait for their predecessors and their runners, and what happens to
//! stale ones.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct DispatchConfig {
    /// How often a dispatcher checks the sessions its waiting turns wait on (one query for all
    /// of them), for a predecessor finished or a call slot freed by another replica; a cursor
    /// moved by the same process wakes its turns at once.
    pub hold_poll_ms: u64,
    /// A turn waiting for its predecessor is parked (no handler slot held) until its session
    /// moves; it checks again after this long even if nothing woke it.
    pub hold_timeout_ms: u64,
    /// A dispatcher counts as alive (its runner calls keep their sessions' call slots) this
    /// long after its last heartbeat; it heartbeats every third of it. After a dispatcher
    /// dies, its sessions wait at most this long.
    pub liveness_ms: u64,
    /// A runner whose calls failed this many times in a row (unreachable, timed out, 5xx) is
    /// taken as down: its turns wait for it without using up their failure budget.
    pub breaker_failures: u32,
    /// While a runner is down, one call tries it this often (doubling up to
    /// `breaker_probe_max_ms`); the first that succeeds lets the waiting turns run, in order.
    pub breaker_probe_ms: u64,
    pub breaker_probe_max_ms: u64,
    /// What a person whose turn waits for a down runner is told, once per outage.
    pub runner_down_notice: String,
    /// A turn older than this (since its message was received) when it can first run is
    /// stale (0: never): see `stale_turns`.
    pub max_turn_age_s: u64,
    /// What happens to a stale turn: `answer` (run it; the prompt says how old it is) or
    /// `expire` (not run: dead-lettered as expired and the person told).
    pub stale_turns: StaleTurns,
    /// What a person whose message expired is told (`{sent}`: when they sent it).
    pub expired_notice: String,
    /// Most messages one runner call joins (`collect`, `interrupt`); the rest go in the next.
    pub collect_max: usize,
    /// How often each dispatcher looks for a `[[schedules]]` time that has come.
    pub schedule_tick_ms: u64,
    /// A schedule time missed by more than this (every dispatcher was down) is skipped, not
    /// fired late.
    pub schedule_lateness_s: u64,
}

/// `dispatch.stale_turns`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StaleTurns {
    /// Run it, with its age in the prompt.
    #[default]
    Answer,
    /// Do not run it: dead-letter it as expired and tell the person.
    Expire,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            hold_poll_ms: 100,
            hold_timeout_ms: 20_000,
            liveness_ms: 6_000,
            breaker_failures: 3,
            breaker_probe_ms: 1_000,
            breaker_probe_max_ms: 15_000,
            runner_down_notice: "Your message is safe with us: the assistant is briefly \
                                 unavailable and will answer shortly."
                .into(),
            max_turn_age_s: 3_600,
            collect_max: 20,
            schedule_tick_ms: 1_000,
            schedule_lateness_s: 300,
            stale_turns: StaleTurns::Answer,
            expired_notice: "Sorry: your message sent {sent} waited too long while the \
                             assistant was unavailable and was not answered. Please send it \
                             again if it still matters."
                .into(),
        }
    }
}
