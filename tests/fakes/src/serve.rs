//! What every fake shares: a loopback server, and failures answered on demand.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::StatusCode;

/// Serve `router` on a free loopback port (below the ephemeral range); its base URL.
pub async fn serve(router: Router) -> String {
    let listener = switchboard_kit::net::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port for a fake");
    let url = format!("http://{}", listener.local_addr().expect("a bound address"));
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// Failures a fake answers on demand: the next `n` requests get HTTP `status`.
#[derive(Clone, Default)]
pub struct Failures {
    next: Arc<AtomicUsize>,
    status: Arc<Mutex<u16>>,
}

impl Failures {
    pub fn fail_next(&self, n: usize, status: u16) {
        *self.status.lock().unwrap() = status;
        self.next.store(n, Ordering::SeqCst);
    }

    /// The status to fail this request with, if one of the next `n` is due.
    pub(crate) fn take(&self) -> Option<StatusCode> {
        self.next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()?;
        StatusCode::from_u16(*self.status.lock().unwrap()).ok()
    }
}

/// A request header as text ("" when absent or not text).
pub(crate) fn header<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}
