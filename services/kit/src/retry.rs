//! Retry delays as data: one policy for every place that waits and tries again (the runtime's
//! failed messages, the session stage's waiting ones).
use std::time::Duration;

/// Exponential backoff from the attempt number: `base`, 2×`base`, 4×`base` … capped at `max`.
/// A pure function of the attempt, so a message's delay follows from its delivery count alone,
/// on whichever replica handles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self { base, max }
    }

    /// The delay before attempt `attempt + 1` (attempts count from 1).
    pub fn delay(&self, attempt: u64) -> Duration {
        let doublings = attempt.saturating_sub(1).min(20) as u32;
        self.base.saturating_mul(1 << doublings).min(self.max)
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
}
