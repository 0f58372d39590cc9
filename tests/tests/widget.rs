//! The chat widget in a real browser (headless Chromium): a third-party page embeds it with one
//! script tag and its own chat token; a visitor sends a message and sees the reply, reloads and
//! sees the conversation kept, loses the network while an answer is on its way and sees it
//! once the network is back. Screenshots in target/screenshots/widget_*/.
use std::time::{Duration, Instant};

use axum::response::Html;
use switchboard_e2e::browser::Browser;
use switchboard_e2e::tcp_cut::CuttableProxy;
use switchboard_e2e::{TestApp, chat_token, spawn_app_configured};

/// A site of its own (another origin than the gateway's), with the widget on it.
async fn host_page(gateway: &str, token: &str) -> String {
    let html = format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Acme staff portal</title></head>
<body><h1>Acme staff portal</h1><p>Questions? Ask in the chat.</p>
<script src="{gateway}/widget.js" data-agent="reggie_oc" data-token="{token}" data-title="Ask Reggie" data-heartbeat-s="2"></script>
</body></html>"#
    );
    let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(move || async move { Html(html) }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

/// The gateway handed the reply `text` to a socket of its person (`mailbox.pushed_at`).
async fn wait_until_handed(app: &TestApp, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM switchboard.mailbox WHERE text = $1 AND pushed_at IS NOT NULL",
        )
        .bind(text)
        .fetch_one(&app.db)
        .await
        .expect("read the mailbox");
        if n > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "'{text}' never handed to a socket"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn widget_a_visitor_keeps_the_conversation_across_a_reload_and_a_dropped_network() {
    // A workspace, so that files are taken.
    let root = std::env::temp_dir().join(format!("sb-widget-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&root).unwrap();
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_configured(move |c| c.workspace.root = root_text).await;
    app.runner
        .answer_when("when is my next shift", "Tuesday at 9, front desk.");
    app.runner
        .answer_when("and the one after", "Thursday at 7, loading dock.");
    let gateway: std::net::SocketAddr = app
        .gateway_url
        .trim_start_matches("http://")
        .parse()
        .expect("the gateway's address");
    let network = CuttableProxy::start(gateway).await;
    let token = chat_token("web:visitor-1", serde_json::json!({"name": "Visitor One"}));
    let page = host_page(&network.url(), &token).await;

    let browser = Browser::start("widget_a_visitor_keeps_the_conversation").await;
    browser.goto(&page).await;
    // Accessible: a labelled launcher that says whether the panel is open.
    let launcher = browser.element("#switchboard-widget .sbw-launch").await;
    assert_eq!(launcher.text().await.unwrap(), "Ask Reggie");
    assert_eq!(
        launcher.attr("aria-expanded").await.unwrap().as_deref(),
        Some("false")
    );
    launcher.click().await.unwrap();
    assert_eq!(
        launcher.attr("aria-expanded").await.unwrap().as_deref(),
        Some("true")
    );
    browser
        .attr_until("#switchboard-widget", "data-status", "connected", |s| {
            s == "Connected"
        })
        .await;
    // The message box has a label a screen reader reads out, and takes the keyboard.
    let input = browser.element("#switchboard-widget textarea").await;
    let id = input.attr("id").await.unwrap().unwrap();
    let label = browser
        .element(&format!("#switchboard-widget label[for='{id}']"))
        .await;
    assert_eq!(
        label.prop("textContent").await.unwrap().as_deref(),
        Some("Message")
    );
    input.send_keys("when is my next shift?\n").await.unwrap();
    browser
        .texts_until(".sbw-log li.sbw-reply", "the reply", |t| {
            t.iter().any(|t| t.contains("Tuesday at 9, front desk."))
        })
        .await;
    browser.screenshot("replied").await;

    // Reload: the conversation is still there, once each.
    browser.client.refresh().await.unwrap();
    browser.click("#switchboard-widget .sbw-launch").await;
    let kept = browser
        .texts_until(".sbw-log li", "the kept conversation", |t| t.len() >= 2)
        .await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept[0].contains("when is my next shift?"), "{kept:?}");
    assert!(kept[1].contains("Tuesday at 9, front desk."), "{kept:?}");
    browser
        .attr_until("#switchboard-widget", "data-status", "reconnected", |s| {
            s == "Connected"
        })
        .await;
    browser.screenshot("after-reload").await;

    // A quiet connection that works is kept: the widget's pings (every second here) are
    // answered, so it makes no new connection.
    let before = network.connections();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        network.connections(),
        before,
        "a working connection was dropped"
    );

    // The next answer takes a while, and meanwhile the network dies silently: the gateway
    // hands the answer to the socket, but its bytes never arrive.
    app.runner.set_hold(true);
    browser
        .type_into("#switchboard-widget textarea", "and the one after?\n")
        .await;
    browser
        .texts_until(".sbw-log li", "the second message shown", |t| t.len() == 3)
        .await;
    browser
        .texts_until(".sbw-log li.sbw-me.sbw-pending", "accepted", |t| {
            t.is_empty()
        })
        .await;
    network.blackhole();
    app.runner.set_hold(false);
    app.runner.release.notify_one();
    wait_until_handed(&app, "Thursday at 7, loading dock.").await;
    browser.screenshot("answered-into-a-dead-network").await;
    let lost = browser
        .texts_until(".sbw-log li", "in the dead network", |_| true)
        .await;
    assert!(
        !lost.iter().any(|t| t.contains("Thursday")),
        "the answer cannot have come through a dead network: {lost:?}"
    );
    // Nothing closes the connection: the widget notices by itself (its ping goes unanswered)
    // and keeps trying.
    browser
        .attr_until("#switchboard-widget", "data-status", "offline", |s| {
            s.to_lowercase().contains("reconnecting")
        })
        .await;

    // Back online: the widget asks for every reply after the last one it showed (`?since=`),
    // so the answer the gateway believed delivered is shown, and nothing twice.
    network.restore();
    let all = browser
        .texts_until(".sbw-log li", "the caught-up answer", |t| {
            t.iter().any(|t| t.contains("Thursday at 7, loading dock."))
        })
        .await;
    assert_eq!(all.len(), 4, "{all:?}");
    browser.screenshot("caught-up").await;

    // A file goes with a message: uploaded (cross-origin, with the token), then named by it.
    let rota = std::env::temp_dir().join(format!("rota-{}.txt", uuid::Uuid::new_v4().simple()));
    std::fs::write(&rota, "Mon 9-5\nTue off\n").unwrap();
    browser
        .element("#switchboard-widget input[type=file]")
        .await
        .send_keys(&rota.to_string_lossy())
        .await
        .unwrap();
    let input = browser.element("#switchboard-widget textarea").await;
    input.send_keys("here is my rota\n").await.unwrap();
    browser
        .texts_until(".sbw-log li.sbw-reply", "the reply to the file", |t| {
            t.iter().any(|t| t.contains("echo: here is my rota"))
        })
        .await;
    let call = app
        .runner
        .calls()
        .into_iter()
        .find(|c| c.prompt.contains("here is my rota"))
        .expect("the runner got the message");
    let name = rota.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        call.prompt.contains("Attachment: attachments/") && call.prompt.contains(&name),
        "{}",
        call.prompt
    );
    browser.screenshot("with-a-file").await;
    let _ = std::fs::remove_file(&rota);
    browser.close().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn widget_a_page_hands_its_token_from_its_own_login_endpoint() {
    let app = spawn_app_configured(|_| {}).await;
    let gateway = app.gateway_url.clone();
    // The site's own endpoint answers the signed-in user's token (here: always Bea's).
    let html = format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Rota</title></head>
<body><script src="{gateway}/widget.js" data-agent="reggie_oc" data-token-url="/my/chat-token" data-open="true"></script></body></html>"#
    );
    let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let site = axum::Router::new()
        .route("/", axum::routing::get(move || async move { Html(html) }))
        .route(
            "/my/chat-token",
            axum::routing::get(|| async {
                axum::Json(
                    serde_json::json!({"token": chat_token("web:bea", serde_json::json!({}))}),
                )
            }),
        );
    tokio::spawn(async move { axum::serve(listener, site).await });

    let browser = Browser::start("widget_a_page_hands_its_token").await;
    browser.goto(&format!("http://{addr}/")).await;
    browser
        .attr_until("#switchboard-widget", "data-status", "connected", |s| {
            s == "Connected"
        })
        .await;
    browser
        .type_into("#switchboard-widget textarea", "hello from the rota page\n")
        .await;
    browser
        .texts_until(".sbw-log li.sbw-reply", "the reply", |t| {
            t.iter()
                .any(|t| t.contains("echo: hello from the rota page"))
        })
        .await;
    browser.screenshot("replied").await;
    let person: String = sqlx::query_scalar(
        "SELECT person_id FROM switchboard.messages WHERE message = 'hello from the rota page'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        person, "user:web:bea",
        "the token the page's endpoint gave names the person"
    );
    browser.close().await;
}

