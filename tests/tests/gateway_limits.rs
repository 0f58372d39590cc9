//! Slow or greedy clients cannot hold the gateway: stalled request heads are closed, trickling
//! bodies get 408, an over-long declared body gets 413 before any of it is read, connections
//! are capped without being dropped, and `/metrics` is not on the public port.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use switchboard_e2e::{TestApp, spawn_app_configured};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Far above the configured timeouts: only a gateway that never closes would hit it.
const BOUND: Duration = Duration::from_secs(15);

async fn app_with_short_timeouts(max_connections: usize) -> TestApp {
    spawn_app_configured(move |c| {
        c.gateway.header_timeout_ms = 500;
        c.gateway.request_timeout_ms = 1_000;
        c.gateway.max_connections = max_connections;
    })
    .await
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.gateway_url.trim_start_matches("http://"))
        .await
        .expect("gateway reachable")
}

/// Everything the server sends until it closes the connection (`None`: still open after
/// [`BOUND`]).
async fn try_read_until_closed(stream: &mut TcpStream) -> Option<String> {
    let mut out = Vec::new();
    tokio::time::timeout(BOUND, stream.read_to_end(&mut out))
        .await
        .ok()?
        .ok();
    Some(String::from_utf8_lossy(&out).into_owned())
}

async fn read_until_closed(stream: &mut TcpStream) -> String {
    try_read_until_closed(stream)
        .await
        .expect("the gateway closed the connection")
}

#[tokio::test]
async fn a_client_that_stalls_in_its_request_line_is_disconnected() {
    let app = app_with_short_timeouts(64).await;
    let mut half = connect(&app).await;
    half.write_all(b"POST /webhooks/twilio/sms HTT")
        .await
        .unwrap();
    let mut silent = connect(&app).await;
    // A whole request, answered, then nothing more on the kept-alive connection.
    let mut idle = connect(&app).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut headers_only = connect(&app).await;
    headers_only
        .write_all(b"POST /webhooks/twilio/sms HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        .await
        .unwrap();

    for (what, stream) in [
        ("half a request line", &mut half),
        ("nothing at all", &mut silent),
        ("half the headers", &mut headers_only),
        ("one request, then nothing", &mut idle),
    ] {
        let answer = try_read_until_closed(stream)
            .await
            .unwrap_or_else(|| panic!("a client that sent {what} is still connected"));
        assert!(
            answer.is_empty()
                || answer.starts_with("HTTP/1.1 408")
                || (what.starts_with("one request") && answer.starts_with("HTTP/1.1 200")),
            "a client that sent {what} got {answer:?}"
        );
    }
    app.assert_nothing_reached_the_pipeline().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_body_that_trickles_in_gets_408() {
    let app = app_with_short_timeouts(64).await;
    let mut slow = connect(&app).await;
    slow.write_all(
        b"POST /webhooks/twilio/sms HTTP/1.1\r\nHost: x\r\n\
          Content-Type: application/x-www-form-urlencoded\r\nX-Twilio-Signature: x\r\n\
          Content-Length: 100\r\n\r\nBody=only+a+few+bytes",
    )
    .await
    .unwrap();
    let answer = read_until_closed(&mut slow).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    app.assert_nothing_reached_the_pipeline().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_declared_body_over_the_limit_is_refused_before_it_is_sent() {
    let app = app_with_short_timeouts(64).await;
    let mut greedy = connect(&app).await;
    // 100 MB announced, not one byte of it sent: the answer must come anyway.
    greedy
        .write_all(
            b"POST /webhooks/twilio/sms HTTP/1.1\r\nHost: x\r\n\
              Content-Type: application/x-www-form-urlencoded\r\nX-Twilio-Signature: x\r\n\
              Content-Length: 100000000\r\n\r\n",
        )
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(BOUND, greedy.read(&mut buf))
        .await
        .expect("answered without reading the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
    assert!(answer.contains("body_too_large"), "{answer:?}");
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("reason=\"body_too_large\",provider=\"twilio\"} 1"),
        "counted"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn over_the_connection_cap_a_client_waits_and_is_then_served() {
    let app = app_with_short_timeouts(1).await;
    // The one connection allowed, held by a stalled client.
    let mut stalled = connect(&app).await;
    stalled.write_all(b"GET /heal").await.unwrap();
    // Give the gateway time to accept it before the second client connects.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let stalled_closed = Arc::new(AtomicBool::new(false));
    let mut waiting = connect(&app).await;
    waiting
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let closed = stalled_closed.clone();
    let served = tokio::spawn(async move {
        let answer = read_until_closed(&mut waiting).await;
        (answer, closed.load(Ordering::SeqCst))
    });
    read_until_closed(&mut stalled).await;
    stalled_closed.store(true, Ordering::SeqCst);

    let (answer, after_stalled_closed) = served.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(
        after_stalled_closed,
        "the second client was served while the only connection slot was held"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn metrics_are_served_on_the_admin_address_not_the_public_port() {
    let app = app_with_short_timeouts(64).await;
    let public = reqwest::get(format!("{}/metrics", app.gateway_url))
        .await
        .unwrap();
    assert_eq!(public.status(), 404);
    let health = reqwest::get(format!("{}/healthz", app.gateway_url))
        .await
        .unwrap();
    assert_eq!(
        health.status(),
        200,
        "load balancers still see the health check"
    );
    // Something to count first: a page of an idle process may hold no series yet.
    assert_eq!(app.post_twilio("Body=hi", None).await.status(), 403);
    let admin = reqwest::get(format!("{}/metrics", app.admin_url))
        .await
        .unwrap();
    assert_eq!(admin.status(), 200);
    let page = admin.text().await.unwrap();
    assert!(
        page.contains("sb_gateway_rejected_total{channel=\"sms\",reason=\"missing_signature\""),
        "the refusal is counted on the admin page:\n{page}"
    );
    app.shutdown().await;
}
