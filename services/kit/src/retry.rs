//! Retry delays as data: one policy for every place that waits and tries again (the runtime's
//! failed messages, the session stage's waiting ones, a write that must not be lost).
use std::future::Future;
use std::time::{Duration, Instant};

/// Exponential backoff from the attempt number: `base`, 2×`base`, 4×`base` … capped at `max`.
/// [`Backoff::delay`] is a pure function of the attempt; [`Backoff::jittered`] spreads it, for
/// retries many messages may take at once (after a NATS or Postgres restart a whole backlog
/// fails with the same delivery count, and would otherwise come back in lockstep).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    pub const fn new(base: Duration, max: Duration) -> Self {
        Self { base, max }
    }

    /// The delay before attempt `attempt + 1` (attempts count from 1).
    pub fn delay(&self, attempt: u64) -> Duration {
        let doublings = attempt.saturating_sub(1).min(20) as u32;
        self.base.saturating_mul(1 << doublings).min(self.max)
    }

    /// [`Backoff::delay`] with equal jitter: a random point in its upper half, so never more
    /// than the policy's delay (nor `max`) and never less than half of it.
    pub fn jittered(&self, attempt: u64) -> Duration {
        let full = self.delay(attempt);
        let half = full / 2;
        let spread = (full - half).as_nanos() as u64;
        if spread == 0 {
            return full;
        }
        // Random bits from the UUID generator the kit already uses (no `rand` in the kit): the
        // low 62 bits of a v4 UUID's second half (its top two are the variant).
        let r = uuid::Uuid::new_v4().as_u64_pair().1 & (u64::MAX >> 2);
        half + Duration::from_nanos(r % (spread + 1))
    }
}

/// Run `op` until it succeeds, waiting by `backoff` between tries, for as long as the next try
/// would start before `until`; then its last error. For a write that must land because what it
/// records already happened (a reply the agent gave, an SMS the provider took): failing the
/// whole message would do that thing again.
pub async fn until<T, E, F, Fut>(
    until: Instant,
    backoff: Backoff,
    what: &str,
    mut op: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() + backoff.delay(attempt) < until => {
                tracing::warn!(error = %e, attempt, "{what} failed; retrying");
                tokio::time::sleep(backoff.jittered(attempt)).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_the_base_and_stop_at_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(3), Duration::from_millis(400));
        assert_eq!(b.delay(10), Duration::from_millis(1000));
        assert_eq!(b.delay(u64::MAX), Duration::from_millis(1000));
        assert_eq!(b.delay(0), Duration::from_millis(100));
    }

    #[test]
    fn jittered_delays_spread_within_the_upper_half_of_the_policys_delay() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        for attempt in [1, 3, 10] {
            let full = b.delay(attempt);
            let delays: Vec<Duration> = (0..200).map(|_| b.jittered(attempt)).collect();
            assert!(
                delays.iter().any(|d| *d != delays[0]),
                "a backlog failing together would retry together: {:?}",
                &delays[..5]
            );
            for d in &delays {
                assert!(*d <= full && *d <= b.max, "{d:?} over {full:?}");
                assert!(*d >= full / 2, "{d:?} under half of {full:?}");
            }
        }
        let none = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(none.jittered(3), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_write_is_tried_again_until_it_lands_or_time_is_up() {
        let b = Backoff::new(Duration::from_millis(1), Duration::from_millis(4));
        let mut tries = 0;
        let landed: Result<u32, String> =
            until(Instant::now() + Duration::from_secs(5), b, "w", || {
                tries += 1;
                let t = tries;
                async move {
                    if t < 3 {
                        Err(format!("down {t}"))
                    } else {
                        Ok(t)
                    }
                }
            })
            .await;
        assert_eq!(landed, Ok(3));
        let lost: Result<u32, String> = until(
            Instant::now() + Duration::from_millis(20),
            b,
            "w",
            || async { Err("down".to_string()) },
        )
        .await;
        assert_eq!(lost, Err("down".into()));
    }
}
