//! Latency percentiles, the unanswered messages included (as slower than any answered one).
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::BEYOND_WINDOW;

/// One latency percentile.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Quantile {
    /// Milliseconds.
    Ms(f64),
    /// Falls on a message that was never answered: longer than the run waited.
    BeyondWindow,
    /// No message was measured.
    #[default]
    NoData,
}

impl Quantile {
    /// At most `limit_ms` (an unanswered or missing value never is).
    pub fn at_most(self, limit_ms: f64) -> bool {
        matches!(self, Quantile::Ms(v) if v <= limit_ms)
    }
}

impl fmt::Display for Quantile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quantile::Ms(v) => write!(f, "{v:.2} ms"),
            Quantile::BeyondWindow => f.write_str(BEYOND_WINDOW),
            Quantile::NoData => f.write_str("no data"),
        }
    }
}

impl Serialize for Quantile {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Quantile::Ms(v) => s.serialize_f64(*v),
            Quantile::BeyondWindow => s.serialize_str(BEYOND_WINDOW),
            Quantile::NoData => s.serialize_none(),
        }
    }
}

impl<'de> Deserialize<'de> for Quantile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Ms(f64),
            Text(String),
        }
        match Option::<Raw>::deserialize(d)? {
            None => Ok(Quantile::NoData),
            Some(Raw::Ms(v)) => Ok(Quantile::Ms(v)),
            Some(Raw::Text(t)) if t == BEYOND_WINDOW => Ok(Quantile::BeyondWindow),
            Some(Raw::Text(t)) => Err(serde::de::Error::custom(format!(
                "a latency is milliseconds or {BEYOND_WINDOW:?}, not {t:?}"
            ))),
        }
    }
}

/// Latency percentiles over answered and unanswered messages.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Overhead {
    pub answered: u64,
    pub unanswered: u64,
    /// Mean of the answered ones only (unanswered have no value).
    pub mean_answered_ms: Option<f64>,
    pub p50: Quantile,
    pub p95: Quantile,
    pub p99: Quantile,
    pub p999: Quantile,
    pub max: Quantile,
}

impl fmt::Display for Overhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p50 {} p95 {} p99 {} p99.9 {} max {} (n={}, {} of them unanswered)",
            self.p50,
            self.p95,
            self.p99,
            self.p999,
            self.max,
            self.answered + self.unanswered,
            self.unanswered
        )
    }
}

/// Percentiles (nearest rank) of `answered_us` latencies together with `unanswered` messages
/// counted as slower than all of them.
pub fn overhead(answered_us: &[u64], unanswered: u64) -> Overhead {
    let mut v = answered_us.to_vec();
    v.sort_unstable();
    let n = v.len() as u64 + unanswered;
    let q = |q: f64| -> Quantile {
        if n == 0 {
            return Quantile::NoData;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        match v.get(rank as usize - 1) {
            Some(us) => Quantile::Ms(*us as f64 / 1000.0),
            None => Quantile::BeyondWindow,
        }
    };
    Overhead {
        answered: v.len() as u64,
        unanswered,
        mean_answered_ms: (!v.is_empty())
            .then(|| v.iter().map(|x| *x as f64).sum::<f64>() / v.len() as f64 / 1000.0),
        p50: q(0.50),
        p95: q(0.95),
        p99: q(0.99),
        p999: q(0.999),
        max: q(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_count_unanswered_as_beyond_the_window() {
        // 40 answered in 1 ms, 60 never answered: the median is an unanswered message.
        let o = overhead(&[1_000; 40], 60);
        assert_eq!(o.p50, Quantile::BeyondWindow);
        assert_eq!(o.p50.to_string(), "> window");
        assert_eq!(o.max, Quantile::BeyondWindow);
        assert_eq!(o.answered, 40);
        assert_eq!(o.mean_answered_ms, Some(1.0));
        assert!(!o.p50.at_most(1e12));
        // 60 answered: the median is answered, the p99 is not.
        let o = overhead(&[1_000; 60], 40);
        assert_eq!(o.p50, Quantile::Ms(1.0));
        assert_eq!(o.p99, Quantile::BeyondWindow);
        // All answered: nearest rank.
        let v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let o = overhead(&v, 0);
        assert_eq!(o.p50, Quantile::Ms(50.0));
        assert_eq!(o.p99, Quantile::Ms(99.0));
        assert_eq!(o.max, Quantile::Ms(100.0));
        assert_eq!(overhead(&[], 0).p50, Quantile::NoData);
        // Round trip through JSON, "> window" included.
        let o = overhead(&[1_000; 40], 60);
        let json = serde_json::to_string(&o).unwrap();
        assert!(json.contains("\"p50\":\"> window\""), "{json}");
        assert_eq!(serde_json::from_str::<Overhead>(&json).unwrap(), o);
    }
}
