//! Retry delays as data: one policy for every place that waits and tries again (the runtime's
//! failed messages, the session stage's waiting ones, a write that must not be lost).
use std::future::Future;
use std::time::{Duration, Instant};

/// Exponential backoff from the attempt number: `base`, 2×`base`, 4×`base` … capped at `max`.
/// A pure function of the attempt, so a message's delay follows from its delivery count alone,
/// on whichever replica handles it.
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
                tokio::time::sleep(backoff.delay(attempt)).await;
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
