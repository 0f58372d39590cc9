//! The shared kit every Switchboard process is built from.
//!
//! - [`config`]: one TOML file plus `SB_…` environment overrides.
//! - [`topology`]: every stream, subject and consumer of the data path, in one place.
//! - [`arrival`]: per-sender arrival numbers (the order a person wrote in).
//! - [`proto`]: the protobuf payloads (`proto/switchboard/v1`).
//! - [`db`]: the Postgres pool and embedded migrations.
//! - [`failpoint`]: where a test may kill a process mid-step.
//! - [`endpoint`]: connection URLs: their credentials to the NATS client, redacted in logs.
//! - [`retry`]: the one retry-delay policy.
//! - [`net`]: listening sockets, below the ephemeral port range; [`http`]: serving them with
//!   header and request timeouts and a connection cap.
//! - [`stage`]: a stage's declaration, read by everything that loops over stages.
//! - [`runtime`]: the worker runtime (fetch, handle, publish, ack, retry, dead-letter); [`settle`]:
//!   the outcomes it counts, why it gives a message up, its dead letters' ids.
//! - [`telemetry`] and [`admin`]: logs, metrics, `/healthz`, `/readyz`, `/metrics`.
//! - [`startup`]: wiring a process together; [`shutdown`]: the drain signal.
//! - [`status`]: the states turns and deliveries move through.
//! - [`turn_token`]: the short-lived token a runner call carries, scoped to its turn's person.

pub mod address;
pub mod admin;
pub mod arrival;
pub mod coalesce;
pub mod config;
pub mod db;
pub mod dlq;
pub mod endpoint;
pub mod exports;
pub mod failpoint;
pub mod file_names;
pub mod forgotten;
pub mod http;
pub mod lifecycle;
pub mod net;
pub mod ops_status;
pub mod proto;
pub mod receipts;
pub mod retention;
pub mod retry;
pub mod runtime;
pub mod sessions;
pub mod settle;
pub mod shutdown;
pub mod snapshot;
pub mod stage;
pub mod startup;
pub mod status;
pub mod takeovers;
pub mod telemetry;
pub mod topology;
pub mod turn_token;
pub mod wakeups;
pub mod workspace;
pub mod workspace_fs;

pub use config::Config;
/// `config::memory` under the name it had before `config` became a folder.
pub use config::memory as memory_config;
pub use runtime::{Attempt, BatchStage, Hold, Outcome, Output, Stage, StageError, Wake};
pub use settle::{GiveUp, MessageOutcome};
pub use shutdown::Shutdown;
pub use stage::{Source, StageOptions, StageSpec};
pub use startup::Registration;
/// One trace per turn: OTLP export and W3C trace context (`services/trace`).
pub use switchboard_trace as trace;
pub use topology::Topology;

/// This process among the replicas: `<host>:<pid>`. It names the process in the logs and in
/// what it sends to providers (the deliverer's `User-Agent`), so an operator, or a chaos run, can
/// tell which replica did what.
pub fn instance_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|| "localhost".into());
        format!("{host}:{}", std::process::id())
    })
}

/// Milliseconds since the Unix epoch, the time unit of every payload.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
