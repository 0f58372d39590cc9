//! Serving HTTP with the limits a public port needs: a connection that does not send its
//! request head in time is closed, a request not answered in time gets 408, and at most
//! `max_connections` connections are served at once (more wait in the kernel's backlog).
//!
//! `axum::serve` sets none of these (tried from outside: 800 connections that sent half a
//! request line were all still open 65 s later), so the accept loop is hyper-util's, with
//! hyper's header read timeout and a graceful drain on shutdown.
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::TimeoutLayer;

use crate::config::GatewayConfig;
use crate::shutdown::Shutdown;

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
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
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
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            // hyper's header timeout starts with the first byte: a client that connects and
            // sends nothing would hold its slot forever.
            let mut first = [0u8; 1];
            match tokio::time::timeout(header_timeout, stream.peek(&mut first)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after the drain time; closing them");
    }
    Ok(())
}
