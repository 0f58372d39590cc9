//! Signed generic webhooks in and out: a configured source's signed JSON event becomes one turn,
//! its reply is POSTed back to the source's callback URL signed the same way, and anything not
//! signed right (or too old) is refused with the reason, counted, and publishes nothing.
use std::time::Duration;

use switchboard_e2e::{FakeCallbackReceiver, TestApp, spawn_app_configured};
use switchboard_kit::config::{Secret, WebhookSourceConfig};

const WAIT: Duration = Duration::from_secs(20);
const SHOP_SECRET: &str = "shop-webhook-secret-1";
const CRM_SECRET: &str = "crm-webhook-secret-2";

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn source(secret: &str, callback_url: &str) -> WebhookSourceConfig {
    WebhookSourceConfig {
        secret: Secret::new(secret),
        sender_field: "user.id".into(),
        callback_url: callback_url.into(),
        ..Default::default()
    }
}

/// An app with the source `shop` (and `crm`), each replying to its own receiver.
async fn app_with_sources() -> (TestApp, FakeCallbackReceiver, FakeCallbackReceiver) {
    let shop = FakeCallbackReceiver::start(SHOP_SECRET).await;
    let crm = FakeCallbackReceiver::start(CRM_SECRET).await;
    let (shop_url, crm_url) = (shop.url.clone(), crm.url.clone());
    let app = spawn_app_configured(move |c| {
        c.webhooks
            .insert("shop".into(), source(SHOP_SECRET, &shop_url));
        c.webhooks
            .insert("crm".into(), source(CRM_SECRET, &crm_url));
    })
    .await;
    (app, shop, crm)
}

fn event(id: &str, sender: &str, text: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "id": id, "user": {"id": sender, "name": "Ana"}, "text": text,
    }))
    .unwrap()
}

async fn code_of(resp: reqwest::Response) -> (u16, String, String) {
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await.unwrap();
    (
        status,
        body["error"]["code"].as_str().unwrap_or_default().into(),
        body["error"]["message"].as_str().unwrap_or_default().into(),
    )
}

