//! WhatsApp through Meta's Cloud API: the subscription handshake, notifications signed with
//! the app secret (a forged one refused), several people's messages in one notification each
//! answered once though Meta sends it again, statuses kept as delivery receipts, a long reply
//! split at 4,096 characters after Meta's throughput limit, a person's picture in the session's
//! workspace and a file the agent leaves sent as a document by its link, and a WhatsApp number
//! proved to be the person's SMS number one session with it; a part Meta may have taken before
//! its deliverer died ends failed with its reason, never sent twice (the Cloud API keeps no log).
use std::path::PathBuf;
use std::time::Duration;

use switchboard_e2e::fakes::person_of;
use switchboard_e2e::{
    FakeRunner, WHATSAPP_NUMBER_ID, WHATSAPP_VERIFY_TOKEN, spawn_app, spawn_app_configured,
};
use switchboard_fakes::whatsapp::{
    DISPLAY_PHONE_NUMBER, image_message, status_update, text_message, text_messages,
    verification_query,
};

const WAIT: Duration = Duration::from_secs(20);
const ANA: &str = "16505551234";
const BEN: &str = "447700900123";

#[tokio::test]
async fn the_subscription_handshake_is_answered_only_with_the_verify_token() {
    let app = spawn_app().await;
    let get = |query: String| {
        let url = format!("{}/webhooks/whatsapp?{query}", app.gateway_url);
        async move { reqwest::get(url).await.expect("gateway reachable") }
    };
    let ok = get(verification_query(WHATSAPP_VERIFY_TOKEN, "1158201444")).await;
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.text().await.unwrap(), "1158201444");
    let wrong = get(verification_query("guessed", "1158201444")).await;
    assert_eq!(wrong.status(), 403);
    // A channel that makes no handshake answers GET with 405.
    let telegram = reqwest::get(format!("{}/webhooks/telegram", app.gateway_url))
        .await
        .unwrap();
    assert_eq!(telegram.status(), 405);
    app.shutdown().await;
}

