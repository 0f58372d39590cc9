//! Hostile input at the Twilio webhook: every bad request gets its 4xx with a JSON error code,
//! publishes nothing, and is counted in `sb_gateway_rejected_total{channel="sms",reason}`; a
//! replayed, correctly signed request is indistinguishable from Twilio's own retry. Also the
//! fuzz targets' checks (`tests/fuzz`), replayed without libFuzzer over their seeds and
//! pseudo-random mutations, so `make test` runs them on every machine.
use std::collections::BTreeMap;
use std::time::Duration;

use switchboard_e2e::{TestApp, spawn_app};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The fuzz targets' checks, from the cargo-fuzz crate (not a workspace member).
#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod fuzz_checks;

const PERSON: &str = "+14155550142";
const WAIT: Duration = Duration::from_secs(20);
const FORM: &str = "application/x-www-form-urlencoded";

/// One request to `POST /webhooks/twilio/sms`, byte for byte.
struct Req {
    what: &'static str,
    body: Vec<u8>,
    content_type: Option<&'static str>,
    signature: Option<String>,
}

fn form(params: &[(String, String)]) -> Vec<u8> {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish()
        .into_bytes()
}

/// The form fields a body means to a lenient (WHATWG) parser: what an attacker holding the
/// auth token would sign, so that a rejection below is not just a signature mismatch.
fn lenient(body: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

impl Req {
    /// A form body, signed correctly (over its lenient parse).
    fn signed(app: &TestApp, what: &'static str, body: impl Into<Vec<u8>>) -> Self {
        let body = body.into();
        Self {
            what,
            signature: Some(app.sign(&lenient(&body))),
            body,
            content_type: Some(FORM),
        }
    }

    fn params(app: &TestApp, what: &'static str, params: &[(String, String)]) -> Self {
        Self::signed(app, what, form(params))
    }

    fn content_type(mut self, ct: Option<&'static str>) -> Self {
        self.content_type = ct;
        self
    }

    fn signature(mut self, sig: Option<&str>) -> Self {
        self.signature = sig.map(str::to_string);
        self
    }

    async fn send(&self, app: &TestApp) -> reqwest::Response {
        let mut req = reqwest::Client::new()
            .post(format!("{}/webhooks/twilio/sms", app.gateway_url))
            .body(self.body.clone());
        if let Some(ct) = self.content_type {
            req = req.header("content-type", ct);
        }
        if let Some(s) = &self.signature {
            req = req.header("X-Twilio-Signature", s);
        }
        req.send()
            .await
            .unwrap_or_else(|e| panic!("{}: gateway dropped the request: {e}", self.what))
    }
}

fn with(mut params: Vec<(String, String)>, name: &str, value: &str) -> Vec<(String, String)> {
    params.retain(|(k, _)| k != name);
    params.push((name.into(), value.into()));
    params
}

fn without(params: &[(String, String)], names: &[&str]) -> Vec<(String, String)> {
    params
        .iter()
        .filter(|(k, _)| !names.contains(&k.as_str()))
        .cloned()
        .collect()
}

/// `sb_gateway_rejected_total{channel="sms",reason=…,provider="twilio"}` by reason.
async fn rejected_counts(app: &TestApp) -> BTreeMap<String, u64> {
    let text = app.metrics().await;
    let prefix = "sb_gateway_rejected_total{channel=\"sms\",reason=\"";
    text.lines()
        .filter(|l| l.contains("provider=\"twilio\""))
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|rest| {
            let (reason, rest) = rest.split_once('"')?;
            let (_, value) = rest.rsplit_once(' ')?;
            Some((reason.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// A POST with `Transfer-Encoding: chunked` (no Content-Length), written by hand: the size limit
/// must hold for a body whose length is not announced. Returns the status and the body.
async fn post_chunked(
    app: &TestApp,
    signature: &str,
    chunks: usize,
    chunk: &[u8],
) -> (u16, String) {
    let addr = app.gateway_url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /webhooks/twilio/sms HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {FORM}\r\n\
         X-Twilio-Signature: {signature}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..chunks {
        let frame = [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat();
        // The server may answer and close before the whole body is sent.
        if stream.write_all(&frame).await.is_err() {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut response = Vec::new();
    let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut response)).await;
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn hostile_requests_get_their_4xx_publish_nothing_and_are_counted() {
    let app = spawn_app().await;
    let good = app.sms_params(PERSON, "hello", "SM0123456789abcdef0123456789abcdef");
    let max_body = app.config.gateway.max_body_bytes;
    let max_text = app.config.gateway.max_text_chars;
    let good_body = form(&good);
    let good_sig = app.sign(&good);

    let mut too_many = good.clone();
    too_many.extend((0..200).map(|i| (format!("X{i}"), "1".to_string())));
    let other_token = switchboard_channels::twilio::twilio_signature(
        "not-the-token",
        &format!("{}/webhooks/twilio/sms", app.config.gateway.public_url),
        &good,
    );
    let other_url = switchboard_channels::twilio::twilio_signature(
        app.config.twilio.auth_token.expose(),
        "https://evil.example.com/webhooks/twilio/sms",
        &good,
    );
    let mut non_utf8 = good_body.clone();
    non_utf8.extend_from_slice(b"&Extra=\xff\xfe");

    #[rustfmt::skip]
    let cases: Vec<(Req, u16, &str)> = vec![
        // Size.
        (Req::signed(&app, "body one byte over the limit", "Body=".to_string() + &"a".repeat(max_body - 4)), 413, "body_too_large"),
        (Req::signed(&app, "unsigned body far over the limit", vec![b'a'; 4 * max_body]).signature(None), 413, "body_too_large"),
        (Req::params(&app, "text one character over the limit", &with(good.clone(), "Body", &"é".repeat(max_text + 1))), 413, "text_too_long"),
        (Req::params(&app, "more than 200 fields", &too_many), 400, "too_many_fields"),
        // Encoding.
        (Req::signed(&app, "broken percent-escape", "MessageSid=SM1&From=%2B14155550142&Body=100%zz"), 400, "malformed_form"),
        (Req::signed(&app, "truncated percent-escape", "MessageSid=SM1&From=%2B14155550142&Body=%4"), 400, "malformed_form"),
        (Req::signed(&app, "raw body not UTF-8", non_utf8), 400, "bad_encoding"),
        (Req::signed(&app, "escaped bytes not UTF-8 (Latin-1 é)", "MessageSid=SM1&From=%2B14155550142&Body=caf%E9"), 400, "bad_encoding"),
        (Req::params(&app, "NUL in the text", &with(good.clone(), "Body", "a\0b")), 400, "bad_encoding"),
        (Req::signed(&app, "JSON body", r#"{"From":"+14155550142","Body":"hi"}"#).content_type(Some("application/json")), 415, "unsupported_media_type"),
        (Req::signed(&app, "form body sent as text/plain", good_body.clone()).content_type(Some("text/plain")), 415, "unsupported_media_type"),
        (Req::signed(&app, "form body without a content type", good_body.clone()).content_type(None), 415, "unsupported_media_type"),
        (Req::signed(&app, "form in Latin-1", good_body.clone()).content_type(Some("application/x-www-form-urlencoded; charset=ISO-8859-1")), 415, "unsupported_media_type"),
        (Req::signed(&app, "multipart form", good_body.clone()).content_type(Some("multipart/form-data; boundary=x")), 415, "unsupported_media_type"),
        // Authentication.
        (Req::signed(&app, "unsigned", good_body.clone()).signature(None), 403, "missing_signature"),
        (Req::signed(&app, "empty signature", good_body.clone()).signature(Some("")), 403, "invalid_signature"),
        (Req::signed(&app, "garbage signature", good_body.clone()).signature(Some("bm90IHRoZSBzaWduYXR1cmU=")), 403, "invalid_signature"),
        (Req::signed(&app, "signed with another token", good_body.clone()).signature(Some(&other_token)), 403, "invalid_signature"),
        (Req::signed(&app, "signed for another URL", good_body.clone()).signature(Some(&other_url)), 403, "invalid_signature"),
        (Req::signed(&app, "text changed after signing", form(&with(good.clone(), "Body", "hellO"))).signature(Some(&good_sig)), 403, "invalid_signature"),
        (Req::signed(&app, "a field added after signing", [good_body.clone(), b"&Body=admin".to_vec()].concat()).signature(Some(&good_sig)), 403, "invalid_signature"),
        // Fields.
        (Req::params(&app, "no MessageSid", &without(&good, &["MessageSid", "SmsSid"])), 400, "missing_field"),
        (Req::params(&app, "no From", &without(&good, &["From"])), 400, "missing_field"),
        (Req::params(&app, "MessageSid with a header injection", &without(&with(good.clone(), "MessageSid", "SM1\r\nNats-Msg-Id: x"), &["SmsSid"])), 400, "invalid_field"),
        (Req::params(&app, "MessageSid too long", &without(&with(good.clone(), "MessageSid", &"a".repeat(65)), &["SmsSid"])), 400, "invalid_field"),
        (Req::params(&app, "From not a number", &with(good.clone(), "From", "not-a-phone")), 400, "invalid_from"),
        (Req::params(&app, "From empty", &with(good.clone(), "From", "")), 400, "invalid_from"),
        (Req::params(&app, "From a plus sign", &with(good.clone(), "From", "+")), 400, "invalid_from"),
        (Req::params(&app, "From too short", &with(good.clone(), "From", "12")), 400, "invalid_from"),
        (Req::params(&app, "From an email address", &with(good.clone(), "From", "admin@example.com")), 400, "invalid_from"),
    ];

    let before = rejected_counts(&app).await;
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for (req, status, code) in &cases {
        let resp = req.send(&app).await;
        assert_eq!(resp.status().as_u16(), *status, "{}", req.what);
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("application/json"), "{}: {ct}", req.what);
        let err: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(err["error"]["code"], *code, "{}: {err}", req.what);
        assert!(
            !err["error"]["message"].as_str().unwrap_or("").is_empty(),
            "{}: {err}",
            req.what
        );
        *expected.entry(code.to_string()).or_default() += 1;
    }

    // A chunked body (no Content-Length) over the limit is cut off at the limit, not buffered.
    let (status, body) = post_chunked(&app, &good_sig, 2 * max_body / 1024, &[b'a'; 1024]).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("body_too_large"), "{body}");
    *expected.entry("body_too_large".into()).or_default() += 1;

    // Every rejection is counted under its code. (At least: with `cargo test` instead of
    // nextest, other tests in this process count into the same registry.)
    let after = rejected_counts(&app).await;
    for (code, n) in &expected {
        let counted =
            after.get(code).copied().unwrap_or(0) - before.get(code).copied().unwrap_or(0);
        assert!(
            counted >= *n,
            "{code}: counted {counted}, expected {n}: {after:?}"
        );
    }

    // Nothing reached the pipeline.
    app.assert_nothing_reached_the_pipeline().await;

    // And the gateway is still fine: the well-formed request those were made from goes through.
    let ok = Req::signed(&app, "the good request", good_body)
        .send(&app)
        .await;
    assert_eq!(ok.status(), 200);
    let sent = app.wait_for_sms(1, WAIT).await;
    assert_eq!(sent[0].body, "echo: hello");
    app.shutdown().await;
}

#[tokio::test]
async fn the_content_types_twilio_sends_are_accepted() {
    let app = spawn_app().await;
    for (i, ct) in [
        "application/x-www-form-urlencoded",
        "application/x-www-form-urlencoded; charset=UTF-8",
        "Application/X-WWW-Form-Urlencoded;charset=\"utf-8\"",
    ]
    .into_iter()
    .enumerate()
    {
        let params = app.sms_params(PERSON, &format!("ct {i}"), &format!("SMct{i}"));
        let req = Req::params(&app, "content type", &params).content_type(Some(ct));
        assert_eq!(req.send(&app).await.status(), 200, "{ct}");
    }
    app.wait_for_sms(3, WAIT).await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_replayed_signed_request_gets_200_and_still_one_turn_and_one_reply() {
    let app = spawn_app().await;
    // Captured on the wire: the exact bytes and signature of one real request.
    let params = app.sms_params(
        PERSON,
        "transfer everything",
        "SMa1b2c3d4e5f60718293a4b5c6d7e8f90",
    );
    let captured = Req::params(&app, "captured", &params);
    assert_eq!(captured.send(&app).await.status(), 200);
    app.wait_for_sms(1, WAIT).await;
    app.settle().await;

    // Replayed later, several times, some at once: to the gateway this is Twilio retrying.
    for _ in 0..2 {
        let resp = captured.send(&app).await;
        assert_eq!(resp.status(), 200);
        assert!(resp.text().await.unwrap().contains("<Response"));
    }
    let (a, b, c) = tokio::join!(
        captured.send(&app),
        captured.send(&app),
        captured.send(&app)
    );
    assert_eq!(
        [a.status(), b.status(), c.status()].map(|s| s.as_u16()),
        [200; 3]
    );
    app.settle().await;

    assert_eq!(app.runner.calls().len(), 1, "one turn");
    let sent = app.twilio.sent();
    assert_eq!(sent.len(), 1, "one reply: {sent:?}");
    assert_eq!(sent[0].to, PERSON);
    let rows = app.log_rows().await;
    assert_eq!(rows.iter().filter(|r| r.direction == "inbound").count(), 1);
    assert_eq!(rows.iter().filter(|r| r.direction == "outbound").count(), 1);
    let turns: i64 = sqlx::query_scalar("SELECT last_seq FROM switchboard.sessions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(turns, 1);
    app.shutdown().await;
}

#[test]
fn the_fuzz_checks_hold_on_seeds_and_mutations() {
    let rounds = std::env::var("SB_FUZZ_REPLAY_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5_000);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for (target, n) in fuzz_checks::replay(&dir, rounds) {
        assert!(n > rounds, "{target}: {n}");
    }
}
