//! Slow or greedy clients cannot hold the gateway: stalled request heads are closed, trickling
//! bodies get 408, an over-long declared body gets 413 before any of it is read, connections
//! are capped without being dropped (chat sockets included, and a few per user), HTTP/2 is not
//! served, a WebSocket frame is bounded like a message, and `/metrics` is not on the public
//! port. Each close comes once its configured limit has passed, not before, and soon after (see
//! [`at_most`]).
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use switchboard_e2e::{ChatClient, TestApp, spawn_app_configured};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `gateway.header_timeout_ms` of these tests: a request head must be in by then.
const HEADER_LIMIT: Duration = Duration::from_millis(500);
/// `gateway.request_timeout_ms` of these tests: a request must be answered by then.
const REQUEST_LIMIT: Duration = Duration::from_millis(1_000);

/// The longest a client may be kept past a limit: three times the limit (a loaded 2-core
/// machine runs timers late) plus a second for connecting and scheduling.
fn at_most(limit: Duration) -> Duration {
    limit * 3 + Duration::from_secs(1)
}

async fn app_with_short_timeouts(max_connections: usize) -> TestApp {
    spawn_app_configured(move |c| {
        c.gateway.header_timeout_ms = HEADER_LIMIT.as_millis() as u64;
        c.gateway.request_timeout_ms = REQUEST_LIMIT.as_millis() as u64;
        c.gateway.max_connections = max_connections;
    })
    .await
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.gateway_url.trim_start_matches("http://"))
        .await
        .expect("gateway reachable")
}

/// A client's connection and when it started (just before it connected: no server timer of
/// it can have started earlier).
struct Client {
    stream: TcpStream,
    started: Instant,
}

async fn client(app: &TestApp) -> Client {
    let started = Instant::now();
    Client {
        stream: connect(app).await,
        started,
    }
}

/// Everything the server sent until it closed the connection, and how long after the client
/// started that was; `None` if it was still open [`at_most`] `limit` after the start.
async fn try_read_until_closed(c: &mut Client, limit: Duration) -> Option<(String, Duration)> {
    let mut out = Vec::new();
    tokio::time::timeout_at(
        (c.started + at_most(limit)).into(),
        c.stream.read_to_end(&mut out),
    )
    .await
    .ok()?
    .ok();
    Some((
        String::from_utf8_lossy(&out).into_owned(),
        c.started.elapsed(),
    ))
}

/// What the server sent before it closed the connection, which it did past `limit` (not
/// before: the limit is the client's to use) and within [`at_most`] `limit`.
async fn closed_after(c: &mut Client, limit: Duration, what: &str) -> String {
    let (answer, after) = try_read_until_closed(c, limit).await.unwrap_or_else(|| {
        panic!(
            "a client that {what} is still connected {:?} after it connected (limit {limit:?})",
            at_most(limit)
        )
    });
    assert!(
        after >= limit,
        "a client that {what} was closed after {after:?}, before its limit of {limit:?}"
    );
    answer
}

