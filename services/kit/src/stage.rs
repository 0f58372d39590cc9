//! A stage, declared once: [`StageSpec`] says what it reads and how it runs; a
//! [`crate::startup::Registration`] adds how to start it. The product's list of registrations
//! (`switchboard::stages::ALL`) is what the topology, `switchboard up`, `switchboard worker`,
//! the per-stage configuration and the metrics all loop over.
use std::time::Duration;

use crate::config::RuntimeConfig;
pub use crate::config::StageOverrides;
use crate::retry::Backoff;

/// The stream a stage's durable consumer reads, and the subject filter within it (after the
/// subject prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A work subject, e.g. `turn.>`. The work stream keeps a message until every stage that
    /// reads its subject has acked it.
    Work(&'static str),
    /// A public event, e.g. `message.logged` (or `>` for all of them), read with a durable
    /// consumer of the stage's own. The events stream keeps events for
    /// `runtime.events_max_age_days` whoever reads them; a stage added later starts from the
    /// oldest event kept, so it catches up on history.
    Events(&'static str),
}

/// Everything the runtime and the topology need to know about a stage. Unset knobs fall back to
/// `[runtime]`; `[stages.<name>]` in the configuration overrides both.
#[derive(Debug, Clone, Copy)]
pub struct StageSpec {
    /// The durable consumer's name; also the stage's name in metrics, dedupe ids, dead-letter
    /// subjects (`{p}.dlq.<name>`) and `[stages.<name>]`.
    pub name: &'static str,
    pub reads: Source,
    /// A work subject earlier versions published this stage's input on, read beside `reads`
    /// so that nothing published there before an upgrade is stranded.
    pub also_reads: Option<&'static str>,
    /// Handler runs at once per process (a batch counts as one).
    pub concurrency: Option<usize>,
    /// Messages pulled per request; for a [`crate::BatchStage`], the most handled in one call.
    pub batch: Option<usize>,
    /// Deliveries (failures and crashes, never waits) before a dead letter.
    pub max_deliver: Option<u64>,
    /// Waiting before a dead letter ("waited too long for …").
    pub max_wait: Option<Duration>,
    /// Delay before a failed message is tried again.
    pub retry: Option<Backoff>,
    /// For a [`crate::BatchStage`] off the reply path: how long a batch may wait for more
    /// messages once its first is here (none: what one pull brought goes at once).
    pub linger: Option<Duration>,
}

impl StageSpec {
    /// A stage named `name` reading `reads`, every knob from `[runtime]`.
    pub const fn new(name: &'static str, reads: Source) -> Self {
        Self {
            name,
            reads,
            also_reads: None,
            concurrency: None,
            batch: None,
            max_deliver: None,
            max_wait: None,
            retry: None,
            linger: None,
        }
    }
    /// Read the work subject `old` too (see [`StageSpec::also_reads`]).
    pub const fn also_reading(mut self, old: &'static str) -> Self {
        self.also_reads = Some(old);
        self
    }
    pub const fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = Some(n);
        self
    }
    pub const fn batch(mut self, n: usize) -> Self {
        self.batch = Some(n);
        self
    }
    /// Let a batch wait up to `d` to fill (a stage that only records, whose outputs nobody
    /// waits for: fewer, larger transactions under load for at most `d` of delay).
    pub const fn linger(mut self, d: Duration) -> Self {
        self.linger = Some(d);
        self
    }
    pub const fn max_deliver(mut self, n: u64) -> Self {
        self.max_deliver = Some(n);
        self
    }
    pub const fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = Some(d);
        self
    }
    pub const fn retry(mut self, policy: Backoff) -> Self {
        self.retry = Some(policy);
        self
    }
}

/// A stage's knobs as it runs: its override, else its spec, else `[runtime]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageOptions {
    pub concurrency: usize,
    pub batch: usize,
    pub max_deliver: u64,
    pub max_wait: Duration,
    pub retry: Backoff,
    /// Zero: a batch never waits to fill.
    pub linger: Duration,
}

