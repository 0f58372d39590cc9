//! WhatsApp through a Twilio WhatsApp sender: Twilio's signed form with `whatsapp:` addresses
//! at its own URL (a forged signature, and a message of the other kind at either URL, refused),
//! a message Twilio posts twice answered once on WhatsApp, a long reply split at Twilio's 1,600
//! characters, a person's picture kept and a file the agent leaves sent as a media message of
//! its own, one session with the same number on Meta's Cloud API, the 24-hour window (the
//! Content template outside it, or a failure saying why), and a part Twilio took before its
//! deliverer died found in Twilio's log, not sent again.
use std::path::PathBuf;
use std::time::Duration;

use switchboard_e2e::fakes::person_of;
use switchboard_e2e::{
    AppOptions, FakeRunner, TWILIO_WHATSAPP_FROM, TestApp, WHATSAPP_NUMBER_ID, spawn_app,
    spawn_app_configured, spawn_app_with,
};
use switchboard_fakes::whatsapp::{DISPLAY_PHONE_NUMBER, text_message};

const WAIT: Duration = Duration::from_secs(20);
const ANA: &str = "+16505551234";
const ANA_ON_WHATSAPP: &str = "whatsapp:+16505551234";

/// The WhatsApp messages Twilio took, as (to, from, body).
fn whatsapp_sent(app: &TestApp) -> Vec<(String, String, String)> {
    app.twilio
        .sent()
        .into_iter()
        .filter(|m| m.to.starts_with("whatsapp:"))
        .map(|m| (m.to, m.from, m.body))
        .collect()
}

