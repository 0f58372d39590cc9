//! Serving HTTP with the limits a public port needs: a connection that does not send its
//! request head in time is closed, a request not answered in time gets 408, and at most
//! `max_connections` connections are served at once (more wait in the kernel's backlog).
//!
//! `axum::serve` sets none of these (tried from outside: 800 connections that sent half a
//! request line were all still open 65 s later), so the accept loop is our own, with hyper's
//! header read timeout and a graceful drain on shutdown.
//!
//! HTTP/1.1 only: hyper-util's auto builder also took HTTP/2 prior knowledge, where no header
//! timeout applies (a client that opened HTTP/2 and sent nothing held its slot for good). And
//! a connection keeps its slot for as long as anything it became lives: an upgraded socket
//! holds the [`ConnectionSlot`] its request carried, so sockets count against
//! `max_connections` too.
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{Request, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tower_http::timeout::TimeoutLayer;

use crate::config::GatewayConfig;
use crate::shutdown::Shutdown;

/// One of the `max_connections` slots, in every request's extensions: whatever outlives the
/// request (an upgraded WebSocket) keeps a clone so the slot stays taken until it ends.
#[derive(Clone, Debug)]
pub struct ConnectionSlot(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// The limits every HTTP port of a process is served with.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub header_timeout: Duration,
    pub request_timeout: Duration,
    pub max_connections: usize,
    /// How long in-flight requests may finish after shutdown begins.
    pub drain: Duration,
}

impl HttpLimits {
    pub fn from_config(gateway: &GatewayConfig, drain: Duration) -> Self {
        Self {
            header_timeout: Duration::from_millis(gateway.header_timeout_ms.max(1)),
            request_timeout: Duration::from_millis(gateway.request_timeout_ms.max(1)),
            max_connections: gateway.max_connections.max(1),
            drain,
        }
    }
}

/// Serve `router` on `listener` until `shutdown`, then let in-flight requests finish (for at
/// most `limits.drain`).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let router = router.layer(TimeoutLayer::with_status_code(
        StatusCode::REQUEST_TIMEOUT,
        limits.request_timeout,
    ));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    // Every connection task holds a sender; all of them gone means all connections ended.
    let (in_flight, mut all_ended) = mpsc::channel::<()>(1);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => permit?,
            _ = shutdown.wait() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.wait() => break,
        };
        let _ = stream.set_nodelay(true);
        let slot = ConnectionSlot(Arc::new(permit));
        let inner = TowerToHyperService::new(router.clone());
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(slot.clone());
            hyper::service::Service::call(&inner, request)
        });
        let builder = builder.clone();
        let header_timeout = limits.header_timeout;
        let shutdown = shutdown.clone();
        let in_flight = in_flight.clone();
        tokio::spawn(async move {
            // hyper's header timeout starts with the first byte: a client that connects and
            // sends nothing would hold its slot forever.
            let mut first = [0u8; 1];
            match tokio::time::timeout(header_timeout, stream.peek(&mut first)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
            let connection = builder
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                _ = shutdown.wait() => {
                    // Finish the request in flight, take no other.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(in_flight);
        });
    }
    drop(listener);
    drop(in_flight);
    if tokio::time::timeout(limits.drain, all_ended.recv())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after the drain time; closing them");
    }
    Ok(())
}
