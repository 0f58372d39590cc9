//! Logs (tracing) and metrics (Prometheus).
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Install the log subscriber once per process, and with `[telemetry] otlp_endpoint` set, the
/// export of the product's spans (`service` names this process in the traces, e.g.
/// `switchboard-dispatch`). `RUST_LOG` overrides the default `info` level; message bodies are
/// only logged at `debug`. Logs go to stderr: stdout is what the CLI's commands print (an API
/// key, a JSON listing) and must stay parseable at any log level. Keep the returned guard
/// until the process ends: dropping it sends the spans still buffered.
pub fn init(
    format: crate::config::LogFormat,
    telemetry: &switchboard_trace::TelemetryConfig,
    service: &str,
) -> Result<switchboard_trace::Traces, switchboard_trace::TraceError> {
    init_at(SERVICE_LOG_LEVELS, format, telemetry, service)
}

/// What a running service logs unless `RUST_LOG` says otherwise.
pub const SERVICE_LOG_LEVELS: &str = "info,sqlx=warn,async_nats=warn";

/// What a one-off command (`switchboard search`, `sessions list`, …) logs unless `RUST_LOG`
/// says otherwise: warnings and errors only, so its output is what it answered.
pub const COMMAND_LOG_LEVELS: &str = "warn";

/// [`init`] with `default_levels` in place of the service's (`RUST_LOG` still wins).
pub fn init_at(
    default_levels: &str,
    format: crate::config::LogFormat,
    telemetry: &switchboard_trace::TelemetryConfig,
    service: &str,
) -> Result<switchboard_trace::Traces, switchboard_trace::TraceError> {
    switchboard_trace::init(
        default_levels,
        format == crate::config::LogFormat::Json,
        telemetry,
        service,
    )
}

static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide Prometheus recorder (installed on first use).
pub fn metrics() -> &'static PrometheusHandle {
    METRICS.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
                &[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0,
                ],
            )
            .expect("valid buckets");
        match builder.install_recorder() {
            Ok(handle) => handle,
            // Another recorder is installed (e.g. several apps in one test process): keep a
            // detached one so /metrics still answers.
            Err(_) => PrometheusBuilder::new().build_recorder().handle(),
        }
    })
}
