//! Files an agent leaves in its session's `exports/` reach the person with the reply (seed 000
//! §12): as MMS media on Twilio, as a link in the text on TextMagic, as `attachments` in the
//! API's answer, each by a signed link that only this Switchboard makes, that expires, and
//! that dies with the person's data.
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use switchboard_e2e::{ChatClient, FakeCallbackReceiver, TestApp, spawn_app_configured};
use switchboard_fakes::runner::{FakeRunner, RunnerCall};
use switchboard_kit::exports::ExportLinkKeys;

const PERSON: &str = "+14155550177";
const WAIT: Duration = Duration::from_secs(20);
const REPORT: &str = "date,visits\n2026-12-01,14\n2026-12-02,17\n";
const CHANGED: &str = "date,visits\n2026-12-01,14\n2026-12-02,17\n2026-12-03,9\n";

async fn app_with_workspaces(max_export_bytes: u64) -> (TestApp, PathBuf) {
    let root = std::env::temp_dir().join(format!("sb-exports-{}", uuid::Uuid::new_v4().simple()));
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root_text;
        c.workspace.max_export_bytes = max_export_bytes;
    })
    .await;
    (app, root)
}

fn exports_of(call: &RunnerCall) -> PathBuf {
    let folder = PathBuf::from(call.workspace.clone().expect("a workspace"));
    let exports = folder.join("exports");
    std::fs::create_dir_all(&exports).unwrap();
    exports
}

/// The agent: asked for the report, it writes `exports/visits.csv`; asked to change it, it
/// writes the new one; anything else it only answers.
fn agent_that_writes_reports(app: &TestApp) {
    app.runner.answer_with(|call, _| {
        let said = FakeRunner::said(&call.prompt);
        if said.contains("change") {
            std::fs::write(exports_of(call).join("visits.csv"), CHANGED).unwrap();
        } else if said.contains("report") {
            std::fs::write(exports_of(call).join("visits.csv"), REPORT).unwrap();
        }
        format!("echo: {said}")
    });
}

async fn fetch(url: &str) -> reqwest::Response {
    reqwest::Client::new()
        .get(url)
        .send()
        .await
        .expect("gateway reachable")
}

