//! A generic webhook source's side: its signing (HMAC-SHA256 written out from its definition)
//! and its callback receiver, a real HTTP server that checks each request's signature.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

use crate::serve::{Failures, serve};

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
    pub body: serde_json::Value,
    /// `X-Switchboard-Delivery`.
    pub delivery: String,
    /// `X-Switchboard-Timestamp`, as unix seconds.
    pub timestamp: i64,
    /// Whether the signature was right for this secret, timestamp and body.
    pub signed: bool,
    /// What the receiver answered.
    pub status: u16,
}

/// A generic webhook source's callback receiver, as a source would write one: a real HTTP
/// server at `url` that checks each request's signature with its own HMAC code (401 when it is
/// wrong), answers failures on demand, and records every request it got.
#[derive(Clone)]
pub struct FakeCallbackReceiver {
    pub url: String,
    secret: String,
    requests: Arc<Mutex<Vec<CallbackRequest>>>,
    pub failures: Failures,
}

impl FakeCallbackReceiver {
    pub async fn start(secret: &str) -> Self {
        let mut this = Self {
            url: String::new(),
            secret: secret.into(),
            requests: Default::default(),
            failures: Default::default(),
        };
        let router = Router::new()
            .route("/callback", post(Self::receive))
            .with_state(this.clone());
        this.url = format!("{}/callback", serve(router).await);
        this
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

    async fn receive(
        State(s): State<FakeCallbackReceiver>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> StatusCode {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let timestamp = header("x-switchboard-timestamp");
        let signed = header("x-switchboard-signature")
            == webhook_signature(&s.secret, &timestamp, &body)
            && header("content-type") == "application/json";
        let status = if !signed {
            StatusCode::UNAUTHORIZED
        } else {
            s.failures.take().unwrap_or(StatusCode::OK)
        };
        s.requests.lock().unwrap().push(CallbackRequest {
            body: serde_json::from_slice(&body).unwrap_or_default(),
            delivery: header("x-switchboard-delivery"),
            timestamp: timestamp.parse().unwrap_or_default(),
            signed,
            status: status.as_u16(),
        });
        status
    }
}