#[tokio::test]
async fn a_client_that_stalls_in_its_request_line_is_disconnected() {
    let app = app_with_short_timeouts(64).await;
    let mut half = client(&app).await;
    half.stream
        .write_all(b"POST /webhooks/twilio/sms HTT")
        .await
        .unwrap();
    let mut silent = client(&app).await;
    // A whole request, answered, then nothing more on the kept-alive connection.
    let mut idle = client(&app).await;
    idle.stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut headers_only = client(&app).await;
    headers_only
        .stream
        .write_all(b"POST /webhooks/twilio/sms HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        .await
        .unwrap();

    // Read side by side: each close is timed when it happens, not when its turn comes.
    let clients = [
        ("sent half a request line", &mut half),
        ("sent nothing at all", &mut silent),
        ("sent half the headers", &mut headers_only),
        ("sent one request, then nothing", &mut idle),
    ];
    let answers = futures::future::join_all(
        clients
            .into_iter()
            .map(|(what, c)| async move { (what, closed_after(c, HEADER_LIMIT, what).await) }),
    )
    .await;
    for (what, answer) in answers {
        assert!(
            answer.is_empty()
                || answer.starts_with("HTTP/1.1 408")
                || (what.contains("one request") && answer.starts_with("HTTP/1.1 200")),
            "a client that {what} got {answer:?}"
        );
    }
    app.assert_nothing_reached_the_pipeline().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_body_that_trickles_in_gets_408() {
    let app = app_with_short_timeouts(64).await;
    let mut slow = client(&app).await;
    slow.stream
        .write_all(
            b"POST /webhooks/twilio/sms HTTP/1.1\r\nHost: x\r\n\
          Content-Type: application/x-www-form-urlencoded\r\nX-Twilio-Signature: x\r\n\
          Content-Length: 100\r\n\r\nBody=only+a+few+bytes",
        )
        .await
        .unwrap();
    let answer = closed_after(&mut slow, REQUEST_LIMIT, "trickled its body").await;
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
    // Before the request limit: a gateway that waited for the body would answer 408 then.
    let n = tokio::time::timeout(REQUEST_LIMIT, greedy.read(&mut buf))
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
    let mut stalled = client(&app).await;
    stalled.stream.write_all(b"GET /heal").await.unwrap();
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
        let mut answer = Vec::new();
        tokio::time::timeout(at_most(HEADER_LIMIT) * 2, waiting.read_to_end(&mut answer))
            .await
            .expect("the waiting client is served once the slot is free")
            .expect("read the answer");
        (
            String::from_utf8_lossy(&answer).into_owned(),
            closed.load(Ordering::SeqCst),
        )
    });
    closed_after(&mut stalled, HEADER_LIMIT, "stalled in its request line").await;
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

/// Chat sockets reading the mailbox (here: all stuck behind a lock on it, as thousands
/// reconnecting after a restart would queue) wait on connections of their own: a message
/// posted meanwhile is accepted, never left waiting behind them for a database connection.
#[tokio::test]
async fn sockets_stuck_reading_the_mailbox_never_hold_the_connections_accepting_messages() {
    let app = spawn_app_configured(|_| {}).await;
    let key = app.api_key("ops", &[]).await;
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE switchboard.mailbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    // More sockets than the process has Postgres connections in all (8 in these tests).
    let mut sockets = Vec::new();
    for i in 0..12 {
        sockets.push(ChatClient::as_user(&app.gateway_url, &format!("reader-{i}")).await);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND query LIKE '%switchboard.mailbox%'",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        if waiting >= 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sockets never read the mailbox"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let post = || {
        app.post_api_message(
            &key,
            serde_json::json!({"text": "still taken?"}),
            Some("m1"),
        )
    };
    let posted = post().await;
    let status = posted.status();
    let body = posted.text().await.unwrap();
    // The retry's status needs the mailbox, which cannot be read now: the message is still
    // taken (pending), never a 503 that a caller would answer by sending it again.
    let retried = post().await;
    let retry_status = retried.status();
    let retry_body: serde_json::Value = retried.json().await.unwrap();
    lock.rollback().await.unwrap();
    assert!(
        status.is_success(),
        "the message is accepted while the sockets wait: {status} {body}"
    );
    assert_eq!(retry_status, 202, "{retry_body}");
    assert_eq!(retry_body["status"], "pending", "{retry_body}");
    drop(sockets);
    app.shutdown().await;
}

/// HTTP/2 with prior knowledge (its preface and a SETTINGS frame, then nothing): HTTP/1.1 only
/// is served, so the connection is closed within the header limit, and holds no slot after.
#[tokio::test]
async fn an_http2_prior_knowledge_client_is_closed_and_holds_no_slot() {
    let app = app_with_short_timeouts(1).await;
    let mut h2 = client(&app).await;
    h2.stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let (answer, _) = try_read_until_closed(&mut h2, HEADER_LIMIT)
        .await
        .expect("an HTTP/2 connection is closed, not served and kept open");
    // An HTTP/2 server would answer with its own SETTINGS frame (type 4 at byte 3).
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1"),
        "answered in HTTP/2: {:?}",
        answer.as_bytes()
    );
    // The only slot is free again.
    let mut next = client(&app).await;
    next.stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = try_read_until_closed(&mut next, HEADER_LIMIT)
        .await
        .expect("served at once");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    app.shutdown().await;
}

/// `/healthz` on a fresh connection: the answer, or `None` if none came within `wait`.
async fn health_within(app: &TestApp, wait: Duration) -> Option<String> {
    let mut c = connect(app).await;
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(wait, c.read_to_end(&mut answer))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&answer).into_owned())
}