#[tokio::test]
async fn a_signed_event_is_answered_by_one_signed_callback_with_the_reply_and_the_event_id() {
    let (app, shop, crm) = app_with_sources().await;

    let resp = app
        .post_webhook(
            "shop",
            SHOP_SECRET,
            now(),
            &event("evt-1", "u-42", "hello there"),
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), r#"{"status":"accepted"}"#);

    let got = shop.wait_for(1, WAIT).await;
    app.settle().await;
    assert_eq!(shop.requests().len(), 1, "one callback");
    assert!(
        crm.requests().is_empty(),
        "only the source that wrote is answered"
    );
    let callback = &got[0];
    assert!(
        callback.signed,
        "signed with the source's secret over timestamp.body"
    );
    assert!((now() - callback.timestamp).abs() < 60, "signed just now");
    let body = &callback.body;
    assert_eq!(body["type"], "reply");
    assert_eq!(body["text"], "echo: hello there");
    assert_eq!(
        body["in_reply_to"], "evt-1",
        "the event id as the source sent it"
    );
    assert_eq!(body["to"], "u-42", "the sender as the source named them");
    assert_eq!(
        body["agent"], "reggie_oc",
        "channels.webhook's default agent"
    );
    assert_eq!(body["part"], 0);
    let reply_id = body["reply_id"].as_str().unwrap();
    assert_eq!(callback.delivery, format!("{reply_id}:0"));

    let rows = app.log_rows().await;
    let inbound = rows.iter().find(|r| r.direction == "inbound").unwrap();
    assert_eq!(inbound.person_id, "webhook:shop:u-42");
    assert_eq!(inbound.message, "hello there");
    assert_eq!(body["correlation_id"], inbound.correlation_id.as_str());
    let (status, ids, provider): (String, Vec<String>, String) =
        sqlx::query_as("SELECT status, provider_message_ids, provider FROM switchboard.deliveries")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((status.as_str(), provider.as_str()), ("sent", "generic"));
    assert_eq!(ids, [callback.delivery.as_str()]);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("sb_gateway_accepted_total{channel=\"webhook\",provider=\"generic\"} 1"),
        "{metrics}"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn the_same_event_id_posted_twice_or_three_times_at_once_is_one_turn_and_one_callback() {
    let (app, shop, _crm) = app_with_sources().await;

    // A client resend: the same event, signed again a little later.
    let first = event("evt-resent", "u-1", "first question");
    assert_eq!(
        app.post_webhook("shop", SHOP_SECRET, now() - 5, &first)
            .await
            .status(),
        200
    );
    assert_eq!(
        app.post_webhook("shop", SHOP_SECRET, now(), &first)
            .await
            .status(),
        200
    );

    // A provider retrying while its first attempt is still in flight.
    let raced = event("evt-raced", "u-2", "second question");
    let ts = now();
    let posts = (0..3).map(|_| app.post_webhook("shop", SHOP_SECRET, ts, &raced));
    for resp in futures::future::join_all(posts).await {
        assert_eq!(resp.status(), 200);
    }

    shop.wait_for(2, WAIT).await;
    app.settle().await;
    let mut answered: Vec<_> = shop
        .accepted()
        .iter()
        .map(|c| c.body["in_reply_to"].as_str().unwrap().to_string())
        .collect();
    answered.sort();
    assert_eq!(answered, ["evt-raced", "evt-resent"], "one callback each");
    assert_eq!(app.runner.calls().len(), 2, "one turn each");
    app.shutdown().await;
}

#[tokio::test]
async fn an_unauthenticated_request_is_401_with_the_reason_counted_and_publishes_nothing() {
    let (app, shop, _crm) = app_with_sources().await;
    let body = event("evt-x", "u-9", "let me in");

    let stale = app
        .post_webhook("shop", SHOP_SECRET, now() - 301, &body)
        .await;
    assert_eq!(code_of(stale).await.0, 401);
    let stale = app
        .post_webhook("shop", SHOP_SECRET, now() - 3600, &body)
        .await;
    assert_eq!(code_of(stale).await.1, "stale_timestamp");

    let wrong_secret = app.post_webhook("shop", CRM_SECRET, now(), &body).await;
    let (status, code, _) = code_of(wrong_secret).await;
    assert_eq!((status, code.as_str()), (401, "invalid_signature"));

    // Signed, then changed on the way.
    let ts = now().to_string();
    let signature = switchboard_e2e::webhook_signature(SHOP_SECRET, &ts, &body);
    let changed = event("evt-x", "u-1", "let me in");
    let client = reqwest::Client::new();
    let url = format!("{}/webhooks/generic/shop", app.gateway_url);
    let tampered = client
        .post(&url)
        .header("content-type", "application/json")
        .header("x-switchboard-timestamp", &ts)
        .header("x-switchboard-signature", &signature)
        .body(changed)
        .send()
        .await
        .unwrap();
    assert_eq!(code_of(tampered).await.1, "invalid_signature");

    let unsigned = client
        .post(&url)
        .header("content-type", "application/json")
        .header("x-switchboard-timestamp", &ts)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    let (status, code, _) = code_of(unsigned).await;
    assert_eq!((status, code.as_str()), (401, "missing_signature"));

    let metrics = app.metrics().await;
    for (reason, n) in [
        ("stale_timestamp", 2),
        ("invalid_signature", 2),
        ("missing_signature", 1),
    ] {
        let line = format!(
            "sb_gateway_rejected_total{{channel=\"webhook\",reason=\"{reason}\",provider=\"generic\"}} {n}"
        );
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    app.assert_nothing_reached_the_pipeline().await;
    assert!(shop.requests().is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn an_unknown_source_is_400_naming_it_and_a_body_without_the_sender_is_400_naming_the_path() {
    let (app, _shop, _crm) = app_with_sources().await;

    let resp = app
        .post_webhook("billing", SHOP_SECRET, now(), &event("e1", "u", "hi"))
        .await;
    let (status, code, message) = code_of(resp).await;
    assert_eq!((status, code.as_str()), (400, "unknown_source"));
    assert!(message.contains("\"billing\""), "{message}");

    let no_sender = serde_json::to_vec(&serde_json::json!({
        "id": "e2", "user": {"name": "Ana"}, "text": "who am I",
    }))
    .unwrap();
    let resp = app
        .post_webhook("shop", SHOP_SECRET, now(), &no_sender)
        .await;
    let (status, code, message) = code_of(resp).await;
    assert_eq!((status, code.as_str()), (400, "missing_field"));
    assert!(message.contains("user.id"), "{message}");

    let metrics = app.metrics().await;
    for reason in ["unknown_source", "missing_field"] {
        let line = format!(
            "sb_gateway_rejected_total{{channel=\"webhook\",reason=\"{reason}\",provider=\"generic\"}} 1"
        );
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    app.assert_nothing_reached_the_pipeline().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_callback_answered_503_then_200_is_delivered_exactly_once() {
    let (app, shop, _crm) = app_with_sources().await;
    shop.failures.fail_next(1, 503);

    let resp = app
        .post_webhook(
            "shop",
            SHOP_SECRET,
            now(),
            &event("evt-503", "u-5", "are you there"),
        )
        .await;
    assert_eq!(resp.status(), 200);
    shop.wait_for(1, WAIT).await;
    app.settle().await;

    let requests = shop.requests();
    let statuses: Vec<_> = requests.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 200], "retried after the outage, then done");
    assert_eq!(shop.accepted().len(), 1);
    assert_eq!(
        requests[0].delivery, requests[1].delivery,
        "a retry carries the same delivery id, so a receiver could drop it"
    );
    assert!(requests.iter().all(|r| r.signed));
    assert_eq!(requests[1].body["text"], "echo: are you there");
    app.shutdown().await;
}

#[tokio::test]
async fn the_same_sender_id_through_two_sources_is_two_people_unless_the_directory_links_them() {
    let (app, shop, crm) = app_with_sources().await;

    app.post_webhook(
        "shop",
        SHOP_SECRET,
        now(),
        &event("a-1", "u-42", "from the shop"),
    )
    .await;
    app.post_webhook(
        "crm",
        CRM_SECRET,
        now(),
        &event("a-1", "u-42", "from the crm"),
    )
    .await;
    shop.wait_for(1, WAIT).await;
    crm.wait_for(1, WAIT).await;
    app.settle().await;
    assert_eq!(crm.accepted()[0].body["text"], "echo: from the crm");
    let mut people: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT person_id FROM switchboard.messages WHERE direction = 'inbound'",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    people.sort();
    assert_eq!(people, ["webhook:crm:u-42", "webhook:shop:u-42"]);

    // The directory knows both ids are Ana's: from then on both sources reach one person.
    sqlx::query(
        "INSERT INTO switchboard.people (person_id, person_type, name, role)
         VALUES ('17', 'staff', 'Ana', 'nurse')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO switchboard.contact_points (kind, address, person_id)
         VALUES ('webhook_sender', 'shop:u-42', '17'), ('webhook_sender', 'crm:u-42', '17')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    app.post_webhook(
        "shop",
        SHOP_SECRET,
        now(),
        &event("a-2", "u-42", "shop again"),
    )
    .await;
    app.post_webhook("crm", CRM_SECRET, now(), &event("a-2", "u-42", "crm again"))
        .await;
    shop.wait_for(2, WAIT).await;
    crm.wait_for(2, WAIT).await;
    app.settle().await;
    let linked: Vec<String> = sqlx::query_scalar(
        "SELECT person_id FROM switchboard.messages
          WHERE direction = 'inbound' AND message LIKE '%again' ORDER BY id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(linked, ["17", "17"]);
    app.shutdown().await;
}

#[tokio::test]
async fn a_callback_answered_410_is_given_up_at_once_and_recorded_failed() {
    let (app, shop, _crm) = app_with_sources().await;
    // The receiver says the addressee is gone: sending again cannot help.
    shop.failures.fail_next(1, 410);
    let resp = app
        .post_webhook(
            "shop",
            SHOP_SECRET,
            now(),
            &event("evt-410", "u-6", "hello?"),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let deadline = std::time::Instant::now() + WAIT;
    let (status, error) = loop {
        let row: Option<(String, Option<String>)> =
            sqlx::query_as("SELECT status, last_error FROM switchboard.deliveries")
                .fetch_optional(&app.db)
                .await
                .unwrap();
        match row {
            Some((status, error)) if status != "pending" => break (status, error),
            _ if std::time::Instant::now() > deadline => panic!("no settled delivery: {row:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    app.settle().await;
    assert_eq!(status, "failed");
    assert!(error.is_some_and(|e| e.contains("410")));
    assert_eq!(shop.requests().len(), 1, "not retried");
    assert!(shop.accepted().is_empty());
    app.shutdown().await;
}
