//! People who come back: after the load, one person per channel, whose conversation has been
//! summarised meanwhile, sends one more message. Their prompt must carry their memory (the
//! summary holds their canary, outside their message's fence).
//!
//! Without this the proof that memory reaches prompts at all rests on timing: the load's
//! people talk for a few seconds each, and a summary comes only once a conversation has been
//! quiet for `[summary] idle_gap_s`, so whether any later turn of theirs finds one depended on
//! how long the runner's outage and the kills held their turns (a CI run found none). A person
//! returning after their summary was written is the case memory exists for, so the run makes
//! it happen and checks it ([`Kind::ReturnerForgotten`](crate::chaos_check::Kind)).
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::canary::Canaries;
use crate::channels::{Channel, Mix};
use crate::loadgen::LoadGen;

/// One person who came back.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Returned {
    pub sender: usize,
    /// The index of the message they came back with (`s<sender>#<index>`).
    pub index: u32,
    /// Their summary (holding their canary) was written before they sent it: their prompt
    /// must then carry memory.
    pub summarised_before: bool,
    /// How long the run waited for that summary, s.
    pub waited_s: f64,
    /// The gateway accepted the message.
    pub accepted: bool,
}

/// The first sender of each channel `mix` uses, among `senders`.
pub fn returners(mix: &Mix, senders: usize) -> Vec<usize> {
    Channel::ALL
        .into_iter()
        .filter_map(|channel| (0..senders).find(|&s| mix.channel_of(s) == channel))
        .collect()
}

/// Whether a summary carrying `canary` has been written.
async fn summarised(db: &PgPool, canary: &str) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM switchboard.summaries WHERE strpos(summary, $1) > 0)",
    )
    .bind(canary)
    .fetch_one(db)
    .await
    .unwrap_or(false)
}

/// Each of `senders` comes back with message `index`, once their summary is written (waiting
/// at most `wait` in all; a person whose summary did not come comes back anyway, recorded so).
pub async fn come_back(
    db: &PgPool,
    load: &LoadGen,
    canaries: Canaries,
    senders: &[usize],
    index: u32,
    wait: Duration,
    event: &(impl Fn(String) + ?Sized),
) -> Vec<Returned> {
    let started = Instant::now();
    let mut out = Vec::new();
    for &sender in senders {
        let canary = canaries.of(sender);
        let mut summarised_before = summarised(db, &canary).await;
        while !summarised_before && started.elapsed() < wait {
            tokio::time::sleep(Duration::from_millis(250)).await;
            summarised_before = summarised(db, &canary).await;
        }
        let waited_s = started.elapsed().as_secs_f64();
        let accepted = load.send(sender, index).await.is_some();
        event(format!(
            "s{sender} came back ({}) {} its summary was written, after {waited_s:.1} s",
            load.clients().channel_of(sender).name(),
            if summarised_before { "once" } else { "before" },
        ));
        out.push(Returned {
            sender,
            index,
            summarised_before,
            waited_s,
            accepted,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_person_per_channel_comes_back() {
        let r = returners(&Mix::CHAOS, 60);
        let channels: Vec<Channel> = r.iter().map(|&s| Mix::CHAOS.channel_of(s)).collect();
        assert_eq!(channels, Channel::ALL.to_vec());
        assert_eq!(returners(&Mix::TWILIO_ONLY, 60), vec![0]);
    }
}