#[tokio::test]
async fn widget_the_script_is_served_to_any_site_and_uploads_answer_a_cross_origin_preflight() {
    let app = spawn_app_configured(|c| c.demo.enabled = true).await;
    let http = reqwest::Client::new();
    let script = http
        .get(format!("{}/widget.js", app.gateway_url))
        .send()
        .await
        .unwrap();
    assert_eq!(script.status(), 200);
    assert_eq!(
        script.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert_eq!(script.headers()["access-control-allow-origin"], "*");
    assert!(script.text().await.unwrap().contains("/ws/chat/"));

    let preflight = http
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/chat/uploads", app.gateway_url),
        )
        .header("Origin", "https://portal.example")
        .header("Access-Control-Request-Method", "POST")
        .header(
            "Access-Control-Request-Headers",
            "authorization, content-type, idempotency-key",
        )
        .send()
        .await
        .unwrap();
    assert!(preflight.status().is_success(), "{}", preflight.status());
    let allowed = preflight.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    for h in ["authorization", "content-type", "idempotency-key"] {
        assert!(allowed.contains(h), "{allowed}");
    }

    // `make run`'s demo page carries the widget with a token the socket takes.
    let demo = http
        .get(format!("{}/demo/widget?visitor=sam", app.gateway_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        demo.contains(r#"<script src="/widget.js" data-agent="reggie_oc""#),
        "{demo}"
    );
    let token = demo
        .split(r#"data-token=""#)
        .nth(2)
        .and_then(|t| t.split('"').next())
        .expect("the page's token");
    let checked = http
        .get(format!("{}/ws/chat?token={token}", app.gateway_url))
        .send()
        .await
        .unwrap();
    assert_ne!(checked.status(), 401, "the demo token is refused");
    let forged = http
        .get(format!("{}/ws/chat?token={token}x", app.gateway_url))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
}
