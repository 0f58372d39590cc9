//! Every worker process: `[runtime]` (the worker runtime's knobs) and `[admin]` (where it serves
//! `/healthz`, `/readyz` and `/metrics`).
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct RuntimeConfig {
    /// Messages pulled per request.
    pub batch: usize,
    /// Messages handled at once per stage and process.
    pub concurrency: usize,
    /// How long the server waits for an ack before redelivering. In-flight work sends progress
    /// acks, so this bounds only how soon a dead process's work comes back.
    pub ack_wait_ms: u64,
    /// Deliveries after which a failing message is dead-lettered. Counts handler errors and
    /// crashes (a message whose worker died comes back as a new delivery); waiting does not.
    pub max_deliver: u64,
    /// How long a message may wait (for its predecessor, a lease, another worker) in a
    /// running process before it is dead-lettered as "waited too long". Keep it above the
    /// longest agent `timeout_s`: a turn waits for the call before it.
    pub max_wait_ms: u64,
    /// Retry delay after the first failure; doubles each time up to `retry_max_ms`.
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// How long SIGTERM waits for in-flight work before exiting.
    pub shutdown_grace_ms: u64,
    /// Number of turn partitions (`sb.turn.<n>`).
    pub turn_partitions: u32,
    /// JetStream dedupe window.
    pub duplicate_window_s: u64,
    /// Events stream retention.
    pub events_max_age_days: u64,
    /// Unacked messages a stage's consumer hands out across all its replicas. Must cover the
    /// replicas' combined concurrency (dispatch: turns waiting on runners).
    pub max_ack_pending: i64,
    /// A sender's arrival counter is forgotten after this many idle days; their next message
    /// starts a new epoch.
    pub arrival_counter_idle_days: u64,
    /// Postgres connections per process; 0 means `concurrency`, between 4 and 8. More only
    /// add contention on a small database host (bench, 2 cores: 8 per process ran as fast as
    /// 32 with 40% of Postgres's memory).
    pub db_pool_size: u32,
    /// Copies of every stream (and so of its consumers and the arrivals bucket) a NATS cluster
    /// keeps: 1 on a single server; 3 on a three-node cluster, so that a node can be lost
    /// without losing an acknowledged message or stopping. `streams apply` (and every process
    /// at start) changes an existing stream to it.
    pub stream_replicas: usize,
}

impl RuntimeConfig {
    /// Postgres connections per process: `db_pool_size`, or 0 for `concurrency` between 4
    /// and 8.
    pub fn pool_size(&self) -> u32 {
        match self.db_pool_size {
            0 => (self.concurrency as u32).clamp(4, 8),
            n => n,
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            batch: 64,
            concurrency: 64,
            ack_wait_ms: 30_000,
            max_deliver: 8,
            max_wait_ms: 3_600_000,
            retry_base_ms: 500,
            retry_max_ms: 60_000,
            shutdown_grace_ms: 20_000,
            turn_partitions: 32,
            duplicate_window_s: 600,
            events_max_age_days: 7,
            max_ack_pending: 20_000,
            arrival_counter_idle_days: 7,
            db_pool_size: 0,
            stream_replicas: 1,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct AdminConfig {
    /// Where a worker process serves `/healthz`, `/readyz` and `/metrics`. Port 0 picks a free
    /// port below the ephemeral range (`net::FREE_PORTS`, logged at start); the gateway and `switchboard up` serve them on the gateway port too.
    pub http_addr: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            http_addr: "127.0.0.1:0".into(),
        }
    }
}

/// `[stages.<name>]`: an operator's override of one stage's knobs.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct StageOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_deliver: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_base_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_max_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linger_ms: Option<u64>,
}