/// An open chat socket keeps its connection slot: with the cap at 2, two sockets leave no
/// room for a third connection until one closes.
#[tokio::test]
async fn open_chat_sockets_hold_their_connection_slots() {
    let app = app_with_short_timeouts(2).await;
    let first = ChatClient::as_user(&app.gateway_url, "slot-a").await;
    let _second = ChatClient::as_user(&app.gateway_url, "slot-b").await;
    assert_eq!(
        health_within(&app, Duration::from_millis(1_500)).await,
        None,
        "a third connection was served while two sockets held both slots"
    );
    first.close().await;
    let answer = health_within(&app, at_most(HEADER_LIMIT))
        .await
        .expect("served once a socket closed");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    app.shutdown().await;
}

#[tokio::test]
async fn one_user_holds_at_most_a_few_sockets_and_others_still_connect() {
    let app = spawn_app_configured(|c| c.chat.max_sockets_per_user = 2).await;
    let token = switchboard_e2e::chat_token("greedy", serde_json::json!({}));
    let query = format!("token={token}");
    let a = ChatClient::connect(&app.gateway_url, &query).await.unwrap();
    let _b = ChatClient::connect(&app.gateway_url, &query).await.unwrap();
    let refusal = match ChatClient::connect(&app.gateway_url, &query).await {
        Ok(_) => panic!("a third socket of one user was opened"),
        Err(refusal) => refusal,
    };
    assert_eq!(refusal.status, 429, "{refusal:?}");
    assert!(refusal.body.contains("too_many_sockets"), "{refusal:?}");
    let _other = ChatClient::as_user(&app.gateway_url, "someone-else").await;
    // A closed socket frees its place.
    a.close().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while ChatClient::connect(&app.gateway_url, &query).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the closed socket's place was not freed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.shutdown().await;
}

/// A frame announcing more than a message may be is refused on its header: the socket is
/// closed at once, not after the gateway buffered megabytes of it.
#[tokio::test]
async fn a_frame_larger_than_a_message_closes_the_socket() {
    let app = app_with_short_timeouts(64).await;
    let token = switchboard_e2e::chat_token("framer", serde_json::json!({}));
    let mut c = connect(&app).await;
    c.write_all(
        format!(
            "GET /ws/chat?token={token} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(c.read(&mut byte).await.unwrap(), 1, "upgrade answered");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{:?}",
        String::from_utf8_lossy(&head)
    );
    // A masked text frame of 8 MiB (well under tungstenite's own 16 MiB frame limit, far
    // over the 64 KiB message limit): its header and a first few bytes only.
    let len: u64 = 8 * 1024 * 1024;
    let mut frame = vec![0x81, 0x80 | 127];
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&[1, 2, 3, 4]);
    frame.extend_from_slice(&[b'x'; 1024]);
    c.write_all(&frame).await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(3), async {
        // Frames the server sent (its close frame, a ping) until it closed the connection.
        let _ = c.read_to_end(&mut rest).await;
    })
    .await;
    assert!(
        closed.is_ok(),
        "the gateway is still reading an 8 MiB frame; it sent {:?}",
        rest
    );
    app.shutdown().await;
}
