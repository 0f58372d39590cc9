//! One trace per turn: spans exported over OTLP, joined across processes by W3C trace context.
//!
//! Off by default. With `[telemetry] otlp_endpoint` set, every process (gateway, each worker,
//! the runner on an agent host) exports its spans to that collector, and the trace context
//! travels with the work: in the `traceparent`/`tracestate` headers of each NATS message a stage
//! publishes, of each runner call, and of each HTTP request that brings one in. A turn is then
//! one trace from the gateway's request to the provider's send, whichever processes ran it.
//!
//! Nothing here knows NATS: a caller hands over or asks for the two header values
//! ([`current`], [`continue_from`]); HTTP gets its helpers ([`inject_http`], [`server_span`]).
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use serde::{Deserialize, Serialize};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, Registry};

mod http_spans;
pub use http_spans::{edge_span, inject_http, server_span};

/// The W3C header carrying the trace and parent span ids.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header carrying vendors' trace state.
pub const TRACESTATE: &str = "tracestate";

/// `[telemetry]`: where spans go. Environment: `SB_TELEMETRY__OTLP_ENDPOINT`, ….
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL, e.g. `http://otel-collector:4318`; spans are posted
    /// (protobuf) to `<base>/v1/traces`. Unset: no spans leave the process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// The share of new traces kept, 0.0 to 1.0. A trace begun elsewhere keeps its sender's
    /// choice (the sampled flag of its `traceparent`), so a turn is never kept in part.
    pub sampling_ratio: f64,
    /// Seconds one export to the collector may take before it is dropped.
    pub export_timeout_s: u64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            sampling_ratio: 1.0,
            export_timeout_s: 10,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("telemetry.sampling_ratio must be between 0.0 and 1.0, not {0}")]
    SamplingRatio(f64),
    #[error("telemetry.otlp_endpoint {endpoint:?}: {reason}")]
    Exporter { endpoint: String, reason: String },
}

static EXPORTING: AtomicBool = AtomicBool::new(false);
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether this process exports spans (so trace context is worth reading and writing).
pub fn enabled() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Flushes spans at drop (end of `main`), so a process that stops sends what it recorded.
#[must_use = "spans are flushed when this is dropped; keep it until the process ends"]
pub struct Traces {
    provider: Option<SdkTracerProvider>,
}

impl Traces {
    /// Send every finished span now (tests; a process about to exit).
    pub fn flush(&self) {
        if let Some(p) = &self.provider {
            let _ = p.force_flush();
        }
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown_with_timeout(Duration::from_secs(5));
        }
    }
}

/// Send every finished span of this process now, wherever its [`Traces`] is.
pub fn flush() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.force_flush();
    }
}

/// Install the process's subscriber once: logs to stderr (`RUST_LOG` overrides
/// `default_filter`; JSON lines when `json`), and with an endpoint configured, the
/// product's spans (`switchboard*` targets, info and up, whatever the log level) to OTLP.
/// A second call in one process (several apps in one test) keeps the first subscriber.
pub fn init(
    default_filter: &str,
    json: bool,
    config: &TelemetryConfig,
    service: &str,
) -> Result<Traces, TraceError> {
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = Vec::with_capacity(2);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    layers.push(if json {
        fmt.json().with_filter(env).boxed()
    } else {
        fmt.with_filter(env).boxed()
    });
    let provider = match &config.otlp_endpoint {
        Some(endpoint) if !endpoint.trim().is_empty() => Some(provider(endpoint, config, service)?),
        _ => None,
    };
    if let Some(p) = &provider {
        let ours = Targets::new()
            .with_target("switchboard", LevelFilter::INFO)
            .with_default(LevelFilter::OFF);
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer("switchboard"))
                .with_filter(ours)
                .boxed(),
        );
    }
    if tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .is_err()
    {
        // Someone else's subscriber is in place: our spans would not reach this provider.
        return Ok(Traces { provider: None });
    }
    if let Some(p) = &provider {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let _ = PROVIDER.set(p.clone());
        EXPORTING.store(true, Ordering::Relaxed);
    }
    Ok(Traces { provider })
}