impl StageOptions {
    pub fn resolve(spec: &StageSpec, rt: &RuntimeConfig, o: Option<&StageOverrides>) -> Self {
        let o = o.cloned().unwrap_or_default();
        let default_retry = Backoff::new(
            Duration::from_millis(rt.retry_base_ms),
            Duration::from_millis(rt.retry_max_ms),
        );
        let spec_retry = spec.retry.unwrap_or(default_retry);
        Self {
            concurrency: o
                .concurrency
                .or(spec.concurrency)
                .unwrap_or(rt.concurrency)
                .max(1),
            batch: o.batch.or(spec.batch).unwrap_or(rt.batch).max(1),
            max_deliver: o
                .max_deliver
                .or(spec.max_deliver)
                .unwrap_or(rt.max_deliver)
                .max(1),
            max_wait: o
                .max_wait_ms
                .map(Duration::from_millis)
                .or(spec.max_wait)
                .unwrap_or(Duration::from_millis(rt.max_wait_ms)),
            retry: Backoff::new(
                o.retry_base_ms
                    .map(Duration::from_millis)
                    .unwrap_or(spec_retry.base),
                o.retry_max_ms
                    .map(Duration::from_millis)
                    .unwrap_or(spec_retry.max),
            ),
            // Never as long as ack_wait: a message waiting for its batch to fill has no progress
            // ack yet, and would come back to another process meanwhile (handled twice).
            linger: o
                .linger_ms
                .map(Duration::from_millis)
                .or(spec.linger)
                .unwrap_or_default()
                .min(Duration::from_millis(rt.ack_wait_ms) / 2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_override_beats_the_stage_which_beats_the_runtime_default() {
        let rt = RuntimeConfig {
            concurrency: 64,
            batch: 32,
            max_deliver: 8,
            retry_base_ms: 500,
            retry_max_ms: 60_000,
            ..Default::default()
        };
        let spec = StageSpec::new("dispatch", Source::Work("turn.>"))
            .concurrency(256)
            .retry(Backoff::new(
                Duration::from_secs(1),
                Duration::from_secs(10),
            ))
            .linger(Duration::from_millis(20));
        let plain = StageOptions::resolve(&spec, &rt, None);
        assert_eq!(plain.concurrency, 256);
        assert_eq!(plain.batch, 32);
        assert_eq!(plain.max_deliver, 8);
        assert_eq!(plain.retry.base, Duration::from_secs(1));
        assert_eq!(plain.linger, Duration::from_millis(20));
        // No stage lingers unless it says so.
        let unsaid = StageOptions::resolve(&StageSpec::new("x", Source::Work("reply")), &rt, None);
        assert_eq!(unsaid.linger, Duration::ZERO);

        let o = StageOverrides {
            concurrency: Some(12),
            max_deliver: Some(3),
            retry_max_ms: Some(2_000),
            linger_ms: Some(0),
            ..Default::default()
        };
        let tuned = StageOptions::resolve(&spec, &rt, Some(&o));
        assert_eq!(tuned.concurrency, 12);
        assert_eq!(tuned.max_deliver, 3);
        assert_eq!(tuned.retry.base, Duration::from_secs(1));
        assert_eq!(tuned.retry.max, Duration::from_secs(2));
        // An operator can turn a stage's linger off.
        assert_eq!(tuned.linger, Duration::ZERO);
    }

    #[test]
    fn a_batch_never_waits_to_fill_as_long_as_ack_wait() {
        // A message waiting for its batch has no progress ack yet: a linger of ack_wait would
        // hand it to another process meanwhile (traces.rs saw it logged twice).
        let rt = RuntimeConfig {
            ack_wait_ms: 2_000,
            ..Default::default()
        };
        let o = StageOverrides {
            linger_ms: Some(5_000),
            ..Default::default()
        };
        let spec = StageSpec::new("log-inbound", Source::Work("turn.>"));
        let capped = StageOptions::resolve(&spec, &rt, Some(&o));
        assert_eq!(capped.linger, Duration::from_secs(1));
    }

    #[test]
    fn a_misspelt_override_key_is_refused() {
        use figment::providers::{Format, Toml};
        let bad =
            figment::Figment::from(Toml::string("concurency = 3")).extract::<StageOverrides>();
        assert!(bad.is_err(), "{bad:?}");
    }
}
