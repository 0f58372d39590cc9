//! Telegram: a bot's updates in (the webhook's secret token, a retried update one turn,
//! updates that carry no message acknowledged and counted), its replies out through the Bot
//! API (split at 4,096 UTF-16 units, a 429 waited out as long as Telegram says, files uploaded),
//! a person's photo in the session's workspace, and a Telegram user who proves their phone one
//! session with its SMS.
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use switchboard_e2e::fakes::person_of;
use switchboard_e2e::{
    FakeRunner, TELEGRAM_BOT_TOKEN, TELEGRAM_SECRET, spawn_app, spawn_app_configured,
};
use switchboard_fakes::telegram::{photo_update, text_update};

const WAIT: Duration = Duration::from_secs(20);
/// A Telegram user; their private chat with the bot has the same id.
const ANA: i64 = 424_242;
const PHONE: &str = "+14155550199";

#[tokio::test]
async fn a_telegram_message_is_answered_once_in_its_chat_even_when_telegram_sends_it_again() {
    let app = spawn_app().await;
    let first = app.telegram_says(ANA, "hello bot", 9001).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.text().await.unwrap(), "{}");
    // Telegram sends an update again until it is answered: the same message, one turn.
    let again = app.telegram_says(ANA, "hello bot", 9001).await;
    assert_eq!(again.status(), 200);

    let sent = app.wait_for_telegram(1, WAIT).await;
    app.settle().await;
    assert_eq!(app.telegram.sent().len(), 1, "one reply: {sent:?}");
    assert_eq!(
        (sent[0].method.as_str(), sent[0].chat_id.as_str()),
        ("sendMessage", "424242")
    );
    assert_eq!(sent[0].text, "echo: hello bot");
    assert_eq!(
        app.runner.calls().len(),
        1,
        "the retry was not a second turn"
    );
    assert!(app.twilio.sent().is_empty(), "answered where it was asked");

    let rows = app.log_rows().await;
    let inbound = rows.iter().find(|r| r.direction == "inbound").unwrap();
    assert_eq!(inbound.person_id, "telegram:424242");
    let (status, ids, provider): (String, Vec<String>, String) =
        sqlx::query_as("SELECT status, provider_message_ids, provider FROM switchboard.deliveries")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((status.as_str(), provider.as_str()), ("sent", "telegram"));
    assert_eq!(
        ids,
        [sent[0].message_id.to_string()],
        "Telegram's own message id"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn an_update_without_the_webhooks_secret_token_is_refused_counted_and_publishes_nothing() {
    let app = spawn_app().await;
    let update = text_update(9101, ANA, ANA, "private", "let me in");
    for secret in ["", "tg-secret-3b9", "tg-secret-3b9cX", "TG-SECRET-3B9C"] {
        let resp = app.post_telegram(&update, secret).await;
        assert_eq!(resp.status(), 401, "secret {secret:?}");
        let err: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(err["error"]["code"], "invalid_secret_token");
    }
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(
            "sb_gateway_rejected_total{channel=\"telegram\",reason=\"invalid_secret_token\",provider=\"telegram\"} 4"
        ),
        "{metrics}"
    );
    app.assert_nothing_reached_the_pipeline().await;
    app.shutdown().await;
}

