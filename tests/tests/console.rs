//! The ops console in a real browser (headless Chromium), as support staff and an operator use
//! it: sign in with an API key, find a person's session, read its transcript, search, see the
//! category chart, and replay a dead letter once its cause is gone, after which the person is
//! answered. Screenshots in target/screenshots/console_*/.
use std::time::{Duration, Instant};

use fantoccini::Locator;
use switchboard_e2e::browser::Browser;
use switchboard_e2e::{TestApp, chat_token, spawn_app, spawn_app_configured};

const WAIT: Duration = Duration::from_secs(30);
const NURSE: &str = "+14155550901";
const PORTER: &str = "+14155550902";

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn an_operator_key(app: &TestApp) -> String {
    app.api_key(
        "ops-desk",
        &[
            "sessions:read",
            "search:read",
            "analytics:read",
            "ops:read",
            "ops:write",
        ],
    )
    .await
}

#[tokio::test]
async fn console_support_finds_a_transcript_searches_and_replays_a_dead_letter() {
    let app = spawn_app().await;
    app.runner
        .answer_when("night shift", "Your next night shift is Friday.");
    assert_eq!(
        app.send_sms(NURSE, "when is my next night shift?")
            .await
            .status(),
        200
    );
    app.wait_for_sms(1, WAIT).await;
    // The porter's message dies: the agent host refuses it (a 4xx no retry can fix).
    app.runner.fail_next(1, 422);
    assert_eq!(
        app.send_sms(PORTER, "the lift on ward 3 is stuck")
            .await
            .status(),
        200
    );
    wait_for("a dead letter", async || {
        app.dead_letters("dispatch").await.len() == 1
    })
    .await;
    app.settle().await;
    let key = an_operator_key(&app).await;

    let browser = Browser::start("console_support").await;
    browser.goto(&format!("{}/console", app.admin_url)).await;
    // A wrong key is refused with the reason.
    let input = browser.element("#login-key").await;
    input.send_keys("sbk_not-a-key").await.unwrap();
    browser.click("#login-form button").await;
    browser
        .texts_until("#login-error", "the refusal", |t| {
            t.first().is_some_and(|t| !t.is_empty())
        })
        .await;
    browser.screenshot("refused").await;
    let input = browser.element("#login-key").await;
    input.clear().await.unwrap();
    input.send_keys(&key).await.unwrap();
    browser.click("#login-form button").await;
    browser
        .texts_until("#who", "signed in", |t| {
            t.first().is_some_and(|t| t == "ops-desk")
        })
        .await;

    // Find the nurse's session and read it.
    let person = format!("phone:{NURSE}");
    browser
        .type_into("#sessions-filter input[name=person]", &person)
        .await;
    browser.click("#sessions-filter button").await;
    let rows = browser
        .texts_until("#sessions-table tbody tr", "the nurse's session", |t| {
            t.len() == 1 && t[0].contains(&person)
        })
        .await;
    assert!(rows[0].contains("reggie_oc"), "{rows:?}");
    browser.screenshot("sessions").await;
    browser.click("#sessions-table tbody tr").await;
    let transcript = browser
        .texts_until("#transcript li", "the transcript", |t| {
            t.iter()
                .any(|t| t.contains("Your next night shift is Friday."))
        })
        .await;
    assert!(
        transcript
            .iter()
            .any(|t| t.contains("when is my next night shift?")),
        "{transcript:?}"
    );
    browser.screenshot("transcript").await;

    // Search by words.
    browser.click("nav button[data-view=search]").await;
    browser.type_into("#search-q", "night shift\n").await;
    let hits = browser
        .texts_until("#search-results li", "search hits", |t| {
            t.iter().any(|t| t.contains("when is my next night shift?"))
        })
        .await;
    // The words match the nurse's exchange only; the porter's message may follow, found by
    // meaning alone, never above them.
    assert!(hits[0].contains("night shift"), "{hits:?}");
    for h in hits.iter().filter(|h| h.contains("lift on ward 3")) {
        assert!(
            h.contains("found by meaning") && !h.contains("words"),
            "{hits:?}"
        );
    }
    browser.screenshot("search").await;

    // The category chart draws.
    browser.click("nav button[data-view=categories]").await;
    browser
        .element("#categories-chart svg rect[data-label]")
        .await;
    browser.screenshot("categories").await;

    // Operations: the dead letter, replayed once the agent host takes it again.
    browser.click("nav button[data-view=operations]").await;
    let stage = browser
        .texts_until(
            "#stages-table tr[data-stage=dispatch]",
            "dispatch's row",
            |t| t.len() == 1,
        )
        .await;
    assert!(stage[0].ends_with('1'), "one dead letter: {stage:?}");
    browser
        .texts_until("#dlq-table tbody tr[data-seq]", "the dead letter", |t| {
            t.len() == 1 && t[0].contains("422")
        })
        .await;
    browser.screenshot("dead-letter").await;
    browser
        .client
        .find(Locator::Css("#dlq-table button.replay"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .texts_until(
            "#dlq-table tbody tr[data-seq]",
            "the replayed letter gone",
            |t| t.is_empty(),
        )
        .await;
    let answered = app.wait_for_sms(2, WAIT).await;
    assert!(
        answered.iter().any(|s| s.to == PORTER),
        "the porter is answered after the replay: {answered:?}"
    );
    browser.screenshot("replayed").await;
    browser.close().await;
}

/// By default no JWT opens the console, an admin's chat token included: API keys only.
#[tokio::test]
async fn console_by_default_no_chat_token_signs_in() {
    let app = spawn_app().await;
    let http = reqwest::Client::new();
    for path in ["/console/api/me", "/console/api/status", "/api/v1/sessions"] {
        let admin = http
            .get(format!("{}{path}", app.admin_url))
            .bearer_auth(chat_token(
                "staff:ana",
                serde_json::json!({"role": "admin"}),
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(admin.status(), 401, "{path}");
    }
    app.shutdown().await;
}

#[tokio::test]
async fn console_an_operator_token_signs_in_and_a_chat_users_does_not() {
    let app = spawn_app_configured(|c| {
        c.chat.jwt_audience = "switchboard-chat".into();
        c.console.jwt_roles = vec!["admin".into()];
        c.console.jwt_audience = "switchboard-console".into();
    })
    .await;
    let http = reqwest::Client::new();
    let me = |token: String| {
        http.get(format!("{}/console/api/me", app.admin_url))
            .bearer_auth(token)
            .send()
    };
    let operator = me(chat_token(
        "staff:ana",
        serde_json::json!({"role": "admin", "aud": "switchboard-console"}),
    ))
    .await
    .unwrap();
    assert_eq!(operator.status(), 200);
    let body: serde_json::Value = operator.json().await.unwrap();
    assert_eq!(body["owner"], "operator.staff:ana");
    // The same admin's chat token (the chat's audience, or none) does not sign in.
    for claims in [
        serde_json::json!({"role": "admin", "aud": "switchboard-chat"}),
        serde_json::json!({"role": "admin"}),
    ] {
        let chat = me(chat_token("staff:ana", claims.clone())).await.unwrap();
        assert_eq!(chat.status(), 401, "{claims}");
    }
    let visitor = me(chat_token(
        "web:visitor",
        serde_json::json!({"aud": "switchboard-console"}),
    ))
    .await
    .unwrap();
    assert_eq!(visitor.status(), 403);
    // The public address never takes a JWT for its API.
    let public = http
        .get(format!("{}/api/v1/sessions", app.gateway_url))
        .bearer_auth(chat_token(
            "staff:ana",
            serde_json::json!({"role": "admin", "aud": "switchboard-console"}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(public.status(), 401);
    // Reading the status needs ops:read.
    let key = app.api_key("crm", &["sessions:read"]).await;
    let status = http
        .get(format!("{}/console/api/status", app.admin_url))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 403);
    app.shutdown().await;
}