#[tokio::test]
async fn a_whatsapp_message_through_twilio_is_answered_once_on_whatsapp_though_twilio_posts_it_again()
 {
    let app = spawn_app().await;
    let message = app.twilio_whatsapp_params(ANA, "hello", "SMwa0001");
    assert_eq!(app.post_twilio_whatsapp(&message).await.status(), 200);
    // Twilio did not see our answer in time and posts the same message again.
    assert_eq!(app.post_twilio_whatsapp(&message).await.status(), 200);
    app.wait_for_twilio_whatsapp(1, WAIT).await;
    app.settle().await;

    assert_eq!(
        whatsapp_sent(&app),
        [(
            ANA_ON_WHATSAPP.to_string(),
            TWILIO_WHATSAPP_FROM.to_string(),
            "echo: hello".to_string()
        )],
        "one answer, on WhatsApp, from the number written to"
    );
    assert!(
        app.twilio
            .sent()
            .iter()
            .all(|m| m.to.starts_with("whatsapp:")),
        "nothing went by SMS"
    );
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(person_of(&calls[0].prompt), ANA_ON_WHATSAPP);
    let (channel, provider): (String, Option<String>) = sqlx::query_as(
        "SELECT channel, metadata->>'provider' FROM switchboard.messages
          WHERE direction = 'inbound'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        (channel.as_str(), provider.as_deref()),
        ("whatsapp", Some("twilio_whatsapp"))
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_forged_signature_and_a_message_of_the_other_kind_are_refused() {
    let app = spawn_app().await;
    let message = app.twilio_whatsapp_params(ANA, "hello", "SMwa0002");
    let forged = app
        .post_twilio_whatsapp_signed(&message, "not-the-auth-token")
        .await;
    assert_eq!(forged.status(), 403);

    // An SMS's form at the WhatsApp sender's URL is not taken as a WhatsApp message…
    let sms = app.sms_params(ANA, "hello", "SMwa0003");
    let resp = app.post_twilio_whatsapp(&sms).await;
    assert_eq!(resp.status(), 400);
    assert!(resp.text().await.unwrap().contains("whatsapp:"));
    // …nor a WhatsApp message at the SMS URL as an SMS.
    let signature = app.sign(&message);
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&message)
        .finish();
    assert_eq!(app.post_twilio(body, Some(&signature)).await.status(), 400);

    app.settle().await;
    assert!(app.runner.calls().is_empty(), "no turn ran");
    assert!(app.twilio.sent().is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn a_long_reply_is_split_at_twilios_1600_characters() {
    let app = spawn_app().await;
    let long: String = (0..1200).map(|i| format!("w{} ", i % 10)).collect(); // 3,600 chars
    let answer = long.clone();
    app.runner.answer_with(move |_, _| answer.clone());
    let message = app.twilio_whatsapp_params(ANA, "everything", "SMwa0004");
    assert_eq!(app.post_twilio_whatsapp(&message).await.status(), 200);
    app.wait_for_twilio_whatsapp(3, WAIT).await;
    app.settle().await;
    let sent = whatsapp_sent(&app);
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(sent.iter().all(|(_, _, body)| body.chars().count() <= 1600));
    let whole: Vec<&str> = sent.iter().map(|(_, _, body)| body.as_str()).collect();
    assert_eq!(whole.join(" "), long.trim_end());
    app.shutdown().await;
}

#[tokio::test]
async fn a_picture_is_kept_and_a_file_the_agent_leaves_goes_as_a_media_message_of_its_own() {
    let root = std::env::temp_dir().join(format!("sb-twa-{}", uuid::Uuid::new_v4().simple()));
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_configured(move |c| c.workspace.root = root_text).await;
    const REPORT: &str = "date,visits\n2026-12-01,14\n";
    app.runner.answer_with(|call, _| {
        let folder = PathBuf::from(call.workspace.clone().expect("a workspace"));
        std::fs::create_dir_all(folder.join("exports")).unwrap();
        std::fs::write(folder.join("exports/visits.csv"), REPORT).unwrap();
        format!("echo: {}", FakeRunner::said(&call.prompt))
    });
    let picture: Vec<u8> = (0..600u32).map(|i| (i % 241) as u8).collect();
    let url = app.twilio.add_media("image/jpeg", picture.clone());
    let mut message = app.twilio_whatsapp_params(ANA, "the visits?", "MMwa0005");
    message.retain(|(k, _)| k != "NumMedia");
    message.extend([
        ("NumMedia".to_string(), "1".to_string()),
        ("MediaUrl0".to_string(), url),
        ("MediaContentType0".to_string(), "image/jpeg".to_string()),
    ]);
    assert_eq!(app.post_twilio_whatsapp(&message).await.status(), 200);
    app.wait_for_twilio_whatsapp(2, WAIT).await;
    app.settle().await;

    let call = &app.runner.calls()[0];
    let folder = PathBuf::from(call.workspace.clone().unwrap());
    let kept: Vec<_> = std::fs::read_dir(folder.join("attachments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read(&kept[0]).unwrap(), picture, "byte for byte");

    let sent: Vec<_> = app
        .twilio
        .sent()
        .into_iter()
        .filter(|m| m.to == ANA_ON_WHATSAPP)
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(
        (sent[0].body.as_str(), sent[0].media_urls.len()),
        ("echo: the visits?", 0)
    );
    assert_eq!(sent[1].media_urls.len(), 1, "one file, its own message");
    // Twilio fetches the link without credentials, as WhatsApp's servers would.
    let got = reqwest::get(&sent[1].media_urls[0]).await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.text().await.unwrap(), REPORT);
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn a_number_on_twilios_whatsapp_and_on_metas_cloud_api_is_one_session() {
    let app = spawn_app().await;
    let digits = ANA.trim_start_matches('+');
    app.whatsapp.person_wrote(digits);
    let on_meta = text_message(
        WHATSAPP_NUMBER_ID,
        DISPLAY_PHONE_NUMBER,
        digits,
        "Ana",
        "wamid.T1=",
        "first on the Cloud API",
    );
    assert_eq!(app.post_whatsapp(&on_meta).await.status(), 200);
    app.wait_for_whatsapp(1, WAIT).await;
    let message = app.twilio_whatsapp_params(ANA, "then through Twilio", "SMwa0006");
    assert_eq!(app.post_twilio_whatsapp(&message).await.status(), 200);
    app.wait_for_twilio_whatsapp(1, WAIT).await;
    app.settle().await;

    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(person_of(&calls[0].prompt), ANA_ON_WHATSAPP);
    assert_eq!(person_of(&calls[1].prompt), ANA_ON_WHATSAPP);
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"), "one session");
    // Each answer went back the way its message came.
    assert_eq!(app.whatsapp.sent().len(), 1);
    assert_eq!(
        whatsapp_sent(&app)[0].2,
        "echo: then through Twilio".to_string()
    );
    app.shutdown().await;
}

/// Ana wrote through Twilio and was answered, 25 hours ago as far as the log knows.
async fn ana_wrote_a_day_ago(app: &TestApp) {
    let hello = app.twilio_whatsapp_params(ANA, "hello", "SMwaOLD1");
    assert_eq!(app.post_twilio_whatsapp(&hello).await.status(), 200);
    app.wait_for_twilio_whatsapp(1, WAIT).await;
    app.settle().await;
    let long_ago = chrono::Utc::now() - chrono::Duration::hours(25);
    sqlx::query("UPDATE switchboard.messages SET created_at = $1 WHERE direction = 'inbound'")
        .bind(long_ago)
        .execute(&app.db)
        .await
        .unwrap();
}

/// An agent-started message to Ana through the REST API.
async fn agent_writes_to_ana(app: &TestApp, text: &str) {
    let key = app.api_key("scheduler", &["outbound:write"]).await;
    let body =
        serde_json::json!({"person_id": ANA_ON_WHATSAPP, "agent": "reggie_oc", "text": text});
    let resp = app.post_api("outbound", &key, body, None).await;
    assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
}

const TEMPLATE_SID: &str = "HX0123456789abcdef0123456789abcdef";

#[tokio::test]
async fn outside_the_24_hour_window_a_message_goes_as_the_content_template() {
    let app = spawn_app_configured(|c| {
        let settings = switchboard_channels::twilio::whatsapp::TwilioWhatsAppSettings {
            window_content_sid: TEMPLATE_SID.into(),
            ..Default::default()
        };
        c.set_provider_settings("twilio_whatsapp", &settings)
            .unwrap();
    })
    .await;
    app.twilio
        .add_content_template(TEMPLATE_SID, "An update on your request: {{1}}");
    ana_wrote_a_day_ago(&app).await;
    agent_writes_to_ana(&app, "Your order shipped.").await;
    app.wait_for_twilio_whatsapp(2, WAIT).await;
    app.settle().await;
    let sent = whatsapp_sent(&app);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[1].2, "An update on your request: Your order shipped.");
    app.shutdown().await;
}

#[tokio::test]
async fn outside_the_window_with_no_template_the_message_fails_saying_why() {
    let app = spawn_app().await;
    ana_wrote_a_day_ago(&app).await;
    agent_writes_to_ana(&app, "Your order shipped.").await;
    let deadline = std::time::Instant::now() + WAIT;
    let error = loop {
        let failed: Option<Option<String>> = sqlx::query_scalar(
            "SELECT last_error FROM switchboard.deliveries WHERE status = 'failed'",
        )
        .fetch_optional(&app.db)
        .await
        .unwrap();
        if let Some(error) = failed {
            break error.unwrap_or_default();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the message did not fail"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(error.contains("window_content_sid"), "{error}");
    assert_eq!(whatsapp_sent(&app).len(), 1, "nothing sent that would fail");
    app.shutdown().await;
}

const DEAD_LEASE: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_part_twilio_took_before_its_deliverer_died_is_found_in_its_log_not_sent_again() {
    let app = spawn_app_with(AppOptions::all_but("deliver")).await;
    let message = app.twilio_whatsapp_params(ANA, "did you get that", "SMwa0007");
    assert_eq!(app.post_twilio_whatsapp(&message).await.status(), 200);
    let reply = app.wait_for_reply(&[], WAIT).await;
    assert_eq!(reply.provider, "twilio_whatsapp");
    app.deliverer_dies_sending(&reply, DEAD_LEASE, 0, true)
        .await;
    assert_eq!(whatsapp_sent(&app).len(), 1);

    app.start_stage("deliver");
    let (status, _) = app.wait_for_delivery(&reply, Duration::from_secs(90)).await;
    app.settle().await;
    assert_eq!(status, "sent", "found in Twilio's log");
    assert_eq!(whatsapp_sent(&app).len(), 1, "never sent a second time");
    assert!(app.twilio.lookups() >= 1, "Twilio's log was asked");
    app.shutdown().await;
}
