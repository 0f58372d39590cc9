//! Trace context over HTTP: the runner call carries it out, a server continues it.
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument as _;

use crate::{TRACEPARENT, TRACESTATE, continue_from, current, enabled, link_remote};

/// Put the current span's trace context on an outgoing request's headers.
pub fn inject_http(headers: &mut HeaderMap) {
    let Some(cx) = current() else { return };
    if let Ok(v) = HeaderValue::from_str(&cx.traceparent) {
        headers.insert(TRACEPARENT, v);
    }
    if let Some(Ok(v)) = cx.tracestate.as_deref().map(HeaderValue::from_str) {
        headers.insert(TRACESTATE, v);
    }
}

/// Middleware (`axum::middleware::from_fn(server_span)`) for a service its callers are trusted
/// by (the runner, called by dispatch): each request runs in a server span named by its route
/// (`POST /run`, never the path with its ids), continuing the caller's trace when its request
/// carries one. A no-op while tracing is off.
pub async fn server_span(request: Request, next: Next) -> Response {
    spanned(request, next, Caller::Trusted).await
}

/// Middleware for the public edge (the gateway): each request is the root of a new trace and a
/// caller's `traceparent` is only linked. Continuing it would let anyone on the internet force
/// a trace to be kept (its sampled flag) or join their requests to someone else's trace.
pub async fn edge_span(request: Request, next: Next) -> Response {
    spanned(request, next, Caller::Anyone).await
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    Trusted,
    Anyone,
}

async fn spanned(request: Request, next: Next, caller: Caller) -> Response {
    if !enabled() {
        return next.run(request).await;
    }
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    {
        // A scope of its own: no borrow of the request (whose body is not Sync) lives across
        // the await below.
        let headers = request.headers();
        let header = |name| {
            headers
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        match caller {
            Caller::Trusted => continue_from(&span, header(TRACEPARENT), header(TRACESTATE)),
            Caller::Anyone => link_remote(&span, header(TRACEPARENT), header(TRACESTATE)),
        }
    }
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}