#[tokio::test]
async fn each_message_of_a_notification_is_answered_once_though_meta_sends_it_again() {
    let app = spawn_app().await;
    app.whatsapp.person_wrote(ANA);
    app.whatsapp.person_wrote(BEN);
    let both = text_messages(
        WHATSAPP_NUMBER_ID,
        DISPLAY_PHONE_NUMBER,
        &[
            (
                ANA,
                "wamid.HBgLMTY1MDU1NTEyMzQVAgASGBQzQTAA=",
                "hello from ana",
            ),
            (
                BEN,
                "wamid.HBgMNDQ3NzAwOTAwMTIzFQIAEhgUM0EBB=",
                "hello from ben",
            ),
        ],
    );
    assert_eq!(app.post_whatsapp(&both).await.status(), 200);
    // Meta sends a notification again until it gets a 2xx in time: the same wamids.
    assert_eq!(app.post_whatsapp(&both).await.status(), 200);
    let status = status_update(
        WHATSAPP_NUMBER_ID,
        DISPLAY_PHONE_NUMBER,
        "wamid.OLD=",
        ANA,
        "read",
    );
    assert_eq!(app.post_whatsapp(&status).await.status(), 200);

    app.wait_for_whatsapp(2, WAIT).await;
    app.settle().await;
    let sent = app.whatsapp.sent();
    assert_eq!(sent.len(), 2, "one answer each: {sent:?}");
    let mut answers: Vec<(String, String)> = sent
        .iter()
        .map(|s| (s.wa_id.clone(), s.text.clone()))
        .collect();
    answers.sort();
    assert_eq!(
        answers,
        [
            (ANA.to_string(), "echo: hello from ana".to_string()),
            (BEN.to_string(), "echo: hello from ben".to_string()),
        ]
    );
    assert!(
        sent.iter().all(|s| s.delivered),
        "inside the 24-hour window"
    );
    assert_eq!(
        app.runner.calls().len(),
        2,
        "the resent notification was no second turn"
    );
    let rows = app.log_rows().await;
    let people: std::collections::BTreeSet<_> = rows
        .iter()
        .filter(|r| r.direction == "inbound")
        .map(|r| r.person_id.clone())
        .collect();
    assert_eq!(
        people,
        [format!("whatsapp:+{BEN}"), format!("whatsapp:+{ANA}")]
            .into_iter()
            .collect()
    );
    // A status is a delivery receipt, kept (here of a message we never sent): no turn.
    assert!(
        app.metrics()
            .await
            .contains("sb_delivery_receipts_total{provider=\"whatsapp\",status=\"read\"} 1")
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_notification_not_signed_with_the_app_secret_is_refused_and_publishes_nothing() {
    let app = spawn_app().await;
    let message = text_message(
        WHATSAPP_NUMBER_ID,
        DISPLAY_PHONE_NUMBER,
        ANA,
        "Ana",
        "wamid.F=",
        "let me in",
    );
    let forged = app.post_whatsapp_signed(&message, "guessed-secret").await;
    assert_eq!(forged.status(), 401);
    let err: serde_json::Value = forged.json().await.unwrap();
    assert_eq!(err["error"]["code"], "invalid_signature");
    assert!(app.metrics().await.contains(
        "sb_gateway_rejected_total{channel=\"whatsapp\",reason=\"invalid_signature\",provider=\"whatsapp\"} 1"
    ));
    app.assert_nothing_reached_the_pipeline().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_long_reply_is_split_at_whatsapps_limit_after_the_throughput_limit() {
    let app = spawn_app().await;
    app.whatsapp.person_wrote(ANA);
    let long: String = (0..1800).map(|i| format!("w{} ", i % 10)).collect(); // 5,400 chars
    let answer = long.clone();
    app.runner.answer_with(move |_, _| answer.clone());
    app.whatsapp.throttle_next(1);
    let message = text_message(
        WHATSAPP_NUMBER_ID,
        DISPLAY_PHONE_NUMBER,
        ANA,
        "Ana",
        "wamid.L=",
        "everything",
    );
    assert_eq!(app.post_whatsapp(&message).await.status(), 200);
    app.wait_for_whatsapp(2, WAIT).await;
    app.settle().await;
    let sent = app.whatsapp.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(sent.iter().all(|s| s.text.chars().count() <= 4096));
    let whole: Vec<&str> = sent.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(whole.join(" "), long.trim_end());
    assert_eq!(
        app.whatsapp.requests(),
        3,
        "one throttled, then each part once"
    );
    assert!(
        app.metrics()
            .await
            .contains("sb_delivery_throttled_total{provider=\"whatsapp\"} 1")
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_picture_lands_in_the_workspace_and_a_file_the_agent_leaves_goes_as_a_document() {
    let root = std::env::temp_dir().join(format!("sb-wa-{}", uuid::Uuid::new_v4().simple()));
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_configured(move |c| c.workspace.root = root_text).await;
    const REPORT: &str = "date,visits\n2026-12-01,14\n";
    app.runner.answer_with(|call, _| {
        let folder = PathBuf::from(call.workspace.clone().expect("a workspace"));
        std::fs::create_dir_all(folder.join("exports")).unwrap();
        std::fs::write(folder.join("exports/visits.csv"), REPORT).unwrap();
        format!("echo: {}", FakeRunner::said(&call.prompt))
    });
    app.whatsapp.person_wrote(ANA);
    let picture: Vec<u8> = (0..600u32).map(|i| (i % 241) as u8).collect();
    let media = app.whatsapp.add_media(picture.clone(), "image/jpeg");
    let message = image_message(
        WHATSAPP_NUMBER_ID,
        DISPLAY_PHONE_NUMBER,
        ANA,
        "wamid.I=",
        &media,
        "the visits?",
    );
    assert_eq!(app.post_whatsapp(&message).await.status(), 200);
    let sent = app.wait_for_whatsapp(2, WAIT).await;
    app.settle().await;

    let call = &app.runner.calls()[0];
    let folder = PathBuf::from(call.workspace.clone().unwrap());
    let kept: Vec<_> = std::fs::read_dir(folder.join("attachments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read(&kept[0]).unwrap(), picture, "byte for byte");
    assert!(
        call.prompt.contains("(image/jpeg, 600 B)"),
        "{}",
        call.prompt
    );

    assert_eq!(
        (sent[0].kind.as_str(), sent[0].text.as_str()),
        ("text", "echo: the visits?")
    );
    assert_eq!(sent[1].kind, "document");
    assert_eq!(sent[1].filename.as_deref(), Some("visits.csv"));
    let link = sent[1].link.clone().expect("sent by its link");
    // Meta fetches the link without credentials, as the person's phone would.
    let got = reqwest::get(&link).await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.text().await.unwrap(), REPORT);
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn a_whatsapp_number_proved_to_be_the_persons_sms_number_is_one_session_with_it() {
    let app = spawn_app().await;
    let phone = format!("+{ANA}");
    app.whatsapp.person_wrote(ANA);
    let say = |id: &str, text: &str| {
        text_message(
            WHATSAPP_NUMBER_ID,
            DISPLAY_PHONE_NUMBER,
            ANA,
            "Ana",
            id,
            text,
        )
    };
    app.post_whatsapp(&say("wamid.P1=", "hello")).await;
    app.wait_for_whatsapp(1, WAIT).await;
    app.post_whatsapp(&say("wamid.P2=", &format!("link my phone {phone}")))
        .await;
    let code = app.code_texted_to(&phone).await;
    app.post_whatsapp(&say("wamid.P3=", &code)).await;
    let answers = app.wait_for_whatsapp(3, WAIT).await;
    assert!(answers[2].text.starts_with("Linked"), "{answers:?}");

    app.text_answered(&phone, "texting now", 2).await;
    app.settle().await;
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(person_of(&calls[1].prompt), format!("whatsapp:{phone}"));
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));
    app.shutdown().await;
}

/// Ana wrote and was answered, 25 hours ago as far as Switchboard's log and Meta know.
async fn ana_wrote_a_day_ago(app: &switchboard_e2e::TestApp) {
    app.whatsapp.person_wrote(ANA);
    let hello = text_message(
        WHATSAPP_NUMBER_ID,
        DISPLAY_PHONE_NUMBER,
        ANA,
        "Ana",
        "wamid.OLD1=",
        "hello",
    );
    assert_eq!(app.post_whatsapp(&hello).await.status(), 200);
    app.wait_for_whatsapp(1, WAIT).await;
    app.settle().await;
    let long_ago = chrono::Utc::now() - chrono::Duration::hours(25);
    sqlx::query("UPDATE switchboard.messages SET created_at = $1 WHERE direction = 'inbound'")
        .bind(long_ago)
        .execute(&app.db)
        .await
        .unwrap();
    app.whatsapp.person_wrote_at(ANA, long_ago);
}

/// An agent-started message to Ana through the REST API.
async fn agent_writes_to_ana(app: &switchboard_e2e::TestApp, text: &str) {
    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let body = serde_json::json!({"person_id": format!("whatsapp:+{ANA}"), "agent": "reggie_oc", "text": text});
    let resp = app.post_api("outbound", &key, body, None).await;
    assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
}

#[tokio::test]
async fn outside_the_24_hour_window_a_message_goes_as_the_configured_template() {
    let app = spawn_app_configured(|c| {
        let mut wa: switchboard_channels::whatsapp::WhatsAppSettings =
            c.provider_settings("whatsapp").unwrap();
        wa.window_template = "reengage_reply".into();
        c.set_provider_settings("whatsapp", &wa).unwrap();
    })
    .await;
    app.whatsapp.add_template("reengage_reply");
    ana_wrote_a_day_ago(&app).await;
    agent_writes_to_ana(&app, "Your order shipped.").await;
    let sent = app.wait_for_whatsapp(2, WAIT).await;
    app.settle().await;
    assert_eq!(sent[1].kind, "template", "{:?}", sent[1]);
    assert_eq!(sent[1].text, "reengage_reply");
    assert_eq!(
        sent[1].request["template"]["components"][0]["parameters"][0]["text"],
        "Your order shipped."
    );
    assert!(
        sent[1].delivered,
        "a template is delivered outside the window"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn outside_the_window_with_no_template_the_message_fails_saying_why_never_silently() {
    let app = spawn_app().await;
    ana_wrote_a_day_ago(&app).await;
    agent_writes_to_ana(&app, "Your order shipped.").await;
    let deadline = std::time::Instant::now() + WAIT;
    let error = loop {
        let failed: Option<(String, Option<String>)> = sqlx::query_as(
            "SELECT status, last_error FROM switchboard.deliveries WHERE status = 'failed'",
        )
        .fetch_optional(&app.db)
        .await
        .unwrap();
        if let Some((_, error)) = failed {
            break error.unwrap_or_default();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the message did not fail"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(error.contains("24-hour window is closed"), "{error}");
    assert_eq!(
        app.whatsapp.sent().len(),
        1,
        "nothing sent that Meta would drop"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_part_meta_may_have_taken_before_its_deliverer_died_is_never_sent_again() {
    let app =
        switchboard_e2e::spawn_app_with(switchboard_e2e::AppOptions::all_but("deliver")).await;
    app.whatsapp.person_wrote(ANA);
    let message = text_message(
        WHATSAPP_NUMBER_ID,
        DISPLAY_PHONE_NUMBER,
        ANA,
        "Ana",
        "wamid.D1=",
        "did you get that",
    );
    assert_eq!(app.post_whatsapp(&message).await.status(), 200);
    let reply = app.wait_for_reply(&[], WAIT).await;
    // Meta took the part, and the deliverer died before the ledger said so. The Cloud API
    // keeps no log a business can read: the part's outcome cannot be known.
    assert!(app.whatsapp.sent().is_empty());
    let error = app
        .a_dead_deliverers_unknowable_part_ends_the_reply(&reply)
        .await;
    assert_eq!(
        app.whatsapp.sent().len(),
        1,
        "taken once, never sent a second time"
    );
    assert!(error.contains("no log"), "says why: {error}");
    app.shutdown().await;
}