#[tokio::test]
async fn updates_that_carry_no_message_for_us_are_acknowledged_and_counted_not_answered() {
    let app = spawn_app().await;
    let edit = json!({"update_id": 9201, "edited_message": {"message_id": 1,
        "chat": {"id": ANA, "type": "private"}, "date": 1, "text": "edited"}});
    let group = text_update(9202, ANA, -4_001_234, "group", "hi everyone");
    for update in [&edit, &group] {
        let resp = app.post_telegram(update, TELEGRAM_SECRET).await;
        assert_eq!(
            resp.status(),
            200,
            "acknowledged, so Telegram does not retry"
        );
    }
    let metrics = app.metrics().await;
    for reason in ["edited_message", "group_not_configured"] {
        assert!(
            metrics.contains(&format!(
                "sb_gateway_ignored_total{{channel=\"telegram\",provider=\"telegram\",reason=\"{reason}\"}} 1"
            )),
            "{reason}: {metrics}"
        );
    }
    app.assert_nothing_reached_the_pipeline().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_long_reply_is_split_at_telegrams_limit_and_a_429_is_waited_out_as_long_as_it_says() {
    let app = spawn_app().await;
    // 10,000 characters, a quarter of them emoji (two UTF-16 units each).
    let long: String = (0..2000)
        .map(|i| if i % 4 == 0 { "😀😀 " } else { "word " })
        .collect();
    let answer = long.clone();
    app.runner.answer_with(move |_, _| answer.clone());
    app.telegram.throttle_next(1, 3);

    let asked = chrono::Utc::now();
    assert_eq!(
        app.telegram_says(ANA, "tell me everything", 9301)
            .await
            .status(),
        200
    );
    app.wait_for_telegram(3, WAIT).await;
    app.settle().await;
    let sent = app.telegram.sent();
    assert!(
        sent.iter().all(|m| m.text.encode_utf16().count() <= 4096),
        "every message within Telegram's limit"
    );
    let whole: Vec<&str> = sent.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(
        whole.join(" "),
        long.trim_end(),
        "all of it, in order, once"
    );
    assert_eq!(
        app.telegram.requests(),
        sent.len() + 1,
        "one refused request, then each part once"
    );
    // Telegram said "retry after 3" in its body alone; the first part went no sooner.
    let waited = sent[0].created - asked;
    assert!(
        waited >= chrono::Duration::seconds(3),
        "the first part went {waited:?} after the message came in"
    );
    assert!(
        app.metrics()
            .await
            .contains("sb_delivery_throttled_total{provider=\"telegram\"} 1")
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_photo_lands_in_the_workspace_and_a_file_the_agent_leaves_is_uploaded_to_the_chat() {
    let root = std::env::temp_dir().join(format!("sb-tg-{}", uuid::Uuid::new_v4().simple()));
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_configured(move |c| c.workspace.root = root_text).await;
    const REPORT: &str = "date,visits\n2026-12-01,14\n";
    app.runner.answer_with(|call, _| {
        let folder = PathBuf::from(call.workspace.clone().expect("a workspace"));
        std::fs::create_dir_all(folder.join("exports")).unwrap();
        std::fs::write(folder.join("exports/visits.csv"), REPORT).unwrap();
        format!("echo: {}", FakeRunner::said(&call.prompt))
    });
    let picture: Vec<u8> = (0..900u32).map(|i| (i % 253) as u8).collect();
    let file_id = app.telegram.add_file(picture.clone(), "image/jpeg");
    let update = photo_update(9401, ANA, ANA, &file_id, "the visits, please");
    assert_eq!(
        app.post_telegram(&update, TELEGRAM_SECRET).await.status(),
        200
    );

    let sent = app.wait_for_telegram(2, WAIT).await;
    app.settle().await;
    let call = &app.runner.calls()[0];
    let folder = PathBuf::from(call.workspace.clone().unwrap());
    let kept: Vec<_> = std::fs::read_dir(folder.join("attachments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read(&kept[0]).unwrap(), picture, "byte for byte");
    let name = kept[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        call.prompt.contains(&format!(
            "Attachment: attachments/{name} (image/jpeg, 900 B)"
        )),
        "{}",
        call.prompt
    );
    assert!(
        !call.prompt.contains(TELEGRAM_BOT_TOKEN),
        "the bot's token is never in a prompt"
    );

    assert_eq!(sent.len(), 2, "the text, then the file: {sent:?}");
    assert_eq!(
        (sent[0].method.as_str(), sent[0].text.as_str()),
        ("sendMessage", "echo: the visits, please")
    );
    assert_eq!(sent[1].method, "sendDocument");
    let upload = sent[1].upload.as_ref().expect("uploaded, not linked");
    assert_eq!(upload.file_name, "visits.csv");
    assert_eq!(upload.content_type, "text/csv");
    assert_eq!(upload.bytes, REPORT.as_bytes());
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT unnest(provider_message_ids) FROM switchboard.deliveries")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(ids.len(), 2, "each message recorded: {ids:?}");
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn a_telegram_user_who_proves_their_phone_is_one_session_with_the_sms_from_it() {
    let app = spawn_app().await;
    assert_eq!(app.telegram_says(ANA, "hello", 9501).await.status(), 200);
    app.wait_for_telegram(1, WAIT).await;

    app.telegram_says(ANA, &format!("link my phone {PHONE}"), 9502)
        .await;
    let code = app.code_texted_to(PHONE).await;
    app.telegram_says(ANA, &code, 9503).await;
    let answers = app.wait_for_telegram(3, WAIT).await;
    assert!(answers[2].text.starts_with("Linked"), "{answers:?}");

    // Now the phone's SMS are Ana's: the same session, answered by SMS.
    app.text_answered(PHONE, "texting now", 2).await;
    app.settle().await;
    let calls = app.runner.calls();
    assert_eq!(
        calls.len(),
        2,
        "the link messages were answered without the agent"
    );
    assert_eq!(person_of(&calls[1].prompt), "telegram:424242");
    assert_eq!(
        calls[1].session_id.as_deref(),
        Some("eng-1"),
        "the SMS turn resumes the Telegram turn's engine session"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_part_telegram_may_have_taken_before_its_deliverer_died_is_never_sent_again() {
    let app =
        switchboard_e2e::spawn_app_with(switchboard_e2e::AppOptions::all_but("deliver")).await;
    assert_eq!(
        app.telegram_says(ANA, "did you get that", 9601)
            .await
            .status(),
        200
    );
    let reply = app.wait_for_reply(&[], WAIT).await;
    // Telegram took the part, and the deliverer died before the ledger said so. The Bot API
    // keeps no log to ask: the part's outcome cannot be known.
    assert!(app.telegram.sent().is_empty());
    let error = app
        .a_dead_deliverers_unknowable_part_ends_the_reply(&reply)
        .await;
    assert_eq!(
        app.telegram.sent().len(),
        1,
        "taken once, never sent a second time"
    );
    assert!(error.contains("no log"), "says why: {error}");
    app.shutdown().await;
}