async fn error_code(answer: reqwest::Response) -> (u16, String) {
    let status = answer.status().as_u16();
    let body: serde_json::Value = answer.json().await.unwrap_or_default();
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn a_report_the_agent_writes_reaches_the_person_by_mms_once_and_again_when_changed() {
    let (app, root) = app_with_workspaces(1_000_000).await;
    agent_that_writes_reports(&app);

    app.text_answered(PERSON, "send me the visits report", 1)
        .await;
    let sent = app.twilio.sent();
    assert_eq!(sent[0].body, "echo: send me the visits report");
    assert_eq!(sent[0].media_urls.len(), 1, "{:?}", sent[0]);
    let first = sent[0].media_urls[0].clone();
    assert!(first.contains("/api/v1/exports/"), "{first}");
    assert!(first.contains("/visits.csv?"), "{first}");
    // Twilio fetches it without credentials, as a person's phone would.
    let got = fetch(&first).await;
    assert_eq!(got.status(), 200);
    assert_eq!(got.headers()["content-type"], "text/csv");
    assert_eq!(got.headers()["x-content-type-options"], "nosniff");
    assert!(
        got.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .contains("visits.csv")
    );
    assert_eq!(got.text().await.unwrap(), REPORT);

    // The file is still there, unchanged: the next reply does not send it again.
    app.text_answered(PERSON, "thanks", 2).await;
    assert!(app.twilio.sent()[1].media_urls.is_empty());

    // Changed, it goes out again, by a link of its own; the first link still gives the first.
    app.text_answered(PERSON, "please change it", 3).await;
    let third = app.twilio.sent()[2].clone();
    assert_eq!(third.media_urls.len(), 1, "{third:?}");
    assert_ne!(third.media_urls[0], first);
    assert_eq!(
        fetch(&third.media_urls[0]).await.text().await.unwrap(),
        CHANGED
    );
    assert_eq!(fetch(&first).await.text().await.unwrap(), REPORT);

    // The outbound log says what went with the reply.
    app.settle().await;
    let logged: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT metadata->'exports' FROM switchboard.messages
          WHERE direction = 'outbound' AND metadata ? 'exports' ORDER BY created_at",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(logged.len(), 2, "{logged:?}");
    assert_eq!(logged[0][0]["name"], "visits.csv");
    assert_eq!(logged[0][0]["size_bytes"], REPORT.len());
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test]
async fn a_link_is_honoured_only_as_this_switchboard_signed_it_and_until_it_expires() {
    let (app, root) = app_with_workspaces(1_000_000).await;
    agent_that_writes_reports(&app);
    app.text_answered(PERSON, "the report please", 1).await;
    let url = app.twilio.sent()[0].media_urls[0].clone();
    assert_eq!(fetch(&url).await.status(), 200);

    let (path, query) = url.split_once('?').unwrap();
    let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let exp = &params.iter().find(|(k, _)| k == "exp").unwrap().1;
    let sig = &params.iter().find(|(k, _)| k == "sig").unwrap().1;
    let mut flipped = sig.clone().into_bytes();
    flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
    let flipped = String::from_utf8(flipped).unwrap();
    let later = exp.parse::<i64>().unwrap() + 86_400;
    let id: uuid::Uuid = path.split('/').rev().nth(1).unwrap().parse().unwrap();
    let other_path = path.replace(&id.to_string(), &uuid::Uuid::new_v4().to_string());

    for (case, tried, want) in [
        ("no signature", path.to_string(), (403, "unsigned")),
        (
            "an altered signature",
            format!("{path}?exp={exp}&sig={flipped}"),
            (403, "bad_signature"),
        ),
        (
            "a later expiry",
            format!("{path}?exp={later}&sig={sig}"),
            (403, "bad_signature"),
        ),
        (
            "another file's id",
            format!("{other_path}?exp={exp}&sig={sig}"),
            (403, "bad_signature"),
        ),
    ] {
        let (status, code) = error_code(fetch(&tried).await).await;
        assert_eq!((status, code.as_str()), want, "{case}: {tried}");
    }

    // Signed as this Switchboard signs, but past its expiry: gone, and it says so.
    let keys = ExportLinkKeys::new(app.db.clone(), &app.config);
    let links = keys.get().await.unwrap();
    let past = chrono::Utc::now() - chrono::Duration::minutes(1);
    let expired = links.link(id, "visits.csv", "text/csv", 10, past);
    assert_eq!(
        error_code(fetch(&expired.url).await).await,
        (410, "expired".into())
    );
    // Signed and current, for a file never sent: not found.
    let future = chrono::Utc::now() + chrono::Duration::hours(1);
    let unknown = links.link(uuid::Uuid::new_v4(), "x.csv", "text/csv", 10, future);
    assert_eq!(
        error_code(fetch(&unknown.url).await).await,
        (404, "not_found".into())
    );
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test]
async fn textmagic_carries_the_link_in_the_text_and_the_api_lists_attachments() {
    let (app, root) = app_with_workspaces(1_000_000).await;
    agent_that_writes_reports(&app);

    let accepted = app
        .send_textmagic_sms("14155550178", "the report please", 9_177_001)
        .await;
    assert_eq!(accepted.status(), 200);
    let sent = app.wait_for_textmagic(1, WAIT).await;
    let body = &sent[0].body;
    assert!(body.starts_with("echo: the report please"), "{body}");
    let link = body
        .split_whitespace()
        .find(|w| w.contains("/api/v1/exports/"))
        .unwrap_or_else(|| panic!("a link in {body:?}"));
    assert!(body.contains("visits.csv"), "{body}");
    assert_eq!(fetch(link).await.text().await.unwrap(), REPORT);

    let key = app.api_key("crm", &[]).await;
    let answer = app
        .post_api_message(
            &key,
            json!({"agent": "reggie_oc", "text": "the report please", "wait": true}),
            None,
        )
        .await;
    assert_eq!(answer.status(), 200);
    let answer: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(answer["status"], "answered", "{answer}");
    let reply = &answer["replies"][0];
    assert_eq!(reply["text"], "echo: the report please", "{answer}");
    let attached = &reply["attachments"][0];
    assert_eq!(attached["name"], "visits.csv", "{answer}");
    assert_eq!(attached["content_type"], "text/csv");
    assert_eq!(attached["size_bytes"], REPORT.len());
    assert!(attached["expires_at"].is_string(), "{answer}");
    let url = attached["url"].as_str().unwrap();
    assert_eq!(fetch(url).await.text().await.unwrap(), REPORT);
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test]
async fn a_chat_reply_frame_and_a_webhook_callback_list_the_file_with_its_link() {
    let shop = FakeCallbackReceiver::start("shop-secret-77").await;
    let shop_url = shop.url.clone();
    let root = std::env::temp_dir().join(format!("sb-exports-{}", uuid::Uuid::new_v4().simple()));
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root_text;
        c.webhooks.insert(
            "shop".into(),
            switchboard_kit::config::WebhookSourceConfig {
                secret: switchboard_kit::config::Secret::new("shop-secret-77"),
                sender_field: "user.id".into(),
                callback_url: shop_url,
                ..Default::default()
            },
        );
    })
    .await;
    agent_that_writes_reports(&app);

    let mut chat = ChatClient::as_user(&app.gateway_url, "ana").await;
    chat.say("m-exports-1", "the report please").await;
    let frame = chat.reply(WAIT).await;
    assert_eq!(frame["text"], "echo: the report please", "{frame}");
    let attached = &frame["attachments"][0];
    assert_eq!(attached["name"], "visits.csv", "{frame}");
    assert_eq!(attached["size_bytes"], REPORT.len());
    let url = attached["url"].as_str().unwrap();
    assert_eq!(fetch(url).await.text().await.unwrap(), REPORT);

    let event = serde_json::to_vec(&json!({
        "id": "evt-exports-1", "user": {"id": "u-77"}, "text": "the report please",
    }))
    .unwrap();
    let accepted = app
        .post_webhook(
            "shop",
            "shop-secret-77",
            chrono::Utc::now().timestamp(),
            &event,
        )
        .await;
    assert_eq!(accepted.status(), 200);
    let callback = shop.wait_for(1, WAIT).await[0].body.clone();
    assert!(
        callback["text"].as_str().unwrap().starts_with("echo: "),
        "{callback}"
    );
    let attached = &callback["attachments"][0];
    assert_eq!(attached["name"], "visits.csv", "{callback}");
    assert_eq!(attached["content_type"], "text/csv");
    let url = attached["url"].as_str().unwrap();
    assert_eq!(fetch(url).await.text().await.unwrap(), REPORT);
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test]
async fn a_file_too_large_or_not_the_agents_own_is_not_sent_and_the_person_is_told_once() {
    let (app, root) = app_with_workspaces(1_000).await;
    let secret = root.join("host-secret.txt");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(&secret, "the host's own file").unwrap();
    let planted = secret.clone();
    app.runner.answer_with(move |call, _| {
        let said = FakeRunner::said(&call.prompt);
        let exports = exports_of(call);
        if said.contains("everything") {
            std::fs::write(exports.join("summary.txt"), "all fine").unwrap();
            std::fs::write(exports.join("scan.bin"), vec![7u8; 5_000]).unwrap();
            std::fs::hard_link(&planted, exports.join("notes.txt")).unwrap();
            std::os::unix::fs::symlink(&planted, exports.join("passwd.txt")).unwrap();
        }
        format!("echo: {said}")
    });

    app.text_answered(PERSON, "send everything", 1).await;
    let first = app.twilio.sent()[0].clone();
    assert_eq!(first.media_urls.len(), 1, "only the small file: {first:?}");
    assert_eq!(
        fetch(&first.media_urls[0]).await.text().await.unwrap(),
        "all fine"
    );
    assert!(
        first
            .body
            .contains("Not sent: notes.txt (a hard link, not a file of its own); scan.bin (larger than 1000 B); passwd.txt (a link, not a file)"),
        "{}",
        first.body
    );
    assert!(!first.body.contains("host's own"), "{}", first.body);
    // Told once: the next reply neither repeats it nor sends anything.
    app.text_answered(PERSON, "ok", 2).await;
    let second = app.twilio.sent()[1].clone();
    assert_eq!(second.body, "echo: ok");
    assert!(second.media_urls.is_empty());
    // What was refused was never read into the store.
    let stored: Vec<Option<Vec<u8>>> = sqlx::query_scalar("SELECT data FROM switchboard.exports")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert!(
        stored.iter().flatten().all(|d| d.as_slice() == b"all fine"),
        "{stored:?}"
    );
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test]
async fn in_a_session_shared_by_everyone_a_person_gets_only_what_their_turn_wrote() {
    let root = std::env::temp_dir().join(format!("sb-exports-{}", uuid::Uuid::new_v4().simple()));
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root_text;
        c.session.scope = switchboard_kit::config::SessionScope::Main;
    })
    .await;
    agent_that_writes_reports(&app);
    app.text_answered("+14155550181", "hello", 1).await;
    // Something left in exports/ before the next person's turn (by an earlier turn, say),
    // never sent to anyone: not theirs to get.
    let exports = exports_of(&app.runner.calls()[0]);
    let earlier = exports.join("someone-elses.txt");
    std::fs::write(&earlier, "another person's notes").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&earlier)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(600))
        .unwrap();

    app.text_answered("+14155550182", "the report please", 2)
        .await;
    let second = app.twilio.sent()[1].clone();
    assert_eq!(second.to, "+14155550182");
    assert_eq!(second.media_urls.len(), 1, "{second:?}");
    assert!(second.media_urls[0].contains("/visits.csv?"), "{second:?}");
    assert_eq!(
        fetch(&second.media_urls[0]).await.text().await.unwrap(),
        REPORT
    );
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test]
async fn forgetting_the_person_makes_their_links_dead() {
    let (app, root) = app_with_workspaces(1_000_000).await;
    agent_that_writes_reports(&app);
    app.text_answered(PERSON, "the report please", 1).await;
    let url = app.twilio.sent()[0].media_urls[0].clone();
    assert_eq!(fetch(&url).await.status(), 200);
    app.settle().await;

    let person: String = sqlx::query_scalar("SELECT person_id FROM switchboard.sessions LIMIT 1")
        .fetch_one(&app.db)
        .await
        .unwrap();
    app.cli_ok(&["forget", &person, "--json"]).await;
    assert_eq!(
        error_code(fetch(&url).await).await,
        (404, "not_found".into())
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.exports")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(left, 0);
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(root);
}
