//! Delivery receipts: what a provider reports after it took a message. A WhatsApp message Meta
//! took and then could not deliver, and an SMS Twilio reports undelivered, read `failed` with
//! the provider's reason where the sender asks after them; delivered and read messages say how
//! far they went; a report sent again is kept once, and one that comes before the delivery
//! ledger records the message is read back once it does; a forged status callback is refused.
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_e2e::{AppOptions, TestApp, WHATSAPP_NUMBER_ID, spawn_app, spawn_app_with};
use switchboard_fakes::whatsapp::{DISPLAY_PHONE_NUMBER, status_update, text_message};

const WAIT: Duration = Duration::from_secs(20);
const ANA: &str = "16505551234";
const PHONE: &str = "+14155550177";

/// An agent-started message to `person`; its correlation id, once it was sent.
async fn agent_writes(app: &TestApp, key: &str, person: &str, text: &str) -> String {
    let body = json!({"person_id": person, "agent": "reggie_oc", "text": text});
    let resp = app.post_api("outbound", key, body, None).await;
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    let cid = body["correlation_id"].as_str().unwrap().to_string();
    let status = status_of(app, key, &cid, |s| s["status"] != "pending").await;
    assert_eq!(status["status"], "answered", "{status}");
    cid
}

/// The message's status once `done` says so (or the last read, after the wait).
async fn status_of(app: &TestApp, key: &str, cid: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let response = app.get_api_message(key, cid).await;
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        if done(&body) || tokio::time::Instant::now() > deadline {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn ana_writes_on_whatsapp(app: &TestApp) {
    let hello = text_message(
        WHATSAPP_NUMBER_ID,
        DISPLAY_PHONE_NUMBER,
        ANA,
        "Ana",
        "wamid.R1=",
        "hello",
    );
    assert_eq!(app.post_whatsapp(&hello).await.status(), 200);
    app.wait_for_whatsapp(1, WAIT).await;
    app.settle().await;
}

#[tokio::test]
async fn a_whatsapp_message_meta_took_but_could_not_deliver_reads_failed_with_metas_reason() {
    let app = spawn_app().await;
    // Ana wrote, so Switchboard's window is open; but Meta's window for this number is closed
    // (she never wrote to it, as far as Meta knows): Meta takes the message, then fails it.
    ana_writes_on_whatsapp(&app).await;
    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let cid = agent_writes(
        &app,
        &key,
        &format!("whatsapp:+{ANA}"),
        "Your order shipped.",
    )
    .await;
    let before = status_of(&app, &key, &cid, |_| true).await;
    assert!(before["replies"][0].get("receipt").is_none(), "{before}");

    // Meta posts what became of each message.
    let reports = app.whatsapp.status_webhooks();
    assert_eq!(reports.len(), 2, "both sends failed at Meta: {reports:?}");
    for report in &reports {
        assert_eq!(app.post_whatsapp(report).await.status(), 200);
    }
    // Meta sends a notification again until it is answered: kept once.
    assert_eq!(app.post_whatsapp(&reports[1]).await.status(), 200);

    let after = status_of(&app, &key, &cid, |s| s["status"] == "failed").await;
    assert_eq!(after["status"], "failed", "{after}");
    let error = after["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("131047") && error.contains("whatsapp"),
        "{error}"
    );
    assert_eq!(after["replies"][0]["receipt"], "failed");
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.delivery_receipts")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(kept, 2, "one row a report");
    assert!(
        app.metrics()
            .await
            .contains("sb_delivery_receipts_total{provider=\"whatsapp\",status=\"failed\"}")
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_whatsapp_message_read_by_the_person_says_so() {
    let app = spawn_app().await;
    app.whatsapp.person_wrote(ANA);
    ana_writes_on_whatsapp(&app).await;
    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let cid = agent_writes(&app, &key, &format!("whatsapp:+{ANA}"), "See you at 3.").await;
    let wamid = app.whatsapp.sent().last().unwrap().wamid.clone();
    for status in ["sent", "delivered", "read"] {
        let report = status_update(
            WHATSAPP_NUMBER_ID,
            DISPLAY_PHONE_NUMBER,
            &wamid,
            ANA,
            status,
        );
        assert_eq!(app.post_whatsapp(&report).await.status(), 200);
    }
    let read = status_of(&app, &key, &cid, |s| s["replies"][0]["receipt"] == "read").await;
    assert_eq!(read["status"], "answered");
    assert_eq!(read["replies"][0]["receipt"], "read", "{read}");
    app.shutdown().await;
}

#[tokio::test]
async fn an_sms_twilio_reports_undelivered_reads_failed_and_a_forged_report_is_refused() {
    let app = spawn_app().await;
    assert_eq!(app.send_sms(PHONE, "hi there").await.status(), 200);
    app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let person = format!("phone:{PHONE}");

    let delivered = agent_writes(&app, &key, &person, "Your appointment is at 3pm.").await;
    let sid = app.twilio.sent().last().unwrap().sid.clone();
    assert_eq!(
        app.twilio.status_callback_of(&sid).as_deref(),
        Some(format!("{}/webhooks/twilio/sms", app.config.gateway.public_url).as_str()),
        "the send asks Twilio to report to the SMS webhook"
    );
    for status in ["queued", "sent", "delivered"] {
        assert_eq!(app.twilio_reports(&sid, status, None).await.status(), 200);
    }
    let read = status_of(&app, &key, &delivered, |s| {
        s["replies"][0]["receipt"] == "delivered"
    })
    .await;
    assert_eq!(read["replies"][0]["receipt"], "delivered", "{read}");

    let lost = agent_writes(&app, &key, &person, "Bring your card.").await;
    let sid = app.twilio.sent().last().unwrap().sid.clone();
    let forged = app
        .twilio_reports_signed(&sid, "undelivered", Some("30003"), "not-the-auth-token")
        .await;
    assert_eq!(forged.status(), 403);
    assert_eq!(
        status_of(&app, &key, &lost, |_| true).await["status"],
        "answered",
        "a forged report changes nothing"
    );
    let report = app.twilio_reports(&sid, "undelivered", Some("30003")).await;
    assert_eq!(report.status(), 200);
    let failed = status_of(&app, &key, &lost, |s| s["status"] == "failed").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"], "twilio: not delivered: (30003)");

    app.settle().await;
    // A status callback is no message: nothing reached the agent but the person's text.
    assert_eq!(app.runner.calls().len(), 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_report_that_comes_before_the_ledger_records_the_message_is_kept_and_read_back() {
    let app = spawn_app_with(AppOptions::all_but("deliver")).await;
    assert_eq!(app.send_sms(PHONE, "hi there").await.status(), 200);
    let first = app.wait_for_reply(&[], WAIT).await;
    app.settle().await;
    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let body = json!({"person_id": format!("phone:{PHONE}"), "agent": "reggie_oc",
                      "text": "Bring your card."});
    let resp = app.post_api("outbound", &key, body, None).await;
    assert_eq!(resp.status(), 202);
    let cid = resp.json::<Value>().await.unwrap()["correlation_id"]
        .as_str()
        .unwrap()
        .to_string();
    let reply = app.wait_for_reply(&[&first], WAIT).await;
    // Twilio took the message and its deliverer died before the ledger recorded the sid;
    // Twilio's report that it was not delivered comes before anyone has.
    app.deliverer_dies_sending(&reply, Duration::from_secs(1), 0, true)
        .await;
    let sid = app.twilio.sent().last().unwrap().sid.clone();
    let report = app.twilio_reports(&sid, "undelivered", Some("30003")).await;
    assert_eq!(report.status(), 200, "kept though no delivery lists it yet");

    app.start_stage("deliver");
    let (status, _) = app.wait_for_delivery(&reply, Duration::from_secs(90)).await;
    assert_eq!(status, "sent", "found in Twilio's log and recorded");
    let failed = status_of(&app, &key, &cid, |s| s["status"] == "failed").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"], "twilio: not delivered: (30003)");
    app.settle().await;
    let to_her = app.twilio.sent().iter().filter(|m| m.to == PHONE).count();
    assert_eq!(to_her, 2, "the echo and the message, each once");
    app.shutdown().await;
}
