//! Slack: an app's Events API in (the v0 signature and its five-minute window, the URL
//! verification challenge, Slack's retries one turn, the app's own replies and edits never a
//! turn), its replies out with `chat.postMessage` in the conversation and thread they answer
//! (split at 4,000 characters, a 429 waited out as long as Slack says), a part Slack took
//! before its deliverer died found in the history and not sent again, a person's file in the
//! workspace, the agent's files uploaded to the conversation (and one Slack took before its
//! deliverer died found there, not uploaded again), and a Slack user who proves their phone
//! one session with its SMS.
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use switchboard_e2e::fakes::person_of;
use switchboard_e2e::{
    AppOptions, FakeRunner, SLACK_SIGNING_SECRET, SLACK_TEAM, TestApp, spawn_app,
    spawn_app_configured, spawn_app_with,
};
use switchboard_fakes::slack::{
    bot_message_event, dm_event, dm_file_event, edited_event, mention_event, url_verification,
};

const WAIT: Duration = Duration::from_secs(20);
const ANA: &str = "U0ANA0001";
const ANA_DM: &str = "D0ANA0001";
const PHONE: &str = "+14155550166";

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

#[tokio::test]
async fn the_url_verification_challenge_is_answered_only_when_signed_by_the_app() {
    let app = spawn_app().await;
    let challenge = url_verification("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P");
    let resp = app.post_slack(&challenge).await;
    assert_eq!(resp.status(), 200);
    let answer: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        answer,
        json!({"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"})
    );
    let forged = app
        .post_slack_signed(&challenge, "not-the-secret", now(), None)
        .await;
    assert_eq!(forged.status(), 401);
    app.shutdown().await;
}

#[tokio::test]
async fn a_direct_message_is_answered_once_in_its_conversation_though_slack_sends_it_again() {
    let app = spawn_app().await;
    let event = dm_event(
        SLACK_TEAM,
        "Ev0DM0001",
        ANA,
        ANA_DM,
        "hello app & <friends>",
        "1700000000.000100",
    );
    assert_eq!(app.post_slack(&event).await.status(), 200);
    // Slack sends an event again when the answer was late, with its retry headers.
    let retry = app
        .post_slack_signed(&event, SLACK_SIGNING_SECRET, now(), Some(1))
        .await;
    assert_eq!(retry.status(), 200);

    let posted = app.wait_for_slack(1, WAIT).await;
    app.settle().await;
    assert_eq!(app.slack.posted().len(), 1, "one reply: {posted:?}");
    assert_eq!(posted[0].channel, ANA_DM);
    assert_eq!(
        posted[0].thread_ts, None,
        "a direct message is answered in the conversation"
    );
    assert_eq!(
        posted[0].text, "echo: hello app &amp; &lt;friends&gt;",
        "the person's text unescaped for the agent, the reply escaped for Slack"
    );
    assert_eq!(
        app.runner.calls().len(),
        1,
        "the retry was not a second turn"
    );

    let rows = app.log_rows().await;
    let inbound = rows.iter().find(|r| r.direction == "inbound").unwrap();
    assert_eq!(inbound.person_id, format!("slack:{SLACK_TEAM}:{ANA}"));
    assert_eq!(inbound.message, "hello app & <friends>");
    let (status, ids): (String, Vec<String>) =
        sqlx::query_as("SELECT status, provider_message_ids FROM switchboard.deliveries")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(status, "sent");
    assert_eq!(ids, [posted[0].ts.clone()], "Slack's own ts");
    app.shutdown().await;
}

