//! An OpenTelemetry collector's OTLP/HTTP trace receiver: `POST /v1/traces` with a protobuf
//! `ExportTraceServiceRequest` (the protocol's own messages decode it), answered with an
//! `ExportTraceServiceResponse` as a collector does. Every span is kept, with the service
//! that sent it, for a test to check the shape of a trace.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;

use crate::serve;

/// One span as the collector received it (ids in lowercase hex, as `traceparent` writes them).
#[derive(Debug, Clone, PartialEq)]
pub struct CollectedSpan {
    /// The `service.name` of the process that sent it.
    pub service: String,
    pub name: String,
    pub kind: SpanKind,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a trace's root.
    pub parent_span_id: String,
    /// String, integer and boolean attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// `(trace_id, span_id)` of each linked span.
    pub links: Vec<(String, String)>,
}

impl CollectedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Clone, Default)]
pub struct FakeCollector {
    /// The base URL, as `[telemetry] otlp_endpoint` takes it.
    pub url: String,
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
}

impl FakeCollector {
    pub async fn start() -> Self {
        let mut this = Self::default();
        let router = Router::new()
            .route("/v1/traces", post(export))
            .with_state(this.spans.clone());
        this.url = serve(router).await;
        this
    }

    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Wait until `check` holds for the spans received, or `timeout` passes; the spans then.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        check: impl Fn(&[CollectedSpan]) -> bool,
    ) -> Vec<CollectedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if check(&spans) || Instant::now() >= deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn export(
    State(spans): State<Arc<Mutex<Vec<CollectedSpan>>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let protobuf = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/x-protobuf"));
    if !protobuf {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "this receiver takes application/x-protobuf",
        )
            .into_response();
    }
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .and_then(|a| text(a.value.as_ref()))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(CollectedSpan {
                    service: service.clone(),
                    kind: SpanKind::try_from(span.kind).unwrap_or(SpanKind::Unspecified),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                });
            }
        }
    }
    spans.lock().unwrap().extend(received);
    (
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .filter_map(|kv| Some((kv.key.clone(), text(kv.value.as_ref())?)))
        .collect()
}

fn text(value: Option<&AnyValue>) -> Option<String> {
    Some(match value?.value.as_ref()? {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        any_value::Value::DoubleValue(d) => d.to_string(),
        _ => return None,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
