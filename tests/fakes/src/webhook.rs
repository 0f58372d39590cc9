//! A generic webhook source's side: its signing (HMAC-SHA256 written out from its definition)
//! and its callback receiver, a real HTTP server that checks each request's signature.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use chrono::{DateTime, Utc};

use crate::serve::{Failures, header, serve};

/// HMAC-SHA256 written out from its definition (RFC 2104) over SHA-256, independent of the
/// product's `hmac` crate use, so a test that signs with it checks the product's signing
/// against a second implementation.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner = Sha256::new()
        .chain_update(block.map(|b| b ^ 0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(block.map(|b| b ^ 0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// `X-Switchboard-Signature` for `body` at `timestamp`, as a source computes it.
pub fn webhook_signature(secret: &str, timestamp: &str, body: &[u8]) -> String {
    let message = [timestamp.as_bytes(), b".", body].concat();
    let hex: String = hmac_sha256(secret.as_bytes(), &message)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

/// One request a callback receiver got.
#[derive(Debug, Clone)]
pub struct CallbackRequest {
    /// The source it was for (the receiver's path; empty at `/callback`).
    pub source: String,
    pub body: serde_json::Value,
    /// `X-Switchboard-Delivery`.
    pub delivery: String,
    /// `X-Switchboard-Timestamp`, as unix seconds.
    pub timestamp: i64,
    /// Whether the signature was right for this secret, timestamp and body.
    pub signed: bool,
    /// What the receiver answered.
    pub status: u16,
    /// When it came.
    pub received: DateTime<Utc>,
}

/// A generic webhook source's callback receiver, as a source would write one: a real HTTP
/// server that checks each request's signature with its own HMAC code (401 when it is wrong or,
/// with a window, too old), answers failures on demand, and records every request it got. One
/// source's secret at `/callback` ([`Self::start`]), or several by name at `/{source}`
/// ([`Self::of_sources`], mounted where the demo wants them).
#[derive(Clone)]
pub struct FakeCallbackReceiver {
    /// The callback URL to configure (`…/callback`); empty for a receiver only mounted in
    /// another server's router.
    pub url: String,
    /// Each source's secret and, when set, its window (a timestamp further than that from now
    /// is refused); `""` is the source at `/callback`.
    sources: Arc<BTreeMap<String, (String, Option<u64>)>>,
    requests: Arc<Mutex<Vec<CallbackRequest>>>,
    pub failures: Failures,
}

impl FakeCallbackReceiver {
    /// One source's receiver at `<url>/callback`, on a port of its own.
    pub async fn start(secret: &str) -> Self {
        let mut this = Self::of_sources([(String::new(), secret.to_string(), None)]);
        this.url = format!("{}/callback", serve(this.router()).await);
        this
    }

    /// A receiver of several sources' callbacks, each at `/{source}` with its secret and its
    /// timestamp window (seconds either side of now), when it has one.
    pub fn of_sources(sources: impl IntoIterator<Item = (String, String, Option<u64>)>) -> Self {
        Self {
            url: String::new(),
            sources: Arc::new(
                sources
                    .into_iter()
                    .map(|(name, secret, window)| (name, (secret, window)))
                    .collect(),
            ),
            requests: Arc::default(),
            failures: Failures::default(),
        }
    }

    /// Its routes: `/callback` and `/{source}`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/callback", post(Self::receive_default))
            .route("/{source}", post(Self::receive_source))
            .with_state(self.clone())
    }

    /// Every request, in the order they came.
    pub fn requests(&self) -> Vec<CallbackRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// The requests it took (answered 2xx).
    pub fn accepted(&self) -> Vec<CallbackRequest> {
        self.requests()
            .into_iter()
            .filter(|r| (200..300).contains(&r.status))
            .collect()
    }

    /// Wait until it has taken at least `n` callbacks.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<CallbackRequest> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let accepted = self.accepted();
            if accepted.len() >= n {
                return accepted;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "expected {n} callbacks within {timeout:?}, got {:?}",
                self.requests()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn receive_default(
        State(s): State<FakeCallbackReceiver>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> StatusCode {
        s.receive(String::new(), &headers, &body)
    }

    async fn receive_source(
        State(s): State<FakeCallbackReceiver>,
        Path(source): Path<String>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> StatusCode {
        s.receive(source, &headers, &body)
    }

    fn receive(&self, source: String, headers: &HeaderMap, body: &[u8]) -> StatusCode {
        let Some((secret, window)) = self.sources.get(&source) else {
            return StatusCode::NOT_FOUND;
        };
        let timestamp = header(headers, "x-switchboard-timestamp");
        let received = Utc::now();
        let fresh = match (*window, timestamp.parse::<i64>()) {
            (None, _) => true,
            (Some(window), Ok(at)) => received.timestamp().abs_diff(at) <= window,
            (Some(_), Err(_)) => false,
        };
        let signed = header(headers, "x-switchboard-signature")
            == webhook_signature(secret, timestamp, body)
            && header(headers, "content-type") == "application/json";
        let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        let status = if !signed || !fresh {
            StatusCode::UNAUTHORIZED
        } else if parsed.is_none() {
            StatusCode::BAD_REQUEST
        } else {
            self.failures.take().unwrap_or(StatusCode::OK)
        };
        self.requests.lock().unwrap().push(CallbackRequest {
            source,
            body: parsed.unwrap_or_default(),
            delivery: header(headers, "x-switchboard-delivery").to_string(),
            timestamp: timestamp.parse().unwrap_or_default(),
            signed,
            status: status.as_u16(),
            received,
        });
        status
    }
}