#[tokio::test]
async fn a_forged_or_stale_event_is_refused_counted_and_publishes_nothing() {
    let app = spawn_app().await;
    let event = dm_event(
        SLACK_TEAM,
        "Ev0FORGED",
        ANA,
        ANA_DM,
        "let me in",
        "1700000000.000200",
    );
    let forged = app.post_slack_signed(&event, "guessed", now(), None).await;
    assert_eq!(forged.status(), 401);
    let err: serde_json::Value = forged.json().await.unwrap();
    assert_eq!(err["error"]["code"], "invalid_signature");
    // Captured and replayed six minutes later: outside Slack's five-minute window.
    let stale = app
        .post_slack_signed(&event, SLACK_SIGNING_SECRET, now() - 360, None)
        .await;
    assert_eq!(stale.status(), 401);
    let err: serde_json::Value = stale.json().await.unwrap();
    assert_eq!(err["error"]["code"], "stale_timestamp");
    let metrics = app.metrics().await;
    for reason in ["invalid_signature", "stale_timestamp"] {
        assert!(
            metrics.contains(&format!(
                "sb_gateway_rejected_total{{channel=\"slack\",reason=\"{reason}\",provider=\"slack\"}} 1"
            )),
            "{reason}: {metrics}"
        );
    }
    app.assert_nothing_reached_the_pipeline().await;
    app.shutdown().await;
}