fn provider(
    endpoint: &str,
    config: &TelemetryConfig,
    service: &str,
) -> Result<SdkTracerProvider, TraceError> {
    if !(0.0..=1.0).contains(&config.sampling_ratio) {
        return Err(TraceError::SamplingRatio(config.sampling_ratio));
    }
    let base = endpoint.trim().trim_end_matches('/');
    let url = if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .with_timeout(Duration::from_secs(config.export_timeout_s.max(1)))
        .build()
        .map_err(|e| TraceError::Exporter {
            endpoint: endpoint.to_string(),
            reason: e.to_string(),
        })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            config.sampling_ratio,
        ))))
        .with_resource(
            Resource::builder()
                .with_service_name(service.to_string())
                .build(),
        )
        .build())
}

/// The current span's trace context as its two W3C headers, when this process exports spans
/// and the current span is part of a trace.
pub fn current() -> Option<TraceHeaders> {
    if !enabled() {
        return None;
    }
    let cx = tracing::Span::current().context();
    let mut headers = TraceHeaders::default();
    TraceContextPropagator::new().inject_context(&cx, &mut headers);
    (!headers.traceparent.is_empty()).then_some(headers)
}

/// `span` continues the trace its input came with (a message's or a request's headers).
/// Call it right after creating the span, before it is entered: a started span keeps its
/// parent. Nothing happens when tracing is off or the headers carry no valid context.
pub fn continue_from(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    if let Some(cx) = remote_context(traceparent, tracestate) {
        let _ = span.set_parent(cx);
    }
}

/// `span` begins a trace of its own and links to the context the headers carry (an untrusted
/// caller's: see [`edge_span`]).
pub fn link_remote(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    if let Some(cx) = remote_context(traceparent, tracestate) {
        use opentelemetry::trace::TraceContextExt as _;
        span.add_link(cx.span().span_context().clone());
    }
}

/// The valid context two W3C headers carry, while tracing is on.
fn remote_context(
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> Option<opentelemetry::Context> {
    let traceparent = traceparent.filter(|_| enabled())?;
    let carrier = TraceHeaders {
        traceparent: traceparent.to_string(),
        tracestate: tracestate.map(str::to_string),
    };
    let cx = TraceContextPropagator::new().extract(&carrier);
    use opentelemetry::trace::TraceContextExt as _;
    cx.span().span_context().is_valid().then_some(cx)
}

/// `span` (a batch's) points at the trace of each message it handles: one batch serves many
/// turns, and each turn's trace shows the batch through this link.
pub fn link_to(span: &tracing::Span, message_span: &tracing::Span) {
    if !enabled() {
        return;
    }
    use opentelemetry::trace::TraceContextExt as _;
    let cx = message_span.context();
    span.add_link(cx.span().span_context().clone());
}

/// Record the session a stage's work belongs to on the current span (`session_id`).
pub fn record_session(session_id: impl std::fmt::Display) {
    record("session_id", session_id);
}

/// Set an attribute of the current span in the exported trace (a value known only once the
/// work is under way, e.g. the correlation id a request was given). Formatted only while
/// tracing is on: it is called for every message.
pub fn record(key: &'static str, value: impl std::fmt::Display) {
    if enabled() {
        tracing::Span::current().set_attribute(key, value.to_string());
    }
}

/// A trace context as the two W3C headers carry it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

impl Injector for TraceHeaders {
    fn set(&mut self, key: &str, value: String) {
        match key {
            TRACEPARENT => self.traceparent = value,
            TRACESTATE if !value.is_empty() => self.tracestate = Some(value),
            _ => {}
        }
    }
}

impl Extractor for TraceHeaders {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => Some(&self.traceparent),
            TRACESTATE => self.tracestate.as_deref(),
            _ => None,
        }
    }
    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_through_the_w3c_propagator() {
        let given = TraceHeaders {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: Some("vendor=1".into()),
        };
        let cx = TraceContextPropagator::new().extract(&given);
        let mut back = TraceHeaders::default();
        TraceContextPropagator::new().inject_context(&cx, &mut back);
        assert_eq!(back, given);
    }

    #[test]
    fn a_sampling_ratio_out_of_range_is_refused() {
        let config = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:4318".into()),
            sampling_ratio: 1.5,
            ..Default::default()
        };
        let err = provider("http://127.0.0.1:4318", &config, "test").unwrap_err();
        assert!(err.to_string().contains("between 0.0 and 1.0"), "{err}");
    }
}