#[tokio::test]
async fn the_apps_own_replies_and_edits_are_acknowledged_and_never_a_turn() {
    let app = spawn_app().await;
    let own = bot_message_event(
        SLACK_TEAM,
        "Ev0BOT",
        &app.slack.bot_id,
        ANA_DM,
        "echo: hi",
        "1700000001.000100",
    );
    let edit = edited_event(
        SLACK_TEAM,
        "Ev0EDIT",
        ANA,
        ANA_DM,
        "1700000002.000100",
        "hi",
        "hi (edited)",
    );
    for event in [&own, &edit] {
        assert_eq!(app.post_slack(event).await.status(), 200);
    }
    let metrics = app.metrics().await;
    for reason in ["from_a_bot", "message_subtype"] {
        assert!(
            metrics.contains(&format!(
                "sb_gateway_ignored_total{{channel=\"slack\",provider=\"slack\",reason=\"{reason}\"}} 1"
            )),
            "{reason}: {metrics}"
        );
    }
    app.assert_nothing_reached_the_pipeline().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_mention_is_answered_in_its_thread_split_at_slacks_limit_after_a_429_waited_out() {
    let app = spawn_app().await;
    let long: String = (0..1800).map(|i| format!("w{} ", i % 10)).collect(); // 5,400 chars
    let answer = long.clone();
    app.runner.answer_with(move |_, _| answer.clone());
    app.slack.throttle_next(1, 2);

    let asked = chrono::Utc::now();
    let mention = mention_event(
        SLACK_TEAM,
        "Ev0MENTION",
        ANA,
        "C0SUPPORT",
        &format!("<@{}> tell me everything", app.slack.bot_user_id),
        "1700000100.000100",
        None,
    );
    assert_eq!(app.post_slack(&mention).await.status(), 200);
    app.wait_for_slack(2, WAIT).await;
    app.settle().await;
    let posted = app.slack.posted();
    assert_eq!(posted.len(), 2, "{posted:?}");
    for p in &posted {
        assert_eq!(p.channel, "C0SUPPORT");
        assert_eq!(
            p.thread_ts.as_deref(),
            Some("1700000100.000100"),
            "in the thread under the mention"
        );
        assert!(p.text.chars().count() <= 4000);
    }
    let whole: Vec<&str> = posted.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(whole.join(" "), long.trim_end());
    assert_eq!(
        first_said(&app),
        "tell me everything",
        "the agent is told what was said, without the mention"
    );
    // Slack said "Retry-After: 2"; the first part went no sooner.
    let waited = posted[0].created - asked;
    assert!(
        waited >= chrono::Duration::seconds(2),
        "went {waited:?} after the mention"
    );
    assert_eq!(
        app.slack.post_requests(),
        3,
        "one refused, then each part once"
    );
    app.shutdown().await;
}

/// What the agent was told in the first turn.
fn first_said(app: &switchboard_e2e::TestApp) -> String {
    switchboard_e2e::FakeRunner::said(&app.runner.calls()[0].prompt)
}

/// The lease of a deliverer that dies holding a reply: short, so the test need not wait 45 s.
const DEAD_LEASE: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_part_slack_took_before_its_deliverer_died_is_found_in_the_history_not_sent_again() {
    let app = spawn_app_with(AppOptions::all_but("deliver")).await;
    let event = dm_event(
        SLACK_TEAM,
        "Ev0DIES",
        ANA,
        ANA_DM,
        "did you get that",
        "1700000200.000100",
    );
    app.post_slack(&event).await;
    let reply = app.wait_for_reply(&[], WAIT).await;
    app.deliverer_dies_sending(&reply, DEAD_LEASE, 0, true)
        .await;
    let taken = app.slack.posted();
    assert_eq!(taken.len(), 1);
    // The history is down for a while: the part waits rather than go out blind.
    app.slack.history_failures.fail_next(2, 503);

    app.start_stage("deliver");
    let (status, ids) = app.wait_for_delivery(&reply, WAIT).await;
    app.settle().await;
    let posted = app.slack.posted();
    assert_eq!(posted.len(), 1, "the person got the reply once: {posted:?}");
    assert_eq!(status, "sent");
    assert_eq!(
        ids,
        [taken[0].ts.clone()],
        "the ledger has Slack's ts from the history"
    );
    assert!(
        app.slack.history_lookups() >= 3,
        "asked until it could read it"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_file_a_person_shares_lands_in_the_workspace_byte_for_byte() {
    let root = std::env::temp_dir().join(format!("sb-slack-{}", uuid::Uuid::new_v4().simple()));
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_configured(move |c| c.workspace.root = root_text).await;
    let picture: Vec<u8> = (0..800u32).map(|i| (i % 249) as u8).collect();
    let file = app
        .slack
        .add_file(picture.clone(), "image/png", "chart.png");
    let event = dm_file_event(
        SLACK_TEAM,
        "Ev0FILE",
        ANA,
        ANA_DM,
        "see this",
        "1700000300.000100",
        file,
    );
    assert_eq!(app.post_slack(&event).await.status(), 200);
    app.wait_for_slack(1, WAIT).await;
    let call = &app.runner.calls()[0];
    let folder = std::path::PathBuf::from(call.workspace.clone().expect("a workspace"));
    let kept: Vec<_> = std::fs::read_dir(folder.join("attachments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read(&kept[0]).unwrap(), picture);
    assert!(
        call.prompt.contains("(image/png, 800 B)"),
        "{}",
        call.prompt
    );
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

/// What the agent leaves in `exports/`: a report whose bytes must arrive unchanged.
const REPORT: &str = "city,visits\nZürich,14\nSão Paulo,17\n";

/// An app whose agent answers with an echo and leaves `exports/visits.csv` ([`REPORT`]), with
/// `options`' stages; and the workspaces' root, to remove after.
async fn app_whose_agent_leaves_a_report(options: AppOptions) -> (TestApp, PathBuf) {
    let root = std::env::temp_dir().join(format!("sb-slack-{}", uuid::Uuid::new_v4().simple()));
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_with(options.configured(move |c| c.workspace.root = root_text)).await;
    app.runner.answer_with(|call, _| {
        let folder = PathBuf::from(call.workspace.clone().expect("a workspace"));
        std::fs::create_dir_all(folder.join("exports")).unwrap();
        std::fs::write(folder.join("exports/visits.csv"), REPORT).unwrap();
        format!("echo: {}", FakeRunner::said(&call.prompt))
    });
    (app, root)
}

/// The provider ids the ledger recorded for the reply, in part order.
async fn recorded_ids(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar("SELECT unnest(provider_message_ids) FROM switchboard.deliveries")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_file_the_agent_leaves_is_uploaded_once_to_the_thread_it_answers_byte_for_byte() {
    let (app, root) = app_whose_agent_leaves_a_report(AppOptions::default()).await;
    let mention = mention_event(
        SLACK_TEAM,
        "Ev0EXPORT",
        ANA,
        "C0SUPPORT",
        "the visits, please",
        "1700000500.000100",
        None,
    );
    assert_eq!(app.post_slack(&mention).await.status(), 200);
    let uploaded = app.wait_for_slack_files(1, WAIT).await;
    app.settle().await;

    let posted = app.slack.posted();
    assert_eq!(posted.len(), 1, "the text once: {posted:?}");
    assert_eq!(
        posted[0].text, "echo: the visits, please",
        "no link in the text"
    );
    assert_eq!(posted[0].thread_ts.as_deref(), Some("1700000500.000100"));
    let uploaded_now = app.slack.uploaded_files();
    assert_eq!(uploaded_now.len(), 1, "the file once: {uploaded_now:?}");
    let file = &uploaded[0];
    assert_eq!(file.name, "visits.csv");
    assert_eq!(file.bytes, REPORT.as_bytes(), "byte for byte");
    assert_eq!(file.channel, "C0SUPPORT");
    assert_eq!(
        file.thread_ts.as_deref(),
        Some("1700000500.000100"),
        "in the thread the reply answers"
    );
    assert!(file.ts > posted[0].ts, "after the text");
    assert_eq!(
        recorded_ids(&app).await,
        [posted[0].ts.clone(), file.id.clone()],
        "the text's ts, then the file's id"
    );
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn a_file_slack_took_before_its_deliverer_died_is_found_in_the_history_not_uploaded_again() {
    let (app, root) = app_whose_agent_leaves_a_report(AppOptions::all_but("deliver")).await;
    let event = dm_event(
        SLACK_TEAM,
        "Ev0UPDIES",
        ANA,
        ANA_DM,
        "the visits, please",
        "1700000600.000100",
    );
    app.post_slack(&event).await;
    let reply = app.wait_for_reply(&[], WAIT).await;
    assert_eq!(reply.exports.len(), 1, "{reply:?}");
    app.slack_deliverer_dies_uploading(&reply, DEAD_LEASE).await;
    let (posted, taken) = (app.slack.posted(), app.slack.uploaded_files());
    assert_eq!(
        (posted.len(), taken.len()),
        (1, 1),
        "the text, then the file"
    );
    assert_eq!(taken[0].channel, ANA_DM);
    let lookups = app.slack.history_lookups();

    app.start_stage("deliver");
    let (status, ids) = app.wait_for_delivery(&reply, WAIT).await;
    app.settle().await;
    assert_eq!(status, "sent");
    assert_eq!(
        app.slack.uploaded_files().len(),
        1,
        "the person got the file once"
    );
    assert_eq!(app.slack.posted().len(), 1, "and the text once");
    assert_eq!(
        ids,
        [posted[0].ts.clone(), taken[0].id.clone()],
        "the ledger has the file's id from the history"
    );
    assert!(
        app.slack.history_lookups() > lookups,
        "the history was asked"
    );
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn a_slack_user_who_proves_their_phone_is_one_session_with_the_sms_from_it() {
    let app = spawn_app().await;
    let say = |id: &str, text: &str, ts: &str| dm_event(SLACK_TEAM, id, ANA, ANA_DM, text, ts);
    app.post_slack(&say("Ev0P1", "hello", "1700000400.000100"))
        .await;
    app.wait_for_slack(1, WAIT).await;
    app.post_slack(&say(
        "Ev0P2",
        &format!("link my phone {PHONE}"),
        "1700000401.000100",
    ))
    .await;
    let code = app.code_texted_to(PHONE).await;
    app.post_slack(&say("Ev0P3", &code, "1700000402.000100"))
        .await;
    let answers = app.wait_for_slack(3, WAIT).await;
    assert!(answers[2].text.starts_with("Linked"), "{answers:?}");

    app.text_answered(PHONE, "texting now", 2).await;
    app.settle().await;
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        person_of(&calls[1].prompt),
        format!("slack:{SLACK_TEAM}:{ANA}")
    );
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));
    app.shutdown().await;
}
